"""A proxy's printed rows, its summary and its JSON describe the same steps: each step's slowest
rank, with every rank's figures kept."""
from __future__ import annotations

import json
import statistics

import pytest
from conftest import commbench


def test_rows_summary_and_json_agree(tmp_path):
    path = tmp_path / "p.jsonl"
    proc = commbench("proxy", "resnet18", "--nprocs", "2", "--batch", "2", "--steps", "3", "--warmup-steps", "1",
                     "--tflops", "1", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [r for r in records if r["record"] == "step"]
    summary = next(r for r in records if r["record"] == "proxy")
    for step in steps:
        assert len(step["ranks_us"]) == 2
        assert step["step_us"] == max(rank[3] for rank in step["ranks_us"])
        assert step["ranks_us"][step["slowest_rank"]][3] == step["step_us"]
        # the split adds up, and exposed communication is communication that was measured
        assert step["compute_us"] + step["exposed_comm_us"] + step["other_us"] == pytest.approx(step["step_us"])
        assert step["exposed_comm_us"] <= step["comm_us"] and step["other_us"] >= 0
        for compute, comm, exposed, whole, other in step["ranks_us"]:
            assert exposed <= comm and compute + exposed + other == pytest.approx(whole)
    measured = [s["step_us"] for s in steps if not s["warmup"]]
    assert summary["steps"] == 3 and summary["step_us_p50"] == statistics.median(measured)
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert [float(row[5]) for row in rows] == [round(s["step_us"] / 1e3, 2) for s in steps]
    assert [float(row[4]) for row in rows] == [round(s["other_us"] / 1e3, 2) for s in steps]
    assert summary["other_us_p50"] == statistics.median(s["other_us"] for s in steps if not s["warmup"])
    assert "1 warm-up step(s), then 3 measured" in proc.stdout
