"""shm: commbench's schedules on one host, through POSIX shared memory.

Every buffer the harness allocates lives in a shared-memory segment
(/dev/shm/cb_<job>_<rank>_<n>), which is how NCCL's user-buffer registration lets
peers address each other's memory. A transfer is a pull: the destination rank reads
the source's chunk straight from the source's segment and adds it into (NumPy),
or copies it into, its own buffer; nothing is copied twice.

Ranks synchronise through counters in one control segment, one per rank on its own
cache line (plain stores and loads: correct under x86-64's store ordering, which
the backend checks for; other architectures would need fences): a rank bumps its
counter when it finishes a round and waits until every
peer's counter has caught up (a barrier per round, so no chunk is read before it is
final or overwritten while a peer still reads it). Waiting busy-polls (waking a
process on another core costs tens of microseconds on a VM), then yields, then
sleeps with growing back-off, so that more ranks than cores still make progress.
A wait gives up after --timeout less the stop margin (launch.peer_wait_s), and within
about 0.1 s once a peer process has died (a zombie not yet reaped counts as dead).

Rounds with hazards (a rank written where a peer reads it in the same round:
one-shot allreduce in place) stage the result in a private buffer and write it
back after a barrier. Segments are unlinked after every point, at exit, on
SIGTERM, and, for ranks that `commbench sweep` spawned, by the spawner after the
ranks end (so a killed rank leaves nothing in /dev/shm).
"""
from __future__ import annotations

import atexit
import mmap
import os
import platform
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from commbench.backends.base import BackendError, OutOfMemory
from commbench.backends.schedule_base import ScheduleBackend, job_topology
from commbench.backends.torch_dist import TorchBackend
from commbench.collectives import DType
from commbench.launch import JOB_TAG_VAR, SHM_DIR, SPAWN_VAR, LaunchInfo, peer_wait_s, segment_prefix
from commbench.schedule import Schedule, hazards
from commbench.topology import Topology

LINE = 8  # int64 slots per cache line: one counter per line, so ranks never share one
SPIN_CHECKS = 20000  # pure spinning before yielding: ~2 ms at ~100 ns per check
OVERSUBSCRIBED_SPIN_CHECKS = 50  # more ranks than cores: the peer we wait for may need our core
_NUMPY_REDUCE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


@dataclass
class ShmBuffer:
    """Elements [offset, offset + count) of segment `seq`, viewed as `array` (bfloat16 kept as uint16)."""
    seq: int
    offset: int
    array: np.ndarray


class _Segment:
    def __init__(self, path: str, nbytes: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, max(nbytes, 1))  # reserve now: a full /dev/shm is an error, not SIGBUS
                except OSError as exc:
                    os.unlink(path)
                    raise OutOfMemory(f"/dev/shm has no room for {nbytes} bytes ({exc.strerror})") from exc
            self.map = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        self.path, self.nbytes = path, nbytes

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a NumPy view still exports it; the mapping goes when the view does
            pass


