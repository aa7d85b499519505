"""`commbench predict-scaling`: options checked into a run, then the table and the JSON lines.

Compute per step, in order of preference: `--throughput-1gpu` (a measured 1-GPU training
throughput without DDP: step = batch / throughput), `--tflops` (the profile's FLOPs at
that achieved rate), or the hardware's peak `device_tflops` for `--precision` (said to be
optimistic). The step splits into forward and backward by the profile's FLOPs; DDP's
gradients stay fp32 under AMP (the parameters are fp32), so `--precision` does not change
the traffic.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace

from commbench.analysis.costmodel import Hardware, HardwareError, load_hardware
from commbench.analysis.scaling import ALGORITHMS, ScalingError, ScalingPoint, predict_scaling
from commbench.proxies.profile import Profile, ProfileError, load_profile
from commbench.proxies.timeline import flops_times_us


class ScalingUsageError(ValueError):
    """Bad input to predict-scaling (one line, exit 2)."""


@dataclass(frozen=True)
class ScalingRun:
    profile: Profile
    hw: Hardware
    batch: int
    compute_label: str
    curves: dict[str, list[ScalingPoint]]  # algorithm -> points
    baseline: str | None
    candidate: str | None


def _gpu_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ScalingUsageError(f"--gpus {text!r}: expected a comma list of GPU counts, e.g. 1,8,16") from exc
    if not counts or min(counts) < 1:
        raise ScalingUsageError(f"--gpus {text!r}: GPU counts must be at least 1")
    return counts


def compute_us(profile: Profile, hw: Hardware, batch: int, throughput: float | None, tflops: float | None,
                precision: str) -> tuple[float, float, str]:
    for flag, value in (("--throughput-1gpu", throughput), ("--tflops", tflops)):
        if value is not None and not value > 0:
            raise ScalingUsageError(f"{flag} {value:g}: must be positive")
    share = profile.forward_flops / (profile.forward_flops + profile.backward_flops)
    if throughput:
        step = batch / throughput * 1e6
        return step * share, step * (1 - share), f"{throughput:g} samples/s measured on 1 GPU ({step / 1e3:.1f} ms/step)"
    rate = tflops or hw.device_tflops.get("fp16" if precision == "amp" else "fp32")
    if not rate:
        raise ScalingUsageError(f"{hw.name} gives no device_tflops for {precision}: pass --throughput-1gpu or --tflops")
    label = f"the profile's FLOPs at {rate:g} TFLOP/s" + ("" if tflops else f" ({hw.name}'s {precision} peak: optimistic)")
    return (*flops_times_us(profile, batch, rate), label)


def plan(model: str, hw_spec: str, gpus: str, gpus_per_node: int | None, batch: int | None,
         throughput: float | None, tflops: float | None, precision: str, algorithm: str, bucket_mb: float | None,
         baseline: str | None, candidate: str | None) -> ScalingRun:
    try:
        profile, hw = load_profile(model), load_hardware(hw_spec)
    except (ProfileError, HardwareError) as exc:
        raise ScalingUsageError(str(exc)) from exc
    if (baseline is None) != (candidate is None):
        raise ScalingUsageError("--baseline and --candidate go together (acc_ratio = candidate / baseline)")
    if batch is not None and batch < 1 or bucket_mb is not None and not bucket_mb > 0:
        raise ScalingUsageError("--batch must be at least 1 and --bucket-mb positive")
    batch = batch or profile.default_batch
    forward, backward, label = compute_us(profile, hw, batch, throughput, tflops, precision)
    per_node = gpus_per_node or hw.ranks_per_node
    curves = {}
    for name in dict.fromkeys([baseline, candidate] if baseline else [algorithm]):
        if name not in ALGORITHMS:
            raise ScalingUsageError(f"unknown allreduce algorithm {name!r}; choose from {', '.join(ALGORITHMS)}")
        try:
            curves[name] = predict_scaling(profile, replace(hw, ranks_per_node=per_node), _gpu_counts(gpus), per_node,
                                           batch, forward, backward, 0.0, bucket_mb, "ddp", name)
        except ScalingError as exc:
            raise ScalingUsageError(str(exc)) from exc
    return ScalingRun(profile, hw, batch, label, curves, baseline, candidate)


def render(run: ScalingRun, json_path: str | None) -> list[str]:
    """The table (and the JSON lines, written as a side effect)."""
    lines = [f"# predict-scaling {run.profile.name} on {run.hw.name} (predicted by the cost model, nothing measured): "
             f"batch {run.batch} per GPU, compute from {run.compute_label}",
             f"# {'algorithm':>9} {'gpus':>6} {'nodes':>6} {'step(ms)':>9} {'comm(ms)':>9} {'exposed(ms)':>11} "
             f"{'samples/s':>11} {'per GPU':>8} {'speedup':>8} {'linearity':>9}"
             + (f" {'acc_ratio':>9}" if run.baseline else "")]
    records = []
    for name, points in run.curves.items():
        base = run.curves.get(run.baseline) if run.baseline else None
        for i, p in enumerate(points):
            acc = p.samples_per_s / base[i].samples_per_s if base and name == run.candidate else None
            lines.append(f"  {name:>9} {p.gpus:>6} {p.nodes:>6} {p.step_us / 1e3:>9.2f} {p.comm_us / 1e3:>9.2f} "
                         f"{p.exposed_comm_us / 1e3:>11.2f} {p.samples_per_s:>11.1f} {p.samples_per_s / p.gpus:>8.1f} "
                         f"{p.speedup:>8.2f} {p.linearity:>9.3f}" + (f" {acc:>9.3f}" if acc is not None else ""))
            records.append({"record": "scaling", "kind": "predicted", "model": run.profile.name, "hardware": run.hw.name,
                            "batch": run.batch, "compute": run.compute_label, **p.to_dict(), "acc_ratio": acc,
                            "baseline": run.baseline, "candidate": run.candidate})
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")
        lines.append(f"# wrote {json_path}")
    return lines
