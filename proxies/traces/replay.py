"""Replay a user's traced job on the ranks of a commbench job: the `replay` job of commbench/job.py.

Every rank reads the trace (proxies/traces/files.py), recreates the trace's groups (every rank calls
new_group for every group, in one order), and runs each traced step of its own rank as a setup's plan
(traces/calls.step_plan) with proxies/replay.py's `run_plan`: the traced compute emulated on a clock up
to each call's issue point, the call issued with torch.distributed (async, on its group, buffers of its
size and dtype, zeros), and the compute waiting where the traced thread waited. Replayed step k is
traced step k modulo their number. The rows, the JSON step records and the summary are the proxy's
(proxies/steps.py); rank 0's step records also list the calls it issued (`issued`).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from commbench import collectives as C
from commbench.backends.base import BackendConfig, RanksConfig
from commbench.backends.rank_frame import run_on_backend
from commbench.backends.registry import capabilities_of
from commbench.environment import local_environment, software_versions
from commbench.errors import EXIT_OK, BackendError
from commbench.job import Job
from commbench.launch import peer_wait_s
from commbench.proxies.channels import WorkChannel
from commbench.proxies.clocks import SleepClock
from commbench.proxies.context import summary_from_records, summary_of
from commbench.proxies.replay import run_plan
from commbench.proxies.steps import METRICS, STEP, StepLog
from commbench.proxies.traces.calls import JobTrace, step_plan
from commbench.proxies.traces.files import read_traces


@dataclass(frozen=True)
class TraceReplayConfig(RanksConfig):
    HEADER_BACKEND_FIELDS: ClassVar[tuple[str, ...]] = ("backend", "torch_backend", "device", "timeout_s")
    traces: tuple[str, ...]
    steps: int = 10
    warmup_steps: int = 2
    compute: str = "trace"  # trace: the traced compute between calls; none: the calls back to back
    backend: BackendConfig = BackendConfig()
    json_path: str | None = None


def run_trace_replay(cfg: TraceReplayConfig, launch, argv: list[str]) -> int:
    """The `replay` job on this rank; returns the exit code."""
    state: dict[str, Any] = {}

    def body(backend) -> int:
        job = read_traces(list(cfg.traces))
        if backend.world_size != job.world:
            raise BackendError(f"the trace is of {job.world} ranks; this job has {backend.world_size}")
        if not backend.launches_async:
            raise BackendError(f"backend {backend.name} cannot issue the trace's calls on their groups")
        _replay(cfg, backend, job, argv, state)
        return EXIT_OK

    def on_fault(status: str, error: str) -> None:
        if "finish" in state:
            state["finish"](status, error)

    def close() -> None:
        if "channel" in state:
            state["channel"].close()

    return run_on_backend(cfg.backend, launch, body, on_fault, close)


TRACE_REPLAY_JOB = Job("replay", f"{__name__}:TRACE_REPLAY_JOB", TraceReplayConfig, run_trace_replay,
                       summary_from_records)


def _replay(cfg: TraceReplayConfig, backend, job: JobTrace, argv: list[str], state: dict) -> None:
    rank = backend.rank
    plans = [step_plan(s, cfg.compute == "trace") for s in job.ranks[rank].steps]
    issued: list[list] = []
    device = _device(backend)
    issue = _torch_calls(job, rank, issued, device)
    # The trace's compute is wall time (the issuing thread busy, whatever else ran on its core), so it is
    # replayed as wall time, as the proxy replays a GPU's or a multi-threaded CPU's (clocks.SleepClock);
    # spinning on CPU time would count the traced run's contention twice.
    clock = SleepClock(peer_wait_s(cfg.timeout_s))
    state["channel"] = channel = WorkChannel([], clock, device if backend.device == "cuda" else None,
                                             [call for step in issue for call in step])
    offsets = np.cumsum([0] + [len(p.comms) for p in plans])
    log = StepLog(cfg.json_path, rank == 0, 0)
    fixed = _fixed(cfg, backend, job)
    rows: list[list[float]] = []
    log.header(_header(cfg, backend, job, argv, fixed), _lines(cfg, job))
    state["finish"] = lambda status, error: _finish(backend, log, fixed, rows, status, error, state=state)
    backend.barrier()
    sys.setswitchinterval(1e-4)
    for index in range(cfg.warmup_steps + cfg.steps):
        k = index % len(plans)
        issued.clear()
        times = run_plan(plans[k], clock, _Shifted(channel, int(offsets[k])))
        values = {"compute_us": times.compute_us, "comm_us": times.comm_us, "exposed_comm_us": times.exposed_comm_us,
                  "step_us": times.step_us, "other_us": times.other_us}
        own = [np.nan if values[m] is None else values[m] for m in METRICS]
        rows.append(own)
        gathered = backend.gather(np.array(own, dtype=float)) if backend.world_size > 1 else None
        if gathered is not None:
            values = dict(zip(METRICS, (float(v) for v in gathered[int(np.nanargmax(gathered[:, STEP]))])))
        log.step(index + 1, index < cfg.warmup_steps, {**values, "traced_step": k, "issued": list(issued),
                                                                "calls_us": [list(i) for i in times.comm_intervals]})
    _finish(backend, log, fixed, rows, "ok", None, state=state)


class _Shifted:
    """A channel whose call i is the channel's call offset + i (one list of calls for all traced steps)."""

    def __init__(self, channel: WorkChannel, offset: int):
        self.channel, self.offset = channel, offset

    def launch(self, i: int) -> None:
        self.channel.launch(self.offset + i)

    def wait_for(self, count: int) -> None:
        self.channel.wait_for(count)

    def wait_all(self) -> list[tuple[float, float]]:
        return self.channel.wait_all()


