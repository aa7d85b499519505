"""A user's own job, as its traces show it: per rank, each step's collective calls in issue order and
the compute between them. Every trace reader (torch_profiler: PyTorch's profiler; execution_trace: its
execution trace; nccl_log: NCCL's COLL log) gives this one form, and the replay, the table and the prediction
read only it.

A call's place in its step is two points on the compute's progress, as a setup's calls have
(comm_plan.Comm): `progress_us`, the compute done (the issuing thread neither waiting nor issuing a
call) when it was issued, and `needed_us`, the progress at which the thread stopped to wait until it was done
(math.inf: nothing waited for it before the step ended). A reader infers the wait from the trace:
the issuing thread was idle when the call ended, in a gap that lasted past its issue (or
resumed within `RESUME_SLACK_US` before: the two clocks' skew). A thread idle for another reason
while a call ends (a data loader) reads as a wait too: the replay then waits for a call that is done
or nearly, where missing a real wait would run the compute ahead of its data. The wake-up after a
wait can be late on a loaded host, so how soon the thread resumed is not asked.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from commbench.proxies.comm_plan import Comm, CommPlan, Phase

IDLE_MIN_US = 20.0  # a gap between the issuing thread's ops shorter than this is not a wait
RESUME_SLACK_US = 200.0  # a call that ended this soon after its thread resumed may still be what it waited for
EXACT_GAPS = 64  # waits one call's run spans, summed one by one; past it, from their running total


class TraceError(ValueError):
    """A trace that cannot be read as a job's calls: one line naming the file and the problem."""


# What a field of a trace may hold: generous beyond any job run to date, and finite, so that what is built
# from a trace (calls, a profile, a replay) stays finite too. A field past them is a broken or crafted file.
MAX_ELEMENTS = 1 << 42  # in one tensor or call (4.4e12; a 405 B-parameter model holds 4e11 in all)
MAX_RANKS = 1 << 17  # in a job or a group (131,072)
MAX_TIME_US = 1e16  # a timestamp or a duration (317 years)
MAX_EVENTS = 1 << 23  # events (lines, nodes) a reader takes from one file (8.4 M; a profiler trace of 2 GB holds fewer)
MAX_CALLS = 1 << 20  # calls of one rank in all its steps: each is a tensor and a call a replay prepares
REPLAYED = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall")  # torch_calls.issue's


def brief(value) -> str:
    """A value as an error line shows it: its repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def checked_count(value, where: str, field: str, limit: int = MAX_ELEMENTS) -> int:
    """A whole number from 0 to `limit` (an integral float too: JSON writers differ), or TraceError naming
    `where` (the file and the event) and the field. JSON true/false are not numbers."""
    if isinstance(value, float) and value.is_integer():
        value = int(value) if abs(value) <= limit else value
    if type(value) is not int or not 0 <= value <= limit:
        raise TraceError(f"{where}: {field!r} is {brief(value)}; it must be a whole number from 0 to {limit:,d}")
    return value


def checked_time(value, where: str, field: str, low: float = -MAX_TIME_US) -> float:
    """A finite number of microseconds from `low` to MAX_TIME_US, or TraceError naming where and the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= MAX_TIME_US:
        raise TraceError(f"{where}: {field!r} is {brief(value)}; it must be a finite number of microseconds "
                         f"from {low:g} to {MAX_TIME_US:g}")
    return float(value)


def checked_shape(value, where: str, field: str) -> tuple[int, ...]:
    """A tensor's shape: a list of whole numbers whose product is at most MAX_ELEMENTS."""
    if not isinstance(value, list) or len(value) > 16:
        raise TraceError(f"{where}: {field!r} is {brief(value)}; it must be a tensor's shape (a list of at most "
                         f"16 whole numbers)")
    dims = tuple(checked_count(d, where, field) for d in value)
    if math.prod(dims) > MAX_ELEMENTS:
        raise TraceError(f"{where}: {field!r} {list(dims)} holds {math.prod(dims):.3g} elements; a tensor holds at "
                         f"most {MAX_ELEMENTS:,d}")
    return dims


