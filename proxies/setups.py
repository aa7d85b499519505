"""The setup table: how a data-parallel training job communicates, one entry per setup.

A setup says, per step, which collectives run on which tensors or sharding units, in which
order, which compute each waits for and which it overlaps (proxies/comm_plan.py), and which
knobs change that. The proxy replay, the sim proxy, predict-scaling, check and train all read
the same entry: adding a setup is adding an entry here.

Each entry's step, and where each behaviour comes from, is in proxies/setup_steps.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from commbench.proxies.comm_plan import Comm, CommPlan, Phase
from commbench.proxies.profile import Profile
from commbench.proxies.setup_steps import (
    Compute,
    Placement,
    StepContext,
    apex,
    compressed,
    ddp,
    fsdp,
    horovod,
    zero,
)


class SetupError(ValueError):
    """An unknown setup, a knob it does not have, a value out of range, a group that does not divide the
    ranks: one line for the user."""


@dataclass(frozen=True)
class Knob:
    name: str
    kind: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float = 0.0  # ints: at least this; floats: more than this
    maximum: float = 1e15  # at most this


KNOBS = {k.name: k for k in (
    Knob("accumulate", int, 1, "micro-steps per optimizer step; gradients are synchronised in the last one", minimum=1,
         maximum=4096),  # each micro-step is laid out in the step's plan: 10^9 of them ran for minutes
    Knob("bucket_mb", float, None, "DDP bucket_cap_mb (default: DDP's 25 MiB with a 1 MiB first bucket)"),
    Knob("message_size", int, 10_000_000, "APEX message_size: elements per allreduce", minimum=1),
    Knob("fusion_mb", float, 128.0, "Horovod HOROVOD_FUSION_THRESHOLD, MiB (64 before Horovod 0.21)"),
    Knob("cycle_ms", float, 1.0, "Horovod HOROVOD_CYCLE_TIME, ms (5 before Horovod 0.21)"),
    Knob("overlap_comm", str, "false", "DeepSpeed overlap_comm: reduce-scatters beside the backward (true) or "
         "blocking it (false, DeepSpeed's default for stages 1 and 2)", choices=("false", "true")),
    Knob("bucket_elements", int, 500_000_000, "DeepSpeed reduce_bucket_size / allgather_bucket_size, elements",
         minimum=1),
    Knob("prefetch", int, None, "FSDP all-gathers issued ahead in the forward (default: 1 on GPUs, 0 on CPUs)",
         minimum=0),
    Knob("shard_group", str, "world", "ranks a shard spans: world, or node (hybrid: replicated across nodes)",
         choices=("world", "node")),
)}


@dataclass(frozen=True)
class Setup:
    """Every fact about one setup, read by the replay, real training, the timeline, the cost model and check
    (no code elsewhere compares a setup's name): what it is, its knobs, its step, and how it runs for real."""
    name: str
    summary: str
    knobs: tuple[str, ...]  # the KNOBS it takes
    build: Callable[[Profile, dict[str, Any], Any], tuple[list[Phase], list[Comm]]]
    trains_as: str  # how `commbench train` runs it for real: ddp, fsdp, or "" (not here)
    fixed: tuple[tuple[str, Any], ...] = ()  # knob values the entry sets itself (fsdp-hybrid's shard group)
    allreduce_only: bool = False  # every call a world allreduce (commbench's own schedules can replay it)
    comm_hook: str = ""  # DDP's comm hook, a name in torch.distributed.algorithms.ddp_comm_hooks.default_hooks
    reshard_after_forward: bool | None = None  # FSDP2 fully_shard's flag (None: not FSDP)
    trains_instead: str = ""  # trains_as "": why, and the nearest setup that `train` runs
    proxy_buckets: bool = False  # replayed through the proxy's DDP buckets (--no-bucketing/--single-bucket apply)
    memory_sharding: str = "none"  # what it shards of the model states at rest (proxies/layouts/memory.py's SHARDING)


@dataclass(frozen=True)
class Choice:
    """A setup with its knobs settled (every knob it takes, default or given)."""
    setup: Setup
    knobs: tuple[tuple[str, Any], ...]

    @property
    def name(self) -> str:
        return self.setup.name

    def get(self, name: str) -> Any:
        return dict(self.knobs)[name]

    def to_dict(self) -> dict[str, Any]:
        return {"setup": self.name, "knobs": dict(self.knobs)}

    def plan(self, profile: Profile, compute: Compute, layout: Placement, bucketing: str = "ddp") -> CommPlan:
        """The step's compute and calls; `bucketing` none or single: the proxy's DDP without buckets, or with one."""
        ctx = StepContext(profile, compute, layout, dict(self.knobs), bucketing)
        phases, comms = self.setup.build(profile, dict(self.knobs), ctx)
        plan = CommPlan(tuple(phases), tuple(sorted(comms, key=lambda c: c.ready_us)))
        plan.check()
        return plan


def settle(name: str, knobs: dict[str, Any] | None = None, layout: Placement | None = None) -> Choice:
    """The setup `name` with `knobs` (name -> value, None: its default) checked against it and `layout`."""
    setup = SETUPS.get(name)
    if setup is None:
        raise SetupError(f"unknown setup {name!r}; choose from {', '.join(SETUPS)}")
    given = {k: v for k, v in (knobs or {}).items() if v is not None}
    for key in given:
        if key not in setup.knobs:
            takes = ", ".join("--" + k.replace("_", "-") for k in setup.knobs) or "none"
            raise SetupError(f"setup {name} has no knob --{key.replace('_', '-')} (it takes: {takes})")
    values = {k: _value(KNOBS[k], given.get(k, KNOBS[k].default)) for k in setup.knobs}
    values.update(dict(setup.fixed))
    if layout is not None:
        _check_layout(name, values, layout)
    return Choice(setup, tuple(values.items()))


def _value(knob: Knob, value: Any) -> Any:
    flag = "--" + knob.name.replace("_", "-")
    if value is None:
        return None
    if knob.choices:
        if value not in knob.choices:
            raise SetupError(f"{flag} {value}: choose from {', '.join(knob.choices)}")
        return value
    if isinstance(value, bool):
        raise SetupError(f"{flag} {value!r}: not a number")
    try:
        number = knob.kind(value)
    except (TypeError, ValueError, OverflowError):
        raise SetupError(f"{flag} {value!r}: not a {'whole ' if knob.kind is int else ''}number") from None
    if knob.kind is int and number != value:
        raise SetupError(f"{flag} {value!r}: must be a whole number")
    in_range = number >= knob.minimum if knob.kind is int else number > knob.minimum
    if not (in_range and math.isfinite(number) and number <= knob.maximum):
        low = f"at least {knob.minimum:g}" if knob.kind is int else f"more than {knob.minimum:g}"
        raise SetupError(f"{flag} {value}: must be {low} and at most {knob.maximum:g}")
    return number


def _check_layout(name: str, values: dict[str, Any], layout: Placement) -> None:
    if values.get("shard_group") == "node" and layout.world % layout.ranks_per_node:
        raise SetupError(f"setup {name}: shards span a node of {layout.ranks_per_node} ranks, which does not "
                         f"divide {layout.world} ranks")


DEFAULT_SETUP = "ddp"  # what a command runs without --setup
_DDP_KNOBS = ("accumulate", "bucket_mb")
_FSDP_KNOBS = ("accumulate", "prefetch", "shard_group")
SETUPS = {s.name: s for s in (
    Setup("ddp", "PyTorch DDP: buckets allreduced as their gradients are ready", _DDP_KNOBS, ddp, "ddp",
          allreduce_only=True, proxy_buckets=True),
    Setup("ddp-fp16", "DDP with fp16_compress_hook: buckets allreduced in fp16", _DDP_KNOBS, compressed("float16"),
          "ddp", allreduce_only=True, comm_hook="fp16_compress_hook"),
    Setup("ddp-bf16", "DDP with bf16_compress_hook: buckets allreduced in bf16", _DDP_KNOBS, compressed("bfloat16"),
          "ddp", allreduce_only=True, comm_hook="bf16_compress_hook"),
    Setup("apex", "APEX DDP: allreduces of message_size elements in arrival order", ("accumulate", "message_size"),
          apex, "ddp", allreduce_only=True),
    Setup("horovod", "Horovod tensor fusion: ready gradients fused each cycle", ("accumulate", "fusion_mb",
                                                                                  "cycle_ms"), horovod, "",
          allreduce_only=True, trains_instead="Horovod is not installed here; the nearest that trains here: --setup "
                                              "ddp (gradient buckets allreduced as they are ready)"),
    Setup("zero1", "DeepSpeed ZeRO-1: reduce-scatter after the backward, all-gather after the optimizer",
          ("accumulate", "bucket_elements"), zero(1), "", memory_sharding="zero1",
          trains_instead="DeepSpeed is not installed here; the nearest that trains here: --setup fsdp-grad-op (every "
                         "gradient reduce-scattered and every parameter all-gathered once a step, per unit)"),
    Setup("zero2", "DeepSpeed ZeRO-2: reduce-scatter as gradients are ready, all-gather after the optimizer",
          ("accumulate", "bucket_elements", "overlap_comm"), zero(2), "", memory_sharding="zero2",
          trains_instead="DeepSpeed is not installed here; the nearest that trains here: --setup fsdp-grad-op "
                         "(ZeRO-2's FSDP form, SHARD_GRAD_OP)"),
    Setup("fsdp-full", "FSDP2 FULL_SHARD: all-gather per unit in forward and backward, reduce-scatter per unit",
          _FSDP_KNOBS, fsdp(True), "fsdp", reshard_after_forward=True, memory_sharding="fsdp"),
    Setup("fsdp-grad-op", "FSDP2 SHARD_GRAD_OP: all-gather per unit in the forward, reduce-scatter per unit",
          _FSDP_KNOBS, fsdp(False), "fsdp", reshard_after_forward=False,
          memory_sharding="zero2"),  # parameters stay gathered from the forward to the backward
    Setup("fsdp-hybrid", "FSDP2 HYBRID_SHARD: sharded within a node, gradient shards allreduced across nodes",
          ("accumulate", "prefetch"), fsdp(True), "fsdp", fixed=(("shard_group", "node"),),
          reshard_after_forward=True, memory_sharding="fsdp"),
)}
