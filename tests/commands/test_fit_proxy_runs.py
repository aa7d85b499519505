"""`commbench fit` given proxy runs: it writes a fitted `step_terms` block (commbench/step_terms.py) into the hardware
file, and predict-scaling and proxy --hw with that file apply those terms, said as fitted (issue 35: before, fit
read only sweeps, and a hardware file's terms could only be written by hand)."""
import json

import pytest
from conftest import commbench, notes_joined

from commbench.results import read_records

HIDDEN = [4000.0, 6000.0, 9000.0, 12000.0, 5000.0, 7000.0]


def write_run(path, run_id: str, calls: int, slope: float = 0.3, per_call_us: float = 40.0, scale: float = 1.0):
    """A 2-rank CPU replay whose other time is slope x overlapped comm + per_call_us x calls + 150 us exactly."""
    lines = [{"record": "header", "schema": 1, "run_id": run_id, "kind": "proxy", "model": "resnet18"}]
    for i, hidden in enumerate(h * scale for h in HIDDEN):
        other = slope * hidden + per_call_us * calls + 150.0
        lines.append({"record": "step", "schema": 1, "run_id": run_id, "step": i + 1, "warmup": False,
                      "compute_us": 50e3, "comm_us": hidden + 1000.0, "exposed_comm_us": 1000.0, "other_us": other,
                      "step_us": 51e3 + other, "samples_per_s": 100.0, "calls_us": [[0.0, 1.0]] * calls})
    lines.append({"record": "proxy", "schema": 1, "run_id": run_id, "kind": "proxy", "model": "resnet18",
                  "backend": "torch", "library": "gloo", "device": "cpu", "world_size": 2, "nnodes": 1, "batch": 4,
                  "buckets": calls, "step_us_p50": 60e3})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


@pytest.fixture
def runs(tmp_path):
    return [write_run(tmp_path / "p4.jsonl", "a", 4), write_run(tmp_path / "p16.jsonl", "b", 16, scale=1.3)]


def test_proxy_runs_fit_the_step_terms_onto_the_base_links(runs, tmp_path):
    hw = tmp_path / "hw.json"
    proc = commbench("fit", *runs, "--base", "dgx-a100", "-o", str(hw))
    assert proc.returncode == 0, proc.stderr
    block = json.loads(hw.read_text())["step_terms"]
    assert block["overlap_slowdown"]["source"] == block["per_bucket_us"]["source"] == "fitted"
    assert block["overlap_slowdown"]["value"] == pytest.approx(0.3 / 0.7, rel=1e-4)
    assert block["per_bucket_us"]["value"] == pytest.approx(40.0, rel=1e-4)
    assert runs[0] in block["overlap_slowdown"]["evidence"]
    assert block["step_cv"]["source"] != "fitted" and "step_cv not fitted" in proc.stderr
    assert "overlap_slowdown 0.429 (fitted" in proc.stdout and f"wrote {hw}" in proc.stdout

    # predict-scaling with that file applies them, said and recorded as fitted, and they lengthen the step
    (fitted, said), (preset, _) = (_predicted(tmp_path, spec) for spec in (str(hw), "dgx-a100"))
    assert fitted["step_terms"]["overlap_slowdown"] == {"value": pytest.approx(0.3 / 0.7, rel=1e-4),
                                                        "source": "fitted"}
    assert fitted["step_terms"]["per_bucket_us"]["source"] == "fitted"
    assert fitted["raw_step_us"] > preset["raw_step_us"]  # the preset's GPU defaults: no slowdown, no per-call time
    assert "overlap_slowdown 0.429 (fitted: commbench fit" in said


def _predicted(tmp_path, spec: str) -> tuple[dict, str]:
    """predict-scaling's 16-GPU record on `spec`, and its printed step terms line."""
    out = tmp_path / "s.jsonl"
    proc = commbench("predict-scaling", "resnet50", "--hw", spec, "--gpus", "16", "--tflops", "50", "--json", str(out),
                     "--force")
    assert proc.returncode == 0, proc.stderr
    [record] = read_records(str(out))
    return record, next(x for x in notes_joined(proc.stdout) if x.startswith("# step terms:"))


