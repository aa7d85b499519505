"""A setup of proxies/setups.py run for real: the model wrapped as the setup says, and its step.

- the DDP family (ddp, ddp-fp16, ddp-bf16, apex): torch's DistributedDataParallel with the
  setup's `bucket_cap_mb` (apex: `message_size` x 4 bytes in MiB, so that every bucket, the first
  included, holds at least that many fp32 elements) and its comm hook (`fp16_compress_hook`,
  `bf16_compress_hook` from torch.distributed.algorithms.ddp_comm_hooks.default_hooks);
- FSDP (fsdp-full, fsdp-grad-op, fsdp-hybrid): FSDP2's `fully_shard` on each unit of
  `setup_steps.units_of(profile)`, then on the root (left at FSDP2's default, which keeps the root's
  parameters gathered from the forward to the backward), with `reshard_after_forward` True or
  False; with `shard_group` node on more than one node, a 2-D mesh (replicate across nodes, shard
  within a node: HSDP); `prefetch` > 0 sets `set_modules_to_forward_prefetch` from the root on.

`accumulate` k: k - 1 micro-steps without gradient synchronisation (DDP's `no_sync()`, FSDP's
`set_requires_gradient_sync(False)`), the k-th with it, then the optimizer: one step.
`own_work_us` times the setup's own work at one rank (what it adds to a step when no traffic
leaves the rank), which the replay puts in `Compute.own_us`.
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from typing import Any

from commbench.proxies.setup_steps import MIB, Placement, units_of
from commbench.proxies.setups import Choice
from commbench.proxies.units import untie


@dataclass
class Running:
    """A Trainer whose model is wrapped as a setup says; `step` is one optimizer step of the setup."""
    trainer: Any  # proxies.train.Trainer
    choice: Choice
    kind: str  # ddp, fsdp, or plain (the model alone)
    what: str  # the header's line: which real setup runs
    groups: dict = field(default_factory=dict)  # the plan's group names (world, node, cross) -> ProcessGroup

    @property
    def accumulate(self) -> int:
        return dict(self.choice.knobs).get("accumulate", 1)

    def step(self, synchronise: bool = True) -> None:
        """k micro-steps (the last synchronises gradients unless `synchronise` is False), the optimizer."""
        trainer = self.trainer
        for micro in range(self.accumulate):
            with self._gradient_sync(synchronise and micro == self.accumulate - 1):
                trainer.backward(trainer.forward())
        trainer.update()
        trainer.sync()

    def _gradient_sync(self, on: bool):
        if self.kind == "fsdp":
            self.trainer.model.set_requires_gradient_sync(on)
        elif self.kind == "ddp" and not on:
            return self.trainer.wrapped.no_sync()
        return contextlib.nullcontext()


def bucket_cap_mb(choice: Choice) -> float | None:
    """DDP's bucket_cap_mb for a DDP-family setup (None: DDP's default, 25 MiB with a 1 MiB first bucket)."""
    knobs = dict(choice.knobs)
    if "message_size" in knobs:  # APEX: allreduces of at least message_size fp32 elements
        return knobs["message_size"] * 4 / MIB
    return knobs.get("bucket_mb")


def apply(trainer, choice: Choice, layout: Placement, profile, device_ids: list[int] | None = None,
          process_group: Any = None) -> Running:
    """Wrap `trainer.model` as `choice` says, on `process_group` (None: the default group, laid out as
    `layout`; a group of one rank: DDP on it, or FSDP on a 1-rank mesh)."""
    kind = choice.setup.trains_as
    if kind == "ddp":
        return _ddp(trainer, choice, device_ids, process_group)
    if kind == "fsdp":
        return _fsdp(trainer, choice, layout, profile, process_group)
    raise ValueError(f"setup {choice.name} does not train here")


def _ddp(trainer, choice: Choice, device_ids, group) -> Running:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    cap = bucket_cap_mb(choice)
    trainer.wrap(cap, device_ids, group)
    hook = choice.setup.comm_hook
    if hook:  # the default hooks take the process group as their state (None: the default group)
        trainer.wrapped.register_comm_hook(group, getattr(default_hooks, hook))
    caps = "DDP's default buckets (25 MiB, first 1 MiB)" if cap is None else f"bucket_cap_mb {cap:g}"
    return Running(trainer, choice, "ddp", f"{choice.name}: torch DistributedDataParallel, {caps}"
                                           + (f", comm hook default_hooks.{hook}" if hook else ""),
                   {"world": group or dist.group.WORLD})


def _fsdp(trainer, choice: Choice, layout: Placement, profile, group) -> Running:
    from torch.distributed.fsdp import fully_shard

    mesh, shape = _mesh(choice, layout, trainer.device, group)
    groups = ({"cross": mesh.get_group("replicate"), "node": mesh.get_group("shard")} if mesh.ndim == 2
              else {"world": mesh.get_group()})
    reshard = choice.setup.reshard_after_forward
    model = trainer.model
    names = [name for name, _, _, _ in units_of(profile) if name]
    kept = untie(model, names)  # a profile extracted before tied parameters were left to the unit holding both
    units = [model.get_submodule(name) for name in kept]
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh)  # the root: FSDP2's default keeps it gathered from forward to backward
    prefetch = dict(choice.knobs).get("prefetch") or 0
    if prefetch:
        chain = [model, *units]
        for i, module in enumerate(chain[:-1]):
            module.set_modules_to_forward_prefetch(chain[i + 1:i + 1 + prefetch])
    trainer.new_optimizer()  # fully_shard replaced the parameters (DTensors)
    untied = f" (not {', '.join(n for n in names if n not in kept)}: tied parameters)" if len(kept) < len(names) else ""
    return Running(trainer, choice, "fsdp", f"{choice.name}: FSDP2 fully_shard on {len(units)} unit(s){untied} and the "
                                            f"root, reshard_after_forward={reshard}, mesh {shape}"
                                            + (f", forward prefetch {prefetch}" if prefetch else ""), groups)


def _mesh(choice: Choice, layout: Placement, device: Any, group):
    """FSDP's device mesh: this rank alone (`group`), the world, or nodes x ranks per node (HSDP)."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    device_type = getattr(device, "type", device)
    if group is not None:
        return DeviceMesh.from_group(group, device_type), "1 (this rank alone)"
    if dict(choice.knobs).get("shard_group") == "node" and layout.nodes > 1:
        shape = (layout.nodes, layout.ranks_per_node)
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=("replicate", "shard"))
        return mesh, f"{shape[0]}x{shape[1]} (replicated across nodes, sharded within a node)"
    one_node = " (shards of a node: one node, nothing replicated)" if dict(choice.knobs).get("shard_group") == "node" \
        else " (sharded)"
    return init_device_mesh(device_type, (layout.world,), mesh_dim_names=("shard",)), f"{layout.world}{one_node}"


