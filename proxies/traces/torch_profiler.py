"""Read a PyTorch profiler trace (Chrome JSON, `prof.export_chrome_trace`, one file per rank) into
one rank's calls (trace_calls.RankTrace). No torch import: the file is streamed (traces/chrome_json.py).

Where the calls come from, in this order of preference:
- `record_param_comms` CPU events (ProcessGroupNCCL writes them, torch/csrc/distributed/c10d/
  ParamCommsUtils.hpp names their args): "Collective name", "In msg nelems", "Out msg nelems", "dtype",
  "Process Group Name", "Process Group Ranks" ("[0, 1, ..., 63]" past 30 ranks, then completed from
  "Global rank start"/"Global rank stride"/"Group size"). Their run time is the communication kernel's
  (GPU events named nccl*), matched in start order when there are as many kernels as calls.
- otherwise the `c10d::` dispatcher ops (gloo writes no record_param_comms in torch 2.14): the
  collective from the op's name, the elements from its "Input Dims", the group from the trace's
  distributedInfo (one set of ranks only), and the run time from gloo's worker-thread events
  (`gloo:all_reduce`, ...), matched in start order (a process group's queue runs them in issue order).

Steps are the profiler's `ProfilerStep#N` spans on the issuing thread (the whole trace is one step
without them). Barriers, send/recv and gather/scatter are left out, and counted in the notes.
"""
from __future__ import annotations

import bisect
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from commbench.proxies.traces import calls as trace_calls
from commbench.proxies.traces.calls import (
    MAX_ELEMENTS,
    MAX_RANKS,
    Busy,
    RankTrace,
    TraceCall,
    TraceError,
    brief,
    build_step,
    checked_count,
    checked_shape,
    checked_time,
    subtract_spans,
)
from commbench.proxies.traces.chrome_json import EVENTS_KEY, open_text, read_chrome_trace

KNOWN_SCHEMAS = (1,)  # schemaVersion values this reader has read (torch 2.14's kineto writes 1)
PARAM_COMMS = "record_param_comms"
PARAM_NAMES = {"allreduce": "allreduce", "allreduce_coalesced": "allreduce", "_allgather_base": "allgather",
               "allgather": "allgather", "allgather_into_tensor_coalesced": "allgather",
               "allgather_coalesced": "allgather", "_reduce_scatter_base": "reduce_scatter",
               "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
               "broadcast": "broadcast", "reduce": "reduce", "alltoall_base": "alltoall", "alltoall": "alltoall"}
# c10d op -> (collective, index of the input whose elements are nccl-tests' size)
C10D_OPS = {"c10d::allreduce_": ("allreduce", 0), "c10d::allreduce_coalesced_": ("allreduce", 0),
            "c10d::_allgather_base_": ("allgather", 0), "c10d::allgather_": ("allgather", 0),
            "c10d::allgather_into_tensor_coalesced_": ("allgather", 0),
            "c10d::_reduce_scatter_base_": ("reduce_scatter", 1), "c10d::reduce_scatter_": ("reduce_scatter", 1),
            "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1), "c10d::broadcast_": ("broadcast", 0),
            "c10d::reduce_": ("reduce", 0), "c10d::alltoall_base_": ("alltoall", 1)}
DTYPES = {"float": "float32", "double": "float64", "c10::half": "float16", "half": "float16",
          "c10::bfloat16": "bfloat16", "bfloat16": "bfloat16", "int": "int32", "long int": "int64", "long": "int64",
          "signed char": "int8", "char": "int8", "unsigned char": "uint8", "byte": "uint8"}
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "int8": 1, "uint8": 1}


@dataclass
class _Collected:
    """What one pass over the file keeps: small per event, nothing of the events it does not use."""
    meta: dict[str, Any] = field(default_factory=dict)
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (tid, start, end)
    param: list[dict] = field(default_factory=list)  # record_param_comms: name, tid, ts, dur, args, where
    c10d: list[dict] = field(default_factory=list)  # c10d:: ops: the same, and count (a known op's elements)
    runs: list[tuple[float, float, str]] = field(default_factory=list)  # gloo worker spans (start, end, dtype)
    kernels: list[tuple[float, float]] = field(default_factory=list)
    busy: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    grads: list[tuple] = field(default_factory=list)  # AccumulateGrad: (tid, ts, shape or None, dtype, where)
    backward: list[tuple] = field(default_factory=list)  # autograd's evaluate_function spans: (tid, ts, end)
    pids: set = field(default_factory=set)
    skipped: Counter = field(default_factory=Counter)


