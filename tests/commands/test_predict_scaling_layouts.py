"""`predict-scaling MODEL --layout ...` as a user runs it: the ranking, its records, and layouts that cannot run
refused in one line."""
import json

import pytest
from conftest import commbench


def test_layouts_are_ranked_with_memory_beside(tmp_path):
    out = tmp_path / "layouts.jsonl"
    proc = commbench("predict-scaling", "llama3.1-8b", "--hw", "dgx-h100", "--gpus", "64", "--layout", "tp8,fsdp8",
                     "--layout", "tp4,pp2,fsdp8", "--layout", "tp2sp,dp32", "--tflops", "400", "--global-batch", "256",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert sorted(r[1] for r in rows) == ["tp2sp,ddp32", "tp4,pp2,fsdp8", "tp8,fsdp8"]
    speeds = [float(r[3].replace(",", "")) for r in rows]
    fits = [r[10] for r in rows]
    assert speeds == sorted(speeds, reverse=True) or "NO" in fits
    records = [json.loads(line) for line in out.read_text().splitlines()]
    layouts = [r for r in records if r["record"] == "layout"]
    assert len(layouts) == 3 and all(r["memory_nbytes"]["total"] > 0 and r["gpus"] == 64 for r in layouts)
    first = next(r for r in layouts if r["layout"]["layout"] == "tp8,fsdp8")
    assert first["acc_ratio"] == 1.0 and first["layout"]["microbatches"] == 32


@pytest.mark.parametrize("args,message", [
    (["resnet50", "--gpus", "8", "--layout", "tp2,dp4"], "has none"),
    (["llama3.1-8b", "--gpus", "64", "--layout", "tp8,dp4"], "= 32 GPUs, not 64"),
    (["llama3.1-8b", "--gpus", "24", "--layout", "tp3,dp8"], "tp 3 neither divides"),
    (["llama3.1-8b", "--gpus", "40", "--layout", "pp5,dp8"], "pp = 5 does not divide the model's 32 layers"),
    (["llama3.1-8b", "--gpus", "8", "--layout", "ep2,dp8"], "on a model without experts"),
    (["llama3.1-8b", "--gpus", "32", "--layout", "tp16,dp2"], "tp groups cross nodes of 8"),
    (["llama3.1-8b", "--gpus", "8,16", "--layout", "tp8,dp1"], "one --gpus"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tq2"], "spell a layout like"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp2,dp8", "--global-batch", "12"], "not a whole number"),
])
def test_layouts_that_cannot_run_are_one_line(args, message):
    proc = commbench("predict-scaling", *args, "--hw", "dgx-h100", "--tflops", "400")
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
