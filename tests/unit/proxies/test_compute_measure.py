"""A compute block measured here for llama-tiny's layouts: one point for every shape its ranks run."""
import pytest

from commbench.proxies.compute_measure import measure_block, shapes_of
from commbench.proxies.layouts import layer_ops as L
from commbench.proxies.layouts.parallelism import parse_layout
from commbench.proxies.profile import load_profile

SHAPE = load_profile("llama-tiny").transformer


def test_the_shapes_are_every_product_and_attention_of_each_layout_once():
    layouts = [parse_layout("dp4", gpus=4), parse_layout("tp2,dp2", gpus=4), parse_layout("cp2,dp2", gpus=4)]
    products, attention = shapes_of(SHAPE, layouts, [1])
    assert len(products) == len(set(products))
    for par in layouts:
        for op in L.matmuls(L.layer_ops(SHAPE, par, 1, 0) + L.head_ops(SHAPE, par, 1)):
            assert (op.m, op.n, op.k) in products
    assert (4, 32, 32, 16, False) in attention  # the CP ring's block beyond the diagonal


def test_a_block_measured_here_costs_every_operator_it_lists():
    pytest.importorskip("torch")
    layouts = [parse_layout("dp2", gpus=2), parse_layout("tp2,dp1", gpus=2)]
    said = []
    block = measure_block(SHAPE, layouts, [1, 2], "cpu", "float32", min_time_s=0.001, say=said.append,
                          framework=False)
    assert block.device.startswith("cpu") and block.memory_gbps > 0 and block.op_us > 0
    assert all(p.time_us > 0 and p.dtype == "float32" for p in block.matmul)
    assert all(p.forward_us > 0 and p.backward_us > 0 for p in block.attention)
    assert L.missing(block, "float32") == []
    for par in layouts:
        times = L.op_times(block, L.layer_ops(SHAPE, par, 1, 0), "float32")
        assert times.forward_us > times.attention_forward_us > 0 and times.backward_us > 0
    assert said[0].startswith("# timing") and said[-1].startswith("# measured in")
