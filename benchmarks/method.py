"""The measurement method the benchmarks here share, written once.

Every loop that these scripts time themselves (the bare torch.distributed loop, the
mpi4py loop) follows the rule commbench's harness follows in its adaptive mode
(commbench/point_timing.py `warmup_calls`, `timed_calls`), so that a difference between tools is a
difference in the tools, not in how long or how often each was timed:

- one first call (setup), then warm-up calls filling ~10% of the time budget
  (1 to 100 calls);
- iterations = budget / (median warm-up time, max over ranks), between 5 and 1000;
- a barrier, then the iterations back to back, each timed with time.perf_counter;
- time_us = each rank's mean per iteration, then the maximum over ranks.

Comparisons between tools are **paired** (ARCHITECTURE.md): this VM changes speed for
tens of seconds at a time, so medians of separate per-tool rounds compare machine states,
not tools. Per size, the two tools of a comparison run in short slots alternating
A B, B A, A B, ... (`abba_orders`); each pair gives one ratio (B's time / A's time,
taken within seconds of each other); the figure reported is the median of the pair
ratios and its spread is their interquartile range (`PairedRatio`). A target is judged
on that spread (`judge_at_least`, `judge_within`): pass when the whole IQR meets it,
FAIL when the whole IQR misses it, noisy when the IQR straddles it. With one pair the
IQR is that one ratio and the verdict is a plain comparison.

Bandwidth follows nccl-tests' doc/PERFORMANCE.md: algbw = bytes / time / 1e9
(GB/s), busbw = algbw * 2(n-1)/n for allreduce, through commbench.collectives'
one definition (tests/unit/commbench/test_collectives.py pins its values).

This module imports neither torch nor MPI: both kinds of ranks use it.
"""
from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from typing import Callable

from commbench.collectives import bandwidths_gbps
from commbench.point_timing import timed_calls, warmup_calls

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


# ---------------------------------------------------------------- paired comparisons

DEFAULT_PAIRS = 6


def abba_orders(pairs: int) -> list[bool]:
    """For each pair, whether A runs first: A B, B A, A B, ... (over two pairs each tool runs first and
    second once, so a drift in the machine's speed within a pair falls on both alike)."""
    return [index % 2 == 0 for index in range(pairs)]


def run_pairs(measure_a: Callable[[], float], measure_b: Callable[[], float], pairs: int) -> list[tuple[float, float]]:
    """(A's time, B's time) per pair, the two slots of each pair back to back in ABBA order."""
    out = []
    for a_first in abba_orders(pairs):
        if a_first:
            a = measure_a()
            b = measure_b()
        else:
            b = measure_b()
            a = measure_a()
        out.append((a, b))
    return out


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3), inclusive method (with one value, that value three times)."""
    if not values:
        return math.nan, math.nan, math.nan
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


@dataclass(frozen=True)
class PairedRatio:
    """The ratios of one comparison at one size, one per pair, and what is reported of them."""
    ratios: tuple[float, ...]

    @classmethod
    def of_times(cls, pairs: list[tuple[float, float]]) -> PairedRatio:
        """ratio = B's time / A's time per pair (above 1: A is faster)."""
        return cls(tuple(b / a for a, b in pairs if a > 0 and b > 0 and not math.isnan(a + b)))

    @property
    def median(self) -> float:
        return quartiles(list(self.ratios))[1]

    @property
    def q1(self) -> float:
        return quartiles(list(self.ratios))[0]

    @property
    def q3(self) -> float:
        return quartiles(list(self.ratios))[2]

    @property
    def spread(self) -> float:
        """The IQR relative to the median ((q3 - q1) / median)."""
        q1, mid, q3 = quartiles(list(self.ratios))
        return (q3 - q1) / mid if self.ratios and mid else math.nan

    def to_json(self) -> dict:
        return {"ratios": list(self.ratios), "median": self.median, "q1": self.q1, "q3": self.q3,
                "iqr_over_median": self.spread, "pairs": len(self.ratios)}

    def text(self) -> str:
        """"1.62 [1.50-1.71]": the median and the IQR of the pair ratios."""
        if not self.ratios:
            return "n/a"
        return f"{self.median:.3g} [{self.q1:.3g}-{self.q3:.3g}]"


def judge_at_least(ratio: PairedRatio, target: float) -> str:
    """pass: the whole IQR of the pair ratios is >= target; FAIL: the whole IQR is below it; noisy: it
    straddles the target (this run cannot decide); n/a: no pair measured."""
    if not ratio.ratios:
        return "n/a"
    if ratio.q1 >= target:
        return "pass"
    if ratio.q3 < target:
        return "FAIL"
    return "noisy"


def judge_within(ratio: PairedRatio, low: float, high: float) -> str:
    """pass: the whole IQR lies in [low, high]; FAIL: the whole IQR lies outside it, on one side;
    noisy: the IQR crosses an edge."""
    if not ratio.ratios:
        return "n/a"
    if low <= ratio.q1 and ratio.q3 <= high:
        return "pass"
    if ratio.q3 < low or ratio.q1 > high:
        return "FAIL"
    return "noisy"


def verdict_counts(verdicts: list[str]) -> str:
    return ", ".join(f"{verdicts.count(v)} {v}" for v in ("pass", "FAIL", "noisy", "n/a") if verdicts.count(v))


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


def json_safe(value):
    """`value` for json.dump: NaN as null, PairedRatio as its dict, keys as strings (the scripts' JSON)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, PairedRatio):
        return json_safe(value.to_json())
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: str, benchmark: str, args, **fields) -> None:
    """A script's JSON: its name, command line and options, then `fields` (json_safe), the folder made."""
    import json
    import os

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(json_safe({"benchmark": benchmark, "command": " ".join(sys.argv), "config": vars(args), **fields}),
                  handle, indent=1)
