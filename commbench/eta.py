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
            return cls(by_size, fastest, 0.0, False)
        typical = sorted(fastest[n] for n in smaller)[(len(smaller) - 1) // 2]  # the median (lower one)
        bar = max(GROWTH * max(fastest[n] for n in smaller), typical + noise)
        grown = [n for n in sizes[len(smaller):] if fastest[n] >= bar and fastest[n] > 0]
        if not grown:
            return cls(by_size, fastest, 0.0, False)
        anchor, base = max(grown), max(n for n in smaller if fastest[n] == typical)
        per_byte = min((fastest[anchor] - typical) / (anchor - base), fastest[anchor] / anchor)  # at most what was seen
        return cls(by_size, fastest, per_byte, True)

    def at(self, nbytes: int) -> tuple[float, bool]:
        """(the value at `nbytes`, whether it is only a lower bound: beyond the sizes seen, no cost per byte
        shown yet)."""
        if nbytes in self.by_size:
            return self.by_size[nbytes], False
        largest = max(self.by_size)
        if nbytes > largest:
            return self.by_size[largest] + self.per_byte * (nbytes - largest), not self.resolved
        nearest = min(self.by_size, key=lambda n: abs(math.log(max(n, 1) / max(nbytes, 1))))
        return max(0.0, self.by_size[nearest] + self.per_byte * (nbytes - nearest)), False


@dataclass(frozen=True)
class Estimate:
    seconds: float
    at_least: bool  # a lower bound: sizes to come lie beyond any cost per byte measured yet


def point_estimate(points: Sequence[PointTime], nbytes: int,
                   calls_for: Callable[[float], int] | None = None) -> Estimate:
    """The time a point of `nbytes` will take, from the points done: the trend of their wall times, or, with
    `calls_for` (the calls a point makes when one call takes that many microseconds: the harness's adaptive
    rule) and every point's call time, its calls at the trend of one call's time plus the harness's typical
    time around them (buffers, barriers, gathers), whichever is longer. The calls show a cost per byte long
    before the wall does: the adaptive rule keeps a point's wall time near --min-time until one call is a
    fifth of it. A lower bound only while neither shows a cost per byte."""
    same = [p.seconds for p in points if p.nbytes == nbytes]
    if same:  # this very size ran (the other placement, an earlier collective): its own mean
        return Estimate(sum(same) / len(same), False)
    wall_s, wall_low = Trend.of([(p.nbytes, p.seconds) for p in points]).at(nbytes)
    if calls_for is None or not all(p.call_us is not None and p.calls > 0 for p in points):
        return Estimate(wall_s, wall_low)
    call_us, call_low = Trend.of([(p.nbytes, p.call_us) for p in points]).at(nbytes)
    # the rest of a point's wall time (buffers filled and checked, barriers, gathers), as noisy as the wall time
    walls = sorted(p.seconds for p in points)
    around_s, around_low = Trend.of([(p.nbytes, p.seconds - p.calls * p.call_us * 1e-6) for p in points],
                                    noise=walls[(len(walls) - 1) // 2]).at(nbytes)
    return Estimate(max(wall_s, around_s + calls_for(call_us) * call_us * 1e-6), wall_low and (call_low or around_low))


def point_estimate_s(durations: Sequence[tuple[int, float]], nbytes: int) -> float:
    """point_estimate from (nbytes, seconds) pairs alone."""
    return point_estimate([PointTime(n, s) for n, s in durations], nbytes).seconds
