"""How each setup of the table (proxies/setups.py) lays out one training step: its compute phases and its
calls, each with when it is ready and when the compute needs it (a CommPlan, proxies/comm_plan.py).

Where each behaviour comes from (docs/setups.md cites the lines):
- `ddp`: torch.nn.parallel.DistributedDataParallel: buckets of gradients in ready order
  (proxies/buckets.py), each allreduced as soon as its last gradient is ready, the optimizer
  after the last one. `accumulate` k: k - 1 micro-steps under `no_sync()` (no communication),
  the k-th synchronises (torch docs, DistributedDataParallel.no_sync).
- `ddp-fp16`, `ddp-bf16`: DDP with `fp16_compress_hook` / `bf16_compress_hook`
  (torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py): each bucket cast to 16 bits,
  allreduced, cast back: half the bytes.
- `apex`: APEX's apex.parallel.DistributedDataParallel: allreduces of `message_size` elements
  (10,000,000 by default) in gradient-arrival order, no small first bucket; NVIDIA's BERT
  pretraining script sets 250,000,000, one allreduce after the backward.
- `horovod`: Horovod's tensor fusion: every `cycle_ms` (HOROVOD_CYCLE_TIME) the gradients ready
  by then are fused into buffers of at most `fusion_mb` (HOROVOD_FUSION_THRESHOLD) and allreduced;
  1 ms and 128 MiB by default since Horovod 0.21.0 (5 ms and 64 MiB before).
- `zero1`, `zero2`: DeepSpeed ZeRO stages 1 and 2: gradients reduce-scattered (stage 1 after the
  backward, at the accumulation boundary; stage 2 in buckets as they are ready, every
  micro-step), the optimizer on each rank's shard, the updated parameters all-gathered
  (`reduce_bucket_size`, `allgather_bucket_size`: 5e8 elements by default).
- `fsdp-full`, `fsdp-grad-op`, `fsdp-hybrid`: FSDP2 (torch.distributed.fsdp.fully_shard) with
  each unit of the profile sharded: FULL_SHARD (reshard_after_forward=True: all-gather per unit
  in the forward and again in the backward), SHARD_GRAD_OP (False: in the forward only), and
  HYBRID_SHARD (sharded within a node, the gradient shards allreduced across nodes); a
  reduce-scatter per unit after its backward (the root's last: FSDP2 runs it in its final callback);
  the root's parameters stay gathered between the forward and the backward. Each parameter's first
  dimension is padded to a multiple of the shard group (`sharded_nbytes`). `prefetch`: all-gathers
  issued ahead of the forward (a GPU's CPU runs ahead of its kernels, so one; CPU ranks issue each
  when they reach it, none); the backward prefetches one unit (FSDP2's default). On CPUs (gloo)
  every FSDP call blocks where it is issued.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from commbench.proxies import buckets as B
from commbench.proxies.comm_plan import Comm, Phase
from commbench.proxies.profile import DTYPE_BYTES, Profile

MIB = 1 << 20


@dataclass(frozen=True)
class Compute:
    """One micro-step's compute on one rank (microseconds): the model's forward and backward at the batch,
    the optimizer over the whole model, and the setup's own work per step (measured at 1 rank)."""
    forward_us: float
    backward_us: float
    optimizer_us: float = 0.0
    own_us: float = 0.0


@dataclass(frozen=True)
class Placement:
    """Where a data-parallel job's ranks sit: `nodes` nodes of `ranks_per_node` ranks on `device` (not a parallel
    layout: that is proxies/layouts/parallelism.py's Parallelism)."""
    nodes: int
    ranks_per_node: int
    device: str = "cuda"  # cpu ranks issue FSDP's forward all-gathers as they reach them

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


# ---------------------------------------------------------------- building a step


