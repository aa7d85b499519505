"""torch.distributed backend: gloo on CPU, NCCL on GPU, as DDP and FSDP use them.

Each collective is the plain torch.distributed call a user would write. torch has
no out-of-place all_reduce, broadcast or reduce, so the out-of-place column for
those is `recv.copy_(send)` followed by the in-place call, both timed (this is
what DDP does with its gradient buckets); docs/metrics.md says so next to the
metrics. Timing uses perf_counter around each call on CPU (gloo calls block until
done) and CUDA events on the current stream on GPU.
"""
from __future__ import annotations

import datetime
import inspect
import os
import socket
import sys
import tempfile
import threading
import time
from typing import Callable
from urllib.parse import parse_qs, urlparse

import numpy as np

from commbench.backends.base import Backend, BackendError, OutOfMemory
from commbench.backends.control import GroupControl
from commbench.backends.torch_lazy import LazyModule, cuda_available
from commbench.collectives import COLLECTIVES, DType, refused_world
from commbench.errors import mentions_out_of_memory
from commbench.launch import LaunchInfo, peer_wait_s

# torch on first use: the parent settles options and prints before a rank imports torch (torch_lazy)
torch = LazyModule("torch", globals(), "torch")
dist = LazyModule("torch.distributed", globals(), "dist")
REDUCE_OPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}  # dist.ReduceOp's
LOOPBACK, LOOPBACK_SCHEME = "127.0.0.1", "commbench-loopback"  # a local spawn's rendezvous


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
        if self.device == "cuda":
            torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
        self._torch_device = torch.device(self.device, torch.cuda.current_device()) \
            if self.device == "cuda" else torch.device("cpu")
        wait_s = peer_wait_s(timeout_s)  # the rest of --timeout is the supervisor's, to stop the job
        timeout = datetime.timedelta(seconds=wait_s)
        takes_device = "device_id" in inspect.signature(dist.init_process_group).parameters  # torch >= 2.2
        kwargs = {"device_id": self._torch_device} if self.device == "cuda" and takes_device else {}
        groups = []

        def join() -> None:
            dist.init_process_group(self.library, init_method=_init_method(launch), rank=launch.rank,
                                    world_size=launch.world_size, timeout=timeout, **kwargs)
            # Control traffic (iteration counts, times) goes through gloo on the CPU, never the measured NCCL stream.
            groups.append(dist.group.WORLD if self.library == "gloo" else dist.new_group(backend="gloo",
                                                                                        timeout=timeout))

        _rendezvous(join, wait_s, launch)
        self.control = GroupControl(groups[0], self.rank, self.world_size)

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
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # newer torch's name
            call = lambda: gather(recv, send)  # noqa: E731
        elif collective == "reduce_scatter":
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
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
        if self.device == "cuda":
            return self._time_cuda(call, iters)
        times = [0.0] * iters  # a list store is cheaper than a NumPy one inside the timed loop
        clock = time.perf_counter
        for i in range(iters):
            start = clock()
            call()
            times[i] = clock() - start
        return np.array(times) * 1e6

    def _time_cuda(self, call: Callable[[], None], iters: int) -> np.ndarray:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            start.record()
            call()
            end.record()
        torch.cuda.synchronize()
        return np.array([start.elapsed_time(end) * 1e3 for start, end in events])

    def synchronize(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def barrier(self) -> None:
        if self.device == "cuda":
            dist.barrier(device_ids=[torch.cuda.current_device()])
            torch.cuda.synchronize()
        else:
            dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _init_method(launch: LaunchInfo) -> str:
    """How the ranks find each other. A local spawn exposes nothing beyond loopback: its store listens
    on 127.0.0.1 only (torch's own TCPStore server listens on every interface, whatever address it is
    given) and gloo and NCCL open their sockets on the loopback interface. torchrun: env:// (it may serve
    the store from its agent); SLURM and MPI: a TCP store at the address the launcher gives."""
    if launch.launcher == "spawn":
        _use_loopback_interface()
        _register_loopback_rendezvous()
        return f"{LOOPBACK_SCHEME}://{LOOPBACK}:{launch.master_port}"
    if launch.launcher == "torchrun" and "MASTER_ADDR" in os.environ:
        return "env://"
    return f"tcp://{launch.master_addr}:{launch.master_port}"


def _use_loopback_interface() -> None:
    """gloo listens on the address the host name resolves to, NCCL's bootstrap on the first interface
    that is not loopback; the ranks of a local spawn only ever talk to each other on this host."""
    names = {name for _, name in socket.if_nameindex()}
    loopback = next((name for name in ("lo", "lo0") if name in names), None)
    if loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = loopback


def _register_loopback_rendezvous() -> None:
    """Teach torch's init_process_group the `commbench-loopback://` scheme, once per process."""
    from torch.distributed.rendezvous import register_rendezvous_handler

    try:
        register_rendezvous_handler(LOOPBACK_SCHEME, _loopback_rendezvous)
    except RuntimeError:  # "already registered": a second backend in this process
        pass


def _loopback_rendezvous(url: str, timeout: datetime.timedelta, **_):
    """torch rendezvous handler (a generator of (store, rank, world size)): rank 0 serves the store
    on a socket it has bound to 127.0.0.1 itself, the other ranks connect to it."""
    parsed = urlparse(url)
    query = {key: int(values[0]) for key, values in parse_qs(parsed.query).items()}
    rank, world, port = query["rank"], query["world_size"], parsed.port
    listen_fd = _listen_on_loopback(port) if rank == 0 else None
    yield dist.TCPStore(LOOPBACK, port, world, rank == 0, timeout, master_listen_fd=listen_fd), rank, world
    raise RuntimeError("a local spawn's rendezvous happens once")


def _listen_on_loopback(port: int) -> int:
    """A socket bound to 127.0.0.1:port, handed over (as its file descriptor) to the store's server."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own server does
        sock.bind((LOOPBACK, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"local rendezvous: cannot listen on {LOOPBACK}:{port} ({exc.strerror})") from exc
    return sock.detach()


def _rendezvous(join: Callable[[], None], wait_s: float, launch: LaunchInfo) -> None:
    """Run `join` (the rendezvous) on a helper thread, waiting for it here for at most `wait_s`. The main
    thread stays where Ctrl-C and SIGTERM reach it (torch's store waits in C++, which holds a Python signal
    handler back until it returns, and retries an absent peer for longer than its timeout), and a failed
    rendezvous is one line: the store's C++ log (C++ stack frames for each retry) is held back and dropped."""
    outcome: list[BaseException] = []
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def run() -> None:
        try:
            if device is not None:  # the current CUDA device is per thread
                torch.cuda.set_device(device)
            join()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome.append(exc)

    thread = threading.Thread(target=run, name="commbench-rendezvous", daemon=True)
    with _HeldStderr() as held:
        thread.start()
        thread.join(wait_s)
        held.keep = not thread.is_alive() and not outcome  # a failed one is one line, without the store's C++ log
    if thread.is_alive():  # left behind, blocked in C++: the rank is about to end
        raise RuntimeError(f"rendezvous at {launch.master_addr}:{launch.master_port} timed out after "
                           f"{wait_s:.3g} s: not all {launch.world_size} ranks joined")
    if outcome:
        raise outcome[0]


class _HeldStderr:
    """Hold back what is written to file descriptor 2 (torch's C++ log) and write it out at the end only
    if `keep` (by default, and when an exception ends the block, it is dropped)."""

    def __init__(self) -> None:
        self.keep = False

    def __enter__(self) -> _HeldStderr:
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile()
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc_info: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        if self.keep and exc_info[0] is None:
            self.file.seek(0)
            os.write(2, self.file.read())
        self.file.close()


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
