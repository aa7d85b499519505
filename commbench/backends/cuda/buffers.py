"""A job's GPU memory as the cuda backends hold it: one `Allocation` per rank of every buffer (its device
address as this process sees it; in ipc mode a peer's arrives through its IPC handle) and the `GpuBuffer`
a schedule reads and writes, a range of elements of each rank's allocation (commbench/backends/cuda/sched.py
allocates them, ipc.py shares them between processes). Nothing here touches a GPU."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from commbench.collectives import DType


@dataclass
class Allocation:
    """One allocation per rank of the job; `bases` holds each rank's device address as
    this process sees it (peers' arrive through IPC handles in ipc mode)."""
    seq: int
    bases: dict[int, int] = field(default_factory=dict)
    handle: bytes | None = None  # ipc: this rank's cudaIpcMemHandle
    memory: Any = None  # ipc: the unpooled cupy.cuda.Memory behind this rank's array


@dataclass
class GpuBuffer:
    """Elements [offsets[r], offsets[r] + count) of every rank's allocation; `arrays` are
    the local ranks' CuPy views of them."""
    arrays: dict[int, Any]
    alloc: Allocation
    offsets: dict[int, int]
    count: int
    dtype: DType

    def pointer(self, rank: int) -> int:
        return self.alloc.bases[rank] + self.offsets[rank] * self.dtype.itemsize
