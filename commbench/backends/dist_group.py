"""A rank's place in a torch.distributed job, as one object a backend owns (`DistGroup`): the rendezvous,
the gloo control plane, and the timed loop on the device's own clock. The torch and p2p backends run their
calls on it; shm and hybrid (and cupy and cuda's ipc mode, beside NCCL or CUDA IPC) own one for the control
plane and the rendezvous only, so no backend inherits another to reach them.

The rendezvous: a local spawn's store listens on 127.0.0.1 only, and its sockets use the loopback interface;
torchrun's is env://, SLURM's and MPI's a TCP store at the launcher's address. It runs on a helper thread, so
Ctrl-C and SIGTERM reach the rank while torch's store waits in C++, and a failed one is one line (the
store's C++ log is held back and dropped).
"""
from __future__ import annotations

import contextlib
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

from commbench.backends.control import GroupControl
from commbench.backends.torch_lazy import LazyModule
from commbench.launch import STORE_FD_VAR, loopback_socket, peer_wait_s
from commbench.launchers import LaunchInfo

# torch on first use: the parent settles options and prints before a rank imports torch (torch_lazy)
torch = LazyModule("torch", globals(), "torch")
dist = LazyModule("torch.distributed", globals(), "dist")
LOOPBACK, LOOPBACK_SCHEME = "127.0.0.1", "commbench-loopback"  # a local spawn's rendezvous


class DistGroup:
    """This rank joined to the job's torch.distributed group on `library` (gloo or nccl), with `device`
    (cpu or cuda, already resolved) its current device. `control`: the control plane, gloo on the CPU
    (the whole group under gloo; beside NCCL, a gloo group of its own, never the measured stream)."""

    def __init__(self, launch: LaunchInfo, device: str, library: str, timeout_s: float = 300.0):
        self.device, self.library = device, library
        if device == "cuda":
            torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
        self.torch_device = torch.device(device, torch.cuda.current_device()) \
            if device == "cuda" else torch.device("cpu")
        wait_s = peer_wait_s(timeout_s)  # the rest of --timeout is the supervisor's, to stop the job
        timeout = datetime.timedelta(seconds=wait_s)
        takes_device = "device_id" in inspect.signature(dist.init_process_group).parameters  # torch >= 2.2
        kwargs = {"device_id": self.torch_device} if device == "cuda" and takes_device else {}
        groups = []

        def join() -> None:
            dist.init_process_group(library, init_method=_init_method(launch), rank=launch.rank,
                                    world_size=launch.world_size, timeout=timeout, **kwargs)
            # Control traffic (iteration counts, times) goes through gloo on the CPU, never the measured NCCL stream.
            groups.append(dist.group.WORLD if library == "gloo" else dist.new_group(backend="gloo",
                                                                                   timeout=timeout))

        _rendezvous(join, wait_s, launch)
        self.control = GroupControl(groups[0], launch.rank, launch.world_size)

    def time_iterations(self, call: Callable[[], None], iters: int) -> np.ndarray:
        """`call` run `iters` times back to back; each one's time in us: perf_counter around each call on the
        CPU (gloo calls block until done), CUDA events on the current stream on a GPU."""
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
        stream = torch.cuda.current_stream()  # once: Event.record() otherwise makes a Python Stream object on
        for start, end in events:  # every call, host time in a loop the H100 run found 17-20 us a call slower than a
            start.record(stream)  # bare one (docs/gpu.md; what this saves is not measured yet)
            call()
            end.record(stream)
        torch.cuda.synchronize()
        return np.array([start.elapsed_time(end) * 1e3 for start, end in events])

    def synchronize(self) -> None:
        """Wait for the work this rank issued (a GPU's; on the CPU every call has ended when it returns)."""
        if self.device == "cuda":
            torch.cuda.synchronize()

    def barrier(self) -> None:
        """Every rank of the job arrives before any leaves, through the group itself."""
        if self.device == "cuda":
            dist.barrier(device_ids=[torch.cuda.current_device()])
            torch.cuda.synchronize()
        else:
            dist.barrier()

    def close(self) -> None:
        """Leave the job: torch.distributed's default group is destroyed (a second close finds none)."""
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
    yield _store(port, world, rank, timeout), rank, world
    raise RuntimeError("a local spawn's rendezvous happens once")


def _store(port: int, world: int, rank: int, timeout: datetime.timedelta):
    """The rendezvous store: rank 0 serves it on a socket bound here, the others connect. torch's libuv server (its
    default) refused a socket handed to it on torch 2.6.0 ("does not support initialization with an listen fd":
    every rank-starting command failed); there the classic server takes a fresh one. libuv stays first where it
    works: the one CI run with the classic server on every torch had two rendezvous time out under load (not
    shown to be its doing, but the libuv server had passed every CI run before)."""
    if rank != 0:
        return dist.TCPStore(LOOPBACK, port, world, False, timeout)
    listen_fd = _spawners_socket(port)
    if listen_fd is None:
        listen_fd = _listen_on_loopback(port)
    try:
        return dist.TCPStore(LOOPBACK, port, world, True, timeout, master_listen_fd=listen_fd)
    except RuntimeError as exc:
        if "listen fd" not in str(exc):
            raise
        with contextlib.suppress(OSError):  # the refused socket still holds the port
            os.close(listen_fd)
    return dist.TCPStore(LOOPBACK, port, world, True, timeout, master_listen_fd=_listen_on_loopback(port),
                         use_libuv=False)


def _spawners_socket(port: int) -> int | None:
    """The socket launch.spawn_local bound to the store's port and handed to rank 0 (its file descriptor), taken
    once (a second store in this process binds its own); None where there is none, or it is not on `port`."""
    fd = os.environ.pop(STORE_FD_VAR, "")
    if not fd.isdigit() or len(fd) > 9:
        return None
    try:
        sock = socket.socket(fileno=int(fd))
    except OSError:  # not an open socket: a stray variable
        return None
    try:
        mine = sock.getsockname() == (LOOPBACK, port)
    except OSError:
        mine = False
    fd_number = sock.detach()  # left open where it is not ours: another descriptor of this process
    return fd_number if mine else None


def _listen_on_loopback(port: int) -> int:
    """A socket bound to 127.0.0.1:port, handed over (as its file descriptor) to the store's server."""
    try:
        return loopback_socket(port).detach()
    except OSError as exc:
        raise RuntimeError(f"local rendezvous: cannot listen on {LOOPBACK}:{port} ({exc.strerror})") from exc


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


