"""torch.distributed backend: gloo on CPU, NCCL on GPU, as DDP and FSDP use them.

Each collective is the plain torch.distributed call a user would write. torch has
no out-of-place all_reduce, broadcast or reduce, so the out-of-place column for
those is `recv.copy_(send)` followed by the in-place call, both timed (this is
what DDP does with its gradient buckets); docs/metrics.md says so next to the
metrics. Timing uses perf_counter around each call on CPU (gloo calls block until
done) and CUDA events on the current stream on GPU. The process group, its rendezvous,
the control plane and the timed loop are the backend's `group` (backends/dist_group.py).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from commbench.backends.base import Backend, BackendError, OutOfMemory
from commbench.backends.dist_group import DistGroup
from commbench.backends.nccl_defects import one_rank_avg_defect, say_once
from commbench.backends.torch_calls import shard_calls
from commbench.backends.torch_lazy import LazyModule, cuda_available
from commbench.collectives import COLLECTIVES, DType, refused_world
from commbench.errors import mentions_out_of_memory
from commbench.launchers import LaunchInfo

# torch on first use: the parent settles options and prints before a rank imports torch (torch_lazy)
torch = LazyModule("torch", globals(), "torch")
dist = LazyModule("torch.distributed", globals(), "dist")
REDUCE_OPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}  # dist.ReduceOp's


def default_library(device: str) -> str:
    """torch.distributed's library for a device, as DDP picks it: NCCL on a GPU, gloo on a CPU."""
    return "nccl" if device == "cuda" else "gloo"


