"""One training step's communication as data, and the step time it gives.

A setup (proxies/setups.py) turns a profile into a `CommPlan`: the step's compute as phases laid
end to end on one compute stream (forward and backward per unit and micro-step, the optimizer),
and its collectives in the order they are issued, each with two points on the compute's
progress: `ready_us`, when the compute has done enough for the call to be issued (a bucket's
last gradient, the start of a unit's forward), and `needed_us`, the progress that cannot be
passed until the call has finished (the optimizer waits for every gradient; a unit's forward
waits for its all-gathered parameters). Calls run one at a time, in issue order, on one
communication stream (DDP and Horovod issue on one process group; FSDP2's all-gather and
reduce-scatter streams share the same links, so serial is what their bandwidth allows).

Progress is microseconds of compute from the start of the step. `simulate` is the pure form
(predict-scaling, the sim proxy and check use it); proxies/replay.py executes the same plan with
emulated compute and real calls. `simulate_many` is its arithmetic for many sets of call times at
once (a prediction's interval).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from commbench.proxies.timeline import StepTimes, busy_us

GROUPS = ("world", "node", "cross")  # all ranks; the ranks of one node; one rank per node (same local rank)


@dataclass(frozen=True)
class Comm:
    collective: str  # allreduce, allgather, reduce_scatter
    nbytes: int  # per rank, the larger buffer (nccl-tests' size): an all-gather's output, a reduce-scatter's input
    dtype: str
    group: str  # GROUPS
    ready_us: float  # compute progress at which it is issued
    needed_us: float  # compute progress that waits for it to finish (math.inf: none until the step's end)
    label: str  # what it carries, for people: "bucket 3", "unit layers.4 (forward)"


@dataclass(frozen=True)
class Phase:
    name: str  # forward, backward, optimizer, own (the setup's own work)
    unit: str  # the unit or bucket it belongs to ("" for the whole model)
    micro_step: int  # 0-based; the optimizer's is the last micro-step's
    start_us: float
    end_us: float


@dataclass(frozen=True)
class CommPlan:
    """A step's compute phases (end to end, from 0) and its collectives in issue order."""
    phases: tuple[Phase, ...]
    comms: tuple[Comm, ...]

    @property
    def compute_us(self) -> float:
        return self.phases[-1].end_us if self.phases else 0.0

    def check(self) -> None:
        """ValueError unless each call is ready before it is needed and calls are issued in ready order."""
        last = -math.inf
        for comm in self.comms:
            if comm.ready_us < last - 1e-6 or comm.needed_us < comm.ready_us - 1e-6:
                raise ValueError(f"{comm.label}: ready at {comm.ready_us:g}, needed at {comm.needed_us:g}, issued "
                                 f"after a call ready at {last:g}")
            last = comm.ready_us

    def bytes_by(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(collective, group) -> (calls, bytes) per step: what the tests compare with torch's own calls."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for comm in self.comms:
            calls, total = out.get((comm.collective, comm.group), (0, 0))
            out[(comm.collective, comm.group)] = (calls + 1, total + comm.nbytes)
        return out


def describe_calls(plan: CommPlan) -> dict:
    """A step's calls as a run's header keeps them (the replay's and the prediction's alike): per
    (collective, group), calls and bytes, and each call's size."""
    return {"by_collective": [{"collective": c, "group": g, "calls": n, "nbytes": b}
                              for (c, g), (n, b) in plan.bytes_by().items()],
            "calls": [{"collective": c.collective, "group": c.group, "nbytes": c.nbytes, "dtype": c.dtype,
                       "label": c.label} for c in plan.comms]}


def points(plan: CommPlan) -> list[tuple[float, list[int], list[int]]]:
    """(progress, calls issued there, calls waited for there) in progress order; the end last."""
    end = plan.compute_us
    at: dict[float, tuple[list[int], list[int]]] = {}
    for i, comm in enumerate(plan.comms):
        at.setdefault(min(comm.ready_us, end), ([], []))[0].append(i)
        at.setdefault(min(comm.needed_us, end), ([], []))[1].append(i)
    at.setdefault(end, ([], []))
    return [(x, issued, waited) for x, (issued, waited) in sorted(at.items())]


def simulate_many(plan: CommPlan, comm_us: np.ndarray) -> np.ndarray:
    """Step times for many sets of call times: row k of `comm_us` (samples x calls) gives call i comm_us[k, i]."""
    comm = np.atleast_2d(np.asarray(comm_us, dtype=float))
    t = np.zeros(comm.shape[0])
    free = np.zeros(comm.shape[0])
    ends = np.zeros_like(comm)
    progress = 0.0
    for x, issued, waited in points(plan):
        t = t + (x - progress)
        progress = x
        for i in issued:
            free = np.maximum(free, t) + comm[:, i]
            ends[:, i] = free
        for i in waited:
            t = np.maximum(t, ends[:, i])
    return np.maximum(t, free)


def simulate(plan: CommPlan, comm_us: Sequence[float], steal_us: Sequence[float] | None = None) -> StepTimes:
    """The step when call i takes comm_us[i]: compute + exposed (time the compute waited for a call) + other.
    `steal_us[i]`: the CPU time call i takes from the compute's core (a CPU rank with no spare core), so while
    it runs the compute progresses at 1 - steal/comm of its pace; what it takes shows as other time."""
    if steal_us is not None and any(steal_us):
        return _simulate_steal(plan, comm_us, steal_us)
    t = free = progress = exposed = 0.0
    intervals: list[tuple[float, float]] = [(0.0, 0.0)] * len(plan.comms)
    for x, issued, waited in points(plan):
        t += x - progress
        progress = x
        for i in issued:
            start = max(free, t)
            free = start + comm_us[i]
            intervals[i] = (start, free)
        for i in waited:
            if intervals[i][1] > t:
                exposed += intervals[i][1] - t
                t = intervals[i][1]
    step = max(t, free)
    exposed += step - t
    return StepTimes(plan.compute_us, busy_us(intervals), exposed, step, tuple(intervals))


def _simulate_steal(plan: CommPlan, comm_us: Sequence[float], steal_us: Sequence[float]) -> StepTimes:
    """simulate with the compute slowed while a call runs: an event walk over progress points and call ends."""
    share = [min(1.0, s / c) if c > 0 else 0.0 for s, c in zip(steal_us, comm_us)]
    intervals: list[tuple[float, float]] = [(0.0, 0.0)] * len(plan.comms)
    queue: list[int] = []
    active: int | None = None
    t = progress = exposed = 0.0

    def start_next(now: float) -> None:
        nonlocal active
        if active is None and queue:
            active = queue.pop(0)
            intervals[active] = (now, now + comm_us[active])

    def finish(now: float) -> None:
        nonlocal active
        active = None
        start_next(now)

    for x, issued, waited in points(plan):
        while progress < x:  # compute towards x, at the pace the running call leaves it
            rate = 1.0 - share[active] if active is not None else 1.0
            t_x = t + (x - progress) / rate if rate > 0 else math.inf
            if active is not None and intervals[active][1] <= t_x:
                end = intervals[active][1]
                progress += (end - t) * rate
                t = end
                finish(t)
            else:
                t, progress = t_x, x
        queue.extend(issued)
        start_next(t)
        for i in waited:
            while i == active or i in queue:  # issued, not finished: the compute waits for the running call
                end = intervals[active][1]
                exposed += end - t
                t = end
                finish(t)
    while active is not None:  # calls still running at the end of the compute
        end = intervals[active][1]
        exposed += end - t
        t = end
        finish(t)
    return StepTimes(plan.compute_us, busy_us(intervals), exposed, t, tuple(intervals),
                     other_us=max(0.0, t - plan.compute_us - exposed))
