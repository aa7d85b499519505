"""Split-conformal calibration (analysis/calibration.py) and the published corpus it is made from
(analysis/corpus/published.py, analysis/corpus/)."""
import json
import math
import random

import numpy as np
import pytest

from commbench.analysis import calibration as C
from commbench.analysis.corpus.published import CORPUS_PATH, CorpusError, load_corpus, setup_choice


def test_order_statistics_are_the_exact_finite_sample_ones():
    # k_lo = floor((n + 1) 0.1), k_hi = ceil((n + 1) 0.9), in exact arithmetic: (9 + 1) x 0.1 is 1, not 0.999...
    assert C.order_indices(9) == (1, 9)
    assert C.order_indices(8) == (0, 9)  # 0.9 and 8.1: both ends unbounded
    assert C.order_indices(19) == (2, 18)
    assert C.order_indices(44) == (4, 41)  # 4.5 and 40.5
    assert C.order_indices(99) == (10, 90)


def test_bounds_are_those_order_statistics_of_the_residuals():
    residuals = [float(i) for i in range(19)]
    random.Random(1).shuffle(residuals)
    assert C.bounds(residuals) == (1.0, 17.0)  # the 2nd and 18th smallest
    assert C.bounds([0.1] * 8) == (-math.inf, math.inf)  # too few for an 80% interval: unbounded, not made up
    with pytest.raises(C.CalibrationError):
        C.bounds([])


def test_coverage_is_the_guaranteed_share_on_exchangeable_residuals():
    # 19 calibration residuals: the interval covers a 20th exchangeable one with probability (18 - 2) / 20 = 0.8
    rng = np.random.default_rng(0)
    draws = rng.standard_normal((4000, 20))
    hits = sum(C.bounds(row[:19])[0] <= row[19] <= C.bounds(row[:19])[1] for row in draws)
    assert abs(hits / len(draws) - 0.8) < 0.025


@pytest.mark.parametrize("n", [1, 2, 5, 8, 9, 19, 44, 99])
def test_the_centre_lies_inside_the_interval_at_any_size(n):
    """The calibrated estimate (raw + the median residual) is inside [raw + r_lo, raw + r_hi] for any n and any
    residuals: the issue's point outside its own interval cannot happen again."""
    rng = random.Random(n)
    for _ in range(50):
        residuals = [rng.uniform(-0.3, 0.05) for _ in range(n)]
        low, high = C.bounds(residuals)
        assert low <= C.centre(residuals) <= high
        calibration = C.Calibration(tuple(residuals), ("s",) * n, C.LEVEL, "", "")
        for raw in (0.2, 0.9, 1.0):
            estimate = calibration.linearity_estimate(raw)
            lin_low, lin_high = calibration.linearity_interval(raw)
            assert lin_low <= estimate <= lin_high


def test_leave_one_source_out_centres_never_use_the_held_out_source():
    residuals = {"a": [0.0, 0.0], "b": [-0.1, -0.1], "c": [-0.3]}
    centres = C.leave_one_source_out_centres(residuals)
    assert centres == {"a": pytest.approx(-0.1), "b": pytest.approx(0.0), "c": pytest.approx(-0.05)}


def test_leave_one_source_out_never_uses_the_held_out_source():
    residuals = {"a": [0.5, 0.6, 0.7, 0.8, 0.9], "b": [0.01 * i for i in range(10)],
                 "c": [-0.01 * i for i in range(10)]}
    held = C.leave_one_source_out(residuals)
    assert held["a"] == C.bounds(residuals["b"] + residuals["c"])
    changed = C.leave_one_source_out({**residuals, "a": [50.0] * 5})
    assert changed["a"] == held["a"]  # a's own residuals cannot move a's interval
    assert changed["b"] != held["b"]  # but they calibrate the others


