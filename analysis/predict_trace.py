"""Predict a traced job's steps on other hardware: each call of the trace costed by the cost model
(analysis/predict.predict_point: the call's collective and size on its group's ranks, laid out on the
--topology's nodes), and each traced step's timeline (comm_plan.simulate: the traced compute between
calls, the calls one at a time in issue order, the compute waiting where the trace waited).

A group's layout: its ranks placed on nodes as the job's are (rank // ranks per node), so a group of
one rank per node crosses every node and a node's ranks stay inside it; the group's topology is its
node count x its ranks per node (a group spread unevenly is costed as the even one with its most ranks
on a node). The compute is the traced one, as traced: a prediction for other GPUs keeps it unless
`compute_scale` (the other device's speed-up) says otherwise.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass

from commbench import collectives as C
from commbench.costmodel import Hardware
from commbench.proxies.comm_plan import simulate
from commbench.proxies.traces.calls import JobTrace, TraceStep, step_plan
from commbench.topology import Topology


@dataclass(frozen=True)
class TracePrediction:
    hw: str
    topology: Topology
    call_us: dict[tuple[str, int, str, tuple[int, ...]], float]  # (collective, nbytes, dtype, group) -> us
    steps_us: list[float]  # per traced step, the slowest rank's predicted step
    comm_us: list[float]
    exposed_us: list[float]
    compute_us: list[float]

    def median(self, values: list[float]) -> float:
        return statistics.median(values) if values else 0.0


def group_topology(group: tuple[int, ...], per_node: int) -> Topology:
    nodes = Counter(rank // per_node for rank in group)
    return Topology(len(nodes), max(nodes.values()))


def call_us(hw: Hardware, collective: str, nbytes: int, dtype: str, group: tuple[int, ...], per_node: int, *,
            algorithm: str = "auto") -> float:
    from commbench.analysis.predict import predict_point

    topo = group_topology(group, per_node)
    if topo.world == 1:
        return 0.0
    result = predict_point(hw, collective, nbytes, C.resolve_dtype(dtype), topo, algorithm)
    if result is None:
        return 0.0
    # the cost model's own time: a trace's calls are costed raw (predict centres a shown point by the corpus)
    return float(result.raw_time_us if result.raw_time_us is not None else result.time_us)


def predict_trace(job: JobTrace, hw: Hardware, topology: Topology, compute_scale: float = 1.0,
                  algorithm: str = "auto") -> TracePrediction:
    if topology.world != job.world:
        raise ValueError(f"--topology {topology.nodes}x{topology.ranks_per_node} has {topology.world} ranks; the "
                         f"trace has {job.world}")
    costs: dict[tuple, float] = {}
    for rank in job.ranks:
        for step in rank.steps:
            for c in step.calls:
                key = (c.collective, c.nbytes, c.dtype, c.group)
                if key not in costs:
                    costs[key] = call_us(hw, *key, topology.ranks_per_node, algorithm=algorithm)
    per_step = [[_step(step, costs, compute_scale) for step in rank.steps] for rank in job.ranks]
    slowest = [max(range(len(per_step)), key=lambda r: per_step[r][k].step_us) for k in range(len(per_step[0]))]
    chosen = [per_step[r][k] for k, r in enumerate(slowest)]
    return TracePrediction(hw.name, topology, costs, [t.step_us for t in chosen], [t.comm_us for t in chosen],
                           [t.exposed_comm_us for t in chosen], [t.compute_us for t in chosen])


def _step(step: TraceStep, costs: dict, compute_scale: float):
    plan = step_plan(_scaled(step, compute_scale))
    return simulate(plan, [costs[(c.collective, c.nbytes, c.dtype, c.group)] for c in step.calls])


def _scaled(step: TraceStep, factor: float) -> TraceStep:
    from dataclasses import replace

    if factor == 1.0:
        return step
    calls = tuple(replace(c, progress_us=c.progress_us / factor, needed_us=c.needed_us / factor) for c in step.calls)
    return replace(step, compute_us=step.compute_us / factor, calls=calls)
