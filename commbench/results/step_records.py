"""The records of a model's training step: `step` and its run's `proxy` summary (proxy, train and `proxy --hw`
runs), `validate` (`proxy --validate`), and predict-scaling's `scaling` and `layout` rows. The sweep's records,
the base class and the constants the two share are in records.py; docs/results.md describes every field.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar

from commbench.results.records import SCHEMA_VERSION, Record


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
    other_us: float | None = None  # step - compute - exposed_comm [- calibration] (None: train, or an older file)
    schema: int = SCHEMA_VERSION
    calls_us: list[list[float]] | None = None  # a replay: rank 0's calls, [start, end] from the step's start
    traced_step: int | None = None  # `replay` of a trace: which traced step this one replays (from 0)
    issued: list[list] | None = None  # `replay`: rank 0's calls as issued, [collective, nbytes, dtype, group ranks]
    # a replay: rank 0's compute as it ran, [progress, wall] from the step's start (two marks of one progress where
    # it waited for a call); the compute's phases on the wall clock the calls are timed by (report's timeline)
    compute_marks_us: list[list[float]] | None = None
    layout: str | None = None  # proxy --layout: the parallel layout's name (tp2,ddp2)
    exposed_by_dim_us: dict[str, float] | None = None  # proxy --layout: rank 0's wait per dimension (pp: its bubble)
    # proxy --hw with the corpus calibration: what it adds to the cost model's step (step = compute + exposed_comm +
    # other + calibration); None: none applied (a measured step, a fit's prediction, or an older file)
    calibration_us: float | None = None


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
    calibration_us: float | None = None  # kind predicted: step_us_p50 - raw_step_us where calibrated, else None
    # a CPU replay: bytes allreduced per second of the CPU its communication threads used (what they take
    # from the compute when a rank has no spare core; docs/model.md, "Terms the model counts")
    comm_cpu_gbps: float | None = None
    setup: str = "ddp"  # the training setup (proxies/setups.py) and its settled knobs; older files: ddp
    knobs: dict | None = None
    layout: dict | None = None  # proxy --layout: the parallel layout (proxies/layouts/parallelism.py to_dict)
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
    # why the hardware file's predictions are not to be trusted (Hardware.doubts: a poor fit, a fit under load), a
    # line each; None: nothing said (or a file from before 2026-12-04). report marks scaling.png with them.
    hardware_doubts: list[str] | tuple[str, ...] | None = None


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
    memory_nbytes: dict  # the fullest GPU's: parameters, gradients, optimizer, activations, buffers (FSDP's gathered
    #                     parameters at the loss's peak), backward_buffers (its two layers gathered in the backward;
    #                     since 2026-12-04, when buffers stopped counting them where gradients are freed), total and
    #                     gradients_held (false: total is the larger of the loss's peak and the backward's end)
    fits: bool | None  # in the hardware's device memory (None: the file gives none)
    acc_ratio: float  # tokens/s against the baseline layout's
    baseline: str  # the top row's layout (until 2026-12-02: the first given)
    global_batch: int | None = None  # sequences per optimizer step, all GPUs (None: a file from before 2026-12-02)
    tflops_source: str | None = None  # "given"; "peak:fp32" / "peak:bf16" (optimistic); "compute block:DTYPE"
    kind: str = "predicted"
    run_id: str = ""
    timestamp: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION
