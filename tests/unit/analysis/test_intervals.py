"""80% intervals of predicted training steps (predict-scaling, proxy --backend sim): the interval is the
prediction when the fit is exact, contains it and has a width when the data scatter, the fit gives none where
nothing was fitted (a preset, an unmeasured level, `nccl`) and the published corpus's calibration stands in
there, and both commands print and write it with its provenance."""
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import DATA, commbench

from commbench.analysis import calibration as C
from commbench.analysis import fit as F
from commbench.analysis import fit_points as P
from commbench.analysis.intervals import levels_fitted
from commbench.analysis.scaling import StepQuestion, predict_scaling, predict_step, step_interval_us
from commbench.collectives import DTYPES
from commbench.costmodel import Hardware, load_hardware, phases_us, schedule_us, variants_us
from commbench.proxies.profile import load_profile
from commbench.proxies.timeline import overlap, plan_step, steps_us
from commbench.results import ProxyResult, ScalingRecord, read_records
from commbench.topology import Link, Topology

TRUE_HW = Hardware("truth", 2, Link("intra", 20.0, 2.0), Link("inter", 5.0, 10.0), None, 5.0)


def _records(layouts, scatter: float, powers=range(12, 25, 2), phase: float = 0.0) -> list[dict]:
    """Result records of allreduces whose times are TRUE_HW's predictions, each off by up to `scatter`
    (a fixed pattern: the same records every run)."""
    out = []
    for nodes, per_node, names in layouts:
        for k in powers:
            for name in names:
                nbytes = 1 << k
                out.append({"record": "result", "kind": "measured", "collective": "allreduce", "backend": "shm",
                            "library": "shm", "device": "cuda", "dtype": "float32", "op": "sum", "root": None,
                            "placement": "in-place", "world_size": nodes * per_node, "nnodes": nodes,
                            "requested_nbytes": nbytes, "nbytes": nbytes, "count": nbytes // 4, "algorithm": name,
                            "time_us": 1.0, "wrong": 0})
    for i, r in enumerate(out):
        r["time_us"] = float(F.predict_records([r], TRUE_HW)[0]) * (1 + scatter * math.sin(1.7 * i + phase))
    return out


ONE_NODE = [(1, 2, ("ring", "oneshot"))]
TWO_LEVELS = ONE_NODE + [(2, 2, ("ring", "hier"))]


@pytest.fixture(scope="module")
def fitted():
    return F.fit(_records(TWO_LEVELS, 0.15))


def _exact(hw: Hardware) -> Hardware:
    """`hw` with an uncertainty block whose 60 resamples are all the fit and whose residuals are all zero."""
    fit = [hw.per_call_overhead_us, hw.intra.latency_us, hw.inter.latency_us, 1 / (hw.intra.bw_gbps * 1e3),
           1 / (hw.inter.bw_gbps * 1e3)]
    block = {"method": "test", "columns": list(F.COLUMNS[:5]), "fit": fit, "resamples": [fit] * 60,
             "relative_residuals": [0.0] * 9}
    return replace(hw, meta={"levels_fitted": {"intra": True, "inter": True}, "uncertainty": block})


def test_steps_us_is_overlaps_step():
    profile = load_profile("bert-large")
    from commbench.proxies import buckets as B

    plan = plan_step(profile, B.assign(profile, None, "ddp"), 1e4, 2e4, 50.0)
    comm = np.random.default_rng(1).uniform(0, 3e3, (7, len(plan.bucket_nbytes)))
    assert steps_us(plan, comm).tolist() == [overlap(plan, row).step_us for row in comm]


