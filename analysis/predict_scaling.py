"""What `commbench predict-scaling` computes: a model's data-parallel step from 1 to N GPUs for
one or two allreduce algorithms, and the `scaling` records it makes (acc_ratio included).
The command's options, table and file are in commbench/commands/predict_scaling.py; this module takes
values already checked there.

Compute per step, in order of preference: a measured 1-GPU training throughput without DDP
(step = batch / throughput), a traced profile's time (profiles extract --from-trace: the time per
sample traced on its device, times the batch; it counts no FLOPs for a rate to apply to), an
achieved device rate in TFLOP/s for the profile's FLOPs, or the hardware's peak `device_tflops`
for the precision (said to be optimistic). The step splits into forward and backward by the
profile's FLOPs (a traced profile's: by its times); DDP's gradients stay fp32 under AMP (the
parameters are fp32), so the precision does not change the traffic.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from commbench.analysis import calibration as C
from commbench.analysis import scale_terms as T
from commbench.analysis.scaling import ScalingError, StepQuestion, predict_scaling
from commbench.costmodel import Hardware, terms_of
from commbench.files import shown
from commbench.proxies.profile import Profile
from commbench.proxies.setups import Choice
from commbench.proxies.timeline import flops_times_us
from commbench.results import CALIBRATED_ESTIMATE, CORPUS_PROVENANCE, RAW_ESTIMATE, ScalingRecord
from commbench.step_terms import StepTerms

LONGEST_STEP_S = 86400.0  # a day: a compute step longer than this comes from a wrong rate, not from a model


@dataclass(frozen=True)
class ScalingRun:
    profile: Profile
    hw: Hardware
    batch: int  # per GPU
    compute_label: str  # where the compute time came from, as the table and the records say it
    curves: dict[str, list[ScalingRecord]]  # algorithm -> points, in the order asked for
    baseline: str | None
    candidate: str | None
    ddp_us: float = 0.0  # DDP's own work per step, as given
    stragglers: bool = False  # steps wait for the expected slowest of N ranks (a 1-rank run's distribution)
    terms: tuple[str, ...] = ()  # the published-evidence terms applied to a hardware without a fit, as said
    calibration: C.Calibration | None = None  # the corpus calibration that gave intervals without a fit

    def records(self, run_id: str = "") -> list[ScalingRecord]:
        """One record per algorithm and GPU count; the candidate's carry acc_ratio = its throughput / the baseline's."""
        base = self.curves.get(self.baseline) if self.baseline else None
        out = []
        for name, points in self.curves.items():
            for i, point in enumerate(points):
                acc = point.samples_per_s / base[i].samples_per_s if base and name == self.candidate else None
                out.append(replace(point, acc_ratio=acc, baseline=self.baseline, candidate=self.candidate,
                                   run_id=run_id))
        return out


def peak_tflops(hw: Hardware, precision: str) -> float | None:
    """The hardware's peak device rate for fp32 or amp (fp16), if it gives one."""
    return hw.device_tflops.get("fp16" if precision == "amp" else "fp32")


def compute_us(profile: Profile, hw: Hardware, batch: int, throughput: float | None, tflops: float | None,
               precision: str, *, block: tuple | None = None, ranks_per_node: int | None = None
               ) -> tuple[float, float, str]:
    """(forward_us, backward_us, label) of one step at `batch`, from the first of: a 1-GPU throughput
    (samples/s), a traced profile's time, an achieved rate (TFLOP/s), `block` (the hardware's compute block
    and the dtype to read it in, for a transformer profile: its operators at `batch` sequences, a CPU block's
    cores shared by `ranks_per_node` ranks), the hardware's peak for `precision`. Given rates are positive;
    ScalingError when none is given and the hardware has no peak. A rate given for a traced profile (no FLOPs)
    times a step of 0 s, which check_compute_us refuses with the label's advice."""
    forward_work, backward_work = profile.compute_work()
    share = forward_work / (forward_work + backward_work) if forward_work + backward_work > 0 else 0.0
    if throughput:
        step = batch / throughput * 1e6
        return (step * share, step * (1 - share),
                f"{throughput:g} samples/s measured on 1 GPU ({_ms(step)} ms/step)")
    traced = profile.traced
    if traced is not None and not tflops:
        forward, backward = traced.times_us(batch)
        return forward, backward, (f"the time traced on {traced.device} ({traced.forward_us / 1e3:.4g} ms forward and "
                                   f"{traced.backward_us / 1e3:.4g} ms backward per sample x batch {batch}: "
                                   f"{_ms(forward + backward)} ms/step)")
    if traced is not None:
        return 0.0, 0.0, (f"--tflops {tflops:g}: {profile.name} is a traced profile and counts no FLOPs; without "
                          f"--tflops its compute is the time traced on {traced.device}")
    if block is not None and not tflops and profile.transformer is not None:
        from commbench.analysis.predict_layout import model_compute_us

        compute, dtype = block
        forward, backward = model_compute_us(profile, hw, batch, compute, dtype, ranks_per_node or hw.ranks_per_node)
        return forward, backward, (f"the compute block of {compute.device}, operator by operator, {dtype} "
                                   f"({_ms(forward + backward)} ms/step)")
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


