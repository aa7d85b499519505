"""Prediction intervals of what is more than one modelled call (docs/model.md, "Uncertainty"): the
rule of which layouts a fit can give an interval for, and the interval of a prediction of which
only a part is the cost model's (a training step: its compute is given, its communication modelled).

A fit (analysis/fit.py) keeps bootstrap resamples of its figures and its relative residuals
(measured / predicted - 1). fit.interval_us multiplies a whole prediction by (1 + r) for each
residual r; that is right for one collective, wrong for a step whose compute the fit never saw:
a step of 1.9 s with 3 ms of communication would get the collectives' +-10% scatter on all of its
1.9 s. Here `cost(hardware, factors)` applies the factors (1 + r) to the modelled part alone.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commbench.analysis.costmodel import Hardware
from commbench.analysis.fit import INTERVAL, uncertainty, variants
from commbench.topology import Topology


def levels_fitted(hw: Hardware, topo: Topology) -> bool:
    """Whether the fit of `hw` measured every link level `topo` communicates over: the level inside a
    node when a node holds 2+ ranks, the one between nodes when there are 2+ nodes. A level the fit
    copied or took from --base (or a preset's) has no resamples that say how uncertain it is: no
    interval then (check's proxy rows, predict-scaling and proxy --backend sim alike)."""
    levels = hw.meta.get("levels_fitted") or {}
    return bool((topo.ranks_per_node == 1 or levels.get("intra")) and (topo.nodes == 1 or levels.get("inter")))


def partial_interval_us(hw: Hardware, cost: Callable[[list[Hardware], np.ndarray], np.ndarray]) \
        -> tuple[float, float] | None:
    """The 80% interval of a prediction of which only a part is modelled: `cost(hardware, factors)` gives
    the prediction on every resample's hardware (all at once: it may cost them together) for each factor
    (1 + r) of the fit's relative residuals r, the factor applied to the modelled part alone (any shape:
    resamples x factors). The percentiles are taken over every resample x residual, as fit.interval_us
    takes them. None without resamples (a preset)."""
    hardware = variants(hw)
    if not hardware:
        return None
    times = np.asarray(cost(hardware, 1.0 + uncertainty(hw)[2]), dtype=float)
    low, high = np.percentile(times, INTERVAL)
    return float(low), float(high)
