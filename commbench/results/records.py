"""Results: every record type commbench writes, one flat, versioned JSON line each.

A sweep writes `header`, one `result` per collective x size x placement, then `summary`; proxy
and train runs write `step` records and a `proxy` summary (and `validate`); predict-scaling
writes `scaling`, compare `compare`. Every type but the free-form header is a dataclass here;
sink.ResultSink writes them (each line fsynced, results in CSV too) and reader.read_records reads
a file back, every line checked. Results keep their raw per-iteration times beside the percentiles
(times.py). docs/results.md describes every field.
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
    telemetry, kind, run_id, and the backend's capabilities: schedule and timing)."""
    per_iteration = np.asarray([] if per_iteration_us is None else per_iteration_us, dtype=float).ravel()
    algbw = busbw = None
    if time_us is not None:
        algbw, busbw = C.bandwidths_gbps(plan.collective, plan.nbytes, plan.world, time_us)
    root = plan.root if C.COLLECTIVES[plan.collective].rooted and plan.root >= 0 else None
    return Result(collective=plan.collective, backend=backend, library=library, device=device, dtype=dtype, op=op,
                  root=root, placement=placement, world_size=plan.world, nnodes=nnodes,
                  requested_nbytes=plan.requested_nbytes, nbytes=plan.nbytes, count=plan.count, warmup=warmup,
                  iters=int(per_iteration.size), time_us=time_us, algbw_gbps=algbw, busbw_gbps=busbw,
                  **percentiles_us(per_iteration), rank_agg=rank_agg, wrong=wrong,
                  iteration_times_us=pack_times(per_iteration), **extra)


# ---------------------------------------------------------------- the other record types


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
class StepRecord(Record):
    """One step of a proxy, train or predicted run as it ends: the figures of the step's slowest
    rank (what a synchronous job waits for), and every rank's in `ranks_us`."""
    RECORD: ClassVar[str] = "step"
    run_id: str
    step: int  # from 1
    warmup: bool
    compute_us: float | None  # None where not known (train steps have only step_us)
    comm_us: float | None
    exposed_comm_us: float | None
    step_us: float | None
    samples_per_s: float | None  # all ranks
    telemetry: dict[str, float] | None = None  # --monitor: this step's hardware averages
    slowest_rank: int | None = None  # whose figures these are (None: one rank, or an older file)
    ranks_us: list[list[float | None]] | None = None  # per rank: compute, comm, exposed_comm, step, other (us)
    other_us: float | None = None  # step - compute - exposed_comm (None: train, or an older file)
    schema: int = SCHEMA_VERSION
    calls_us: list[list[float]] | None = None  # a replay: rank 0's calls, [start, end] from the step's start
    traced_step: int | None = None  # `replay` of a trace: which traced step this one replays (from 0)
    issued: list[list] | None = None  # `replay`: rank 0's calls as issued, [collective, nbytes, dtype, group ranks]
    # a replay: rank 0's compute as it ran, [progress, wall] from the step's start (two marks of one progress where
    # it waited for a call); the compute's phases on the wall clock the calls are timed by (report's timeline)
    compute_marks_us: list[list[float]] | None = None
    layout: str | None = None  # proxy --layout: the parallel layout's name (tp2,ddp2)
    exposed_by_dim_us: dict[str, float] | None = None  # proxy --layout: rank 0's wait per dimension (pp: its bubble)


@dataclass(frozen=True)
class ProxyResult(Record):
    """One proxy replay, real training run or prediction, summarised over its measured steps."""
    RECORD: ClassVar[str] = "proxy"
    kind: str  # proxy (replayed), train (real DDP), predicted (cost model)
    model: str
    backend: str
    library: str
    device: str
    world_size: int
    nnodes: int
    batch: int  # per rank
    bucket_mb: float | None  # None: DDP's default (25 MiB, first bucket 1 MiB)
    bucketing: str
    buckets: int
    gradient_bytes: int
    compute: str  # how compute was set: measured [(CPU time)], flops at N TFLOP/s, none, real
    steps: int
    warmup_steps: int
    compute_us_p50: float | None
    compute_us_p90: float | None
    comm_us_p50: float | None
    comm_us_p90: float | None
    exposed_comm_us_p50: float | None
    exposed_comm_us_p90: float | None
    step_us_p50: float
    step_us_p90: float
    samples_per_s: float | None  # all ranks, from the median step; None: a step of 0 us has no rate
    other_us_p50: float | None = None  # None: train, or an older file
    other_us_p90: float | None = None
    status: str = "ok"
    error: str | None = None
    telemetry: dict[str, float] | None = None  # --monitor: averages over the whole run (rank 0's host)
    run_id: str = ""
    timestamp: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION
    # kind predicted: the step's 80% interval [low, high] in us (docs/model.md), from a fitted hardware file's
    # resamples or, without a fit, the published corpus's calibration; interval_source says which
    step_interval_us: list[float] | tuple[float, float] | None = None
    interval_source: str | None = None
    estimate: str | None = None  # kind predicted: what step_us_p50 is, CALIBRATED_ESTIMATE or RAW_ESTIMATE
    raw_step_us: float | None = None  # kind predicted: the cost model's own step, before any calibration
    # a CPU replay: bytes allreduced per second of the CPU its communication threads used (what they take
    # from the compute when a rank has no spare core; docs/model.md, "Terms the model counts")
    comm_cpu_gbps: float | None = None
    setup: str = "ddp"  # the training setup (proxies/setups.py) and its settled knobs; older files: ddp
    knobs: dict | None = None
    layout: dict | None = None  # proxy --layout: the parallel layout (proxies/parallelism.py to_dict)
    schedule: bool | None = None  # as a Result's: what the backend could do (None: readers look it up by name)
    timing: str | None = None


