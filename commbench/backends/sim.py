"""sim: every rank as NumPy buffers in one process, running commbench's schedules.

The simulated backend that tests and laptops use: `--nprocs 64 --topology 8x8`
needs no GPU, no network and one process. Results are checked like any backend's
(the harness fills and verifies every virtual rank). Its time is a prediction:
with `--hw FILE|PRESET` each call is timed by the analytic model (the schedule that
ran, costed round by round; records have kind `predicted`); without it the time
columns read `n/m` (not modelled) and the JSON carries the step count instead.

bfloat16 has no NumPy type: sim holds it as float32, which is exact for the
verifiable data but means sim does not reproduce bf16 rounding.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from commbench.backends.base import BackendError
from commbench.backends.control import LocalControl
from commbench.backends.schedule_base import ScheduleBackend
from commbench.collectives import DType
from commbench.files import shown
from commbench.launchers import LaunchInfo
from commbench.schedule import Schedule, run
from commbench.topology import Topology, TopologyError, parse_topology


class RankArrays:
    """One NumPy array per virtual rank (views of the same shape, possibly at rank-dependent offsets)."""

    def __init__(self, arrays: list[np.ndarray]):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0])


class SimBackend(ScheduleBackend):
    control = LocalControl()  # every rank in this process
    name = "sim"
    library = "schedule"
    device = "cpu"
    timed = False
    kind = "predicted"
    uses_hw = True
    default_sizes = "1K-1M"  # every rank's buffers live in this process
    # The NumPy interpreter steps each transfer in Python: ~ranks^2 per call (2048 ranks at 1 MiB: 4 min here).
    max_virtual_ranks = 1024

    @classmethod
    def settle(cls, cfg, launcher: str | None):
        cfg = super().settle(cfg, launcher)
        if cfg.hw:
            _hardware(cfg.hw)
        return cfg

    @classmethod
    def in_process(cls, cfg) -> bool:
        return True

    def header_notes(self, collectives: tuple[str, ...], placements: tuple[str, ...], hw: str | None) -> list[str]:
        poor = self.hardware.meta.get("poor_fit") if self.hardware is not None else None
        poor = shown(poor) if poor else poor  # the file's text, printed back
        return [f"sim: results are checked; times are predicted by the cost model of {hw}" if hw
                else "sim: results are checked; not timed (n/m) without --hw FILE|PRESET",
                *([f"warning: {hw} is a poor fit ({poor}): its times do not describe the sweep it came from"]
                  if poor else [])]

    def __init__(self, world: int, topology: Topology, algorithm: str = "auto", hardware=None):
        if world < 1:
            raise BackendError("--backend sim needs --nprocs >= 1 virtual ranks")
        self.rank, self.world_size = 0, world
        self.topology, self.algorithm = topology, algorithm
        self.hardware = hardware  # a costmodel.Hardware: calls are then timed by the model
        self.timed = hardware is not None

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> SimBackend:
        world = cfg.nprocs or 2
        try:
            topology = parse_topology(cfg.topology, world)
        except TopologyError as exc:
            raise BackendError(str(exc)) from exc
        hardware = _hardware(cfg.hw) if cfg.hw else None
        return cls(world, topology, cfg.algorithm, hardware)

    @property
    def local_ranks(self) -> list[int]:
        return list(range(self.world_size))

    # ---------------------------------------------------------------- buffers

    def alloc(self, count: int, dtype: DType) -> RankArrays:
        self._itemsize = dtype.itemsize  # the dtype's real size (bfloat16 is held as float32 here)
        try:
            return RankArrays([np.empty(count, dtype=dtype.host) for _ in range(self.world_size)])
        except MemoryError as exc:
            from commbench.backends.base import OutOfMemory

            raise OutOfMemory(f"could not allocate {self.world_size} x {count * dtype.itemsize} bytes") from exc

    def view(self, buffer: RankArrays, start: int, count: int) -> RankArrays:
        return RankArrays([a[start:start + count] for a in buffer.arrays])

    def rank_view(self, buffer: RankArrays, start_of: Callable[[int], int], count: int) -> RankArrays:
        return RankArrays([a[start_of(r):start_of(r) + count] for r, a in enumerate(buffer.arrays)])

    def upload(self, buffer: RankArrays, values: np.ndarray, rank: int) -> None:
        buffer.arrays[rank][...] = values

    def fill(self, buffer: RankArrays, value: float) -> None:
        for array in buffer.arrays:
            array.fill(value)

    def download(self, buffer: RankArrays, start: int, count: int, rank: int) -> np.ndarray:
        return buffer.arrays[rank][start:start + count]

    def length(self, buffer: RankArrays) -> int:
        return len(buffer)

    def itemsize(self, buffer: RankArrays) -> int:
        return self._itemsize  # the dtype's size, not the host array's (bfloat16 is held as float32)

    def scratch(self, count: int, like: RankArrays) -> RankArrays:
        return RankArrays([np.empty(count, dtype=a.dtype) for a in like.arrays])

    def copy(self, dst: RankArrays, src: RankArrays, only_rank: int | None = None) -> None:
        for rank, (d, s) in enumerate(zip(dst.arrays, src.arrays)):
            if only_rank is None or rank == only_rank:
                d[...] = s

    def scale(self, buffer: RankArrays, factor: float) -> None:
        for array in buffer.arrays:
            array *= array.dtype.type(factor)

    # ---------------------------------------------------------------- running a schedule

    def executor(self, schedule: Schedule, working: RankArrays, op: str) -> Callable[[], None]:
        return lambda: run(schedule, working.arrays, op, check=False)  # the reference interpreter itself

    def time_iterations(self, call: Callable[[], None], iters: int) -> np.ndarray:
        """The model's time of the prepared schedule for every iteration (nothing runs: the check does)."""
        if self.hardware is None or self._last is None:
            raise BackendError("sim has no clock: give --hw FILE|PRESET to time calls with the cost model")
        from commbench.costmodel import schedule_us

        return np.full(iters, schedule_us(self._last, self.topology, self.hardware, self._itemsize))

    # ---------------------------------------------------------------- one process: the control plane is local

    def synchronize(self) -> None:
        pass

    def barrier(self) -> None:
        pass


def _hardware(spec: str):
    """The cost model of a hardware file or preset, or one BackendError (the node size is the run's topology's,
    which the cost model is handed with every call)."""
    from commbench.costmodel import HardwareError, load_hardware

    try:
        return load_hardware(spec)
    except HardwareError as exc:
        raise BackendError(str(exc)) from exc
