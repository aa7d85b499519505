"""--nodes/--gpus-per-node and --topology on proxy: the two forms say the same, and values that
disagree (with each other or with --nprocs) are one line, exit 2."""
from __future__ import annotations

import pytest
from conftest import commbench
from test_cli_layout import check_refused, check_the_two_forms_say_the_same

PROXY = ["proxy", "resnet50", "--backend", "sim", "--hw", "dgx-a100", "--tflops", "100"]


@pytest.mark.parametrize("extra, message", [
    (["-T", "4x8", "-N", "16"], "--topology 4x8 is 32 ranks but --nprocs 16"),
    (["--nodes", "3", "-N", "16"], "--nprocs 16 ranks do not fill --nodes 3 evenly"),
])
def test_disagreeing_values_are_one_line_and_exit_2(capsys, extra, message):
    check_refused(capsys, PROXY, extra, message)


def test_topology_is_nodes_and_gpus_per_node(capsys):
    check_the_two_forms_say_the_same(capsys, PROXY, "on 2x4 (8 ranks)")


def test_a_layout_in_predicted_mode_is_refused_not_dropped(capsys):
    """--hw with no ranks here predicts the data-parallel proxy's step, which has no layout: one line, pointing
    at predict-scaling --layout, instead of a prediction of plain DDP."""
    from commbench.cli import main

    code = main(["proxy", "llama-tiny", "--layout", "pp2,dp2", "--nodes", "1", "--gpus-per-node", "4",
                 "--hw", "dgx-h100", "--tflops", "100"])
    err = capsys.readouterr().err
    assert code == 2 and "predict-scaling llama-tiny --hw HW --gpus N --layout pp2,dp2" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra, message", [
    (["--compute", "block"], "give --hw FILE (from `commbench compute`)"),
    (["--compute", "block", "--layout", "tp2,dp2", "--hw", "dgx-h100"], "has no compute block"),
    (["--compute", "block", "--layout", "tp2,dp2", "--hw", "dgx-h100", "--tflops", "5"], "drop --tflops"),
])
def test_a_block_replay_without_a_block_is_one_line(capsys, extra, message):
    from commbench import cli

    code = cli.main(["proxy", "llama-tiny", "-N", "4", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_layout_replays_with_its_operators_from_a_block(tmp_path):
    """proxy --layout --compute block: each rank spins its pieces' times from the hardware file's block."""
    import json

    from commbench.costmodel import load_hardware

    data = load_hardware("dgx-h100").to_dict()
    data["compute"] = {"device": "cpu (test)", "matmul": [{"m": 64, "n": 64, "k": 64, "dtype": "float32",
                                                            "time_us": 20.0}],
                       "attention": [{"batch_heads": 4, "seq_q": 64, "seq_kv": 64, "head_dim": 16, "causal": True,
                                      "dtype": "float32", "forward_us": 10.0, "backward_us": 25.0}],
                       "memory_gbps": 10.0, "op_us": 2.0, "framework_us": {"forward": 200.0, "backward": 300.0},
                       "meta": {"dtype": "float32", "clock": "thread CPU time"}}
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(data))
    out = tmp_path / "p.jsonl"
    run = commbench("proxy", "llama-tiny", "--layout", "tp2,dp2", "-N", "4", "--compute", "block", "--hw", str(hw),
                    "--steps", "2", "--warmup-steps", "1", "--json", str(out), timeout=240)
    assert run.returncode == 0, run.stderr
    assert "the compute block of cpu (test)" in run.stdout
    assert "no activation checkpointing" in run.stdout  # not "none activation checkpointing" (issue 48, item 12)
    header = next(json.loads(line) for line in out.read_text().splitlines() if '"header"' in line)
    assert header["layout_compute_us"]["layer_forward_us"] > 200.0


def test_a_layout_is_validated_against_its_training_and_the_error_kept(tmp_path):
    """issue 48 item 4: --validate refused layouts ("compares with DDP training"); now the layout is trained as
    replayed, the error printed and appended to the proxy's file as a validate record."""
    import json

    out = tmp_path / "v.jsonl"
    run = commbench("proxy", "llama-tiny", "--layout", "tp2,dp2", "-N", "4", "--tflops", "0.003", "--steps", "1",
                    "--warmup-steps", "1", "--validate", "--json", str(out), timeout=300)
    assert run.returncode == 0, run.stderr
    assert "real training of layout tp2,ddp2" in run.stdout and "proxy error" in run.stdout
    record = next(json.loads(line) for line in out.read_text().splitlines() if '"record": "validate"' in line)
    assert record["train_step_us"] > 0 and record["error"] == pytest.approx(
        record["proxy_step_us"] / record["train_step_us"] - 1)
    assert (tmp_path / "v.train.jsonl").exists()
