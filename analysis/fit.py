"""Fit the cost model to measured sweeps: per link level, latency (alpha) and bandwidth (beta).

Each measured point is rebuilt as the Schedule that ran it (commbench's own
algorithm, or the ring a library runs), and its rounds become features: a round
that crosses nodes counts for the inter level, else for the intra level, with the
bytes of its busiest resource. The model is then linear in its unknowns,

    time_us = overhead + sum_levels( rounds_l * alpha_l + bytes_l * (1 / bw_l) ),

and is fitted by robust least squares (scipy, soft-L1 loss on relative errors,
every unknown >= 0). A host's caches: when the data span working sets (every local
rank's buffer) on both sides of some size, the fit also tries a second intra-level
bandwidth for the working sets up to that size, each candidate threshold in turn,
and keeps the best one if it is at least 25% faster and lowers the loss by a fifth or
more (`cache_bytes`, `cache_bw_gbps` in the hardware file). What a sweep cannot tell apart is not invented: a level with
no rounds in the data keeps the base hardware's figures (or the other level's,
noted in `meta`); with a single step count, the per-call overhead is folded into
alpha; reduction cost is folded into bandwidth (reduce_gbps stays null).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from commbench.analysis.fit_points import FitError, points, schedule_for, select, setups_name, usable
from commbench.analysis.hosts import host_cache_bytes, measured_on
from commbench.analysis.provenance import measured_with
from commbench.collectives import DTYPES
from commbench.costmodel import Hardware
from commbench.topology import Link

# A fit whose median point is off by more than this does not describe its data (docs/model.md).
# The median, not R^2 or the mean error: one disturbed point (a 14.7 ms first call of an shm
# sweep whose other points fit within 12%, seen here) drives R^2 below 0 on its own, as it does
# the mean; the soft-L1 fit ignores it, and so does the test of the fit.
POOR_MEDIAN_ERROR = 0.25


def poor_fit(meta: dict) -> str | None:
    """Why a fit's figures do not describe the data it came from, or None when they do."""
    if meta.get("median_ape", 0) > POOR_MEDIAN_ERROR:
        return (f"median error {100 * meta['median_ape']:.1f}% > {100 * POOR_MEDIAN_ERROR:.0f}%: "
                f"half the points are further off than that")
    return None


# The most points one fit takes: its jackknife refits the model once without each, so its work grows as points^2
# (20,000 points took 14 s on the 2-core CI host, 2026-12-02; a sweep has hundreds).
MAX_FIT_POINTS = 10_000
# A cache regime's rate past this (1 PB/s, above any cache's) is no per-byte cost the sweep measured: a loaded
# host's fit gave 4e30 GB/s, which the hardware loader refuses (at most 1e30); written as this instead.
CACHE_BW_CAP_GBPS = 1e6


