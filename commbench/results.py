"""Results: every record commbench writes, one flat, versioned JSON line each, flushed as it completes.

A sweep writes `header`, one `result` per collective x size x placement, then `summary`; proxy
and train runs write `step` records and a `proxy` summary (and `validate`); predict-scaling
writes `scaling`, compare `compare`. Every type but the free-form header is a dataclass here
and goes through ResultSink, which fsyncs each line (a crash loses nothing already written)
and puts results in CSV too. Results keep their raw per-iteration times beside the
percentiles (pack_times, raw_times). read_records reads a file back and checks every line
(check_record): a bad one is a RecordError naming the file and line. docs/results.md describes
every field.
"""
from __future__ import annotations

import base64
import contextlib
import csv
import dataclasses
import errno
import json
import math
import os
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar

import numpy as np

from commbench import collectives as C
from commbench.environment import local_environment, software_versions  # noqa: F401 - re-exported
from commbench.files import MAX_FIGURE, NotJson, UnreadableFile, lines, open_regular, parse_json

SCHEMA_VERSION = 1
RAW_TIMES_INLINE_MAX = 64  # up to this many per-iteration times stay a plain JSON list; more are packed
RAW_TIMES_ENCODING = "float32-zlib-base64"
# A predicted record's interval_source: where its interval came from (docs/model.md).
FIT_PROVENANCE = "fit resamples"  # the fit's jackknife+ resamples
CORPUS_PROVENANCE = "corpus calibration"  # no fit: the published corpus's calibration
PROVENANCE_LABELS = {FIT_PROVENANCE: "fit", CORPUS_PROVENANCE: "corpus"}  # the word beside an interval in a table


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


MAX_RAW_TIMES = 10**7  # --iters' own bound: a packed record never holds more (40 MB unpacked)


def raw_times(record: Any) -> np.ndarray:
    """The per-iteration times (us) a result keeps, from a record dict (JSON Lines or a CSV row) or a
    Result, in iteration order; empty when it keeps none (a file written before they were kept, a point
    not timed, a prediction). ValueError for an encoding this version does not know."""
    packed = record.get("iteration_times_us") if isinstance(record, dict) else getattr(record, "iteration_times_us",
                                                                                          None)
    if isinstance(packed, str):  # a CSV cell holds the JSON form
        packed = parse_json(packed) if packed.strip() else None
    if packed is None:
        return np.empty(0)
    if isinstance(packed, list):
        return np.asarray(packed, dtype=float)
    if not isinstance(packed, dict) or packed.get("encoding") != RAW_TIMES_ENCODING:
        what = packed.get("encoding") if isinstance(packed, dict) else packed
        raise ValueError(f"iteration_times_us: unknown encoding {what!r}")
    count, data = packed.get("count"), packed.get("data")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_RAW_TIMES:
        raise ValueError(f"iteration_times_us: count must be a whole number in 1..{MAX_RAW_TIMES:,d}, "
                         f"not {json_kind(count)}")
    if not isinstance(data, str):
        raise ValueError(f"iteration_times_us: data must be a string, not {json_kind(data)}")
    try:  # at most what `count` values take, and one byte more to see a file that holds more
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(data, validate=True), 4 * count + 1)
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"iteration_times_us: data is not {RAW_TIMES_ENCODING} ({exc})") from None
    if len(raw) != 4 * count:
        held = "more" if len(raw) > 4 * count else f"{len(raw) / 4:g}"
        raise ValueError(f"iteration_times_us: {held} values, the record says {count}")
    return np.frombuffer(raw, dtype="<f4").astype(float)


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
    avg_busbw_gbps: float  # mean over the points of their busbw_gbps (that of the statistic `stat`)
    telemetry: dict[str, float] | None = None  # --monitor: averages over the whole run
    schema: int = SCHEMA_VERSION
    stat: str = "mean"  # the statistic the points' times are (sweep --stat)


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
    # a CPU replay: bytes allreduced per second of the CPU its communication threads used (what they take
    # from the compute when a rank has no spare core; docs/model.md, "Terms the model counts")
    comm_cpu_gbps: float | None = None
    setup: str = "ddp"  # the training setup (proxies/setups.py) and its settled knobs; older files: ddp
    knobs: dict | None = None


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
    # time_us}] (NCCL 2.20.3's tuning model, analysis/nccl_tuning.py)
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


# ---------------------------------------------------------------- writing and reading


