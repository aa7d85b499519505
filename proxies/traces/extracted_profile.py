"""A gradient profile (proxies/profile.py) from one rank's PyTorch profiler trace of a data-parallel job,
so that `proxy`, `profiles show --buckets` and `predict-scaling` can take the user's own model as traced.

What the trace gives (captured with record_shapes=True): each gradient's shape and dtype, in the order
autograd accumulated them (`torch::autograd::AccumulateGrad` events: the ready order DDP sees), and the
issuing thread's busy time in the forward (the step's start to autograd's first evaluate_function), the
backward (to its last) and at each gradient's readiness. The times are kept as times (the profile's
`traced` compute: per sample, divided by --batch, with the device the trace ran on), and `proxy` and
`predict-scaling` use them as the step's compute; the profile's FLOPs are 0, as a trace counts none.
The step read is the traced step of median length.

What it cannot know: parameter names and registration order (the profile lists them as param0.. in the
reverse of ready order, which is registration order for a model whose backward runs its layers in
reverse), the input shape (1), the model's FLOPs (only its times on the traced device), and sharding
units (an FSDP trace's AccumulateGrad events are the sharded parameters', not the model's: not read).
"""
from __future__ import annotations

import os
import statistics
from collections import Counter

from commbench.proxies.profile import DTYPE_BYTES, Profile, ProfileError, TensorSpec, TracedCompute, profile_from_dict
from commbench.proxies.traces.calls import Busy, TraceError, brief, subtract_spans
from commbench.proxies.traces.torch_profiler import DTYPES, collect


def profile_from_trace(path: str, name: str | None = None, batch: int = 1, sample_unit: str = "samples") -> Profile:
    got = collect(path)
    issuing = got.c10d + got.param
    sharded = [e for e in issuing if "gather" in e["name"] or "scatter" in e["name"]
               or "gather" in str(e["args"].get("Collective name", "")) or "scatter" in str(
                   e["args"].get("Collective name", ""))]
    if sharded:
        raise TraceError(f"{path}: a sharded job's trace (all-gathers, reduce-scatters: FSDP or ZeRO): its "
                         f"AccumulateGrad events are shards; --from-trace reads a DDP trace")
    tids = Counter(e["tid"] for e in issuing)
    tid = tids.most_common(1)[0][0] if tids else (got.steps[0][0] if got.steps else None)
    steps = sorted((e - s, s, e) for t, s, e in got.steps if t == tid)
    if not steps:
        raise TraceError(f"{path}: no ProfilerStep spans on the thread that issued the calls (profile with "
                         f"torch.profiler's schedule and call prof.step() each step)")
    _, start, end = steps[(len(steps) - 1) // 2]
    grads = sorted((g for g in got.grads if g[0] == tid and start <= g[1] < end), key=lambda g: g[1])
    if not grads or any(g[2] is None for g in grads):
        raise TraceError(f"{path}: no AccumulateGrad events with shapes in a step (capture with record_shapes=True; "
                         f"an FSDP trace's gradients are sharded: not read)")
    spans = [b for b in got.backward if b[0] == tid and start <= b[1] < end]
    if not spans:
        raise TraceError(f"{path}: no autograd::engine::evaluate_function events in the step read (the backward): "
                         f"profile whole training steps")
    backward_start, backward_end = min(b[1] for b in spans), max(b[2] for b in spans)
    busy = Busy(subtract_spans(got.busy.get(tid, []), [(e["ts"], e["ts"] + e["dur"]) for e in issuing]))
    samples = max(1, batch)

    def per_sample_us(t0: float, t1: float) -> float:
        return (busy.progress(t1) - busy.progress(t0)) / samples

    count = len(grads)
    tensors, ready_us = [], []
    for index in range(count):  # registration order: the reverse of ready order
        ready = count - 1 - index
        _, ts, shape, dtype, where = grads[ready]
        tensors.append(TensorSpec(f"param{index}", shape, _dtype(dtype, where), 0.0, ready))
        ready_us.append(per_sample_us(backward_start, min(max(ts, backward_start), backward_end)))
    traced = TracedCompute(traced_device(got.meta), samples, per_sample_us(start, backward_start),
                           per_sample_us(backward_start, backward_end), tuple(ready_us))
    return _checked(Profile(name or os.path.basename(path).split(".")[0], tuple(tensors), 0.0, 0.0, (1,), sample_unit,
                            samples, source={"package": "trace", "trace": os.path.abspath(path),
                                             "step_us": statistics.median(e - s for _, s, e in steps),
                                             "note": "no FLOPs: the compute is the traced busy time (traced); names "
                                                     "and registration order are inferred (reverse of ready order)"},
                            traced=traced), path)


def traced_device(meta: dict) -> str:
    """What a trace ran on: its GPU's name (kineto's deviceProperties), or the CPU of its host."""
    devices = meta.get("deviceProperties")
    names = sorted({str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name")}) \
        if isinstance(devices, list) else []
    if names:
        return names[0] if len(names) == 1 else f"{names[0]} (and {len(names) - 1} other device kind(s))"
    host = meta.get("host_name")
    return f"CPU of host {str(host)[:200]}" if host else "CPU"


def _checked(profile: Profile, path: str) -> Profile:
    """The profile as a profile file is checked (parameters, times and names in range), or TraceError."""
    try:
        profile_from_dict(profile.to_dict(), path)
    except ProfileError as exc:
        raise TraceError(f"{exc} (read from the trace)") from None
    return profile


def _dtype(name: str, path: str) -> str:
    dtype = DTYPES.get(str(name).lower())
    if dtype not in DTYPE_BYTES:
        raise TraceError(f"{path}: a gradient of dtype {brief(name)}, which a profile cannot hold")
    return dtype
