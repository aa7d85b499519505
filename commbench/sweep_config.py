"""The sweep's configuration: every option of `commbench sweep` (and `nccl-tests`) as one frozen
value that travels to every rank (as JSON in the environment of spawned ranks). The options a
backend reads are one BackendConfig inside it, settled by the backend's class before any rank
starts (commands/helpers/backend_options.py)."""
from __future__ import annotations

from dataclasses import dataclass

from commbench.backends.base import BackendConfig, RanksConfig

PLACEMENTS = ("out-of-place", "in-place")


@dataclass(frozen=True)
class SweepConfig(RanksConfig):
    """The sweep's options as they travel to every rank; `backend` is what the backend reads, settled
    by its class before any rank starts (commands/helpers/backend_options.py)."""
    collectives: tuple[str, ...] = ("allreduce",)
    sizes: tuple[int, ...] = (1 << 10,)
    dtype: str = "float32"
    op: str = "sum"
    # (dtype, op) of each pass over the sizes, in order, under one header and footer per collective
    # (`commbench nccl-tests -d all -o all -N 2`, as nccl-tests runs them in one job); empty: (dtype, op) once
    passes: tuple[tuple[str, str], ...] = ()
    splits: str = "uniform"  # alltoallv's per-peer counts, as given (commbench/splits.py)
    split_weights: tuple[tuple[float, ...], ...] = ()  # ... and as weights (rows: senders); (): uniform
    root: int = 0
    placements: tuple[str, ...] = PLACEMENTS
    warmup: int | None = None  # None: adaptive
    iters: int | None = None  # None: adaptive, to fill min_time_s
    min_time_s: float = 0.2
    min_iters: int = 5
    max_iters: int = 1000
    rank_agg: str = "max"
    stat: str = "mean"  # the table's time column: mean, p50 or min of the iterations (the JSON keeps all)
    check: bool = True
    backend: BackendConfig = BackendConfig()
    json_path: str | None = None
    csv_path: str | None = None
    append: bool = False  # --append: add to --json/--csv instead of starting them anew
    monitor: bool = False  # GPU (NVML) and host (psutil) telemetry, averaged over each point's timed calls
    nccl_tests_rows: bool = False  # `commbench nccl-tests`: rows of nccl-tests' 13 columns, nothing after them
    # `commbench nccl-tests NAME_perf`: its name, for nccl-tests' own lines around the table (its "# nThread ..."
    # header, `nccl_tests_header`, then "# Using devices" and a line a rank; "# Collective test concluded: NAME")
    nccl_tests_binary: str = ""
    nccl_tests_header: tuple[str, ...] = ()
    # nccl-tests 2.19's -K, -I, -S, -M, -u, -z (sweep's --skip-iters, --p99, --timestamps, --memory-report,
    # --misalign, --blocking): commbench/point_timing.py and docs/nccl-tests.md
    skip_iters: int = 0  # the first this many timed iterations are left out of every statistic
    show_p99: bool = False  # a p99 column beside each time
    timestamps: bool = False  # a UTC timestamp (the start of the timed calls) at the end of each row
    memory_report: bool = False  # each rank's memory at the end
    misalign_nbytes: int = 0  # every buffer starts this many bytes past its allocation's alignment
    blocking: int = 0  # point_timing.BLOCKING

    def __post_init__(self) -> None:
        # JSON (the way to the ranks) turns the pairs into lists: pairs again, so a config arrives unchanged
        object.__setattr__(self, "passes", tuple(tuple(pair) for pair in self.passes))
        object.__setattr__(self, "split_weights", tuple(tuple(row) for row in self.split_weights))
