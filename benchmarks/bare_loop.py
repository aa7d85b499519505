"""The bare torch.distributed allreduce loop the benchmarks hold commbench's harness against.

The loop a user would write (barrier, N back-to-back dist.all_reduce calls, each timed with
time.perf_counter), with its warm-up and N chosen by commbench's adaptive rule (method.py) and its
per-call times reduced by commbench's own bench_point.summarize, so its time_us and p50_us mean what
commbench's do. harness_overhead.py times it beside the harness in the same ranks; sweep_repeat.py
runs it in fresh ranks (bare_run_rank) beside each `commbench sweep`.
"""
from __future__ import annotations

import time

import method
import numpy as np
import torch
import torch.distributed as dist

from commbench import bench_point


def bare_allreduce_times_us(tensor: torch.Tensor, iters: int, warmup: int) -> np.ndarray:
    """The loop a user would write: warm up, barrier, `iters` timed all_reduce calls.
    Returns this rank's per-call times in microseconds."""
    for _ in range(warmup):
        dist.all_reduce(tensor)
    dist.barrier()
    times_s = [0.0] * iters
    for i in range(iters):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times_s[i] = time.perf_counter() - start
    return np.array(times_s) * 1e6


def bare_allreduce_stats(tensor: torch.Tensor, iters: int, warmup: int) -> dict[str, float]:
    """The bare loop, reduced as commbench reduces its own times (bench_point.summarize): one sample per call,
    the slowest rank's; time_us their mean, p50_us their median, and the other percentiles. Every rank
    gets them."""
    return bench_point.summarize(gather_over_ranks(bare_allreduce_times_us(tensor, iters, warmup)), "max")


def bare_allreduce_us(tensor: torch.Tensor, iters: int, warmup: int) -> float:
    """The bare loop's time_us: the mean over calls of each call's slowest rank (every rank gets it)."""
    return bare_allreduce_stats(tensor, iters, warmup)["time_us"]


def gather_over_ranks(values: np.ndarray) -> np.ndarray:
    """Every rank's `values` (the same length on every rank) as a ranks x len matrix, on every rank."""
    local = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
    out = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(out, local)
    return torch.stack(out).numpy()


def calibrate(tensor: torch.Tensor, min_time_s: float, warmup: int | None = None,
              iters: int | None = None) -> tuple[int, int]:
    """(warmup, iters) for this size as commbench's harness picks them (bench._iteration_counts, by the
    rule in method.py), agreed across ranks; a fixed `warmup` or `iters` is kept, as commbench --warmup
    and --iters. The calls made here are the warm-up: a caller may time `iters` calls right after a barrier."""
    if warmup is None:
        first_us = _max_over_ranks(_time_calls_us(tensor, 1)[0])  # includes one-time setup: not an estimate
        extra = method.warmup_count(first_us, min_time_s)
        probe_us, warmup = _time_calls_us(tensor, extra), 1 + extra
    else:
        probe_us = _time_calls_us(tensor, warmup)
    if iters is not None:
        return warmup, iters
    if not probe_us:  # a fixed warm-up of 0 with adaptive iterations: one probe, counted as warm-up
        probe_us, warmup = _time_calls_us(tensor, 1), warmup + 1
    estimate_us = _max_over_ranks(float(np.median(probe_us)))
    return warmup, method.iteration_count(estimate_us, min_time_s)


def _time_calls_us(tensor: torch.Tensor, calls: int) -> list[float]:
    times_us = []
    for _ in range(calls):
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times_us.append((time.perf_counter() - start) * 1e6)
    return times_us


def _max_over_ranks(value: float) -> float:
    agreed = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return float(agreed[0])


def bare_run_rank(rank: int, world: int, port: int, outbox, sizes: list[int], min_time_s: float,
                  fixed_warmup: int | None = None, fixed_iters: int | None = None) -> None:
    """One rank of a bare run (a run_local_ranks target): its own gloo process group, then per size
    the warm-up and iteration counts chosen as commbench chooses them, and one timed bare loop.
    Rank 0 puts one dict per size: nbytes, time_us, p50_us, iters, warmup."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for nbytes in sizes:
            tensor = torch.ones(nbytes // 4, dtype=torch.float32)
            warmup, iters = calibrate(tensor, min_time_s, fixed_warmup, fixed_iters)  # these calls are the warm-up
            stats = bare_allreduce_stats(tensor, iters, warmup=0)
            if rank == 0:
                outbox.put({"nbytes": nbytes, "time_us": stats["time_us"], "p50_us": stats["p50_us"],
                            "iters": iters, "warmup": warmup})
            del tensor
    finally:
        dist.destroy_process_group()
    if rank == 0:
        outbox.put(None)

