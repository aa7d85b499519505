"""cupy: collectives through CuPy's NCCL communicator (cupy.cuda.nccl), one rank per GPU.

NCCL without torch in the measured path: the same library torch's NCCL backend calls,
driven directly, so the two can be compared on the same GPUs. Ranks find each other
through the launcher's rendezvous (torch.distributed over gloo on the CPU, as the
control plane of shm and p2p): rank 0 creates the NCCL unique id and broadcasts it
there, then every rank creates its communicator on GPU local_rank % visible GPUs (two
ranks on one GPU are refused, by PCI bus id: device.rank_gpu).

Every collective is the plain NCCL call on a dedicated non-blocking stream, with the
out-of-place and in-place buffers laid out as nccl-tests lays them out; NCCL has all
reductions (avg included) for every dtype commbench sweeps. alltoall and sendrecv
are grouped point-to-point calls (ncclGroupStart/End), as nccl-tests runs them.
Time is CUDA events on that stream; `--graph` captures the timed calls in one CUDA
graph and replays it (nccl-tests -G), so per-call times are the graph's mean (warm-up
runs eagerly, so NCCL's first call is never captured).

The host never blocks on NCCL: it polls for completion, checking the communicator's
asynchronous error, and past --timeout aborts the communicator (ncclCommAbort) and
stops the run with one line; an NCCL kernel waiting for a dead peer would otherwise
hang cudaEventSynchronize, and ncclCommDestroy, forever.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from commbench.backends.base import Backend, BackendError
from commbench.backends.cuda.device import (
    NCCL_HINT,
    dtype_of,
    fill_value,
    from_store,
    gpu_only,
    oom_or,
    rank_gpu,
    require_gpu,
    store_dtype,
    time_calls,
    to_store,
    wait_until_done,
)
from commbench.backends.nccl_defects import one_rank_avg_defect, say_once
from commbench.collectives import DType
from commbench.launch import peer_wait_s
from commbench.launchers import LaunchInfo


def _loaded_nccl_version() -> int | None:
    """The version of the NCCL CuPy loads, or None (no CuPy or no NCCL: the backend says so later)."""
    try:
        from cupy.cuda import nccl

        return int(nccl.get_version()) if nccl.available else None
    except Exception:  # noqa: BLE001 - a warning must never end a run
        return None


NCCL_DTYPES = {"float32": "NCCL_FLOAT32", "float16": "NCCL_FLOAT16", "bfloat16": "NCCL_BFLOAT16",
               "float64": "NCCL_FLOAT64", "int32": "NCCL_INT32", "int8": "NCCL_INT8", "uint8": "NCCL_UINT8",
               "int64": "NCCL_INT64"}
NCCL_OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN", "avg": "NCCL_AVG"}


class CupyBackend(Backend):
    name = "cupy"
    library = "nccl"
    device = "cuda"
    needs_gpu = True
    captures_graphs = True

    @classmethod
    def resolve_device(cls, cfg) -> tuple[str, str]:
        return gpu_only(cfg, "nccl")

    @classmethod
    def default_world(cls, cfg, device: str) -> int:
        return require_gpu("cupy")

    @classmethod
    def check_request(cls, cfg, library: str, collectives: list[str], dtype: DType, op: str, world: int) -> None:
        if "sendrecv" in collectives and world == 1:
            raise BackendError("-c sendrecv needs at least 2 ranks (each rank sends to the next one)")
        if world == 1 and op == "avg":  # NVIDIA/nccl#1950: NCCL writes every out-of-place output here
            say_once(one_rank_avg_defect(_loaded_nccl_version(), world, op, dtype, collectives,
                                         ("allreduce", "reduce_scatter", "reduce")))

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> CupyBackend:
        return cls(launch, timeout_s=cfg.timeout_s, graph=cfg.graph)

    def __init__(self, launch: LaunchInfo, timeout_s: float = 300.0, graph: bool = False):
        from commbench.backends.dist_group import DistGroup

        gpus = require_gpu("cupy")
        import cupy
        from cupy.cuda import nccl

        if not nccl.available:
            raise BackendError(f"--backend cupy: CuPy cannot load NCCL: {NCCL_HINT}")
        self.rank, self.world_size, self.graph, self.timeout_s = launch.rank, launch.world_size, graph, timeout_s
        self.comm = None
        self._group = DistGroup(launch, "cpu", "gloo", timeout_s)
        self.control = self._group.control
        self.gpu = rank_gpu("cupy", launch.local_rank, gpus,
                            self.control.all_gather_objects)
        cupy.cuda.Device(self.gpu).use()
        unique_id = self.control.broadcast_object(nccl.get_unique_id() if self.rank == 0 else None)
        self.comm = nccl.NcclCommunicator(self.world_size, unique_id, self.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._nccl = nccl

    @property
    def gpus(self) -> list[int]:
        """The CUDA device this process drives (telemetry watches it)."""
        return [self.gpu]

    # ---------------------------------------------------------------- buffers (CuPy arrays; bfloat16 as uint16)

    def unsupported(self, collective: str, dtype: DType, op: str | None, placement: str) -> str | None:
        return None

    def device_memory(self) -> dict[str, int]:
        import cupy

        from commbench.point_timing import nvml_used_bytes

        pool = cupy.get_default_memory_pool()
        return {"cupy_pool_used_bytes": int(pool.used_bytes()), "cupy_pool_total_bytes": int(pool.total_bytes()),
                **nvml_used_bytes(self.gpu)}

    def alloc(self, count: int, dtype: DType) -> Any:
        import cupy

        try:
            return cupy.empty(count, dtype=store_dtype(dtype))
        except Exception as exc:  # noqa: BLE001 - CuPy's OutOfMemoryError
            raise oom_or(exc, count * dtype.itemsize) from exc

    def view(self, buffer: Any, start: int, count: int) -> Any:
        return buffer[start:start + count]

    # Fills, uploads and downloads run on the stream the NCCL calls use (CuPy works on the current
    # stream), so the buffers see one order of work whatever the default stream is (legacy or per
    # thread: CUPY_CUDA_PER_THREAD_DEFAULT_STREAM), not only through the host's waits between them.

    def upload(self, buffer: Any, values: np.ndarray, rank: int) -> None:
        with self.stream:
            buffer.set(to_store(values, dtype_of(buffer)))

    def fill(self, buffer: Any, value: float) -> None:
        with self.stream:
            buffer.fill(fill_value(value, dtype_of(buffer)))

    def download(self, buffer: Any, start: int, count: int, rank: int) -> np.ndarray:
        with self.stream:
            return from_store(buffer[start:start + count].get(), dtype_of(buffer))

    # ---------------------------------------------------------------- the measured call

    def prepare(self, collective: str, send: Any, recv: Any, op: str | None, root: int,
                inplace: bool, splits: tuple | None = None) -> Callable[[], None]:
        comm, nccl, stream = self.comm, self._nccl, self.stream.ptr
        dtype = getattr(nccl, NCCL_DTYPES[dtype_of(recv).name])
        if collective in ("gather", "scatter", "alltoallv", "hypercube"):
            return grouped_calls(nccl, comm, stream, dtype,
                                 personalized_steps(collective, send, recv, root, self.rank, self.world_size, splits))
        reduce_op = getattr(nccl, NCCL_OPS[op]) if op else None
        s, r = send.data.ptr, recv.data.ptr
        if collective == "allreduce":
            return lambda: comm.allReduce(s, r, recv.size, dtype, reduce_op, stream)
        if collective == "allgather":
            return lambda: comm.allGather(s, r, send.size, dtype, stream)
        if collective == "reduce_scatter":
            return lambda: comm.reduceScatter(s, r, recv.size, dtype, reduce_op, stream)
        if collective == "broadcast":
            return lambda: comm.broadcast(s, r, recv.size, dtype, root, stream)
        if collective == "reduce":
            return lambda: comm.reduce(s, r, recv.size, dtype, reduce_op, root, stream)
        if collective == "alltoall":
            return self._alltoall(send, recv, dtype)
        if collective == "sendrecv":
            return self._sendrecv(send, recv, dtype)
        raise BackendError(f"--backend cupy cannot run {collective!r}")

    def _alltoall(self, send: Any, recv: Any, dtype: int) -> Callable[[], None]:
        """Chunk p of send goes to rank p, chunk p of recv comes from rank p: one group of 2n calls."""
        comm, nccl, stream, world = self.comm, self._nccl, self.stream.ptr, self.world_size
        chunk = send.size // world
        nbytes = chunk * send.itemsize
        pairs = [(send.data.ptr + p * nbytes, recv.data.ptr + p * nbytes, p) for p in range(world)]

        def call() -> None:
            nccl.groupStart()
            for s, r, peer in pairs:
                comm.send(s, chunk, dtype, peer, stream)
                comm.recv(r, chunk, dtype, peer, stream)
            nccl.groupEnd()
        return call

    def _sendrecv(self, send: Any, recv: Any, dtype: int) -> Callable[[], None]:
        """Send to the next rank, receive from the previous one, as nccl-tests' sendrecv."""
        comm, nccl, stream, world = self.comm, self._nccl, self.stream.ptr, self.world_size
        s, r, count = send.data.ptr, recv.data.ptr, recv.size
        peer_next, peer_prev = (self.rank + 1) % world, (self.rank - 1) % world

        def call() -> None:
            nccl.groupStart()
            comm.send(s, count, dtype, peer_next, stream)
            comm.recv(r, count, dtype, peer_prev, stream)
            nccl.groupEnd()
        return call

    def time_iterations(self, call: Callable[[], None], iters: int) -> np.ndarray:
        return self._time(call, iters, self.graph)

    def time_warmup(self, call: Callable[[], None], iters: int) -> np.ndarray:
        """Warm-up calls run eagerly, --graph or not (the harness uses this when a backend has it)."""
        return self._time(call, iters, False)

    def _time(self, call: Callable[[], None], iters: int, graph: bool) -> np.ndarray:
        import cupy

        with cupy.cuda.Device(self.gpu):
            return time_calls(call, iters, self.stream, graph=graph, wait=self._wait)

    def barrier(self) -> None:
        self.synchronize()
        self.control.barrier()

    def synchronize(self) -> None:
        import cupy

        with cupy.cuda.Device(self.gpu):  # our stream, and the stream uploads and fills use
            self._wait(self.stream, cupy.cuda.get_current_stream())

    def _wait(self, *work: Any) -> None:
        """Until every event or stream in `work` is done, polling NCCL's asynchronous error;
        on an error or past --timeout, abort the communicator and raise (one line)."""
        if self.comm is None:
            raise RuntimeError("the NCCL communicator was aborted after an earlier fault")
        try:
            done = wait_until_done(list(work), peer_wait_s(self.timeout_s), self.comm.check_async_error)
        except RuntimeError:  # NcclError (a peer's failure seen by NCCL), or a CUDA error
            self._abort()
            raise
        if not done:
            self._abort()
            raise RuntimeError(f"NCCL did not finish within --timeout {self.timeout_s:g} s; communicator aborted")

    def _abort(self) -> None:
        """ncclCommAbort: ends NCCL kernels still waiting for a peer (destroy would wait for them)."""
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.abort()

    def close(self) -> None:
        """Destroy the communicator after a clean run; abort it when work is still queued (a
        fault elsewhere, e.g. on the control plane): destroy would wait for that work."""
        comm, self.comm = self.comm, None
        if comm is not None:
            if self.stream.done:
                comm.destroy()
            else:
                comm.abort()
        self._group.close()


