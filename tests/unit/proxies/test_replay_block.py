"""proxies/replay.py block_times: a data-parallel replay's compute from a hardware file's compute block (`proxy MODEL
--compute block` on ranks): one replica's whole model, and the update over the whole model, which the setup's plan
divides among the ranks that shard it (setup_steps.Compute: a sharded setup's update was divided twice)."""
from types import SimpleNamespace

import pytest

from commbench.costmodel.compute import AttentionPoint, ComputeBlock, MatmulPoint
from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.layouts.pieces import from_block
from commbench.proxies.profile import load_profile
from commbench.proxies.replay import block_times


def _ctx(setup: str, world: int = 4, clock: str = "thread CPU time"):
    block = ComputeBlock("cpu (test)", (MatmulPoint(64, 64, 64, "float32", 10.0),),
                         (AttentionPoint(4, 64, 64, 16, True, "float32", 5.0, 12.0),), 10.0, 1.0,
                         {"forward": 100.0, "backward": 150.0, "fsdp_unit_forward": 7.0, "fsdp_unit_backward": 9.0},
                         meta={"dtype": "float32", "clock": clock})
    ctx = SimpleNamespace(cfg=SimpleNamespace(compute_block=block.to_dict()), profile=load_profile("llama-tiny"),
                          backend=SimpleNamespace(world_size=world), choice=SimpleNamespace(name=setup), batch=2)
    return ctx, block


@pytest.mark.parametrize("setup", ["ddp", "zero2", "fsdp-full"])
def test_the_update_is_the_whole_models_whatever_the_setup_shards(setup):
    ctx, block = _ctx(setup)
    forward, backward, update, own, label = block_times(ctx)
    shape = ctx.profile.transformer
    whole = from_block(block, Parallelism(setup="ddp"), shape, 2, 0, "float32")
    assert update == pytest.approx(whole.optimizer_us) and own == 0.0
    pieces = from_block(block, Parallelism(dp=4, setup=setup), shape, 2, 0, "float32")
    assert forward == pytest.approx(shape.layers * pieces.layer_forward_us + pieces.embed_forward_us
                                    + pieces.head_forward_us)
    assert backward > forward and label == "the compute block of cpu (test) (CPU time)"


def test_a_block_timed_on_the_wall_clock_is_spun_on_it():
    ctx, _ = _ctx("ddp", clock="wall")
    assert not block_times(ctx)[4].endswith("(CPU time)")