class OutputError(OSError):
    """An output file that cannot be opened or written (a full disk, no permission): one line,
    `cannot write PATH: reason`. An OSError, so whatever handles those handles it."""

    def __init__(self, path: str, exc: OSError):
        super().__init__(exc.errno, exc.strerror or str(exc), path)

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


class ResultSink:
    """Writes records to JSON Lines (and results to CSV too), flushing and fsyncing each line.

    `append` adds to an existing file instead of starting a new one (the CSV header is then written
    only into an empty file). A write that fails (a full disk) raises OutputError; every line
    written before it stays in the file."""

    def __init__(self, json_path: str | None = None, csv_path: str | None = None, append: bool = False):
        mode = "a" if append else "w"
        self._json_path, self._csv_path = json_path, csv_path
        self._json: IO[str] | None = _open(json_path, mode)
        try:
            self._csv_file: IO[str] | None = _open(csv_path, mode)
        except OutputError:
            self.close()
            raise
        self._csv = csv.DictWriter(self._csv_file, RESULT_FIELDS) if self._csv_file else None
        if self._csv and self._csv_file.tell() == 0:
            with _writing(csv_path):
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
            with _writing(self._csv_path):
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
            line = json.dumps(record, allow_nan=False, default=str) + "\n"
            with _writing(self._json_path):
                self._json.write(line)
            if sync:
                self._sync()

    def _sync(self) -> None:
        if self._json:
            with _writing(self._json_path):
                self._json.flush()
                _fsync(self._json)

    def close(self) -> None:
        """Close the files; a buffer that cannot be flushed any more (a full disk) raises OutputError once."""
        failure = None
        for handle, path in ((self._json, self._json_path), (self._csv_file, self._csv_path)):
            if handle and not handle.closed:
                try:
                    handle.close()
                except OSError as exc:
                    failure = failure or OutputError(path, exc)
        if failure:
            raise failure


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
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if mode == "a" and os.path.isfile(path):  # a run killed mid-line: its fragment goes before this run's lines
            from commbench.files import drop_torn_line

            with open(path, "r+b") as handle:
                drop_torn_line(handle)
        return open(path, mode, encoding="utf-8", newline="")
    except OSError as exc:
        raise OutputError(path, exc) from exc


@contextlib.contextmanager
def _writing(path: str | None):
    """Turns an OSError while writing `path` into OutputError (one line naming the file)."""
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(path or "?", exc) from exc


def _fsync(handle: IO[str]) -> None:
    """fsync, where the file supports it (a pipe, /dev/null or a terminal does not: nothing to sync)."""
    try:
        os.fsync(handle.fileno())
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise


# ---------------------------------------------------------------- reading, every line checked


class RecordError(ValueError):
    """A results file that cannot be read as records: one line naming the file and the line."""


RECORD_TYPES: dict[str, type[Record]] = {cls.RECORD: cls for cls in (
    Result, SweepSummary, StepRecord, ProxyResult, ValidateRecord, ScalingRecord, CompareRecord)}

# The fields commbench's readers (fit, report, compare) need in a record. A record may lack any other
# (a hand-made file, one converted from another tool): readers take it as its default or as null.
REQUIRED_FIELDS = {
    "result": ("collective", "backend", "library", "dtype", "placement", "world_size", "nbytes"),
    "proxy": ("kind", "model", "backend", "library", "world_size", "batch", "step_us_p50"),
    "scaling": ("model", "hardware", "batch", "compute", "gpus", "algorithm", "samples_per_s", "speedup",
                "linearity"),
}
AT_LEAST_ONE = ("world_size", "nnodes", "gpus", "nodes", "gpus_per_node", "batch")  # counts of things, >= 1
PLACEMENT_NAMES = ("out-of-place", "in-place")

