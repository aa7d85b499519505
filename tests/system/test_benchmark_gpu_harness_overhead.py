"""benchmarks/gpu_harness_overhead.py without a GPU: one line and exit 2; its pairing and verdicts
(its figures need a GPU: benchmarks/gpu_run.sh runs it)."""
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_harness_overhead.py"


def test_without_a_gpu_it_refuses_in_one_line():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "needs" in proc.stderr, proc.stderr


def test_rounds_alternate_and_the_verdict_reads_the_iqr():
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_harness_overhead as bench

    order = []
    measure = {"bare": lambda: order.append("bare") or 10.0, "commbench": lambda: order.append("commbench") or 11.5}
    row = bench._paired("cupy", "eager", 1024, measure, rounds=4)
    assert order == ["bare", "commbench", "commbench", "bare"] * 2 and row["added_us"] == pytest.approx(1.5)
    assert bench.verdict(row) == "pass"
    assert bench.verdict({**row, "mode": "graph"}) == "FAIL"
    assert bench.verdict({**row, "mode": "graph", "iqr_us": [-0.2, 0.3]}) == "noisy"
