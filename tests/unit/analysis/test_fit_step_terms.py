"""analysis/fit_step_terms.py: the step terms fitted from proxy replays' own steps (other = a x overlapped comm + b x
calls + c), each term the runs cannot pin left at its class default and said so."""
import numpy as np
import pytest

from commbench.analysis.fit_step_terms import StepTermsFitError, fit_step_terms, step_rows
from commbench.step_terms import CPU_DEFAULTS, GPU_DEFAULTS, Term


def run_records(run_id: str, overlapped_us: list[float], calls: int, slope: float = 0.3, per_call_us: float = 40.0,
                rest_us: float = 150.0, world: int = 2, device: str = "cpu", kind: str = "proxy") -> list[dict]:
    """A replay whose every step's other time is the module's model exactly."""
    records = [{"record": "header", "run_id": run_id, "kind": kind, "config": {"device": device}}]
    for i, hidden in enumerate(overlapped_us):
        exposed = 1000.0 + 10 * i
        other = slope * hidden + per_call_us * calls + rest_us if world > 1 else 0.0
        records.append({"record": "step", "run_id": run_id, "step": i + 1, "warmup": False, "compute_us": 50e3,
                        "comm_us": hidden + exposed, "exposed_comm_us": exposed, "other_us": other,
                        "step_us": 50e3 + exposed + other, "calls_us": [[0.0, 1.0]] * calls})
    records.append({"record": "proxy", "run_id": run_id, "kind": kind, "device": device, "world_size": world,
                    "buckets": calls})
    return records


HIDDEN = [4000.0, 6000.0, 9000.0, 12000.0, 5000.0]


def test_two_bucket_counts_pin_both_terms_exactly():
    records = run_records("a", HIDDEN, calls=4) + run_records("b", [h * 1.3 for h in HIDDEN], calls=16)
    rows, skipped = step_rows(records)
    assert len(rows) == 10 and skipped == []
    terms, notes = fit_step_terms(rows, "cpu", "test runs")
    assert terms.overlap_slowdown.value == pytest.approx(0.3 / 0.7, rel=1e-6)
    assert terms.per_bucket_us.value == pytest.approx(40.0, rel=1e-6)
    assert terms.overlap_slowdown.source == terms.per_bucket_us.source == "fitted"
    assert "test runs: 10 measured steps of 2 replay(s)" in terms.overlap_slowdown.evidence
    assert terms.step_cv == CPU_DEFAULTS.step_cv and any(n.startswith("step_cv not fitted") for n in notes)


def test_one_bucket_count_leaves_per_bucket_at_its_default_and_says_why():
    terms, notes = fit_step_terms(step_rows(run_records("a", HIDDEN, calls=4))[0], "cpu", "r")
    assert terms.overlap_slowdown.value == pytest.approx(0.3 / 0.7, rel=1e-6)  # the constant went to c, not to a
    assert terms.per_bucket_us == CPU_DEFAULTS.per_bucket_us
    assert any("per_bucket_us not fitted (every step made 4 calls" in n for n in notes)
    # a hardware file's own block keeps what the runs do not pin
    own = CPU_DEFAULTS.__class__(CPU_DEFAULTS.overlap_slowdown, CPU_DEFAULTS.step_cv, Term(7.0, "measured", "mine"))
    kept, _ = fit_step_terms(step_rows(run_records("a", HIDDEN, calls=4))[0], "cpu", "r", own)
    assert kept.per_bucket_us == Term(7.0, "measured", "mine") and kept.overlap_slowdown.source == "fitted"


def test_a_gpu_replay_fits_no_slowdown_its_compute_sleeps():
    records = run_records("a", HIDDEN, calls=4, device="cuda") + run_records("b", HIDDEN, calls=8, device="cuda")
    terms, notes = fit_step_terms(step_rows(records)[0], "cuda", "r")
    assert terms.overlap_slowdown == GPU_DEFAULTS.overlap_slowdown
    assert terms.per_bucket_us.source == "fitted"
    assert any("GPU replay sleeps" in n for n in notes)


def test_predictions_and_training_runs_are_left_out_with_a_note():
    records = run_records("p", HIDDEN, calls=4, kind="predicted") + run_records("t", HIDDEN, calls=4, kind="train")
    rows, skipped = step_rows(records)
    assert rows == [] and len(skipped) == 2 and "kind predicted, not a replay" in skipped[0]
    with pytest.raises(StepTermsFitError, match="no step term could be fitted"):
        fit_step_terms(rows, "cpu", "r")


def test_warmup_steps_do_not_count():
    records = run_records("a", HIDDEN, calls=4)
    records[1]["warmup"] = True
    assert len(step_rows(records)[0]) == len(HIDDEN) - 1


def test_one_rank_replays_give_step_cv():
    rng = np.random.default_rng(0)
    steps = list(50e3 * (1 + 0.05 * rng.standard_normal(40)))
    records = [{"record": "header", "run_id": "one", "kind": "proxy"}]
    records += [{"record": "step", "run_id": "one", "step": i, "warmup": False, "compute_us": 50e3, "comm_us": 0.0,
                 "exposed_comm_us": 0.0, "other_us": s - 50e3, "step_us": s, "calls_us": []}
                for i, s in enumerate(steps)]
    records.append({"record": "proxy", "run_id": "one", "kind": "proxy", "device": "cpu", "world_size": 1})
    terms, _ = fit_step_terms(step_rows(records)[0], "cpu", "r")
    assert terms.step_cv.source == "fitted"
    assert terms.step_cv.value == pytest.approx(np.std(steps, ddof=1) / np.mean(steps))
    assert terms.overlap_slowdown == CPU_DEFAULTS.overlap_slowdown  # no multi-rank steps: nothing else fitted
