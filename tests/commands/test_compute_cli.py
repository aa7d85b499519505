"""`commbench compute` as a user runs it: a block measured for llama-tiny's layouts, used by predict-scaling,
and bad input refused in one line."""
import json

import pytest
from conftest import commbench, notes_joined

from commbench import cli


def test_a_block_is_measured_written_and_used(tmp_path):
    out = tmp_path / "hw.json"
    run = commbench("compute", "llama-tiny", "--gpus", "2", "--layout", "dp2", "--layout", "tp2,dp1",
                    "--min-time", "0.002", "--hw", "dgx-h100", "-o", str(out), timeout=240)
    assert run.returncode == 0, run.stderr
    block = json.loads(out.read_text())["compute"]
    assert block["device"].startswith("cpu") and block["meta"]["dtype"] == "float32"
    assert len(block["matmul"]) >= 9 and block["attention"] and block["memory_gbps"] > 0
    # the rest of a rank, timed for real: the head and its loss, the embedding, the update per tensor
    assert {"head_forward", "head_backward", "embed_forward", "embed_backward", "optimizer_tensor"} <= \
        set(block["framework_us"])
    assert "# wrote" in run.stdout
    predicted = commbench("predict-scaling", "llama-tiny", "--gpus", "2", "--hw", str(out), "--layout", "dp2",
                          "--layout", "tp2,dp1", "--global-batch", "4")
    assert predicted.returncode == 0, predicted.stderr
    assert "each operator from the compute block of cpu" in predicted.stdout
    assert "no --tflops" not in predicted.stderr  # no peak: the block
    rated = commbench("predict-scaling", "llama-tiny", "--gpus", "2", "--hw", str(out), "--layout", "dp2",
                      "--global-batch", "4", "--tflops", "0.05")
    assert "--tflops: one rate for every operator" in rated.stdout
    # data parallelism too (issue 47 item 4): each replica's whole model, operator by operator from the block
    scaled = commbench("predict-scaling", "llama-tiny", "--gpus", "1,2", "--hw", str(out))
    assert scaled.returncode == 0, scaled.stderr
    header = " ".join(notes_joined(scaled.stdout))
    assert "compute from the compute block of cpu" in header and "operator by operator" in header
    assert "no --tflops" not in scaled.stderr and "peak" not in header
    given = commbench("predict-scaling", "llama-tiny", "--gpus", "1,2", "--hw", str(out), "--tflops", "0.05")
    assert "the profile's FLOPs at 0.05 TFLOP/s" in " ".join(notes_joined(given.stdout))
    # and the predicted data-parallel proxy: the same step as predict-scaling's on the same 2 ranks of a node
    proxied = commbench("proxy", "llama-tiny", "--backend", "sim", "--hw", str(out), "-N", "2", "--compute", "block",
                        "--json", str(tmp_path / "p.jsonl"))
    assert proxied.returncode == 0, proxied.stderr
    assert "compute each operator from the compute block of cpu" in proxied.stdout
    summary = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()][-1]
    two = commbench("predict-scaling", "llama-tiny", "--gpus", "2", "--gpus-per-node", "2", "--hw", str(out),
                    "--json", str(tmp_path / "s.jsonl"))
    assert two.returncode == 0, two.stderr
    point = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()][-1]
    assert (summary["compute_us_p50"], summary["step_us_p50"]) == pytest.approx((point["compute_us"],
                                                                                 point["step_us"]), rel=1e-9)
    # and the data-parallel replay on ranks (was refused): the ranks spin the block's pieces of one replica's whole
    # model (the predicted proxy's step, and the embedding and the update, which the prediction leaves out)
    ranks = commbench("proxy", "llama-tiny", "--hw", str(out), "-N", "2", "--compute", "block", "--steps", "2",
                      "--warmup-steps", "1", "--json", str(tmp_path / "r.jsonl"))
    assert ranks.returncode == 0, ranks.stderr
    assert "compute per step (the compute block of cpu" in ranks.stdout
    from commbench.costmodel.compute import compute_from_dict
    from commbench.proxies.layouts.parallelism import Parallelism
    from commbench.proxies.layouts.pieces import from_block
    from commbench.proxies.profile import load_profile

    shape = load_profile("llama-tiny").transformer
    batch = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()][-1]["batch"]
    p = from_block(compute_from_dict(block), Parallelism(dp=2), shape, batch, 0, "float32")
    planned = shape.layers * (p.layer_forward_us + p.layer_backward_us) + p.embed_forward_us + p.embed_backward_us \
        + p.head_forward_us + p.head_backward_us + p.optimizer_us
    steps = [r for r in map(json.loads, (tmp_path / "r.jsonl").read_text().splitlines()) if r["record"] == "step"]
    assert len(steps) == 3 and all(r["compute_us"] == pytest.approx(planned, rel=1e-3) for r in steps)
    assert summary["compute_us_p50"] < planned < 1.2 * summary["compute_us_p50"]


@pytest.mark.parametrize("args,message", [
    (["resnet50", "--hw", "dgx-h100"], "has none"),
    (["llama-tiny", "--gpus", "4", "--layout", "tp3,dp1", "--hw", "dgx-h100"], "GPUs, not 4"),
    (["llama-tiny", "--min-time", "0", "--hw", "dgx-h100"], "--min-time"),
    (["llama-tiny", "--microbatch", "0", "--hw", "dgx-h100"], "--microbatch"),
    (["llama-tiny", "--hw", "no-such-hw"], "no hardware file or preset"),
    (["llama-tiny", "--hw", "dgx-h100", "--device", "cuda"], "sees no GPU"),
    (["deepseek-v3", "--hw", "dgx-h100"], "multi-head latent attention"),
])
def test_bad_input_is_one_line(capsys, tmp_path, args, message):
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("a GPU is here")
    code = cli.main(["compute", *args, "-o", str(tmp_path / "hw.json")])
    out, err = capsys.readouterr()
    assert code == 2, out
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "hw.json").exists()


def test_a_replay_of_a_block_the_file_lacks_says_how_to_write_one(capsys):
    """The hint named `--layout None` where no layout was given."""
    code = cli.main(["proxy", "llama-tiny", "--hw", "dgx-h100", "-N", "2", "--compute", "block"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1, out + err
    assert "(write one with `commbench compute llama-tiny --hw dgx-h100 -o FILE`)" in err and "None" not in err