@dataclass(frozen=True)
class Curves:
    """The curves one predict-scaling run draws: a (setup choice, algorithm) pair each, and the two that acc_ratio
    compares by their curve_label (None: no ratio)."""
    pairs: tuple[tuple[Choice, str], ...]
    baseline: str | None = None
    candidate: str | None = None

    @property
    def algorithms(self) -> list[str]:
        return [a for _, a in self.pairs]


def scaling_run(q: StepQuestion, hw: Hardware, gpu_counts: list[int], gpus_per_node: int, curves: Curves,
                step_ratios=None) -> ScalingRun:
    """A curve per (setup, algorithm) pair of `curves` over `gpu_counts` (weak scaling: `q.batch` per GPU) on
    nodes of `gpus_per_node`: `q` with each pair's choice and algorithm and, given a 1-rank run's `step_ratios`,
    the expected slowest of N ranks (analysis/stragglers.py). A hardware without a fit gets the terms of
    analysis/scale_terms.py that the published corpus keeps (the question's step terms are the hardware's:
    applied_terms), and every point of 2+ GPUs without a fit's interval gets the corpus calibration's estimate and
    interval (corpus_interval). ScalingError: a GPU count that does not fill whole nodes, or a compute time
    `check_compute_us` refuses."""
    check_compute_us(q.compute.forward_us, q.compute.backward_us, q.compute_label)
    measured = step_ratios is not None
    used, step_ratios, terms = evidence_terms(hw, step_ratios)
    setups, algorithms = [c.name for c, _ in curves.pairs], curves.algorithms
    q, batch, out = q.at(terms=applied_terms(hw)), q.batch, {}
    for choice, name in curves.pairs:
        label = curve_label(choice.name, name, setups, algorithms)
        if label not in out:
            out[label] = predict_scaling(q.at(choice=choice, algorithm=name), used, gpu_counts, gpus_per_node,
                                         step_ratios)
    calibration = C.load_calibration()
    out = {name: [corpus_interval(p, batch * (p.knobs or {}).get("accumulate", 1), calibration)
                  for p in points] for name, points in out.items()}
    return ScalingRun(q.profile, hw, batch, q.compute_label, out, curves.baseline, curves.candidate,
                      q.compute.own_us, measured, terms, calibration)


def unfitted(hw: Hardware) -> bool:
    """No link level of `hw` was measured (a preset or a hand-written file)."""
    return not any((hw.meta.get("levels_fitted") or {}).values())


def applied_terms(hw: Hardware) -> StepTerms | None:
    """The step terms a prediction on `hw` applies (commbench/step_terms.py): the file's own block; for a hardware
    without a fit, its device class's defaults; a fitted file without a block: none (its figures are measured,
    as scale_terms says of the other terms)."""
    if hw.step_terms is not None:
        return hw.step_terms
    return terms_of(hw) if unfitted(hw) else None


