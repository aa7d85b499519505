"""Stragglers: the expected slowest of N ranks, from a 1-rank run's measured step times."""
import json

import numpy as np
import pytest

from commbench.analysis.stragglers import JitterError, expected_max, load_ratios, step_ratios


def test_expected_max_of_the_empirical_distribution_is_exact():
    ratios = np.array([0.9, 1.0, 1.3])
    assert expected_max(ratios, 1) == pytest.approx(ratios.mean())
    # two draws of three equally likely values: P(max = 0.9) = 1/9, P(max = 1.0) = 3/9, P(max = 1.3) = 5/9
    assert expected_max(ratios, 2) == pytest.approx((0.9 * 1 + 1.0 * 3 + 1.3 * 5) / 9)
    assert expected_max(ratios, 10**6) == pytest.approx(1.3)  # never beyond the longest step measured


def test_expected_max_of_a_normal_sample_follows_its_order_statistics():
    sample = np.random.default_rng(7).normal(1.0, 0.02, 200_000)
    assert expected_max(sample, 2) - 1 == pytest.approx(0.02 / np.sqrt(np.pi), rel=0.05)  # E[max of 2] = s/sqrt(pi)
    grows = [expected_max(sample, n) for n in (2, 8, 64, 1000)]
    assert grows == sorted(grows) and grows[-1] - 1 == pytest.approx(3.24 * 0.02, rel=0.05)


def _steps(world: int, times: list[float]) -> list[dict]:
    return ([{"record": "proxy", "world_size": world}] + [{"record": "step", "step": 0, "warmup": True,
                                                           "step_us": 99.0}]
            + [{"record": "step", "step": i + 1, "warmup": False, "step_us": t} for i, t in enumerate(times)])


def test_ratios_are_a_one_rank_runs_steps_over_their_median_without_warm_up():
    assert list(step_ratios(_steps(1, [10.0, 20.0, 10.0, 11.0, 9.0]))) == [0.9, 1.0, 1.0, 1.1, 2.0]


@pytest.mark.parametrize("records, message", [
    (_steps(2, [1.0] * 8), "already wait for the slowest"),
    ([{"record": "header", "ranks": [{}, {}]}] + _steps(1, [1.0] * 8)[1:], "already wait for the slowest"),
    (_steps(1, [1.0] * 8) + [{"record": "step", "run_id": "other", "warmup": False, "step_us": 2.0}], "2 runs"),
    (_steps(1, [1.0] * 3), "at least 5"),
])
def test_unusable_records_are_one_line(records, message):
    with pytest.raises(JitterError, match=message):
        step_ratios(records)


def test_a_file_that_is_not_records_is_one_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text("not json\n")
    with pytest.raises(JitterError, match="x.jsonl"):
        load_ratios(str(path))
    path.write_text(json.dumps({"record": "proxy", "world_size": 1}) + "\n")  # not a whole record
    with pytest.raises(JitterError, match="x.jsonl"):
        load_ratios(str(path))


def test_predict_scaling_counts_ddp_work_and_the_slowest_of_n_ranks_from_a_real_run(tmp_path):
    from conftest import commbench

    run = tmp_path / "one.jsonl"
    out = commbench("proxy", "tts_angular", "--nprocs", "1", "--batch", "1", "--compute", "flops", "--tflops", "0.05",
                    "--steps", "8", "--warmup-steps", "1", "--json", str(run))
    assert out.returncode == 0, out.stderr
    base = ("predict-scaling", "tts_angular", "--hw", "dgx-a100", "--gpus", "1,8,64", "--batch", "1", "--tflops",
            "0.05", "-A", "ring")
    plain, more = tmp_path / "plain.jsonl", tmp_path / "more.jsonl"
    assert commbench(*base, "--json", str(plain)).returncode == 0
    out = commbench(*base, "--ddp-ms", "5", "--jitter-from", str(run), "--json", str(more))
    assert out.returncode == 0, out.stderr
    assert "DDP's own work: 5.00 ms per step (--ddp-ms)" in out.stdout and "stragglers (--jitter-from)" in out.stdout
    ratios = load_ratios(str(run))
    before = {r["gpus"]: r for r in map(json.loads, plain.read_text().splitlines()) if r["record"] == "scaling"}
    after = {r["gpus"]: r for r in map(json.loads, more.read_text().splitlines()) if r["record"] == "scaling"}
    one = after[1]["step_us"]
    assert one == pytest.approx(before[1]["step_us"] + 5000.0)  # 1 GPU: DDP's work, nobody to wait for
    for gpus in (8, 64):
        late = max(0.0, one * (expected_max(ratios, gpus) - 1))
        assert after[gpus]["straggler_us"] == pytest.approx(late)
        # without --jitter-from a preset waits for the published default distribution's slowest rank instead
        # (analysis/scale_terms.py): the measured run's delay replaces it, it does not add to it
        assert 0 < before[gpus]["straggler_us"] < before[gpus]["step_us"]
        assert after[gpus]["step_us"] >= before[gpus]["step_us"] - before[gpus]["straggler_us"] + 5000.0 + late - 1e-6
    assert after[64]["straggler_us"] >= after[8]["straggler_us"]
    assert "steps normal with CV 0.25%" in commbench(*base).stdout  # the default is said
    bad = commbench(*base, "--jitter-from", str(tmp_path / "missing.jsonl"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
