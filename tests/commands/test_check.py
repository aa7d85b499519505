"""`commbench check`: the cost model's prediction of a user's own sweep and proxy runs, row by row."""
import json

import numpy as np
import pytest
from conftest import commbench

from commbench.analysis import check as K
from commbench.results import read_records


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A small shm sweep, a model fitted on it, and a proxy replay on shm with FLOP-rate compute."""
    folder = tmp_path_factory.mktemp("check")
    sweep, hw, proxy = folder / "s.jsonl", folder / "hw.json", folder / "p.jsonl"
    out = commbench("sweep", "--backend", "shm", "--sizes", "4K-1M", "-f", "4", "--min-time", "0.02",
                    "--json", str(sweep))
    assert out.returncode == 0, out.stderr
    out = commbench("fit", str(sweep), "-o", str(hw), "--accept-poor-fit")
    assert out.returncode == 0, out.stderr
    out = commbench("proxy", "tts_angular", "--backend", "shm", "--nprocs", "2", "--batch", "1", "--compute", "flops",
                    "--tflops", "0.05",
                    "--steps", "3", "--warmup-steps", "1", "--json", str(proxy))
    assert out.returncode == 0, out.stderr
    return sweep, hw, proxy


def test_errors_are_predicted_over_measured(runs):
    from commbench.costmodel import load_hardware

    sweep, hw_path, proxy = runs
    hw = load_hardware(str(hw_path))
    records = read_records(str(sweep)) + read_records(str(proxy))
    rows, _ = K.check(records, hw)
    assert {r.kind for r in rows} == {"sweep", "proxy"}
    # measured set to exactly twice the prediction: every error is -50%, every row optimistic
    doubled = []
    predicted = {(r.kind, r.what, r.setup): r.predicted_us for r in rows}
    for r in records:
        if r["record"] == "result":
            row = next(x for x in rows if x.kind == "sweep" and x.nbytes == r["nbytes"]
                       and x.what.endswith(r["placement"]))
            r = {**r, "time_us": 2 * row.predicted_us}
        elif r["record"] == "proxy":
            step = next(v for (kind, what, _), v in predicted.items() if kind == "proxy" and what == "step")
            comm = next(v for (kind, what, _), v in predicted.items() if kind == "proxy" and what == "comm")
            r = {**r, "step_us_p50": 2 * step, "comm_us_p50": 2 * comm}
        doubled.append(r)
    again, _ = K.check(doubled, hw)
    assert len(again) == len(rows)
    assert all(r.error == pytest.approx(-0.5) for r in again)
    summary = K.summary(again)
    assert summary["all"]["median_abs_error"] == pytest.approx(0.5)
    assert summary["all"]["optimistic"] == len(again)
    assert summary["proxy_steps"]["rows"] == 1
    assert summary["sweep_64k_up"]["rows"] == sum(1 for r in again if r.kind == "sweep" and r.nbytes >= 64 << 10)


def test_a_run_of_another_library_or_host_is_left_out_with_both_named(runs):
    """The fit says what it was measured with (meta.measured_with); a run of another library (a gloo
    proxy beside a shm fit), or of another host, is not predicted: one note names both."""
    from commbench.costmodel import load_hardware

    sweep, hw_path, proxy = runs
    hw = load_hardware(str(hw_path))
    assert hw.meta["measured_with"]["backend"] == ["shm"] and hw.meta["measured_with"]["hosts"]
    records = read_records(str(sweep)) + read_records(str(proxy))
    gloo = [{**r, "backend": "torch", "library": "gloo", "_file": "gloo.jsonl"} if r["record"] in ("result", "proxy")
            else r for r in records]
    rows, notes = K.check(gloo, hw)
    assert rows == []
    assert any(n.startswith("gloo.jsonl:") and "backend torch, library gloo" in n and "the fit with backend shm" in n
               for n in notes)
    elsewhere = [{**r, "ranks": [{**rank, "host": "other-host"} for rank in r["ranks"]]} if r["record"] == "header"
                 else r for r in records]
    rows, notes = K.check(elsewhere, hw)
    assert rows == [] and any("hosts other-host" in n for n in notes)
    medians = [{**r, "stat": "p50"} if r["record"] == "result" else r for r in records]  # a --stat p50 sweep
    rows, notes = K.check(medians, hw)
    assert {r.kind for r in rows} == {"proxy"} and any("stat p50" in n and "stat mean" in n for n in notes)
    same, _ = K.check(records, hw)
    assert {r.kind for r in same} == {"sweep", "proxy"}


def test_report_leaves_out_and_names_a_run_the_fit_does_not_apply_to(runs, tmp_path):
    from commbench.analysis import report as R
    from commbench.costmodel import load_hardware

    sweep, hw_path, _ = runs
    gloo = tmp_path / "gloo.jsonl"
    gloo.write_text("".join(json.dumps({**r, "backend": "torch", "library": "gloo"}) + "\n"
                            for r in read_records(str(sweep))))
    warnings = []
    index, _ = R.report([str(sweep), str(gloo)], str(tmp_path / "rep"), load_hardware(str(hw_path)), warnings.append)
    text = open(index).read()
    assert "not predicted: gloo.jsonl" in text and any("gloo.jsonl" in w for w in warnings)
    assert "torch/gloo, 2 ranks | predicted" not in text and "| predicted |" in text  # shm's own run still is


def test_check_prints_rows_and_summary_and_writes_json(runs, tmp_path):
    sweep, hw, proxy = runs
    out = commbench("check", str(sweep), str(proxy), "--hw", str(hw), "--json", str(tmp_path / "c.jsonl"))
    assert out.returncode == 0, out.stderr
    results = [r for r in read_records(str(sweep)) if r["record"] == "result"]
    lines = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    rows = [r for r in lines if r["record"] == "check"]
    assert len([r for r in rows if r["kind"] == "sweep"]) == len(results)
    assert [r["what"] for r in rows if r["kind"] == "proxy"] == ["step", "comm"]
    assert lines[-1]["record"] == "check_summary"
    assert "median |error|" in out.stdout and "proxy steps" in out.stdout
    for row in rows:
        assert row["error"] == pytest.approx(row["predicted_us"] / row["measured_us"] - 1)



def test_an_error_against_a_time_of_nearly_nothing_is_written_null(runs, tmp_path):
    """A measured time of 1e-320 us makes the row's error infinite: the JSON line holds null (JSON has no
    infinity), the run ends as any other, no traceback."""
    sweep, hw, _ = runs
    lines = sweep.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if json.loads(line)["record"] == "result")
    record = json.loads(lines[first])
    record["time_us"] = 1e-320
    lines[first] = json.dumps(record)
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text("\n".join(lines) + "\n")
    out = commbench("check", str(tiny), "--hw", str(hw), "--json", str(tmp_path / "c.jsonl"))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert any(r["record"] == "check" and r["error"] is None for r in rows)
    assert "Infinity" not in (tmp_path / "c.jsonl").read_text()

def test_max_error_fails_a_poor_prediction(runs):
    sweep, hw, _ = runs
    out = commbench("check", str(sweep), "--hw", str(hw), "--max-error", "0.0001")
    assert out.returncode == 1
    assert "above --max-error" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["--hw", "dgx-a100", "/nonexistent.jsonl"], "no such file"),
    (["--hw", "no-such-preset", "S"], "no-such-preset"),
    (["--hw", "dgx-a100", "--max-error", "0", "S"], "--max-error"),
])
def test_bad_input_is_one_line(runs, args, message):
    sweep = str(runs[0])
    out = commbench("check", *[sweep if a == "S" else a for a in args])
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_nothing_predictable_is_refused(runs, tmp_path):
    sweep, hw, _ = runs
    only_header = tmp_path / "h.jsonl"
    only_header.write_text(sweep.read_text().splitlines()[0] + "\n")
    out = commbench("check", str(only_header), "--hw", str(hw))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_interval_collapses_on_data_the_model_describes_exactly(runs):
    """Times that are the model's own predictions: every resample fits the same figures and every
    residual is zero, so the 80% interval is the prediction itself."""
    from commbench.analysis import fit as F
    from commbench.analysis import intervals as I
    from commbench.costmodel import load_hardware

    sweep, hw_path, _ = runs
    from dataclasses import replace

    fitted = load_hardware(str(hw_path))  # without a cache regime: one the refit can find again exactly
    hw0 = replace(fitted, intra=replace(fitted.intra, cache_bytes=None, cache_bw_gbps=None))
    template = next(r for r in read_records(str(sweep)) if r["record"] == "result")
    results = [{**template, "nbytes": 1 << k, "requested_nbytes": 1 << k, "count": (1 << k) // 4, "algorithm": name,
                "placement": "in-place", "time_us": 1.0} for k in range(12, 25, 2) for name in ("ring", "oneshot")]
    results = [{**r, "time_us": float(F.predict_records([r], hw0)[0])} for r in results]  # 14 exact points
    hw1 = F.fit(results)
    assert len(I.variants(hw1)) == len(results)  # one refit without each point
    for r in results:
        predicted = F.predict_records([r], hw1)[0]
        low, high = I.interval_us(hw1, lambda v, r=r: F.predict_records([r], v)[0])
        assert low == pytest.approx(predicted, rel=1e-2)  # the solver's tolerance
        assert high == pytest.approx(predicted, rel=1e-2)


def test_interval_is_the_jackknife_plus_of_the_left_out_points_and_coverage_is_reported(runs, tmp_path):
    """Residual i is point i's error against the fit that left it out (resample i), and the interval is the
    order statistics of those fits' predictions spread by their own point's error on log time."""

    from commbench.analysis import fit as F
    from commbench.analysis import fit_points as P
    from commbench.analysis import intervals as I
    from commbench.costmodel import load_hardware

    sweep, hw_path, _ = runs
    hw = load_hardware(str(hw_path))
    block = hw.meta["uncertainty"]
    assert block["pairing"] == "jackknife+"
    points = P.usable(read_records(str(sweep)))
    refits = I.variants(hw)
    assert len(refits) == len(block["relative_residuals"]) == len(points)
    for point, refit, residual in zip(points, refits, block["relative_residuals"]):
        assert residual == pytest.approx(point["time_us"] / F.predict_records([point], refit)[0] - 1, rel=1e-9)
    r = points[0]
    times = np.array([F.predict_records([r], v)[0] for v in refits])
    spread = np.exp(np.abs(np.log1p(block["relative_residuals"])))
    n = len(times)
    k_low, k_high = max(1, (n + 1) // 5), min(n, -(-4 * (n + 1) // 5))  # floor(0.2 (n+1)), ceil(0.8 (n+1)), exact
    low, high = I.interval_us(hw, lambda v: F.predict_records([r], v)[0])
    assert low == pytest.approx(np.sort(times / spread)[k_low - 1])
    assert high == pytest.approx(np.sort(times * spread)[k_high - 1])
    assert low < F.predict_records([r], hw)[0] < high
    out = commbench("check", str(sweep), "--hw", str(hw_path), "--json", str(tmp_path / "c.jsonl"))
    lines = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    rows = [x for x in lines if x["record"] == "check"]
    assert all(x["interval_us"] and x["inside"] == (x["interval_us"][0] <= x["measured_us"] <= x["interval_us"][1])
               for x in rows)
    assert lines[-1]["all"]["coverage"] == pytest.approx(sum(x["inside"] for x in rows) / len(rows))
    assert "inside the 80% interval" in out.stdout


def test_predict_prints_and_writes_the_interval(runs, tmp_path):
    _, hw_path, _ = runs
    out = commbench("predict", "--hw", str(hw_path), "-T", "1x2", "--sizes", "64K,1M", "--json",
                    str(tmp_path / "p.jsonl"))
    assert out.returncode == 0, out.stderr
    assert "80% interval" in out.stdout
    results = [r for r in read_records(str(tmp_path / "p.jsonl")) if r["record"] == "result"]
    assert results and all(r["interval_us"][0] <= r["interval_us"][1] for r in results)
    assert all(r["interval_source"] == "fit resamples" for r in results)
    preset = commbench("predict", "--hw", "dgx-a100", "-T", "1x8", "--sizes", "1M")
    assert "] corpus" in preset.stdout and "] fit" not in preset.stdout  # no resamples: the published corpus's


def test_report_draws_proxy_steps_beside_sweep_points(runs, tmp_path, monkeypatch):
    from commbench.analysis import report as R
    from commbench.costmodel import load_hardware

    sweep, hw_path, proxy = runs
    drawn = {}
    real = R.plot_prediction

    def spy(series, out_dir, extra=(), mark=None):
        drawn["extra"] = list(extra)
        return real(series, out_dir, extra, mark)

    monkeypatch.setattr(R, "plot_prediction", spy)
    _, pngs = R.report([str(sweep), str(proxy)], str(tmp_path / "rep"), load_hardware(str(hw_path)))
    assert any(p.endswith("predicted_vs_measured.png") for p in pngs)
    (label, measured, predicted), = drawn["extra"]
    summary = [r for r in read_records(str(proxy)) if r["record"] == "proxy"][-1]
    assert "tts_angular" in label and measured == summary["step_us_p50"] and predicted > 0


@pytest.mark.parametrize("block", ["junk", {"columns": None}, {"columns": list(range(5))},
                                   {"columns": ["overhead_us", "alpha_intra_us", "alpha_inter_us",
                                                "us_per_byte_intra", "us_per_byte_inter"],
                                    "fit": [1, 1, 1, 1, 1], "resamples": [["x", 1, 1, 1, 1]],
                                    "relative_residuals": [0.0]},
                                   {"columns": ["overhead_us", "alpha_intra_us", "alpha_inter_us",
                                                "us_per_byte_intra", "us_per_byte_inter"], "pairing": "made-up",
                                    "fit": [1, 1, 1, 1, 1], "resamples": [[1, 1, 1, 1, 1]],
                                    "relative_residuals": [0.0]},
                                   {"columns": ["overhead_us", "alpha_intra_us", "alpha_inter_us",
                                                "us_per_byte_intra", "us_per_byte_inter"], "pairing": "jackknife+",
                                    "fit": [1, 1, 1, 1, 1], "resamples": [[1, 1, 1, 1, 1]] * 2,
                                    "relative_residuals": [0.0]}])
def test_a_damaged_interval_block_is_one_line(runs, tmp_path, block):
    sweep, hw_path, _ = runs
    data = json.loads(hw_path.read_text())
    data["meta"]["uncertainty"] = block
    damaged = tmp_path / "hw.json"
    damaged.write_text(json.dumps(data))
    for args in (["predict", "--hw", str(damaged), "-T", "1x2", "--sizes", "1M"],
                 ["check", str(sweep), "--hw", str(damaged)]):
        out = commbench(*args)
        assert out.returncode == 2, out.stderr
        assert "meta.uncertainty" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_no_interval_where_the_fit_measured_no_link(runs):
    """A one-node fit says nothing of the link between nodes: predictions that cross it get no interval from
    the fit; the published corpus's stands in, as without a fit, and says so."""
    _, hw_path, _ = runs
    out = commbench("predict", "--hw", str(hw_path), "-T", "2x2", "--sizes", "1M", "-A", "ring")
    assert out.returncode == 0, out.stderr
    assert "] fit" not in out.stdout and "] corpus" in out.stdout
    # and predict says why, as predict-scaling does
    assert "note: 2x2 crosses the inter level, which" in out.stdout and "did not measure" in out.stdout
    # 1x2, not 1x4: on a host of fewer than 4 cores, predict refuses 4 CPU ranks per node
    inside = commbench("predict", "--hw", str(hw_path), "-T", "1x2", "--sizes", "1M", "-A", "ring")
    assert "80% interval" in inside.stdout and "] fit" in inside.stdout


