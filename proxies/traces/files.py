"""A job's trace files, whatever wrote them, read into one JobTrace; and the table of what it communicated.

`read_traces` tells the formats apart by their content (a JSON object with traceEvents: PyTorch's
profiler, one file per rank, .gz or not; with nodes: an execution trace, one file per rank in rank
order; lines with "NCCL INFO": NCCL's log), checks the set (every rank once, every
group's members issuing the same calls) and raises TraceError with one line naming the problem.
`table_rows` sums the calls per (collective, size, dtype, group): nccl-tests' columns (size, time,
busbw: collectives.bandwidths_gbps) and the job's (calls, share of the step, exposed or overlapped).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from commbench.collectives import bandwidths_gbps
from commbench.files import shown
from commbench.proxies.traces.calls import JobTrace, RankTrace, TraceError, check_job
from commbench.proxies.traces.chrome_json import open_text
from commbench.proxies.traces.execution_trace import looks_like_execution_trace, read_execution_traces
from commbench.proxies.traces.nccl_log import looks_like_nccl_log, read_nccl_logs
from commbench.proxies.traces.torch_profiler import read_torch_trace


def read_traces(paths: list[str]) -> JobTrace:
    if not paths:
        raise TraceError("no trace file given")
    _once(paths)
    kinds = {_kind(p) for p in paths}
    if len(kinds) > 1:
        raise TraceError(f"{', '.join(paths)}: a mix of formats ({', '.join(sorted(kinds))}): give one kind")
    origin = paths[0] if len(paths) == 1 else f"{paths[0]} (and {len(paths) - 1} more)"
    reader = {"nccl": read_nccl_logs, "et": read_execution_traces, "torch": _read_torch}[kinds.pop()]
    job = reader(paths)
    check_job(job, origin)
    return job


def _once(paths: list[str]) -> None:
    """TraceError for a file given twice (by two names too): its calls would be read, and replayed, twice."""
    seen: dict[tuple[int, int], str] = {}
    for path in paths:
        try:
            status = os.stat(path)
        except (OSError, ValueError):  # no such file, a NUL in the name: said where the file is opened
            continue
        first = seen.setdefault((status.st_dev, status.st_ino), path)
        if first != path or paths.count(path) > 1:
            said = "given twice" if first == path else f"the same file as {shown(first)}"
            raise TraceError(f"{shown(path)}: {said}: give each file once (its calls would be read twice)")


def _kind(path: str) -> str:
    try:
        with open_text(path) as handle:
            head = handle.read(4096)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    except (EOFError, UnicodeError) as exc:
        raise TraceError(f"{path}: cannot be read ({exc})") from exc
    if head.lstrip().startswith("{"):
        return "et" if looks_like_execution_trace(head) else "torch"
    if looks_like_nccl_log(head):
        return "nccl"
    raise TraceError(f"{path}: neither a PyTorch profiler trace (JSON) nor an NCCL log (no 'NCCL INFO' lines)")


def _read_torch(paths: list[str]) -> JobTrace:
    ranks: dict[int, RankTrace] = {}
    worlds, notes = set(), []
    for path in paths:
        try:
            rank, world, trace, own = read_torch_trace(path)
        except TraceError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:  # a field of the wrong kind
            raise TraceError(f"{path}: not a profiler trace this reader understands ({type(exc).__name__}: "
                             f"{str(exc)[:120]})") from exc
        if rank in ranks:
            raise TraceError(f"{path}: a second trace of rank {rank}")
        ranks[rank] = RankTrace(rank, trace.steps)
        worlds.add(world)
        notes.extend(f"rank {rank}: {n}" for n in own)
    if len(worlds) != 1:
        raise TraceError(f"{paths[0]}: traces of jobs of {sorted(worlds)} ranks: give one job's files")
    world = worlds.pop()
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        raise TraceError(f"{paths[0]}: a job of {world} ranks, but no trace of rank(s) {', '.join(map(str, missing))}")
    counts = {len(r.steps) for r in ranks.values()}
    if len(counts) > 1:
        raise TraceError(f"{paths[0]}: the ranks' traces hold different numbers of steps ({sorted(counts)})")
    return JobTrace(world, tuple(ranks[r] for r in range(world)), "PyTorch profiler", tuple(dict.fromkeys(notes)))


@dataclass(frozen=True)
class TableRow:
    collective: str
    nbytes: int
    dtype: str
    group: tuple[int, ...]
    calls: int  # per rank, over the traced steps
    time_us: float | None  # median run time of one call (None: the trace has no times)
    busbw_gbps: float | None
    share: float | None  # of the step: the calls' run time over the step time (rank 0's)
    exposed_us: float  # per step: the issuing thread waiting while they ran
    overlapped_us: float  # per step: their run time less the exposed


def table_rows(job: JobTrace, rank: int = 0) -> list[TableRow]:
    """One rank's calls summed per (collective, size, dtype, group), in order of first issue."""
    trace = job.ranks[rank]
    steps = max(1, len(trace.steps))
    step_us = sum(s.step_us for s in trace.steps)
    groups: dict[tuple, list] = {}
    for step in trace.steps:
        for call in step.calls:
            groups.setdefault((call.collective, call.nbytes, call.dtype, call.group), []).append(call)
    rows = []
    for (collective, nbytes, dtype, group), calls in groups.items():
        times = [c.time_us for c in calls if c.time_us is not None]
        median = statistics.median(times) if times else None
        busbw = bandwidths_gbps(collective, nbytes, len(group), median)[1] if median else None
        exposed = sum(c.exposed_us for c in calls)
        rows.append(TableRow(collective, nbytes, dtype, group, len(calls), median, busbw,
                             sum(times) / step_us if times and step_us else None, exposed / steps,
                             max(0.0, sum(times) - exposed) / steps))
    return rows
