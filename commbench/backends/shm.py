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
process on another core costs tens of microseconds on a VM), then polls between
sched_yield calls (which hand the core to a runnable peer at once), then blocks in
the kernel (a futex on the peer's counter, Linux) until the peer arrives, so that
more ranks than cores still make progress and a rank that waits long burns no core.
Each of the first two phases lasts ~SPIN_CHECKS reads when every rank of the job on
this host has a core of its own, and only OVERSUBSCRIBED_SPIN_CHECKS when they do not
(then the peer we wait for may need our core); within that budget the spin adapts to
how long waits take (halved by a wait that blocks, doubled by one that does not), so
that other processes loading the cores do not make every rank spin a full budget.
A rank that blocks raises its byte in a flags word; a rank that arrives wakes its
counter's waiters only when some flag is up, so ranks that never block never pay for
a system call. The flag and the counter are
plain stores (x86 may order a store after a later load), so a wake-up can be missed:
a blocked wait therefore re-reads the counter at least every millisecond. Without a
futex (not Linux) the wait yields and sleeps with growing back-off instead.
A wait gives up after --timeout less the stop margin (launch.peer_wait_s), and within
about 0.1 s once a peer process has died (a zombie not yet reaped counts as dead).

A call runs as one flat plan of steps (barriers, copies, reductions over views fixed when the call
is prepared), executed by the native executor (shm_native.c: the whole plan in one ctypes call; its
barrier spins, then hands the wait back here to block) or by the Python one below (one NumPy call or
barrier closure per step), the reference and the fallback: $COMMBENCH_SHM_EXECUTOR (shm_native.py).
Both keep the protocol above on the same counters and give bitwise the same results.

Rounds with hazards (a rank written where a peer reads it in the same round:
one-shot allreduce in place) stage the result in a private buffer and write it
back after a barrier. Segments are unlinked after every point, at exit, on
SIGTERM, and, for ranks that `commbench sweep` spawned, by the spawner after the
ranks end (so a killed rank leaves nothing in /dev/shm).
"""
from __future__ import annotations

import atexit
import ctypes
import functools
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

from commbench.backends import shm_native
from commbench.backends.base import BackendError, OutOfMemory
from commbench.backends.schedule_base import ScheduleBackend, job_topology
from commbench.backends.torch_dist import TorchBackend
from commbench.collectives import DType
from commbench.launch import JOB_TAG_VAR, SHM_DIR, SPAWN_VAR, LaunchInfo, peer_wait_s, segment_prefix
from commbench.schedule import Schedule, hazards, pipelined
from commbench.topology import Topology

LINE = 8  # int64 slots per cache line: one counter per line, so ranks never share one
SPIN_CHECKS = 20000  # pure spinning before blocking: ~2 ms at ~100 ns per check
OVERSUBSCRIBED_SPIN_CHECKS = 50  # more ranks than cores: the peer we wait for may need our core
BLOCK_TIMEOUT_NS = 1_000_000  # a blocked wait re-reads the counter (and misses no wake-up for longer)
PIPELINE_SLICES_PER_LLC = 8  # in flight per round: ~4 slices (a reduce and a copy, 2 ranks) in the cache
PEER_CHECK_BLOCKS = 64  # blocked waits between checks for a dead peer or the timeout (~64 ms at most)
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
            self.map = _map(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        self.path, self.nbytes = path, nbytes

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a NumPy view still exports it; the mapping goes when the view does
            pass


def _map(fd: int, nbytes: int) -> mmap.mmap:
    """The segment mapped with its page tables filled now (MAP_POPULATE): no page faults in the first
    timed calls, in a peer's mapping as in the creator's (whose posix_fallocate allocated the pages)."""
    return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))


def shm_page_note() -> str | None:
    """What page size shm's segments get here, when it is not huge pages (a header note)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled", encoding="ascii") as handle:
            mode = handle.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None
    if mode in ("always", "force", "within_size"):
        return None
    return (f"note: shm segments use 4 KiB pages here (transparent_hugepage/shmem_enabled = {mode}; huge "
            f"pages for /dev/shm are a system setting: 'always' or 'within_size', or a huge= mount option)")


class ShmBackend(ScheduleBackend, TorchBackend):
    name = "shm"
    one_host = True
    native_executor = True  # runs its calls through shm_native when it builds ($COMMBENCH_SHM_EXECUTOR)
    # Large rings as a wavefront of LLC-sized slices (_pipeline_slices): off, as measured (docs/performance.md):
    # at 256 MiB 1.05x faster once, 1.6-2.3x slower in the later runs, quiet or loaded (33 barriers per call
    # instead of 3, each a rendezvous of two ranks, and slices below the non-temporal copy threshold).
    pipeline = False

    def __init__(self, launch: LaunchInfo, topology: Topology, algorithm: str = "auto", timeout_s: float = 300.0):
        self._check_layout(launch, topology)
        TorchBackend.__init__(self, launch, device="cpu", torch_backend="gloo", timeout_s=timeout_s)
        self.library = "shm"
        self.members = self._members(topology)  # the ranks that share memory with this one, in rank order
        np.seterr(over="ignore", invalid="ignore")  # in-place prod/sum timing loops overflow by design
        self.topology, self.algorithm, self.timeout_s = topology, algorithm, timeout_s
        self._wait_s = peer_wait_s(timeout_s)  # as the control plane's: the rest is for stopping the job
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._spin_budget = SPIN_CHECKS if self._ranks_on_host(launch) <= cores else OVERSUBSCRIBED_SPIN_CHECKS
        self._spin = self._spin_budget  # adapts between OVERSUBSCRIBED_SPIN_CHECKS and the budget (_wait)
        self.job = self.control.broadcast_object(  # rank 0's tag
            os.environ.get(SPAWN_VAR) or os.environ.get(JOB_TAG_VAR) or uuid.uuid4().hex[:10])
        self._own: dict[int, _Segment] = {}
        self._peers: dict[tuple[int, int], _Segment] = {}
        self._seq = 0
        self._ctl = self._control_segment()
        self._native, self.executor_name, self._executor_note = self._choose_executor()
        self._llc_bytes = shm_native.llc_bytes()
        atexit.register(self._cleanup)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run atexit: unlink the segments

    def _check_layout(self, launch: LaunchInfo, topology: Topology) -> None:
        require_x86(self.name)
        if launch.nnodes > 1 or launch.local_world_size != launch.world_size:
            raise BackendError("--backend shm needs every rank on one host; across nodes use --backend hybrid or p2p")

    def _members(self, topology: Topology) -> list[int]:
        return list(range(self.world_size))

    def _ranks_on_host(self, launch: LaunchInfo) -> int:
        """How many of the job's ranks share this host's cores (all of them, for shm)."""
        return launch.local_world_size

    @classmethod
    def check_request(cls, cfg, library: str, collectives: list[str], dtype: DType, op: str, world: int) -> None:
        try:
            shm_native.requested()  # a bad $COMMBENCH_SHM_EXECUTOR is one line before any rank starts
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
        super().check_request(cfg, library, collectives, dtype, op, world)

    def setup_text(self) -> str:
        text = f"{super().setup_text()}, executor {self.executor_name}"
        return text + " (float16 and bfloat16: python)" if self._native is not None else text

    def header_notes(self, collectives: tuple[str, ...], placements: tuple[str, ...], hw: str | None) -> list[str]:
        return [note for note in (self._executor_note, shm_page_note()) if note]

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
        flag_lines = -(-len(members) // (LINE * 8))  # one byte per member, after the counters and pids
        nbytes = (len(members) * LINE * 2 + flag_lines * LINE) * 8
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
        # The hot path reads through memoryviews (~80 ns per read against NumPy's ~130 ns).
        self._counters = memoryview(self._ctl_seg.map).cast("q")
        flags_at = len(members) * LINE * 2 * 8
        self._flags = memoryview(self._ctl_seg.map)[flags_at:flags_at + flag_lines * LINE * 8]
        self._flag_words = self._flags.cast("Q")
        self._flag_word_count = -(-len(members) // 8)
        self._flags_address = ctl.ctypes.data + flags_at
        self._my_counter = self._slot * LINE
        self._peer_counters = [i * LINE for i in range(len(members)) if i != self._slot]
        self._ctl_address = ctl.ctypes.data
        self._arrive_and_wait = self._barrier_closure()
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

    def _barrier_closure(self) -> Callable[[], None]:
        """The barrier of the members through the control segment (self._arrive_and_wait): bump my
        counter, wake blocked waiters if a flag says there are any, wait for every peer's counter.
        A closure over locals: it runs once or twice per schedule step, and every attribute lookup
        it saves is ~30 ns of the executor's cost per step."""
        counters, words, mine, peers, wait = self._counters, self._flag_words, self._my_counter, \
            tuple(self._peer_counters), self._wait
        address, one_word = self._ctl_address + self._my_counter * 8, self._flag_word_count == 1
        wake = _FUTEX.wake

        def arrive_and_wait() -> None:
            epoch = counters[mine] + 1  # my counter is my epoch (the native executor bumps it too)
            counters[mine] = epoch
            if words[0] if one_word else any(words):
                wake(address)
            for index in peers:
                if counters[index] < epoch:
                    wait(index, epoch)
        return arrive_and_wait

    def _wait(self, index: int, epoch: int) -> None:
        """Wait until the counter at `index` reaches `epoch`: spin, yield, then block (or sleep).
        The spin adapts, as an adaptive mutex's does: a wait that had to block halves it (down to
        OVERSUBSCRIBED_SPIN_CHECKS: other processes want these cores, and spinning only delays the
        peer), a wait that ended before blocking doubles it back (up to the budget set at start)."""
        counters, checks, spin = self._counters, 0, self._spin
        while counters[index] < epoch:
            checks += 1
            if checks < spin:
                continue
            if checks < 2 * spin:
                os.sched_yield()
                continue
            self._wait_long(index, epoch)
            self._spin = max(OVERSUBSCRIBED_SPIN_CHECKS, spin // 2)
            return
        if spin < self._spin_budget:  # ended spinning or yielding: a longer spin would have caught it
            self._spin = min(self._spin_budget, 2 * spin)

    def _wait_long(self, index: int, epoch: int) -> None:
        """The wait after the spin: block in the kernel (or sleep), checking the peer and the timeout."""
        if _FUTEX.available:
            self._block(index, epoch)
        else:
            self._back_off(index, epoch)

    def _block(self, index: int, epoch: int) -> None:
        """Sleep in the kernel until the peer bumps its counter (flag raised so that it wakes us)."""
        counters, address, started, blocks = self._counters, self._ctl_address + index * 8, time.monotonic(), 0
        self._flags[self._slot] = 1
        try:
            while True:
                value = counters[index]
                if value >= epoch:
                    return
                _FUTEX.wait(address, value)
                blocks += 1
                if blocks % PEER_CHECK_BLOCKS == 0:
                    self._check_peer(index // LINE, started)
        finally:
            self._flags[self._slot] = 0

    def _back_off(self, index: int, epoch: int) -> None:
        """Without a futex: sleep with growing back-off."""
        counters, started, pause, checks = self._counters, time.monotonic(), 1e-6, 0
        while counters[index] < epoch:
            checks += 1
            if checks % 64 == 0:  # every ~64 ms at most, also whether the peer is a zombie
                self._check_peer(index // LINE, started)
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

    def _choose_executor(self) -> tuple[shm_native.NativeExecutor | None, str, str | None]:
        """(native state or None, which executor runs, the header's note when auto fell back to python)."""
        try:
            wanted = shm_native.requested()
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
        if wanted == "python" or not self.native_executor:
            return None, "python", None
        try:
            library = shm_native.load()
        except shm_native.NativeUnavailable as exc:
            if wanted == "native":
                raise BackendError(f"${shm_native.EXECUTOR_VAR}=native: {exc}") from exc
            return None, "python", f"note: shm executor python, the native fast path is unavailable here: {exc}"
        native = shm_native.NativeExecutor(library, self._ctl_address, self._flags_address, self._flag_word_count,
                                           self._my_counter, self._peer_counters, self._spin_budget,
                                           OVERSUBSCRIBED_SPIN_CHECKS)
        return native, "native", None

    def executor(self, schedule: Schedule, working: ShmBuffer, op: str) -> Callable[[], None]:
        """The whole call as one flat plan of steps (pulls and barriers), run by the native executor
        (one ctypes call) or by the Python one (one call per step, nothing else)."""
        plan = self._plan(schedule, working)
        if self._native is not None and shm_native.unsupported(working.array.dtype, op) is None:
            # Large copies bypass the cache where the ranks' buffers do not fit in it anyway (paired against
            # Open MPI, quiet, 21:23-21:24: 16 MiB 0.84-0.96 without, 0.87-1.13 with; but at 4 MiB, where they
            # fit, streaming cost 0.99 -> 0.72, so it is only for buffers past the LLC).
            return self._native_call(plan, op, working.array.nbytes * len(self.members) >= self._llc_bytes)
        reduce, arrive = _reducer(op, working.array.dtype), self._arrive_and_wait
        ops = tuple(arrive if step[0] == "barrier" else _python_step(reduce, step) for step in plan)

        def call() -> None:
            for operation in ops:
                operation()
        return call

    def _native_call(self, plan: list[tuple], op: str, stream: bool) -> Callable[[], None]:
        """The plan as native Ops; a barrier that outlasts the spin returns here to block (and to notice a
        dead peer or the timeout), then the call resumes at that barrier."""
        native = self._native
        ops = native.ops(plan, op, stream)
        run, ops_address, count, context = native.run, ctypes.addressof(ops), len(plan), native.address
        first = native.first_call(ops)

        def call() -> None:
            at = first()
            while at >= 0:
                started = time.perf_counter()
                self._wait_long(*native.stalled())
                native.blocked(time.perf_counter() - started)
                at = run(ops_address, count, at, 1, context)
        call.keep = (ops, plan)  # the Op array and the views its pointers point into live as long as the call
        return call

    def _plan(self, schedule: Schedule, working: ShmBuffer) -> list[tuple]:
        """Steps ("barrier",), ("copy", dst, src), ("reduce", out, a, b) over views fixed now."""
        plan: list[tuple] = [_BARRIER]  # every rank's input is in place, nobody reads the last call
        rounds = pipelined(schedule, self._pipeline_slices(schedule, working.array.itemsize)).rounds
        last = len(rounds) - 1
        for index, rnd in enumerate(rounds):
            steps, staged = self._round_steps(rnd, working)
            plan += [*steps, _BARRIER, *staged]  # staged: hazard rounds write back after every peer has read
            # Whether a round needs the write-back barrier is decided from the round itself, so every rank
            # meets the same barriers even when only some stage. After the last round the next call's first
            # barrier does its work (nobody reads this call's result before it; the write-back is our own
            # buffer, which no peer reads after the barrier above).
            if hazards(rnd) and index < last:
                plan.append(_BARRIER)
        return plan

    def _pipeline_slices(self, schedule: Schedule, itemsize: int) -> int:
        """Into how many slices a ring's chunks are cut (schedule.pipelined) when the ranks' buffers
        together exceed the last-level cache: a slice of 1/PIPELINE_SLICES_PER_LLC of it, so that a
        chunk a peer has just reduced is copied from the cache, not from memory (1: not cut)."""
        if not self.pipeline or schedule.name != "ring" or \
                schedule.count * itemsize * schedule.world <= self._llc_bytes:
            return 1
        largest = max(t.count for rnd in schedule.rounds for t in rnd) * itemsize
        return -(-largest // (self._llc_bytes // PIPELINE_SLICES_PER_LLC))

    def _round_plan(self, rnd, working: ShmBuffer, op: str) -> tuple[list[Callable[[], Any]], list[Callable[[], Any]]]:
        """One round's steps as Python callables (the hybrid backend's executor)."""
        reduce = _reducer(op, working.array.dtype)
        steps, staged = self._round_steps(rnd, working)
        return [_python_step(reduce, s) for s in steps], [_python_step(reduce, s) for s in staged]

    def _round_steps(self, rnd, working: ShmBuffer) -> tuple[list[tuple], list[tuple]]:
        """(this rank's pulls in a round, the write-backs after its barrier) as plan steps."""
        mine = working.array
        incoming = [t for t in rnd if t.dst == self.rank]
        if self.rank not in hazards(rnd):
            return [_step(mine[t.chunk[0]:t.chunk[1]], self._peer_array(t.src, working)[t.chunk[0]:t.chunk[1]],
                          t.reduce) for t in incoming], []
        # Stage into a private copy of my whole buffer region that this round writes.
        lo, hi = min(t.chunk[0] for t in incoming), max(t.chunk[1] for t in incoming)
        stage, region = np.empty(hi - lo, dtype=mine.dtype), mine[lo:hi]
        first = incoming[0]
        if first.reduce and first.chunk == (lo, hi):  # stage = mine op peer in one pass, not copy then reduce
            steps = [("reduce", stage, region, self._peer_array(first.src, working)[lo:hi])]
            incoming = incoming[1:]
        else:
            steps = [("copy", stage, region)]
        for t in incoming:
            dst = stage[t.chunk[0] - lo:t.chunk[1] - lo]
            steps.append(_step(dst, self._peer_array(t.src, working)[t.chunk[0]:t.chunk[1]], t.reduce))
        return steps, [("copy", region, stage)]


# ---------------------------------------------------------------- blocking waits


class _Futex:
    """futex(2) wait and wake on a 32-bit word of shared memory (the low half of an int64 counter,
    x86 being little-endian), through libc's syscall(); `available` is False where there is none."""
    SYS_FUTEX = 202  # x86-64
    WAIT, WAKE = 0, 1  # not FUTEX_PRIVATE: the word is shared between processes

    class _Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    def __init__(self) -> None:
        self.available = False
        if not sys.platform.startswith("linux"):
            return
        try:
            self._syscall = ctypes.CDLL(None, use_errno=True).syscall
        except (OSError, AttributeError):
            return
        self._syscall.restype = ctypes.c_long
        self._timeout = ctypes.byref(self._Timespec(0, BLOCK_TIMEOUT_NS))
        self.available = True

    def wait(self, address: int, value: int) -> None:
        """Sleep while the word at `address` still holds `value` (returns at once if it does not),
        at most BLOCK_TIMEOUT_NS; a signal or a spurious wake-up just returns."""
        self._syscall(self.SYS_FUTEX, ctypes.c_void_p(address), self.WAIT, ctypes.c_uint32(value & 0xFFFFFFFF),
                      self._timeout, None, 0)

    def wake(self, address: int) -> None:
        self._syscall(self.SYS_FUTEX, ctypes.c_void_p(address), self.WAKE, 0x7FFFFFFF, None, None, 0)


_FUTEX = _Futex()


# ---------------------------------------------------------------- dtype helpers


_BARRIER = ("barrier",)


def _step(dst: np.ndarray, src: np.ndarray, is_reduce: bool) -> tuple:
    """A pull as a plan step: dst op= src, or dst = src."""
    return ("reduce", dst, dst, src) if is_reduce else ("copy", dst, src)


def _python_step(reduce, step: tuple) -> Callable[[], Any]:
    """A plan step as one pre-built call: partials of NumPy's C functions (no Python frame per step)."""
    if step[0] == "copy":
        return functools.partial(step[1].__setitem__, Ellipsis, step[2])
    out, a, b = step[1:]
    return functools.partial(reduce, a, b, out)


def _pull(reduce, dst: np.ndarray, src: np.ndarray, is_reduce: bool) -> Callable[[], Any]:
    """One pre-built step: dst op= src, or dst = src (views fixed when the call is prepared). Partials of
    the C functions, not lambdas: no Python frame per step; dst[...] = src is NumPy's cheapest copy call
    (same dtype and shape: a plain copy)."""
    return functools.partial(reduce, dst, src, dst) if is_reduce else functools.partial(dst.__setitem__, Ellipsis, src)


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
