"""The measurement method the benchmarks here share, written once.

Every loop that these scripts time themselves (the bare torch.distributed loop, the
mpi4py loop) follows the rule commbench's harness follows in its adaptive mode
(commbench/bench.py `warmup_calls`, `timed_calls`), so that a difference between tools is a
difference in the tools, not in how long or how often each was timed:

- one first call (setup), then warm-up calls filling ~10% of the time budget
  (1 to 100 calls);
- iterations = budget / (median warm-up time, max over ranks), between 5 and 1000;
- a barrier, then the iterations back to back, each timed with time.perf_counter;
- time_us = each rank's mean per iteration, then the maximum over ranks.

Bandwidth follows nccl-tests' doc/PERFORMANCE.md: algbw = bytes / time / 1e9
(GB/s), busbw = algbw * 2(n-1)/n for allreduce, through commbench.collectives'
one definition (tests/test_collectives.py pins its values).

This module imports neither torch nor MPI: both kinds of ranks use it.
"""
from __future__ import annotations

import math
import statistics
import sys

from commbench.bench import timed_calls, warmup_calls
from commbench.collectives import bandwidths_gbps

DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"
DEFAULT_MIN_TIME_S = 0.2  # commbench sweep --min-time default


# The adaptive rule and the bandwidth definitions are commbench's own, imported rather
# than copied, so a change there cannot leave the peer loops timed differently.
warmup_count = warmup_calls
iteration_count = timed_calls


def allreduce_bandwidths_gbps(nbytes: int, time_us: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 B/s) for an allreduce of `nbytes` per rank on `world` ranks."""
    return bandwidths_gbps("allreduce", nbytes, world, time_us)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


class Table:
    """A right-aligned table printed row by row as results arrive: columns are sized by their
    headers (at least `min_width`, or the width given for that header in `widths`)."""

    def __init__(self, headers: list[str], min_width: int = 8, widths: dict[str, int] | None = None):
        self.headers = headers
        self.widths = [max(len(h), (widths or {}).get(h, min_width)) for h in headers]

    def header(self) -> str:
        return "\n".join([self._line(self.headers), self._line(["-" * w for w in self.widths])])

    def row(self, values: list[object]) -> str:
        return self._line([_cell(v) for v in values])

    def _line(self, cells: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, self.widths)).rstrip()


def ratio_text(value: float) -> str:
    """A ratio to 3 decimals ("n/a" when a side is missing)."""
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def _cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 0.01 else f"{value:.4f}"
    return str(value)


def fail(message: str, code: int = 2) -> None:
    """End the script with one line on stderr (errors a user can cause: bad sizes, missing tools)."""
    print(f"{sys.argv[0].rsplit('/', 1)[-1]}: error: {message}", file=sys.stderr)
    sys.exit(code)
