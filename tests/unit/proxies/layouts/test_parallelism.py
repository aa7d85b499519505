"""Layouts: their spelling, the rank mesh (as torch's init_device_mesh lays it out) and the checks that refuse
a layout that cannot run, each in one line."""
from dataclasses import dataclass

import numpy as np
import pytest

from commbench.proxies.layouts.parallelism import LayoutError, Parallelism, parse_layout


@dataclass(frozen=True)
class Shape:  # what the checks read of a model's shape
    layers: int = 80
    heads: int = 64
    kv_heads: int = 8
    seq_len: int = 8192
    experts: int = 0


@pytest.mark.parametrize("text,gpus,expected", [
    ("tp8,fsdp32", None, Parallelism(tp=8, dp=32, setup="fsdp-full")),
    ("tp4,pp2,fsdp32", None, Parallelism(tp=4, pp=2, dp=32, setup="fsdp-full")),
    ("tp8sp,pp16,dp64", None, Parallelism(tp=8, pp=16, dp=64, sequence_parallel=True, setup="ddp")),
    ("tp8,pp2", 256, Parallelism(tp=8, pp=2, dp=16)),
    ("cp2,ep4,hsdp8", None, Parallelism(cp=2, ep=4, dp=8, setup="fsdp-hybrid")),
    ("zero1:32,tp2", None, Parallelism(tp=2, dp=32, setup="zero1")),
    ("tp2,fsdp:8", None, Parallelism(tp=2, dp=8, setup="fsdp-full")),  # a shorthand in the SETUP:N form too
    ("tp8,hsdp8x16", None, Parallelism(tp=8, dp=128, setup="fsdp-hybrid", dp_shard=16)),  # R replicas x S shards
])
def test_spelling(text, gpus, expected):
    par = parse_layout(text, gpus=gpus)
    assert par == expected
    assert parse_layout(par.name) == par  # the name spells the same layout


@pytest.mark.parametrize("text,message", [
    ("", "empty layout"),
    ("tp8,tp2,dp4", "gives a dimension twice"),
    ("tq8", "spell a layout like"),
    ("pp2sp,dp2", "spell a layout like"),
    ("tp0,dp2", "a degree is 1"),
    ("tp8,pp2", "name the data-parallel part"),
    ("tp8,fsdp8x16", "spell a layout like"),  # a shard group size is HSDP's
])
def test_bad_spellings_are_one_line(text, message):
    with pytest.raises(LayoutError, match=message) as err:
        parse_layout(text)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("layout,kwargs,message", [
    (Parallelism(tp=8, dp=16), {"gpus": 256}, "= 128 GPUs, not 256"),
    (Parallelism(tp=3, dp=2), {"shape": Shape()}, "tp 3 neither divides"),
    (Parallelism(tp=16, dp=2), {"shape": Shape(heads=40, kv_heads=8)}, "does not divide the model's 40 attention"),
    (Parallelism(pp=3, dp=2), {"shape": Shape()}, "pp = 3 does not divide the model's 80 layers"),
    (Parallelism(pp=16, dp=2), {"shape": Shape(layers=125)}, "nor do they divide with one layer fewer"),
    (Parallelism(pp=4, dp=2, pp_schedule="interleaved", virtual_stages=3, microbatches=8), {"shape": Shape()},
     "virtual stages = 12 does not divide"),
    (Parallelism(ep=4, dp=8), {"shape": Shape(experts=6)}, "ep = 4 does not divide the model's 6 experts"),
    (Parallelism(ep=4, dp=8), {"shape": Shape()}, "model without experts"),
    (Parallelism(ep=3, dp=4), {}, "ep 3 must divide dp x cp = 4"),
    (Parallelism(pp=4, dp=2, pp_schedule="interleaved", virtual_stages=2, microbatches=6), {}, "not a multiple"),
    (Parallelism(pp=2, dp=2, virtual_stages=2), {}, "needs --pp-schedule interleaved"),
    (Parallelism(pp=2, dp=2, pp_schedule="zigzag"), {}, "choose from gpipe, 1f1b, interleaved"),
    (Parallelism(tp=16, dp=2), {"ranks_per_node": 8, "within_node": ("tp",)}, "tp groups cross nodes of 8"),
])
def test_layouts_that_cannot_run_are_one_line(layout, kwargs, message):
    with pytest.raises(LayoutError, match=message) as err:
        layout.check(**kwargs)
    assert "\n" not in str(err.value)


def test_a_layout_that_fits_passes_its_checks():
    # Llama 3.1 405B's 126 layers on 16 stages: one fewer on the first and last (Dubey et al. 2024, 3.3.2)
    Parallelism(tp=8, pp=16, dp=64).check(gpus=8192, shape=Shape(layers=126, heads=128, kv_heads=8))
    Parallelism(tp=8, pp=4, dp=8, pp_schedule="interleaved", virtual_stages=5, microbatches=16).check(
        gpus=256, ranks_per_node=8, shape=Shape(), within_node=("tp",))
    Parallelism(tp=2, cp=2, ep=8, dp=8).check(gpus=32, shape=Shape(heads=32, kv_heads=4, experts=64))


