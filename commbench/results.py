"""Results: every record commbench writes, one flat, versioned JSON line each, flushed as it completes.

A sweep writes `header`, one `result` per collective x size x placement, then `summary`; proxy
and train runs write `step` records and a `proxy` summary (and `validate`); predict-scaling
writes `scaling`, compare `compare`. Every type but the free-form header is a dataclass here
and goes through ResultSink, which fsyncs each line (a crash loses nothing already written)
and puts results in CSV too. Results keep their raw per-iteration times beside the
percentiles (pack_times, raw_times). docs/results.md describes every field.
"""
from __future__ import annotations

import base64
import csv
import dataclasses
import json
import os
import time
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar

import numpy as np

from commbench import collectives as C
from commbench.environment import local_environment, software_versions  # noqa: F401 - re-exported

SCHEMA_VERSION = 1
RAW_TIMES_INLINE_MAX = 64  # up to this many per-iteration times stay a plain JSON list; more are packed
RAW_TIMES_ENCODING = "float32-zlib-base64"


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
    time_us: float | None  # per-rank mean over iterations, aggregated across ranks; None: not timed
    algbw_gbps: float | None
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


RESULT_FIELDS = [f.name for f in dataclasses.fields(Result)]


def percentiles_us(per_iteration_us: np.ndarray) -> dict[str, float | None]:
    """p50, p90, p99, min and max of per-iteration times (all None when nothing was timed)."""
    if per_iteration_us.size == 0:
        return dict.fromkeys(("p50_us", "p90_us", "p99_us", "min_us", "max_us"))
    p50, p90, p99 = np.percentile(per_iteration_us, [50, 90, 99])
    return {"p50_us": float(p50), "p90_us": float(p90), "p99_us": float(p99),
            "min_us": float(per_iteration_us.min()), "max_us": float(per_iteration_us.max())}


def point_result(plan: C.Plan, *, dtype: str, op: str | None, placement: str, nnodes: int, backend: str,
                 library: str, device: str, time_us: float | None, per_iteration_us: Any = None, warmup: int = 0,
                 rank_agg: str = "-", wrong: int | None = None, **extra: Any) -> Result:
    """The Result of one point of `plan`: sizes and root from the plan, algbw and busbw from `time_us`,
    iters, the percentiles and the raw times from `per_iteration_us` (each iteration already combined
    over ranks; None or empty: not timed). `extra`: the optional Result fields (algorithm, steps,
    telemetry, kind, run_id)."""
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


# ---------------------------------------------------------------- raw per-iteration times


def pack_times(per_iteration_us: Any) -> list[float] | dict[str, Any] | None:
    """What a record keeps of its per-iteration times: up to RAW_TIMES_INLINE_MAX finite values as a plain
    list (exact), more as little-endian float32, zlib-compressed, base64 (about 4 bytes a value; float32
    keeps 7 significant digits); None when nothing was timed."""
    if per_iteration_us is None:
        return None
    values = np.asarray(per_iteration_us, dtype=float).ravel()
    if values.size == 0:
        return None
    if values.size <= RAW_TIMES_INLINE_MAX and np.isfinite(values).all():
        return [float(v) for v in values]
    data = zlib.compress(values.astype("<f4").tobytes(), 6)
    return {"encoding": RAW_TIMES_ENCODING, "count": int(values.size), "data": base64.b64encode(data).decode("ascii")}


