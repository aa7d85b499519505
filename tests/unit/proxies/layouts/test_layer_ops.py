"""A rank's operators: their products add up to the FLOPs the rate path counts, layout by layout, so a block
whose every operator runs at one rate predicts exactly what --tflops at that rate predicts."""
from dataclasses import replace

import pytest

from commbench.analysis.predict_layout import Job, predict_layout
from commbench.costmodel import load_hardware
from commbench.costmodel.compute import AttentionPoint, ComputeBlock, MatmulPoint, attention_flops
from commbench.proxies.layouts import layer_ops as L
from commbench.proxies.layouts.parallelism import parse_layout
from commbench.proxies.profile import load_profile

SHAPE = load_profile("llama3.1-8b").transformer


def _product_flops(ops) -> float:
    return sum(2.0 * op.m * op.n * op.k * op.count for op in ops if isinstance(op, L.Matmul))


@pytest.mark.parametrize("text", ["dp8", "tp2,dp4", "tp8,dp1", "tp4sp,cp2,dp1", "cp4,dp2"])
def test_a_layers_operators_hold_the_layers_flops(text):
    par = parse_layout(text, gpus=8)
    ops = L.layer_ops(SHAPE, par, 1, 0)
    tokens = SHAPE.seq_len / par.cp
    attention = sum(attention_flops(o.batch_heads, o.seq_q, o.seq_kv, o.head_dim, o.causal) * o.count
                    for o in ops if isinstance(o, L.Attention))
    expected = SHAPE.layer_forward_flops(0, causal_halved=True) * tokens / par.tp
    assert _product_flops(ops) + attention == pytest.approx(expected, rel=1e-12)
    head = _product_flops(L.head_ops(SHAPE, par, 1))
    assert head == pytest.approx(SHAPE.head_forward_flops() * tokens / par.tp)


def test_backward_products_are_dx_and_dw():
    forward = [L.Matmul(8, 16, 32, "x")]
    assert [(o.m, o.n, o.k) for o in L.matmuls(forward)] == [(8, 16, 32), (8, 32, 16), (32, 16, 8)]


def test_moe_experts_get_their_tokens():
    shape = load_profile("mixtral-8x7b").transformer
    par = parse_layout("ep8,dp8", gpus=8)
    experts = [o for o in L.layer_ops(shape, par, 1, 0) if isinstance(o, L.Matmul) and o.label.startswith("experts")]
    assert {o.count for o in experts} == {shape.experts // 8}
    assert {o.m for o in experts} == {shape.seq_len * 8 * shape.top_k // shape.experts}


def _one_rate_block(tflops: float) -> ComputeBlock:
    """Every product and attention at `tflops` (backward twice the forward), memory free, no overheads."""
    matmul = (MatmulPoint(1000, 1000, 1000, "bfloat16", 2e9 / (tflops * 1e6)),)
    flops = attention_flops(32, 8192, 8192, 128, True)
    attention = (AttentionPoint(32, 8192, 8192, 128, True, "bfloat16", flops / (tflops * 1e6),
                                2 * flops / (tflops * 1e6)),
                 AttentionPoint(32, 8192, 8192, 128, False, "bfloat16", 2 * flops / (tflops * 1e6),
                                4 * flops / (tflops * 1e6)))
    return ComputeBlock("one rate", matmul, attention, 1e12, 0.0)


@pytest.mark.parametrize("text", ["tp8,fsdp4", "tp4sp,pp2,fsdp4", "tp8sp,cp2,fsdp2"])
def test_a_block_at_one_rate_predicts_what_the_rate_does(text):
    profile = load_profile("llama3.1-8b")
    par = replace(parse_layout(text, gpus=32), microbatches=4)
    par.check(32, 8, SHAPE)
    job = Job(SHAPE, profile, load_hardware("dgx-h100"), 8, 1, 400.0, "selective")
    by_rate = predict_layout(job, par)
    by_block = predict_layout(replace(job, compute=_one_rate_block(400.0)), par)
    assert by_block.compute_us == pytest.approx(by_rate.compute_us, rel=1e-6)
    assert by_block.step_us == pytest.approx(by_rate.step_us, rel=1e-6)


def test_what_a_block_lacks_is_named():
    assert L.missing(ComputeBlock("d"), "bfloat16") == ["bfloat16 matrix products", "bfloat16 attention",
                                                        "memory_gbps"]
    assert L.unlisted(load_profile("deepseek-v3").transformer) == "multi-head latent attention (MLA)"