@pytest.mark.parametrize("topo", [Topology(1, 4), Topology(2, 4), Topology(3, 2)])
def test_variants_us_is_each_hardwares_own_cost(topo):
    from commbench import algorithms

    base = Hardware("v", topo.ranks_per_node, Link("intra", 50.0, 1.5, cache_bytes=1 << 20, cache_bw_gbps=90.0),
                    Link("inter", 8.0, 6.0, links_per_node=2), None, 4.0)
    hws = [replace(base, intra=replace(base.intra, bw_gbps=40.0 + i, latency_us=1.0 + i / 10, cache_bw_gbps=80.0 + i),
                   inter=replace(base.inter, bw_gbps=6.0 + i / 3, latency_us=5.0 + i), per_call_overhead_us=3.0 + i)
           for i in range(5)]
    for count in (1 << 10, 1 << 16, 3_000_001):
        forms = [algorithms.ring_allreduce_phases(topo, count, 2), algorithms.entry("allreduce", "hier").phases(topo,
                                                                                                             count)]
        for form in forms:
            assert variants_us(form, topo, hws, 4) == [phases_us(form, h, 4) for h in hws]
        schedule = algorithms.build("allreduce", "rhd", topo, count, count * 4, 0)
        assert variants_us(schedule, topo, hws, 4) == [schedule_us(schedule, topo, h, 4) for h in hws]


@pytest.mark.parametrize("algorithm", ["ring", "hier", "nccl-ring"])
def test_the_interval_is_the_prediction_when_every_resample_agrees_and_no_point_scatters(algorithm):
    hw = _exact(TRUE_HW)
    profile = load_profile("resnet50")
    q = StepQuestion.ddp(profile, 8, 3e4, 6e4, algorithm=algorithm)
    for topo in (Topology(1, 2), Topology(2, 2)):
        step = predict_step(q, topo, replace(hw, ranks_per_node=topo.ranks_per_node)).times.step_us
        low, high = step_interval_us(q, topo, replace(hw, ranks_per_node=topo.ranks_per_node))
        assert low == pytest.approx(step, rel=1e-12) and high == pytest.approx(step, rel=1e-12)
    for point in predict_scaling(q, hw, [2, 4], 2):
        assert point.step_interval_us == pytest.approx((point.step_us, point.step_us), rel=1e-12)
        assert point.linearity_interval == pytest.approx((point.linearity, point.linearity), rel=1e-12)


def test_a_fitted_interval_holds_the_prediction_and_has_a_width(fitted):
    assert fitted.meta["levels_fitted"] == {"intra": True, "inter": True}
    profile = load_profile("resnet50")
    for algorithm in ("ring", "hier"):
        points = predict_scaling(StepQuestion.ddp(profile, 8, 3e3, 6e3, algorithm=algorithm), fitted, [2, 4, 8], 2)
        for p in points:
            low, high = p.step_interval_us
            assert low <= p.step_us <= high and high - low > 1e-3 * p.step_us, (algorithm, p.gpus)
            assert p.samples_per_s_interval[0] <= p.samples_per_s <= p.samples_per_s_interval[1]
            assert p.linearity_interval[0] <= p.linearity <= p.linearity_interval[1]
    # compute is given, not spread: with 0.9 s of it and tens of ms of communication, the interval is as wide
    # as the communication's spread, not as the 15% scatter of the fit's points on the whole step
    for p in predict_scaling(StepQuestion.ddp(profile, 8, 3e5, 6e5, algorithm="ring"), fitted, [2, 4], 2):
        low, high = p.step_interval_us
        assert low <= p.step_us <= high and 0 < high - low < min(p.comm_us, 0.02 * p.step_us)


def test_no_interval_without_resamples_an_unmeasured_level_or_for_nccl(fitted):
    profile = load_profile("resnet50")
    ring = StepQuestion.ddp(profile, 8, 3e3, 6e3, algorithm="ring")
    preset = load_hardware("dgx-a100")
    assert all(p.step_interval_us is None and p.samples_per_s_interval is None and p.linearity_interval is None
               for p in predict_scaling(ring, preset, [8, 16], 8))
    assert all(p.step_interval_us is None for p in predict_scaling(ring.at(algorithm="nccl"), fitted, [2, 4], 2))
    one_node = F.fit(_records(ONE_NODE, 0.15))
    assert levels_fitted(one_node, Topology(1, 2)) and not levels_fitted(one_node, Topology(2, 2))
    two, four = predict_scaling(ring, one_node, [2, 4], 2)
    assert two.step_interval_us is not None and four.step_interval_us is None


