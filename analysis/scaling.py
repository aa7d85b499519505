"""A training step predicted from the cost model: the proxy's overlap timeline
(commbench.proxies.timeline, the same code the replay executes) with each bucket's
allreduce time taken from the cost model instead of measured.

This module imports the proxies (profile, buckets, timeline) as well as the core:
the one place in analysis/ that does, because the scaling prediction *is* the proxy's
timeline with modelled communication (docs/model.md).

`allreduce_us` costs ring and hier at any world size in O(ranks per node) work: every
round of a phase of those schedules moves the same pattern of chunks, so a phase costs
one round times its step count, and a round loads every node alike, so it is costed on
two nodes (chunks rounded up to the largest part; the tests pin it to the full
schedule's cost). `nccl` (algorithms.LIBRARY) is the ring as NCCL runs it between nodes: one ring per
NIC of a node (NCCL's channels), each carrying its share of the buffer, so that a
node's NICs all carry traffic; on one node, or with one NIC, it is the ring.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from commbench import algorithms
from commbench.algorithms import LIBRARY
from commbench.analysis.costmodel import Hardware, in_cache, round_us, schedule_us, working_set_bytes
from commbench.proxies import buckets as B
from commbench.proxies.profile import Profile
from commbench.proxies.timeline import StepTimes, overlap, plan_step
from commbench.schedule import Transfer
from commbench.topology import Topology

ALGORITHMS = (LIBRARY, *algorithms.available("allreduce", gpu=True))  # what a prediction can cost


def allreduce_us(hw: Hardware, topo: Topology, nbytes: int, itemsize: int = 4, algorithm: str = "ring") -> float:
    """Predicted time of one allreduce of `nbytes` per rank."""
    count = nbytes // itemsize
    if topo.world == 1 or count == 0:
        return 0.0
    name = algorithms.choose("allreduce", topo, nbytes) if algorithm == "auto" else algorithm
    if name in ("ring", LIBRARY, "hier"):
        hw = in_cache(hw, working_set_bytes(count, itemsize, topo))
    if name in ("ring", LIBRARY):
        channels = (hw.inter.links_per_node or 1) if name == LIBRARY and topo.nodes > 1 else 1
        return hw.per_call_overhead_us + _ring_phases_us(hw, topo, count, itemsize, channels)
    if name == "hier":
        return hw.per_call_overhead_us + _hier_phases_us(hw, topo, count, itemsize)
    schedule = algorithms.build("allreduce", name, topo, count, nbytes)
    return schedule_us(schedule, topo, hw, itemsize)


def _ring_round(members: list[int], chunk: int, reduce: bool, channels: int = 1) -> tuple[Transfer, ...]:
    n, share = len(members), math.ceil(chunk / channels)
    return tuple(Transfer(members[i], members[(i + 1) % n], (0, share), reduce)
                 for _ in range(channels) for i in range(n))


def _two_nodes(topo: Topology) -> Topology:
    """Where a ring or hier round is costed: every node of a round sends and receives the same
    (one ring hop across each node boundary, or one per local rank), so two nodes load each
    link and NIC as N do, and a round costs O(ranks per node) to build whatever N is."""
    return Topology(min(topo.nodes, 2), topo.ranks_per_node)


def _ring_phases_us(hw: Hardware, topo: Topology, count: int, itemsize: int, channels: int = 1) -> float:
    p, chunk, small = topo.world, math.ceil(count / topo.world), _two_nodes(topo)
    members = list(range(small.world))
    return (p - 1) * (round_us(_ring_round(members, chunk, True, channels), small, hw, itemsize)
                      + round_us(_ring_round(members, chunk, False, channels), small, hw, itemsize))


def _hier_phases_us(hw: Hardware, topo: Topology, count: int, itemsize: int) -> float:
    per_node, nodes, small = topo.ranks_per_node, topo.nodes, _two_nodes(topo)
    part = math.ceil(count / per_node)
    total = 0.0
    if per_node > 1:
        groups = [small.node_ranks(n) for n in range(small.nodes)]
        for reduce in (True, False):  # reduce-scatter then all-gather inside every node
            rnd = tuple(t for g in groups for t in _ring_round(g, part, reduce))
            total += (per_node - 1) * round_us(rnd, small, hw, itemsize)
    if nodes > 1:
        sub = math.ceil(part / nodes)
        for reduce in (True, False):  # the ring allreduce of part i among the local-rank-i ranks
            rnd = tuple(t for local in range(per_node) for t in _ring_round(small.local_peers(local), sub, reduce))
            total += (nodes - 1) * round_us(rnd, small, hw, itemsize)
    return total


@dataclass(frozen=True)
class StepPrediction:
    times: StepTimes
    buckets: list[B.Bucket]
    bucket_comm_us: list[float]


def predict_step(profile: Profile, batch: int, topo: Topology, hw: Hardware, forward_us: float, backward_us: float,
                 optimizer_us: float = 0.0, bucket_mb: float | None = None, bucketing: str = "ddp",
                 algorithm: str = LIBRARY) -> StepPrediction:
    """One data-parallel step on `topo`: compute as given, each bucket's allreduce from the model."""
    buckets = B.assign(profile, bucket_mb, bucketing)
    plan = plan_step(profile, buckets, forward_us, backward_us, optimizer_us)
    from commbench.collectives import resolve_dtype

    comm = [allreduce_us(hw, topo, b.nbytes, resolve_dtype(b.dtype).itemsize, algorithm) for b in buckets]
    return StepPrediction(overlap(plan, comm), buckets, comm)