def _device(backend):
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if backend.device == "cuda" else torch.device("cpu")


def _torch_calls(job: JobTrace, rank: int, issued: list, device) -> list[list]:
    """Per traced step, torch.distributed's async call for each of this rank's calls, on its group."""
    import torch.distributed as dist

    groups = {}
    for group in job.groups():  # every rank creates every group, in the same order
        groups[group] = None if len(group) == job.world else dist.new_group(list(group))
    buffers: dict[tuple, tuple] = {}
    out = []
    for step in job.ranks[rank].steps:
        calls = []
        for call in step.calls:
            key = (call.collective, call.nbytes, call.dtype, len(call.group))
            if key not in buffers:
                buffers[key] = _buffers(call.collective, call.nbytes, call.dtype, len(call.group), device)
            send, recv = buffers[key]
            group, root = groups[call.group], call.group[0]
            note = [call.collective, call.nbytes, call.dtype, list(call.group)]
            calls.append(_issue(dist, call.collective, send, recv, group, root, note=note, issued=issued))
        out.append(calls)
    return out


def _issue(dist, collective: str, send, recv, group, root: int, *, note: list, issued: list):
    from commbench.backends.torch_calls import issue

    def go():
        issued.append(note)
        return issue(dist, collective, send, recv, group, root)
    return go


def buffer_bytes(job: JobTrace, rank: int) -> int:
    """The bytes of the buffers `_torch_calls` makes on `rank`: one set per (collective, size, dtype, group
    size), a full buffer and, but for allreduce, broadcast and reduce, a second (at most as large)."""
    keys = {(c.collective, c.nbytes, c.dtype, len(c.group)) for s in job.ranks[rank].steps for c in s.calls}
    return sum(nbytes * (1 if collective in ("allreduce", "broadcast", "reduce") else 2)
               for collective, nbytes, _, _ in keys)


def _buffers(collective: str, nbytes: int, dtype: str, size: int, device) -> tuple:
    """(send, recv) tensors of zeros on `device`: the full buffer of nbytes (whole shards: a multiple of the
    group's size where the call splits it), and a shard of it for all-gather's input and reduce-scatter's
    output."""
    import torch

    torch_dtype = getattr(torch, C.resolve_dtype(dtype).name)
    count = nbytes // C.resolve_dtype(dtype).itemsize
    if collective in ("allgather", "reduce_scatter", "alltoall"):
        count = count // size * size

    def zeros(n: int):
        return torch.zeros(n, dtype=torch_dtype, device=device)

    full = zeros(count)
    if collective == "alltoall":
        return full, zeros(count)
    if collective not in ("allgather", "reduce_scatter"):
        return full, full
    shard = zeros(count // size)
    return (shard, full) if collective == "allgather" else (full, shard)


def _fixed(cfg: TraceReplayConfig, backend, job: JobTrace) -> dict[str, Any]:
    trace = job.ranks[0]
    return {"kind": "proxy", "model": "trace:" + os.path.basename(cfg.traces[0]), "backend": backend.name,
            "library": backend.library, "device": backend.device, "world_size": backend.world_size, "nnodes": 1,
            "batch": 1, "bucket_mb": None, "bucketing": "trace", "buckets": sum(len(s.calls) for s in trace.steps),
            "gradient_bytes": sum(c.nbytes for s in trace.steps for c in s.calls), "warmup_steps": cfg.warmup_steps,
            "compute": "trace" if cfg.compute == "trace" else "none", "setup": "trace", "knobs": {},
            **capabilities_of(backend).fields()}


def _header(cfg, backend, job: JobTrace, argv: list[str], fixed: dict) -> dict:
    environment = backend.gather_objects(local_environment(backend.device))
    return {"kind": "proxy", "model": fixed["model"], "command": " ".join(argv), "config": cfg.header_fields(),
            "ranks": environment, "versions": software_versions(), "summary_fields": fixed,
            "trace": {"source": job.source, "world": job.world, "notes": list(job.notes),
                      "steps": [[[c.collective, c.nbytes, c.dtype, list(c.group)] for c in s.calls]
                                for s in job.ranks[0].steps]}}


def _lines(cfg: TraceReplayConfig, job: JobTrace) -> list[str]:
    compute = ("the traced compute between calls (the issuing thread's busy time, replayed as wall time)"
               if cfg.compute == "trace" else
               "no compute: the calls back to back, waits as traced")
    return [f"replay of the {job.source}: {job.world} rank(s), {len(job.ranks[0].steps)} traced step(s), "
            f"{len(job.groups())} group(s); {compute}",
            "step = compute + exposed + other: exposed is the time the compute waited for a call in flight; "
            "other is the rest (issuing the calls, a late wake-up)",
            f"{cfg.warmup_steps} warm-up step(s), then {cfg.steps} measured; each row: the step's slowest rank"]


def _finish(backend, log: StepLog, fixed: dict, rows: list, status: str, error: str | None, *, state: dict) -> None:
    """The summary, once (a fault while it is written does not write a second)."""
    if state.get("summarised"):
        return
    state["summarised"] = True
    table = np.array(rows, dtype=float).reshape(-1, len(METRICS))
    if status == "ok" and backend.world_size > 1:
        gathered = backend.gather(table.ravel())
        if gathered is not None:
            ranks = gathered.reshape(backend.world_size, -1, len(METRICS))
            table = ranks[ranks[:, :, STEP].argmax(axis=0), np.arange(ranks.shape[1])]
    if backend.rank == 0:
        # a trace's step has no samples commbench knows of: no rate (batch 1 is the records' least)
        log.summary(replace(summary_of(fixed, table, log.run_id, status, error), samples_per_s=None))
