"""cuda: commbench's schedules run by the kernels in cuda/, on one GPU or several.

The Schedule objects that shm, p2p and sim run (commbench/algorithms.py, plus
`twoshot`), executed on GPUs: every round is one launch of `schedule_round` (one-shot
and two-shot allreduce use their own kernels), with the launch tables built once when
the call is prepared (commbench/backends/cuda/plan.py, tested without a GPU). Three
pointer modes (`--cuda-mode`); the kernels are the same, only where the rank buffer
pointers come from differs:

- virtual: every rank's buffers on one GPU, in one process, one stream. A launch
  computes the round for every rank; stream order is the barrier between rounds.
  This is the mode a single GPU runs, and the one GPU tests use.
- peer: rank r on GPU r, one process, peer access enabled between every pair. One
  stream per GPU; each GPU computes its rank's outputs, reading peers' buffers over
  NVLink/PCIe; between rounds every stream waits for an event of every other stream.
- ipc: one process per GPU (spawned, torchrun, srun, mpirun), buffers shared through
  CUDA IPC handles and a GPU-side barrier between rounds (ipc.py), as the custom
  allreduce of vLLM and TensorRT-LLM do.

Buffers are allocated per rank (CuPy arrays; bfloat16 held as uint16). Results are
checked by the harness like every backend's; the time of a call is measured with
CUDA events on the stream of the first local rank (peer mode: the call forks the
other streams from it and joins them back, so the events bracket all GPUs' work).

The kernel files are compiled and loaded on every GPU when the backend starts, and
every kernel a call launches is looked up when the call is prepared, so nothing
compiles inside a timed or captured region. Each launch enters its GPU's device
context (`launch_on`): CuPy launches on the device current at call time, so a call
works from any thread. Eagerly, a call is one Python-issued launch per round, so
small-message times measure the launch rate; `--graph` measures the GPU's latency.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from commbench.backends.base import BackendError
from commbench.backends.control import LocalControl
from commbench.backends.cuda import kernels as K
from commbench.backends.cuda import plan as P
from commbench.backends.cuda.buffers import Allocation, GpuBuffer
from commbench.backends.cuda.device import (
    MEMCPY_DEFAULT,
    enable_peer_access,
    fill_value,
    from_store,
    gpu_only,
    launch_on,
    oom_or,
    require_gpu,
    store_dtype,
    time_calls,
    to_store,
)
from commbench.backends.schedule_base import ScheduleBackend
from commbench.collectives import DType
from commbench.schedule import Schedule
from commbench.topology import Topology, TopologyError, parse_topology


def resolve_mode(mode: str, launcher: str, world: int, gpus: int) -> str:
    """`--cuda-mode auto`: ipc under a launcher (one process per GPU), else peer when every
    rank has a GPU of its own, else virtual ranks on one GPU."""
    if mode != "auto":
        return mode
    if launcher not in ("single",):
        return "ipc"
    return "peer" if 1 < world <= gpus else "virtual"


class CudaBackend(ScheduleBackend):
    control = LocalControl()  # every rank in this process
    name = "cuda"
    device = "cuda"
    needs_gpu = True
    captures_graphs = True
    has_cuda_modes = True

    @classmethod
    def settle(cls, cfg, launcher: str | None):
        """Resolve `--cuda-mode auto`; the modes with every rank in one process refuse a launcher."""
        cfg = super().settle(cfg, launcher)
        gpus = require_gpu("cuda")
        world = cfg.nprocs if cfg.nprocs is not None else (gpus if gpus > 1 else 2)
        mode = resolve_mode(cfg.cuda_mode, launcher or "single", world, gpus)
        if mode != "ipc" and launcher is not None:
            raise BackendError(f"--cuda-mode {mode} runs every rank in one process: start it without {launcher}, "
                               f"or use --cuda-mode ipc (one process per GPU)")
        return replace(cfg, cuda_mode=mode)

    in_process = classmethod(lambda cls, cfg: cfg.cuda_mode != "ipc")
    resolve_device = classmethod(lambda cls, cfg: gpu_only(cfg, f"cuda-{cfg.cuda_mode}"))

    @classmethod
    def default_world(cls, cfg, device: str) -> int:
        gpus = require_gpu("cuda")
        return gpus if gpus > 1 else 2  # one GPU: 2 virtual ranks

    def setup_text(self) -> str:
        return f"{super().setup_text()}, {self.library}"  # the pointer mode

    def __init__(self, world: int, topology: Topology, algorithm: str = "auto", mode: str = "virtual",
                 graph: bool = False, timeout_s: float = 300.0, rank: int = 0, devices: dict[int, int] | None = None,
                 launch_config: P.LaunchConfig = P.LaunchConfig()):
        """`devices`: local rank -> GPU (default: all on GPU 0 for virtual, rank r on GPU r for peer)."""
        import cupy

        gpus = require_gpu("cuda")
        if mode == "peer" and world > gpus:
            raise BackendError(f"--cuda-mode peer puts rank r on GPU r: {world} ranks but {gpus} GPU(s) visible "
                               f"(use --cuda-mode virtual, or fewer --nprocs)")
        if mode == "peer" and graph:
            raise BackendError("--graph captures one stream; --cuda-mode peer runs one per GPU (use virtual or ipc)")
        self.rank, self.world_size, self.topology, self.algorithm = rank, world, topology, algorithm
        self.mode, self.graph, self.timeout_s, self.launch_config = mode, graph, timeout_s, launch_config
        self.library = f"cuda-{mode}"
        self._devices = devices if devices is not None else {r: (r if mode == "peer" else 0) for r in range(world)}
        K.require_arch(self.gpus)
        for device in self.gpus:  # compile (once) and load now: an error is one line before any point
            for file in K.KERNEL_FILES:
                K.load(file, device)
        self._streams = {}
        for device in sorted(set(self._devices.values())):
            with cupy.cuda.Device(device):
                self._streams[device] = cupy.cuda.Stream(non_blocking=True)
        self._events = {}  # peer mode: one event per GPU, re-recorded at every barrier
        if mode == "peer":
            enable_peer_access(sorted(self._streams))
            for device in self._streams:
                with cupy.cuda.Device(device):
                    self._events[device] = cupy.cuda.Event(disable_timing=True)
        self._seq = 0

    @classmethod
    def create(cls, cfg, launch) -> CudaBackend:
        """The virtual and peer modes (every rank in this process); ipc.create_cuda_backend picks."""
        world = cfg.nprocs or 2
        mode = resolve_mode(cfg.cuda_mode, launch.launcher, world, require_gpu("cuda"))
        try:
            topology = parse_topology(cfg.topology, world)
        except TopologyError as exc:
            raise BackendError(str(exc)) from exc
        return cls(world, topology, cfg.algorithm, mode, cfg.graph, cfg.timeout_s)

    @property
    def local_ranks(self) -> list[int]:
        return sorted(self._devices)

    @property
    def gpus(self) -> list[int]:
        """The CUDA devices this process drives (telemetry watches these)."""
        return sorted(set(self._devices.values()))

    def device_of(self, rank: int) -> int:
        """The GPU that local rank `rank`'s buffers and launches are on; `stream_of`: its stream."""
        return self._devices[rank]

    def stream_of(self, rank: int) -> Any:
        return self._streams[self._devices[rank]]

    def _groups(self) -> list[list[int]]:
        """Ranks whose outputs one stream computes: all of them (virtual), or one each."""
        return [self.local_ranks] if self.mode == "virtual" else [[r] for r in self.local_ranks]

    # ---------------------------------------------------------------- buffers

    def alloc(self, count: int, dtype: DType) -> GpuBuffer:
        allocation, self._seq = Allocation(self._seq), self._seq + 1
        arrays = {r: self.new_array(r, count, dtype, allocation) for r in self.local_ranks}
        return GpuBuffer(arrays, allocation, dict.fromkeys(range(self.world_size), 0), count, dtype)

    def new_array(self, rank: int, count: int, dtype: DType, allocation: Allocation) -> Any:
        """Local rank `rank`'s array of `allocation`, its base recorded (ipc: unpooled, with its IPC handle)."""
        import cupy

        with cupy.cuda.Device(self._devices[rank]):
            try:
                array = cupy.empty(count, dtype=store_dtype(dtype))
            except Exception as exc:  # noqa: BLE001 - CuPy's OutOfMemoryError, or a CUDA runtime error
                raise oom_or(exc, count * dtype.itemsize) from exc
        allocation.bases[rank] = array.data.ptr
        return array

    def view(self, buffer: GpuBuffer, start: int, count: int) -> GpuBuffer:
        return self.rank_view(buffer, lambda r: start, count)

    def rank_view(self, buffer: GpuBuffer, start_of: Callable[[int], int], count: int) -> GpuBuffer:
        arrays = {r: a[start_of(r):start_of(r) + count] for r, a in buffer.arrays.items()}
        offsets = {r: o + start_of(r) for r, o in buffer.offsets.items()}
        return GpuBuffer(arrays, buffer.alloc, offsets, count, buffer.dtype)

    def upload(self, buffer: GpuBuffer, values: np.ndarray, rank: int) -> None:
        import cupy

        with cupy.cuda.Device(self._devices[rank]):
            buffer.arrays[rank].set(to_store(values, buffer.dtype))

    def fill(self, buffer: GpuBuffer, value: float) -> None:
        import cupy

        for rank, array in buffer.arrays.items():
            with cupy.cuda.Device(self._devices[rank]):
                array.fill(fill_value(value, buffer.dtype))

    def download(self, buffer: GpuBuffer, start: int, count: int, rank: int) -> np.ndarray:
        import cupy

        with cupy.cuda.Device(self._devices[rank]):
            return from_store(buffer.arrays[rank][start:start + count].get(), buffer.dtype)

    def length(self, buffer: GpuBuffer) -> int:
        return buffer.count

    def itemsize(self, buffer: GpuBuffer) -> int:
        return buffer.dtype.itemsize

    def scratch(self, count: int, like: GpuBuffer) -> GpuBuffer:
        return self.alloc(count, like.dtype)

    def copy(self, dst: GpuBuffer, src: GpuBuffer, only_rank: int | None = None) -> None:
        import cupy

        nbytes = dst.count * dst.dtype.itemsize
        for rank in self.local_ranks:
            if nbytes and (only_rank is None or rank == only_rank):
                with cupy.cuda.Device(self._devices[rank]):
                    cupy.cuda.runtime.memcpyAsync(dst.pointer(rank), src.pointer(rank), nbytes, MEMCPY_DEFAULT,
                                                  self.stream_of(rank).ptr)

    def scale(self, buffer: GpuBuffer, factor: float) -> None:
        """buffer *= factor on every local rank (avg); the kernel was loaded by executor()."""
        import cupy

        cast = np.float64 if buffer.dtype.name == "float64" else np.float32
        blocks = max(1, min(1024, -(-buffer.count // self.launch_config.threads)))
        for rank in self.local_ranks:
            device = self._devices[rank]
            kernel = K.function("reduce_copy.cu", K.kernel_name("scale", buffer.dtype.name), device)
            with cupy.cuda.Device(device):
                kernel((blocks,), (self.launch_config.threads,),
                       (np.uint64(buffer.pointer(rank)), np.int64(buffer.count), cast(factor)),
                       stream=self.stream_of(rank))

    # ---------------------------------------------------------------- running a schedule

    def prepare(self, collective: str, send: Any, recv: Any, op: str | None, root: int,
                inplace: bool) -> Callable[[], None]:
        call = super().prepare(collective, send, recv, op, root, inplace)
        return self._fork_join(call) if self.mode == "peer" else call

    def executor_reading(self, schedule: Schedule, working: GpuBuffer, source: GpuBuffer, op: str) -> Any:
        """Out of place, oneshot/twoshot read the inputs: no copy first (oneshot no staging either)."""
        return self.executor(schedule, working, op, source) if P.reads_inputs(schedule) else None

    def executor(self, schedule: Schedule, working: GpuBuffer, op: str, source: GpuBuffer | None = None) -> Any:
        groups = self._groups()
        programs = [P.program(schedule, group, reads_input=source is not None) for group in groups]
        for buffer in (working, source) if source is not None else (working,):
            self.share(buffer)
        stage = self.alloc(schedule.count, working.dtype) if any(map(P.uses_staging, programs)) else None
        buffers = {P.WORK: working, P.STAGE: stage, P.INPUT: source}

        def address(ref: P.Ref) -> int:
            buffer = buffers[ref.buffer]
            return buffer.pointer(ref.rank) + ref.offset * buffer.dtype.itemsize
        self._resolve_kernels(working.dtype, op)
        launches = [[self._launcher(step, group, address, working.dtype, op, schedule.world) for step in steps]
                    for group, steps in zip(groups, programs)]
        barriers = [isinstance(step, P.Barrier) for step in programs[0]]
        per_step = list(zip(barriers, zip(*launches)))
        self.synchronize()  # the tables are on the GPUs before the first launch reads them
        round_barrier = self.round_barrier

        def call() -> None:
            for is_barrier, group_launches in per_step:
                if is_barrier:
                    round_barrier()
                    continue
                for launch in group_launches:
                    if launch is not None:
                        launch()
        return call

    def _resolve_kernels(self, dtype: DType, op: str) -> None:
        """Look up, on every GPU, the kernels a call launches outside its steps (avg's scale),
        so that none is compiled or loaded inside a timed or captured call."""
        if op == "avg":
            for device in self.gpus:
                K.function("reduce_copy.cu", K.kernel_name("scale", dtype.name), device)

    def _launcher(self, step: P.Step, group: list[int], address: Callable[[P.Ref], int], dtype: DType, op: str,
                  world: int) -> Callable[[], None] | None:
        """A closure that launches one step's kernel for one group, its tables already on the GPU."""
        import cupy

        device = self._devices[group[0]]
        stream, threads = self._streams[device], self.launch_config.threads
        with cupy.cuda.Device(device):
            if isinstance(step, P.RoundLaunch) and step.tasks:
                entries, inputs, grid = P.pack_round(step.tasks, address, dtype.itemsize, self.launch_config)
                tables = (cupy.asarray(entries.view(np.uint8)), np.int32(len(entries)), cupy.asarray(inputs))
                kernel = K.function("schedule_round.cu", K.kernel_name("schedule_round", dtype.name, op), device)
                return launch_on(device, kernel, (grid,), (threads,), tables, stream)
            if isinstance(step, P.AllreduceLaunch):
                blocks, rows = P.allreduce_grid(step, dtype.itemsize, world, self.launch_config)
                ins = cupy.asarray(np.array([address(r) for r in step.ins], dtype=np.uint64))
                outs = cupy.asarray(np.array([address(r) for r in step.outs], dtype=np.uint64))
                args = (ins, outs, np.int32(world), np.int32(step.first_rank), np.int64(step.count))
                name = K.allreduce_kernel_name(step.kernel, step.phase, dtype.name, op)
                kernel = K.function("allreduce.cu", name, device)
                return launch_on(device, kernel, (blocks, rows), (threads,), args, stream)
        return None

    def round_barrier(self) -> None:
        """Between rounds: nothing on one stream (stream order); across GPUs, every stream
        waits for an event of every other stream."""
        if self.mode == "virtual":
            return
        import cupy

        for device, stream in self._streams.items():  # a wait takes the event's latest record, so reuse is safe
            with cupy.cuda.Device(device):
                self._events[device].record(stream)
        for device, stream in self._streams.items():
            with cupy.cuda.Device(device):
                for other, event in self._events.items():
                    if other != device:
                        stream.wait_event(event)

    def _fork_join(self, call: Callable[[], None]) -> Callable[[], None]:
        """Peer mode: the other streams start after the first stream's earlier work, and the
        first stream waits for theirs, so events on the first stream time the whole call."""
        def timed_call() -> None:
            self.round_barrier()
            call()
            self.round_barrier()
        return timed_call

    def share(self, buffer: GpuBuffer) -> None:
        """Make every rank's pointer of `buffer` known here (ipc mode exchanges handles)."""

    # ---------------------------------------------------------------- timing and synchronisation

    def time_iterations(self, call: Callable[[], None], iters: int) -> np.ndarray:
        return self._time(call, iters, self.graph)

    def time_warmup(self, call: Callable[[], None], iters: int) -> np.ndarray:
        """Warm-up calls run eagerly, --graph or not (the harness uses this when a backend has it)."""
        return self._time(call, iters, False)

    def _time(self, call: Callable[[], None], iters: int, graph: bool) -> np.ndarray:
        import cupy

        first = self.local_ranks[0]
        with cupy.cuda.Device(self._devices[first]):
            times = time_calls(call, iters, self.stream_of(first), graph=graph)
        self.check_errors()
        return times

    def check_errors(self) -> None:
        """Raise if the GPU reported a fault the kernels record (ipc: a barrier timed out)."""

    def synchronize(self) -> None:
        import cupy

        for device in self._streams:  # the whole device: our streams, and the default stream uploads use
            cupy.cuda.Device(device).synchronize()
        self.check_errors()

    # ---------------------------------------------------------------- one process: the control plane is local

    def barrier(self) -> None:
        self.synchronize()
        self.control.barrier()  # ipc mode: the ranks' processes meet over gloo

