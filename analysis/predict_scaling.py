"""What `commbench predict-scaling` computes: a model's data-parallel step from 1 to N GPUs for
one or two allreduce algorithms, and the `scaling` records it makes (acc_ratio included).
The command's options, table and file are in commbench/commands/model.py; this module takes
values already checked there.

Compute per step, in order of preference: a measured 1-GPU training throughput without DDP
(step = batch / throughput), an achieved device rate in TFLOP/s for the profile's FLOPs, or
the hardware's peak `device_tflops` for the precision (said to be optimistic). The step
splits into forward and backward by the profile's FLOPs; DDP's gradients stay fp32 under
AMP (the parameters are fp32), so the precision does not change the traffic.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from commbench.analysis.costmodel import Hardware
from commbench.analysis.scaling import ScalingError, ScalingPoint, predict_scaling
from commbench.proxies.profile import Profile
from commbench.proxies.timeline import flops_times_us
from commbench.results import ScalingRecord

LONGEST_STEP_S = 86400.0  # a day: a compute step longer than this comes from a wrong rate, not from a model


@dataclass(frozen=True)
class ScalingRun:
    profile: Profile
    hw: Hardware
    batch: int  # per GPU
    compute_label: str  # where the compute time came from, as the table and the records say it
    curves: dict[str, list[ScalingPoint]]  # algorithm -> points, in the order asked for
    baseline: str | None
    candidate: str | None
    ddp_us: float = 0.0  # DDP's own work per step, as given
    stragglers: bool = False  # steps wait for the expected slowest of N ranks (a 1-rank run's distribution)

    def records(self, run_id: str = "") -> list[ScalingRecord]:
        """One record per algorithm and GPU count; the candidate's carry acc_ratio = its throughput / the baseline's."""
        base = self.curves.get(self.baseline) if self.baseline else None
        out = []
        for name, points in self.curves.items():
            for i, point in enumerate(points):
                acc = point.samples_per_s / base[i].samples_per_s if base and name == self.candidate else None
                out.append(ScalingRecord(model=self.profile.name, hardware=self.hw.name, batch=self.batch,
                                         compute=self.compute_label, **point.to_dict(), acc_ratio=acc,
                                         baseline=self.baseline, candidate=self.candidate, run_id=run_id))
        return out


def peak_tflops(hw: Hardware, precision: str) -> float | None:
    """The hardware's peak device rate for fp32 or amp (fp16), if it gives one."""
    return hw.device_tflops.get("fp16" if precision == "amp" else "fp32")


def compute_us(profile: Profile, hw: Hardware, batch: int, throughput: float | None, tflops: float | None,
               precision: str) -> tuple[float, float, str]:
    """(forward_us, backward_us, label) of one step at `batch`, from the first of: a 1-GPU throughput
    (samples/s), an achieved rate (TFLOP/s), the hardware's peak for `precision`. Given rates are
    positive; ScalingError when none is given and the hardware has no peak."""
    total_flops = profile.forward_flops + profile.backward_flops
    share = profile.forward_flops / total_flops if total_flops > 0 else 0.0
    if throughput:
        step = batch / throughput * 1e6
        return (step * share, step * (1 - share),
                f"{throughput:g} samples/s measured on 1 GPU ({_ms(step)} ms/step)")
    rate = tflops or peak_tflops(hw, precision)
    if not rate:
        raise ScalingError(f"{hw.name} gives no device_tflops for {precision}")
    label = f"the profile's FLOPs at {rate:g} TFLOP/s" + (
        "" if tflops else f" ({hw.name}'s {precision} peak: optimistic)")
    return (*flops_times_us(profile, batch, rate), label)


def _ms(time_us: float) -> str:
    return f"{time_us / 1e3:.1f}" if time_us < 1e9 else f"{time_us / 1e3:.3g}"  # no 300-digit numbers


def check_compute_us(forward_us: float, backward_us: float, label: str) -> None:
    """ScalingError unless one step computes for more than 0 s and at most LONGEST_STEP_S: an infinite
    rate makes the step 0 (and every speed-up 0/0), a tiny one makes it centuries."""
    step_s = (forward_us + backward_us) / 1e6
    if not 0 < step_s <= LONGEST_STEP_S:  # NaN fails too
        raise ScalingError(f"compute per step from {label}: {step_s:.3g} s; it must be more than 0 s and at most "
                           f"a day ({LONGEST_STEP_S:g} s)")


def curve_label(setup: str, algorithm: str, setups: list[str], algorithms: list[str]) -> str:
    """How a curve is named in the table, the records' baseline/candidate and acc_ratio: its algorithm when one
    setup is predicted, its setup when one algorithm is, else setup/algorithm."""
    if len(set(setups)) == 1:
        return algorithm
    if len(set(algorithms)) == 1:
        return setup
    return f"{setup}/{algorithm}"


def scaling_run(profile: Profile, hw: Hardware, gpu_counts: list[int], gpus_per_node: int, batch: int,
                forward_us: float, backward_us: float, algorithms: list[str], bucket_mb: float | None = None,
                baseline: str | None = None, candidate: str | None = None, compute_label: str = "",
                ddp_us: float = 0.0, step_ratios=None, choices: list | None = None) -> ScalingRun:
    """A curve per (setup, algorithm) pair over `gpu_counts` (weak scaling: `batch` per GPU) on nodes of
    `gpus_per_node`: `choices[i]` (proxies.setups.Choice; None: DDP with `bucket_mb`) costed by `algorithms[i]`
    (one algorithm and no choices: DDP), the setup's own work `ddp_us` per step and, given a 1-rank run's
    `step_ratios`, the expected slowest of N ranks (analysis/stragglers.py). `baseline`/`candidate` name curves
    (curve_label). ScalingError: a GPU count that does not fill whole nodes, or a compute time
    `check_compute_us` refuses."""
    check_compute_us(forward_us, backward_us, compute_label)
    node_hw = replace(hw, ranks_per_node=gpus_per_node)
    choices = choices or [None] * len(algorithms)
    setups = [c.name if c is not None else "ddp" for c in choices]
    curves = {}
    for choice, name, setup in zip(choices, algorithms, setups):
        label = curve_label(setup, name, setups, algorithms)
        if label not in curves:
            curves[label] = predict_scaling(profile, node_hw, gpu_counts, gpus_per_node, batch, forward_us,
                                            backward_us, 0.0, bucket_mb, "ddp", name, ddp_us, step_ratios, choice)
    return ScalingRun(profile, hw, batch, compute_label, curves, baseline, candidate, ddp_us, step_ratios is not None)
