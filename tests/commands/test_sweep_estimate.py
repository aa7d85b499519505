"""`sweep --backend sim --hw`: its times are the cost model's own, and its records say so (`estimate: raw`,
`raw_time_us` its time), as `predict`'s records say what their time is. Before 2026-11-27 they wrote `estimate:
null`, where the field is documented for every record of kind predicted. A measured sweep, and a sim sweep without
--hw (nothing timed), keep both null."""
from conftest import commbench, results_of


def test_a_sim_sweep_says_its_time_is_the_cost_models_own(tmp_path):
    path = tmp_path / "s.jsonl"
    proc = commbench("sweep", "--backend", "sim", "-N", "4", "--hw", "dgx-a100", "-c", "allreduce,allgather",
                     "--sizes", "1K,1M", "--placement", "in-place", "--iters", "2", "--warmup", "1", "--json",
                     str(path))
    assert proc.returncode == 0, proc.stderr
    results, _ = results_of(path)
    assert len(results) == 4
    for r in results:
        assert r["kind"] == "predicted" and r["time_us"] > 0
        assert r["estimate"] == "raw" and r["raw_time_us"] == r["time_us"]
    assert "raw " not in proc.stdout  # the table labels a raw time only beside a calibrated one


def test_an_untimed_sim_sweep_has_no_estimate(tmp_path):
    path = tmp_path / "s.jsonl"
    proc = commbench("sweep", "--backend", "sim", "-N", "2", "-c", "allreduce", "--sizes", "1K", "--iters", "2",
                     "--warmup", "1", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    results, _ = results_of(path)
    assert results and all(r["time_us"] is None and r["estimate"] is None and r["raw_time_us"] is None
                           for r in results)
