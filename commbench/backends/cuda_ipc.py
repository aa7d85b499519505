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
stops the run with one line, instead of hanging.

Handles opened for a point are closed when the point ends (Backend.end_point); the
flag arrays live as long as the backend.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from commbench.backends.base import BackendError
from commbench.backends.cuda_sched import Allocation, CudaBackend, GpuBuffer
from commbench.backends.gpu import oom_or, require_gpu, store_dtype
from commbench.backends.schedule_base import job_topology
from commbench.collectives import DType
from commbench.launch import LaunchInfo
from commbench.topology import Topology

MAX_WORLD = 1024  # one block of the barrier kernel has a thread per rank


class IpcCudaBackend(CudaBackend):

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> "IpcCudaBackend":
        if launch.nnodes > 1 or launch.local_world_size != launch.world_size:
            raise BackendError("--backend cuda shares GPU memory through CUDA IPC: every rank must be on one host; "
                               "across nodes use --backend cupy (NCCL)")
        return cls(launch, job_topology(cfg.topology, launch), cfg.algorithm, cfg.graph, cfg.timeout_s)

    def __init__(self, launch: LaunchInfo, topology: Topology, algorithm: str = "auto", graph: bool = False,
                 timeout_s: float = 300.0):
        import cupy

        from commbench.backends.torch_dist import TorchBackend

        if launch.world_size > MAX_WORLD:
            raise BackendError(f"--cuda-mode ipc supports up to {MAX_WORLD} ranks")
        gpus = require_gpu("cuda")
        cupy.cuda.Device(launch.local_rank % gpus).use()  # tables, flags and CuPy's own work go to this GPU
        # The control plane (and the rendezvous) is torch.distributed over gloo, as for shm and cupy.
        self._control = TorchBackend(launch, device="cpu", torch_backend="gloo", timeout_s=timeout_s)
        super().__init__(launch.world_size, topology, algorithm, "ipc", graph, timeout_s, rank=launch.rank,
                         devices={launch.rank: launch.local_rank % gpus})
        self._opened: list[int] = []
        self._flags_memory, self._peer_flags = self._flag_arrays()

    # ---------------------------------------------------------------- shared allocations

    def _new_array(self, rank: int, count: int, dtype: DType, allocation: Allocation) -> Any:
        import cupy

        nbytes = count * dtype.itemsize
        with cupy.cuda.Device(self._devices[rank]):
            try:
                memory = cupy.cuda.Memory(max(nbytes, 1))  # unpooled: the handle names this buffer alone
            except Exception as exc:  # noqa: BLE001 - CUDARuntimeError cudaErrorMemoryAllocation
                raise oom_or(exc, nbytes) from exc
            array = cupy.ndarray((count,), dtype=store_dtype(dtype), memptr=cupy.cuda.MemoryPointer(memory, 0))
            allocation.handle = cupy.cuda.runtime.ipcGetMemHandle(memory.ptr)
        allocation.memory, allocation.bases[rank] = memory, memory.ptr
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

    def end_point(self) -> None:
        import cupy

        for pointer in self._opened:
            cupy.cuda.runtime.ipcCloseMemHandle(pointer)
        self._opened.clear()

    # ---------------------------------------------------------------- the barrier between rounds

    def _flag_arrays(self) -> tuple[Any, Any]:
        """This rank's flags (one u64 slot per peer, then the epoch, then the error word),
        zeroed, and a device table of every rank's flag array as this GPU addresses it."""
        import cupy

        world = self.world_size
        memory = cupy.cuda.Memory(8 * (world + 2))
        cupy.cuda.runtime.memset(memory.ptr, 0, 8 * (world + 2))
        handles = self._all_gather(cupy.cuda.runtime.ipcGetMemHandle(memory.ptr))
        pointers = [memory.ptr if p == self.rank else cupy.cuda.runtime.ipcOpenMemHandle(h)
                    for p, h in enumerate(handles)]
        self._control.barrier()  # every rank's flags are zeroed before anyone signals into them
        return memory, cupy.asarray(np.array(pointers, dtype=np.uint64))

    def _step_barrier(self) -> None:
        from commbench.backends import cuda_kernels as K

        world, device = self.world_size, self._devices[self.rank]
        kernel = K.function("schedule_round.cu", "rank_barrier", device)
        base = self._flags_memory.ptr
        args = (self._peer_flags, np.uint64(base), np.uint64(base + 8 * world), np.int32(self.rank),
                np.int32(world), np.uint64(int(self.timeout_s * 1e9)), np.uint64(base + 8 * (world + 1)))
        kernel((1,), (max(32, -(-world // 32) * 32),), args, stream=self._streams[device])

    def check_errors(self) -> None:
        import cupy

        world = self.world_size
        word = cupy.ndarray((1,), dtype=np.int32, memptr=cupy.cuda.MemoryPointer(self._flags_memory, 8 * (world + 1)))
        missing = int(word.get()[0])
        if missing:
            raise RuntimeError(f"timed out after {self.timeout_s:g} s at a round barrier waiting for rank "
                               f"{missing - 1} (it died or hung)")

    # ---------------------------------------------------------------- control plane: gloo

    def barrier(self) -> None:
        self.synchronize()
        self._control.barrier()

    def gather(self, values: np.ndarray) -> np.ndarray | None:
        return self._control.gather(values)

    def agree_max(self, values: np.ndarray) -> np.ndarray:
        return self._control.agree_max(values)

    def gather_objects(self, obj: Any) -> list[Any] | None:
        return self._control.gather_objects(obj)

    def _all_gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._control._control)
        return out

    def close(self) -> None:
        self.end_point()
        self._control.close()
