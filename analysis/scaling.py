"""A training step predicted from the cost model: the proxy's overlap timeline
(commbench.proxies.timeline, the same code the replay executes) with each bucket's
allreduce time taken from the cost model instead of measured.

This module imports the proxies (profile, buckets, timeline) as well as the core:
the one place in analysis/ that does, because the scaling prediction *is* the proxy's
timeline with modelled communication (docs/model.md).

`allreduce_us` costs ring and hier at any world size in O(world) work: every round of
a phase of those schedules moves the same pattern of chunks, so a phase costs one round
times its step count (chunks rounded up to the largest part; the tests pin it to the
full schedule's cost).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from commbench import algorithms
from commbench.analysis.costmodel import Hardware, round_us, schedule_us
from commbench.proxies import buckets as B
from commbench.proxies.profile import Profile
from commbench.proxies.timeline import StepTimes, overlap, plan_step
from commbench.schedule import Transfer
from commbench.topology import Topology

FAST_ALGORITHMS = ("ring", "hier")


def allreduce_us(hw: Hardware, topo: Topology, nbytes: int, itemsize: int = 4, algorithm: str = "ring") -> float:
    """Predicted time of one allreduce of `nbytes` per rank."""
    count = nbytes // itemsize
    if topo.world == 1 or count == 0:
        return 0.0
    name = algorithms.choose("allreduce", topo, nbytes) if algorithm == "auto" else algorithm
    if name == "ring":
        return hw.per_call_overhead_us + _ring_phases_us(hw, topo, count, itemsize)
    if name == "hier":
        return hw.per_call_overhead_us + _hier_phases_us(hw, topo, count, itemsize)
    schedule = algorithms.build("allreduce", name, topo, count, nbytes)
    return schedule_us(schedule, topo, hw, itemsize)


def _ring_round(members: list[int], chunk: int, reduce: bool) -> tuple[Transfer, ...]:
    n = len(members)
    return tuple(Transfer(members[i], members[(i + 1) % n], (0, chunk), reduce) for i in range(n))


def _ring_phases_us(hw: Hardware, topo: Topology, count: int, itemsize: int) -> float:
    p, chunk = topo.world, math.ceil(count / topo.world)
    members = list(range(p))
    return (p - 1) * (round_us(_ring_round(members, chunk, True), topo, hw, itemsize)
                      + round_us(_ring_round(members, chunk, False), topo, hw, itemsize))


def _hier_phases_us(hw: Hardware, topo: Topology, count: int, itemsize: int) -> float:
    per_node, nodes = topo.ranks_per_node, topo.nodes
    part = math.ceil(count / per_node)
    total = 0.0
    if per_node > 1:
        groups = [topo.node_ranks(n) for n in range(nodes)]
        for reduce in (True, False):  # reduce-scatter then all-gather inside every node
            rnd = tuple(t for g in groups for t in _ring_round(g, part, reduce))
            total += (per_node - 1) * round_us(rnd, topo, hw, itemsize)
    if nodes > 1:
        sub = math.ceil(part / nodes)
        for reduce in (True, False):  # the ring allreduce of part i among the local-rank-i ranks
            rnd = tuple(t for local in range(per_node) for t in _ring_round(topo.local_peers(local), sub, reduce))
            total += (nodes - 1) * round_us(rnd, topo, hw, itemsize)
    return total


@dataclass(frozen=True)
class StepPrediction:
    times: StepTimes
    buckets: list[B.Bucket]
    bucket_comm_us: list[float]


def predict_step(profile: Profile, batch: int, topo: Topology, hw: Hardware, forward_us: float, backward_us: float,
                 optimizer_us: float = 0.0, bucket_mb: float | None = None, bucketing: str = "ddp",
                 algorithm: str = "ring") -> StepPrediction:
    """One data-parallel step on `topo`: compute as given, each bucket's allreduce from the model."""
    buckets = B.assign(profile, bucket_mb, bucketing)
    plan = plan_step(profile, buckets, batch, forward_us, backward_us, optimizer_us)
    from commbench.collectives import resolve_dtype

    comm = [allreduce_us(hw, topo, b.nbytes, resolve_dtype(b.dtype).itemsize, algorithm) for b in buckets]
    return StepPrediction(overlap(plan, comm), buckets, comm)
