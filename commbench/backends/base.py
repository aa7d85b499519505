"""The narrow interface the harness drives; every backend implements it.

A backend owns buffers and runs one collective call; the harness (bench.py) does
the sweeping, warm-up, timing loop, checking and aggregation, once for all
backends. Buffers are opaque to the harness: it moves host (NumPy) values in and
out through `upload`/`download`, so a backend may keep them in torch tensors,
CuPy arrays or shared memory.

The control plane (`gather`, `agree_max`, `gather_objects`) carries a few numbers
between ranks (iteration counts, per-iteration times, error counts); it is not
timed and never shares a stream with the measured traffic. Every backend holds one
(`control`, backends/control.py) rather than inheriting it.
"""
from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from commbench.backends.registry import names_where
from commbench.collectives import DType

# The errors a backend raises are floor 1's, where the job frame maps them to exit codes; the
# backends import them from here, with the rest of the interface they implement.
from commbench.errors import BackendError, OutOfMemory  # noqa: F401 - OutOfMemory: raised by alloc()


@dataclass(frozen=True)
class BackendConfig:
    """What a backend reads to start on a rank. The sweep's and the proxy's configs each hold one
    (their `backend` field), settled by the backend's class before any rank starts."""
    backend: str = "torch"
    torch_backend: str = "auto"  # torch: gloo, nccl, or auto (gloo on CPU, NCCL on GPU)
    device: str = "auto"
    algorithm: str = "auto"  # schedule backends: a name in commbench/algorithms.py's TABLE, or auto
    topology: str | None = None  # NODESxRANKS; None: the launcher's layout (or one node)
    nprocs: int | None = None  # ranks in this process's job (sim and cuda: virtual ranks)
    hw: str | None = None  # sim: hardware file or preset whose cost model times the calls
    cuda_mode: str = "auto"  # cuda: virtual, peer or ipc (auto: ipc under a launcher, else peer or virtual)
    graph: bool = False  # cupy/cuda: the timed calls captured in one CUDA graph and replayed (nccl-tests -G)
    timeout_s: float = 300.0  # the rendezvous and every wait for a peer; the job frame's timeout too
    tuning: str | None = None  # schedule backends: the tuning file `auto` follows (None: the shipped table, if any)