def test_groups_are_the_mesh_torch_lays_out():
    """init_device_mesh(device, (pp, dp, cp, tp)) numbers the ranks as arange(world).reshape(shape) (DeviceMesh's
    mesh tensor); the group along a dimension is the line through the rank along that axis."""
    par = Parallelism(tp=2, pp=3, cp=2, dp=2, ep=2)
    mesh = np.arange(par.world).reshape(par.pp, par.dp, par.cp, par.tp)
    for rank in range(par.world):
        at = tuple(int(i) for i in np.argwhere(mesh == rank)[0])
        assert par.coords(rank) == dict(zip(("pp", "dp", "cp", "tp"), at))
        for axis, dim in enumerate(("pp", "dp", "cp", "tp")):
            index = list(at)
            index[axis] = slice(None)
            assert par.group(rank, dim) == tuple(int(r) for r in mesh[tuple(index)])
    assert par.group(0, "tp") == (0, 1) and par.group(0, "cp") == (0, 2) and par.group(0, "dp") == (0, 4)
    # expert parallel: ep consecutive ranks of the flattened dp x cp ranks; expert data parallel: the rest
    assert par.group(0, "ep") == (0, 2) and par.group(0, "edp") == (0, 4)
    assert par.group(5, "ep") == (5, 7) and par.group(5, "edp") == (1, 5)


def test_experts_without_tensor_parallelism_take_the_tp_ranks_too():
    """etp1 (Megatron-Core's --expert-tensor-parallel-size 1): EP groups of consecutive ranks of the flattened
    dp x cp x tp ranks, so EP 8 under TP 2 fills one node of 8 instead of spanning two."""
    par = Parallelism(tp=2, dp=8, ep=8, expert_tp=1)
    assert par.group(0, "ep") == tuple(range(8)) and par.nodes_spanned("ep", 8) == (1, 8)
    assert par.group(3, "edp") == (3, 11)
    assert Parallelism(tp=2, dp=8, ep=8).nodes_spanned("ep", 8) == (2, 4)  # etp = tp: dp x cp ranks only
    assert parse_layout("tp2,ep8,etp1,fsdp8") == Parallelism(tp=2, dp=8, ep=8, expert_tp=1, setup="fsdp-full")
    assert parse_layout("tp2,ep8,etp1,fsdp8").name == "tp2,ep8,etp1,fsdp8"
    par.check(gpus=16, ranks_per_node=8)
    with pytest.raises(LayoutError, match="ep 16 must divide dp x cp = 8"):
        Parallelism(tp=2, dp=8, ep=16).check()
    with pytest.raises(LayoutError, match="tp .leave it out. or etp1"):
        parse_layout("tp2,etp2,dp8")
    # Megatron-Core refuses MoE layers under TP without SP (moe_layer.py), so etp1 needs tpNsp on a model with experts
    with pytest.raises(LayoutError, match="etp1 under tp needs sequence parallelism .tp2sp."):
        par.check(shape=Shape(heads=8, kv_heads=2, experts=8))
    sp = Parallelism(tp=2, dp=8, ep=8, expert_tp=1, sequence_parallel=True)
    sp.check(shape=Shape(heads=8, kv_heads=2, experts=8))
    Parallelism(tp=2, dp=8, expert_tp=1).check(shape=Shape(heads=8, kv_heads=2))  # no experts: nothing to refuse


def test_tensor_parallel_stays_inside_a_node():
    par = Parallelism(tp=8, pp=2, dp=16)
    assert par.nodes_spanned("tp", 8) == (1, 8)
    assert par.nodes_spanned("dp", 8) == (16, 1)
    assert par.nodes_spanned("pp", 8) == (2, 1)
    assert Parallelism(tp=2, dp=8).nodes_spanned("dp", 8) == (2, 4)


@pytest.mark.parametrize("text,schedule,virtual", [
    ("tp8sp,pp4,fsdp32@interleaved:2", "interleaved", 2), ("pp2,fsdp8@gpipe", "gpipe", 1),
    ("pp2,fsdp8@1f1b", "1f1b", 1), ("pp2,fsdp8", "gpipe", 1)])
def test_a_layout_carries_its_own_schedule_over_the_commands(text, schedule, virtual):
    par = parse_layout(text, pp_schedule="gpipe")
    assert (par.pp_schedule, par.virtual_stages) == (schedule, virtual)
    assert parse_layout(par.name) == par  # the name spells the schedule too (two schedules, two names)


def test_a_layout_without_a_pipeline_takes_no_schedule():
    """The command's --pp-schedule / --virtual-stages leave it as it is; its own @schedule is refused."""
    assert parse_layout("tp8,fsdp8", pp_schedule="gpipe", virtual_stages=2) == parse_layout("tp8,fsdp8")
    with pytest.raises(LayoutError, match="without a pipeline"):
        parse_layout("tp8,fsdp8@gpipe")


@pytest.mark.parametrize("text", ["pp2,dp2@interleaved", "pp2,dp2@interleaved:1", "pp2,dp2@fast", "pp2,dp2@gpipe:2",
                                  "tp\u0662,dp2", "pp2,dp2@interleaved:\u0662"])
def test_bad_schedules_and_digits_are_one_line(text):
    with pytest.raises(LayoutError):
        parse_layout(text)


def test_hsdp_groups_are_dp_shard_consecutive_dp_ranks_with_every_cp_and_one_per_shard_group_across():
    par = parse_layout("tp2,cp2,hsdp2x3")  # mesh (pp, dp, cp, tp) = (1, 6, 2, 2)
    shard, replicate = par.hsdp_groups(0)
    assert shard == tuple(par.rank_of({"pp": 0, "dp": d, "cp": c, "tp": 0}) for d in range(3) for c in range(2))
    assert replicate == (0, par.rank_of({"pp": 0, "dp": 3, "cp": 0, "tp": 0}))
    assert par.hsdp_groups(par.rank_of({"pp": 0, "dp": 4, "cp": 1, "tp": 1}))[1] == \
        tuple(par.rank_of({"pp": 0, "dp": d, "cp": 1, "tp": 1}) for d in (1, 4))
    with pytest.raises(LayoutError, match="HSDP's"):
        Parallelism(dp=8, setup="fsdp-full", dp_shard=4).check()