def collect(path: str) -> _Collected:
    """One pass over a trace; every field it keeps checked (type and range), a bad one a TraceError naming
    the file, the event (its place among the trace's events, from 0, and its name) and the field."""
    got = _Collected()
    index = 0
    try:
        with open_text(path) as handle:
            for key, value in read_chrome_trace(handle, path):
                if key == EVENTS_KEY:
                    if index >= trace_calls.MAX_EVENTS:
                        raise TraceError(f"{path}: more than {trace_calls.MAX_EVENTS:,d} events: more than a "
                                         f"trace this reader takes (profile fewer steps)")
                    _event(got, value, path, index)
                    index += 1
                else:
                    got.meta[key] = value
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    return got


def _event(got: _Collected, e: dict, path: str, index: int) -> None:
    if e.get("ph") != "X":
        return
    name, cat = e.get("name"), e.get("cat")
    if not isinstance(name, str) or not name:
        raise TraceError(f"{path}: event {index} (ph X, a complete event): 'name' is "
                         f"{brief(name) if 'name' in e else 'missing'}; it must name the operator")
    where = f"{path}: event {index} ({brief(name)})"
    ts, dur = checked_time(e.get("ts", 0.0), where, "ts"), checked_time(e.get("dur", 0.0), where, "dur", 0.0)
    tid = e.get("tid")
    if tid is not None and not isinstance(tid, (int, str)):
        raise TraceError(f"{where}: 'tid' is {brief(tid)}; it must be a thread's number or name")
    if cat == "kernel":
        if name.startswith("nccl"):
            got.kernels.append((ts, ts + dur))
        return
    args = _args(e, where)
    if name.startswith("ProfilerStep#"):
        got.steps.append((tid, ts, ts + dur))
    elif name == PARAM_COMMS:
        _check_param_args(args, where)
        got.param.append({"name": name, "tid": tid, "ts": ts, "dur": dur, "args": args, "where": where})
        pid = e.get("pid")
        if pid is not None and not isinstance(pid, (int, str)):
            raise TraceError(f"{where}: 'pid' is {brief(pid)}; it must be a process's number or name")
        got.pids.add(pid)
    elif name in C10D_OPS or name.startswith("c10d::"):
        count = _op_count(args, C10D_OPS[name][1], where) if name in C10D_OPS else 0
        got.c10d.append({"name": name, "tid": tid, "ts": ts, "dur": dur, "args": args, "where": where, "count": count})
    elif name.startswith("gloo:"):
        got.runs.append((ts, ts + dur, str(_first(args, "Input type", where, ""))))
    elif cat == "cpu_op" and not name.startswith("nccl:"):
        got.busy[tid].append((ts, ts + dur))
        if name == "torch::autograd::AccumulateGrad":
            shape = _first(args, "Input Dims", where, None)
            got.grads.append((tid, ts, None if shape is None else checked_shape(shape, where, "Input Dims"),
                              _first(args, "Input type", where, ""), where))
        elif name.startswith("autograd::engine::evaluate_function"):
            got.backward.append((tid, ts, ts + dur))


def _args(e: dict, where: str) -> dict:
    args = e.get("args")
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise TraceError(f"{where}: 'args' is {brief(args)}; it must be an object")
    return args


def _first(args: dict, key: str, where: str, default: Any) -> Any:
    """The first entry of a per-input list (Input Dims, Input type), `default` where there is none."""
    value = args.get(key)
    if value is None:
        return default
    if not isinstance(value, list):
        raise TraceError(f"{where}: {key!r} is {brief(value)}; it must be a list (one entry per input)")
    return value[0] if value else default


def _check_param_args(args: dict, where: str) -> None:
    """record_param_comms' numbers: element counts, and group sizes and ranks, in range."""
    for key in ("In msg nelems", "Out msg nelems"):
        if args.get(key) is not None:
            checked_count(args[key], where, key)
    for key in ("Group size", "Global rank start", "Global rank stride"):
        if args.get(key) is not None:
            checked_count(args[key], where, key, MAX_RANKS)


def _op_count(args: dict, which: int, where: str) -> int:
    """A c10d op's elements: its input `which`'s shape, or the sum over a TensorList's shapes."""
    dims = args.get("Input Dims")
    if dims is None:
        return 0
    if not isinstance(dims, list):
        raise TraceError(f"{where}: 'Input Dims' is {brief(dims)}; it must be a list (one entry per input)")
    return shape_elements(dims[which] if len(dims) > which else [], where)


