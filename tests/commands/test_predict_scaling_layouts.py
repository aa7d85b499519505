"""`predict-scaling MODEL --layout ...` as a user runs it: the ranking, its records, and layouts that cannot run
refused in one line."""
import json

import pytest
from conftest import REPO, commbench

from commbench import cli


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
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp2,dp8", "--global-batch", "0"], "--global-batch 0"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp2,dp8", "--seq-len", "0"], "--seq-len 0"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,bogus:2"], "unknown setup 'bogus'"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,dp2", "-A", "bogus"], "unknown allreduce algorithm"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,dp2", "--batch", "4"], "--batch: data-parallel"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,dp2", "--accumulate", "4"], "--accumulate: data-parallel"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "pp2,dp8", "--pp-schedule", "interleaved"], "--virtual-stages 2"),
    (["llama3.1-8b", "--gpus", "80", "--layout", "pp40,dp2"], "40 pipeline stages for the model's 32 layers"),
    (["mixtral-8x7b", "--gpus", "16", "--layout", "tp2,ep16,fsdp8"], "ep 16 must divide dp x cp = 8"),
])
def test_layouts_that_cannot_run_are_one_line(capsys, args, message):
    """In process (cli.main, as `python -m commbench` runs it): a process each only restarted Python."""
    code = cli.main(["predict-scaling", *args, "--hw", "dgx-h100", "--tflops", "400"])
    out, err = capsys.readouterr()
    assert code == 2, out
    assert message in err and err.count("\n") == 1, err


def test_experts_without_tensor_parallelism_and_a_hardware_without_a_peak(tmp_path):
    """etp1 lays EP over the TP ranks too (memory counted so, no crash); a hardware file without device_tflops
    prints no MFU rather than the given rate over itself."""
    import json as _json

    hw = _json.loads((REPO / "commbench" / "presets" / "dgx-h100.json").read_text())
    hw.pop("device_tflops")
    path = tmp_path / "hw.json"
    path.write_text(_json.dumps(hw))
    proc = commbench("predict-scaling", "mixtral-8x7b", "--hw", str(path), "--gpus", "16", "--tflops", "400",
                     "--layout", "tp2sp,ep8,etp1,ddp8", "--layout", "tp2,ep8,ddp8", "--json", str(tmp_path / "l.jsonl"))
    assert proc.returncode == 0, proc.stderr
    records = [_json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert {r["layout"]["layout"] for r in records} == {"tp2sp,ep8,etp1,ddp8", "tp2,ep8,ddp8"}
    assert all(r["mfu"] is None for r in records)
    etp1 = next(r for r in records if r["layout"]["expert_tp"] == 1)
    other = next(r for r in records if r["layout"]["expert_tp"] is None)
    # unsharded (DDP): experts over ep 8 alone under etp1, over ep 8 x tp 2 otherwise
    assert etp1["memory_nbytes"]["parameters"] > other["memory_nbytes"]["parameters"]
