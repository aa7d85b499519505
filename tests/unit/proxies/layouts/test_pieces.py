"""proxies/layouts/pieces.py: a layout rank's compute in the pieces the replay spins, costed from a compute block
(pure: check sets a replay's measured pieces against them), and the optimizer's shard."""
from __future__ import annotations

import pytest

from commbench.proxies.layouts.parallelism import parse_layout
from commbench.proxies.layouts.pieces import from_block
from commbench.proxies.profile import load_profile

SHAPE = load_profile("llama-tiny").transformer


@pytest.mark.parametrize("layout, shards", [
    ("tp2,ddp2", 1), ("tp2,zero1:2", 2), ("tp2,zero2:2", 2), ("tp2,fsdp-grad-op:2", 2), ("cp2,fsdp2", 4),
])
def test_the_optimizer_step_is_timed_on_the_shard_a_rank_updates(layout, shards):
    """ZeRO-1 and -2 update 1/dp of the parameters on each rank as FSDP does (the setup models charge
    optimizer_us / shards for them too); it was measured unsharded for them."""
    from commbench.proxies.layouts.pieces import optimizer_shards
    from commbench.proxies.setups import SETUPS

    par = parse_layout(layout, gpus=4)
    assert optimizer_shards(par, SETUPS.get(par.setup)) == shards


def _block():
    from commbench.costmodel.compute import AttentionPoint, ComputeBlock, MatmulPoint

    return ComputeBlock("cpu (test)", (MatmulPoint(64, 64, 64, "float32", 10.0),),
                        (AttentionPoint(4, 64, 64, 16, True, "float32", 5.0, 12.0),
                         AttentionPoint(4, 64, 64, 16, False, "float32", 9.0, 20.0)), 10.0, 1.0,
                        {"forward": 100.0, "backward": 150.0, "fsdp_unit_forward": 7.0, "fsdp_unit_backward": 9.0,
                         "tp_layer_forward": 3.0, "tp_layer_backward": 4.0}, meta={"dtype": "float32"})


def test_a_ranks_pieces_from_a_block_hold_each_stage_its_own():
    """proxy --layout --compute block: the replay's pieces from the block's times (no model built)."""
    block = _block()
    plain = from_block(block, parse_layout("dp4", gpus=4), SHAPE, 1, 0, "float32")
    assert plain.layer_forward_us > 100.0 and plain.layer_backward_us > plain.layer_forward_us
    assert plain.block_forward_us == 0.0 and plain.embed_forward_us > 0 and plain.head_forward_us > 0
    assert plain.optimizer_us > 0
    sharded = from_block(block, parse_layout("tp2,fsdp2", gpus=4), SHAPE, 1, 0, "float32")
    assert sharded.optimizer_us < plain.optimizer_us  # FSDP: the optimizer on a shard
    ring = from_block(block, parse_layout("cp2,dp2", gpus=4), SHAPE, 1, 0, "float32")
    assert ring.block_forward_us > 0 and ring.block_backward_us > ring.block_forward_us
    first, last = (from_block(block, parse_layout("pp2,dp2", gpus=4), SHAPE, 1, s, "float32") for s in (0, 1))
    assert first.embed_forward_us > 0 and first.head_forward_us == 0
    assert last.head_forward_us > 0 and last.embed_forward_us == 0


def test_what_compute_measured_of_the_rest_of_a_rank_is_added_to_its_pieces():
    """commbench compute times the real head, embedding and update (framework_us head_*, embed_*, optimizer_tensor):
    each piece gains it, the update once a parameter tensor (9 a Llama layer, the embedding, the norm, the head)."""
    from dataclasses import replace

    block = _block()
    rest = replace(block, framework_us={**block.framework_us, "head_forward": 40.0, "head_backward": 60.0,
                                        "embed_forward": 5.0, "embed_backward": 8.0, "optimizer_tensor": 2.0})
    par = parse_layout("dp4", gpus=4)
    plain, more = (from_block(b, par, SHAPE, 1, 0, "float32") for b in (block, rest))
    assert more.head_forward_us - plain.head_forward_us == pytest.approx(40.0)
    assert more.head_backward_us - plain.head_backward_us == pytest.approx(60.0)
    assert (more.embed_forward_us - plain.embed_forward_us, more.embed_backward_us - plain.embed_backward_us) == \
        pytest.approx((5.0, 8.0))
    assert more.optimizer_us - plain.optimizer_us == pytest.approx(2.0 * (9 * SHAPE.layers + 3))
    assert more.layer_forward_us == plain.layer_forward_us
