"""More CPU ranks on a host than its cores: the model has no notion of cores, so a fit records the host
it was measured on, `predict` refuses CPU ranks per node beyond that host's cores, and `check` marks
the rows of oversubscribed runs and leaves them out of its summary (docs/model.md)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO, notes_joined

from commbench import algorithms as A
from commbench import cli
from commbench import costmodel as M
from commbench.analysis import check as K
from commbench.analysis import fit as F
from commbench.analysis.hosts import oversubscription
from commbench.topology import Link, Topology

TRUTH = M.Hardware("truth", 2, Link("shm", 8.0, 3.0), Link("shm", 8.0, 3.0))


def header(run_id: str, world: int, cpus: int, device: str = "cpu", hosts: int = 1) -> dict:
    """A run header as the harness writes it: every rank's host, device and that host's cores."""
    return {"record": "header", "run_id": run_id, "device": device,
            "ranks": [{"host": f"node{rank * hosts // world}", "device": device, "cpus": cpus}
                      for rank in range(world)]}


def results(run_id: str, world: int, sizes, slow: float = 1.0, nnodes: int = 1, device: str = "cpu") -> list[dict]:
    """Ring allreduce points timed by TRUTH (times `slow`)."""
    topo = Topology(nnodes, world // nnodes)
    out = []
    for nbytes in sizes:
        count = nbytes // 4 - (nbytes // 4) % world
        t = M.schedule_us(A.build("allreduce", "ring", topo, count, count * 4), topo, TRUTH, 4) * slow
        out.append({"record": "result", "kind": "measured", "collective": "allreduce", "backend": "shm",
                    "library": "shm", "algorithm": "ring", "dtype": "float32", "placement": "in-place",
                    "world_size": world, "nnodes": nnodes, "count": count, "nbytes": count * 4, "time_us": t,
                    "wrong": 0, "root": None, "run_id": run_id, "device": device})
    return out


SIZES = [1 << k for k in range(16, 25, 2)]


def fitted(tmp_path, cpus: int = 2, device: str = "cpu", world: int = 2) -> str:
    """`commbench fit` of a 2-rank sweep on a host of `cpus` cores: the hardware file's path."""
    sweep = tmp_path / "s.jsonl"
    sweep.write_text("".join(json.dumps(r) + "\n" for r in [header("a", world, cpus, device),
                                                             *results("a", world, SIZES, device=device)]))
    hw = tmp_path / "hw.json"
    assert cli.main(["fit", str(sweep), "-o", str(hw)]) == 0
    return str(hw)


def test_fit_records_where_it_was_measured(tmp_path, capsys):
    hw = fitted(tmp_path)
    assert json.loads(open(hw).read())["meta"]["measured_on"] == {"device": "cpu", "cpus": 2, "ranks_per_host": 2}
    assert "measured on cpu: at most 2 rank(s) on a host of 2 cores" in capsys.readouterr().out


def test_fit_of_an_oversubscribed_sweep_says_so():
    hw = F.fit([header("a", 4, 2), *results("a", 4, SIZES)])
    assert hw.meta["measured_on"] == {"device": "cpu", "cpus": 2, "ranks_per_host": 4}
    assert any("oversubscribed" in note for note in hw.meta["notes"])
    assert oversubscription(hw, 4) is None and oversubscription(hw, 5)  # what it measured, not beyond