def raw_times(record: Any) -> np.ndarray:
    """The per-iteration times (us) a result keeps, from a record dict (JSON Lines or a CSV row) or a
    Result, in iteration order; empty when it keeps none (a file written before they were kept, a point
    not timed, a prediction). ValueError for an encoding this version does not know."""
    packed = record.get("iteration_times_us") if isinstance(record, dict) else getattr(record, "iteration_times_us",
                                                                                          None)
    if isinstance(packed, str):  # a CSV cell holds the JSON form
        packed = json.loads(packed) if packed.strip() else None
    if packed is None:
        return np.empty(0)
    if isinstance(packed, list):
        return np.asarray(packed, dtype=float)
    if packed.get("encoding") != RAW_TIMES_ENCODING:
        raise ValueError(f"iteration_times_us: unknown encoding {packed.get('encoding')!r}")
    values = np.frombuffer(zlib.decompress(base64.b64decode(packed["data"])), dtype="<f4").astype(float)
    if values.size != packed["count"]:
        raise ValueError(f"iteration_times_us: {values.size} values, the record says {packed['count']}")
    return values


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
    avg_busbw_gbps: float  # mean over the points
    telemetry: dict[str, float] | None = None  # --monitor: averages over the whole run
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class StepRecord(Record):
    """One step of a proxy, train or predicted run as it ends (rank 0's view)."""
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
    schema: int = SCHEMA_VERSION


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
    samples_per_s: float  # all ranks, from the median step
    status: str = "ok"
    error: str | None = None
    telemetry: dict[str, float] | None = None  # --monitor: averages over the whole run (rank 0's host)
    run_id: str = ""
    timestamp: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION


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
    verdict: str  # regression, improvement, same, only in base, only in new
    schema: int = SCHEMA_VERSION


# ---------------------------------------------------------------- writing and reading


class ResultSink:
    """Writes records to JSON Lines (and results to CSV too), flushing and fsyncing each line.

    `append` adds to an existing file instead of starting a new one (the CSV header is then written
    only into an empty file)."""

    def __init__(self, json_path: str | None = None, csv_path: str | None = None, append: bool = False):
        mode = "a" if append else "w"
        self._json: IO[str] | None = _open(json_path, mode)
        self._csv_file: IO[str] | None = _open(csv_path, mode)
        self._csv = csv.DictWriter(self._csv_file, RESULT_FIELDS) if self._csv_file else None
        if self._csv and self._csv_file.tell() == 0:
            self._csv.writeheader()
            self._csv_file.flush()

    def __enter__(self) -> ResultSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def header(self, record: dict[str, Any]) -> None:
        """The run's first line: free-form environment and configuration (docs/results.md)."""
        self._write_json({"record": "header", "schema": SCHEMA_VERSION, **record})

    def result(self, result: Result) -> None:
        self._write_json(result.to_dict())
        if self._csv:
            row = dataclasses.asdict(result)
            for name in ("telemetry", "iteration_times_us"):  # one JSON cell each
                row[name] = json.dumps(row[name]) if row[name] else None
            self._csv.writerow(row)
            self._csv_file.flush()

    def summary(self, summary: SweepSummary | dict[str, Any]) -> None:
        """The sweep's last line; a dict is written as given (the form callers used before SweepSummary)."""
        if isinstance(summary, SweepSummary):
            self.write(summary)
        else:
            self._write_json({"record": "summary", "schema": SCHEMA_VERSION, **summary})

    def write(self, record: Record) -> None:
        """Any record: one JSON line, flushed (a Result goes to the CSV file too)."""
        if isinstance(record, Result):
            self.result(record)
        else:
            self._write_json(record.to_dict())

    def write_all(self, records: Iterable[Record]) -> None:
        """Records computed all at once (compare, predict-scaling): written, then flushed and fsynced once."""
        for record in records:
            if isinstance(record, Result):
                self.result(record)
            else:
                self._write_json(record.to_dict(), sync=False)
        self._sync()

    def _write_json(self, record: dict[str, Any], sync: bool = True) -> None:
        if self._json:
            self._json.write(json.dumps(record, allow_nan=False, default=str) + "\n")
            if sync:
                self._sync()

    def _sync(self) -> None:
        if self._json:
            self._json.flush()
            os.fsync(self._json.fileno())

    def close(self) -> None:
        for handle in (self._json, self._csv_file):
            if handle and not handle.closed:
                handle.close()


def new_run_id() -> str:
    """12 hex digits naming one run, repeated in each of its records."""
    return uuid.uuid4().hex[:12]


def append_record(path: str, record: Record) -> None:
    """Add one record to the end of an existing JSON Lines file (e.g. `validate` after a proxy run)."""
    with ResultSink(path, append=True) as sink:
        sink.write(record)


def _open(path: str | None, mode: str = "w") -> IO[str] | None:
    if not path:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    return open(path, mode, encoding="utf-8", newline="")


def read_records(path: str) -> list[dict[str, Any]]:
    """All records of a JSON Lines results file (a truncated last line is skipped)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