def evidence_terms(hw: Hardware, step_ratios) -> tuple[Hardware, object, tuple[str, ...]]:
    """(hardware, step ratios, what was applied, each said with where it applies): for a hardware without a fit,
    the terms the published corpus keeps (scale_terms.KEPT): NICs at their class's nccl-tests efficiency; and
    stragglers, unless a measured distribution is given, from the step terms' `step_cv` (applied_terms: a file's
    own block, or the class default for a hardware without a fit). A fitted file without a block is used as it is."""
    terms = applied_terms(hw)
    said = []
    evidence = T.nic_efficiency(hw) if "nic" in T.KEPT and unfitted(hw) else None
    if evidence:
        hw = T.delivered(hw)
        said.append(f"without a fit: NICs at {100 * evidence.value:.1f}% of their line rate ({evidence.source})")
    if step_ratios is None and "stragglers" in T.KEPT and terms is not None and terms.step_cv.value > 0:
        step_ratios = T.default_step_ratios(terms.step_cv.value)
        said.append(("without a fit" if unfitted(hw) else "the file's step_terms")
                    + f": stragglers: the expected slowest of N ranks, steps normal with CV "
                    f"{100 * terms.step_cv.value:.2f}% (step_cv, {terms.step_cv.source}: "
                    f"{shown(terms.step_cv.evidence)}; --jitter-from for your own)")
    return hw, step_ratios, tuple(said)


def corpus_interval(point: ScalingRecord, batch: int, calibration: C.Calibration | None) -> ScalingRecord:
    """`point` with the estimate users see and its 80% interval (docs/model.md, "The estimate users see"). Where
    a fit gives no interval, the corpus calibration gives both: the linearity moved by the corpus's median error
    (the calibrated estimate, inside its interval by construction) and the interval of its order statistics; the
    throughput and step follow from the linearity. The cost model's own figures stay as raw_*. A fit's interval
    keeps the raw figure as the estimate, stretched to hold it where every refit moved one way. 1 GPU: nothing to
    calibrate (the linearity is 1 by definition). A linearity interval reaching 0 leaves the step's upper end
    unbounded: no step interval then."""
    point = replace(point, estimate=RAW_ESTIMATE, raw_step_us=point.step_us, raw_samples_per_s=point.samples_per_s,
                    raw_linearity=point.linearity)
    if point.step_interval_us is not None:
        return _holding(point)
    if point.gpus == 1 or calibration is None or not point.linearity > 0:
        return point
    low, high = calibration.linearity_interval(point.linearity)
    one_gpu = point.samples_per_s / (point.gpus * point.linearity)
    rates = (low * point.gpus * one_gpu, high * point.gpus * one_gpu)
    step = (batch * point.gpus / rates[1] * 1e6, batch * point.gpus / rates[0] * 1e6) if rates[0] > 0 else None
    point = replace(point, step_interval_us=step, samples_per_s_interval=rates, linearity_interval=(low, high),
                    interval_source=CORPUS_PROVENANCE)
    linearity = calibration.linearity_estimate(point.linearity)
    if not linearity > 0:  # the corpus's median error takes it to 0: no finite step to show, the raw one stays, and
        high = max(high, point.linearity)  # the interval's upper end is raised to hold it (a fit's is stretched so)
        return replace(point, linearity_interval=(low, high),
                       samples_per_s_interval=(rates[0], max(rates[1], point.samples_per_s)))
    rate = linearity * point.gpus * one_gpu
    return replace(point, estimate=CALIBRATED_ESTIMATE, step_us=batch * point.gpus / rate * 1e6, samples_per_s=rate,
                   speedup=linearity * point.gpus, linearity=linearity, linearity_offset=linearity - point.linearity)


def _holding(point: ScalingRecord) -> ScalingRecord:
    """A fit's interval stretched, where it must be, to hold its own prediction (the jackknife+ order statistics
    need not hold it when every refit moves one way); the rates at its ends follow."""
    low, high = point.step_interval_us
    if low <= point.step_us <= high:
        return point
    low, high = min(low, point.step_us), max(high, point.step_us)
    per_step = point.samples_per_s * point.step_us  # samples x 1e6 per step
    rates = (per_step / high, per_step / low)
    one_gpu = point.samples_per_s / (point.gpus * point.linearity)
    return replace(point, step_interval_us=(low, high), samples_per_s_interval=rates,
                   linearity_interval=(rates[0] / (point.gpus * one_gpu), rates[1] / (point.gpus * one_gpu)))