def test_check_marks_oversubscribed_rows_and_leaves_them_out():
    records = [header("two", 2, 2), *results("two", 2, SIZES, slow=1.05),
               header("four", 4, 2), *results("four", 4, SIZES, slow=3.0)]  # 4 ranks on 2 cores: 3x slower
    rows, _ = K.check(records, TRUTH)
    four = [r for r in rows if r.setup.startswith("shm/shm/ring, 4 ranks")]
    two = [r for r in rows if r.setup.startswith("shm/shm/ring, 2 ranks")]
    assert len(four) == len(two) == len(SIZES)
    assert all(r.oversubscribed == "4 ranks on 2 cores" and "oversubscribed: 4 ranks on 2 cores" in r.setup
               for r in four)
    assert not any(r.oversubscribed for r in two)
    summary = K.summary(rows)
    assert summary["oversubscribed_left_out"] == len(SIZES)
    assert summary["all"]["rows"] == len(SIZES)
    assert summary["all"]["median_abs_error"] == pytest.approx(1 - 1 / 1.05)  # the 2-rank rows alone are judged
    counted = K.summary(rows, include_oversubscribed=True)
    assert counted["all"]["rows"] == 2 * len(SIZES) and counted["oversubscribed_left_out"] == 0


@pytest.mark.parametrize("head", [header("g", 4, 2, device="cuda"), header("c", 4, 8), header("n", 4, 2, hosts=2),
                                  {"record": "header", "run_id": "x"}])
def test_gpu_ranks_enough_cores_or_an_unknown_host_are_judged(head):
    """GPU ranks, 4 ranks on 8 cores, 2 ranks on each of 2 hosts of 2 cores, a header without ranks."""
    records = [head, *results(head["run_id"], 4, SIZES, nnodes=2 if head["run_id"] == "n" else 1)]
    rows, _ = K.check(records, TRUTH)
    assert rows and not any(r.oversubscribed for r in rows)
    assert K.summary(rows)["oversubscribed_left_out"] == 0


def test_check_command_prints_the_mark_and_one_note(tmp_path, capsys):
    run = tmp_path / "r.jsonl"
    run.write_text("".join(json.dumps(r) + "\n" for r in [header("two", 2, 2), *results("two", 2, SIZES),
                                                           header("four", 4, 2), *results("four", 4, SIZES)]))
    hw = fitted(tmp_path)
    capsys.readouterr()
    assert cli.main(["check", str(run), "--hw", hw, "--json", str(tmp_path / "c.jsonl")]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "oversubscribed" in line and line.startswith("# note")]
    assert len(notes) == 1 and f"{len(SIZES)} row(s)" in notes[0] and "left out of the summary" in notes[0]
    assert out.count("oversubscribed: 4 ranks on 2 cores") == len(SIZES)
    summary = json.loads((tmp_path / "c.jsonl").read_text().splitlines()[-1])
    assert summary["all"]["rows"] == len(SIZES) and summary["oversubscribed_left_out"] == len(SIZES)


