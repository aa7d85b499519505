"""shm's synchronisation: the barrier through the control segment's counters, and the waits behind it.

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
The native executor (shm_native.c) spins in its own barrier, then hands the wait back here to block.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
import time
from typing import Callable

from commbench.backends.base import BackendError

LINE = 8  # int64 slots per cache line: one counter per line, so ranks never share one
SPIN_CHECKS = 20000  # pure spinning before blocking: ~2 ms at ~100 ns per check
OVERSUBSCRIBED_SPIN_CHECKS = 50  # more ranks than cores: the peer we wait for may need our core
BLOCK_TIMEOUT_NS = 1_000_000  # a blocked wait re-reads the counter (and misses no wake-up for longer)
PEER_CHECK_BLOCKS = 64  # blocked waits between checks for a dead peer or the timeout (~64 ms at most)


def control_nbytes(members: int) -> int:
    """The control segment's size for `members` ranks: one counter per member on its own cache line,
    then the members' pids (as many lines), then one flag byte per member."""
    return (members * LINE * 2 + _flag_lines(members) * LINE) * 8


def _flag_lines(members: int) -> int:
    return -(-members // (LINE * 8))


class Barrier:
    """The barrier of the members and the waits behind it, on the control segment `mapped` (laid out as
    control_nbytes says; ShmBackend creates it and owns this object). Its public part: arrive_and_wait
    (the barrier, a closure), wait_long (the native executor's stalled waits), and the layout the native
    executor shares (native_layout)."""

    def __init__(self, mapped, address: int, members: list[int], slot: int, pids: list[int],
                 spin_budget: int, wait_s: float) -> None:
        count = len(members)
        self.members, self._pids, self._slot, self._wait_s = members, pids, slot, wait_s
        self._spin_budget = spin_budget
        self._spin = spin_budget  # adapts between OVERSUBSCRIBED_SPIN_CHECKS and the budget (_wait)
        # The hot path reads through memoryviews (~80 ns per read against NumPy's ~130 ns).
        self._counters = memoryview(mapped).cast("q")
        flags_at = count * LINE * 2 * 8
        self._flags = memoryview(mapped)[flags_at:flags_at + _flag_lines(count) * LINE * 8]
        self._flag_words = self._flags.cast("Q")
        self._flag_word_count = -(-count // 8)
        self._flags_address = address + flags_at
        self._my_counter = slot * LINE
        self._peer_counters = [i * LINE for i in range(count) if i != slot]
        self._ctl_address = address
        self.arrive_and_wait = self._barrier_closure()

    def native_layout(self) -> tuple[int, int, int, int, list[int], int]:
        """(counters' address, flags' address, flag words, my counter's index, the peers' indices, spin budget):
        what the native executor (native.NativeExecutor) needs to keep this barrier's protocol."""
        return (self._ctl_address, self._flags_address, self._flag_word_count, self._my_counter,
                self._peer_counters, self._spin_budget)

    def _barrier_closure(self) -> Callable[[], None]:
        """The barrier of the members through the control segment (self.arrive_and_wait): bump my
        counter, wake blocked waiters if a flag says there are any, wait for every peer's counter.
        A closure over locals: it runs once or twice per schedule step, and every attribute lookup
        it saves is ~30 ns of the executor's cost per step."""
        counters, words, mine, peers, wait = self._counters, self._flag_words, self._my_counter, \
            tuple(self._peer_counters), self._wait
        address, one_word = self._ctl_address + self._my_counter * 8, self._flag_word_count == 1
        wake = FUTEX.wake

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
            self.wait_long(index, epoch)
            self._spin = max(OVERSUBSCRIBED_SPIN_CHECKS, spin // 2)
            return
        if spin < self._spin_budget:  # ended spinning or yielding: a longer spin would have caught it
            self._spin = min(self._spin_budget, 2 * spin)

    def wait_long(self, index: int, epoch: int) -> None:
        """The wait after the spin: block in the kernel (or sleep), checking the peer and the timeout."""
        if FUTEX.available:
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
                FUTEX.wait(address, value)
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
        if not alive(pid, reaped_only):
            raise RuntimeError(f"rank {rank} (pid {pid}) died")
        if time.monotonic() - started > self._wait_s:
            raise RuntimeError(f"timed out after {self._wait_s:.3g} s waiting for rank {rank}")


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


FUTEX = _Futex()


def require_x86(backend: str) -> None:
    """The counters are plain stores and loads: right under x86-64's store ordering only."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise BackendError(f"--backend {backend} relies on x86-64 store ordering for its flags; this is "
                           f"{platform.machine()} (use --backend p2p)")


def alive(pid: int, reaped_only: bool = False) -> bool:
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