def test_a_training_run_is_predicted_with_its_replays_measured_compute_and_ddp_work(runs):
    """A train record beside a replay of the same setup (what `proxy --validate` writes) is predicted with the
    replay's header split, DDP's own work included; without such a replay it is named and left out."""
    from commbench.analysis.scaling import StepQuestion, predict_step
    from commbench.costmodel import load_hardware
    from commbench.proxies.profile import load_profile
    from commbench.proxies.setups import Compute, settle
    from commbench.topology import Topology

    _, hw_path, proxy = runs
    hw = load_hardware(str(hw_path))
    records = read_records(str(proxy))
    split = {"forward": 3000.0, "backward": 6000.0, "optimizer": 500.0, "ddp": 2000.0}
    records = [{**r, "compute_split_us": split, "config": {**r["config"], "compute": "measured"}}
               if r["record"] == "header" else
               {**r, "comm_cpu_gbps": None} if r["record"] == "proxy" else r for r in records]
    replay = next(r for r in records if r["record"] == "proxy")
    train = {**replay, "kind": "train", "run_id": "t", "step_us_p50": 50_000.0, "compute_us_p50": None}
    rows, notes = K.check(records + [train], hw)
    by_kind = {r.kind: r for r in rows if r.what == "step"}
    topo = Topology(1, 2)
    q = StepQuestion(load_profile("tts_angular"), 1, Compute(3000.0, 6000.0, 500.0, 2000.0),
                     settle("ddp", {"bucket_mb": replay.get("bucket_mb")}), K.LIBRARY_ALGORITHM["allreduce"])
    expected = predict_step(q, topo, hw)
    assert by_kind["train"].predicted_us == pytest.approx(expected.times.step_us)
    assert by_kind["proxy"].predicted_us == pytest.approx(expected.times.step_us)  # same setup, same prediction
    assert expected.times.compute_us == pytest.approx(11_500.0)  # DDP's own work counted in the step
    assert by_kind["train"].measured_us == 50_000.0
    assert K.summary(rows)["train_steps"]["rows"] == 1
    # the replay measured its communication's CPU, and its 2 ranks had no spare core (2 cores): both rows then
    # count what the allreduces take from the backward, as other time
    busy = [{**r, "ranks": [{**e, "cpus": 2} for e in r["ranks"]]} if r["record"] == "header" else
            {**r, "comm_cpu_gbps": 1e-4} if r["record"] == "proxy" else r for r in records]
    train_header = {**next(r for r in busy if r["record"] == "header"), "run_id": "t", "kind": "train"}
    slowed = {r.kind: r for r in K.check(busy + [train_header, train], hw)[0] if r.what == "step"}
    assert slowed["train"].predicted_us > by_kind["train"].predicted_us
    assert slowed["proxy"].predicted_us == pytest.approx(slowed["train"].predicted_us)
    alone, notes = K.check([r for r in records if r["record"] != "proxy"] + [train], hw)
    assert not [r for r in alone if r.kind == "train"]
    assert any("no proxy replay of the same setup" in n for n in notes)


