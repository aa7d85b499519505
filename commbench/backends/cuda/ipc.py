"""cuda, ipc mode: one process per GPU, peers' buffers mapped through CUDA IPC handles.

The way vLLM's and TensorRT-LLM's custom allreduce share memory between the processes
of one host: every buffer is its own cudaMalloc (not CuPy's pool, so that a handle
names exactly this buffer and the opened pointer is its start); before a schedule
runs on a buffer, the ranks exchange its handle over the control plane (gloo, the
launcher's rendezvous) and each opens its peers' handles. The kernels then read
peers' chunks directly, as in the other two modes.

Rounds are separated by `rank_barrier` (cuda/schedule_round.cu), launched on the
rank's stream: each rank owns an IPC-shared flag array with one slot per peer; at a
barrier it writes the new epoch into its slot of every peer's array (a system-scope
release after a fence) and spins until every peer has written its own. The barrier
stays on the GPU (no host round trip between rounds) and its epoch lives in device
memory, so a whole call can be captured in a CUDA graph. A wait longer than
--timeout records the missing rank; the host reads that after synchronising and
stops the run with one line, instead of hanging; once the error word is set, every
later barrier of this rank returns at once, so the calls already queued drain quickly.

Lifetimes: a rank keeps its own allocations of a point alive until the point ends
(Backend.end_point), when every rank closes the handles it opened, meets the others on
the control plane, and only then drops its own (an exporter must not free memory a peer
still has mapped). The flag arrays live as long as the backend, closed the same way.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from commbench.backends.base import BackendError
from commbench.backends.cuda import kernels as K
from commbench.backends.cuda.buffers import Allocation, GpuBuffer
from commbench.backends.cuda.device import launch_on, oom_or, rank_gpu, require_gpu, store_dtype
from commbench.backends.cuda.sched import CudaBackend, resolve_mode
from commbench.backends.schedule_base import job_topology
from commbench.collectives import DType
from commbench.launch import peer_wait_s
from commbench.launchers import LaunchInfo
from commbench.topology import Topology

MAX_WORLD = 1024  # one block of the barrier kernel has a thread per rank


def create_cuda_backend(cfg, launch: LaunchInfo) -> CudaBackend:
    """--backend cuda on this rank: the class of its pointer mode (ipc: one process per GPU)."""
    mode = resolve_mode(cfg.cuda_mode, launch.launcher, cfg.nprocs or 2, require_gpu("cuda"))
    return (IpcCudaBackend if mode == "ipc" else CudaBackend).create(cfg, launch)


class IpcCudaBackend(CudaBackend):

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> IpcCudaBackend:
        if launch.nnodes > 1 or launch.local_world_size != launch.world_size:
            raise BackendError("--backend cuda shares GPU memory through CUDA IPC: every rank must be on one host; "
                               "across nodes use --backend cupy (NCCL)")
        return cls(launch, job_topology(cfg.topology, launch), cfg.algorithm, cfg.graph, cfg.timeout_s)

    def __init__(self, launch: LaunchInfo, topology: Topology, algorithm: str = "auto", graph: bool = False,
                 timeout_s: float = 300.0):
        import cupy

        from commbench.backends.dist_group import DistGroup

        if launch.world_size > MAX_WORLD:
            raise BackendError(f"--cuda-mode ipc supports up to {MAX_WORLD} ranks")
        gpus = require_gpu("cuda")
        # The control plane (and the rendezvous) is torch.distributed over gloo, as for shm and cupy.
        self._group = DistGroup(launch, "cpu", "gloo", timeout_s)
        self.control = self._group.control
        self.world_size = launch.world_size
        gpu = rank_gpu("cuda", launch.local_rank, gpus, self._all_gather)
        cupy.cuda.Device(gpu).use()  # tables, flags and CuPy's own work go to this GPU
        super().__init__(launch.world_size, topology, algorithm, "ipc", graph, timeout_s, rank=launch.rank,
                         devices={launch.rank: gpu})
        self._opened: list[int] = []  # peers' allocations mapped for this point
        self._exported: list[Any] = []  # this rank's allocations of this point, freed at its end
        self._faulted = False  # a point failed (a barrier timed out, a peer died): do not meet the peers again
        self._flags_memory, self._peer_flags, self._flag_handles = self._flag_arrays()
        self._barrier = self._barrier_launch()

    # ---------------------------------------------------------------- shared allocations

    def new_array(self, rank: int, count: int, dtype: DType, allocation: Allocation) -> Any:
        import cupy

        nbytes = count * dtype.itemsize
        with cupy.cuda.Device(self.device_of(rank)):
            try:
                memory = cupy.cuda.Memory(max(nbytes, 1))  # unpooled: the handle names this buffer alone
            except Exception as exc:  # noqa: BLE001 - CUDARuntimeError cudaErrorMemoryAllocation
                raise oom_or(exc, nbytes) from exc
            array = cupy.ndarray((count,), dtype=store_dtype(dtype), memptr=cupy.cuda.MemoryPointer(memory, 0))
            allocation.handle = cupy.cuda.runtime.ipcGetMemHandle(memory.ptr)
        allocation.memory, allocation.bases[rank] = memory, memory.ptr
        self._exported.append(memory)
        return array

    def share(self, buffer: GpuBuffer) -> None:
        """Exchange the allocation's handles (every rank calls this for the same buffers, in
        the same order: while preparing a call) and open the peers'."""
        allocation = buffer.alloc
        if len(allocation.bases) == self.world_size:
            return
        handles = self._all_gather(allocation.handle)
        for peer, handle in enumerate(handles):
            if peer != self.rank:
                allocation.bases[peer] = self._open(handle, peer)

    def _open(self, handle: bytes, peer: int) -> int:
        import cupy

        try:
            pointer = cupy.cuda.runtime.ipcOpenMemHandle(handle)
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            raise BackendError(f"cannot map rank {peer}'s GPU memory through CUDA IPC ({exc}); GPUs without a "
                               f"peer-to-peer path need --backend cupy (NCCL)") from exc
        self._opened.append(pointer)
        return pointer

    def end_point(self, failed: bool = False) -> None:
        """Close the peers' handles of this point, meet every rank, then free this rank's allocations.

        After a failed point nothing is closed or freed and no rank is met: kernels still
        queued may address the peers' memory (and the peers' kernels this rank's), a dead peer
        would never arrive, and a CUDA error raised here would hide the point's own."""
        if failed:
            self._faulted = True
            return
        self._close_handles(self._opened)
        self._meet()
        self._exported.clear()

    def _close_handles(self, pointers: list[int]) -> None:
        import cupy

        for pointer in pointers:
            cupy.cuda.runtime.ipcCloseMemHandle(pointer)
        pointers.clear()

    def _meet(self) -> None:
        """Every rank has closed its handles before any frees what they mapped (skipped after a
        barrier timeout: the missing rank would never arrive)."""
        if not self._faulted:
            self.control.barrier()

    # ---------------------------------------------------------------- the barrier between rounds

    def _flag_arrays(self) -> tuple[Any, Any, list[int]]:
        """This rank's flags (one u64 slot per peer, then the epoch, then the error word),
        zeroed; a device table of every rank's flag array as this GPU addresses it; the
        peers' flag handles opened here."""
        import cupy

        world = self.world_size
        memory = cupy.cuda.Memory(8 * (world + 2))
        cupy.cuda.runtime.memset(memory.ptr, 0, 8 * (world + 2))
        cupy.cuda.runtime.deviceSynchronize()  # the zeros have landed before any peer can signal into them
        handles = self._all_gather(cupy.cuda.runtime.ipcGetMemHandle(memory.ptr))
        opened = [cupy.cuda.runtime.ipcOpenMemHandle(h) for p, h in enumerate(handles) if p != self.rank]
        pointers = opened[:self.rank] + [memory.ptr] + opened[self.rank:]
        self.control.barrier()  # every rank's flags are zeroed before anyone signals into them
        return memory, cupy.asarray(np.array(pointers, dtype=np.uint64)), opened

    def _barrier_launch(self) -> Any:
        """The rank_barrier launch on this rank's GPU and stream, its kernel loaded now (not
        inside a timed or captured call); its arguments never change (the epoch is on the GPU)."""
        world, device = self.world_size, self.device_of(self.rank)
        base = self._flags_memory.ptr
        args = (self._peer_flags, np.uint64(base), np.uint64(base + 8 * world), np.int32(self.rank),
                np.int32(world), np.uint64(int(peer_wait_s(self.timeout_s) * 1e9)), np.uint64(base + 8 * (world + 1)))
        kernel = K.function("schedule_round.cu", "rank_barrier", device)
        return launch_on(device, kernel, (1,), (max(32, -(-world // 32) * 32),), args, self.stream_of(self.rank))

    def round_barrier(self) -> None:
        self._barrier()

    def check_errors(self) -> None:
        import cupy

        world = self.world_size
        word = cupy.ndarray((1,), dtype=np.int32, memptr=cupy.cuda.MemoryPointer(self._flags_memory, 8 * (world + 1)))
        missing = int(word.get()[0])
        if missing:
            self._faulted = True
            raise RuntimeError(f"timed out after {self.timeout_s:g} s at a round barrier waiting for rank "
                               f"{missing - 1} (it died or hung)")

    # ---------------------------------------------------------------- control plane: gloo

    def _all_gather(self, obj: Any) -> list[Any]:
        return self.control.all_gather_objects(obj)

    def close(self) -> None:
        if self._faulted:  # as after a failed point: leave the mappings to the process's exit
            self._group.close()
            return
        self._close_handles(self._opened)
        self._close_handles(self._flag_handles)
        self._meet()  # no peer still maps this rank's flags when they are freed
        self._exported.clear()
        self._flags_memory = None
        self._group.close()
