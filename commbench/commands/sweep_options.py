"""`commbench sweep`'s command line as one frozen value, built once from click's parameters: the rest of the
command (commands/sweep.py) reads typed fields, never a dict of options. Each field is the option's
destination name; an option added to the command without its field here fails `from_click` at once. The
backend's, the ranks' and the output's options are the base's (commands/helpers/ranks_options.py), shared with proxy."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from commbench.commands.helpers.ranks_options import RanksOptions


@dataclass(frozen=True, kw_only=True)
class SweepOptions(RanksOptions):
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
    nccl_tests_rows: bool = False
    # the GPU backends' own choices (the rest of the backend's are the base's)
    cuda_mode: str = "auto"
    graph: bool = False
    # outputs beside the base's --json
    csv_path: str | None = None
    append: bool = False

    @classmethod
    def from_click(cls, params: dict[str, Any]) -> SweepOptions:
        """The options from click's parameters (a TypeError names an option without a field)."""
        return cls(**params)

    @classmethod
    def names(cls) -> set[str]:
        return {f.name for f in fields(cls)}