# ---------------------------------------------------------------- gather, scatter, alltoallv, hypercube

# One step: (sends, receives), each a list of (pointer, count, peer), issued inside one NCCL group.
Step = tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]


def personalized_steps(collective: str, send: Any, recv: Any, root: int, rank: int, world: int,
                       splits: tuple | None) -> list[Step]:
    """The grouped sends and receives nccl-tests issues for these (src/gather.cu, scatter.cu,
    alltoallv.cu, hypercube.cu): NCCL has no such collective call, only send and recv in a group."""
    item, s, r = send.itemsize, send.data.ptr, recv.data.ptr
    if collective == "gather":
        chunk = send.size
        return [([(s, chunk, root)], [(r + p * chunk * item, chunk, p) for p in range(world)] if rank == root else [])]
    if collective == "scatter":
        chunk = recv.size
        return [([(s + p * chunk * item, chunk, p) for p in range(world)] if rank == root else [], [(r, chunk, root)])]
    if collective == "alltoallv":
        from commbench.collectives import split_offsets

        send_at, recv_at = split_offsets(splits, rank)
        return [([(s + send_at[p] * item, splits[rank][p], p) for p in range(world)],
                 [(r + recv_at[p] * item, splits[p][rank], p) for p in range(world)])]
    chunk, steps, mask = send.size, [], 1  # hypercube: the own chunk is copied first (grouped_calls)
    while mask < world:
        held = rank & ~(mask - 1)
        steps.append(([(r + held * chunk * item, mask * chunk, rank ^ mask)],
                      [(r + (held ^ mask) * chunk * item, mask * chunk, rank ^ mask)]))
        mask <<= 1
    return [([(s, chunk * item, -1)], [(r + rank * chunk * item, chunk * item, -1)]), *steps]


def grouped_calls(nccl: Any, comm: Any, stream: int, dtype: int, steps: list[Step]) -> Callable[[], None]:
    """One NCCL group per step; a step whose peer is -1 is a device copy of that many bytes (hypercube's
    own chunk, left out in place)."""
    def call() -> None:
        for sends, receives in steps:
            if sends and sends[0][2] == -1:
                (source, nbytes, _), (target, _, _) = sends[0], receives[0]
                if source != target:
                    _copy(target, source, nbytes, stream)
                continue
            nccl.groupStart()
            for pointer, count, peer in sends:
                comm.send(pointer, count, dtype, peer, stream)
            for pointer, count, peer in receives:
                comm.recv(pointer, count, dtype, peer, stream)
            nccl.groupEnd()
    return call


def _copy(target: int, source: int, nbytes: int, stream: int) -> None:
    import cupy

    cupy.cuda.runtime.memcpyAsync(target, source, nbytes, cupy.cuda.runtime.memcpyDeviceToDevice, stream)
