"""Prediction intervals (docs/model.md, "Uncertainty"): reading a fit's `meta.uncertainty`, the 80%
interval of one modelled call, and of a prediction of which only a part is modelled (a training step:
its compute is given, its communication modelled); and which layouts a fit can give an interval for.

`commbench fit` (analysis/fit.py) writes a jackknife+ block: the fit's figures without each point in
turn, and that point's relative error against them (its leave-one-out residual). A prediction is
costed on each of those fits, t_i, and spread on log time by residual r_i: low_i = t_i exp(-e_i),
high_i = t_i exp(e_i) with e_i = |ln(1 + r_i)|; the interval is the
floor(a (n + 1))-th smallest low and the ceil((1 - a)(n + 1))-th smallest high, a = 0.2 (Barber et
al., Annals of Statistics 2021: at least 1 - 2a of new points inside whatever the model's errors,
about 1 - a in practice). With fewer than 9 points the order statistics are the smallest and largest;
below 4 the paper's upper bound is unbounded, so `fit` writes no interval then.
A block from before 2026-11-25 (bootstrap fits and in-sample residuals, no `pairing`) is read as it
was written: every fit with every residual, the 10th to 90th percentile.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from commbench.analysis.fit import COLUMNS, INTERVAL, INTERVAL_LEVEL, JACKKNIFE
from commbench.analysis.fit_points import features
from commbench.costmodel import Hardware, HardwareError, working_set_bytes
from commbench.schedule import Phases, Schedule
from commbench.topology import Topology


@dataclass(frozen=True)
class Uncertainty:
    """A fit's uncertainty block, checked: its figures, the resampled figures (one row per resample) and
    the relative residuals; `paired`: resample i goes with residual i (jackknife+), else every resample
    goes with every residual (an old bootstrap block)."""
    fit: np.ndarray
    resamples: np.ndarray
    residuals: np.ndarray
    paired: bool

    def factors(self) -> np.ndarray:
        """resamples x k factors for the modelled time on each resample: (low, high) per left-out point, or
        (1 + r) for every residual r."""
        if self.paired:
            spread = np.exp(np.abs(np.log1p(self.residuals)))
            return np.column_stack([1.0 / spread, spread])
        return np.tile(1.0 + self.residuals, (len(self.resamples), 1))

    def bounds(self, times: np.ndarray) -> tuple[float, float]:
        """The interval of predictions costed as `factors()` lays them out (resamples x k)."""
        times = np.asarray(times, dtype=float)
        if not self.paired:
            low, high = np.percentile(times, INTERVAL)
            return float(low), float(high)
        n = len(times)
        tail = Fraction(1) - Fraction(INTERVAL_LEVEL).limit_denominator(1000)  # exact: 1 - 0.8 is 0.1999... in floats
        k_low = min(n, max(1, math.floor(tail * (n + 1))))
        k_high = min(n, max(1, math.ceil((1 - tail) * (n + 1))))
        return float(np.sort(times[:, 0])[k_low - 1]), float(np.sort(times[:, 1])[k_high - 1])


def uncertainty(hw: Hardware) -> Uncertainty | None:
    """`hw`'s uncertainty block, None when the file has none (a preset, a fit from before 2026-11-23). A
    block that is not what fit writes is a HardwareError, one line: a prediction never rests on a
    damaged interval."""
    block = hw.meta.get("uncertainty")
    if block is None:
        return None
    try:
        columns = list(block["columns"])
        if not 5 <= len(columns) <= len(COLUMNS) or columns != list(COLUMNS[:len(columns)]):
            raise ValueError("unknown columns")
        fitted = np.array(block["fit"], dtype=float)
        resamples = np.array(block["resamples"], dtype=float)
        residuals = np.array(block["relative_residuals"], dtype=float)
        paired = block.get("pairing") == JACKKNIFE
        if block.get("pairing", JACKKNIFE) != JACKKNIFE:
            raise ValueError("unknown pairing")
        if fitted.shape != (len(columns),) or resamples.ndim != 2 or resamples.shape[1] != len(columns) \
                or not len(resamples) or residuals.ndim != 1 or not len(residuals) \
                or paired and len(residuals) != len(resamples):
            raise ValueError("shapes")
        if not (np.isfinite(fitted).all() and np.isfinite(resamples).all() and np.isfinite(residuals).all()) \
                or (fitted < 0).any() or (resamples < 0).any() or (residuals <= -1).any():
            raise ValueError("values")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HardwareError(f"{hw.name}: meta.uncertainty is not what `commbench fit` writes ({exc}); fit again, "
                            f"or remove the block to predict without intervals") from None
    return Uncertainty(fitted, resamples, residuals, paired)


WIDE_FACTOR = 10.0  # a leave-one-out error beyond this factor (either way) is a point the model does not describe


def wide_note(hw: Hardware) -> str | None:
    """Why the intervals of `hw` are wide, when they are: jackknife+ spreads every prediction by the fit's
    leave-one-out errors, pooled over all its points, so a few points the model does not describe (a loaded host's
    small sizes, 1000x its latency) widen the interval of every size, the well-described included, by up to their
    factor. None when no point was off by more than WIDE_FACTOR."""
    parsed = uncertainty(hw)
    if parsed is None:
        return None
    factors = np.exp(np.abs(np.log1p(parsed.residuals)))
    far = int((factors > WIDE_FACTOR).sum())
    if not far:
        return None
    n = len(factors)
    extremes = " (with fewer than 9 points the bounds are the extremes)" if n < 9 else ""
    return (f"wide intervals: {far} of the fit's {n} points were off by more than {WIDE_FACTOR:g}x when left out "
            f"(the largest {factors.max():,.0f}x): the model does not describe them (noise, a loaded host, another "
            f"regime), and jackknife+ spreads every prediction by these errors{extremes}; refit on quieter data "
            f"or on the sizes the model describes (fit --sizes), docs/model.md")


def levels_fitted(hw: Hardware, topo: Topology) -> bool:
    """Whether the fit of `hw` measured every link level `topo` communicates over: the level inside a
    node when a node holds 2+ ranks, the one between nodes when there are 2+ nodes. A level the fit
    copied or took from --base (or a preset's) has no resamples that say how uncertain it is: no
    interval then (check's proxy rows, predict-scaling and proxy --backend sim alike)."""
    levels = hw.meta.get("levels_fitted") or {}
    return bool((topo.ranks_per_node == 1 or levels.get("intra")) and (topo.nodes == 1 or levels.get("inter")))


def schedule_interval_us(hw: Hardware, schedule: Schedule | Phases, topo: Topology, itemsize: int,
                         central_us: float) -> tuple[float, float] | None:
    """The 80% interval of `central_us`, the cost model's time of `schedule` (or its closed form). The fit's
    model is linear in its figures (time = features . figures), so each resample's time is that of the fit scaled by
    features . resample / features . fit. None without resamples, or when the schedule crosses a level
    the fit did not measure (its figures were copied or given, not fitted: no interval would say how
    uncertain they are)."""
    parsed = uncertainty(hw)
    if parsed is None:
        return None
    f = features(schedule, topo, itemsize)
    levels = hw.meta.get("levels_fitted") or {}
    if (f[1] or f[3]) and not levels.get("intra") or (f[2] or f[4]) and not levels.get("inter"):
        return None
    vector = np.zeros(len(parsed.fit))
    vector[:5] = f
    if len(parsed.fit) > 5 and hw.intra.cache_bytes and working_set_bytes(schedule.count, itemsize, topo) \
            <= hw.intra.cache_bytes:
        vector[5], vector[3] = vector[3], 0.0
    base = float(vector @ parsed.fit)
    if base <= 0:
        return None
    times = central_us * (parsed.resamples @ vector) / base
    return parsed.bounds(times[:, None] * parsed.factors())


def variants(hw: Hardware) -> list[Hardware]:
    """The hardware of each resample of the fit (empty without resamples): exactly the figures that
    resample's residual was computed with. A level the fit did not measure keeps its figures; a fitted
    bandwidth whose resample is 0 us per byte (a refit in which that level's bytes cost nothing, as a
    non-negative fit may find on a noisy sweep) is an infinite bandwidth, not the fit's own: keeping
    the fit's would pair the resample's residual with other figures than the ones it came from."""
    parsed = uncertainty(hw)
    if parsed is None:
        return []
    levels = hw.meta.get("levels_fitted") or {}
    out = []
    for values in parsed.resamples:
        fields = dict(zip(COLUMNS, values))
        intra, inter = hw.intra, hw.inter
        if levels.get("intra"):
            intra = replace(intra, bw_gbps=_gbps(fields["us_per_byte_intra"]), latency_us=fields["alpha_intra_us"])
        if "us_per_byte_cache" in fields and intra.cache_bytes:
            intra = replace(intra, cache_bw_gbps=_gbps(fields["us_per_byte_cache"]))
        if levels.get("inter"):
            inter = replace(inter, bw_gbps=_gbps(fields["us_per_byte_inter"]), latency_us=fields["alpha_inter_us"])
        out.append(replace(hw, intra=intra, inter=inter, per_call_overhead_us=fields["overhead_us"]))
    return out


def _gbps(us_per_byte: float) -> float:
    """A fitted figure in us per byte as GB/s (0 us per byte: bytes cost nothing, an infinite bandwidth)."""
    return 1.0 / us_per_byte / 1e3 if us_per_byte > 0 else math.inf


def interval_us(hw: Hardware, cost: Callable[[Hardware], float]) -> tuple[float, float] | None:
    """The 80% interval of a prediction that is not one schedule but wholly modelled: `cost(hardware) ->
    us` on every resample's hardware. None without resamples."""
    return partial_interval_us(hw, lambda hardware, factors: np.array([cost(v) for v in hardware])[:, None]
                               * factors)


def partial_interval_us(hw: Hardware, cost: Callable[[list[Hardware], np.ndarray], np.ndarray]) \
        -> tuple[float, float] | None:
    """The 80% interval of a prediction of which only a part is modelled: `cost(hardware, factors)` gives,
    for resample i's hardware and each of its factors (resamples x k, Uncertainty.factors), the
    prediction with the factor applied to the modelled part alone (one shape: resamples x k). None
    without resamples (a preset)."""
    hardware = variants(hw)
    if not hardware:
        return None
    parsed = uncertainty(hw)
    times = np.asarray(cost(hardware, parsed.factors()), dtype=float).reshape(len(hardware), -1)
    return parsed.bounds(times)
