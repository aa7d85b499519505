"""hybrid: schedules with shared memory inside a node and torch send/recv between nodes.

What `hier` is for: the ranks of a node exchange through their registered
shared-memory buffers (the shm backend's pulls and polling barriers, among the
node's ranks only), and only the transfers that cross nodes go over
torch.distributed (gloo). The node layout is `--topology` or the launcher's
(ranks of a node must share a host; that is checked).

One round, on one rank:
1. post this rank's cross-node sends (straight from its shared buffer) and
   receives (into scratch), in the round's transfer order, and wait for them;
2. pull this round's node-local chunks from node peers (staged when the round
   has a hazard, as shm does);
3. node barrier: every node peer has finished reading this round;
4. write back staged results and apply the cross-node receives;
5. node barrier: the writes are in place before the next round reads them.
A node none of whose ranks takes part in a round skips both barriers.
"""
from __future__ import annotations

import socket
from typing import Callable

import numpy as np

from commbench.backends.base import BackendError
from commbench.backends.p2p import make_poster
from commbench.backends.schedule_base import job_topology
from commbench.backends.shm.backend import ShmBackend
from commbench.backends.shm.executor import pull, reducer
from commbench.backends.shm.segments import ShmBuffer
from commbench.backends.shm.waits import require_x86
from commbench.backends.torch_lazy import LazyModule
from commbench.launchers import LaunchInfo
from commbench.schedule import Schedule, Transfer
from commbench.topology import Topology

# torch on first use, as torch_dist does: the parent settles options before any rank imports torch
torch = LazyModule("torch", globals(), "torch")


class HybridBackend(ShmBackend):
    name = "hybrid"
    one_host = False  # shared memory inside a node only
    native_executor = False  # its rounds interleave gloo requests: the Python executor runs them
    pushes = False  # its rounds run through the executor's round_plan, pulls only
    reads_inputs = False  # out of place: the input is copied into the working buffer first

    def _check_layout(self, launch: LaunchInfo, topology: Topology) -> None:
        require_x86(self.name)
        if topology.world != launch.world_size:
            raise BackendError(f"topology {topology} has {topology.world} ranks but the job has {launch.world_size}")

    def _members(self, topology: Topology) -> list[int]:
        members = topology.node_ranks(topology.node_of(self.rank))
        # every rank's host, everywhere
        hosts = self.control.broadcast_object(self.gather_objects(socket.gethostname()))
        self._host_ranks = hosts.count(hosts[self.rank])  # every rank of the job on this host shares its cores
        apart = [r for r in members if hosts[r] != hosts[self.rank]]
        if apart:
            raise BackendError(f"--topology {topology} puts rank {self.rank} and rank {apart[0]} on one node, but "
                               f"they run on {hosts[self.rank]} and {hosts[apart[0]]}")
        return members

    def _ranks_on_host(self, launch: LaunchInfo) -> int:
        return self._host_ranks

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> HybridBackend:
        return cls(launch, job_topology(cfg.topology, launch), cfg.algorithm, cfg.timeout_s)

    def barrier(self) -> None:
        self.group.barrier()  # the harness's barrier spans nodes: the gloo group's, not the node's shared memory

    def executor(self, schedule: Schedule, working: ShmBuffer, op: str) -> Callable[[], None]:
        rounds = [self._hybrid_round(rnd, working, op) for rnd in schedule.rounds]
        arrive = self.waits.arrive_and_wait

        def call() -> None:
            arrive()  # node peers' inputs are in place, and nobody still reads the previous call
            for post, local, apply, sync in rounds:
                if post is not None:
                    for request in post():
                        request.wait()
                for step in local:
                    step()
                if sync:
                    arrive()
                for step in apply:
                    step()
                if sync:
                    arrive()
        return call

    def _hybrid_round(self, rnd: tuple[Transfer, ...], working: ShmBuffer, op: str):
        """(post cross-node requests, node-local steps, steps after the read barrier, node takes part)."""
        rank, members = self.rank, set(self.members)
        mine = working.array
        local_round = tuple(t for t in rnd if t.src in members and t.dst in members)
        local, staged = self.runner.round_plan(local_round, working, op) if any(t.dst == rank for t in local_round) \
            else ([], [])
        reduce = reducer(op, mine.dtype)
        ops, apply = [], list(staged)
        for t in rnd:
            if rank not in (t.src, t.dst) or (t.src in members and t.dst in members) or t.count == 0:
                continue
            chunk = mine[t.chunk[0]:t.chunk[1]]
            if t.src == rank:
                ops.append((True, _tensor(chunk), t.dst))
            else:
                data = np.empty(t.count, dtype=mine.dtype)  # allocated once, here, not while timed
                ops.append((False, _tensor(data), t.src))
                apply.append(pull(reduce, chunk, data, t.reduce))
        post = make_poster(ops, "gloo") if ops else None
        sync = any(t.src in members or t.dst in members for t in rnd)
        return post, local, apply, sync


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A torch view of a NumPy array for gloo (bfloat16 bits travel as int16: the bytes are what matter)."""
    return torch.from_numpy(array.view(np.int16) if array.dtype == np.uint16 else array)
