"""Read PyTorch's execution trace (torch.profiler.ExecutionTraceObserver's JSON, Chakra's input; one
file per rank) into the job's calls, streamed (traces/chrome_json.py) as the profiler's trace is.

An execution trace lists every operator the rank ran as a node, in execution order (its `id`), with
its inputs' shapes and types but no times. The calls are the `c10d::` nodes (the same operators
torch_profiler.C10D_OPS sizes: the input whose elements are nccl-tests' size, the dtype from its type,
"Tensor(float)" or "GenericList[Tensor(float)]"). What it cannot know: which rank wrote the file (the
schema 1.1.1 header has a pid, no rank: the files are taken in rank order, as given), which process
group a call used (its group is written "<Object>": every call is taken to be on all ranks, and a trace
of several groups is caught only when its ranks disagree), and any time (compute and run times zero,
the whole trace one step). Known schemas: SCHEMA_PREFIXES.
"""
from __future__ import annotations

import re
from collections import Counter

from commbench.proxies.traces import calls as trace_calls
from commbench.proxies.traces.calls import JobTrace, RankTrace, TraceCall, TraceError, TraceStep, brief, checked_count
from commbench.proxies.traces.chrome_json import open_text, read_chrome_trace
from commbench.proxies.traces.torch_profiler import C10D_OPS, DTYPES, ITEMSIZE, shape_elements

SCHEMA_PREFIXES = ("1.0.", "1.1.")  # torch 2.14.1 writes "1.1.1-chakra.0.0.4"
NODES_KEY = "nodes"


def looks_like_execution_trace(head: str) -> bool:
    return '"traceEvents"' not in head and '"nodes"' in head and '"schema"' in head


def read_execution_traces(paths: list[str]) -> JobTrace:
    world = len(paths)
    ranks, dropped = [], Counter()
    for rank, path in enumerate(paths):
        calls = _calls(path, tuple(range(world)), dropped)
        ranks.append(RankTrace(rank, (TraceStep(0.0, 0.0, tuple(calls)),)))
    notes = ["an execution trace has no times, ranks or groups: files taken in rank order, every call on all "
             "ranks, compute and run times zero"]
    if dropped:
        notes.append("left out (not replayed): " + ", ".join(f"{n} {name}" for name, n in sorted(dropped.items())))
    return JobTrace(world, tuple(ranks), "PyTorch execution trace", tuple(notes))


def _calls(path: str, group: tuple[int, ...], dropped: Counter) -> list[TraceCall]:
    nodes, schema = [], None
    try:
        with open_text(path) as handle:
            for number, (key, value) in enumerate(read_chrome_trace(handle, path, NODES_KEY)):
                if number >= trace_calls.MAX_EVENTS:
                    raise TraceError(f"{path}: more than {trace_calls.MAX_EVENTS:,d} nodes: more than a trace this "
                                     f"reader takes")
                if key == "schema":
                    schema = str(value)
                elif key == NODES_KEY and str(value.get("name", "")).startswith("c10d::"):
                    nodes.append(value)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc
    if schema is None or not schema.startswith(SCHEMA_PREFIXES):
        raise TraceError(f"{path}: execution trace schema {schema!r}: this reader knows {', '.join(SCHEMA_PREFIXES)}*")
    calls = []
    ids = {id(n): checked_count(n.get("id", 0), f"{path}: node {brief(n.get('id'))} ({brief(n['name'])})", "id")
           for n in nodes}
    for node in sorted(nodes, key=lambda n: ids[id(n)]):
        name, where = node["name"], f"{path}: node {ids[id(node)]} ({brief(node['name'])})"
        if name not in C10D_OPS:
            dropped[name] += 1
            continue
        collective, which = C10D_OPS[name]
        inputs = node.get("inputs") or {}
        shapes, types = (inputs.get("shapes"), inputs.get("types")) if isinstance(inputs, dict) else (None, None)
        if not isinstance(shapes, list) or not isinstance(types, list) or len(shapes) <= which or len(types) <= which:
            raise TraceError(f"{where}: 'inputs' {brief(inputs)} lacks its input {which} (shapes and types)")
        dtype = _dtype(str(types[which]), where)
        calls.append(TraceCall(collective, shape_elements(shapes[which], where) * ITEMSIZE[dtype], dtype, "", group,
                               "0", 0.0, None, None, where=where))
    return calls


def _dtype(text: str, path: str) -> str:
    found = re.search(r"Tensor\(([^)]*)\)", text)
    name = found.group(1).strip().lower() if found else ""
    if name not in DTYPES:
        raise TraceError(f"{path}: a call of type {brief(text)}, which this reader does not know")
    return DTYPES[name]