def test_check_max_error_with_only_oversubscribed_rows_is_one_line(tmp_path, capsys):
    run = tmp_path / "r.jsonl"
    run.write_text("".join(json.dumps(r) + "\n" for r in [header("four", 4, 2), *results("four", 4, SIZES)]))
    hw = fitted(tmp_path)
    capsys.readouterr()
    assert cli.main(["check", str(run), "--hw", hw, "--max-error", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no row to judge" in err
    assert cli.main(["check", str(run), "--hw", hw, "--max-error", "1000", "--include-oversubscribed"]) == 0


def test_predict_refuses_more_cpu_ranks_than_the_fitted_hosts_cores(tmp_path, capsys):
    hw = fitted(tmp_path)
    capsys.readouterr()
    assert cli.main(["predict", "--hw", hw, "-T", "1x4", "--sizes", "1M"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("commbench: error: 4 ranks per node")
    assert "2 cores" in err and "no notion of cores" in err
    for layout in ("1x2", "4x2"):  # ranks per node within the cores: predicted
        assert cli.main(["predict", "--hw", hw, "-T", layout, "--sizes", "1M"]) == 0


def test_a_gpu_fit_and_a_preset_are_not_refused(tmp_path, capsys):
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    hw = fitted(gpu, device="cuda")
    assert json.loads(open(hw).read())["meta"]["measured_on"]["device"] == "cuda"
    assert cli.main(["predict", "--hw", hw, "-T", "1x8", "--sizes", "1M"]) == 0
    assert cli.main(["predict", "--hw", "dgx-a100", "-T", "1x8", "--sizes", "1M"]) == 0
    assert "measured_on" not in capsys.readouterr().out  # a preset: no note either


def test_an_old_fit_without_measured_on_predicts_with_a_note(tmp_path, capsys):
    hw = fitted(tmp_path)
    data = json.loads(open(hw).read())
    del data["meta"]["measured_on"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    capsys.readouterr()
    assert cli.main(["predict", "--hw", str(old), "-T", "1x4", "--sizes", "1M"]) == 0
    out = capsys.readouterr().out
    assert "does not say which host it was fitted on" in " ".join(notes_joined(out))  # wherever the path breaks it


@pytest.mark.parametrize("block", ["junk", {"device": "cpu", "cpus": "2", "ranks_per_host": 2}, {"device": "cpu"}])
def test_a_damaged_measured_on_is_one_line(tmp_path, capsys, block):
    hw = fitted(tmp_path)
    data = json.loads(open(hw).read())
    data["meta"]["measured_on"] = block
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(data))
    capsys.readouterr()
    assert cli.main(["predict", "--hw", str(damaged), "-T", "1x2", "--sizes", "1M"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "meta.measured_on" in err


def test_simulated_points_record_no_host():
    records = [{**r, "backend": "sim"} for r in results("s", 2, SIZES)]
    assert "measured_on" not in F.fit([header("s", 1, 2), *records]).meta
    no_header = F.fit(results("u", 2, SIZES)).meta["measured_on"]  # cores unknown: nothing refused for them
    assert no_header == {"device": "cpu", "cpus": None, "ranks_per_host": 2}


def test_model_accuracy_reports_oversubscribed_sweeps_apart(tmp_path):
    """benchmarks/model_accuracy.py: a 4-rank sweep on 2 cores keeps its errors in the table, marked, and
    is left out of the target line."""
    import importlib.util

    path = str(REPO / "benchmarks" / "model_accuracy.py")
    spec = importlib.util.spec_from_file_location("model_accuracy", path)
    MA = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(MA)
    for name, world in (("two", 2), ("four", 4)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                                        [header(name, world, 2), *results(name, world, SIZES)]))
    assert MA.oversubscribed([str(tmp_path / "two.jsonl")]) is None
    assert MA.oversubscribed([str(tmp_path / "four.jsonl")]) == "4 ranks on 2 cores"
    row = MA.table_row("shm-ring-2", "shm-ring-4", np.array([-0.7, -0.6]), 0.0, "4 ranks on 2 cores")
    assert "| 65.0% | 70.0% | 0% | no: oversubscribed, 4 ranks on 2 cores (refused by the model) |" in row
    line = MA.target_line([np.array([0.05, -0.02])], ["shm-ring-4 (4 ranks on 2 cores)"])
    assert "median 3.5% over the 2 points of 1 judged row(s), met" in line and "shm-ring-4 (4 ranks" in line


def test_a_proxy_replay_on_more_ranks_than_cores_is_marked():
    from commbench.proxies.profile import load_profile

    gradients = load_profile("tts_angular").nbytes
    rows = []
    for run_id, world in (("p2", 2), ("p4", 4)):
        proxy = {"record": "proxy", "kind": "proxy", "status": "ok", "run_id": run_id, "model": "tts_angular",
                 "backend": "shm", "world_size": world, "nnodes": 1, "batch": 1, "step_us_p50": 1000.0,
                 "comm_us_p50": 500.0, "gradient_bytes": gradients, "bucket_mb": None, "bucketing": "ddp"}
        rows += K.check([header(run_id, world, 2), proxy], TRUTH)[0]
    four = "4 ranks on 2 cores"
    marks = [(r.what, r.oversubscribed) for r in rows]
    assert marks == [("step", None), ("comm", None), ("step", four), ("comm", four)]
    assert K.summary(rows)["proxy_steps"]["rows"] == 1
