"""A layout's replay on 4 gloo ranks (proxies/layouts/replay.py) against the calls the layout declares.

One spawned 4-rank job runs every case: a TorchDispatchMode sees each c10d call one step of a rank issues
(collective, bytes: the larger buffer, the process group), and per (dimension, collective) the calls and bytes
must equal calls.step_bytes for the rank's pipeline stage (pipeline and ring steps: the sends), and the
data-parallel calls the setup's plan for the stage's share of the model (for DDP: all of its gradient bytes)."""
import os
import queue

import pytest
from conftest import c10d_trace, clean_env

from commbench.launch import free_port
from commbench.proxies.layouts.calls import step_bytes
from commbench.proxies.layouts.parallelism import parse_layout
from commbench.proxies.layouts.stage_share import stage_profile
from commbench.proxies.profile import load_profile
from commbench.proxies.transformer import TransformerShape

MOE = TransformerShape(layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=176, vocab=1024, seq_len=64,
                       experts=4, top_k=2, expert_ffn=64)
CASES = {  # name: (layout, schedule, MoE shape)
    "tp2 dp2": ("tp2,dp2", {}, False),
    "tp2sp dp2": ("tp2sp,dp2", {}, False),
    "tp2 fsdp2": ("tp2,fsdp2", {}, False),
    "pp2 dp2 1f1b": ("pp2,dp2", {"microbatches": 3}, False),
    "pp2 dp2 gpipe": ("pp2,dp2", {"pp_schedule": "gpipe", "microbatches": 2}, False),
    "pp2 dp2 interleaved": ("pp2,dp2", {"pp_schedule": "interleaved", "virtual_stages": 2, "microbatches": 4}, False),
    "cp2 dp2": ("cp2,dp2", {}, False),
    "cp2 dp2 full checkpointing": ("cp2,dp2", {}, False),
    "ep2 dp4": ("ep2,dp4", {"microbatches": 2}, True),  # experts over 2 of the 4 data-parallel ranks
    "tp2 ep2 dp2": ("tp2,ep2,dp2", {}, True),
    "tp2sp ep4 etp1 dp2": ("tp2sp,ep4,etp1,dp2", {}, True),  # experts without TP: EP spans the TP ranks
}
CHECKPOINTING = {"cp2 dp2 full checkpointing": "full"}
MICROBATCH = 2
RATE = 1e6  # FLOP per us (1 TFLOP/s): llama-tiny's layer of 2 sequences computes for about 14 us


def _layout(case):
    text, schedule, moe = CASES[case]
    par = parse_layout(text, gpus=4, **schedule)
    par.check(4, shape=MOE if moe else load_profile("llama-tiny").transformer)
    return par


