"""Replay a parallel layout's communication on real ranks (torch.distributed), with the compute emulated.

`commbench proxy MODEL --layout tp2,dp2 -N 4` runs this on each rank (proxies/layouts/replay_run.py: its
header and records). Every rank makes the process groups of
every dimension (tp, cp, ep and the data-parallel replicas, dp x cp: every group, in one order on all ranks,
as torch.distributed.new_group needs). Each step, a rank runs its pipeline stage's passes in the schedule's
order (proxies/layouts/pipeline.py):
- a forward pass of a model chunk receives the activation from the previous virtual stage, runs each layer
  (its FLOPs at --tflops, waited for as a GPU's kernels: proxies/clocks.py; or with --compute measured the
  times of the rank's own pieces, proxies/layouts/compute.py, spun for as CPU time on a CPU) with the layer's calls
  (proxies/layouts/calls.py: TP allreduces, or SP all-gathers and reduce-scatters, on the tp group; CP ring
  steps on the cp group, each overlapped with its share of the attention; EP all-to-alls on the ep group in
  MoE layers, the token counts' first) on zero buffers of the calls' sizes, then sends the activation on;
- a backward pass mirrors it: the gradient from the next virtual stage, the layers in reverse with their
  backward calls, the gradient sent back.
Pipeline sends are asynchronous (isend, waited for at the step's end) and each receive names its pass by tag,
so no two neighbours wait on each other: a receive's send is always issued, as the schedule's order is the
order proxies/layouts/pipeline.py proves free of cycles. Ranks of one stage run the same program, so the collectives
of tp, cp, ep and the replicas (all inside a stage) are issued in one order on every member.

The data-parallel setup runs on the replicas: the setups table's plan (proxies/setups.py) for the stage's share
of the model (proxies/layouts/stage_share.py, as analysis/predict_layout.py cuts it), its last micro-step laid over the
rank's last forward and last backward pass: each call is issued (asynchronously) at the layer where the plan
issues it and waited for where the plan needs it, so DDP's buckets and FSDP's reduce-scatters overlap the last
backward as in training, and FSDP's gathers are waited for in the forward; the rest is waited for after the
last pass. Then the calls outside the layers (`calls.outside_layer_calls`: sequence parallelism's norm gradients,
reduced once a step on the tp group, as Megatron-LM's finalize_model_grads does).

A step's figures: compute (the emulated compute), comm = exposed (the time the rank waited for calls and for
its pipeline neighbours: the bubble included; ring steps count only what outlasts their attention) and other
(the rest), step = compute + exposed + other, as the data-parallel proxy's (proxies/steps.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from itertools import zip_longest

from commbench.backends.torch_calls import issue
from commbench.proxies.clocks import CpuClock, SleepClock
from commbench.proxies.layouts.calls import DTYPES, LayerCall, boundary_nbytes, layer_calls, outside_layer_calls
from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.layouts.pieces import RankCompute
from commbench.proxies.layouts.pipeline import Pass, order
from commbench.proxies.layouts.stage_share import stage_layer_ranges, stage_profile
from commbench.proxies.setup_steps import Compute, Placement
from commbench.proxies.setups import settle

GROUP_DIMS = ("tp", "cp", "ep", "replicas")  # replicas: the dp x cp ranks holding the same weights


def replica_ranks(par: Parallelism, rank: int) -> tuple[int, ...]:
    """The ranks holding `rank`'s weights: its dp x cp group (same tp and pp position)."""
    return tuple(sorted({r for c in par.group(rank, "cp") for r in par.group(c, "dp")}))


def make_groups(par: Parallelism, rank: int) -> dict[str, object]:
    """This rank's process group of each dimension with more than one rank; every rank creates every group
    in the same order (new_group is collective over the world)."""
    import torch.distributed as dist

    mine: dict[str, object] = {}
    for dim in GROUP_DIMS:
        seen: list[tuple[int, ...]] = []
        for r in range(par.world):
            members = replica_ranks(par, r) if dim == "replicas" else par.group(r, dim)
            if len(members) > 1 and members not in seen:
                seen.append(members)
        for members in seen:
            group = dist.new_group(list(members))
            if rank in members:
                mine[dim] = group
    return mine


