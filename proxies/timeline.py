"""One training step as a timeline: forward, a backward during which each bucket's allreduce
starts once its last gradient is ready, and the optimizer once every allreduce is done.

Allreduces run one at a time on a communication stream (DDP launches buckets in order on
one process group), overlapped with the rest of the backward. The step ends when the
backward and the last allreduce have both finished, plus the optimizer. Two forms, one
arithmetic:

- `overlap(plan, comm_us)`: pure; communication times given (from the cost model, or a
  fake). predict-scaling and the sim proxy use it.
- `run_step(plan, clock, channel)`: executed; compute is emulated on `clock`, allreduces
  are handed to `channel` when ready and timed as they really run. The clock and the
  channel are given: the clocks that sleep and spin are proxies/clocks.py (the runtime), so
  this module stays pure, and tests drive run_step with a fake clock and channel and
  compare it with `overlap`.

Times are microseconds from the start of the step.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
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
    # executed steps: (compute progress, wall time) at each point the compute reached, from the step's start; where
    # the compute waited, two marks of one progress. Maps the plan's phases onto the wall time the calls are in
    compute_marks: tuple[tuple[float, float], ...] = ()

    def samples_per_s(self, samples: int) -> float:
        return samples / (self.step_us * 1e-6) if self.step_us > 0 else math.inf


def plan_step(profile: Profile, buckets: Sequence[Bucket], forward_us: float, backward_us: float,
              optimizer_us: float = 0.0, ddp_us: float = 0.0) -> StepPlan:
    """Bucket ready times: the backward's duration shared out by backward FLOPs (a traced profile's: by its
    traced time), so a bucket is ready when the work done before its last gradient has run.

    `ddp_us` is DDP's own work per step (measured at 1 rank: train.measure_compute). It is two equal
    copies of the gradients, so half of it runs with the backward (each gradient copied into its
    bucket by DDP's hook as it is ready: the backward, and every bucket's readiness, stretch) and half
    after the last allreduce (the buckets copied back into the gradients), before the optimizer."""
    backward_us += ddp_us / 2
    optimizer_us += ddp_us / 2
    ready = tuple(backward_us * b.ready_share for b in buckets)
    return StepPlan(forward_us, backward_us, optimizer_us, ready, tuple(b.nbytes for b in buckets))


def flops_times_us(profile: Profile, batch: int, tflops: float) -> tuple[float, float]:
    """(forward, backward) in microseconds at a device rate of `tflops` 1e12 FLOP/s."""
    per_us = tflops * 1e6
    return profile.forward_flops * batch / per_us, profile.backward_flops * batch / per_us


def traced_words(profile: Profile) -> str:
    """How a header names a traced profile's compute (--compute trace)."""
    traced = profile.traced
    return f"traced on {traced.device}, {(traced.forward_us + traced.backward_us) / 1e3:.4g} ms per sample"


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


def run_step(plan: StepPlan, clock: Clock, channel: Channel) -> StepTimes:
    """Execute one step: emulate compute on `clock`, launch each bucket on `channel` when ready."""
    t0 = clock.now_us()
    marks = [(0.0, 0.0)]
    clock.begin()
    clock.compute_until(plan.forward_us)
    marks.append((plan.forward_us, clock.now_us() - t0))
    for bucket, ready in enumerate(plan.bucket_ready_us):
        clock.compute_until(plan.forward_us + ready)
        marks.append((plan.forward_us + ready, clock.now_us() - t0))
        channel.launch(bucket)
    computed = plan.forward_us + plan.backward_us
    clock.compute_until(computed)
    backward_done = clock.now_us()
    intervals = channel.wait_all()
    waited = clock.now_us()
    marks += [(computed, backward_done - t0), (computed, waited - t0)]
    clock.begin()
    clock.compute_until(plan.optimizer_us)
    step = clock.now_us() - t0
    marks.append((plan.compute_us, step))
    # exposed: the wait after the backward, counted only while an allreduce was in flight
    exposed = busy_us(intervals, within=(backward_done, waited))
    return StepTimes(plan.compute_us, busy_us(intervals), exposed, step,
                     tuple((start - t0, end - t0) for start, end in intervals),
                     other_us=max(0.0, step - plan.compute_us - exposed), compute_marks=tuple(marks))