@dataclass(frozen=True)
class TraceCall:
    collective: str  # commbench's name (collectives.COLLECTIVES)
    nbytes: int  # per rank, the larger buffer (nccl-tests' size)
    dtype: str  # commbench's dtype name
    op: str  # sum, max, ...; "" where the trace does not say
    group: tuple[int, ...]  # the global ranks of its group
    stream: str  # the process group or communicator that issued it
    issue_us: float  # when it was issued, from the step's start
    start_us: float | None  # when it ran (the worker thread's or the kernel's span); None: not in the trace
    end_us: float | None
    progress_us: float = 0.0  # compute done when it was issued
    needed_us: float = math.inf  # compute progress that waited for it
    exposed_us: float = 0.0  # the part of its run while the issuing thread was idle (waiting)
    where: str = field(default="", compare=False, repr=False)  # the file and the event it was read from

    @property
    def time_us(self) -> float | None:
        return None if self.start_us is None or self.end_us is None else self.end_us - self.start_us


@dataclass(frozen=True)
class TraceStep:
    step_us: float  # wall time of the step in the trace
    compute_us: float  # the issuing thread busy (not waiting, not issuing calls)
    calls: tuple[TraceCall, ...]
    exposed_us: float = 0.0  # the issuing thread idle while one of its calls ran


@dataclass(frozen=True)
class RankTrace:
    rank: int
    steps: tuple[TraceStep, ...]


@dataclass(frozen=True)
class JobTrace:
    world: int
    ranks: tuple[RankTrace, ...]  # rank order
    source: str  # what was read: "PyTorch profiler", "PyTorch execution trace", "NCCL COLL log"
    notes: tuple[str, ...] = ()  # what the reader left out (barriers, send/recv), said with the table

    def groups(self) -> list[tuple[int, ...]]:
        """Every group of the job, in one order every rank agrees on (sorted)."""
        return sorted({c.group for r in self.ranks for s in r.steps for c in s.calls}, key=lambda g: (len(g), g))


