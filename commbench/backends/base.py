"""The narrow interface the harness drives; every backend implements it.

A backend owns buffers and runs one collective call; the harness (bench.py) does
the sweeping, warm-up, timing loop, checking and aggregation, once for all
backends. Buffers are opaque to the harness: it moves host (NumPy) values in and
out through `upload`/`download`, so a backend may keep them in torch tensors,
CuPy arrays or shared memory.

The control plane (`gather`, `agree_max`, `barrier`) carries a few numbers
between ranks (iteration counts, per-iteration times, error counts); it is not
timed and never shares a stream with the measured traffic.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np

from commbench.collectives import DType


class BackendError(RuntimeError):
    """The backend cannot run here or cannot run this request; the message is one line for the user."""


class OutOfMemory(BackendError):
    """Allocating or filling buffers for one size ran out of memory."""


class Backend(ABC):
    """One process's view of a communicator: `rank` of `world_size`."""

    name: str  # commbench backend name (torch, shm, ...)
    library: str  # what actually runs the collective (gloo, nccl, a schedule)
    device: str  # cpu or cuda
    rank: int
    world_size: int
    timed: bool = True  # False: the backend cannot time calls (sim without a cost model)
    kind: str = "measured"  # what its Results are: measured, or predicted (sim)

    @classmethod
    def create(cls, cfg: Any, launch: Any) -> "Backend":
        """Build the backend for a SweepConfig on this rank (each backend reads what it needs)."""
        raise NotImplementedError

    @property
    def local_ranks(self) -> list[int]:
        """Ranks whose buffers this process holds: its own, or all of them (sim)."""
        return [self.rank]

    def rank_view(self, buffer: Any, start_of: Callable[[int], int], count: int) -> Any:
        """A view whose offset depends on the rank (in-place allgather / reduce_scatter layouts)."""
        return self.view(buffer, start_of(self.rank), count)

    def describe(self) -> dict[str, Any]:
        """What ran the last prepared call: {"algorithm": name, "steps": rounds} for schedules."""
        return {"algorithm": None, "steps": None}

    def end_point(self, failed: bool = False) -> None:
        """Called after every point: release per-point resources (shared-memory segments).

        `failed`: the point raised; release only what is safe without the peers' help (a dead
        peer never arrives) and raise nothing, so the point's own error is what is reported."""

    @abstractmethod
    def unsupported(self, collective: str, dtype: DType, op: str | None, placement: str) -> str | None:
        """Why this combination cannot run here, or None if it can."""

    @abstractmethod
    def alloc(self, count: int, dtype: DType) -> Any:
        """A device buffer of `count` elements (raise OutOfMemory if it does not fit)."""

    @abstractmethod
    def view(self, buffer: Any, start: int, count: int) -> Any:
        """Elements [start, start + count) of `buffer`, sharing its memory."""

    @abstractmethod
    def upload(self, buffer: Any, values: np.ndarray, rank: int) -> None:
        """Copy host values (DType.host dtype) into rank `rank`'s part of `buffer`."""

    @abstractmethod
    def fill(self, buffer: Any, value: float) -> None:
        """Set every element of `buffer` to `value`."""

    @abstractmethod
    def download(self, buffer: Any, start: int, count: int, rank: int) -> np.ndarray:
        """Elements [start, start + count) of rank `rank`'s part of `buffer` as host values."""

    @abstractmethod
    def prepare(self, collective: str, send: Any, recv: Any, op: str | None, root: int,
                inplace: bool) -> Callable[[], None]:
        """A zero-argument callable that issues one collective call, as bare as possible."""

    @abstractmethod
    def time_iterations(self, call: Callable[[], None], iters: int) -> np.ndarray:
        """Run `call` `iters` times back to back; per-iteration times in microseconds,
        taken with the device's own clock (CUDA events on GPU, perf_counter on CPU)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for all work this rank issued to finish."""

    @abstractmethod
    def barrier(self) -> None:
        """All ranks arrive before any leaves (through the measured communicator)."""

    @abstractmethod
    def gather(self, values: np.ndarray) -> np.ndarray | None:
        """Control plane: float64 vectors of equal length from every rank, stacked on rank 0."""

    @abstractmethod
    def agree_max(self, values: np.ndarray) -> np.ndarray:
        """Control plane: element-wise maximum over ranks, on every rank."""

    @abstractmethod
    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Control plane: one picklable object per rank, as a list on rank 0."""

    def close(self) -> None:
        """Release the communicator."""


class LocalControlPlane:
    """The control plane of a backend whose ranks all live in this process (sim, cuda on one host
    process): every "rank" already sees every value."""

    def gather(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)[None, :]

    def agree_max(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def gather_objects(self, obj: Any) -> list[Any]:
        return [obj]


class DelegatedControlPlane:
    """The control plane carried by another backend (`self._control`, a gloo TorchBackend on the
    CPU): what the GPU backends use beside their NCCL or CUDA-IPC data path."""
    _control: Backend

    def barrier(self) -> None:
        self.synchronize()
        self._control.barrier()

    def gather(self, values: np.ndarray) -> np.ndarray | None:
        return self._control.gather(values)

    def agree_max(self, values: np.ndarray) -> np.ndarray:
        return self._control.agree_max(values)

    def gather_objects(self, obj: Any) -> list[Any] | None:
        return self._control.gather_objects(obj)
