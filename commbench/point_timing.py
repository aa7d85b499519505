"""How many calls a point times (adaptive warm-up and iterations), how they run beyond back to back,
and what a rank reports of its memory:
nccl-tests' blocking modes (-z; sweep --blocking), buffers offset from their alignment (-u;
sweep --misalign), and the memory report (-M; sweep --memory-report).

Leading iterations left out of the statistics (-K; sweep --skip-iters) are bench.summarize's.
"""
from __future__ import annotations

import math
import resource
import socket
import sys
from typing import Any, Callable

import numpy as np

from commbench.results import pack_times


def warmup_calls(first_us: float, min_time_s: float) -> int:
    """Adaptive warm-up after the first call: enough calls to fill a tenth of the time budget (1..100)."""
    return int(min(100, max(1, math.ceil(0.1 * min_time_s * 1e6 / max(first_us, 1.0)))))


def timed_calls(estimate_us: float, min_time_s: float, min_iters: int = 5, max_iters: int = 1000) -> int:
    """Adaptive timed iterations: fill `min_time_s` at `estimate_us` per call, within [min_iters, max_iters]."""
    return int(min(max_iters, max(min_iters, math.ceil(min_time_s * 1e6 / max(estimate_us, 0.01)))))


def iteration_counts(backend: Any, cfg: Any, call: Callable[[], None]) -> tuple[int, int]:
    """(warmup, iters): fixed if given, else sized from timed warm-up runs, agreed across ranks.
    Warm-up runs eagerly where a backend says how (time_warmup: --graph captures only the timed calls)."""
    warm = getattr(backend, "time_warmup", backend.time_iterations)
    if cfg.warmup is None:
        first = warm(call, 1)  # includes one-time setup: never used as the estimate
        extra = warmup_calls(float(backend.agree_max(first)[0]), cfg.min_time_s)
        warm_times, warmup = warm(call, extra), 1 + extra
    else:
        warm_times, warmup = warm(call, cfg.warmup), cfg.warmup
    if cfg.iters is not None:
        return warmup, cfg.iters
    if warm_times.size == 0:  # --warmup 0 with adaptive iterations: one probe, counted as warm-up
        warm_times, warmup = warm(call, 1), warmup + 1
    estimate_us = float(backend.agree_max(np.array([np.median(warm_times)]))[0])
    return warmup, timed_calls(estimate_us, cfg.min_time_s, cfg.min_iters, cfg.max_iters)


def planned_calls(cfg: Any, call_us: float) -> int:
    """The calls a point makes when one call takes `call_us`: warm-up and timed calls as iteration_counts
    sizes them, the -K calls left out, and the check's one (the progress line's ETA counts them)."""
    warmup = cfg.warmup if cfg.warmup is not None else 1 + warmup_calls(call_us, cfg.min_time_s)
    iters = cfg.iters if cfg.iters is not None else timed_calls(call_us, cfg.min_time_s, cfg.min_iters,
                                                                 cfg.max_iters)
    return warmup + iters + cfg.skip_iters + (1 if cfg.check else 0)


# What each blocking mode puts inside the timed region, as the table's header says it.
# 0 and 1 are nccl-tests' src/common.cu (startColl: with blocking_coll, a stream synchronize and a
# barrier after each call, inside the timed loop); 3 leaves the barrier out of the timing, as
# nccl-tests 2.19's -z 3 does by its issue (39); 2 is refused (its definition was not available here).
BLOCKING = {
    0: "the calls back to back (nothing waits between them)",
    1: "each call, a wait for it to finish and a barrier",
    3: "each call and a wait for it to finish (a barrier after each, outside the timed region)",
}


def time_calls(backend: Any, call: Callable[[], None], iters: int, blocking: int = 0) -> np.ndarray:
    """`iters` timed calls (us each) in blocking mode `blocking` (BLOCKING)."""
    if blocking == 0:
        return backend.time_iterations(call, iters)

    def finished() -> None:
        call()
        backend.synchronize()
        if blocking == 1:
            backend.barrier()

    if blocking == 1:
        return backend.time_iterations(finished, iters)
    times = []
    for _ in range(iters):  # mode 3: each call timed on its own, the barrier between them untimed
        times.append(backend.time_iterations(finished, 1))
        backend.barrier()
    return np.concatenate(times) if times else np.empty(0)


def misaligned(backend: Any, count: int, dtype: Any, shift_elements: int) -> tuple[Any, Any]:
    """(owner, view): a buffer `shift_elements` longer, and its `count` elements after the shift."""
    owner = backend.alloc(count + shift_elements, dtype)
    return owner, backend.view(owner, shift_elements, count) if shift_elements else owner


def memory_report(backend: Any) -> dict[str, Any]:
    """This rank's memory: the host process's peak resident set (getrusage; kilobytes on Linux, bytes on
    macOS), and what the backend's device allocator and NVML say where they exist."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    report = {"rank": backend.rank, "host": socket.gethostname(), "host_peak_rss_bytes": int(peak)}
    report.update(backend.device_memory())
    return report


def memory_lines(reports: list[dict[str, Any]]) -> list[str]:
    """One line per rank for the table's end (nccl-tests -M prints one per GPU)."""
    lines = []
    for report in reports:
        figures = ", ".join(f"{key.removesuffix('_bytes').replace('_', ' ').replace('rss', 'RSS')} "
                            f"{value / (1 << 20):.1f} MiB"
                            for key, value in report.items() if key.endswith("_bytes"))
        lines.append(f"memory: rank {report['rank']} on {report['host']}: {figures}")
    return lines


def nvml_used_bytes(gpu_index: int) -> dict[str, int]:
    """NVML's used memory of a GPU (every process's), or {} where NVML is not there."""
    try:
        import pynvml

        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(gpu_index))
        return {"nvml_device_used_bytes": int(info.used)}
    except Exception:  # noqa: BLE001 - no pynvml, no driver: the report says what it has
        return {}


MAX_RANK_TIMES = 1 << 20  # every rank's time of every iteration is kept up to this many values a point


def timing_fields(stats: dict[str, Any], timed_start: float | None, skip: int) -> dict[str, Any]:
    """A result's fields beyond the statistics: when its timed calls began, the leading iterations -K left
    out (their samples), and every rank's time of every counted iteration (`report --stragglers` reads
    them), packed as iteration_times_us is; a point with more than MAX_RANK_TIMES values keeps none."""
    matrix = stats.get("rank_times_us")
    ranks = None
    if matrix is not None and 0 < matrix.size <= MAX_RANK_TIMES:
        ranks = {"ranks": int(matrix.shape[0]), "times_us": pack_times(matrix.ravel())}
    return {"timed_start": timed_start, "skipped_iters": skip,
            "skipped_times_us": pack_times(stats.get("skipped_us")) if skip else None, "rank_times_us": ranks}


def timing_notes(cfg: Any) -> list[str]:
    """The header's lines on -z, -K and -u: what the timed region holds, what the figures leave out."""
    notes = []
    if cfg.blocking:
        notes.append(f"blocking mode {cfg.blocking} (-z): the timed region of each iteration holds "
                     f"{BLOCKING[cfg.blocking]}")
    if cfg.skip_iters:
        notes.append(f"-K {cfg.skip_iters}: the first {cfg.skip_iters} timed iteration(s) of each point run and are "
                     f"timed but left out of every figure (skipped_times_us in the JSON)")
    if cfg.misalign_nbytes:
        notes.append(f"-u {cfg.misalign_nbytes}: every buffer starts {cfg.misalign_nbytes} B past its allocation")
    return notes
