"""`commbench proxy --hw` (a step predicted by the cost model): the step shown is the calibrated estimate, inside
its 80% interval, with the cost model's raw step beside it, labelled raw, in the table's lines and the records."""
import pytest
from conftest import commbench

from commbench.analysis import calibration as C
from commbench.results import read_records


def test_a_preset_step_is_the_calibrated_estimate_inside_its_interval(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = commbench("proxy", "resnet50", "--nodes", "4", "--gpus-per-node", "8", "--hw", "dgx-a100", "--tflops",
                     "100", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    header, step, summary = read_records(str(out))
    low, high = summary["step_interval_us"]
    assert low <= summary["step_us_p50"] <= high and summary["interval_source"] == "corpus calibration"
    assert summary["estimate"] == header["estimate"] == "calibrated"
    raw = summary["raw_step_us"]
    assert raw == header["raw_step_us"] and raw < summary["step_us_p50"]  # the corpus: the model was optimistic
    # the calibrated step is the one-rank step over the calibrated linearity; what it adds is calibration_us, apart
    # from other (until 2026-11-27 it was counted in other)
    one = summary["compute_us_p50"]  # one rank: its compute, nothing else (no DDP work given, no calls)
    assert one / summary["step_us_p50"] == pytest.approx(one / raw + C.load_calibration().centre(), rel=1e-9)
    assert step["step_us"] == summary["step_us_p50"]
    assert step["calibration_us"] == summary["calibration_us"] == pytest.approx(summary["step_us_p50"] - raw)
    assert step["calibration_us"] > 0 and step["other_us"] == summary["other_us_p50"]
    for record, suffix in ((step, ""), (summary, "_p50")):
        assert record[f"step_us{suffix}"] == pytest.approx(record[f"compute_us{suffix}"] + record[
            f"exposed_comm_us{suffix}"] + record[f"other_us{suffix}"] + record["calibration_us"])
        # other is the cost model's own: the raw step's parts
        assert raw == pytest.approx(record[f"compute_us{suffix}"] + record[f"exposed_comm_us{suffix}"]
                                    + record[f"other_us{suffix}"])
    assert "calibration_us in the records" in proc.stdout
    assert f"raw {raw / 1e3:.2f} ms: the cost model's own figure" in proc.stdout
    assert f"estimate {summary['step_us_p50'] / 1e3:.2f} ms" in proc.stdout
    assert header["step_terms"]["step_cv"]["source"] == "defaulted"
    assert any(x.startswith("# step terms: overlap_slowdown") for x in proc.stdout.splitlines())


def test_one_rank_is_the_raw_step(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = commbench("proxy", "resnet50", "--nodes", "1", "--gpus-per-node", "1", "--hw", "dgx-a100", "--tflops",
                     "100", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = read_records(str(out))[-1]
    assert summary["estimate"] == "raw" and summary["raw_step_us"] == summary["step_us_p50"]
    assert summary["calibration_us"] is None and read_records(str(out))[1]["calibration_us"] is None
    assert summary["step_interval_us"] is None and "calibrated" not in proc.stdout  # nothing to calibrate on 1 rank