def _rank(rank, port, out):
    import torch
    import torch.distributed as dist

    from commbench.proxies.layouts.replay import LayoutReplay

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    profile = load_profile("llama-tiny")
    try:
        for case, (_, _, moe) in CASES.items():
            shape = MOE if moe else profile.transformer
            replay = LayoutReplay(_layout(case), shape, profile, rank, MICROBATCH,
                                  checkpointing=CHECKPOINTING.get(case, "none"), rate=RATE)
            replay.step()
            calls = []
            labels = {g.group_name: dim for dim, g in replay.groups.items()}
            with c10d_trace(calls, labels, unlabelled=lambda group: "world"):
                figures = replay.step()
            calls = [(collective, nbytes, group) for collective, nbytes, _, group in calls]  # compared without dtypes
            out.put((case, rank, calls, figures.compute_us, figures.step_us))
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def traced():
    """(case, rank) -> (the calls of one step, its compute and step in us)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    old = {k: os.environ.pop(k) for k in list(os.environ) if k not in clean_env()}
    try:
        procs = [ctx.Process(target=_rank, args=(r, port, out)) for r in range(4)]
        for p in procs:
            p.start()
        results = {}
        try:
            while len(results) < 4 * len(CASES):
                case, rank, *result = out.get(timeout=120)
                results[(case, rank)] = result
        except queue.Empty:
            pytest.fail(f"the ranks stopped after {sorted(results)}")
        for p in procs:
            p.join(timeout=60)
        assert all(p.exitcode == 0 for p in procs)
    finally:
        os.environ.update(old)
    return results


def _by_key(calls):
    """(dimension, collective) -> (calls, bytes): sends stand for pipeline and ring steps, receives are left out."""
    out = {}
    for collective, nbytes, group in calls:
        if collective == "recv":
            continue
        dim = {"world": "pp", "replicas": "dp"}.get(group, group)
        key = (dim, "sendrecv" if dim == "cp" else collective)
        count, total = out.get(key, (0, 0))
        out[key] = (count + 1, total + nbytes)
    return out


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("rank", range(4))
def test_a_step_issues_the_layouts_calls_and_bytes(traced, case, rank):
    par = _layout(case)
    profile = load_profile("llama-tiny")
    shape = MOE if CASES[case][2] else profile.transformer
    stage = par.coords(rank)["pp"]
    calls, _, _ = traced[(case, rank)]
    issued = _by_key(calls)
    layer_and_pipeline = {k: v for k, v in issued.items() if k[0] != "dp"}
    assert layer_and_pipeline == step_bytes(par, shape, MICROBATCH, CHECKPOINTING.get(case, "none"), stage)
    assert sum(1 for c in calls if c[0] == "recv") == sum(1 for c in calls if c[0] == "send")  # every send received
    # the data-parallel setup on the replicas (dp x cp ranks): the stage's share of the gradients
    from commbench.proxies.setup_steps import Compute, Placement
    from commbench.proxies.setups import settle

    share = stage_profile(profile, shape.layers, par, stage)
    accumulate = {"accumulate": par.microbatches} if par.pp == 1 and par.microbatches > 1 else {}
    plan = settle(par.setup, accumulate).plan(share, Compute(1.0, 2.0), Placement(1, par.dp * par.cp, "cpu"))
    planned = {(("dp", c), by) for (c, _), by in plan.bytes_by().items()}
    assert {(k, v) for k, v in issued.items() if k[0] == "dp"} == planned
    if par.setup == "ddp":
        assert issued[("dp", "allreduce")][1] == share.nbytes
        assert share.nbytes < profile.nbytes if par.tp * par.pp > 1 else share.nbytes == profile.nbytes


def test_the_compute_is_the_stages_flops_at_the_rate(traced):
    """A rank's compute is its stage's layers (and the last stage's head), per micro-batch
    forward and twice that backward; the step takes at least as long."""
    par = _layout("pp2 dp2 1f1b")
    shape = load_profile("llama-tiny").transformer
    tokens = MICROBATCH * shape.seq_len
    for rank in range(4):
        stage = par.coords(rank)["pp"]
        layers = range(2 * stage, 2 * stage + 2)
        flops = sum(shape.layer_forward_flops(i, causal_halved=True) for i in layers) + \
            (shape.head_forward_flops() if stage else 0)
        _, compute_us, step_us = traced[("pp2 dp2 1f1b", rank)]
        assert compute_us == pytest.approx(3 * flops * tokens * par.microbatches / RATE)
        assert step_us >= compute_us


def test_data_parallel_calls_overlap_the_passes_as_the_setups_plan_issues_them(traced):
    """FSDP's gathers come before the forward's first TP call and some reduce-scatters before the backward's
    last one: the plan's calls are issued inside the rank's last passes, not all after them."""
    for rank in range(4):
        calls, _, _ = traced[("tp2 fsdp2", rank)]
        tp = [i for i, (_, _, group) in enumerate(calls) if group == "tp"]
        assert any(c == "allgather" and g == "replicas" for c, _, g in calls[:tp[0]])
        assert any(c == "reduce_scatter" and g == "replicas" for c, _, g in calls[:tp[-1]])