class RanksConfig:
    """What the frozen config of a command that runs ranks shares (SweepConfig, ProxyConfig): it holds one
    BackendConfig (`backend`), travels to the ranks as JSON, and its run header writes it flat, the
    backend's options beside the command's own, as headers have always been written (readers look up
    config.algorithm, config.stat, config.compute)."""
    backend: BackendConfig
    HEADER_BACKEND_FIELDS: ClassVar[tuple[str, ...] | None] = None  # the backend's options a header holds; None: all

    @property
    def timeout_s(self) -> float:
        """The job frame's timeout: the backend's (its rendezvous and every wait for a peer)."""
        return self.backend.timeout_s

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Any:
        fields = json.loads(text)
        fields["backend"] = BackendConfig(**fields["backend"])
        tuples = {f.name for f in dataclasses.fields(cls) if str(f.type).startswith("tuple")}  # JSON made them lists
        return cls(**{k: tuple(v) if k in tuples and isinstance(v, list) else v for k, v in fields.items()})

    def header_fields(self) -> dict[str, Any]:
        """The run header's `config`: one flat dict."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "backend"}
        names = self.HEADER_BACKEND_FIELDS or [f.name for f in dataclasses.fields(self.backend)]
        return {**own, **{name: getattr(self.backend, name) for name in names}}


class Backend(ABC):
    """One process's view of a communicator: `rank` of `world_size`."""

    name: str  # commbench backend name (torch, shm, ...)
    library: str  # what actually runs the collective (gloo, nccl, a schedule)
    device: str  # cpu or cuda
    rank: int
    world_size: int
    control: Any  # the control plane: control.GroupControl (gloo) or control.LocalControl (one process)
    timed: bool = True  # False: the backend cannot time calls (sim without a cost model)
    kind: str = "measured"  # what its Results are: measured, or predicted (sim)
    # Capabilities: what commands ask instead of switching on backend names.
    runs_schedules: bool = False  # runs commbench's own algorithms (--algorithm, --topology)
    needs_gpu: bool = False  # needs CuPy and a CUDA device
    captures_graphs: bool = False  # --graph: timed calls captured in one CUDA graph
    has_cuda_modes: bool = False  # --cuda-mode: where the ranks' buffers live
    uses_hw: bool = False  # --hw: calls timed by the cost model instead of measured
    launches_async: bool = False  # a call returns a work handle before the data moved (DDP-like overlap)
    runs_rank_groups: bool = False  # collectives on groups of ranks (the sharded setups' gathers and scatters)
    makes_ddp_calls: bool = False  # its calls are those DDP training makes (proxy --validate compares the two)
    one_host: bool = False  # every rank maps every other's memory: one node only (shm)
    default_sizes: str = "1K-64M"  # the sweep's sizes when --sizes is not given
    max_virtual_ranks: int | None = None  # ranks one process can step through (sim), None: no such limit

    @classmethod
    def create(cls, cfg: BackendConfig, launch: Any) -> Backend:
        """Build the backend on this rank (each backend reads what it needs)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- before any rank starts

    @classmethod
    def settle(cls, cfg: BackendConfig, launcher: str | None) -> BackendConfig:
        """Refuse options this backend does not take (BackendError, one line) and resolve its
        `auto` choices for a job started by `launcher` (None: commbench on its own)."""
        if cfg.graph and not cls.captures_graphs:
            raise BackendError(f"--graph captures CUDA work in a graph: use it with --backend "
                               f"{' or '.join(names_where('captures_graphs'))}")
        if cfg.cuda_mode != "auto" and not cls.has_cuda_modes:
            raise BackendError("--cuda-mode only applies to --backend cuda (where its ranks' buffers live)")
        if cfg.hw and not cls.uses_hw:
            raise BackendError("--hw times the sim backend's calls; other backends measure theirs")
        if cfg.tuning and not cls.runs_schedules:
            raise BackendError(f"--tuning chooses among commbench's own algorithms: use it with --backend "
                               f"{', '.join(names_where('runs_schedules'))}")
        if cfg.tuning:
            from commbench.tuning import TuningError, for_backend

            try:
                for_backend(cfg.tuning, cfg.backend, "")
            except TuningError as exc:
                raise BackendError(str(exc)) from None
        if not cls.runs_schedules and (cfg.algorithm != "auto" or cfg.topology):
            raise BackendError(f"--algorithm/--topology choose commbench's own algorithms: use them with --backend "
                               f"{', '.join(names_where('runs_schedules'))} (--backend {cfg.backend} runs the "
                               f"library's)")
        return cfg

    @classmethod
    def in_process(cls, cfg: BackendConfig) -> bool:
        """Every rank lives in this process (nothing to spawn or join)."""
        return False

    @classmethod
    def resolve_device(cls, cfg: BackendConfig) -> tuple[str, str]:
        """(device, library) for `--device`; a CPU backend by default."""
        return cpu_only(cfg)

    @classmethod
    def default_world(cls, cfg: BackendConfig, device: str) -> int:
        """Ranks to spawn when neither --nprocs nor a launcher says."""
        return 2

    @classmethod  # noqa: B027 - optional hook: accepts every request unless overridden
    def check_request(cls, cfg: BackendConfig, library: str, collectives: list[str], dtype: DType, op: str,
                      world: int) -> None:
        """Refuse collectives, dtypes and ops this backend cannot run (BackendError, one line)."""

    # ---------------------------------------------------------------- the run's header

    def setup_text(self) -> str:
        """What runs the calls, for the table's first line."""
        return f"{self.library} on {self.device}"

    def header_notes(self, collectives: tuple[str, ...], placements: tuple[str, ...], hw: str | None) -> list[str]:
        """Comment lines the table's header adds for this backend."""
        return []

    def header_fields(self) -> dict[str, Any]:
        """Fields the run's header record adds for this backend (shm: the planner's values)."""
        return {}

    @property
    def local_ranks(self) -> list[int]:
        """Ranks whose buffers this process holds: its own, or all of them (sim)."""
        return [self.rank]

    def device_memory(self) -> dict[str, int]:
        """What the device's allocator reports of this rank's buffers (name_bytes: value), for
        sweep --memory-report (nccl-tests -M); {} on the CPU, where the host's figure is all there is."""
        return {}

    def rank_view(self, buffer: Any, start_of: Callable[[int], int], count: int) -> Any:
        """A view whose offset depends on the rank (in-place allgather / reduce_scatter layouts)."""
        return self.view(buffer, start_of(self.rank), count)

    def describe(self) -> dict[str, Any]:
        """What ran the last prepared call: {"algorithm": name, "steps": rounds} for schedules."""
        return {"algorithm": None, "steps": None}

    def end_point(self, failed: bool = False) -> None:  # noqa: B027 - optional hook: nothing to release by default
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
        """A zero-argument callable that issues one collective call, as bare as possible. alltoallv's
        call also gets `splits=` (collectives.Plan.splits): only backends that run alltoallv take it."""

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

    # Control plane (backends/control.py): a few numbers and objects between ranks, never timed.

    def gather(self, values: np.ndarray) -> np.ndarray | None:
        """float64 vectors of equal length from every rank, stacked on rank 0."""
        return self.control.gather(values)

    def agree_max(self, values: np.ndarray) -> np.ndarray:
        """Element-wise maximum over ranks, on every rank."""
        return self.control.agree_max(values)

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """One picklable object per rank, as a list on rank 0."""
        return self.control.gather_objects(obj)

    def close(self) -> None:  # noqa: B027 - optional hook: nothing to release by default
        """Release the communicator."""


def cpu_only(cfg: BackendConfig) -> tuple[str, str]:
    """(device, library) of a backend that runs commbench's schedules on the CPU."""
    if cfg.device == "cuda":
        raise BackendError(f"--backend {cfg.backend} runs on the CPU; GPUs: --backend torch, "
                           f"{' or '.join(names_where('needs_gpu'))}")
    return "cpu", "schedule"
