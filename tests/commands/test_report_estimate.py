"""`commbench report` of predict-scaling's records: its table gives the estimate, its interval and the cost
model's raw linearity beside it, labelled, and the chart draws the raw curve beside the calibrated one."""
from conftest import commbench

from commbench.results import read_records


def test_the_scaling_table_shows_the_estimate_its_interval_and_the_raw_figure(tmp_path):
    records = tmp_path / "s.jsonl"
    proc = commbench("predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8,64", "--json", str(records))
    assert proc.returncode == 0, proc.stderr
    report = commbench("report", str(records), "-o", str(tmp_path / "r"))
    assert report.returncode == 0, report.stderr
    index = (tmp_path / "r" / "index.md").read_text()
    assert "| linearity | linearity 80% | raw linearity | estimate |" in index
    for r in read_records(str(records)):
        low, high = r["linearity_interval"]
        assert low <= r["linearity"] <= high
        assert (f"| {r['linearity']:.3f} | {low:.3f}-{high:.3f} | {r['raw_linearity']:.3f} | calibrated |"
                in index)
    assert (tmp_path / "r" / "scaling.png").exists()
