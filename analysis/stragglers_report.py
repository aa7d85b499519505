"""Which rank and which node held a sweep up, and which iterations spiked (`commbench report
--stragglers`), read from the records a sweep writes: every rank's own time of every iteration
(`rank_times_us`), the iterations' samples (`iteration_times_us`), when the timed calls began
(`timed_start`) and each rank's host (the run header's `ranks`).

A collective ends at about the same moment on every rank (none can finish before the last one's
data arrives), so in one iteration the rank that arrived last measures the shortest time and every
other rank measures its own time plus the wait: that iteration's wait (longest rank time - shortest)
is the late rank's doing. One pattern reads the other way: a rank held up inside a call (stopped,
descheduled) after its peers had their data measures the longest time while they finish early, and in
the next iteration they wait for it, so it measures the shortest there; when the rank with the longest
time in one iteration has the shortest in the next (and that wait is at least half as long), both waits
are its. When every rank measured the delay alike (one held inside the call before its peers had its
data), the times do not say whose it was and it is nobody's. Summed over a point's iterations, the
rank that caused the most waiting is the point's slowest rank, and the node whose ranks caused the
most its slowest node. A rank that runs its own part slower but arrives on time causes no wait and is
not found this way; its own mean time, beside the others', is in the JSON (`rank_mean_us`).
Rooted collectives (broadcast, reduce, gather, scatter) do not end together on every rank, so there the
attribution is a reading, not a measurement.

A spike is an iteration whose sample is more than `spike_factor` times the point's median; it began
at about timed_start + rank 0's own times before it (rank 0 took timed_start; what runs between two
calls is not timed, so this is early by that much).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from commbench.results import raw_times

SPIKE_FACTOR = 3.0


class StragglerError(ValueError):
    """Records a straggler report cannot read (one line)."""


def rank_times(record: dict[str, Any]) -> np.ndarray | None:
    """A result's (ranks x iterations) own times, or None where the record keeps none."""
    kept = record.get("rank_times_us")
    if not isinstance(kept, dict) or not isinstance(kept.get("ranks"), int) or kept["ranks"] < 1:
        return None
    values = raw_times({"iteration_times_us": kept.get("times_us")})
    if values.size == 0 or values.size % kept["ranks"]:
        return None
    return values.reshape(kept["ranks"], -1)


def holdups(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the rank that held each iteration up, the wait it caused), as the module's docstring reads them;
    -1 where every rank measured the delay alike (held inside the call, by whom the times cannot say)."""
    top = matrix.max(axis=0)
    spread = top - matrix.min(axis=0)
    culprit, longest = matrix.argmin(axis=0), matrix.argmax(axis=0)
    inside = (longest[:-1] == culprit[1:]) & (spread[1:] >= 0.5 * spread[:-1])
    culprit[:-1][inside] = longest[:-1][inside]
    culprit[spread < 0.5 * (top - np.median(top))] = -1
    return culprit, spread


def caused_wait_us(matrix: np.ndarray) -> np.ndarray:
    """Per rank: the wait it caused the others, summed over the iterations it held up."""
    culprit, spread = holdups(matrix)
    known = culprit >= 0
    return np.bincount(culprit[known], weights=spread[known], minlength=matrix.shape[0])


@dataclass(frozen=True)
class Spike:
    iteration: int
    time_us: float
    times_median: float  # time_us over the point's median
    at_utc: str | None  # when (from timed_start), ISO 8601 with milliseconds
    held_by: int | None  # the rank that held it up (holdups); None: no rank times, or every rank alike


def spikes(record: dict[str, Any], factor: float = SPIKE_FACTOR) -> list[Spike]:
    samples = raw_times(record)
    if samples.size == 0:
        return []
    median = float(np.median(samples))
    matrix = rank_times(record)
    began = record.get("timed_start")
    found = []
    # when: rank 0 took timed_start; its own times add up to its clock (the samples, combined over ranks, count
    # a wait twice when the ranks take turns waiting: a rank stopped inside a call, then its peer in the next one)
    kept = matrix is not None and matrix.shape[1] == samples.size
    clock, culprit = (matrix[0], holdups(matrix)[0]) if kept else (samples, None)
    before = np.concatenate(([0.0], np.cumsum(clock, dtype=float)))  # rank 0's time before each iteration, once
    for i in np.flatnonzero(samples > factor * median):  # (summed per spike, 800k spikes took minutes: issue 48)
        at = None
        if isinstance(began, (int, float)):
            moment = began + float(before[i]) * 1e-6
            try:
                at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment % 1 * 1000):03d}Z"
            except (OverflowError, OSError, ValueError):  # times past what a clock renders: no moment to say
                at = None
        found.append(Spike(int(i), float(samples[i]), float(samples[i] / median) if median > 0 else float("inf"), at,
                           int(culprit[i]) if culprit is not None and culprit[i] >= 0 else None))
    return found


def hosts_of(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """run_id -> each rank's host (the header's `ranks`, in rank order)."""
    out = {}
    for r in records:
        if r.get("record") == "header" and isinstance(r.get("ranks"), list):
            out[r.get("run_id")] = [str(e.get("host", "?")) if isinstance(e, dict) else "?" for e in r["ranks"]]
    return out


def point_report(record: dict[str, Any], hosts: list[str] | None, factor: float = SPIKE_FACTOR) -> dict[str, Any]:
    """One point: its slowest rank and node (the wait each caused), every rank's mean, its spikes."""
    matrix = rank_times(record)
    out: dict[str, Any] = {key: record.get(key) for key in ("run_id", "collective", "nbytes", "placement", "dtype",
                                                            "op", "world_size")}
    out["spikes"] = [s.__dict__ for s in spikes(record, factor)]
    if matrix is None or matrix.shape[0] < 2:
        out.update(slowest_rank=None, slowest_node=None, rank_mean_us=None)
        return out
    waits = caused_wait_us(matrix)
    iterations, median_us = matrix.shape[1], float(np.median(matrix.max(axis=0)))
    slowest = int(waits.argmax())
    out["rank_mean_us"] = [float(x) for x in matrix.mean(axis=1)]
    out["caused_wait_us"] = [float(x) for x in waits]
    out["slowest_rank"] = None if waits[slowest] <= 0 else {
        "rank": slowest, "host": hosts[slowest] if hosts and slowest < len(hosts) else None,
        "caused_wait_us": float(waits[slowest]), "per_iteration_us": float(waits[slowest] / iterations),
        "share_of_waits": float(waits[slowest] / waits.sum()),
        "of_median": float(waits[slowest] / iterations / median_us) if median_us > 0 else None}
    out["slowest_node"] = _slowest_node(waits, hosts, iterations, median_us)
    return out