def test_a_one_rank_replay_has_a_step_row_without_interval_and_no_comm_row(runs, tmp_path):
    """One rank communicates nothing: its step is its given compute (no interval: a zero-width one would only
    say so), and no comm row (the replay's hand-off time against a modelled 0 would read -100%)."""
    from commbench.costmodel import load_hardware

    _, hw_path, _ = runs
    one = tmp_path / "one.jsonl"
    out = commbench("proxy", "tts_angular", "--backend", "shm", "--nprocs", "1", "--batch", "1", "--compute", "flops",
                    "--tflops", "0.05", "--steps", "3", "--warmup-steps", "1", "--json", str(one))
    assert out.returncode == 0, out.stderr
    rows, _ = K.check(read_records(str(one)), load_hardware(str(hw_path)))
    assert [(r.kind, r.what) for r in rows] == [("proxy", "step")]
    assert rows[0].interval_us is None and rows[0].inside is None


def test_the_readmes_check_line_reads_files_its_own_lines_make_on_the_fitted_backend():
    """The README's `commbench check shm.jsonl p.jsonl --hw shm-hw.json` could not work: p.jsonl was a gloo
    replay, always left out against an shm fit, and no line made shm.jsonl (issue 32, item 13). Each input of
    each `check` line is made by an earlier line, with the backend of the sweep its --hw was fitted on."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    lines = [line.split("#")[0].split() for line in readme.splitlines() if line.startswith("commbench ")]
    made: dict[str, str] = {}  # file -> backend of the line that wrote it
    fitted: dict[str, str] = {}  # hardware file -> backend of the sweep it was fitted on
    checked = 0
    for words in lines:
        options = dict(zip(words, words[1:]))
        backend = options.get("--backend", "torch")
        if words[1] in ("sweep", "proxy") and "--json" in options:
            made[options["--json"]] = backend
        if words[1] == "fit" and "-o" in options:
            fitted[options["-o"]] = made.get(words[2], "?")
        if words[1] == "check":
            inputs = [w for w in words[2:words.index("--hw")] if re.search(r"\.jsonl$", w)]
            assert all(f in made for f in inputs), (words, made)
            assert {made[f] for f in inputs} == {fitted[options["--hw"]]}, (words, made, fitted)
            checked += 1
    assert checked


def test_the_table_stays_aligned_past_999_us_and_long_point_names(capsys):
    """The columns shifted once a time passed 999.9 us or an interval or a point's name outgrew its column."""
    from types import SimpleNamespace

    from commbench.commands import check as command
    from commbench.costmodel import load_hardware

    def row(what, measured, predicted, interval):
        return SimpleNamespace(setup="shm/shm/ring, 2 ranks", what=what, kind="sweep", measured_us=measured,
                               predicted_us=predicted, error=predicted / measured - 1, interval_us=interval,
                               inside=interval[0] <= measured <= interval[1])

    rows = [row("allreduce 4KiB in-place", 10.1, 10.2, (2.1, 198.2)),
            row("allreduce 256KiB out-of-place", 542.1, 1436.5, (297.3, 6940.2)),
            row("allreduce 64MiB in-place", 27985.0, 29187.8, (170.5, 4995060.4))]
    command._table(rows, load_hardware("dgx-a100"))
    lines = capsys.readouterr().out.splitlines()[2:2 + len(rows)]
    measured_ends = {line.index(f" {r.measured_us:.1f} ") + len(f" {r.measured_us:.1f}")
                     for line, r in zip(lines, rows)}
    error_ends = {line.index("%") for line in lines}
    interval_ends = {len(line.rsplit(" ", 1)[0]) for line in lines}
    assert len(measured_ends) == len(error_ends) == len(interval_ends) == 1, "\n".join(lines)


