"""One point of a sweep, on one rank: the buffers of a collective, size and placement, filled with verifiable
data, warmed up, timed back to back (commbench/point_timing.py), checked on a fresh run (the wrong elements
counted), and collected on rank 0 into the statistics a Result holds. commbench/bench.py's Sweep runs the
points; docs/metrics.md describes the method.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from commbench import collectives as C
from commbench import point_timing as timing
from commbench.backends import Backend, OutOfMemory
from commbench.errors import JobFault
from commbench.results import percentiles_us, statistic_us
from commbench.sizes import format_size
from commbench.sweep_config import SweepConfig

CHECK_CHUNK = 1 << 22  # elements compared per step: bounds the checker's extra memory
RANK_AGG_TEXT = {"max": "slowest rank's", "avg": "ranks' average", "min": "fastest rank's"}  # one sample per iteration


@dataclass
class PointOutcome:
    times_us: np.ndarray  # this rank's per-iteration times
    warmup: int
    wrong: int  # this rank's wrong elements (-1 when not checked)
    telemetry: dict[str, float] | None = None  # --monitor, on rank 0: averages over the timed calls
    timed_start: float | None = None  # when the timed calls began (epoch seconds, UTC)


# ---------------------------------------------------------------- one point


def _buffers(backend: Backend, plan: C.Plan, dtype: C.DType, placement: str, shift: int = 0) -> tuple[Any, Any, Any]:
    """(send, recv, owners) for a placement; in-place views share one buffer as nccl-tests lays it out.
    `shift`: elements every buffer starts past its allocation (sweep --misalign)."""
    if placement == "out-of-place":
        (send_owner, send), (recv_owner, recv) = (timing.misaligned(backend, count, dtype, shift)
                                                  for count in (plan.send_count, plan.recv_count))
        return send, recv, (send_owner, recv_owner)
    whole = backend.alloc(max(plan.send_count, plan.recv_count) + shift, dtype)
    coll = C.COLLECTIVES[plan.collective]  # the chunk of a rank sits at its place in the n-chunk buffer
    send_at = (lambda r: shift + r * plan.send_count) if coll.recv_all and not coll.send_all else (lambda r: shift)
    recv_at = (lambda r: shift + r * plan.recv_count) if coll.send_all and not coll.recv_all else (lambda r: shift)
    return backend.rank_view(whole, send_at, plan.send_count), backend.rank_view(whole, recv_at, plan.recv_count), \
        (whole,)


def _fill(backend: Backend, send: Any, owners: tuple, pattern: C.Pattern, plan: C.Plan) -> None:
    """Sentinel everywhere, then this rank's verifiable input, generated a slice at a time
    (a host copy of a 1 GiB input per rank would cost as much memory as the buffers)."""
    for buffer in owners:
        backend.fill(buffer, C.sentinel(pattern.dtype))
    for rank in backend.local_ranks:
        for pos in range(0, plan.send_count, CHECK_CHUNK):
            n = min(CHECK_CHUNK, plan.send_count - pos)
            backend.upload(backend.view(send, pos, n), C.input_values(pattern, rank, pos, n), rank)
    backend.synchronize()


def _count_wrong(backend: Backend, recv: Any, pattern: C.Pattern, plan: C.Plan) -> int:
    wrong, tol = 0, C.tolerance(pattern)
    for rank in backend.local_ranks:
        for seg in C.expected_segments(pattern, plan, rank):
            for pos in range(0, seg.count, CHECK_CHUNK):
                n = min(CHECK_CHUNK, seg.count - pos)
                actual = backend.download(recv, seg.start + pos, n, rank)
                expected = C.periodic(seg.source, seg.offset + pos, n)
                wrong += C.count_wrong(actual, expected, tol)
    return wrong


def _agree(backend: Backend, failed: str | None) -> None:
    """Every rank learns whether any rank failed to prepare this point (e.g. out of memory)."""
    if backend.agree_max(np.array([1.0 if failed else 0.0]))[0] > 0:
        messages = backend.gather_objects(failed)
        first = next((m for m in messages if m), None) if messages else None
        raise JobFault(first or "a rank failed to prepare its buffers", agreed=True)


def measure_point(backend: Backend, cfg: SweepConfig, plan: C.Plan, placement: str, pattern: C.Pattern,
                  monitor: Any = None) -> PointOutcome:
    dtype, rank = pattern.dtype, backend.rank
    failed = None
    try:
        send, recv, owners = _buffers(backend, plan, dtype, placement, cfg.misalign_nbytes // dtype.itemsize)
        _fill(backend, send, owners, pattern, plan)
    except (OutOfMemory, MemoryError) as exc:
        failed = f"out of memory at {format_size(plan.nbytes)} ({plan.collective}, {placement}) on rank {rank}: {exc}"
        send = recv = owners = None
        gc.collect()
    _agree(backend, failed)
    call = backend.prepare(plan.collective, send, recv, pattern.op, plan.root, placement == "in-place",
                           **({"splits": plan.splits} if plan.splits else {}))
    if backend.timed:
        warmup, iters = timing.iteration_counts(backend, cfg, call)
        if monitor is not None:  # before the barrier: nothing on rank 0 between it and the timed calls
            monitor.mark(f"{plan.collective} {plan.nbytes} {placement}")
        backend.barrier()
        timed_start = time.time()
        times_us = timing.time_calls(backend, call, iters + cfg.skip_iters, cfg.blocking)  # -K: leading ones, left out
        telemetry = monitor.window() if monitor is not None else None
    else:  # nothing to time with (sim without a cost model): run once, for the check only
        warmup, times_us, telemetry, timed_start = 0, np.empty(0), None, None
    wrong = -1
    if cfg.check:
        _fill(backend, send, owners, pattern, plan)  # timing may have changed the data (in-place)
        backend.barrier()
        call()
        backend.synchronize()
        wrong = _count_wrong(backend, recv, pattern, plan)
    return PointOutcome(times_us, warmup, wrong, telemetry, timed_start)


def summarize(all_times_us: np.ndarray, rank_agg: str, stat: str = "mean", skip: int = 0) -> dict[str, Any]:
    """Aggregate a (ranks x iterations) time matrix. One sample per iteration: the ranks' times of
    that iteration combined with `rank_agg` (max: the slowest rank's). Every figure is a statistic of
    those samples: time_us is `stat`'s, the percentiles and mean_us the others (docs/metrics.md).
    The first `skip` iterations (-K) are left out of every figure; their samples are kept apart."""
    if all_times_us.shape[1] == 0:  # not timed (sim without a cost model): no figure at all
        return {"time_us": None, **percentiles_us(np.empty(0)), "per_iteration_us": None}
    reduce = {"max": np.max, "avg": np.mean, "min": np.min}[rank_agg]
    per_iteration = reduce(all_times_us, axis=0)
    counted = per_iteration[skip:]
    return {"time_us": statistic_us(counted, stat), **percentiles_us(counted), "per_iteration_us": counted,
            "skipped_us": per_iteration[:skip], "rank_times_us": all_times_us[:, skip:]}


def collect(backend: Backend, outcome: PointOutcome, rank_agg: str, stat: str = "mean",
            skip: int = 0) -> dict[str, Any] | None:
    """Gather every rank's times and error count; on rank 0, the reported numbers
    (time_us, percentiles, and `wrong` summed over ranks, -1 when not checked)."""
    gathered = backend.gather(np.concatenate([[outcome.wrong], outcome.times_us]))
    if gathered is None:
        return None
    wrong = gathered[:, 0]
    return {**summarize(gathered[:, 1:], rank_agg, stat, skip), "wrong": -1 if (wrong < 0).any() else int(wrong.sum())}