@dataclass
class StepFigures:
    compute_us: float = 0.0
    exposed_us: float = 0.0
    step_us: float = 0.0
    by_dim_us: dict[str, float] = field(default_factory=dict)  # the wait per dimension (pp: the bubble's too)

    @property
    def other_us(self) -> float:
        return max(0.0, self.step_us - self.compute_us - self.exposed_us)


class LayoutReplay:
    """One rank's step of a layout: `rate` is FLOP per microsecond (0: no compute), or `measured` the rank's
    compute timed here (proxies/layouts/compute.py), spun for as CPU time with `cpu_clock`."""

    def __init__(self, par: Parallelism, shape, profile, rank: int, microbatch: int, *, checkpointing: str = "none",
                 rate: float = 0.0, limit_s: float = math.inf, groups: dict | None = None,
                 measured: RankCompute | None = None, cpu_clock: bool = False):
        import torch

        self.par, self.shape, self.rank, self.microbatch = par, shape, rank, microbatch
        self.checkpointing, self.rate, self.measured = checkpointing, rate, measured
        self.coords = par.coords(rank)
        self.stage = self.coords["pp"]
        self.chunks = stage_layer_ranges(shape.layers, par, self.stage)
        self.dtype = getattr(torch, DTYPES.get(shape.dtype_bytes, "float16"))
        self.groups = make_groups(par, rank) if groups is None else groups
        self.calls = {moe: _ordered(layer_calls(par, shape, microbatch, checkpointing, moe)) for moe in (False, True)}
        self.boundary_nbytes = boundary_nbytes(par, shape, microbatch)
        self.step_calls = outside_layer_calls(par, shape, microbatch, self.stage)
        self.clock = CpuClock(limit_s) if cpu_clock else SleepClock(limit_s)
        self.buffers: dict[tuple, object] = {}
        self.figures = StepFigures()
        self.dp_plan = self._data_parallel_plan(profile)
        # the plan's last micro-step starts here (its compute: forward 1 us, backward 2 us a micro-step)
        self.dp_offset_us = max((ph.start_us for ph in self.dp_plan.phases if ph.name == "forward"), default=0.0) \
            if self.dp_plan else 0.0
        self.dp_pending: list = []
        self.dp_works: list = []

    # ------------------------------------------------------------ the step

    def step(self) -> StepFigures:
        self.figures = StepFigures()
        started = time.perf_counter()
        sends: list = []
        passes = order(self.par.pp_schedule, self.par.pp, self.stage, self.par.microbatches, self.par.virtual_stages)
        last = {p.kind: index for index, p in enumerate(passes)}  # the rank's last forward and last backward
        self.dp_pending = [c for c in self.dp_plan.comms if c.group != "cross"] if self.dp_plan else []
        self.dp_works = []
        for index, p in enumerate(passes):
            self._pass(p, sends, index == last[p.kind])
        self._wait("pp", sends)
        self._dp_progress(math.inf)  # what the last backward left: issued now, and every call waited for
        for (dim, collective), calls, nbytes in self.step_calls:  # after the gradients' reduction, as Megatron-LM's
            for _ in range(calls):                                  # finalize_model_grads reduces the SP norms'
                self._collective(LayerCall(dim, collective, nbytes, str(self.dtype).replace("torch.", ""), "step",
                                           1, "", "outside the layers"))
        if self.measured:  # the optimizer's step on the rank's parameters (FLOPs at a rate count none)
            self._compute(self.measured.optimizer_us)
        self.figures.step_us = (time.perf_counter() - started) * 1e6
        return self.figures

    def _pass(self, p: Pass, sends: list, last: bool = False) -> None:
        """One pass; the rank's `last` forward and backward carry the data-parallel plan's progress: its calls
        are issued and waited for where the plan's last micro-step issues and needs them (_dp_progress)."""
        par, stages = self.par, self.par.pp * self.par.virtual_stages
        j = p.chunk * par.pp + self.stage
        forward = p.kind == "F"
        source, target = (j - 1, j + 1) if forward else (j + 1, j - 1)
        if 0 <= source < stages:
            self._wait("pp", [self._p2p("recv", source, p)])
        layers = self.chunks[p.chunk]
        begin, span = (self.dp_offset_us if forward else self.dp_offset_us + 1.0), (1.0 if forward else 2.0)
        m = self.measured
        if m and j == 0 and forward:  # the embedding: the first virtual stage's (its backward after the layers')
            self._compute(m.embed_forward_us)
        if m and j == stages - 1 and not forward:  # the loss and head's backward come first
            self._compute(m.head_backward_us)
        for k, index in enumerate(layers if forward else reversed(layers)):
            if last:
                self._dp_progress(begin + span * k / max(1, len(layers)))
            self._layer(index, forward)
        if m and j == 0 and not forward:
            self._compute(m.embed_backward_us)
        if m and j == stages - 1 and forward:
            self._compute(m.head_forward_us)
        elif j == stages - 1 and self.rate > 0:  # the head's FLOPs: the last virtual stage's
            head = self.shape.head_forward_flops() * self._tokens() / par.tp
            self._compute((head if forward else 2 * head) / self.rate)
        if last:
            self._dp_progress(begin + span)
        if 0 <= target < stages:
            sends.append(self._p2p("send", target, p))

    def _layer(self, index: int, forward: bool) -> None:
        """One layer's compute with its calls: ring steps beside their share of the attention, then the rest of
        the compute in equal slices, each followed by one of the exposed calls (a matrix product, then its
        collective)."""
        phase = "forward" if forward else "backward"
        calls = [c for c in self.calls[self.shape.is_moe_layer(index)] if c.phase == phase]
        ring = [c for c in calls if c.dim == "cp"]
        exposed = [c for c in calls if c.dim != "cp"]
        total, overlapped = self._layer_us(index, forward, bool(ring))
        for call in ring:
            self._ring_step(call, overlapped / len(ring))
        rest = total - overlapped
        for call in exposed:
            self._compute(rest / len(exposed))
            self._collective(call)
        if not exposed:
            self._compute(rest)

    def _layer_us(self, index: int, forward: bool, ring: bool) -> tuple[float, float]:
        """A layer's compute in microseconds, and the part of it beside CP's ring steps (the attention on the
        blocks that travel): FLOPs at the rate, or as measured (the layer on its own block, one measured block
        beside each of the cp - 1 blocks that arrive; recomputed: full, the forward again; selective, the
        attention's blocks)."""
        if self.measured:
            m, others = self.measured, self.par.cp - 1
            overlapped = (m.block_forward_us if forward else m.block_backward_us) * others if ring else 0.0
            recompute = {"none": 0.0, "selective": m.block_forward_us * (others + 1),
                         "full": m.layer_forward_us + m.block_forward_us * others}[self.checkpointing]
            return (m.layer_forward_us if forward else m.layer_backward_us + recompute) + overlapped, overlapped
        if self.rate <= 0:
            return 0.0, 0.0
        shape, tokens = self.shape, self._tokens() / self.par.tp
        # the attention's masked half skipped, as causal kernels do and predict_layout counts (Job.causal_halved)
        flops = shape.layer_forward_flops(index, causal_halved=True) * tokens
        attention = shape.attention_score_flops(causal_halved=True) * tokens
        recompute = {"none": 0.0, "selective": attention, "full": flops}[self.checkpointing]
        total = flops if forward else 2 * flops + recompute
        return total / self.rate, (min(total, attention * (1 if forward else 2)) if ring else 0.0) / self.rate

    def _tokens(self) -> float:
        return self.microbatch * self.shape.seq_len / self.par.cp

    # ------------------------------------------------------------ compute and calls

    def _compute(self, us: float) -> None:
        if us <= 0:
            return
        self.clock.rebase(0.0)
        self.clock.compute_until(us)
        self.figures.compute_us += us

    def _wait(self, dim: str, works: list) -> None:
        if not works:
            return
        started = time.perf_counter()
        for work in works:
            work.wait()
        waited = (time.perf_counter() - started) * 1e6
        self.figures.exposed_us += waited
        self.figures.by_dim_us[dim] = self.figures.by_dim_us.get(dim, 0.0) + waited
        works.clear()

    def _buffer(self, count: int, role: str, dtype=None):
        import torch

        key = (count, role, dtype)
        if key not in self.buffers:
            self.buffers[key] = torch.zeros(max(count, 0), dtype=dtype or self.dtype)
        return self.buffers[key]

    def _collective(self, call: LayerCall) -> None:
        import torch
        import torch.distributed as dist

        group = self.groups[call.dim]
        size = dist.get_world_size(group)
        dtype = getattr(torch, call.dtype)  # the activations', or int64 (an all-to-all of token counts)
        count = call.nbytes // dtype.itemsize // size * size
        full, shard = self._buffer(count, "full", dtype), self._buffer(count // size, "shard", dtype)
        send, recv = {"allgather": (shard, full), "reduce_scatter": (full, shard),  # alltoall: count / size to each
                      "alltoall": (full, self._buffer(count, "received", dtype))}.get(call.collective, (full, full))
        self._wait(call.dim, [issue(dist, call.collective, send, recv, group)])

    def _ring_step(self, call: LayerCall, attention_us: float) -> None:
        """One ring-attention step: this rank's K/V block to the next CP rank while the previous one's arrives,
        beside the attention on the block in hand."""
        import torch.distributed as dist

        members = self.par.group(self.rank, "cp")
        at = members.index(self.rank)
        count = call.nbytes // self.dtype.itemsize
        group = self.groups["cp"]
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, self._buffer(count, "ring send"), members[(at + 1) % len(members)], group),
            dist.P2POp(dist.irecv, self._buffer(count, "ring recv"), members[at - 1], group)])
        self._compute(attention_us)
        self._wait("cp", works)

    def _p2p(self, kind: str, virtual_stage: int, p: Pass):
        """The isend or irecv of pass `p`'s activation (forward) or gradient (backward) with the rank of
        `virtual_stage` at this rank's dp, cp and tp position; the tag names the pass, so that a receive
        matches its own send whatever else is in flight."""
        import torch.distributed as dist

        peer = self.par.rank_of({**self.coords, "pp": virtual_stage % self.par.pp})
        stages = self.par.pp * self.par.virtual_stages
        sender = min(virtual_stage, p.chunk * self.par.pp + self.stage) if p.kind == "F" else \
            max(virtual_stage, p.chunk * self.par.pp + self.stage)
        tag = ((p.kind == "B") * self.par.microbatches + p.microbatch) * stages + sender
        buffer = self._buffer(self.boundary_nbytes // self.dtype.itemsize, kind)
        return (dist.isend if kind == "send" else dist.irecv)(buffer, peer, tag=tag)

    # ------------------------------------------------------------ data parallel

    def _data_parallel_plan(self, profile):
        """The setup's plan for this stage's share of the model over the replicas (None: no replicas)."""
        par = self.par
        replicas = par.dp * par.cp
        if replicas == 1 or profile is None:
            return None
        share = stage_profile(profile, self.shape.layers, par, self.stage)
        accumulate = par.microbatches if par.pp == 1 and par.microbatches > 1 else 1
        choice = settle(par.setup, {"accumulate": accumulate} if accumulate > 1 else {})
        return choice.plan(share, Compute(1.0, 2.0), Placement(1, replicas, "cpu"))

    def _dp_progress(self, at_us: float) -> None:
        """The data-parallel plan's calls at compute progress `at_us` of its last micro-step (forward 1 us,
        backward 2 us, from `dp_offset_us`): those issued by then are started (asynchronous), and those
        needed by then are waited for, as the setup overlaps them with the last backward (DDP's buckets,
        FSDP's reduce-scatters) or waits for them in its forward (FSDP's gathers). One node: its node and
        world groups are the replicas; its cross-node group is this rank alone, so those calls are left out."""
        while self.dp_pending and self.dp_pending[0].ready_us <= at_us:
            comm = self.dp_pending.pop(0)
            self.dp_works.append((comm.needed_us, self._dp_issue(comm)))
        due = [work for needed, work in self.dp_works if needed <= at_us]
        self.dp_works = [(needed, work) for needed, work in self.dp_works if needed > at_us]
        self._wait("dp", due)

    def _dp_issue(self, comm):
        import torch
        import torch.distributed as dist

        group, size = self.groups["replicas"], self.par.dp * self.par.cp
        dtype = getattr(torch, comm.dtype)
        count = comm.nbytes // dtype.itemsize // size * size
        full, shard = self._buffer(count, "dp full", dtype), self._buffer(count // size, "dp shard", dtype)
        send, recv = {"allgather": (shard, full), "reduce_scatter": (full, shard)}.get(comm.collective, (full, full))
        return issue(dist, comm.collective, send, recv, group)


def _ordered(calls: list[LayerCall]) -> list[LayerCall]:
    """Each call repeated by its count, kinds taken in turn (an all-gather, then its reduce-scatter)."""
    runs = [[c] * c.count for c in calls]
    return [c for turn in zip_longest(*runs) for c in turn if c is not None]