class StepContext:
    """Progress bookkeeping while a setup lays out its step: phases end to end from 0."""

    def __init__(self, profile: Profile, compute: Compute, layout: Placement, knobs: dict[str, Any],
                 bucketing: str = "ddp"):
        self.profile, self.compute, self.layout, self.knobs = profile, compute, layout, knobs
        self.bucketing = bucketing
        self.phases: list[Phase] = []
        self.comms: list[Comm] = []
        self.k = knobs.get("accumulate", 1)

    @property
    def now(self) -> float:
        return self.phases[-1].end_us if self.phases else 0.0

    def run(self, name: str, duration_us: float, micro: int, unit: str = "") -> tuple[float, float]:
        start = self.now
        self.phases.append(Phase(name, unit, micro, start, start + max(0.0, duration_us)))
        return start, self.now

    def issue(self, collective: str, nbytes: int, dtype: str, group: str, ready: float, needed: float, *,
              label: str) -> None:
        if nbytes > 0 and self.group_size(group) > 1:
            self.comms.append(Comm(collective, int(nbytes), dtype, group, ready, needed, label))

    def group_size(self, group: str) -> int:
        return {"world": self.layout.world, "node": self.layout.ranks_per_node, "cross": self.layout.nodes}[group]

    def shard_group(self) -> str:
        return "node" if self.knobs.get("shard_group") == "node" and self.layout.nodes > 1 else "world"


def _bucketed(ctx: StepContext, buckets: list[B.Bucket], *, collective: str = "allreduce", scale: float = 1.0,
              dtype: str | None = None, group: str = "world", own_in_backward: bool = True) -> None:
    """The DDP family's step: k micro-steps, the last one's backward issuing each bucket when it is ready;
    the optimizer waits for all. The setup's own work: half stretches the synchronising backward, half runs
    after the last call (proxies/timeline.plan_step)."""
    c = ctx.compute
    for micro in range(ctx.k):
        ctx.run("forward", c.forward_us, micro)
        last = micro == ctx.k - 1
        backward = c.backward_us + (c.own_us / 2 if last and own_in_backward else 0.0)
        start, end = ctx.run("backward", backward, micro)
        if not last:
            continue
        for bucket in buckets:
            ready = start + backward * bucket.ready_share
            ctx.issue(collective, int(bucket.nbytes * scale), dtype or bucket.dtype, group, ready, end,
                      label=f"bucket {bucket.index}")
    ctx.run("own", c.own_us / 2 if own_in_backward else c.own_us, ctx.k - 1)


def ddp(profile: Profile, knobs: dict[str, Any], ctx: StepContext, scale: float = 1.0, dtype: str | None = None):
    _bucketed(ctx, B.assign(profile, knobs.get("bucket_mb"), ctx.bucketing), scale=scale, dtype=dtype)
    ctx.run("optimizer", ctx.compute.optimizer_us, ctx.k - 1)
    return ctx.phases, ctx.comms


def compressed(dtype: str):
    def build(profile: Profile, knobs: dict[str, Any], ctx: StepContext):
        return ddp(profile, knobs, ctx, scale=DTYPE_BYTES[dtype] / 4, dtype=dtype)
    return build


def _capped(profile: Profile, cap_bytes: float) -> list[B.Bucket]:
    """Buckets of at least `cap_bytes` in ready order, per dtype, no small first bucket (APEX, DeepSpeed)."""
    groups = B._by_dtype(profile, profile.ready_order(), [cap_bytes])
    return [B._bucket(profile, k, group) for k, group in enumerate(groups)]


def apex(profile: Profile, knobs: dict[str, Any], ctx: StepContext):
    _bucketed(ctx, _capped(profile, knobs["message_size"] * 4))
    ctx.run("optimizer", ctx.compute.optimizer_us, ctx.k - 1)
    return ctx.phases, ctx.comms