@dataclass(frozen=True)
class ValidateRecord(Record):
    """`proxy --validate`: the proxy's median step against real training's, appended to the proxy's file."""
    RECORD: ClassVar[str] = "validate"
    model: str
    world_size: int
    batch: int  # per rank
    proxy_step_us: float  # medians over the measured steps
    train_step_us: float
    error: float  # (proxy - train) / train
    train_json: str  # the training run's own file
    run_id: str = ""  # the proxy run's
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class ScalingRecord(Record):
    """`predict-scaling`: one GPU count of one algorithm, predicted by the cost model."""
    RECORD: ClassVar[str] = "scaling"
    model: str
    hardware: str
    batch: int  # per GPU
    compute: str  # where the compute time per step came from
    gpus: int
    nodes: int
    gpus_per_node: int
    algorithm: str
    step_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    samples_per_s: float  # all GPUs
    speedup: float  # vs the same setup's 1-GPU throughput
    linearity: float  # throughput(N) / (N x throughput(1))
    acc_ratio: float | None = None  # the candidate's throughput / the baseline's (candidate rows only)
    baseline: str | None = None
    candidate: str | None = None
    # `nccl` rows on 2+ GPUs: what NCCL runs per bucket size, [{nbytes, buckets, algorithm, protocol, channels,
    # time_us}] (NCCL 2.20.3's tuning model, commbench/costmodel/nccl_tuning.py)
    nccl_choices: list[dict] | tuple[dict, ...] | None = None
    setup: str = "ddp"  # the training setup (proxies/setups.py) and its settled knobs; older files: ddp
    knobs: dict | None = None
    kind: str = "predicted"
    run_id: str = ""
    timestamp: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION
    # a fitted hardware file (its jackknife+ refits): the step's 80% interval [low, high] in us, and the
    # throughput and linearity at its ends; null for a preset, a level the fit did not measure, or `nccl`
    step_interval_us: list[float] | tuple[float, float] | None = None
    samples_per_s_interval: list[float] | tuple[float, float] | None = None
    linearity_interval: list[float] | tuple[float, float] | None = None
    straggler_us: float = 0.0  # the step's expected wait for its slowest rank (predict-scaling --jitter-from)
    interval_source: str | None = None  # "fit resamples" (the fit's jackknife+) or "corpus calibration" (no fit)
    # The estimate (step_us, samples_per_s, speedup, linearity) is the calibrated one where `estimate` is
    # CALIBRATED_ESTIMATE (the raw linearity moved by `linearity_offset`, the corpus's median error); the cost
    # model's own figures, before any calibration, are the raw_* fields. None: a file from before 2026-11-27.
    estimate: str | None = None  # CALIBRATED_ESTIMATE or RAW_ESTIMATE
    raw_step_us: float | None = None
    raw_samples_per_s: float | None = None
    raw_linearity: float | None = None
    linearity_offset: float | None = None  # calibrated minus raw linearity (fractions: 0.01 = 1 point)
    step_terms: dict | None = None  # the step terms applied, {name: {value, source}} (commbench/step_terms.py)


@dataclass(frozen=True)
class LayoutRecord(Record):
    """`predict-scaling --layout`: one parallel layout of a transformer, predicted by the cost model."""
    RECORD: ClassVar[str] = "layout"
    model: str
    hardware: str
    gpus: int
    gpus_per_node: int
    layout: dict  # proxies.parallelism.Parallelism.to_dict(): its name, degrees, setup, schedule, micro-batches
    microbatch: int  # sequences
    seq_len: int
    tflops: float  # the compute rate a GPU achieves
    checkpointing: str
    algorithm: str
    step_us: float
    compute_us: float
    tokens_per_s: float  # all GPUs
    mfu: float | None  # null: the hardware file gives no peak rate
    bubble: float
    comm_us: dict  # per dimension (tp, cp, ep, pp, dp): its calls' time per step on the busiest rank
    exposed_us: dict  # per dimension: what the step waited for
    memory_nbytes: dict  # the fullest GPU's: parameters, gradients, optimizer, activations, buffers, total
    fits: bool | None  # in the hardware's device memory (None: the file gives none)
    acc_ratio: float  # tokens/s against the baseline layout's
    baseline: str
    kind: str = "predicted"
    run_id: str = ""
    timestamp: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION


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


RECORD_TYPES: dict[str, type[Record]] = {cls.RECORD: cls for cls in (
    Result, SweepSummary, StepRecord, ProxyResult, ValidateRecord, ScalingRecord, LayoutRecord, CompareRecord)}
