"""Predict collective times from a hardware description: the same Schedule the backends run,
costed round by round (costmodel.schedule_us), written as Result records of kind `predicted`, each with
its 80% interval and where it comes from (`interval_source`): a fitted file's resamples (jackknife+,
analysis/intervals.py), else the published collectives corpus's calibration (analysis/corpus/collectives.py), which
also centres the time shown (`estimate: calibrated`; the cost model's own figure is `raw_time_us`)."""
from __future__ import annotations

import math
from dataclasses import replace

from commbench import algorithms
from commbench import collectives as C
from commbench.analysis.corpus import collectives as collective_corpus
from commbench.analysis.intervals import schedule_interval_us
from commbench.backends.registry import MODEL, PREDICTED
from commbench.costmodel import Hardware, schedule_us
from commbench.results import CALIBRATED_ESTIMATE, CORPUS_PROVENANCE, FIT_PROVENANCE, RAW_ESTIMATE, Result, point_result
from commbench.topology import Topology
from commbench.tuning import TuningTable

# A prediction builds every rank's schedule: ring's 2(n-1) rounds of n transfers took 3 min for
# 4,096 ranks on the 2-core CI machine (2026-11-23), 1,024 ranks a few seconds.
MAX_RANKS = 1024


def predict_point(hw: Hardware, collective: str, nbytes: int, dtype: C.DType, topo: Topology, algorithm: str, *,
                  root: int = 0, tuning: TuningTable | None = None) -> Result | None:
    """One predicted point (None when the size rounds to zero elements); `auto` follows `tuning`'s
    table where it has a row (as a backend's `auto` does), else the built-in rule."""
    if topo.world > MAX_RANKS:
        raise ValueError(f"{topo.world:,d} ranks: predict builds every rank's schedule, at most {MAX_RANKS:,d} ranks "
                         f"(predict-scaling costs larger clusters from closed forms)")
    plan = C.plan(collective, nbytes, dtype, topo.world, root)
    if plan.count == 0:
        return None
    chooser = None
    if algorithm == "auto" and collective in algorithms.ALGORITHMS:
        algorithm, chooser = algorithms.chosen_by(collective, topo, plan.nbytes, tuning=tuning)
    schedule = algorithms.build(collective, algorithm, topo, plan.count, plan.nbytes, root)
    raw_us = schedule_us(schedule, topo, hw, dtype.itemsize)
    interval, source = schedule_interval_us(hw, schedule, topo, dtype.itemsize, raw_us), FIT_PROVENANCE
    time_us, estimate = raw_us, RAW_ESTIMATE
    if interval is None:  # no fit resamples (a preset, a hand-written file) or a level the fit did not measure
        interval = collective_corpus.time_interval_us(raw_us, collective_corpus.shipped_bounds(row_us))
        source = CORPUS_PROVENANCE
        time_us, estimate = raw_us * math.exp(collective_corpus.shipped_centre(row_us)), CALIBRATED_ESTIMATE
    else:  # a fit's interval holds its own prediction, stretched where every refit moved one way
        interval = (min(interval[0], raw_us), max(interval[1], raw_us))
    result = point_result(plan, dtype=dtype.name, op="sum" if C.COLLECTIVES[collective].reduces else None,
                          placement="in-place", nnodes=topo.nodes, backend=MODEL, library=hw.name, device="-",
                          time_us=time_us, algorithm=schedule.name, steps=schedule.steps, kind="predicted",
                          tuning=chooser, **PREDICTED.fields())
    return replace(result, interval_us=list(interval), interval_source=source, estimate=estimate, raw_time_us=raw_us)


def row_us(hw: Hardware, row: collective_corpus.Row) -> float:
    """The time `commbench predict` gives a published row (float32, the corpus's algorithm): its residual's
    denominator, costed as predict_point costs."""
    topo = Topology(row.nodes, row.gpus_per_node)
    plan = C.plan(row.collective, row.nbytes, C.resolve_dtype("float32"), topo.world)
    schedule = algorithms.build(row.collective, collective_corpus.ALGORITHM, topo, plan.count, plan.nbytes, 0)
    return schedule_us(schedule, topo, hw, 4)


def predict(hw: Hardware, collectives: list[str], sizes: list[int], dtype: C.DType, topo: Topology,
            algorithm: str = "auto", *, root: int = 0, tuning: TuningTable | None = None) -> list[Result]:
    out = []
    for collective in collectives:
        for nbytes in sizes:
            point = predict_point(hw, collective, nbytes, dtype, topo, algorithm, root=root, tuning=tuning)
            if point is not None and all(p.nbytes != point.nbytes or p.collective != collective for p in out):
                out.append(point)
    return out