def horovod(profile: Profile, knobs: dict[str, Any], ctx: StepContext):
    """Fusion buffers: the gradients ready within each cycle, fused up to the threshold, issued at the cycle's end
    (the last cycle's at the end of the backward, where the timer's remaining wait is not counted)."""
    c = ctx.compute
    cycle_us, cap = knobs["cycle_ms"] * 1e3, knobs["fusion_mb"] * MIB
    backward = c.backward_us + c.own_us / 2
    by_cycle: dict[int, list[int]] = {}
    for i in profile.ready_order():
        ready = backward * profile.ready_share(i)
        by_cycle.setdefault(int(ready // cycle_us) if cycle_us > 0 else 0, []).append(i)
    for micro in range(ctx.k):
        ctx.run("forward", c.forward_us, micro)
        last = micro == ctx.k - 1
        start, end = ctx.run("backward", backward if last else c.backward_us, micro)
        if not last:
            continue
        n = 0
        for cycle, members in sorted(by_cycle.items()):
            ready = min(start + (cycle + 1) * cycle_us, end)
            for group in B._by_dtype(profile, members, [cap]):
                nbytes = sum(profile.tensors[i].nbytes for i in group)
                ctx.issue("allreduce", nbytes, profile.tensors[group[0]].dtype, "world", ready, end,
                          label=f"fusion buffer {n}")
                n += 1
    ctx.run("own", c.own_us / 2, ctx.k - 1)
    ctx.run("optimizer", c.optimizer_us, ctx.k - 1)
    return ctx.phases, ctx.comms


def zero(stage: int):
    def build(profile: Profile, knobs: dict[str, Any], ctx: StepContext):
        c, group = ctx.compute, ctx.shard_group()
        shards = ctx.group_size(group)
        buckets = _capped(profile, knobs["bucket_elements"] * 4)
        if stage == 2:  # reduce-scatter in buckets as gradients are ready, every micro-step
            for micro in range(ctx.k):
                ctx.run("forward", c.forward_us, micro)
                start, end = ctx.run("backward", c.backward_us + c.own_us / 2 / ctx.k, micro)
                for b in buckets:
                    ready = start + (end - start) * b.ready_share
                    needed = end if knobs["overlap_comm"] == "true" else ready  # blocking: the backward waits
                    ctx.issue("reduce_scatter", b.nbytes, b.dtype, group, ready, needed,
                              label=f"bucket {b.index} (m{micro})")
        else:  # stage 1: the gradients reduce-scattered once, at the accumulation boundary
            for micro in range(ctx.k):
                ctx.run("forward", c.forward_us, micro)
                start, end = ctx.run("backward", c.backward_us + (c.own_us / 2 if micro == ctx.k - 1 else 0), micro)
            for b in buckets:
                ctx.issue("reduce_scatter", b.nbytes, b.dtype, group, end, end, label=f"bucket {b.index}")
        ctx.run("own", c.own_us / 2, ctx.k - 1)
        start, end = ctx.run("optimizer", c.optimizer_us / shards, ctx.k - 1)
        for b in buckets:  # the updated shards gathered before the next forward
            ctx.issue("allgather", b.nbytes, b.dtype, group, end, end, label=f"parameters {b.index}")
        return ctx.phases, ctx.comms
    return build


def units_of(profile: Profile) -> list[tuple[str, list[int], float, float]]:
    """(name, tensor indices, forward work, backward work) per sharding unit, in forward order: the profile's
    own units (FLOPs), or, for a profile without them, one unit per name prefix up to its first number (layer1.0,
    encoder.layer.3), the rest in the root unit "", with the backward's work (FLOPs, or a traced profile's
    microseconds: Profile.compute_work) between units' readiness and the forward shared out as the backward is."""
    own = getattr(profile, "units", ())
    if own:
        return [(u.name, list(u.tensors), u.forward_flops, u.backward_flops) for u in own]
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(profile.tensors):
        parts = t.name.split(".")
        cut = next((k for k, part in enumerate(parts[:-1]) if part.isdigit()), None)
        groups.setdefault(".".join(parts[:cut + 1]) if cut is not None else "", []).append(i)
    ready = {name: max(profile.ready_work(i) for i in members) for name, members in groups.items()}
    order = sorted(groups, key=lambda n: ready[n])  # backward order
    done, backward = 0.0, {}
    for name in order:
        backward[name] = ready[name] - done
        done = ready[name]
    forward_work, backward_work = profile.compute_work()
    if order:
        backward[order[-1]] += max(0.0, backward_work - done)
    share = forward_work / backward_work if backward_work > 0 else 0.0
    forward_order = [n for n in reversed(order) if n != ""]
    names = ([""] if "" in groups else []) + forward_order
    return [(n, groups[n], backward[n] * share, backward[n]) for n in names]


def sharded_nbytes(profile: Profile, members: list[int], shards: int) -> int:
    """A unit's all-gather output and reduce-scatter input (bytes per rank): FSDP2 pads each parameter's first
    dimension to a multiple of the shard group's size (fully_shard's `_get_dim0_padded_size`) and gathers and
    reduce-scatters the unit's parameters as one flat buffer."""
    total = 0
    for i in members:
        t = profile.tensors[i]
        shape = t.shape or (1,)
        total += math.ceil(shape[0] / shards) * shards * math.prod(shape[1:]) * DTYPE_BYTES[t.dtype]
    return total


def fsdp(reshard: bool):
    """FSDP2's step as torch 2.14.1 issues it, call for call (tests/unit/proxies/test_setups_torch.py).
    On a CPU every call blocks where it is issued (async_op=False, no streams): needed where ready."""
    def build(profile: Profile, knobs: dict[str, Any], ctx: StepContext):
        c, group, layout = ctx.compute, ctx.shard_group(), ctx.layout
        units = units_of(profile)
        shards = ctx.group_size(group)
        cpu = layout.device == "cpu"
        nbytes = {name: sharded_nbytes(profile, members, shards) for name, members, _, _ in units}
        dtype = {name: profile.tensors[members[0]].dtype for name, members, _, _ in units}
        flops_f = sum(u[2] for u in units) or 1.0
        flops_b = sum(u[3] for u in units) or 1.0
        prefetch = knobs.get("prefetch")
        prefetch = (0 if cpu else 1) if prefetch is None else prefetch
        own_f = c.own_us / 2 / ctx.k / max(1, len(units))

        def issue(collective: str, name: str, ready: float, needed: float, what: str, *, group_: str = group,
                  size: int | None = None) -> None:
            ctx.issue(collective, nbytes[name] if size is None else size, dtype[name], group_, ready,
                      ready if cpu else needed, label=f"{name or 'root'} {what}")

        for micro in range(ctx.k):
            starts = [ctx.run("forward", c.forward_us * f / flops_f + own_f, micro, name)[0]
                      for name, _, f, _ in units]
            for j, (name, _, _, _) in enumerate(units):  # each unit is resharded after its backward
                issue("allgather", name, starts[max(0, j - prefetch)], starts[j], "forward")
            back = list(reversed(units))
            spans = [ctx.run("backward", c.backward_us * b / flops_b + own_f, micro, name) for name, _, _, b in back]
            for j, (name, _, _, _) in enumerate(back):
                start, end = spans[j]
                if reshard and j == 0 and name != "":
                    issue("allgather", name, start, start, "backward")
                if reshard and j + 1 < len(back) and back[j + 1][0] != "":  # the next unit, prefetched
                    issue("allgather", back[j + 1][0], start, spans[j + 1][0], "backward")
                if micro == ctx.k - 1:
                    issue("reduce_scatter", name, end, math.inf, "gradients")
                    if group == "node":
                        issue("allreduce", name, end, math.inf, "gradient shard across nodes", group_="cross",
                              size=nbytes[name] // shards)
        ctx.run("optimizer", c.optimizer_us / shards, ctx.k - 1)
        return ctx.phases, ctx.comms
    return build
