"""The clocks on which a replayed step's compute is emulated (timeline.run_step's `clock`): they
wait, sleeping for a GPU's compute (`SleepClock`) or spinning on this thread's CPU time for a
CPU's (`CpuClock`). The step's arithmetic is proxies/timeline.py, pure; waiting is the runtime's.

A clock given a limit refuses to wait longer than it (`ComputeTimeout`): emulated compute
honours the run's timeout as a collective does.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable


class ComputeTimeout(RuntimeError):
    """Emulated compute would run, or has run, longer than the clock's limit (the run's timeout).
    `planned`: the plan itself asks for it, so every rank of the run raises it alike."""

    def __init__(self, message: str, planned: bool):
        super().__init__(message)
        self.planned = planned


class SleepClock:
    """Compute that leaves the host CPU free (a GPU's kernels): waiting sleeps, and spins only
    the last 200 us for precision. Progress is wall time since `begin`. With `limit_s`, a wait
    for more progress than that is refused at once, and a stretch of compute (one `compute_until`:
    what the peers wait for between two of this rank's calls) whose wall time passes it stops."""
    SPIN_US = 200.0
    WATCH_US = 50e3  # a sleeping wait looks at the communication this often

    def __init__(self, limit_s: float = math.inf) -> None:
        self.limit_us = limit_s * 1e6
        self.base_us = self.now_us()
        self.failure: Callable[[], BaseException | None] = lambda: None

    def watch(self, failure: Callable[[], BaseException | None]) -> None:
        """While computing, raise what `failure()` returns: a call of this step that failed (a dead peer)
        ends the compute at once, not at the step's end, when the job may already be stopping the rank."""
        self.failure = failure

    def check_failure(self) -> None:
        error = self.failure()
        if error is not None:
            raise error

    def now_us(self) -> float:
        return time.perf_counter() * 1e6

    def begin(self) -> None:
        self.base_us = self.now_us()

    def rebase(self, progress_us: float) -> None:
        """Compute progress is `progress_us` now (after a wait that did no compute)."""
        self.base_us = self.now_us() - progress_us

    def check(self, progress_us: float) -> None:
        """Refuse progress beyond the limit (NaN included: a profile with infinite FLOPs)."""
        if not progress_us <= self.limit_us:
            raise ComputeTimeout(f"the emulated compute of one step ({progress_us / 1e6:.3g} s so far) is "
                                 f"longer than a rank waits ({self.limit_us / 1e6:.3g} s of --timeout)", True)

    def check_wall(self, stretch_started_us: float) -> None:
        """Stop a stretch of compute whose wall time passed the limit: the peers waiting for this rank's next
        call have given up by now. Per stretch, not per step: on a loaded host a whole step's wall time
        may pass the limit while no peer ever waits that long (issue 26)."""
        elapsed_us = self.now_us() - stretch_started_us
        if elapsed_us > self.limit_us:
            raise ComputeTimeout(f"a stretch of emulated compute still running after {elapsed_us / 1e6:.3g} s, "
                                 f"longer than a rank waits ({self.limit_us / 1e6:.3g} s of --timeout)", False)

    def compute_until(self, progress_us: float) -> None:
        self.check(progress_us)
        deadline = self.base_us + progress_us
        remaining = deadline - self.now_us()
        while remaining > self.SPIN_US:
            self.check_failure()
            time.sleep(min(remaining - self.SPIN_US, self.WATCH_US) * 1e-6)
            remaining = deadline - self.now_us()
        while self.now_us() < deadline:
            pass


class CpuClock(SleepClock):
    """Compute that occupies a CPU core, as a CPU model's forward and backward do: spin until this
    thread has used `progress` of CPU time. What the communication threads take from the core
    (gloo's copies and reductions) delays the emulated compute as it delays real compute; the
    wall time is checked against the limit too, in case the core is not there at all."""

    def begin(self) -> None:
        self.base_us = time.thread_time() * 1e6

    def rebase(self, progress_us: float) -> None:
        self.base_us = time.thread_time() * 1e6 - progress_us

    def compute_until(self, progress_us: float) -> None:
        self.check(progress_us)
        deadline = self.base_us + progress_us
        stretch_started_us = self.now_us()
        spins = 0
        while time.thread_time() * 1e6 < deadline:
            spins += 1
            if spins % 1024 == 0 and time.thread_time() * 1e6 < deadline:  # done is done, however late
                self.check_failure()
                self.check_wall(stretch_started_us)