class ShmBackend(ScheduleBackend, TorchBackend):
    name = "shm"

    def __init__(self, launch: LaunchInfo, topology: Topology, algorithm: str = "auto", timeout_s: float = 300.0):
        self._check_layout(launch, topology)
        TorchBackend.__init__(self, launch, device="cpu", torch_backend="gloo", timeout_s=timeout_s)
        self.library = "shm"
        self.members = self._members(topology)  # the ranks that share memory with this one, in rank order
        np.seterr(over="ignore", invalid="ignore")  # in-place prod/sum timing loops overflow by design
        self.topology, self.algorithm, self.timeout_s = topology, algorithm, timeout_s
        self._wait_s = peer_wait_s(timeout_s)  # as the control plane's: the rest is for stopping the job
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._spin = SPIN_CHECKS if launch.local_world_size <= cores else OVERSUBSCRIBED_SPIN_CHECKS
        self.job = self.control.broadcast_object(  # rank 0's tag
            os.environ.get(SPAWN_VAR) or os.environ.get(JOB_TAG_VAR) or uuid.uuid4().hex[:10])
        self._own: dict[int, _Segment] = {}
        self._peers: dict[tuple[int, int], _Segment] = {}
        self._seq = 0
        self._ctl = self._control_segment()
        atexit.register(self._cleanup)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run atexit: unlink the segments

    def _check_layout(self, launch: LaunchInfo, topology: Topology) -> None:
        require_x86(self.name)
        if launch.nnodes > 1 or launch.local_world_size != launch.world_size:
            raise BackendError("--backend shm needs every rank on one host; across nodes use --backend hybrid or p2p")

    def _members(self, topology: Topology) -> list[int]:
        return list(range(self.world_size))

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> ShmBackend:
        return cls(launch, job_topology(cfg.topology, launch), cfg.algorithm, cfg.timeout_s)

    # ---------------------------------------------------------------- segments

    def _path(self, rank: int, seq: int | str) -> str:
        return os.path.join(SHM_DIR, f"{segment_prefix(self.job)}{rank}_{seq}")

    def _control_segment(self) -> np.ndarray:
        """One counter per member on its own cache line, then the members' pids. Created by the
        first member; every rank waits on the (untimed) control plane until it exists."""
        members, leader = self.members, self.members[0]
        nbytes = (len(members) * LINE * 2) * 8
        if self.rank == leader:
            self._ctl_seg = _Segment(self._path(leader, "ctl"), nbytes, create=True)
        self.gather_objects(None)
        if self.rank != leader:
            self._ctl_seg = _Segment(self._path(leader, "ctl"), nbytes, create=False)
        ctl = np.frombuffer(self._ctl_seg.map, dtype=np.int64)
        self._slot = members.index(self.rank)
        ctl[(len(members) + self._slot) * LINE] = os.getpid()  # second half: pids, to notice dead peers
        self.gather_objects(None)
        self._pids = [int(ctl[(len(members) + i) * LINE]) for i in range(len(members))]
        self._epoch = 0
        return ctl

    def alloc(self, count: int, dtype: DType) -> ShmBuffer:
        seq, self._seq = self._seq, self._seq + 1
        segment = _Segment(self._path(self.rank, seq), count * dtype.itemsize, create=True)
        self._own[seq] = segment
        return ShmBuffer(seq, 0, self._array(segment, dtype, 0, count))

    @staticmethod
    def _array(segment: _Segment, dtype: DType, offset: int, count: int) -> np.ndarray:
        store = np.uint16 if dtype.name == "bfloat16" else np.dtype(dtype.host)
        return np.frombuffer(segment.map, dtype=store, count=count, offset=offset * np.dtype(store).itemsize)

    def _peer_array(self, peer: int, buffer: ShmBuffer) -> np.ndarray:
        key = (peer, buffer.seq)
        if key not in self._peers:
            own = self._own[buffer.seq]
            self._peers[key] = _Segment(self._path(peer, buffer.seq), own.nbytes, create=False)
        full = np.frombuffer(self._peers[key].map, dtype=buffer.array.dtype)
        return full[buffer.offset:buffer.offset + len(buffer.array)]

    def end_point(self, failed: bool = False) -> None:
        """Unlink this point's segments; peers that still map one keep it until they unmap
        (the same after a failed point: nothing here waits for a peer)."""
        for segment in list(self._peers.values()):
            segment.close()
        self._peers.clear()
        for segment in self._own.values():
            _unlink(segment.path)
            segment.close()
        self._own.clear()

    def _cleanup(self) -> None:
        self.end_point()
        if hasattr(self, "_ctl_seg") and self.rank == self.members[0]:
            _unlink(self._ctl_seg.path)

    def close(self) -> None:
        self._cleanup()
        TorchBackend.close(self)

    # ---------------------------------------------------------------- buffers (harness side)

    def view(self, buffer: ShmBuffer, start: int, count: int) -> ShmBuffer:
        if start == 0 and count == len(buffer.array):
            return buffer
        return ShmBuffer(buffer.seq, buffer.offset + start, buffer.array[start:start + count])

    def upload(self, buffer: ShmBuffer, values: np.ndarray, rank: int) -> None:
        buffer.array[...] = _to_store(values, buffer.array.dtype)

    def fill(self, buffer: ShmBuffer, value: float) -> None:
        buffer.array[...] = _to_store(np.array([value], dtype=np.float64), buffer.array.dtype)[0]

    def download(self, buffer: ShmBuffer, start: int, count: int, rank: int) -> np.ndarray:
        part = buffer.array[start:start + count]
        return _bf16_to_float32(part) if part.dtype == np.uint16 else part.copy()  # uint16 storage = bfloat16

    def length(self, buffer: ShmBuffer) -> int:
        return len(buffer.array)

    def itemsize(self, buffer: ShmBuffer) -> int:
        return buffer.array.itemsize

    def scratch(self, count: int, like: ShmBuffer) -> ShmBuffer:
        dtype = _dtype_of(like.array)
        buffer = self.alloc(count, dtype)
        self.gather_objects(None)  # peers map it while preparing: it must exist on every rank first
        return buffer

    def copy(self, dst: ShmBuffer, src: ShmBuffer, only_rank: int | None = None) -> None:
        if only_rank is None or only_rank == self.rank:
            np.copyto(dst.array, src.array)

    def scale(self, buffer: ShmBuffer, factor: float) -> None:
        array = buffer.array
        if array.dtype == np.uint16:
            array[...] = _float32_to_bf16(_bf16_to_float32(array) * np.float32(factor))
        else:
            np.multiply(array, array.dtype.type(factor), out=array)

    # ---------------------------------------------------------------- synchronisation

    def _arrive_and_wait(self) -> None:
        """Barrier of the members through the control segment: bump my counter, wait for every peer's."""
        self._epoch += 1
        ctl, epoch = self._ctl, self._epoch
        ctl[self._slot * LINE] = epoch
        for peer in range(len(self.members)):
            if ctl[peer * LINE] < epoch:
                self._wait(peer, epoch)

    def _wait(self, peer: int, epoch: int) -> None:
        """Wait until member number `peer` reaches `epoch`: spin, then yield, then sleep with back-off."""
        ctl, slot = self._ctl, peer * LINE
        checks, started, pause, spin = 0, None, 1e-6, self._spin
        while ctl[slot] < epoch:
            checks += 1
            if checks < spin:
                continue
            if started is None:
                started = time.monotonic()
            if checks % 64 == 0:  # sleeping: every ~64 ms at most, also whether the peer is a zombie
                self._check_peer(peer, started, reaped_only=checks < 2 * spin)
            if checks < 2 * spin:
                os.sched_yield()
            else:
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)

    def _check_peer(self, peer: int, started: float, reaped_only: bool = False) -> None:
        rank, pid = self.members[peer], self._pids[peer]
        if not _alive(pid, reaped_only):
            raise RuntimeError(f"rank {rank} (pid {pid}) died")
        if time.monotonic() - started > self._wait_s:
            raise RuntimeError(f"timed out after {self._wait_s:.3g} s waiting for rank {rank}")

    def barrier(self) -> None:
        self._arrive_and_wait()

    # ---------------------------------------------------------------- running a schedule

    def executor(self, schedule: Schedule, working: ShmBuffer, op: str) -> Callable[[], None]:
        # Whether a round needs the write-back barrier is decided from the round itself, so every
        # rank meets the same number of barriers even when only some of them stage.
        plan = [(*self._round_plan(rnd, working, op), bool(hazards(rnd))) for rnd in schedule.rounds]
        arrive = self._arrive_and_wait

        def call() -> None:
            arrive()  # every rank's input is in place, and nobody still reads the previous call
            for steps, staged, hazardous in plan:
                for step in steps:
                    step()
                arrive()
                for step in staged:  # hazard rounds: write back after every peer has read
                    step()
                if hazardous:
                    arrive()
        return call

    def _round_plan(self, rnd, working: ShmBuffer, op: str) -> tuple[list[Callable[[], Any]], list[Callable[[], Any]]]:
        """Pre-built closures over fixed views, so the timed loop only calls them."""
        mine = working.array
        incoming = [t for t in rnd if t.dst == self.rank]
        reduce = _reducer(op, mine.dtype)
        if self.rank not in hazards(rnd):
            steps = []
            for t in incoming:
                dst, src = mine[t.chunk[0]:t.chunk[1]], self._peer_array(t.src, working)[t.chunk[0]:t.chunk[1]]
                steps.append(_pull(reduce, dst, src, t.reduce))
            return steps, []
        # Stage into a private copy of my whole buffer region that this round writes.
        lo, hi = min(t.chunk[0] for t in incoming), max(t.chunk[1] for t in incoming)
        stage = np.empty(hi - lo, dtype=mine.dtype)
        first = incoming[0]
        if first.reduce and first.chunk == (lo, hi):  # stage = mine op peer in one pass, not copy then reduce
            src = self._peer_array(first.src, working)[lo:hi]
            steps = [lambda s=src: reduce(mine[lo:hi], s, stage)]
            incoming = incoming[1:]
        else:
            steps = [lambda: np.copyto(stage, mine[lo:hi])]
        for t in incoming:
            dst = stage[t.chunk[0] - lo:t.chunk[1] - lo]
            src = self._peer_array(t.src, working)[t.chunk[0]:t.chunk[1]]
            steps.append(_pull(reduce, dst, src, t.reduce))
        return steps, [lambda: np.copyto(mine[lo:hi], stage)]