# ---------------------------------------------------------------- scaling curves


class ScalingError(ValueError):
    """A GPU count the node size cannot lay out, or a rate that is not positive (one line)."""


@dataclass(frozen=True)
class ScalingPoint:
    gpus: int
    nodes: int
    gpus_per_node: int
    algorithm: str
    step_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    samples_per_s: float  # all GPUs
    speedup: float  # vs the same setup's 1-GPU throughput
    linearity: float  # throughput(N) / (N x throughput(1))

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def layout(gpus: int, gpus_per_node: int) -> Topology:
    """N GPUs as nodes x GPUs per node: one partly used node below a node's size, whole nodes above."""
    if gpus < 1 or gpus_per_node < 1:
        raise ScalingError(f"GPU counts and --gpus-per-node must be at least 1 (got {gpus}, {gpus_per_node})")
    if gpus <= gpus_per_node:
        return Topology(1, gpus)
    if gpus % gpus_per_node:
        raise ScalingError(f"{gpus} GPUs do not fill whole nodes of {gpus_per_node}; use a multiple of "
                           f"{gpus_per_node} (or --gpus-per-node that divides it)")
    return Topology(gpus // gpus_per_node, gpus_per_node)


def predict_scaling(profile: Profile, hw: Hardware, gpu_counts: list[int], gpus_per_node: int, batch: int,
                    forward_us: float, backward_us: float, optimizer_us: float = 0.0, bucket_mb: float | None = None,
                    bucketing: str = "ddp", algorithm: str = LIBRARY) -> list[ScalingPoint]:
    """Step time, throughput, speedup and linearity per GPU count (weak scaling: `batch` per GPU)."""
    from dataclasses import replace

    points, base = [], None
    for gpus in [1, *gpu_counts]:
        topo = layout(gpus, gpus_per_node)
        pred = predict_step(profile, batch, topo, replace(hw, ranks_per_node=topo.ranks_per_node), forward_us,
                            backward_us, optimizer_us, bucket_mb, bucketing, algorithm)
        t = pred.times
        rate = batch * gpus / (t.step_us * 1e-6)
        base = base or rate
        points.append(ScalingPoint(gpus, topo.nodes, topo.ranks_per_node, algorithm, t.step_us, t.compute_us,
                                   t.comm_us, t.exposed_comm_us, rate, rate / base, rate / (gpus * base)))
    return points[1:]
