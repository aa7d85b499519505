"""p2p: commbench's schedules over torch.distributed point-to-point (isend/irecv).

The same Schedule objects the shm and sim backends run, executed between real
processes on any number of nodes: gloo on the CPU (NCCL on GPUs is the same code
once the CLI lets p2p onto a GPU). Buffers (torch tensors) are the torch backend's,
and with them its process group (backends/dist_group.py: the rendezvous, the control
plane, timing with perf_counter per call on CPU); this module adds only the executor.

One round of a schedule, on one rank: post every isend (of its working chunk) and
irecv (into a slice of a receive scratch buffer, preallocated when the call is
prepared) of this rank, in the round's transfer order, so that both ends of a peer
pair post their messages in the same order; wait for all of them; then copy or
reduce the received chunks into the working buffer. Nothing is written before every
request of the round has completed, so each send reads the state the round began
with, as the schedule's semantics require (schedules with hazards, such as one-shot
allreduce, are correct too). A copy that nothing else reads in its round is received
straight into the working buffer, saving one copy.

`library` stays the transport (gloo or nccl); the algorithm and its step count are
in every result (`describe()`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from commbench.backends.base import BackendError
from commbench.backends.schedule_base import ScheduleBackend, job_topology
from commbench.backends.torch_dist import TorchBackend, _as_oom
from commbench.backends.torch_lazy import LazyModule
from commbench.launchers import LaunchInfo
from commbench.schedule import Schedule, Transfer
from commbench.topology import Topology

# torch on first use, as torch_dist does: the parent settles options before any rank imports torch
torch = LazyModule("torch", globals(), "torch")
dist = LazyModule("torch.distributed", globals(), "dist")


def _reducer(op: str) -> Callable[[torch.Tensor, torch.Tensor], Any]:
    """out op= data, in place (avg runs as sum; ScheduleBackend divides at the end)."""
    if op in ("sum", "avg"):
        return lambda out, data: out.add_(data)
    if op == "prod":
        return lambda out, data: out.mul_(data)
    if op == "max":
        return lambda out, data: torch.maximum(out, data, out=out)
    if op == "min":
        return lambda out, data: torch.minimum(out, data, out=out)
    raise BackendError(f"--backend p2p has no reduction {op!r}")


@dataclass
class _Round:
    """One round as this rank sees it: the requests to post, then what to apply once all completed."""
    post: Callable[[], list[Any]]  # posts every isend/irecv of the round; returns their requests
    apply: list[tuple[torch.Tensor, torch.Tensor, bool]]  # (working chunk, received data, reduce)


def make_poster(ops: list[tuple[bool, torch.Tensor, int]], library: str) -> Callable[[], list[Any]]:
    """Post (is_send, tensor, peer) requests in order. gloo: straight on the process group
    (dist.batch_isend_irecv costs ~30-100 us more per round there and gloo gains nothing
    from it); NCCL must group a round's sends and receives, or ranks that send to each
    other first would wait forever. Receives are posted before sends: gloo posting a send first
    ran a two-member exchange one direction after the other (half the link each way, measured
    on an emulated cluster: docs/emulation.md)."""
    ops = sorted(ops, key=lambda op: op[0])  # receives (False) first, each kind in its order
    if library == "gloo":
        group = dist.group.WORLD
        calls = [((group.send if is_send else group.recv), [tensor], peer) for is_send, tensor, peer in ops]
        return lambda: [post(tensors, peer, 0) for post, tensors, peer in calls]
    p2p_ops = [dist.P2POp(dist.isend if is_send else dist.irecv, tensor, peer) for is_send, tensor, peer in ops]
    return lambda: dist.batch_isend_irecv(p2p_ops)


class P2PBackend(ScheduleBackend, TorchBackend):
    name = "p2p"

    def __init__(self, launch: LaunchInfo, topology: Topology, algorithm: str = "auto", device: str = "auto",
                 torch_backend: str = "auto", timeout_s: float = 300.0):
        if topology.world != launch.world_size:
            raise BackendError(f"topology {topology} has {topology.world} ranks but the job has {launch.world_size}")
        TorchBackend.__init__(self, launch, device=device, torch_backend=torch_backend, timeout_s=timeout_s)
        self.topology, self.algorithm = topology, algorithm

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> P2PBackend:
        return cls(launch, job_topology(cfg.topology, launch), cfg.algorithm, device=cfg.device,
                   torch_backend=cfg.torch_backend, timeout_s=cfg.timeout_s)

    # ---------------------------------------------------------------- what ScheduleBackend needs

    def length(self, buffer: torch.Tensor) -> int:
        return buffer.numel()

    def itemsize(self, buffer: torch.Tensor) -> int:
        return buffer.element_size()

    def scratch(self, count: int, like: torch.Tensor) -> torch.Tensor:
        return self._empty(count, like)  # lives as long as the prepared call that holds it

    def copy(self, dst: torch.Tensor, src: torch.Tensor, only_rank: int | None = None) -> None:
        if only_rank is None or only_rank == self.rank:
            dst.copy_(src)

    def scale(self, buffer: torch.Tensor, factor: float) -> None:
        buffer.mul_(factor)

    def _empty(self, count: int, like: torch.Tensor) -> torch.Tensor:
        try:
            return torch.empty(count, dtype=like.dtype, device=like.device)
        except (RuntimeError, MemoryError) as exc:
            raise _as_oom(exc, count * like.element_size(), self.device) from exc

    # ---------------------------------------------------------------- running a schedule

    def executor(self, schedule: Schedule, working: torch.Tensor, op: str) -> Callable[[], None]:
        reduce = _reducer(op)
        rounds = self._plan(schedule, working)
        copy = torch.Tensor.copy_

        def call() -> None:
            for rnd in rounds:
                for request in rnd.post():
                    request.wait()
                for out, data, is_reduce in rnd.apply:
                    if is_reduce:
                        reduce(out, data)
                    else:
                        copy(out, data)
        return call

    def _plan(self, schedule: Schedule, working: torch.Tensor) -> list[_Round]:
        """This rank's requests per round, with views and scratch slices made once, here."""
        rank = self.rank
        mine = [[t for t in rnd if rank in (t.src, t.dst) and t.count > 0] for rnd in schedule.rounds]
        staged = [[_staged(t, rnd, rank) for t in rnd] for rnd in mine]
        need = max((sum(t.count for t, s in zip(rnd, flags) if s) for rnd, flags in zip(mine, staged)), default=0)
        # One receive buffer for the whole call, sliced per transfer: nothing is allocated while timed,
        # and it lives as long as the prepared call (its slices are in `rounds`).
        recv_scratch = self._empty(need, working) if need else None
        rounds = []
        for rnd, flags in zip(mine, staged):
            ops, apply, offset = [], [], 0
            for t, stage in zip(rnd, flags):  # the round's own order on both ends of every peer pair
                chunk = working.narrow(0, t.chunk[0], t.count)
                if t.src == rank:
                    ops.append((True, chunk, t.dst))
                elif stage:
                    data = recv_scratch.narrow(0, offset, t.count)
                    offset += t.count
                    ops.append((False, data, t.src))
                    apply.append((chunk, data, t.reduce))
                else:  # a plain copy nothing else reads this round: receive in place
                    ops.append((False, chunk, t.src))
            if ops:  # a rank with nothing to do in a round skips it
                rounds.append(_Round(make_poster(ops, self.library), apply))
        return rounds


def _staged(transfer: Transfer, rnd: list[Transfer], rank: int) -> bool:
    """Must `transfer` be received into scratch and applied after the round? Reductions
    always; a copy into this rank only if one of this rank's sends of the round reads
    elements it writes (a write-write overlap cannot happen: schedule.check_round)."""
    if transfer.dst != rank:
        return False
    if transfer.reduce:
        return True
    a = transfer.chunk
    return any(b.src == rank and a[0] < b.chunk[1] and b.chunk[0] < a[1] for b in rnd)