def _slowest_node(waits: np.ndarray, hosts: list[str] | None, iterations: int, median_us: float) -> dict | None:
    if not hosts or len(hosts) != len(waits) or len(set(hosts)) < 2:
        return None
    by_host: dict[str, float] = {}
    for rank, host in enumerate(hosts):
        by_host[host] = by_host.get(host, 0.0) + float(waits[rank])
    host = max(by_host, key=by_host.get)
    if by_host[host] <= 0:
        return None
    return {"host": host, "caused_wait_us": by_host[host], "per_iteration_us": by_host[host] / iterations,
            "of_median": by_host[host] / iterations / median_us if median_us > 0 else None}


def report(records: list[dict[str, Any]], factor: float = SPIKE_FACTOR) -> dict[str, Any]:
    """Every measured point's report, and per rank and per node: how often each was the slowest."""
    if not factor > 1:
        raise StragglerError(f"--spike {factor:g}: a spike is a time above a multiple (> 1) of the median")
    hosts = hosts_of(records)
    points = [point_report(r, hosts.get(r.get("run_id")), factor) for r in records
              if r.get("record") == "result" and r.get("kind", "measured") == "measured"]
    if not points:
        raise StragglerError("no measured result records (a sweep's --json file holds them)")
    ranks = Counter(p["slowest_rank"]["rank"] for p in points if p.get("slowest_rank"))
    nodes = _node_summary(points, hosts)
    return {"spike_factor": factor, "points": points, "kept_rank_times": sum(p.get("rank_mean_us") is not None
                                                                             for p in points),
            "slowest_rank_counts": {str(rank): n for rank, n in ranks.most_common()}, "nodes": nodes}


def _node_summary(points: list[dict[str, Any]], hosts: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Per host: its ranks, the wait they caused over every point, and how often it was the slowest node."""
    summary: dict[str, dict[str, Any]] = {}
    for point in points:
        names = hosts.get(point.get("run_id")) or []
        for rank, wait in enumerate(point.get("caused_wait_us") or []):
            host = names[rank] if rank < len(names) else "?"
            entry = summary.setdefault(host, {"host": host, "ranks": set(), "caused_wait_us": 0.0, "slowest_in": 0})
            entry["ranks"].add(rank)
            entry["caused_wait_us"] += wait
        node = point.get("slowest_node")
        if node:
            summary.setdefault(node["host"], {"host": node["host"], "ranks": set(), "caused_wait_us": 0.0,
                                              "slowest_in": 0})["slowest_in"] += 1
    return [{**entry, "ranks": sorted(entry["ranks"])} for entry in summary.values()]