def _sweep(path) -> str:
    """A measured 2- and 4-rank allreduce sweep timed by a known link (3 us, 8 GB/s)."""
    from commbench import algorithms as A
    from commbench import costmodel as M
    from commbench.topology import Link, Topology

    truth = M.Hardware("truth", 4, Link("shm", 8.0, 3.0), Link("shm", 8.0, 3.0))
    lines = []
    for world in (2, 4):
        for nbytes in (1 << k for k in range(10, 25, 2)):
            count = nbytes // 4 - (nbytes // 4) % world
            schedule = A.build("allreduce", "ring", Topology(1, world), count, count * 4)
            lines.append({"record": "result", "kind": "measured", "collective": "allreduce", "backend": "shm",
                          "library": "shm", "algorithm": "ring", "dtype": "float32", "placement": "in-place",
                          "world_size": world, "nnodes": 1, "count": count, "nbytes": count * 4, "root": None,
                          "time_us": M.schedule_us(schedule, Topology(1, world), truth, 4), "wrong": 0})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_sweeps_and_proxy_runs_fit_links_and_terms_together(runs, tmp_path):
    hw = tmp_path / "hw.json"
    proc = commbench("fit", _sweep(tmp_path / "sweep.jsonl"), *runs, "-o", str(hw))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(hw.read_text())
    assert data["levels"]["intra"]["bw_gbps"] == pytest.approx(8.0, rel=1e-2)  # the sweep's links, fitted
    assert data["step_terms"]["overlap_slowdown"]["source"] == "fitted" and "# fitted " in proc.stdout
    # a fitted file with a block applies it (one without applies none: test_step_terms.py)
    record, said = _predicted(tmp_path, str(hw))
    assert record["step_terms"]["per_bucket_us"] == {"value": pytest.approx(40.0, rel=1e-4), "source": "fitted"}
    assert "per_bucket_us 40 us (fitted" in said


def test_proxy_runs_without_sweeps_or_base_are_one_line(runs, tmp_path):
    proc = commbench("fit", *runs, "-o", str(tmp_path / "hw.json"))
    assert proc.returncode == 2
    assert "proxy runs fit only the step terms" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "hw.json").exists()


def test_runs_that_pin_no_term_are_refused_in_one_line(tmp_path):
    run = write_run(tmp_path / "p.jsonl", "a", 4)
    records = [json.loads(x) for x in open(run)]
    for r in records:
        if r["record"] == "step":
            r["comm_us"] = 5000.0  # the overlapped time never varies, and one bucket count
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = commbench("fit", run, "--base", "dgx-a100", "-o", str(tmp_path / "hw.json"))
    assert proc.returncode == 2 and "no step term could be fitted" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "hw.json").exists()


def test_runs_that_pin_no_term_beside_sweeps_leave_the_terms_and_write_the_links(tmp_path):
    """The README's `commbench fit shm.jsonl p-shm.jsonl`: one replay of one bucket count pins no term, and the
    sweep's links are still fitted and written, the terms left out with the reason said."""
    run = write_run(tmp_path / "p.jsonl", "a", 4)
    records = [json.loads(x) for x in open(run)]
    for r in records:
        if r["record"] == "step":
            r["comm_us"] = 5000.0
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    hw = tmp_path / "hw.json"
    proc = commbench("fit", _sweep(tmp_path / "sweep.jsonl"), run, "-o", str(hw))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(hw.read_text())
    assert data["levels"]["intra"]["bw_gbps"] == pytest.approx(8.0, rel=1e-2)
    assert not data.get("step_terms")  # no block: predictions use the class defaults, as before fit read runs
    assert "step terms: none written (no step term could be fitted" in proc.stderr and "Traceback" not in proc.stderr


def test_terms_the_runs_cannot_pin_keep_the_base_files_then_its_device_class(runs, tmp_path):
    """Beside sweeps, --base's own block is kept for what the runs leave (it was dropped for the CPU default),
    and a GPU preset gets the GPU class defaults, not the CPU runs' (step_cv 0.03 where the GPU's is 0.0025)."""
    from commbench.step_terms import defaults

    hw_gpu = tmp_path / "gpu.json"
    proc = commbench("fit", *runs, "--base", "dgx-a100", "-o", str(hw_gpu))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(hw_gpu.read_text())["step_terms"]["step_cv"]["value"] == defaults("cuda").step_cv.value
    mine = tmp_path / "mine.json"
    written = json.loads(hw_gpu.read_text())
    written["step_terms"]["step_cv"] = {"value": 0.011, "source": "measured", "evidence": "a test's own figure"}
    mine.write_text(json.dumps(written))
    out = tmp_path / "out.json"
    proc = commbench("fit", _sweep(tmp_path / "sweep.jsonl"), *runs, "--base", str(mine), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["step_terms"]["step_cv"]["value"] == 0.011


def test_a_multi_rank_run_cut_short_keeps_its_world_size(runs, tmp_path):
    """A run without its summary record (stopped early) takes its world size from the header's summary fields:
    before, it counted as a 1-rank replay and fitted step_cv from a 2-rank run's steps."""
    from commbench.analysis.fit_step_terms import step_rows

    records = [json.loads(x) for x in open(runs[0])]
    summary = records.pop()
    records[0]["summary_fields"] = {k: v for k, v in summary.items() if k not in ("record", "schema", "run_id")}
    rows, _ = step_rows(records)
    assert rows and {r.world_size for r in rows} == {2}
    records[0].pop("summary_fields")
    records[0]["config"] = "not an object"
    rows, notes = step_rows(records)  # nothing to say its world: left out, said, no traceback
    assert not rows and any("no world size" in n for n in notes)
