"""shm: commbench's schedules on one host, through POSIX shared memory.

Every buffer the harness allocates lives in a shared-memory segment (segments.py), so
a peer reads a chunk straight from the rank that holds it. The backend is three parts:
the segments and their lifecycle (here: created per point, the control segment once), the
barrier and its waits on the control segment's counters (waits.Barrier, which it owns), and the
schedule executor, a call as one flat plan of pulls and barriers run natively or by the Python
reference (executor.ShmExecutor, which it owns). The ranks meet, and exchange the few numbers the
harness needs, through a gloo process group it owns too (backends/dist_group.DistGroup), which
also times its calls.

Segments are unlinked after every point, at exit, on
SIGTERM, and, for ranks that `commbench sweep` spawned, by the spawner after the
ranks end (so a killed rank leaves nothing in /dev/shm).
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
from typing import Callable

import numpy as np

from commbench.backends.base import BackendError
from commbench.backends.bfloat16 import from_float32, to_float32
from commbench.backends.dist_group import DistGroup
from commbench.backends.schedule_base import ScheduleBackend, job_topology
from commbench.backends.shm import native
from commbench.backends.shm import plan as shm_plan
from commbench.backends.shm.executor import ShmExecutor, choose_native
from commbench.backends.shm.segments import SEGMENT_SLACK, Segment, ShmBuffer, shm_page_note, start_nbytes, unlink
from commbench.backends.shm.waits import (
    LINE,
    OVERSUBSCRIBED_SPIN_CHECKS,
    SPIN_CHECKS,
    Barrier,
    control_nbytes,
    require_x86,
)
from commbench.collectives import DTYPES, DType
from commbench.environment import affinity_text, cpu_affinity, host_cores
from commbench.launch import SHM_DIR, SPAWN_VAR, new_job_id, peer_wait_s, segment_prefix
from commbench.launchers import LaunchInfo
from commbench.topology import Topology


class ShmBackend(ScheduleBackend):
    name = "shm"
    one_host = True
    native_executor = True  # runs its calls through native.py when it builds ($COMMBENCH_SHM_EXECUTOR)
    # Copies that a round's source can run at the end of the round before (schedule.pushed_ahead) are pushed
    # into the peer's buffer there: the native executor fuses a reduce with the push of its result, and a
    # round left empty loses its barrier; `auto` runs a ring on 2 ranks at every size (algorithms.choose;
    # docs/algorithms.md, "Pushes"; False: every transfer a pull, and auto's rule without pushes).
    pushes = True
    reads_inputs = True  # out of place, reads the input where a copy of it would be read (executor_reading)

    def __init__(self, launch: LaunchInfo, topology: Topology, algorithm: str = "auto", timeout_s: float = 300.0):
        self._check_layout(launch, topology)
        self.rank, self.world_size, self.device, self.library = launch.rank, launch.world_size, "cpu", "shm"
        self.group = DistGroup(launch, "cpu", "gloo", timeout_s)  # the rendezvous, the control plane, the clock
        self.control = self.group.control
        self.members = self._members(topology)  # the ranks that share memory with this one, in rank order
        np.seterr(over="ignore", invalid="ignore")  # in-place prod/sum timing loops overflow by design
        self.topology, self.algorithm, self.timeout_s = topology, algorithm, timeout_s
        self._wait_s = peer_wait_s(timeout_s)  # as the control plane's: the rest is for stopping the job
        cores = self._host_cores()
        self._spin_budget = SPIN_CHECKS if self._ranks_on_host(launch) <= cores else OVERSUBSCRIBED_SPIN_CHECKS
        self.job = self.control.broadcast_object(  # rank 0's: the spawner's id, else a new one under the job tag
            os.environ.get(SPAWN_VAR) or new_job_id())
        self._own: dict[int, Segment] = {}
        self._peers: dict[tuple[int, int], Segment] = {}
        self._seq = 0
        self.waits = self._control_segment()  # the barrier and its waits
        state, self.executor_name, self._executor_note, self.plan_chosen = choose_native(
            self.control, self.rank, timeout_s, self.waits, self.native_executor)
        self.runner = ShmExecutor(self.rank, self.members, self._peer_array, self.waits, state, self.pushes)
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

    def _host_cores(self) -> int:
        """The cores this host's ranks may run on together: the union of their affinities (a rank spins
        only where the peer it waits for has a core of its own; mpirun binds each rank to one core, so
        one rank's affinity would call every mpirun job oversubscribed)."""
        mine = (socket.gethostname(), affinity_text(cpu_affinity()))
        every = self.control.all_gather_objects(mine)
        cores = host_cores([{"host": host, "cpus": os.cpu_count(), "cpu_affinity": text} for host, text in every])
        return cores[mine[0]][0] or 1

    @classmethod
    def check_request(cls, cfg, library: str, collectives: list[str], dtype: DType, op: str, world: int) -> None:
        try:
            native.requested()  # a bad $COMMBENCH_SHM_EXECUTOR is one line before any rank starts
            shm_plan.override()  # and so is a bad $COMMBENCH_SHM_PLAN
        except ValueError as exc:
            raise BackendError(str(exc)) from exc
        super().check_request(cfg, library, collectives, dtype, op, world)

    def setup_text(self) -> str:
        text = f"{super().setup_text()}, executor {self.executor_name}"
        return text + " (float16 and bfloat16: python)" if self.runner.native is not None else text

    def header_notes(self, collectives: tuple[str, ...], placements: tuple[str, ...], hw: str | None) -> list[str]:
        plan = self.plan_chosen.note() if self.runner.native is not None and self.plan_chosen else None
        return [note for note in (self._executor_note, shm_page_note(), plan) if note]

    def header_fields(self) -> dict:
        return {"shm_plan": self.plan_chosen.fields()} if self.runner.native is not None and self.plan_chosen else {}

    # ---------------------------------------------------------------- the owned parts

    def executor(self, schedule, working: ShmBuffer, op: str):
        return self.runner.executor(schedule, working, op)

    def executor_reading(self, schedule, working: ShmBuffer, source: ShmBuffer, op: str):
        return self.runner.executor_reading(schedule, working, source, op) if self.reads_inputs else None

    def barrier(self) -> None:
        self.waits.arrive_and_wait()

    def time_iterations(self, call: Callable[[], None], iters: int) -> np.ndarray:
        return self.group.time_iterations(call, iters)

    def synchronize(self) -> None:
        self.group.synchronize()

    @classmethod
    def create(cls, cfg, launch: LaunchInfo) -> ShmBackend:
        return cls(launch, job_topology(cfg.topology, launch), cfg.algorithm, cfg.timeout_s)

    # ---------------------------------------------------------------- segments

    def _path(self, rank: int, seq: int | str) -> str:
        return os.path.join(SHM_DIR, f"{segment_prefix(self.job)}{rank}_{seq}")

    def _control_segment(self) -> Barrier:
        """One counter per member on its own cache line, then the members' pids, then the flags
        (waits.control_nbytes). Created by the first member; every rank waits on the (untimed) control
        plane until it exists."""
        members, leader = self.members, self.members[0]
        nbytes = control_nbytes(len(members))
        if self.rank == leader:
            self._ctl_seg = Segment(self._path(leader, "ctl"), nbytes, create=True)
        self.gather_objects(None)
        if self.rank != leader:
            self._ctl_seg = Segment(self._path(leader, "ctl"), nbytes, create=False)
        ctl = np.frombuffer(self._ctl_seg.map, dtype=np.int64)
        slot = members.index(self.rank)
        ctl[(len(members) + slot) * LINE] = os.getpid()  # second half: pids, to notice dead peers
        self.gather_objects(None)
        pids = [int(ctl[(len(members) + i) * LINE]) for i in range(len(members))]
        return Barrier(self._ctl_seg.map, ctl.ctypes.data, members, slot, pids, self._spin_budget, self._wait_s)

    def alloc(self, count: int, dtype: DType) -> ShmBuffer:
        seq, self._seq = self._seq, self._seq + 1
        segment = Segment(self._path(self.rank, seq), count * dtype.itemsize + SEGMENT_SLACK, create=True)
        self._own[seq] = segment
        store = np.uint16 if dtype.name == "bfloat16" else np.dtype(dtype.host)
        return ShmBuffer(seq, 0, np.frombuffer(segment.map, dtype=store, count=count, offset=start_nbytes(self.rank)))

    def _peer_array(self, peer: int, buffer: ShmBuffer) -> np.ndarray:
        key = (peer, buffer.seq)
        if key not in self._peers:
            own = self._own[buffer.seq]
            self._peers[key] = Segment(self._path(peer, buffer.seq), own.nbytes, create=False)
        full = np.frombuffer(self._peers[key].map, dtype=buffer.array.dtype, offset=start_nbytes(peer))
        return full[buffer.offset:buffer.offset + len(buffer.array)]

    def end_point(self, failed: bool = False) -> None:
        """Unlink this point's segments; peers that still map one keep it until they unmap
        (the same after a failed point: nothing here waits for a peer)."""
        for segment in list(self._peers.values()):
            segment.close()
        self._peers.clear()
        for segment in self._own.values():
            unlink(segment.path)
            segment.close()
        self._own.clear()

    def _cleanup(self) -> None:
        self.end_point()
        if hasattr(self, "_ctl_seg") and self.rank == self.members[0]:
            unlink(self._ctl_seg.path)

    def close(self) -> None:
        self._cleanup()
        self.group.close()

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
        return to_float32(part) if part.dtype == np.uint16 else part.copy()  # uint16 storage = bfloat16

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
            array[...] = from_float32(to_float32(array) * np.float32(factor))
        else:
            np.multiply(array, array.dtype.type(factor), out=array)


def _to_store(values: np.ndarray, store: np.dtype) -> np.ndarray:
    return from_float32(values.astype(np.float32)) if store == np.uint16 else values.astype(store)


def _dtype_of(array: np.ndarray) -> DType:
    if array.dtype == np.uint16:
        return DTYPES["bfloat16"]
    return next(d for d in DTYPES.values() if np.dtype(d.host) == array.dtype and d.name != "bfloat16")


