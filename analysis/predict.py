"""Predict collective times from a hardware description: the same Schedule the backends run,
costed round by round (costmodel.schedule_us), written as Result records of kind `predicted`."""
from __future__ import annotations

from commbench import algorithms
from commbench import collectives as C
from commbench.analysis.costmodel import Hardware, schedule_us
from commbench.results import Result
from commbench.topology import Topology


def predict_point(hw: Hardware, collective: str, nbytes: int, dtype: C.DType, topo: Topology, algorithm: str,
                  root: int = 0) -> Result | None:
    """One predicted point (None when the size rounds to zero elements)."""
    plan = C.plan(collective, nbytes, dtype, topo.world, root)
    if plan.count == 0:
        return None
    schedule = algorithms.build(collective, algorithm, topo, plan.count, plan.nbytes, root)
    time_us = schedule_us(schedule, topo, hw, dtype.itemsize)
    algbw, busbw = C.bandwidths_gbps(collective, plan.nbytes, topo.world, time_us)
    coll = C.COLLECTIVES[collective]
    return Result(collective=collective, backend="model", library=hw.name, device="-", dtype=dtype.name,
                  op="sum" if coll.reduces else None, root=root if coll.rooted else None, placement="in-place",
                  world_size=topo.world, nnodes=topo.nodes, requested_nbytes=nbytes, nbytes=plan.nbytes,
                  count=plan.count, warmup=0, iters=0, time_us=time_us, algbw_gbps=algbw, busbw_gbps=busbw,
                  p50_us=None, p90_us=None, p99_us=None, min_us=None, max_us=None, rank_agg="-", wrong=None,
                  algorithm=schedule.name, steps=schedule.steps, kind="predicted")


def predict(hw: Hardware, collectives: list[str], sizes: list[int], dtype: C.DType, topo: Topology,
            algorithm: str = "auto", root: int = 0) -> list[Result]:
    out = []
    for collective in collectives:
        for nbytes in sizes:
            point = predict_point(hw, collective, nbytes, dtype, topo, algorithm, root)
            if point is not None and all(p.nbytes != point.nbytes or p.collective != collective for p in out):
                out.append(point)
    return out