def read_torch_trace(path: str) -> tuple[int, int, RankTrace, list[str]]:
    """(rank, world, the rank's steps, notes) of one rank's profiler trace."""
    got = collect(path)
    schema = got.meta.get("schemaVersion")
    if schema not in KNOWN_SCHEMAS:
        raise TraceError(f"{path}: trace schemaVersion {schema!r}: this reader knows {list(KNOWN_SCHEMAS)} "
                         f"(is it a PyTorch profiler trace?)")
    info = got.meta.get("distributedInfo")
    if not isinstance(info, dict) or "rank" not in info or "world_size" not in info:
        raise TraceError(f"{path}: no distributedInfo (rank, world_size): not a trace of a torch.distributed job")
    if len(got.pids) > 1:
        raise TraceError(f"{path}: holds {len(got.pids)} processes' calls (a merged trace): give one file per rank")
    world = checked_count(info["world_size"], f"{path}: distributedInfo", "world_size", MAX_RANKS)
    rank = checked_count(info["rank"], f"{path}: distributedInfo", "rank", MAX_RANKS)
    if not rank < world:
        raise TraceError(f"{path}: distributedInfo: rank {rank} of a job of {world} rank(s)")
    notes: list[str] = []
    calls, tid = (_param_calls(got, path, notes) if got.param else _c10d_calls(got, path, info, world, notes))
    return rank, world, _steps(got, calls, tid, path, notes), notes


def _steps(got: _Collected, calls: list[TraceCall], tid: Any, path: str, notes: list[str]) -> RankTrace:
    spans = sorted((s, e) for t, s, e in got.steps if t == tid) or sorted((s, e) for _, s, e in got.steps)
    own = got.busy.get(tid, [])
    if not spans:
        times = [t for span in own for t in span] + [c.issue_us for c in calls]
        if not times:
            raise TraceError(f"{path}: no events on the thread that issued the calls")
        spans = [(min(times), max(times))]
    issuing = [(e["ts"], e["ts"] + e["dur"]) for e in got.c10d + got.param if e["tid"] == tid]
    busy = Busy(subtract_spans(own, issuing))  # a call's own issue is not compute: the replay issues it again
    # Each step is given its own calls and the issue spans that reach into it, found by bisection: all of them
    # for every step cost steps x calls (4,000 steps: 7.6 s). The issue spans merged first are the same holes.
    holes, order = Busy(issuing), sorted(range(len(calls)), key=lambda i: calls[i].issue_us)
    issued = [calls[i].issue_us for i in order]
    steps = []
    for start, end in spans:
        own_calls = sorted(order[bisect.bisect_left(issued, start):bisect.bisect_left(issued, end)])
        reaching = holes.spans[bisect.bisect_left(holes.ends, start):bisect.bisect_right(holes.starts, end)]
        steps.append(build_step(start, end, busy, [calls[i] for i in own_calls], reaching))
    outside = len(calls) - sum(len(s.calls) for s in steps)
    if outside:
        notes.append(f"{outside} call(s) issued outside the profiled steps, left out")
    return RankTrace(0, tuple(steps))


def _param_calls(got: _Collected, path: str, notes: list[str]) -> tuple[list[TraceCall], Any]:
    calls, dropped = [], Counter()
    for event in sorted(got.param, key=lambda e: e["ts"]):
        args = event["args"]
        name = str(args.get("Collective name", "")).strip('"')
        if name not in PARAM_NAMES:
            dropped[name or "?"] += 1
            continue
        dtype = _dtype(args.get("dtype"), event["where"])
        nelems = max(int(args.get("In msg nelems") or 0), int(args.get("Out msg nelems") or 0))
        calls.append(TraceCall(PARAM_NAMES[name], nelems * ITEMSIZE[dtype], dtype, "", _ranks(args, event["where"]),
                               str(args.get("Process Group Name", "")).strip('"'), event["ts"], None, None,
                               where=event["where"]))
    _note_dropped(dropped, notes)
    runs = sorted(got.kernels)
    if len(runs) == len(calls):
        calls = [_ran(c, s, e) for c, (s, e) in zip(calls, runs)]
    elif calls:
        notes.append(f"{len(runs)} communication kernel(s) for {len(calls)} call(s): run times unknown")
    tids = Counter(e["tid"] for e in got.param)
    return calls, (tids.most_common(1)[0][0] if tids else None)


def _c10d_calls(got: _Collected, path: str, info: dict, world: int, notes: list[str]) -> tuple[list[TraceCall], Any]:
    sets = _group_sets(info, world, path)
    issued = sorted((e for e in got.c10d if e["name"] in C10D_OPS), key=lambda e: e["ts"])
    _note_dropped(Counter(e["name"] for e in got.c10d if e["name"] not in C10D_OPS), notes)
    if issued and len(sets) > 1:
        raise TraceError(f"{path}: {len(sets)} process groups of different ranks, and its calls (c10d ops, no "
                         f"record_param_comms) do not say which they used; a trace of NCCL's process groups does")
    group = tuple(sorted(next(iter(sets))))
    runs = sorted(got.runs)
    barriers = [e for e in got.c10d if e["name"] == "c10d::barrier"]
    every = sorted(issued + barriers, key=lambda e: e["ts"])  # barriers run on the workers too
    matched = _match([e["ts"] for e in every], runs)
    calls = []
    for event, run in zip(every, matched):
        if event["name"] == "c10d::barrier":
            continue
        collective, which = C10D_OPS[event["name"]]
        first = _first(event["args"], "Input type", event["where"], "")
        dtype = _dtype(first if first not in ("TensorList", "") else (run[2] if run else ""), event["where"])
        calls.append(TraceCall(collective, event["count"] * ITEMSIZE[dtype], dtype, "", group, "0", event["ts"],
                               run[0] if run else None, run[1] if run else None, where=event["where"]))
    tids = Counter(e["tid"] for e in issued)
    return calls, (tids.most_common(1)[0][0] if tids else _lead_tid(got))


