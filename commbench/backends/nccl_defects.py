"""Known defects of the NCCL a GPU backend loads, said once on stderr where a run can meet them.

NCCL before 2.29.7 splits a one-rank reduction's elements over its blocks (at most 32) by floor division and
never writes the remainder, up to 31 elements at the end of the output (NVIDIA/nccl#1950; seen on an H100
with NCCL 2.28.9, docs/gpu.md). It takes that path for a one-rank average of floats: out of place the tail
keeps the output's sentinel and `#wrong` counts it; in place it keeps the input, which is a one-rank average.
Integers take another path and were right. The backends pass the collectives whose out-of-place output NCCL
writes itself (torch copies and reduces in place for allreduce and reduce).
"""
from __future__ import annotations

import sys

from commbench.collectives import DType
from commbench.environment import nccl_text

ONE_RANK_AVG_FIXED = 22907  # NCCL 2.29.7 fixed NVIDIA/nccl#1950
_said: set[str] = set()


def one_rank_avg_defect(version: int | None, world: int, op: str, dtype: DType, collectives, affected) -> str | None:
    """The warning for NVIDIA/nccl#1950 where this request can meet it, else None."""
    if world != 1 or op != "avg" or not dtype.is_float or not set(collectives) & set(affected):
        return None
    if version is None or version >= ONE_RANK_AVG_FIXED:
        return None
    return (f"NCCL {nccl_text(version)} leaves up to 31 elements at the end of a one-rank avg unwritten "
            "(NVIDIA/nccl#1950, fixed in 2.29.7): out of place #wrong counts them")


def say_once(note: str | None) -> None:
    """`note` on stderr as a warning, once per process (the request is checked once per collective)."""
    if note and note not in _said:
        _said.add(note)
        print(f"commbench: warning: {note}", file=sys.stderr)
