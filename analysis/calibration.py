"""Calibrated intervals for predictions made without a fit (a preset or a hand-written hardware file):
split-conformal on the residuals of the published corpus (docs/model.md, "Intervals without a fit").

A residual is the published linearity minus the predicted one, in linearity points (0.01 = 1 point),
one per corpus row, each predicted with nothing fitted to it. With n calibration residuals sorted,
r_(1) <= ... <= r_(n), the interval of a new prediction p at level 1 - a is

    [p + r_(k_lo), p + r_(k_hi)],  k_lo = floor((n + 1) a / 2),  k_hi = ceil((n + 1)(1 - a / 2)),

(an end is unbounded when its index falls outside 1..n). If the new residual is exchangeable with the
calibration ones, it falls below r_(k_lo) with probability at most k_lo / (n + 1) <= a / 2 and above
r_(k_hi) with probability at most (n + 1 - k_hi) / (n + 1) <= a / 2: coverage at least 1 - a in finite
samples (Lei, G'Sell, Rinaldo, Tibshirani and Wasserman, JASA 2018, split conformal; the two tails
taken separately so that a one-sided model error gives a one-sided interval).

Rows of one source share a benchmark, a framework and a machine, so they are not exchangeable with the
others: `leave_one_source_out` calibrates each source's rows on the other sources' residuals only, and
the shipped file (analysis/corpus/calibration.json) holds every source's residuals for a prediction
that belongs to none of them.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

CALIBRATION_PATH = os.path.join(os.path.dirname(__file__), "corpus", "calibration.json")
LEVEL = Fraction(4, 5)  # the 80% interval, as the fit's jackknife+ gives


class CalibrationError(ValueError):
    """A calibration file that is not what this module writes (one line)."""


def order_indices(n: int, level: Fraction = LEVEL) -> tuple[int, int]:
    """(k_lo, k_hi), 1-based order statistics of n residuals for the two-sided interval at `level`; k_lo
    may be 0 and k_hi n + 1 (that end unbounded). Exact: fractions, not floats."""
    tail = (1 - Fraction(level)) / 2
    return math.floor((n + 1) * tail), math.ceil((n + 1) * (1 - tail))


def bounds(residuals: Sequence[float], level: Fraction = LEVEL) -> tuple[float, float]:
    """(low, high) offsets to add to a prediction: the order statistics above (+-inf where unbounded)."""
    values = np.sort(np.asarray(residuals, dtype=float))
    if not len(values) or not np.isfinite(values).all():
        raise CalibrationError("calibration needs at least one finite residual")
    k_lo, k_hi = order_indices(len(values), level)
    low = values[k_lo - 1] if k_lo >= 1 else -math.inf
    high = values[k_hi - 1] if k_hi <= len(values) else math.inf
    return float(low), float(high)


def centre(residuals: Sequence[float]) -> float:
    """The median residual: the offset that centres a prediction inside its interval (see Calibration.centre)."""
    values = np.asarray(residuals, dtype=float)
    if not len(values) or not np.isfinite(values).all():
        raise CalibrationError("calibration needs at least one finite residual")
    return float(np.median(values))


def leave_one_source_out(residuals: Mapping[str, Sequence[float]],
                         level: Fraction = LEVEL) -> dict[str, tuple[float, float]]:
    """For each source, the bounds from every other source's residuals (never its own)."""
    return {held: bounds([r for source, values in residuals.items() if source != held for r in values], level)
            for held in residuals}


def leave_one_source_out_centres(residuals: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """For each source, the centre (median residual) of every other source's residuals: the calibrated estimate
    of its rows, as a prediction that belongs to none of the calibrating sources gets it."""
    return {held: centre([r for source, values in residuals.items() if source != held for r in values])
            for held in residuals}


@dataclass(frozen=True)
class Calibration:
    residuals: tuple[float, ...]  # published - predicted linearity, fractions (0.01 = 1 point)
    sources: tuple[str, ...]  # the source of each residual
    level: Fraction
    made_by: str  # the command that wrote it
    model: str  # what the predictions it calibrates counted (terms, algorithm)

    def bounds(self) -> tuple[float, float]:
        return bounds(self.residuals, self.level)

    def centre(self) -> float:
        """The offset that centres a prediction: the median residual. It lies between the interval's order
        statistics (k_lo <= (n + 1) / 2 <= k_hi at any level), so the calibrated point is inside its interval."""
        return centre(self.residuals)

    def linearity_estimate(self, linearity: float) -> float:
        """The calibrated linearity of a raw prediction: raw + centre(), clipped at 0."""
        return max(0.0, linearity + self.centre())

    def step_estimate_us(self, one_rank_step_us: float, step_us: float) -> float | None:
        """The calibrated step of N ranks (weak scaling: the one-rank step over the calibrated linearity); None
        when the calibrated linearity is 0 (no finite step)."""
        linearity = self.linearity_estimate(one_rank_step_us / step_us)
        return one_rank_step_us / linearity if linearity > 0 else None

    def step_interval_us(self, one_rank_step_us: float, step_us: float) -> tuple[float, float] | None:
        """The interval of a step of N ranks whose one-rank step is `one_rank_step_us` (weak scaling: the
        linearity is their ratio); None when the linearity's interval reaches 0 (the step is unbounded)."""
        low, high = self.linearity_interval(one_rank_step_us / step_us)
        return (one_rank_step_us / high, one_rank_step_us / low) if low > 0 else None

    def linearity_interval(self, linearity: float) -> tuple[float, float]:
        """The interval of a predicted linearity, clipped at 0 (a rate cannot be negative)."""
        low, high = self.bounds()
        return max(0.0, linearity + low), max(0.0, linearity + high)


def load_calibration(path: str = CALIBRATION_PATH) -> Calibration | None:
    """The shipped calibration, None when the file is absent; CalibrationError (one line) when damaged."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        residuals = tuple(float(r) for r in data["residuals"])
        sources = tuple(str(s) for s in data["sources"])
        level = Fraction(str(data["level"]))
        if len(residuals) != len(sources) or not residuals or not all(map(math.isfinite, residuals)) \
                or not 0 < level < 1:
            raise ValueError("residuals, sources and level do not agree")
        return Calibration(residuals, sources, level, str(data.get("made_by", "")), str(data.get("model", "")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CalibrationError(f"{path}: not a calibration file ({exc})") from None


def save_calibration(calibration: Calibration, path: str = CALIBRATION_PATH) -> None:
    data = {"method": "split conformal, two tails (analysis/calibration.py)", "level": str(calibration.level),
            "made_by": calibration.made_by, "model": calibration.model,
            "residuals": [round(r, 6) for r in calibration.residuals], "sources": list(calibration.sources)}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(data, indent=1) + "\n")
