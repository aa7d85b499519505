"""fit -> predict round trips on synthetic data with known alpha and beta (analysis/fit.py), and the model's
commands (sweep, fit, predict, sim, report) on them from the command line."""
import json

import numpy as np
import pytest

from commbench import algorithms as A
from commbench import costmodel as M
from commbench.analysis import fit as F
from commbench.topology import Link, Topology

NVLINK = Link("nvlink", bw_gbps=100.0, latency_us=2.0)
IB = Link("ib", bw_gbps=25.0, latency_us=5.0, links_per_node=1)
HW = M.Hardware("test", 8, NVLINK, IB)


def _synthetic(hw, worlds, sizes, algorithm=None, backend="shm", nnodes=1, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    records = []
    for world in worlds:
        topo = Topology(nnodes, world // nnodes)
        for nbytes in sizes:
            count = nbytes // 4 - (nbytes // 4) % world
            name = algorithm or "ring"
            schedule = A.build("allreduce", name, topo, count, count * 4)
            t = M.schedule_us(schedule, topo, hw, 4) * (1 + noise * rng.standard_normal())
            records.append({"record": "result", "kind": "measured", "collective": "allreduce", "backend": backend,
                            "library": "shm", "algorithm": algorithm, "dtype": "float32", "placement": "in-place",
                            "world_size": world, "nnodes": nnodes, "count": count, "nbytes": count * 4,
                            "time_us": t, "wrong": 0, "root": None})
    return records


def test_fit_recovers_known_alpha_and_beta():
    truth = M.Hardware("truth", 4, Link("shm", 8.0, 3.0), Link("shm", 8.0, 3.0))
    records = _synthetic(truth, [2, 4], [1 << k for k in range(10, 27, 2)], algorithm="ring")
    hw = F.fit(records)
    assert hw.intra.bw_gbps == pytest.approx(8.0, rel=1e-3)
    assert hw.intra.latency_us + hw.per_call_overhead_us / 2 == pytest.approx(3.0, rel=0.05)
    assert hw.meta["median_ape"] < 1e-3 and hw.meta["levels_fitted"] == {"intra": True, "inter": False}
    predicted = F.predict_records(_synthetic(truth, [3], [1 << 20]), hw)
    assert predicted[0] == pytest.approx(M.schedule_us(A.ring_allreduce(Topology(1, 3), (1 << 18) - 1), Topology(1, 3),
                                                       truth, 4), rel=0.02)


def test_fit_finds_a_cache_regime_and_predicts_across_it():
    """Working sets up to 8 MiB at 30 GB/s, beyond at 6 GB/s: the fit recovers both and the boundary,
    and predicts 4 ranks (whose working set crosses it at half the per-rank size)."""
    truth = M.Hardware("truth", 2, Link("shm", 6.0, 2.0, cache_bytes=8 << 20, cache_bw_gbps=30.0),
                       Link("shm", 6.0, 2.0))
    records = _synthetic(truth, [2], [1 << k for k in range(14, 27)], algorithm="ring", noise=0.01)
    hw = F.fit(records)
    assert hw.intra.bw_gbps == pytest.approx(6.0, rel=0.05) and hw.intra.cache_bw_gbps == pytest.approx(30, rel=0.1)
    # between the largest measured working set inside (8 MiB) and the smallest outside (16 MiB): the midpoint
    assert hw.intra.cache_bytes == int(np.sqrt((8 << 20) * (16 << 20)))
    assert any("cache regime" in note for note in hw.meta["notes"])
    four = _synthetic(truth, [4], [1 << k for k in range(14, 27)], algorithm="ring")
    errors = np.abs(F.predict_records(four, hw) / [r["time_us"] for r in four] - 1)
    assert np.median(errors) < 0.05
    plain = F.fit(_synthetic(M.Hardware("t", 2, Link("shm", 6.0, 2.0), Link("shm", 6.0, 2.0)), [2],
                             [1 << k for k in range(14, 27)], algorithm="ring", noise=0.01))
    assert plain.intra.cache_bytes is None  # no cache regime where the data show none


def test_a_cache_regime_without_a_measurable_byte_cost_is_capped_and_the_file_loads(tmp_path):
    """Working sets in cache that cost latency only (a loaded host's fit wrote 3.96e30 GB/s, which load_hardware
    refuses): the rate written is CACHE_BW_CAP_GBPS, said in a note, and the file loads."""
    truth = M.Hardware("truth", 2, Link("shm", 6.0, 2.0, cache_bytes=8 << 20, cache_bw_gbps=1e12),
                       Link("shm", 6.0, 2.0))
    hw = F.fit(_synthetic(truth, [2], [1 << k for k in range(14, 27)], algorithm="ring"))
    assert hw.intra.cache_bytes and hw.intra.cache_bw_gbps == F.CACHE_BW_CAP_GBPS
    assert any("no per-byte cost the fit can measure" in note for note in hw.meta["notes"])
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(hw.to_dict()))
    assert M.load_hardware(str(path)).intra.cache_bw_gbps == F.CACHE_BW_CAP_GBPS


def test_fit_puts_the_cache_boundary_at_the_hosts_last_level_cache():
    """A sweep with one fitted size beyond the cache: from the data alone no boundary is tried (a regime
    needs 2 points beyond), and the lone point is left as an outlier; with the hosts' last-level cache in
    the run header the fit tries it there, finds both bandwidths and writes that size. In the jackknife
    the lone point has no residual: without it nothing pins the bandwidth beyond the cache."""
    llc = 32 << 20
    truth = M.Hardware("truth", 2, Link("shm", 10.0, 1.5, cache_bytes=llc, cache_bw_gbps=40.0), Link("shm", 10.0, 1.5))
    points = _synthetic(truth, [2], [1 << k for k in range(16, 27, 2)], algorithm="ring", noise=0.01)
    for r in points:
        r["run_id"] = "r1"
    header = {"record": "header", "run_id": "r1", "ranks": [{"host": "h", "device": "cpu", "cpus": 2,
                                                            "llc_bytes": llc}] * 2}
    blind = F.fit(points)
    assert blind.intra.cache_bytes is None
    hw = F.fit([header] + points)
    assert hw.intra.cache_bytes == llc
    assert hw.intra.bw_gbps == pytest.approx(10.0, rel=0.05) and hw.intra.cache_bw_gbps == pytest.approx(40, rel=0.05)
    assert any("last-level cache" in note for note in hw.meta["notes"])
    errors = F.predict_records(points, hw) / [r["time_us"] for r in points] - 1
    assert np.abs(errors).max() < 0.03
    block = hw.meta["uncertainty"]
    assert len(block["resamples"]) == len(block["relative_residuals"]) == len(points) - 1  # the 64 MiB point: none
    assert np.abs(block["relative_residuals"]).max() < 0.05


def test_fit_is_robust_to_an_outlier_and_fits_the_inter_level():
    truth = M.Hardware("truth", 2, Link("nvlink", 100.0, 2.0), Link("ib", 10.0, 8.0))
    records = _synthetic(truth, [4, 8], [1 << k for k in range(12, 27, 2)], algorithm="hier", nnodes=2, noise=0.01)
    records[3]["time_us"] *= 5  # one disturbed point
    hw = F.fit(records)
    assert hw.inter.bw_gbps == pytest.approx(10.0, rel=0.05)
    assert hw.meta["levels_fitted"]["inter"]


def test_fit_errors_name_what_is_missing():
    with pytest.raises(F.FitError, match="0 usable points"):
        F.fit([{"record": "header"}])
    mixed = _synthetic(HW, [2], [1024, 4096, 8192], algorithm="ring") + \
        _synthetic(HW, [2], [1024, 4096, 8192], algorithm="oneshot")
    whole = F.fit(mixed)  # one backend whose algorithms differ (auto): fitted whole
    assert whole.meta["points"] == 6 and whole.name == "fit:shm/shm/oneshot+ring"
    assert F.fit(mixed, setup="shm/shm/ring").meta["points"] == 3
    assert F.fit(mixed, setup="shm/shm").meta["points"] == 6
    two_backends = mixed + _synthetic(HW, [2], [1024, 4096, 8192], algorithm="ring", backend="p2p")
    with pytest.raises(F.FitError, match="several setups"):
        F.fit(two_backends)


def test_sweep_fit_predict_and_sim_from_the_command_line(tmp_path):
    """A real shm sweep, fitted, then predicted and simulated with the fit: the same numbers."""
    from conftest import commbench, results_of

    sweep = commbench("sweep", "--backend", "shm", "--sizes", "4K,64K,1M,4M", "--placement", "in-place",
                      "--iters", "20", "--warmup", "3", "--json", str(tmp_path / "m.jsonl"))
    assert sweep.returncode == 0, sweep.stderr
    # --accept-poor-fit: a loaded machine can put the median point past 25% (30% seen, 2026-11-25); the
    # refusal is test_fit_quality's, and what this test checks (predict and sim agree) holds either way
    fitted = commbench("fit", str(tmp_path / "m.jsonl"), "-o", str(tmp_path / "hw.json"), "--accept-poor-fit")
    assert fitted.returncode == 0, fitted.stderr
    # auto runs ring at every size on 2 shm ranks (pushed: one round, algorithms.choose); mixed
    # algorithms are fitted whole: test_fit_errors_name_what_is_missing above
    assert "fitted shm/shm/ring: 4 points" in fitted.stdout and "inter level not fitted" in fitted.stdout
    ranged = commbench("fit", str(tmp_path / "m.jsonl"), "--sizes", "64K-4M", "-o", str(tmp_path / "hw2.json"),
                       "--accept-poor-fit")
    assert ranged.returncode == 0 and "3 points" in ranged.stdout, ranged.stderr
    hw = M.load_hardware(str(tmp_path / "hw.json"))
    assert hw.intra.bw_gbps > 0 and hw.meta["points"] == 4
    predicted = commbench("predict", "--hw", str(tmp_path / "hw.json"), "--topology", "1x2", "--sizes", "64K,1M",
                          "--json", str(tmp_path / "p.jsonl"))
    assert predicted.returncode == 0, predicted.stderr
    simulated = commbench("sweep", "--backend", "sim", "-N", "2", "--hw", str(tmp_path / "hw.json"), "--sizes",
                          "64K,1M", "--placement", "in-place", "--json", str(tmp_path / "s.jsonl"))
    assert simulated.returncode == 0, simulated.stderr
    pred, sim = results_of(tmp_path / "p.jsonl")[0], results_of(tmp_path / "s.jsonl")[0]
    assert [r["kind"] for r in pred + sim] == ["predicted"] * 4
    assert [r["time_us"] for r in sim] == pytest.approx([r["time_us"] for r in pred])
    assert all(r["wrong"] == 0 for r in sim)


@pytest.mark.parametrize("args,needle", [
    (["fit", "{tmp}/empty.jsonl", "-o", "{tmp}/fitted.json"], "0 usable points"),
    (["predict", "--hw", "nope", "--topology", "2x8"], "no hardware file or preset 'nope'"),
    (["predict", "--hw", "{tmp}/hw.json", "--topology", "2by8"], "bad --topology"),
    (["predict", "--hw", "{tmp}/hw.json", "--topology", "2x8", "-c", "sendrecv"], "sendrecv"),
    (["predict", "--hw", "{tmp}/hw.json", "--topology", "1x4", "-c", "broadcast", "--root", "9"], "--root 9"),
    (["predict", "--hw", "{tmp}/hw.json", "--topology", "1x4", "--json", "/proc/nope/p.jsonl"], "/proc/nope"),
    (["fit", "/bin/ls", "-o", "{tmp}/x.json"], "/bin/ls:1: not UTF-8 text"),
    (["report", "{tmp}/hw.json", "-o", "/proc/nope/rep"], "hw.json:1: not JSON"),
    (["report", "{tmp}/empty.jsonl", "-o", "/proc/nope/rep"], "no timed result, proxy, scaling or compare record in"),
    (["sweep", "--backend", "shm", "--hw", "{tmp}/hw.json"], "--hw times the sim backend"),
    (["sweep", "--backend", "sim", "--hw", "{tmp}/broken.json"], "missing field"),
])
def test_model_commands_reject_bad_input_in_one_line(tmp_path, args, needle):
    from conftest import commbench

    (tmp_path / "empty.jsonl").write_text('{"record": "header"}\n')
    HW.save(str(tmp_path / "hw.json"))
    (tmp_path / "broken.json").write_text('{"levels": {}}')
    proc = commbench(*[a.format(tmp=tmp_path) for a in args])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr


def test_report_draws_measured_and_predicted(tmp_path):
    from commbench.analysis.report import collect_series, report
    from commbench.cli import main

    records = _synthetic(HW, [2, 4], [1 << k for k in range(10, 21, 2)], algorithm="ring")
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    HW.save(str(tmp_path / "hw.json"))
    assert main(["report", str(path), "--hw", str(tmp_path / "hw.json"), "-o", str(tmp_path / "rep")]) == 0
    index = (tmp_path / "rep" / "index.md").read_text()
    assert "shm/ring, 2 ranks | measured" in index and "shm/ring, 4 ranks | predicted" in index
    png = (tmp_path / "rep" / "allreduce.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    series = collect_series(records)
    assert [len(s.nbytes) for s in series] == [6, 6]
    with pytest.raises(ValueError, match="hw.json:1: not JSON"):  # a hardware file is no results file
        report([str(tmp_path / "hw.json")], str(tmp_path / "none"))