def fit(records: list[dict], setup: str | None = None, base: Hardware | None = None) -> Hardware:
    """Fit one setup's points (all of them when the records hold one setup)."""
    chosen = select(usable(records), setup)
    if len(chosen) > MAX_FIT_POINTS:
        raise FitError(f"{len(chosen):,d} points to fit, more than {MAX_FIT_POINTS:,d} (the fit is refitted once "
                       f"without each point): fit one setup and size range at a time (--setup, --sizes)")
    pts = points(chosen)
    if len(pts) < 3:
        raise FitError(f"{len(pts)} usable points for {setup or 'the results'}: a fit needs at least 3 measured, "
                       "timed, correct points of allreduce, allgather, reduce_scatter, broadcast or reduce")
    a = np.array([p.features for p in pts])
    y = np.array([p.record["time_us"] for p in pts])
    ws = np.array([p.working_set for p in pts])
    x, cost, active = _solve(a, y)
    base_cost, cache = cost, None
    llc = host_cache_bytes(chosen, records)
    for threshold in _cache_thresholds(ws, a, llc):
        small = ws <= threshold
        split = np.column_stack([a, np.where(small, a[:, 3], 0.0)])
        split[small, 3] = 0.0
        x6, cost6, active6 = _solve(split, y)
        distinct = 0 < x6[5] < x6[3] / 1.25  # the cache must be at least 25% faster, not a noise fit
        if distinct and cost6 < 0.8 * base_cost and cost6 < cost:  # the best boundary of those that help
            x, cost, active, cache = x6, cost6, active6, int(threshold)
    predicted = a @ x[:5]
    design = a
    if cache is not None:  # small working sets move their intra bytes at the cache bandwidth
        predicted = predicted + np.where(ws <= cache, a[:, 3] * (x[5] - x[3]), 0.0)
        design = np.column_stack([a, np.where(ws <= cache, a[:, 3], 0.0)])
        design[ws <= cache, 3] = 0.0
        # The data place the boundary between the largest working set inside and the smallest
        # outside: at the hosts' last-level cache when it lies there (measured, from sysfs), else at
        # the geometric midpoint rather than either end (the lower end would call every size in
        # between out of the cache).
        above = int(ws[(a[:, 3] > 0) & (ws > cache)].min())
        cache = llc if llc and cache <= llc < above else math.isqrt(cache * above)  # Python ints: no overflow
    hw = _hardware(x, active, pts, predicted, y, setup=setup or setups_name(chosen), base=base, cache=cache)
    if cache is not None and cache == llc:
        hw.meta["notes"].append(f"cache boundary at the hosts' last-level cache ({llc} bytes, from their run headers)")
    hw.meta["measured_with"] = measured_with(chosen, records)  # what it applies to (provenance.py)
    _note_hosts(hw, measured_on(chosen, records))
    block = _jackknife(design, y, x)
    if len(block["resamples"]) >= JACKKNIFE_MIN_POINTS:
        hw.meta["uncertainty"] = block
    else:
        hw.meta["notes"].append(f"no prediction intervals: {len(block['resamples'])} point(s) could be left out of "
                                f"the fit without leaving a figure unpinned; a jackknife+ 80% interval needs "
                                f"{JACKKNIFE_MIN_POINTS} (fewer leave its upper end unbounded)")
    return hw


# Prediction intervals (docs/model.md, "Uncertainty"): a jackknife+ (Barber, Candes, Ramdas and
# Tibshirani, "Predictive inference with the jackknife+", Annals of Statistics 49(1), 2021) on log time.
# The fit is repeated once without each point, and that point's error against the fit that did not
# see it is its leave-one-out residual; analysis/intervals.py costs a prediction on each of those fits,
# spreads it by the left-out point's residual and takes finite-sample order statistics. Until
# 2026-11-25 the file held 60 bootstrap fits and the fit's in-sample residuals: with 5-8 points and 3-5
# figures a fit follows its own points, so those residuals understated the error on points it did not
# see (17-60% inside an "80%" interval, docs/model.md); such files are still read as they were meant.
INTERVAL = (10.0, 90.0)  # percentiles of an old bootstrap block: an 80% interval
INTERVAL_LEVEL = 0.8
JACKKNIFE = "jackknife+"
JACKKNIFE_MIN_POINTS = 4  # below, ceil(0.8 (n + 1)) > n: the paper's upper end is unbounded


def _jackknife(design: np.ndarray, y: np.ndarray, x: np.ndarray) -> dict:
    """The fit without each point in turn (its figures) and that point's relative error against it. The
    cache boundary stays where the whole fit put it (the one choice not made again). A point whose removal
    leaves a fitted figure without data has no residual (its refit would only copy the figure)."""
    resamples, residuals = [], []
    needed = _identifiable(design)
    refits: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
    for left_out in range(len(y)):
        # a point measured again with the same time (a file read twice, a run appended) leaves the same
        # points behind as its twin: one refit serves both, so n copies of m points cost m refits, not n
        key = design[left_out].tobytes() + y[left_out].tobytes()
        if key not in refits:
            keep = np.arange(len(y)) != left_out
            refits[key] = _refit(design[keep], y[keep], x)
        figures, active = refits[key]
        predicted = float(design[left_out] @ figures)
        # a point that alone pins a figure (the one point beyond a cache boundary) cannot be predicted
        # without it, and one no other point's figures can cost: neither says anything of the error
        if predicted > 0 and not (needed[1:] & ~active[1:]).any():
            resamples.append([float(v) for v in figures])
            residuals.append(float(y[left_out] / predicted - 1.0))
    return {"method": f"{JACKKNIFE}: the fit without each point, and that point's relative error against it; "
                      f"interval {INTERVAL_LEVEL:.0%} from finite-sample order statistics on log time",
            "pairing": JACKKNIFE, "columns": list(COLUMNS[:len(x)]), "fit": [float(v) for v in x],
            "resamples": resamples, "relative_residuals": residuals}


