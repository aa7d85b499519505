"""A layout rank's measured compute (proxies/layouts/compute.py): which pieces each rank times, and how the
replay (proxies/layouts/replay.py) spends them per layer, beside CP's ring steps and under recomputation."""
from __future__ import annotations

import pytest

from commbench.proxies.layouts.compute import RankCompute, measure_rank_compute, refusal
from commbench.proxies.layouts.parallelism import parse_layout
from commbench.proxies.layouts.replay import LayoutReplay
from commbench.proxies.profile import load_profile

SHAPE = load_profile("llama-tiny").transformer
MEASURED = RankCompute(layer_forward_us=100.0, layer_backward_us=250.0, block_forward_us=10.0,
                       block_backward_us=30.0, optimizer_us=7.0)


@pytest.mark.parametrize("layout, stage, timed", [
    ("pp2,dp2", 0, {"layer", "embed"}),  # the first stage: the embedding, no head
    ("pp2,dp2", 1, {"layer", "head"}),
    ("cp2,dp2", 0, {"layer", "block", "embed", "head"}),  # CP: a ring block beside the layer
])
def test_each_rank_times_the_pieces_it_holds(layout, stage, timed):
    import torch

    torch.set_num_threads(1)
    par = parse_layout(layout, gpus=4, microbatches=2 if "pp" in layout else 1)
    measured, cpu_time = measure_rank_compute(par, SHAPE, 1, stage, repeats=1)
    assert cpu_time
    for piece in ("layer", "block", "embed", "head"):
        values = [getattr(measured, f"{piece}_{phase}_us") for phase in ("forward", "backward")]
        assert all(v > 0 for v in values) if piece in timed else values == [0.0, 0.0], piece
    assert measured.optimizer_us > 0 and RankCompute.of(measured.values()) == measured


@pytest.mark.parametrize("checkpointing, backward_us", [
    ("none", 250.0 + 30.0),                       # the layer's own backward, one arriving block's beside the ring
    ("full", 250.0 + 100.0 + 10.0 + 30.0),        # and the forward again, with its ring block
    ("selective", 250.0 + 2 * 10.0 + 30.0),       # and the attention's two blocks again
])
def test_the_replay_spends_the_measured_times_per_layer(checkpointing, backward_us):
    par = parse_layout("cp2,dp2", gpus=4)
    replay = LayoutReplay(par, SHAPE, None, 0, 1, checkpointing=checkpointing, groups={}, measured=MEASURED)
    assert replay._layer_us(0, True, True) == pytest.approx((110.0, 10.0))
    assert replay._layer_us(0, False, True) == pytest.approx((backward_us, 30.0))
    # without CP no block is added; FLOPs at a rate still serve without a measurement
    plain = LayoutReplay(parse_layout("dp4", gpus=4), SHAPE, None, 0, 1, groups={}, measured=MEASURED)
    assert plain._layer_us(0, True, False) == (100.0, 0.0)
    rate = LayoutReplay(parse_layout("dp4", gpus=4), SHAPE, None, 0, 1, rate=1e6, groups={})
    assert rate._layer_us(0, True, False)[0] == pytest.approx(SHAPE.layer_forward_flops(0, causal_halved=True) *
                                                             SHAPE.seq_len / 1e6)


def test_moe_and_non_llama_shapes_are_refused_with_the_way_out():
    for name in ("mixtral-8x7b", "deepseek-v3"):
        why = refusal(parse_layout("ep8", gpus=8), load_profile(name).transformer, 1, on_cpu=True)
        assert why and "--tflops" in why
    assert refusal(parse_layout("tp2,dp2", gpus=4), SHAPE, 1, on_cpu=True) is None