def merge_intervals(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def subtract_spans(spans: Sequence[tuple[float, float]],
                   holes: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """`spans` merged, less the `holes` (a thread's ops less the time it spent issuing calls); one sweep."""
    out: list[tuple[float, float]] = []
    merged_holes, h = merge_intervals(holes), 0
    for start, end in merge_intervals(spans):
        while h < len(merged_holes) and merged_holes[h][1] <= start:
            h += 1
        k, at = h, start
        while k < len(merged_holes) and merged_holes[k][0] < end:
            if merged_holes[k][0] > at:
                out.append((at, merged_holes[k][0]))
            at = max(at, merged_holes[k][1])
            k += 1
        if at < end:
            out.append((at, end))
    return out


class Busy:
    """The issuing thread's busy spans (merged, absolute microseconds), and progress along them."""

    def __init__(self, spans: Sequence[tuple[float, float]]):
        self.spans = merge_intervals(spans)
        self.starts = [s for s, _ in self.spans]
        self.ends = [e for _, e in self.spans]
        self.before = [0.0]
        for s, e in self.spans:
            self.before.append(self.before[-1] + e - s)

    def progress(self, t: float) -> float:
        """Busy time before `t`."""
        i = bisect.bisect_right(self.starts, t)
        if i == 0:
            return 0.0
        s, e = self.spans[i - 1]
        return self.before[i - 1] + min(t, e) - s

    def idle(self, start: float, end: float) -> list[tuple[float, float]]:
        """The gaps of at least IDLE_MIN_US in [start, end]."""
        gaps, t = [], start
        for i in range(max(0, bisect.bisect_right(self.starts, start) - 1), len(self.spans)):  # no copy: once per step
            s, e = self.spans[i]
            if s > end:
                break
            if s - t >= IDLE_MIN_US:
                gaps.append((t, s))
            t = max(t, e)
        if end - t >= IDLE_MIN_US:
            gaps.append((t, end))
        return gaps


def _waits(gaps: list[tuple[float, float]], calls: Sequence[TraceCall]) -> dict[int, tuple[float, float]]:
    """Call index -> the gap in which the thread waited for it: idle when the call ended, in a gap that
    lasted past its issue (the issue is idle time too: it is not compute). The first such gap in order: the
    gaps are disjoint and sorted, so only those from the first that ends near the call's end are asked."""
    ends = [g1 for _, g1 in gaps]
    out = {}
    for i, call in enumerate(calls):
        if call.end_us is not None:
            for k in range(bisect.bisect_left(ends, call.end_us - RESUME_SLACK_US - 1.0), len(gaps)):
                g0, g1 = gaps[k]
                if g0 > call.end_us:
                    break
                if g0 <= call.end_us <= g1 + RESUME_SLACK_US and g1 >= call.issue_us:
                    out[i] = (g0, g1)
                    break
    return out


def _overlap(gaps: Busy, start: float, end: float) -> float:
    """The time of [start, end] inside `gaps`: each overlapping gap's part, summed in order (as many gaps as a
    call can span in a real trace), or from the gaps' running total past EXACT_GAPS (a crafted trace's
    calls spanning thousands of waits each cost calls x waits)."""
    lo, hi = bisect.bisect_left(gaps.ends, start - 1.0), bisect.bisect_right(gaps.starts, end + 1.0)
    if hi - lo > EXACT_GAPS:
        return max(0.0, gaps.progress(end) - gaps.progress(start))
    return sum((max(0.0, min(end, g1) - max(start, g0)) for g0, g1 in gaps.spans[lo:hi]), 0.0 if gaps.spans else 0)


def _overlap_all(running: list[tuple[float, float]], gaps: list[tuple[float, float]]) -> float:
    """The time of the disjoint sorted `running` inside the disjoint sorted `gaps`: one sweep of both."""
    total, j = (0.0 if running and gaps else 0), 0
    for start, end in running:
        while j < len(gaps) and gaps[j][1] <= start:
            j += 1
        k = j
        while k < len(gaps) and gaps[k][0] < end:
            total += max(0.0, min(end, gaps[k][1]) - max(start, gaps[k][0]))
            k += 1
    return total


def build_step(start: float, end: float, ops: Busy, calls: Sequence[TraceCall],
               issuing: Sequence[tuple[float, float]] = ()) -> TraceStep:
    """A step from absolute times: `ops` the issuing thread's ops less its calls' `issuing` spans; `calls`
    (issue, start and end absolute, in issue order). The thread's time in the step is issuing calls,
    waiting for one (a gap in its ops in which a call ended), or compute: everything else, the time
    between ops (Python, the profiler's own) and gaps no call ended in included. Each call is placed on
    the compute's progress, needed where the thread waited for it; times made relative to `start`."""
    waits = _waits(ops.idle(start, end), calls)
    busy = Busy(subtract_spans([(start, end)], [*issuing, *waits.values()]))
    p0 = busy.progress(start)
    compute = busy.progress(end) - p0
    wait_gaps = merge_intervals(list(waits.values()))
    waited = Busy(wait_gaps)
    placed = []
    for i, call in enumerate(calls):
        progress = busy.progress(call.issue_us) - p0
        needed = busy.progress(waits[i][0]) - p0 if i in waits else math.inf
        exposed = 0.0 if call.end_us is None else _overlap(waited, call.start_us, call.end_us)
        placed.append(replace(call, issue_us=call.issue_us - start, progress_us=progress, exposed_us=exposed,
                              needed_us=max(needed, progress) if needed < compute else math.inf,
                              start_us=None if call.start_us is None else call.start_us - start,
                              end_us=None if call.end_us is None else call.end_us - start))
    running = merge_intervals([(c.start_us, c.end_us) for c in calls if c.start_us is not None])
    exposed = _overlap_all(running, wait_gaps)
    return TraceStep(end - start, compute, tuple(placed), exposed)


def check_job(job: JobTrace, origin: str) -> None:
    """TraceError unless the ranks are 0..world-1, every call is one a replay can issue (its collective, its
    size, its group: distinct ranks of the job, the issuing rank among them), and every group's members issue
    the same calls (collective, bytes) in the same order: calls that differ would hang a replay. All in the
    parent, before any rank starts: a bad call fails here in one line, not in every rank. One pass per rank."""
    seen = [r.rank for r in job.ranks]
    missing = sorted(set(range(job.world)) - set(seen))
    if missing or len(seen) != job.world or seen != list(range(job.world)):
        raise TraceError(f"{origin}: a job of {job.world} ranks, but no trace of rank(s) "
                         f"{', '.join(map(str, missing)) or '?'} (give every rank's file)")
    sequences: dict[tuple[int, ...], dict[int, list]] = {}
    for trace in job.ranks:
        own = [c for s in trace.steps for c in s.calls]
        if len(own) > MAX_CALLS:
            raise TraceError(f"{origin}: rank {trace.rank} issues {len(own):,d} calls; a replay takes at most "
                             f"{MAX_CALLS:,d}")
        known: set[tuple[int, ...]] = set()
        for number, call in enumerate(own, 1):
            if call.group not in known:
                _check_group(call, trace.rank, job.world, call.where or f"{origin}: rank {trace.rank}'s call {number}")
                known.add(call.group)
            _check_call(call, call.where or f"{origin}: rank {trace.rank}'s call {number}")
            sequences.setdefault(call.group, {}).setdefault(trace.rank, []).append((call.collective, call.nbytes))
    for group, by_rank in sorted(sequences.items(), key=lambda item: (len(item[0]), item[0])):
        first = by_rank.get(group[0], [])
        for r in group[1:]:
            other = by_rank.get(r, [])
            if other != first:
                at = next((i for i, (a, b) in enumerate(zip(first, other)) if a != b), min(len(first), len(other)))
                raise TraceError(f"{origin}: ranks {group[0]} and {r} of group {list(group)} disagree at its call "
                                 f"{at + 1} ({len(first)} and {len(other)} calls): a truncated trace, or "
                                 f"traces of different steps")


def _check_group(call: TraceCall, rank: int, world: int, where: str) -> None:
    group = call.group
    if not all(type(r) is int and 0 <= r < world for r in group):
        raise TraceError(f"{where}: a call's group {brief(list(group))} names ranks beyond the job's {world}")
    if not group or list(group) != sorted(set(group)):
        raise TraceError(f"{where}: 'group' is {brief(list(group))}; it must be distinct ranks, in order")
    if rank not in group:
        raise TraceError(f"{where}: rank {rank} issues a call on group {brief(list(group))}, which it is not in")


def _check_call(call: TraceCall, where: str) -> None:
    if call.collective not in REPLAYED:
        raise TraceError(f"{where}: 'collective' is {brief(call.collective)}; a replay issues {', '.join(REPLAYED)}")
    if type(call.nbytes) is not int or not 0 <= call.nbytes <= MAX_ELEMENTS * 8:
        raise TraceError(f"{where}: 'nbytes' is {brief(call.nbytes)}; it must be a whole number from 0 to "
                         f"{MAX_ELEMENTS * 8:,d}")


def step_plan(step: TraceStep, compute: bool = True) -> CommPlan:
    """One traced step as a setup's plan: the compute as one phase, each call ready where it was issued
    and needed where the thread waited for it; the group is named by its ranks. Without `compute`, no
    compute: every call ready at once, and waited for where it was (at the start) or at the end."""
    def at(x: float) -> float:
        return x if compute or math.isinf(x) else 0.0

    comms = tuple(Comm(c.collective, c.nbytes, c.dtype, ",".join(map(str, c.group)), at(c.progress_us),
                       at(c.needed_us), f"call {i + 1}") for i, c in enumerate(step.calls))
    return CommPlan((Phase("compute", "", 0, 0.0, step.compute_us if compute else 0.0),), comms)