@pytest.fixture(scope="module")
def hw_file(fitted, tmp_path_factory):
    path = tmp_path_factory.mktemp("intervals") / "hw.json"
    fitted.save(str(path))
    return path


def test_predict_scaling_prints_and_writes_the_interval(hw_file, tmp_path):
    out = tmp_path / "s.jsonl"
    proc = commbench("predict-scaling", "resnet50", "--hw", str(hw_file), "--gpus", "1,2,4", "--gpus-per-node", "2",
                     "--batch", "8", "--tflops", "1", "--baseline", "nccl", "--candidate", "ring", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "step 80%(ms)" in proc.stdout and "nccl: no interval" not in proc.stdout
    assert "1 GPU: no interval" in proc.stdout and "crosses" not in proc.stdout  # both levels fitted: 1 GPU is why
    records = [ScalingRecord.from_dict(r) for r in read_records(str(out))]
    for r in records:
        line = next(x for x in proc.stdout.splitlines() if x.split()[:2] == [r.algorithm, str(r.gpus)])
        if r.gpus == 1:
            assert r.step_interval_us is None and r.interval_source is None and " - " in line
            continue
        low, high = r.step_interval_us
        assert low < high and r.samples_per_s_interval[0] < r.samples_per_s_interval[1]
        # the fit's jackknife+ where it gives one (ring); NCCL's own constants have none: the corpus's calibration
        source, word = ("corpus calibration", "corpus") if r.algorithm == "nccl" else ("fit resamples", "fit")
        assert r.interval_source == source and f"[{low / 1e3:.2f}-{high / 1e3:.2f}] {word}" in line
        if source == "fit resamples":
            assert low <= r.step_us <= high
    preset = commbench("predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8", "--tflops", "100", "-A",
                       "ring", "--json", str(tmp_path / "p.jsonl"))
    assert preset.returncode == 0, preset.stderr
    assert "corpus calibration, not a fit" in preset.stdout  # no resamples: the published corpus calibrates it
    [record] = read_records(str(tmp_path / "p.jsonl"))
    assert record["interval_source"] == "corpus calibration"
    calibration = C.load_calibration()
    offsets = C.bounds(calibration.residuals)  # published - predicted: the interval is around the raw prediction
    assert record["linearity_interval"] == pytest.approx([record["raw_linearity"] + o for o in offsets])
    # ... and the estimate shown is the raw one moved by the residuals' median: inside the interval
    assert record["estimate"] == "calibrated"
    assert record["linearity"] == pytest.approx(record["raw_linearity"] + calibration.centre())
    assert offsets[0] <= calibration.centre() <= offsets[1]
    low, high = record["step_interval_us"]
    assert low == pytest.approx(record["batch"] * record["gpus"] / record["samples_per_s_interval"][1] * 1e6)


def test_proxy_sim_prints_and_writes_the_interval(hw_file, tmp_path):
    out = tmp_path / "p.jsonl"
    proc = commbench("proxy", "resnet50", "--backend", "sim", "--hw", str(hw_file), "--nodes", "2", "--gpus-per-node",
                     "2", "--batch", "8", "--compute", "flops", "--tflops", "1", "--algorithm", "ring", "--json",
                     str(out))
    assert proc.returncode == 0, proc.stderr
    records = read_records(str(out))
    summary = ProxyResult.from_dict(records[-1])
    low, high = summary.step_interval_us
    assert low <= summary.step_us_p50 <= high and low < high
    assert records[0]["step_interval_us"] == [low, high]  # the header says it too
    assert f"# step 80% interval (fit resamples): {low / 1e3:.2f}-{high / 1e3:.2f} ms" in proc.stdout
    assert summary.interval_source == "fit resamples"
    nccl = commbench("proxy", "resnet50", "--backend", "sim", "--hw", str(hw_file), "--nodes", "1", "--gpus-per-node",
                     "2", "--batch", "8", "--compute", "flops", "--tflops", "1", "--json", str(tmp_path / "n.jsonl"))
    assert nccl.returncode == 0, nccl.stderr
    assert "corpus calibration" in nccl.stdout  # no interval from the fit for nccl: the corpus's
    assert read_records(str(tmp_path / "n.jsonl"))[-1]["interval_source"] == "corpus calibration"
    preset = commbench("proxy", "resnet50", "--backend", "sim", "--hw", "dgx-a100", "--nodes", "2",
                       "--gpus-per-node", "8", "--tflops", "100", "--algorithm", "ring", "--json",
                       str(tmp_path / "d.jsonl"))
    assert preset.returncode == 0, preset.stderr
    records = read_records(str(tmp_path / "d.jsonl"))
    low, high = records[-1]["step_interval_us"]
    assert low < high and records[-1]["interval_source"] == "corpus calibration"
    assert f"# step 80% interval (corpus calibration): {low / 1e3:.2f}-{high / 1e3:.2f} ms" in preset.stdout


def test_files_from_before_the_intervals_still_read():
    summary = {"kind": "predicted", "model": "m", "backend": "model", "library": "x", "device": "-", "world_size": 2,
               "nnodes": 1, "batch": 1, "bucket_mb": None, "bucketing": "ddp", "buckets": 1, "gradient_bytes": 4,
               "compute": "none", "steps": 1, "warmup_steps": 0, "compute_us_p50": 0.0, "compute_us_p90": 0.0,
               "comm_us_p50": 1.0, "comm_us_p90": 1.0, "exposed_comm_us_p50": 1.0, "exposed_comm_us_p90": 1.0,
               "step_us_p50": 1.0, "step_us_p90": 1.0, "samples_per_s": 2e6}
    assert ProxyResult.from_dict(summary).step_interval_us is None
    scaling = {"model": "m", "hardware": "h", "batch": 1, "compute": "c", "gpus": 2, "nodes": 1, "gpus_per_node": 2,
               "algorithm": "ring", "step_us": 1.0, "compute_us": 0.0, "comm_us": 1.0, "exposed_comm_us": 1.0,
               "samples_per_s": 2e6, "speedup": 2.0, "linearity": 1.0}
    assert ScalingRecord.from_dict(scaling).step_interval_us is None
    assert json.dumps(ScalingRecord.from_dict(scaling).to_dict())  # written as it was read


def test_jackknife_intervals_hold_points_the_fit_did_not_see():
    """Fitted on a scattered sweep, asked for the sizes in between measured with another scatter pattern:
    at least 60% of them inside their 80% interval (the jackknife+'s guarantee is 1 - 2 x 20%), and every
    interval holds its prediction."""
    from commbench.analysis.intervals import interval_us

    hw = F.fit(_records(TWO_LEVELS, 0.15))
    unseen = _records(TWO_LEVELS, 0.15, powers=range(13, 24, 2), phase=0.9)
    inside = []
    for r in unseen:
        low, high = interval_us(hw, lambda v, r=r: F.predict_records([r], v)[0])
        assert low <= F.predict_records([r], hw)[0] <= high
        inside.append(low <= r["time_us"] <= high)
    assert np.mean(inside) >= 0.6


@pytest.mark.parametrize("n, k_low, k_high", [(4, 1, 4), (9, 2, 8), (14, 3, 12), (19, 4, 16), (20, 4, 17)])
def test_jackknife_bounds_are_the_exact_order_statistics(n, k_low, k_high):
    """floor(0.2 (n + 1))-th smallest low, ceil(0.8 (n + 1))-th smallest high, with no float rounding (1 - 0.8
    is 0.1999... in floats, which at n = 9, 14, 19 would take one order statistic lower)."""
    from commbench.analysis.intervals import Uncertainty

    times = np.column_stack([np.arange(1.0, n + 1), 100 + np.arange(1.0, n + 1)])[::-1]  # any order
    parsed = Uncertainty(np.ones(5), np.ones((n, 5)), np.zeros(n), paired=True)
    assert parsed.bounds(times) == (float(k_low), 100.0 + k_high)


def test_no_interval_from_fewer_than_four_points():
    """Three points: the jackknife+'s upper end would be unbounded, so the fit writes no interval and says why."""
    from commbench.analysis.intervals import uncertainty

    hw = F.fit(_records([(1, 2, ("ring",))], 0.1, powers=range(12, 18, 2)))
    assert hw.meta["points"] == 3 and uncertainty(hw) is None
    assert any("no prediction intervals" in note for note in hw.meta["notes"])


def test_a_damaged_header_does_not_stop_a_fit():
    """Headers are free-form: one whose run_id is a list, or whose ranks are not a list, is passed over."""
    points = _records(ONE_NODE, 0.05)
    for r in points:
        r["run_id"] = "r1"
    headers = [{"record": "header", "run_id": ["r1"], "ranks": [{"llc_bytes": 1 << 20}]},
               {"record": "header", "run_id": "r1", "ranks": "junk"}]
    assert F.fit(headers + points).meta["points"] == len(points)


@pytest.mark.parametrize("name, column", [("shm_2rank_loaded_refit_without_cache_cost.jsonl", "us_per_byte_cache"),
                                          ("shm_2rank_loaded_refit_without_byte_cost.jsonl", "us_per_byte_intra")])
def test_each_resample_is_the_refit_its_residual_came_from(name, column, tmp_path):
    """Two 2-rank shm sweeps (4K-1M, x4) measured here under load on 2026-11-25 whose leave-one-out refits
    put a fitted bandwidth at 0 us per byte (the cache regime's; the intra level's): the hardware `variants`
    rebuilds from the written file costs each left-out point to exactly the residual the fit stored for it
    (it used to keep the fit's own figures for such a level: residuals off by 1.1 points on the first file, by
    7.1 in test_check's run that found it)."""
    from commbench.analysis.intervals import interval_us, schedule_interval_us, variants

    records = read_records(str(DATA / name))
    F.fit(records).save(str(tmp_path / "hw.json"))
    hw = load_hardware(str(tmp_path / "hw.json"))
    block = hw.meta["uncertainty"]
    index = block["columns"].index(column)
    assert any(resample[index] == 0 for resample in block["resamples"])  # the case this data is kept for
    points = P.usable(records)
    refits = variants(hw)
    assert len(refits) == len(block["relative_residuals"]) == len(points)
    for point, refit, residual in zip(points, refits, block["relative_residuals"]):
        assert residual == pytest.approx(point["time_us"] / F.predict_records([point], refit)[0] - 1, rel=1e-9)
    for point in points:  # the interval costed on the variants is the one costed on the figures themselves
        topo, schedule = P.schedule_for(point)
        predicted = F.predict_records([point], hw)[0]
        assert interval_us(hw, lambda v, p=point: F.predict_records([p], v)[0]) == pytest.approx(
            schedule_interval_us(hw, schedule, topo, DTYPES[point["dtype"]].itemsize, predicted), rel=1e-9)


def test_a_fit_with_points_it_does_not_describe_says_why_its_intervals_are_wide():
    """On a loaded host the 80% intervals spanned three orders of magnitude (466-754,317 us) with nothing said
    (issue 32, item 13): jackknife+ pools the leave-one-out errors, and a few points off by 1000x widen every
    interval. wide_note names them; a fit without such points says nothing."""
    from commbench.analysis.intervals import WIDE_FACTOR, wide_note

    hw = _exact(TRUE_HW)
    assert wide_note(hw) is None
    block = dict(hw.meta["uncertainty"], pairing=F.JACKKNIFE, resamples=[hw.meta["uncertainty"]["fit"]] * 9,
                 relative_residuals=[4042.0, 170.0, 0.05, -0.03, 0.02, -0.9995, 0.01, 0.0, 0.04])
    note = wide_note(replace(hw, meta={**hw.meta, "uncertainty": block}))
    assert note.startswith(f"wide intervals: 3 of the fit's 9 points were off by more than {WIDE_FACTOR:g}x when "
                           f"left out (the largest 4,043x)")
    assert "fewer than 9" not in note