_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {  # an annotation's base name: test, and its name
    "None": (lambda v: v is None, "null"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "Any": (lambda v: True, "anything"),
}


def json_kind(value: Any) -> str:
    """What a JSON value is, for an error message: 'the string "8"', 'a list', 'null', '2.7'."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"the string {json.dumps(value[:40])}"
    return "a list" if isinstance(value, list) else "an object"


def check_record(record: Any) -> str | None:
    """What is wrong with one record read from a file (None: nothing). Every field a record type
    declares must hold its declared type where present (numbers finite; an int field a whole number),
    the readers' fields (REQUIRED_FIELDS) must be present, counts at least 1, and a result's numbers
    non-negative, its collective, dtype and placement ones commbench knows. The header is free-form;
    a record type this version does not know is left alone (a newer file)."""
    if not isinstance(record, dict):
        return f"not a JSON object but {json_kind(record)}: every line of a results file is one record"
    bad = _non_finite(record)
    if bad:
        return f"{bad[0]} is {bad[1]}: only finite numbers are accepted" if bad[1] in ("NaN", "infinite") else \
            f"{bad[0]} is {bad[1]}: no count or size of a run comes near it"
    kind = record.get("record")
    if not isinstance(kind, str):
        return "no 'record' field naming the record type" if kind is None else \
            f"'record' must be a string, not {json_kind(kind)}"
    cls = RECORD_TYPES.get(kind)
    if cls is None:
        return None
    missing = [name for name in REQUIRED_FIELDS.get(kind, ()) if name not in record]
    if missing:
        return f"{kind} record: missing field {missing[0]!r}"
    for f in dataclasses.fields(cls):
        if f.name in record:
            problem = _type_problem(str(f.type), record[f.name])
            if problem:
                return f"{kind} record: {f.name} must be {problem}, not {json_kind(record[f.name])}"
    return _value_problem(kind, record)


def _type_problem(annotation: str, value: Any) -> str | None:
    """None when `value` fits the dataclass annotation (e.g. 'float | None'), else what it should be."""
    kinds = [part.strip().split("[")[0] for part in annotation.split("|")]
    if any(_KINDS[k][0](value) for k in kinds if k in _KINDS) or not any(k in _KINDS for k in kinds):
        return None
    return " or ".join(_KINDS[k][1] for k in kinds if k in _KINDS)


def _value_problem(kind: str, record: dict[str, Any]) -> str | None:
    for name in AT_LEAST_ONE:
        value = record.get(name)
        if isinstance(value, (int, float)) and value < 1:
            return f"{kind} record: {name} must be at least 1, not {value!r}"
    if kind == "scaling" and not record["speedup"] > 0:
        return f"scaling record: speedup must be positive, not {record['speedup']!r}"
    if kind != "result":
        return None
    for name in RESULT_FIELDS:
        value = record.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            return f"result record: {name} cannot be negative ({value!r})"
    known = (("collective", C.COLLECTIVES), ("dtype", C.DTYPES), ("placement", PLACEMENT_NAMES))
    for name, names in known:
        if record[name] not in names:
            return f"result record: unknown {name} {record[name]!r}; known: {', '.join(names)}"
    if isinstance(record.get("iteration_times_us"), dict):  # packed: unpacked here, bounded, so no reader fails
        try:
            raw_times(record)
        except ValueError as exc:
            return f"result record: {exc}"
    root = record.get("root")
    if root is not None and root >= record["world_size"]:
        return f"result record: root {root} is not a rank of {record['world_size']}"
    return None


LARGEST_INTEGER = 2**63 - 1  # what a count or size is stored in (int64); beyond it, float() and numpy overflow


def _non_finite(value: Any, where: str = "") -> tuple[str, str] | None:
    """(field path, 'NaN', 'infinite', 'above 2**63' or 'above 1e30') of the first number that is not
    finite or too large for any count, size, time or rate, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the record", "NaN" if math.isnan(value) else "infinite"
    if isinstance(value, int) and abs(value) > LARGEST_INTEGER:
        return where or "the record", "above 2**63"
    if isinstance(value, float) and abs(value) > MAX_FIGURE:
        return where or "the record", "above 1e30"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def read_records(path: str, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """All records of a JSON Lines results file, each line checked (check_record). Blank lines are
    ignored; a truncated last line (a run killed mid-write) is skipped, with `warn(message)`; any
    other bad line is one RecordError: 'PATH:LINE: what is wrong'."""
    records = []
    try:
        with open_regular(path) as handle:
            for number, raw in enumerate(lines(handle), 1):
                record = _parse_line(path, number, raw, warn)
                if record is not None:
                    records.append(record)
    except UnreadableFile as exc:
        raise RecordError(str(exc) if str(exc).startswith(path) else f"{path}: {exc}") from exc
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return records


def _parse_line(path: str, number: int, raw: bytes, warn: Callable[[str], None] | None) -> dict | None:
    if not raw.strip():
        return None
    try:
        record = parse_json(raw.rstrip(b"\r\n"))
    except NotJson as exc:
        if exc.decode_error and not raw.endswith(b"\n"):  # the last line, cut short
            if warn:
                warn(f"{path}:{number}: the last line is cut short (a run killed mid-write): skipped")
            return None
        raise RecordError(f"{path}:{number}: {exc}: a results file is JSON Lines, one record a line") from None
    problem = check_record(record)
    if problem:
        raise RecordError(f"{path}:{number}: {problem}")
    return record
