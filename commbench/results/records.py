"""Results: the base of every record type commbench writes (one flat, versioned JSON line each), and a sweep's.

A sweep writes `header`, one `result` per collective x size x placement, then `summary`; compare writes
`compare`. The records of a model's step (`step`, `proxy`, `validate`, `scaling`, `layout`) are in
step_records.py. Every type but the free-form header is a dataclass; sink.ResultSink writes them (each line
fsynced, results in CSV too) and reader.read_records reads a file back, every line checked. Results keep their
raw per-iteration times beside the percentiles (times.py). docs/results.md describes every field.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from commbench import collectives as C
from commbench.results.times import pack_times

SCHEMA_VERSION = 1
# A predicted record's interval_source: where its interval came from (docs/model.md).
FIT_PROVENANCE = "fit resamples"  # the fit's jackknife+ resamples
CORPUS_PROVENANCE = "corpus calibration"  # no fit: the published corpus's calibration
PROVENANCE_LABELS = {FIT_PROVENANCE: "fit", CORPUS_PROVENANCE: "corpus"}  # the word beside an interval in a table
# A predicted record's `estimate`: what its point figures are (docs/model.md, "The estimate users see").
CALIBRATED_ESTIMATE = "calibrated"  # the raw figure moved by the corpus calibration's median error
RAW_ESTIMATE = "raw"  # the cost model's own figure (a fit: its interval is from the same fit)


class Record:
    """What every record type shares: its `record` name, its JSON form, and reading it back."""
    RECORD: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return {"record": self.RECORD, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """The record from a JSON line: fields an older file lacks take their defaults, unknown ones are dropped."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Result(Record):
    """One measured (or predicted) point. Units live in the names."""
    RECORD: ClassVar[str] = "result"
    collective: str
    backend: str  # commbench backend: torch, shm, p2p, sim, cupy, cuda
    library: str  # what ran the collective: gloo, nccl, or a schedule name
    device: str  # cpu or cuda
    dtype: str
    op: str | None
    root: int | None
    placement: str  # out-of-place or in-place
    world_size: int
    nnodes: int
    requested_nbytes: int
    nbytes: int  # size actually used (the larger per-rank buffer)
    count: int
    warmup: int
    iters: int
    time_us: float | None  # the printed statistic (`stat`) of the per-iteration times; None: not timed
    algbw_gbps: float | None  # of time_us
    busbw_gbps: float | None
    p50_us: float | None  # percentiles of per-iteration times (each iteration aggregated across ranks)
    p90_us: float | None
    p99_us: float | None
    min_us: float | None
    max_us: float | None
    rank_agg: str
    wrong: int | None  # wrong elements summed over ranks; None when not checked
    algorithm: str | None = None  # the schedule that ran (custom backends); None for a library call
    steps: int | None = None  # rounds of that schedule
    telemetry: dict[str, float] | None = None  # --monitor: hardware averages over the timed calls (telemetry.py)
    kind: str = "measured"
    run_id: str = ""
    timestamp: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION
    # the times the percentiles come from, as pack_times keeps them; last, so CSV columns keep their places
    iteration_times_us: list[float] | dict[str, Any] | None = None
    interval_us: list[float] | None = None  # kind predicted: the 80% interval [low, high] (docs/model.md)
    stat: str = "mean"  # which statistic of the per-iteration times time_us is (sweep --stat: mean, p50, min)
    mean_us: float | None = None  # the mean of the per-iteration times, whatever `stat` is
    interval_source: str | None = None  # kind predicted: "fit resamples" (jackknife+) or "corpus calibration"
    # What the backend could do (backends.registry.RecordCapabilities), so readers need not know backends by
    # name: commbench's own schedule ran (or was costed), or a library's collective; and whether the time is
    # measured, simulated (the call ran, the cost model timed it) or modelled (nothing ran). None: an older
    # file (readers then look its backend up by name: registry.record_capabilities)
    schedule: bool | None = None
    timing: str | None = None
    tuning: str | None = None  # `auto`'s chooser: a tuning table's name, or "rule" (the built-in); None: not auto
    timed_start: float | None = None  # when the timed calls began (epoch s): iteration i began ~ there + sum before it
    skipped_iters: int = 0  # -K / --skip-iters: leading timed iterations left out of every figure above
    skipped_times_us: list[float] | dict[str, Any] | None = None  # ... their samples, packed as iteration_times_us
    # every rank's time of every counted iteration (packed row after row: rank 0's, rank 1's, ...), for
    # `report --stragglers`; None: not kept (a file from before, or more than point_timing.MAX_RANK_TIMES values)
    rank_times_us: dict[str, Any] | None = None
    estimate: str | None = None  # kind predicted: what time_us is, CALIBRATED_ESTIMATE or RAW_ESTIMATE (results.md)
    raw_time_us: float | None = None  # kind predicted: the cost model's own time, before any calibration


RESULT_FIELDS = [f.name for f in dataclasses.fields(Result)]
STATS = ("mean", "p50", "min")  # the statistics a result's time_us can be (sweep --stat)


def percentiles_us(per_iteration_us: np.ndarray) -> dict[str, float | None]:
    """p50, p90, p99, min, max and mean of per-iteration times (all None when nothing was timed)."""
    if per_iteration_us.size == 0:
        return dict.fromkeys(("p50_us", "p90_us", "p99_us", "min_us", "max_us", "mean_us"))
    p50, p90, p99 = np.percentile(per_iteration_us, [50, 90, 99])
    return {"p50_us": float(p50), "p90_us": float(p90), "p99_us": float(p99),
            "min_us": float(per_iteration_us.min()), "max_us": float(per_iteration_us.max()),
            "mean_us": float(per_iteration_us.mean())}