def test_the_corpus_has_40_rows_from_5_sources_each_with_its_address():
    corpus = load_corpus()
    assert len(corpus.rows) >= 40 and len(corpus.sources) >= 5
    assert max(r.gpus for r in corpus.rows) >= 64 and min(r.gpus for r in corpus.rows) >= 8
    for source in corpus.sources.values():
        assert "@" in source["address"] or "http" in source["address"]
    for setup in corpus.setups.values():
        assert "@" in setup.stated_in  # the source's own code, at a commit
    row = next(r for r in corpus.rows if r.unit.startswith("images/s per GPU") and r.gpus == 16)
    assert row.linearity == pytest.approx(row.value / row.base)  # per-GPU figures: linearity is their ratio


def test_a_damaged_corpus_is_one_line(tmp_path):
    with open(CORPUS_PATH, encoding="utf-8") as handle:
        data = json.load(handle)
    data["rows"][0]["precision"] = "fp8"
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CorpusError, match=r"rows\[0\]\.precision") as info:
        load_corpus(str(path))
    assert "\n" not in str(info.value)


def test_published_rows_are_predicted_with_the_setup_tables_entry(tmp_path):
    """No stand-in: a source's setup is the table's entry with the knobs its code states, checked as the entry
    checks them (a knob the setup does not take is one line)."""
    from commbench.analysis.corpus.published import Setup

    choice = setup_choice(Setup("horovod", {"fusion_mb": 64, "accumulate": 1}, "x"))
    assert choice.setup.name == "horovod" and choice.get("fusion_mb") == 64 and choice.get("cycle_ms") == 1.0
    assert setup_choice(Setup("apex", {}, "x")).get("message_size") == 10_000_000
    with open(CORPUS_PATH, encoding="utf-8") as handle:
        data = json.load(handle)
    source = next(iter(data["setups"]))
    data["setups"][source]["fusion_mb"] = 64  # a ddp entry: DDP has no fusion threshold
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CorpusError, match=f"setups.{source}: setup ddp has no knob --fusion-mb") as info:
        load_corpus(str(path))
    assert "\n" not in str(info.value)


def test_the_shipped_calibration_covers_every_corpus_row():
    calibration = C.load_calibration()
    assert calibration is not None
    corpus = load_corpus()
    assert len(calibration.residuals) == len(corpus.rows)
    assert set(calibration.sources) == set(corpus.sources)
    lo, hi = C.bounds(calibration.residuals)
    assert calibration.linearity_interval(0.9) == (0.9 + lo, 0.9 + hi)  # the residuals' offsets, not symmetric
    assert calibration.linearity_interval(0.05)[0] == 0.0  # a linearity is never negative


def test_a_damaged_calibration_is_one_line(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text('{"residuals": [0.1, 0.2], "sources": ["a"], "level": "4/5"}')
    with pytest.raises(C.CalibrationError) as info:
        C.load_calibration(str(path))
    assert "\n" not in str(info.value)


def test_terms_apply_to_a_preset_and_never_to_a_fitted_file():
    from dataclasses import replace

    from commbench.analysis.predict_scaling import evidence_terms
    from commbench.analysis.scale_terms import DEFAULT_STEP_CV, default_step_ratios
    from commbench.costmodel import load_hardware

    preset = load_hardware("dgx-a100")
    hw, ratios, said = evidence_terms(preset, None)
    assert hw.inter.bw_gbps == pytest.approx(25.0 * 24 / 25)  # HDR: 24 GB/s of nccl-tests busbw per NIC
    assert len(said) == 2 and "nccl issue #412" in said[0] and "CV 0.25%" in said[1]
    assert np.median(ratios) == pytest.approx(1.0) and np.std(ratios) == pytest.approx(DEFAULT_STEP_CV.value, rel=0.02)
    measured = default_step_ratios(0.05)
    assert evidence_terms(preset, measured)[1] is measured  # a measured distribution is kept, not replaced
    fitted = replace(preset, meta={"levels_fitted": {"intra": True, "inter": True}})
    assert evidence_terms(fitted, None) == (fitted, None, ())  # measured bandwidths and steps: nothing added
