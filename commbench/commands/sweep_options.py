"""`commbench sweep`'s command line as one frozen value, built once from click's parameters: the rest of the
command (commands/sweep.py) reads typed fields, never a dict of options. Each field is the option's
destination name; an option added to the command without its field here fails `from_click` at once."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class SweepOptions:
    # what runs: sizes, collectives, data
    sizes: str | None = None  # --sizes as given (None: the backend's default range)
    factor: float | None = None
    step: str | None = None
    collective_names: tuple[str, ...] = ("allreduce",)  # -c as given (repeated, comma lists, `all`)
    root: int = 0
    splits: str = "uniform"
    dtype: str = "float32"
    op: str = "sum"
    placement: str = "both"
    # how points are timed
    warmup: int | None = None
    iters: int | None = None
    min_time: float = 0.2  # seconds
    rank_agg: str = "max"
    stat: str = "mean"
    skip_iters: int = 0
    show_p99: bool = False
    timestamps: bool = False
    memory_report: bool = False
    misalign_nbytes: int = 0
    blocking: str = "0"  # click's choice: "0", "1" or "3"
    check: bool = True
    monitor: bool = False
    nccl_tests_rows: bool = False
    # what runs the calls (settled by the backend's class: commands/backend_options.py)
    backend: str = "torch"
    algorithm: str = "auto"
    tuning: str | None = None
    cuda_mode: str = "auto"
    graph: bool = False
    hw: str | None = None
    torch_backend: str = "auto"
    device: str = "auto"
    # the ranks and their layout
    topology: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    nprocs: int | None = None
    oversubscribe: bool = False
    launcher: str = "auto"
    emulate: str | None = None
    link: str | None = None
    timeout_s: float = 300.0
    # outputs
    json_path: str | None = None
    csv_path: str | None = None
    append: bool = False
    force: bool = False

    @classmethod
    def from_click(cls, params: dict[str, Any]) -> SweepOptions:
        """The options from click's parameters (a TypeError names an option without a field)."""
        return cls(**params)

    @classmethod
    def names(cls) -> set[str]:
        return {f.name for f in fields(cls)}
