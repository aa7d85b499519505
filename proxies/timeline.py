"""One training step as a timeline: forward, a backward during which each bucket's allreduce
starts once its last gradient is ready, and the optimizer once every allreduce is done.

Allreduces run one at a time on a communication stream (DDP launches buckets in order on
one process group), overlapped with the rest of the backward. The step ends when the
backward and the last allreduce have both finished, plus the optimizer. Two forms, one
arithmetic:

- `overlap(plan, comm_us)`: pure; communication times given (from the cost model, or a
  fake). predict-scaling and the sim proxy use it.
- `run_step(plan, clock, channel)`: executed; compute is emulated on `clock` (sleeping for
  a GPU's compute, spinning on CPU time for a CPU's), allreduces are handed to `channel`
  when ready and timed as they really run. Tests drive it with a fake clock and channel
  and compare it with `overlap`. A clock given a limit refuses to wait longer than it
  (`ComputeTimeout`): emulated compute honours the run's timeout as a collective does.

Times are microseconds from the start of the step.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from commbench.proxies.buckets import Bucket
from commbench.proxies.profile import Profile


@dataclass(frozen=True)
class StepPlan:
    """What one rank computes in a step, and when each bucket becomes ready."""
    forward_us: float
    backward_us: float
    optimizer_us: float
    bucket_ready_us: tuple[float, ...]  # from the start of the backward, launch order
    bucket_nbytes: tuple[int, ...]

    @property
    def compute_us(self) -> float:
        return self.forward_us + self.backward_us + self.optimizer_us


@dataclass(frozen=True)
class StepTimes:
    """One step's split: step = compute + exposed communication + other, exactly.

    exposed_comm_us is measured, not inferred: the time the step waited, its backward done,
    with an allreduce in flight; so it never exceeds comm_us. other_us is the rest of the
    step's wall time: the replayed compute running longer than its own duration (the rank
    descheduled on a loaded host, or sharing its core with the communication threads), and
    the hand-offs between them. It is 0 in the pure timeline."""
    compute_us: float  # forward + backward + optimizer, as replayed (CPU time on a CPU)
    comm_us: float  # time with at least one allreduce launched and not yet done
    exposed_comm_us: float  # communication the backward did not hide: <= comm_us
    step_us: float
    comm_intervals: tuple[tuple[float, float], ...] = ()  # (start, end) of each allreduce
    other_us: float = 0.0  # step - compute - exposed: neither computing nor waiting for communication

    def samples_per_s(self, samples: int) -> float:
        return samples / (self.step_us * 1e-6) if self.step_us > 0 else math.inf


def plan_step(profile: Profile, buckets: Sequence[Bucket], forward_us: float, backward_us: float,
              optimizer_us: float = 0.0, ddp_us: float = 0.0) -> StepPlan:
    """Bucket ready times: the backward's duration shared out by backward FLOPs, so a bucket is
    ready when the FLOPs done before its last gradient have run.

    `ddp_us` is DDP's own work per step (measured at 1 rank: train.measure_compute). It is two equal
    copies of the gradients, so half of it runs with the backward (each gradient copied into its
    bucket by DDP's hook as it is ready: the backward, and every bucket's readiness, stretch) and half
    after the last allreduce (the buckets copied back into the gradients), before the optimizer."""
    backward_us += ddp_us / 2
    optimizer_us += ddp_us / 2
    total = profile.backward_flops
    ready = tuple(backward_us * (b.ready_flops / total if total > 0 else 1.0) for b in buckets)
    return StepPlan(forward_us, backward_us, optimizer_us, ready, tuple(b.nbytes for b in buckets))


def flops_times_us(profile: Profile, batch: int, tflops: float) -> tuple[float, float]:
    """(forward, backward) in microseconds at a device rate of `tflops` 1e12 FLOP/s."""
    per_us = tflops * 1e6
    return profile.forward_flops * batch / per_us, profile.backward_flops * batch / per_us


def overlap(plan: StepPlan, comm_us: Sequence[float], steal_us: Sequence[float] | None = None) -> StepTimes:
    """The step when bucket i's allreduce takes comm_us[i] on a serial communication stream. `steal_us[i]`:
    the CPU time bucket i's allreduce takes from the compute's core (a CPU rank with no spare core: the
    library's threads copy and reduce on it), so while it runs the backward progresses at 1 - steal/comm
    of its pace (compute_with_steal)."""
    if steal_us is not None and any(steal_us):
        return compute_with_steal(plan, comm_us, steal_us)
    backward_start = plan.forward_us
    backward_end = backward_start + plan.backward_us
    free_at, intervals = 0.0, []
    for ready, duration in zip(plan.bucket_ready_us, comm_us):
        start = max(backward_start + ready, free_at)
        free_at = start + duration
        intervals.append((start, free_at))
    step = max(backward_end, free_at) + plan.optimizer_us
    return StepTimes(plan.compute_us, busy_us(intervals), max(0.0, free_at - backward_end), step, tuple(intervals))


def steps_us(plan: StepPlan, comm_us: np.ndarray) -> np.ndarray:
    """overlap's step time for many sets of communication times at once: row k of `comm_us`
    (samples x buckets) gives bucket i's allreduce comm_us[k, i]; the same arithmetic, one pass over
    the buckets (a prediction's interval costs the step for thousands of resampled times)."""
    comm = np.atleast_2d(np.asarray(comm_us, dtype=float))
    free_at = np.zeros(comm.shape[0])
    for i, ready in enumerate(plan.bucket_ready_us[:comm.shape[1]]):
        free_at = np.maximum(plan.forward_us + ready, free_at) + comm[:, i]
    return np.maximum(plan.forward_us + plan.backward_us, free_at) + plan.optimizer_us


def compute_with_steal(plan: StepPlan, comm_us: Sequence[float], steal_us: Sequence[float]) -> StepTimes:
    """overlap's step when each allreduce also takes CPU from the backward: an event walk over bucket
    readiness (in backward progress) and allreduce ends, the backward's pace 1 - steal/comm while one
    runs. What it takes shows as other time: compute + exposed + other = step, as measured."""
    backward, n = plan.backward_us, len(plan.bucket_ready_us)
    ready = [min(r, backward) for r in plan.bucket_ready_us]  # a profile's rounding may put the last past the end
    t, progress, ready_next, queue, intervals = plan.forward_us, 0.0, 0, [], []
    active: tuple[float, float] | None = None  # (end, share of the core it takes)
    while True:
        rate = 1.0 - active[1] if active else 1.0
        goal = min(ready[ready_next] if ready_next < n else backward, backward)
        t_goal = t + (goal - progress) / rate if rate > 0 else math.inf
        t_end = active[0] if active else math.inf
        if t_goal <= t_end:
            t, progress = t_goal, goal
        else:
            t, progress = t_end, progress + (t_end - t) * rate
        if active and t >= active[0]:
            active = None
        while ready_next < n and ready[ready_next] <= progress:
            queue.append(ready_next)
            ready_next += 1
        if active is None and queue:
            i = queue.pop(0)
            intervals.append((t, t + comm_us[i]))
            active = (t + comm_us[i], min(1.0, steal_us[i] / comm_us[i]) if comm_us[i] > 0 else 0.0)
        if progress >= backward and ready_next >= n:
            break
    backward_end = t
    free_at = active[0] if active else t
    for i in queue:  # the rest run back to back after the backward
        intervals.append((free_at, free_at + comm_us[i]))
        free_at += comm_us[i]
    free_at = max(free_at, backward_end)
    step = free_at + plan.optimizer_us
    exposed = max(0.0, free_at - backward_end)
    return StepTimes(plan.compute_us, busy_us(intervals), exposed, step, tuple(intervals),
                     other_us=max(0.0, step - plan.compute_us - exposed))


def busy_us(intervals: Sequence[tuple[float, float]], within: tuple[float, float] = (-math.inf, math.inf)) -> float:
    """Length of the union of (start, end) intervals, clipped to `within`: time with communication in flight."""
    total, reach = 0.0, -math.inf
    low, high = within
    clipped = [(max(start, low), min(end, high)) for start, end in intervals]
    for start, end in sorted((start, end) for start, end in clipped if end > start):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


# ---------------------------------------------------------------- executed


class Clock(Protocol):
    def now_us(self) -> float: ...  # wall time
    def begin(self) -> None: ...  # compute progress counts from here
    def compute_until(self, progress_us: float) -> None: ...  # block until this much compute has run


class Channel(Protocol):
    def launch(self, bucket: int) -> None: ...
    def wait_all(self) -> list[tuple[float, float]]: ...  # (start, end) per bucket launched, wall time


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


def run_step(plan: StepPlan, clock: Clock, channel: Channel) -> StepTimes:
    """Execute one step: emulate compute on `clock`, launch each bucket on `channel` when ready."""
    t0 = clock.now_us()
    clock.begin()
    clock.compute_until(plan.forward_us)
    for bucket, ready in enumerate(plan.bucket_ready_us):
        clock.compute_until(plan.forward_us + ready)
        channel.launch(bucket)
    clock.compute_until(plan.forward_us + plan.backward_us)
    backward_done = clock.now_us()
    intervals = channel.wait_all()
    waited = clock.now_us()
    clock.begin()
    clock.compute_until(plan.optimizer_us)
    step = clock.now_us() - t0
    # exposed: the wait after the backward, counted only while an allreduce was in flight
    exposed = busy_us(intervals, within=(backward_done, waited))
    return StepTimes(plan.compute_us, busy_us(intervals), exposed, step,
                     tuple((start - t0, end - t0) for start, end in intervals),
                     other_us=max(0.0, step - plan.compute_us - exposed))