def own_work_us(trainer, choice: Choice, profile, group, device_ids=None, *, pairs: int = 6,
                warmup: int = 2) -> float:
    """The setup's own work per step at one rank (on `group`, a process group of this rank alone): steps of
    the setup against steps that leave it out (DDP family: the same steps with every micro-step under no_sync;
    FSDP: the plain model, a copy made before wrapping), interleaved in pairs whose order alternates
    (A B, B A, ...), after `warmup` of each (DDP rebuilds its buckets in its second step); the shortest of
    each kind, on phase_times_us's clock, one minus the other, never below 0. The shortest, because a busy host
    only lengthens a step (even its CPU time: caches, memory); the interleaving, so that both kinds see the
    same host. `trainer` is wrapped here and left wrapped."""
    plain = None
    if choice.setup.trains_as == "fsdp":
        plain = copy.copy(trainer)
        plain.model = copy.deepcopy(trainer.model)
        plain.wrapped = plain.model
        plain.new_optimizer()
    running = apply(trainer, choice, Placement(1, 1, str(getattr(trainer.device, "type", trainer.device))), profile,
                    device_ids, group)
    reference = (Running(plain, choice, "plain", "").step if plain is not None
                 else lambda: running.step(synchronise=False))
    clock = time.thread_time if trainer.cpu_timed() else time.perf_counter

    def timed(step) -> float:
        trainer.on_step(f"{choice.name}'s own work: its steps against steps without it")
        t0 = clock()
        step()
        return clock() - t0

    for _ in range(warmup):
        timed(running.step)
        timed(reference)
    took: dict[bool, list[float]] = {True: [], False: []}
    for pair in range(pairs):
        for setup in ((True, False) if pair % 2 == 0 else (False, True)):
            took[setup].append(timed(running.step if setup else reference))
    return max(0.0, (min(took[True]) - min(took[False])) * 1e6)