# ---------------------------------------------------------------- dtype helpers


def _pull(reduce, dst: np.ndarray, src: np.ndarray, is_reduce: bool) -> Callable[[], Any]:
    """One pre-built step: dst op= src, or dst = src (views fixed when the call is prepared)."""
    return (lambda: reduce(dst, src, dst)) if is_reduce else (lambda: np.copyto(dst, src))


def require_x86(backend: str) -> None:
    """The counters are plain stores and loads: right under x86-64's store ordering only."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise BackendError(f"--backend {backend} relies on x86-64 store ordering for its flags; this is "
                           f"{platform.machine()} (use --backend p2p)")


def _reducer(op: str, store: np.dtype) -> Callable[[np.ndarray, np.ndarray, np.ndarray], Any]:
    if store != np.uint16:
        return _NUMPY_REDUCE["sum" if op == "avg" else op]
    fn = _NUMPY_REDUCE["sum" if op == "avg" else op]

    def bf16(dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:  # NumPy has no bfloat16: widen, reduce, round
        dst[...] = _float32_to_bf16(fn(_bf16_to_float32(a), _bf16_to_float32(b)))
    return lambda d, s, out: bf16(out, d, s)


def _bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _float32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits, to nearest even (NaN stays NaN)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    one, half = np.uint32(1), np.uint32(0x7FFF)
    rounded = ((bits + half + ((bits >> np.uint32(16)) & one)) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _to_store(values: np.ndarray, store: np.dtype) -> np.ndarray:
    return _float32_to_bf16(values.astype(np.float32)) if store == np.uint16 else values.astype(store)


def _dtype_of(array: np.ndarray) -> DType:
    from commbench.collectives import DTYPES

    if array.dtype == np.uint16:
        return DTYPES["bfloat16"]
    return next(d for d in DTYPES.values() if np.dtype(d.host) == array.dtype and d.name != "bfloat16")


def _alive(pid: int, reaped_only: bool = False) -> bool:
    """Whether process `pid` still runs. A dead process that its parent has not reaped yet (a zombie)
    still answers kill(pid, 0), so unless `reaped_only` its state is read too (Linux /proc; elsewhere
    kill alone)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # PermissionError: the pid went to another user's process
        return False
    if reaped_only:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
