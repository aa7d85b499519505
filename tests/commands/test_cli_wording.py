"""Lines that said something untrue of the run they were in (issue 32, item 14): each now says what holds."""
from __future__ import annotations

import io
import re
import types

import pytest

from commbench import cli, job
from commbench.results import point_result
from commbench.table import Table


def error_of(capsys, args) -> str:
    assert cli.main(args) == 2
    return capsys.readouterr().err


def test_the_nccl_tests_hint_names_b_only_when_b_was_given(capsys):
    """`sweep -e 128M` said "(here -b is --backend)" with no -b on the line."""
    assert "(here -b is --backend)" not in error_of(capsys, ["sweep", "-e", "128M"])
    assert "(here -b is --backend)" in error_of(capsys, ["sweep", "-b", "8", "-e", "128M"])


@pytest.mark.parametrize("command,ways", [
    (["sweep"], ["--nprocs N", "--nodes N --gpus-per-node G"]),
    (["train", "resnet18"], ["--nprocs N"]),
])
def test_torchruns_nproc_per_node_is_answered_with_nprocs(capsys, command, ways):
    """click guessed --gpus-per-node from the spelling, where a CPU user wants --nprocs."""
    err = error_of(capsys, [*command, "--nproc-per-node", "2"])
    assert err.startswith("commbench: error: no option --nproc-per-node (torchrun's): here, --nprocs N"), err
    assert all(way in err for way in ways) and ("--gpus-per-node" in err) == (len(ways) > 1), err


def noisy_footer(json_kept: bool) -> str:
    out = io.StringIO()
    table = Table(["out-of-place"], stream=out, json_kept=json_kept)
    result = point_result(types.SimpleNamespace(collective="allreduce", nbytes=1024, count=256, root=-1, world=2,
                                                requested_nbytes=1024),
                          dtype="float32", op="sum", placement="out-of-place", nnodes=1, backend="torch",
                          library="gloo", device="cpu", time_us=10.0, per_iteration_us=[1.0, 1.0, 1.0, 50.0],
                          warmup=1, rank_agg="max", wrong=0, run_id="x", kind="measured")
    table.row({"out-of-place": result}, "float")
    table.footer(checked=True)
    return out.getvalue()


def test_the_noisy_footer_points_at_the_json_only_when_there_is_one():
    """The footer said "(... in the JSON)" in a run without --json."""
    assert "(p50_us, p99_us and iteration_times_us in the JSON)" in noisy_footer(json_kept=True)
    without = noisy_footer(json_kept=False)
    assert "add --json FILE to keep p50_us" in without and "(p50_us" not in without


def test_validate_names_the_setup_it_trains(monkeypatch, capsys, tmp_path):
    """`--validate` on fsdp said "real DDP training"."""
    from commbench.commands import proxy
    from commbench.proxies.config import ProxyConfig

    monkeypatch.setattr(proxy, "_launch", lambda *a, **k: 3)
    cfg = ProxyConfig(model="resnet18", setup="fsdp-full", json_path=str(tmp_path / "p.jsonl"))
    proxy._validate(cfg, job.Plan("spawn", 2), keep=False, force=False)
    out = capsys.readouterr().out
    assert "real training of setup fsdp-full" in out and "DDP" not in out


def test_each_setups_nccl_block_is_labelled(capsys):
    """With two setups the second "nccl:" block repeated the GPU counts with no setup to tell them apart."""
    assert cli.main(["predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8,16", "--baseline-setup", "ddp",
                     "--candidate-setup", "ddp-fp16"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("# nccl:"):].splitlines()[1:]
    labels = [re.match(r"#\s+(\S+)\s+(\d+) GPUs:", line).groups() for line in block if " GPUs: " in line]
    assert labels == [("ddp", "8"), ("ddp", "16"), ("ddp-fp16", "8"), ("ddp-fp16", "16")]