def _group_sets(info: dict, world: int, path: str) -> set[tuple[int, ...]]:
    """The sets of ranks of the trace's process groups (distributedInfo's pg_config), or the whole job."""
    where = f"{path}: distributedInfo"
    configs = info.get("pg_config") or []
    if not isinstance(configs, list) or not all(isinstance(pg, dict) for pg in configs):
        raise TraceError(f"{where}: 'pg_config' is {brief(configs)}; it must be a list of objects")
    sets = set()
    for pg in configs:
        ranks = pg.get("ranks") or []
        if not isinstance(ranks, list) or len(ranks) > world:
            raise TraceError(f"{where}: a pg_config 'ranks' is {brief(ranks)}; it must list at most {world} ranks")
        sets.add(tuple(checked_count(r, where, "pg_config ranks", world - 1) for r in ranks))
    return sets or {tuple(range(world))}


def _lead_tid(got: _Collected) -> Any:
    return got.steps[0][0] if got.steps else (max(got.busy, key=lambda t: len(got.busy[t])) if got.busy else None)


def _match(issues: list[float], runs: list[tuple[float, float, str]]) -> list[tuple | None]:
    """Each issued call's run: the next unused worker span that starts after it was issued."""
    out, j = [], 0
    for ts in issues:
        while j < len(runs) and runs[j][0] < ts - 1.0:
            j += 1
        out.append(runs[j] if j < len(runs) else None)
        j += 1
    return out


def _ran(call: TraceCall, start: float, end: float) -> TraceCall:
    return replace(call, start_us=start, end_us=end)


def shape_elements(dims: Any, where: str, depth: int = 0) -> int:
    """Elements of a shape, or the sum over a list of shapes (a TensorList, nested a few deep), checked
    (the execution trace's reader counts its inputs so too)."""
    if not isinstance(dims, list) or depth > 4:
        raise TraceError(f"{where}: 'Input Dims' holds {brief(dims)}; it must hold shapes (lists of whole numbers)")
    if not dims:
        return 0
    if not any(isinstance(d, list) for d in dims):
        return math.prod(checked_shape(dims, where, "Input Dims"))
    total = sum(shape_elements(d, where, depth + 1) for d in dims)
    if total > MAX_ELEMENTS:
        raise TraceError(f"{where}: 'Input Dims' holds {total:.3g} elements; a call moves at most {MAX_ELEMENTS:,d}")
    return total


def _dtype(name: Any, path: str) -> str:
    key = str(name or "").strip('"').lower()
    if key not in DTYPES:
        raise TraceError(f"{path}: a call of dtype {brief(name)}, which this reader does not know")
    return DTYPES[key]


def _ranks(args: dict, path: str) -> tuple[int, ...]:
    """The group's global ranks from record_param_comms' args; `path` names the file (and the event)."""
    text = str(args.get("Process Group Ranks", "")).strip('"')
    size = int(args.get("Group size") or 0)
    numbers = [checked_count(int(n) if len(n) <= 12 else n, path, "Process Group Ranks", MAX_RANKS - 1)
               for n in re.findall(r"-?\d+", text[:16 * MAX_RANKS])]
    if "..." in text:  # past 30 ranks torch writes the first 29 and the last
        start, stride = args.get("Global rank start"), args.get("Global rank stride")
        if start is not None and stride and size:
            numbers = list(range(int(start), int(start) + int(stride) * size, int(stride)))
        elif len(numbers) > 2 and size and numbers[1] - numbers[0] == numbers[2] - numbers[1]:
            numbers = list(range(numbers[0], numbers[0] + (numbers[1] - numbers[0]) * size, numbers[1] - numbers[0]))
        else:
            raise TraceError(f"{path}: a group's ranks are cut short ({text}) and cannot be completed")
    if not numbers or (size and len(numbers) != size):
        raise TraceError(f"{path}: a call's Process Group Ranks {brief(text)} do not give its {size} ranks")
    if len(set(numbers)) != len(numbers):
        raise TraceError(f"{path}: a call's Process Group Ranks {brief(text)} name a rank twice")
    return tuple(sorted(numbers))


def _note_dropped(dropped: Counter, notes: list[str]) -> None:
    if dropped:
        notes.append("left out (not replayed): " + ", ".join(f"{n} {name}" for name, n in sorted(dropped.items())))
