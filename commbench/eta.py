"""How long the points of a sweep still to come will take: the estimate behind the progress line's ETA.

A point's wall time is its calls (warm-up, timed, the check's) at the time of one call, plus what the
harness does around them (buffers filled and checked, barriers, gathers). The time of one call is what the
point measured (its `time_us`); the rest is the point's wall time less its calls. Each of the two is a
trend over the sizes done: flat (latency, a fixed cost) until the largest sizes show a cost per byte, then
that cost per byte carried on to the sizes to come.

Noise must not pass for a cost per byte. Under load one size's calls can take four times another's at the
same size (`sweep --sizes 1K-1G` on a loaded 2-core host said "ETA 681433s" at 5 of 42 points, for a run of
90 s: a line through 1-4 KiB carried to 1 GiB). So a cost per byte counts only once a size of the larger
half of those done takes at least GROWTH times the slowest of the smaller half (two sizes at least; each
size at its fastest sample: load only slows); it is the growth from their typical (median) time, and never
more than that size's own time per byte. Until then the sizes beyond the largest done are counted at its
time: the estimate is a lower bound, and says so (`Estimate.at_least`), instead of a guess.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

GROWTH = 2.0  # the largest size's time over the smaller sizes' before their difference counts as a cost per byte


@dataclass(frozen=True)
class PointTime:
    """One point done: its size, its wall time, and (when the harness timed calls) how many calls it made
    and the time of one call."""
    nbytes: int
    seconds: float
    calls: int = 0
    call_us: float | None = None


@dataclass(frozen=True)
class Trend:
    """A quantity over sizes: each size's mean (`by_size`) and fastest (`fastest`), and beyond the sizes
    seen, `per_byte` from the largest; `resolved` False: no cost per byte shown yet (flat beyond)."""
    by_size: dict[int, float]
    fastest: dict[int, float]
    per_byte: float
    resolved: bool
    largest: int = 0  # the largest size seen

    @classmethod
    def of(cls, samples: Sequence[tuple[int, float]], noise: float = 0.0) -> Trend:
        """The trend of (nbytes, value) samples; `noise`: an amount the growth must pass as well (for a
        difference of two noisy times, whose own small values say nothing of the noise)."""
        values: dict[int, list[float]] = {}
        for nbytes, value in samples:
            values.setdefault(nbytes, []).append(max(0.0, value))
        by_size = {n: sum(v) / len(v) for n, v in values.items()}
        fastest = {n: min(v) for n, v in values.items()}
        sizes = sorted(fastest)
        smaller = sizes[:len(sizes) // 2]
        if len(smaller) < 2:  # one smaller size says nothing of the noise: 1-4 KiB under load differ 2-4x
            return cls(by_size, fastest, 0.0, False, sizes[-1])
        typical = sorted(fastest[n] for n in smaller)[(len(smaller) - 1) // 2]  # the median (lower one)
        bar = max(GROWTH * max(fastest[n] for n in smaller), typical + noise)
        grown = [n for n in sizes[len(smaller):] if fastest[n] >= bar and fastest[n] > 0]
        if not grown:
            return cls(by_size, fastest, 0.0, False, sizes[-1])
        anchor, base = max(grown), max(n for n in smaller if fastest[n] == typical)
        per_byte = min((fastest[anchor] - typical) / (anchor - base), fastest[anchor] / anchor)  # at most what was seen
        return cls(by_size, fastest, per_byte, True, sizes[-1])

    def at(self, nbytes: int) -> tuple[float, bool]:
        """(the value at `nbytes`, whether it is only a lower bound: beyond the sizes seen, no cost per byte
        shown yet)."""
        if nbytes in self.by_size:
            return self.by_size[nbytes], False
        if nbytes > self.largest:
            return self.by_size[self.largest] + self.per_byte * (nbytes - self.largest), not self.resolved
        nearest = min(self.by_size, key=lambda n: abs(math.log(max(n, 1) / max(nbytes, 1))))
        return max(0.0, self.by_size[nearest] + self.per_byte * (nbytes - nearest)), False


@dataclass(frozen=True)
class Estimate:
    seconds: float
    at_least: bool  # a lower bound: sizes to come lie beyond any cost per byte measured yet


@dataclass(frozen=True)
class Forecast:
    """The points done, as the trends that estimate the points to come: fitted once (a progress line asks
    for every point still to come, every second), then read per size with `at`."""
    wall: Trend
    call: Trend | None = None  # None: no call times (not every point timed its calls), or no calls_for
    around: Trend | None = None
    calls_for: Callable[[float], int] | None = None

    @classmethod
    def of(cls, points: Sequence[PointTime], calls_for: Callable[[float], int] | None = None) -> Forecast:
        wall = Trend.of([(p.nbytes, p.seconds) for p in points])
        if calls_for is None or not all(p.call_us is not None and p.calls > 0 for p in points):
            return cls(wall)
        call = Trend.of([(p.nbytes, p.call_us) for p in points])
        # the rest of a point's wall time (buffers filled and checked, barriers, gathers), as noisy as the wall
        walls = sorted(p.seconds for p in points)
        around = Trend.of([(p.nbytes, p.seconds - p.calls * p.call_us * 1e-6) for p in points],
                          noise=walls[(len(walls) - 1) // 2])
        return cls(wall, call, around, calls_for)

    def at(self, nbytes: int) -> Estimate:
        """The time a point of `nbytes` will take: its own size's mean where that size ran (the other
        placement, an earlier collective); else the trend of the wall times or, with call times, the calls
        (`calls_for` at the trend of one call's time) plus the harness's time around them, whichever is
        longer. The calls show a cost per byte long before the wall does: the adaptive rule keeps a point's
        wall time near --min-time until one call is a fifth of it. A lower bound only while neither does."""
        wall_s, wall_low = self.wall.at(nbytes)
        if nbytes in self.wall.by_size or self.call is None:
            return Estimate(wall_s, wall_low)
        call_us, call_low = self.call.at(nbytes)
        around_s, around_low = self.around.at(nbytes)
        return Estimate(max(wall_s, around_s + self.calls_for(call_us) * call_us * 1e-6),
                        wall_low and (call_low or around_low))


def point_estimate(points: Sequence[PointTime], nbytes: int,
                   calls_for: Callable[[float], int] | None = None) -> Estimate:
    """Forecast.of(points, calls_for).at(nbytes): one point's estimate."""
    return Forecast.of(points, calls_for).at(nbytes)


def point_estimate_s(durations: Sequence[tuple[int, float]], nbytes: int) -> float:
    """point_estimate from (nbytes, seconds) pairs alone."""
    return point_estimate([PointTime(n, s) for n, s in durations], nbytes).seconds
