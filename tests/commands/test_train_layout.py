"""`train MODEL --layout SPEC`: a parallel layout trained for real (proxies/train_layout_run.py) on 4 spawned
gloo ranks, through the job frame and records of `train` and `proxy --layout` (the header and every record
carry the layout); layouts or options the trainer cannot run: one line, exit 2, before any rank starts."""
from __future__ import annotations

import pytest
from conftest import commbench

from commbench.results import read_records


def test_a_pipelined_layout_trains_end_to_end_with_records(tmp_path):
    out = tmp_path / "t.jsonl"
    run = commbench("train", "llama-tiny", "--layout", "pp2,fsdp2", "--microbatches", "2", "-N", "4", "--steps",
                    "2", "--warmup-steps", "1", "--json", str(out), timeout=240)
    assert run.returncode == 0, run.stderr
    records = read_records(str(out))
    header, steps, summary = records[0], [r for r in records if r["record"] == "step"], records[-1]
    assert header["kind"] == "train" and header["layout"]["layout"] == "pp2,fsdp2"
    assert header["layout"]["pp"] == 2 and header["layout"]["microbatches"] == 2
    assert len(steps) == 3 and all(s["layout"] == "pp2,fsdp2" and s["step_us"] > 0 for s in steps)
    assert all(s["compute_us"] is None for s in steps)  # real training: the step's time alone
    assert len(steps[-1]["ranks_us"]) == 4
    assert summary["status"] == "ok" and summary["kind"] == "train" and summary["layout"]["dp"] == 2
    # samples: 2 micro-batches of one sequence on each of the 2 data-parallel ranks
    assert summary["samples_per_s"] == pytest.approx(4 / (summary["step_us_p50"] * 1e-6))
    assert "real training of layout pp2,fsdp2 on 4 ranks" in run.stdout


@pytest.mark.parametrize("extra, message", [
    (["--layout", "tp2,dp2"], "shards the data-parallel part with FSDP2: spell it fsdp2"),
    (["--layout", "tp3,fsdp2"], "tp3,fsdp2: tp x pp x cp x dp = 3 x 1 x 1 x 2 = 6 GPUs, not 4"),
    (["--layout", "ep2,fsdp4"], "ep 2 on a model without experts"),
    (["--layout", "tp2,fsdp2", "--microbatches", "2"], "runs micro-batches through a pipeline only"),
    (["--layout", "cp2,pp2"], "cp, ep or sequence parallelism beside pp is not trained"),
    (["--layout", "tp2,fsdp2", "--checkpointing", "full"], "keeps every activation"),
])
def test_a_layout_train_cannot_run_is_one_line_and_exit_2(extra, message):
    run = commbench("train", "llama-tiny", "-N", "4", *extra, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in run.stderr


def test_a_layout_train_on_a_gpu_host_with_device_auto_is_refused(monkeypatch, capsys):
    """--device auto resolves to cuda where a GPU is visible: the CPU-only trainer refuses it before ranks start."""
    from commbench.backends import torch_lazy
    from commbench.cli import main

    monkeypatch.setattr(torch_lazy, "cuda_available", lambda: True)
    assert main(["train", "llama-tiny", "-N", "4", "--layout", "tp2,fsdp2"]) == 2
    assert "trains on CPU ranks over gloo (give --device cpu" in capsys.readouterr().err