def statistic_us(per_iteration_us: np.ndarray, stat: str) -> float | None:
    """One statistic (STATS) of per-iteration times, the samples every printed time is computed from
    (docs/metrics.md); None when nothing was timed."""
    values = np.asarray(per_iteration_us, dtype=float).ravel()
    if values.size == 0:
        return None
    return float({"mean": np.mean, "p50": np.median, "min": np.min}[stat](values))


def point_result(plan: C.Plan, *, dtype: str, op: str | None, placement: str, nnodes: int, backend: str,
                 library: str, device: str, time_us: float | None, per_iteration_us: Any = None, warmup: int = 0,
                 rank_agg: str = "-", wrong: int | None = None, **extra: Any) -> Result:
    """The Result of one point of `plan`: sizes and root from the plan, algbw and busbw from `time_us`,
    iters, the percentiles and the raw times from `per_iteration_us` (each iteration already combined
    over ranks; None or empty: not timed). `extra`: the optional Result fields (algorithm, steps,
    telemetry, kind, run_id, and the backend's capabilities: schedule and timing). A timed point of kind
    predicted is the cost model's raw time (`estimate` raw, `raw_time_us` its time) unless `extra` says else."""
    per_iteration = np.asarray([] if per_iteration_us is None else per_iteration_us, dtype=float).ravel()
    algbw = busbw = None
    if time_us is not None:
        algbw, busbw = C.bandwidths_gbps(plan.collective, plan.nbytes, plan.world, time_us)
    root = plan.root if C.COLLECTIVES[plan.collective].rooted and plan.root >= 0 else None
    if extra.get("kind") == "predicted" and time_us is not None:  # a cost model's time (sim --hw), as it is, unless
        extra = {"estimate": RAW_ESTIMATE, "raw_time_us": time_us, **extra}  # the caller says it calibrated it
    return Result(collective=plan.collective, backend=backend, library=library, device=device, dtype=dtype, op=op,
                  root=root, placement=placement, world_size=plan.world, nnodes=nnodes,
                  requested_nbytes=plan.requested_nbytes, nbytes=plan.nbytes, count=plan.count, warmup=warmup,
                  iters=int(per_iteration.size), time_us=time_us, algbw_gbps=algbw, busbw_gbps=busbw,
                  **percentiles_us(per_iteration), rank_agg=rank_agg, wrong=wrong,
                  iteration_times_us=pack_times(per_iteration), **extra)


# ---------------------------------------------------------------- a sweep's other records and compare's


@dataclass(frozen=True)
class SweepSummary(Record):
    """The last line of a sweep."""
    RECORD: ClassVar[str] = "summary"
    run_id: str
    status: str  # ok, wrong, failed, interrupted
    error: str | None  # the one-line message
    points: int
    wrong: int  # wrong elements over every point
    # mean over every timed point of the run, all collectives together, of their busbw_gbps (that of the
    # statistic `stat`); the table shows it only when one collective ran. None: no point was timed (sim, no --hw)
    avg_busbw_gbps: float | None
    telemetry: dict[str, float] | None = None  # --monitor: averages over the whole run
    schema: int = SCHEMA_VERSION
    stat: str = "mean"  # the statistic the points' times are (sweep --stat)
    # each collective's own mean, the figure its footer prints ("Avg bus bandwidth"); None where not timed
    avg_busbw_gbps_by_collective: dict[str, float | None] | None = None
    memory: list[dict[str, Any]] | None = None  # --memory-report (nccl-tests -M): each rank's (point_timing.py)

    @classmethod
    def failed_from(cls, records: list[dict[str, Any]], error: str) -> SweepSummary:
        """A sweep's summary, status failed, from its header and result records (the spawner ends a file so
        when rank 0 died before writing its own: job.close_records)."""
        results = [r for r in records if r.get("record") == "result"]
        busbw, by_collective = busbw_averages([(r.get("collective", ""), r.get("busbw_gbps")) for r in results])
        return cls(run_id=records[0].get("run_id", ""), status="failed", error=error, points=len(results),
                   wrong=sum(r.get("wrong") or 0 for r in results), avg_busbw_gbps=busbw,
                   stat=(records[0].get("config") or {}).get("stat", "mean"),
                   avg_busbw_gbps_by_collective=by_collective)


def busbw_averages(points: list[tuple[str, float | None]]) -> tuple[float | None, dict[str, float | None]]:
    """(mean busbw over every point, {collective: its mean}) of (collective, busbw_gbps) pairs in run order: the
    summary's figures, the second those of the table's footers. None where no point of it was timed."""
    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    timed = [busbw for _, busbw in points if busbw is not None]
    names = list(dict.fromkeys(name for name, _ in points))
    return mean(timed), {name: mean([b for n, b in points if n == name and b is not None]) for name in names}


@dataclass(frozen=True)
class CompareRecord(Record):
    """`compare`: one point of two sweeps, matched on the key fields (collective .. nbytes)."""
    RECORD: ClassVar[str] = "compare"
    collective: str
    backend: str
    library: str
    algorithm: str | None
    dtype: str
    op: str | None
    placement: str
    world_size: int
    nnodes: int
    nbytes: int
    metric: str  # the result field compared: busbw_gbps or time_us
    higher_is_better: bool
    threshold_pct: float
    base: float | None  # median over the base file's records of this point; None: only in new
    new: float | None
    base_runs: int
    new_runs: int
    ratio: float | None  # new / base
    change_pct: float | None
    verdict: str  # regression, improvement, same, within noise, only in base, only in new
    noise_pct: float | None = None  # the change the measurements' own spread allows (see analysis/compare.py)
    schema: int = SCHEMA_VERSION