def _refit(a: np.ndarray, y: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fit's loss (soft-L1 on relative errors, f_scale 0.05, every unknown >= 0) minimised again on a
    subset of the points, from the full fit's figures, by iteratively reweighted non-negative least squares:
    the same minimum as _solve's, at about a hundredth of the cost (one refit per point in milliseconds)."""
    from scipy.optimize import nnls

    active = _identifiable(a)
    idx = np.flatnonzero(active)
    typical = np.array([1.0, 1.0, 1.0, 1e-4, 1e-4, 1e-4][:a.shape[1]])[idx]
    scaled = a[:, idx] / y[:, None] * typical  # relative residual = scaled @ z - 1, z in typical units
    z = start[idx] / typical
    for _ in range(20):
        residual = scaled @ z - 1.0
        weight = np.sqrt(1.0 / np.sqrt(1.0 + (residual / 0.05) ** 2))  # soft-L1's IRLS weight, square-rooted
        new, _ = nnls(scaled * weight[:, None], weight)
        converged = np.allclose(new, z, rtol=1e-6, atol=1e-12)
        z = new
        if converged:
            break
    x = np.array(start, dtype=float)
    x[idx] = z * typical
    return x, active


COLUMNS = ("overhead_us", "alpha_intra_us", "alpha_inter_us", "us_per_byte_intra", "us_per_byte_inter",
           "us_per_byte_cache")


def _solve(a: np.ndarray, y: np.ndarray, start: np.ndarray | None = None) -> tuple[np.ndarray, float, np.ndarray]:
    """Robust least squares on relative errors over the identifiable columns: (x, cost, active).
    `start`: where to begin (a resample of the points starts from the full fit's figures)."""
    from scipy.optimize import least_squares

    active = _identifiable(a)
    idx = np.flatnonzero(active)
    typical = np.array([1.0, 1.0, 1.0, 1e-4, 1e-4, 1e-4][:a.shape[1]])[idx]  # us, us, us, us/byte (10 GB/s)
    x0 = typical if start is None else np.maximum(start[idx], 1e-12)  # strictly inside the bounds
    result = least_squares(lambda z: (a[:, idx] @ z - y) / y, x0, bounds=(0, np.inf), loss="soft_l1",
                           f_scale=0.05, x_scale=typical)
    x = np.zeros(a.shape[1])
    x[idx] = result.x
    return x, float(result.cost), active


def _cache_thresholds(ws: np.ndarray, a: np.ndarray, llc: int | None = None) -> list[int]:
    """Working-set sizes to try as the cache boundary: at least 2 intra points on each side (the
    regime beyond adds one unknown, its bandwidth); and where the hosts' last-level cache `llc` is known,
    the largest working set within it, with 1 point beyond enough (the host, not the data, says where
    the boundary is: seen here, a 2-rank shm sweep turns at 32 MiB, this VM's L3, with one fitted size
    beyond it, 2026-11-25)."""
    intra = a[:, 3] > 0
    sizes = np.unique(ws[intra])
    inside = {int(t): int((ws[intra] <= t).sum()) for t in sizes}
    found = [t for t, n in inside.items() if n >= 2 and intra.sum() - n >= 2]
    within = [t for t in inside if llc and t <= llc]
    if within and inside[max(within)] >= 2 and intra.sum() - inside[max(within)] >= 1 and max(within) not in found:
        found.append(max(within))
    return found


def _note_hosts(hw: Hardware, where: dict | None) -> None:
    """The fit's `meta.measured_on` (None: simulated points, nothing to say), and a note when its points ran
    more CPU ranks on a host than it had cores."""
    if where is None:
        return
    hw.meta["measured_on"] = where
    if where["cpus"] and where["ranks_per_host"] > where["cpus"]:
        hw.meta["notes"].append(f"the fitted points ran {where['ranks_per_host']} CPU ranks on a host of "
                                f"{where['cpus']} cores (oversubscribed): the figures hold that contention, "
                                f"at that many ranks only")


def _cache_note(cache: int, gbps: float) -> str:
    if gbps < CACHE_BW_CAP_GBPS:
        return f"cache regime: working sets up to {cache} bytes move at {gbps:.3f} GB/s"
    return (f"cache regime: working sets up to {cache} bytes show no per-byte cost the fit can measure (written as "
            f"{CACHE_BW_CAP_GBPS:g} GB/s: their time is the latency)")


def _identifiable(a: np.ndarray) -> np.ndarray:
    """Which unknowns the data can pin down: a level needs rounds; overhead needs two step counts."""
    active = np.array([False, *(a[:, k].any() for k in range(1, a.shape[1]))])
    active[0] = bool(len(a)) and bool((a[:, 1:3] != a[0, 1:3]).any())  # more than one (intra, inter) step count
    return active


def _hardware(x, active, pts, predicted, measured, *, setup: str, base: Hardware | None,
              cache: int | None = None) -> Hardware:
    overhead, alpha_intra, alpha_inter, inv_intra, inv_inter = x[:5]
    fitted = {"intra": bool(active[3]), "inter": bool(active[4])}
    if not any(fitted.values()):
        raise FitError(f"no point of {setup} moves data between ranks (one rank each): nothing to fit")
    intra = _level("intra", alpha_intra, inv_intra, base.intra if base else None) if fitted["intra"] else None
    if intra is not None and cache is not None and x[5] > 0:  # 1 / x[5] past any cache's rate: no cost measured
        intra = replace(intra, cache_bytes=cache, cache_bw_gbps=min(1.0 / x[5] / 1e3, CACHE_BW_CAP_GBPS))
    inter = _level("inter", alpha_inter, inv_inter, base.inter if base else None) if fitted["inter"] else None
    if intra is None:  # one rank per node: every round crossed nodes
        intra = base.intra if base else replace(inter, name="intra")
    if inter is None:
        inter = base.inter if base else replace(intra, name="inter")
    ranks = pts[0].topo.ranks_per_node
    ape = np.abs(predicted - measured) / measured
    ss_res, ss_tot = float(((predicted - measured) ** 2).sum()), float(((measured - measured.mean()) ** 2).sum())
    meta = {"fitted_from": setup, "points": len(pts), "levels_fitted": fitted,
            "r2": 1 - ss_res / ss_tot if ss_tot else None, "mape": float(ape.mean()),
            "median_ape": float(np.median(ape)), "overhead_fitted": bool(active[0]),
            "notes": _notes(fitted, active, base) + ([_cache_note(cache, intra.cache_bw_gbps)] if intra.cache_bytes
                                                     else [])}
    return Hardware(f"fit:{setup}", ranks, intra, inter, None, float(overhead),
                    dict(base.device_tflops) if base else {}, meta)


def _level(name: str, alpha: float, inv_bw: float, fallback: Link | None) -> Link:
    if inv_bw <= 0:  # time does not grow with size: no bandwidth to write down (JSON has no infinity)
        if fallback is None:
            raise FitError(f"the {name} level's bandwidth cannot be fitted: the times of these points do not grow "
                           "with size; add larger sizes, or give --base for its figures")
        return fallback
    return Link(name, 1.0 / inv_bw / 1e3, float(alpha))  # us per byte -> GB/s


def _notes(fitted: dict, active: np.ndarray, base: Hardware | None) -> list[str]:
    notes = []
    if not fitted["intra"]:
        notes.append("intra level not fitted (one rank per node): " + ("taken from the base hardware" if base
                                                                      else "copied from the inter level"))
    if not fitted["inter"]:
        notes.append("inter level not fitted (single-node data): " + ("taken from the base hardware" if base
                                                                      else "copied from the intra level"))
    if not active[0]:
        notes.append("one step count in the data: per-call overhead folded into alpha")
    notes.append("reduction cost folded into bandwidth (reduce_gbps null)")
    return notes


def predict_records(records: list[dict], hw: Hardware) -> np.ndarray:
    """The model's time for each record's point (its schedule on its topology)."""
    from commbench.costmodel import form_us

    out = []
    for r in records:
        topo, form = schedule_for(r)
        out.append(form_us(form, topo, hw, DTYPES[r["dtype"]].itemsize))
    return np.array(out)