def resolve_device(device: str, torch_backend: str) -> tuple[str, str]:
    """(device, library) for `--device` and `--torch-backend`, or a one-line BackendError."""
    # auto: no GPU device node means no CUDA without importing torch; an explicit cuda asks torch itself
    has_cuda = cuda_available() if device == "auto" else device == "cuda" and torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if has_cuda and torch_backend != "gloo" else "cpu"
    if device == "cuda" and not has_cuda:
        raise BackendError("--device cuda: no CUDA device is visible to torch "
                           f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
    library = torch_backend if torch_backend != "auto" else default_library(device)
    if library == "nccl" and device != "cuda":
        raise BackendError("--torch-backend nccl needs --device cuda (NCCL runs on GPUs only)")
    if library not in ("gloo", "nccl"):
        raise BackendError(f"unknown --torch-backend {library!r}; choose gloo or nccl")
    return device, library


def unsupported(library: str, collective: str, dtype: DType, op: str | None, placement: str) -> str | None:
    """Why torch.distributed on `library` cannot run this, or None."""
    if op == "avg" and not dtype.is_float and library == "gloo":
        return f"gloo has no avg for integer dtype {dtype.name}"
    return None


class TorchBackend(Backend):
    name = "torch"
    launches_async = True  # DDP-like overlap in the proxy: the library queues the calls
    runs_rank_groups = True  # torch.distributed's subgroups (FSDP's and ZeRO's shards)
    makes_ddp_calls = True  # torch.distributed is what DDP training calls

    @classmethod
    def resolve_device(cls, cfg) -> tuple[str, str]:
        return resolve_device(cfg.device, cfg.torch_backend)

    @classmethod
    def default_world(cls, cfg, device: str) -> int:
        return torch.cuda.device_count() if device == "cuda" else 2

    @classmethod
    def check_request(cls, cfg, library: str, collectives: list[str], dtype: DType, op: str, world: int) -> None:
        for name in collectives:
            if refused_world(name, world):
                raise BackendError(refused_world(name, world))
            reason = unsupported(library, name, dtype, op if COLLECTIVES[name].reduces else None, "both")
            if reason:
                raise BackendError(f"--op {op} with --dtype {dtype.name}: {reason}")
        if library == "nccl" and world == 1 and op == "avg":  # NVIDIA/nccl#1950; allreduce and reduce are copied
            say_once(one_rank_avg_defect(_torch_nccl_version(), world, op, dtype, collectives, ("reduce_scatter",)))

    def header_notes(self, collectives: tuple[str, ...], placements: tuple[str, ...], hw: str | None) -> list[str]:
        copied = [name for name in ("allreduce", "broadcast", "reduce") if name in collectives]
        if not copied or "out-of-place" not in placements:
            return []
        return [f"torch has no out-of-place {'/'.join(copied)}: out-of-place = copy + in-place call, both timed"]

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> TorchBackend:
        return cls(launch, device=cfg.device, torch_backend=cfg.torch_backend, timeout_s=cfg.timeout_s)

    def __init__(self, launch: LaunchInfo, device: str = "auto", torch_backend: str = "auto",
                 timeout_s: float = 300.0):
        self.device, self.library = resolve_device(device, torch_backend)
        self.rank, self.world_size = launch.rank, launch.world_size
        self.group = DistGroup(launch, self.device, self.library, timeout_s)  # the rendezvous, the timed loop
        self._torch_device, self.control = self.group.torch_device, self.group.control

    # ---------------------------------------------------------------- buffers

    def unsupported(self, collective: str, dtype: DType, op: str | None, placement: str) -> str | None:
        return unsupported(self.library, collective, dtype, op, placement)

    def alloc(self, count: int, dtype: DType) -> torch.Tensor:
        try:
            return torch.empty(count, dtype=getattr(torch, dtype.name), device=self._torch_device)
        except (RuntimeError, MemoryError) as exc:
            raise _as_oom(exc, count * dtype.itemsize, self.device) from exc

    def device_memory(self) -> dict[str, int]:
        if self.device != "cuda":
            return {}
        from commbench.point_timing import nvml_used_bytes

        return {"torch_allocated_peak_bytes": int(torch.cuda.max_memory_allocated()),
                "torch_reserved_bytes": int(torch.cuda.memory_reserved()),
                **nvml_used_bytes(torch.cuda.current_device())}

    def view(self, buffer: torch.Tensor, start: int, count: int) -> torch.Tensor:
        if start == 0 and count == buffer.numel():
            return buffer  # a narrowed view costs ~0.4 us per call in the timed loop
        return buffer.narrow(0, start, count)

    def upload(self, buffer: torch.Tensor, values: np.ndarray, rank: int) -> None:
        buffer.copy_(torch.from_numpy(values))

    def fill(self, buffer: torch.Tensor, value: float) -> None:
        buffer.fill_(value)

    def download(self, buffer: torch.Tensor, start: int, count: int, rank: int) -> np.ndarray:
        part = buffer.narrow(0, start, count).cpu()
        return part.float().numpy() if part.dtype == torch.bfloat16 else part.numpy()

    # ---------------------------------------------------------------- the measured call

    def prepare(self, collective: str, send: torch.Tensor, recv: torch.Tensor, op: str | None, root: int,
                inplace: bool, splits: tuple | None = None) -> Callable[[], None]:
        if collective in ("gather", "scatter", "alltoallv", "hypercube"):
            return _personalized(collective, send, recv, root, self.rank, self.world_size, splits)
        reduce_op = getattr(dist.ReduceOp, REDUCE_OPS[op]) if op else None
        rank, world = self.rank, self.world_size
        copy_first = not inplace and collective in ("allreduce", "broadcast", "reduce")
        if collective == "allreduce" and op == "sum":
            call = lambda: dist.all_reduce(recv)  # noqa: E731 - the default op, as users write it (~1 us cheaper)
        elif collective == "allreduce":
            call = lambda: dist.all_reduce(recv, op=reduce_op)  # noqa: E731
        elif collective == "broadcast":
            call = lambda: dist.broadcast(recv, src=root)  # noqa: E731
            copy_first = copy_first and rank == root
        elif collective == "reduce":
            call = lambda: dist.reduce(recv, dst=root, op=reduce_op)  # noqa: E731
        elif collective == "allgather":
            gather = shard_calls(dist)[0]  # newer torch's name where it has it (backends/torch_calls.py)
            call = lambda: gather(recv, send)  # noqa: E731
        elif collective == "reduce_scatter":
            scatter = shard_calls(dist)[1]
            call = lambda: scatter(recv, send, op=reduce_op)  # noqa: E731
        elif collective == "alltoall":
            call = lambda: dist.all_to_all_single(recv, send)  # noqa: E731
        elif collective == "sendrecv":
            call = _sendrecv(send, recv, (rank + 1) % world, (rank - 1) % world)
        else:
            raise BackendError(f"torch backend cannot run {collective!r}")
        if copy_first:
            inner = call

            def call() -> None:
                recv.copy_(send)
                inner()
        return call

    def time_iterations(self, call: Callable[[], None], iters: int) -> np.ndarray:
        return self.group.time_iterations(call, iters)

    def synchronize(self) -> None:
        self.group.synchronize()

    def barrier(self) -> None:
        self.group.barrier()

    def close(self) -> None:
        self.group.close()
def _sendrecv(send: torch.Tensor, recv: torch.Tensor, peer_next: int, peer_prev: int) -> Callable[[], None]:
    """Each rank sends to the next rank and receives from the previous one, as nccl-tests' sendrecv.
    The receive is posted first: with the send first, gloo ran the two directions one after the
    other (half the link each way between two emulated nodes, docs/emulation.md)."""
    def call() -> None:
        ops = [dist.P2POp(dist.irecv, recv, peer_prev), dist.P2POp(dist.isend, send, peer_next)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return call


def _personalized(collective: str, send: torch.Tensor, recv: torch.Tensor, root: int, rank: int, world: int,
                  splits: tuple | None) -> Callable[[], None]:
    """gather, scatter, alltoallv and hypercube as a user writes them with torch.distributed (gather and
    scatter with a list of the root's chunks, alltoallv as all_to_all_single with split sizes)."""
    if collective == "gather":
        parts = list(recv.chunk(world)) if rank == root else None
        return lambda: dist.gather(send, gather_list=parts, dst=root)
    if collective == "scatter":
        parts = list(send.chunk(world)) if rank == root else None
        return lambda: dist.scatter(recv, scatter_list=parts, src=root)
    if collective == "alltoallv":
        sent, received = list(splits[rank]), [row[rank] for row in splits]
        used = recv.narrow(0, 0, sum(received))  # the buffer holds the largest rank's receipt
        return lambda: dist.all_to_all_single(used, send, output_split_sizes=received, input_split_sizes=sent)
    return _hypercube(send, recv, rank, world)


def _hypercube(send: torch.Tensor, recv: torch.Tensor, rank: int, world: int) -> Callable[[], None]:
    """nccl-tests' hypercube (src/hypercube.cu): an allgather by recursive doubling. The own chunk is
    copied into place, then in step k each rank swaps the 2^k chunks it holds with rank xor 2^k."""
    chunk = send.numel()
    steps = []
    mask = 1
    while mask < world:
        held = rank & ~(mask - 1)
        steps.append((recv.narrow(0, held * chunk, mask * chunk), recv.narrow(0, (held ^ mask) * chunk, mask * chunk),
                      rank ^ mask))
        mask <<= 1
    own = recv.narrow(0, rank * chunk, chunk)

    def call() -> None:
        if own.data_ptr() != send.data_ptr():
            own.copy_(send)
        for outgoing, incoming, peer in steps:
            ops = [dist.P2POp(dist.irecv, incoming, peer), dist.P2POp(dist.isend, outgoing, peer)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()
    return call


def _as_oom(exc: BaseException, nbytes: int, device: str) -> BaseException:
    if isinstance(exc, MemoryError) or mentions_out_of_memory(str(exc)) \
            or isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return OutOfMemory(f"could not allocate {nbytes} bytes on {device}")
    return exc


def _torch_nccl_version() -> int | None:
    """The NCCL torch was built with, as NCCL's integer (2.28.9: 22809), or None."""
    try:
        import torch

        major, minor, patch = torch.cuda.nccl.version()
        return major * 10000 + minor * 100 + patch
    except Exception:  # noqa: BLE001 - a warning must never end a run
        return None