def test_a_step_is_printed_in_ms_and_a_sweep_point_in_us_each_with_its_unit(capsys):
    """A 10.9 s training step read 10977439.9 in a column of microseconds (issue 48, item 12): a step and its
    comm are in ms, as the proxy's and train's tables print them, a sweep point in us, every cell with its unit."""
    from types import SimpleNamespace

    from commbench.commands import check as command
    from commbench.costmodel import load_hardware

    def row(kind, what, measured, predicted, interval):
        return SimpleNamespace(setup="resnet50 b32, torch/ring, 1x2", what=what, kind=kind, measured_us=measured,
                               predicted_us=predicted, error=predicted / measured - 1, interval_us=interval,
                               inside=interval[0] <= measured <= interval[1])

    rows = [row("train", "step", 10977439.9, 10551457.1, (9e6, 1.2e7)),
            row("proxy", "comm", 137629.1, 455.0, (300.0, 900.0)),
            row("sweep", "allreduce 4KiB in-place", 10.1, 10.2, (2.1, 198.2))]
    command._table(rows, load_hardware("dgx-a100"))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "10977439.9" not in out and "(us)" not in lines[1] and "measured" in lines[1]
    assert "10977.44 ms" in lines[2] and "10551.46 ms" in lines[2] and "9000.00-12000.00 ms in" in lines[2]
    assert "137.63 ms" in lines[3] and "0.46 ms" in lines[3] and "0.30-0.90 ms OUT" in lines[3]
    assert "10.1 us" in lines[4] and "10.2 us" in lines[4] and "2.1-198.2 us in" in lines[4]
