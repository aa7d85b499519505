"""A proxy step predicted by the cost model, no ranks: what `commbench proxy` does when the job's
ranks are not there to replay it (--backend sim, or --nodes larger than the job).

It sits beside the other predictions (predict.py, predict_scaling.py) and costs the step as
predict-scaling does (analysis/scaling.predict_step), with the same terms for a hardware without a
fit and the same 80% interval. It is on the runtime's floor, not with the pure models: with
--compute measured it runs the real model here (proxies/train.measure_compute), and it writes and
prints its records through the proxy's step log (proxies/steps.StepLog), as a replay does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from commbench.algorithms import LIBRARY
from commbench.analysis.calibration import load_calibration
from commbench.analysis.intervals import levels_fitted
from commbench.analysis.predict_scaling import applied_terms, evidence_terms
from commbench.analysis.scaling import StepPrediction, StepQuestion, predict_step, step_interval_us
from commbench.analysis.stragglers import expected_max
from commbench.backends.registry import MODEL, PREDICTED
from commbench.costmodel import Hardware, load_hardware
from commbench.proxies.catalog import ModelError
from commbench.proxies.comm_plan import describe_calls
from commbench.proxies.config import ProxyConfig
from commbench.proxies.profile import Profile, load_profile
from commbench.proxies.run import ProxyUsageError
from commbench.proxies.setups import Compute
from commbench.proxies.steps import ProxyResult, StepLog
from commbench.proxies.timeline import flops_times_us, traced_words
from commbench.results import CALIBRATED_ESTIMATE, CORPUS_PROVENANCE, FIT_PROVENANCE, RAW_ESTIMATE
from commbench.topology import Topology


@dataclass(frozen=True)
class ProxyPrediction:
    """A predicted step and what it was predicted from: what its header, step and summary records say. `q` is
    the question the step answers (the profile, batch, compute and its words, setup choice, algorithm, step
    terms), asked once and kept whole."""
    q: StepQuestion
    topo: Topology
    hw: Hardware
    step: StepPrediction
    interval: tuple[float, float] | None  # the step's 80% interval, us
    interval_source: str | None  # FIT_PROVENANCE or CORPUS_PROVENANCE
    terms: tuple[str, ...]  # predict-scaling's terms applied for a hardware without a fit
    estimate_us: float  # the step users see: calibrated where the corpus gave the interval, else the raw step

    @property
    def calibrated(self) -> bool:
        return self.estimate_us != self.step.times.step_us

    @property
    def times(self):
        """The step's parts with the estimate as its time; its other stays the cost model's (what the calibration
        adds is `calibration_us`, apart: step = compute + exposed + other + calibration)."""
        t = self.step.times
        return replace(t, step_us=self.estimate_us) if self.calibrated else t

    @property
    def calibration_us(self) -> float | None:
        """What the corpus calibration adds to the cost model's step; None where none applied."""
        return self.estimate_us - self.step.times.step_us if self.calibrated else None

    @property
    def samples(self) -> int:
        return self.q.batch * self.q.choice.get("accumulate") * self.topo.world


def predict_proxy(cfg: ProxyConfig, plan: Any, argv: list[str], hw: Hardware | None = None) -> int:
    """A proxy step predicted by the cost model (no ranks) on `plan.nodes` x `plan.ranks_per_node`
    (a job.Plan): the table and a kind=predicted record. Under a launcher only rank 0 predicts. `hw`: the
    command's --hw as it loaded it (None: cfg.hw read here)."""
    if not plan.lead:
        return 0
    prediction = predict(cfg, Topology(plan.nodes, plan.ranks_per_node), hw)
    log = StepLog(cfg.json_path, True, prediction.samples)
    log.header(_header(prediction, cfg, argv), _header_lines(prediction, cfg))
    t = prediction.times
    log.step(1, False, {"compute_us": t.compute_us, "comm_us": t.comm_us, "exposed_comm_us": t.exposed_comm_us,
                        "step_us": t.step_us, "other_us": t.other_us, "calibration_us": prediction.calibration_us,
                        "calls_us": [list(i) for i in t.comm_intervals]})
    log.summary(_summary(prediction, cfg, log.run_id))
    raw = prediction.step.times.step_us
    if prediction.interval:
        low, high = prediction.interval
        print(f"# step 80% interval ({prediction.interval_source}): {low / 1e3:.2f}-{high / 1e3:.2f} ms, estimate "
              f"{t.step_us / 1e3:.2f} ms", flush=True)
    if prediction.calibrated:
        print(f"# step: the calibrated estimate (the raw step moved by the corpus calibration's median error, inside "
              f"its interval; the {prediction.calibration_us / 1e3:.2f} ms it adds is not in other: calibration_us "
              f"in the records, step = compute + exposed + other + calibration); raw {raw / 1e3:.2f} ms: the cost "
              f"model's own figure", flush=True)
    elif prediction.interval:
        print(f"# step: the cost model's raw figure ({raw / 1e3:.2f} ms), from the fit its interval comes from; no "
              f"corpus calibration applies", flush=True)
    return 0


def predict(cfg: ProxyConfig, topo: Topology, hw: Hardware | None = None) -> ProxyPrediction:
    """The step `cfg` asks for on `topo`, costed on `hw` (None: cfg.hw loaded here), with its interval where there
    is one. The node size is the topology's (the cost model reads no other)."""
    profile = load_profile(cfg.model)
    batch = cfg.batch or profile.default_batch
    hw = hw if hw is not None else load_hardware(cfg.hw)
    compute, label = _compute_split(profile, batch, cfg, hw, topo.ranks_per_node)
    algorithm = LIBRARY if cfg.backend.algorithm == "auto" else cfg.backend.algorithm  # the library's ring unless told
    choice = cfg.choice(topo.nodes, topo.ranks_per_node)
    q = StepQuestion(profile, batch, compute, choice, algorithm, cfg.bucketing, terms=applied_terms(hw),
                     compute_label=label)
    hw, late, terms = _evidence_terms(hw, q, topo)
    q = q.at(straggler_us=late)
    step = predict_step(q, topo, hw)
    interval = step_interval_us(q, topo, hw)
    source, estimate = (FIT_PROVENANCE if interval else None), step.times.step_us
    if interval:  # a fit's interval holds its own prediction, stretched where every refit moved one way
        interval = (min(interval[0], estimate), max(interval[1], estimate))
    elif topo.world > 1:
        interval, source, estimate = _corpus_interval(q, hw, step)
    return ProxyPrediction(q, topo, hw, step, interval, source, terms, estimate)


def _compute_split(profile: Profile, batch: int, cfg: ProxyConfig, hw: Hardware,
                   ranks_per_node: int) -> tuple[Compute, str]:
    """One rank's compute per step as --compute says (a CPU block's cores shared by `ranks_per_node` ranks, as
    predict-scaling shares them), and the words the header gives it."""
    if cfg.compute == "flops":
        return Compute(*flops_times_us(profile, batch, cfg.tflops)), f"flops at {cfg.tflops:g} TFLOP/s"
    if cfg.compute == "trace":
        return Compute(*profile.traced.times_us(batch)), traced_words(profile)
    if cfg.compute == "measured":
        compute = _measure_here(profile, batch, cfg)
        return compute, f"measured on this host (DDP's own work {compute.own_us / 1e3:.2f} ms, measured at 1 rank)"
    if cfg.compute == "block":  # a transformer's whole model on each replica, operator by operator
        from commbench.analysis.predict_layout import model_compute_us
        from commbench.costmodel.compute import compute_from_dict

        block = compute_from_dict(cfg.compute_block)
        dtype = block.meta.get("dtype", "float32")
        return (Compute(*model_compute_us(profile, hw, batch, block, dtype, ranks_per_node)),
                f"each operator from the compute block of {block.device} ({dtype})")
    return Compute(0.0, 0.0), "none"


def _measure_here(profile: Profile, batch: int, cfg: ProxyConfig) -> Compute:
    import torch

    from commbench.proxies.train import measure_compute

    try:
        device = torch.device("cuda" if cfg.backend.device == "cuda" else "cpu")
        return Compute(*measure_compute(profile, batch, device, cfg.amp, trust_code=cfg.trust_profile_code,
                                        bucket_mb=cfg.bucket_mb, choice=cfg.choice(), show_progress=True)[0])
    except (MemoryError, ModelError) as exc:
        raise ProxyUsageError(str(exc).splitlines()[0]) from exc


def _evidence_terms(hw: Hardware, q: StepQuestion, topo: Topology) -> tuple[Hardware, float, tuple[str, ...]]:
    """(hardware, straggler delay in us, what was applied): predict-scaling's terms for a hardware without a
    fit (analysis/predict_scaling.evidence_terms), the stragglers' delay over this step's compute alone."""
    hw, ratios, terms = evidence_terms(hw, None)
    if ratios is None or topo.world == 1:
        return hw, 0.0, terms
    return hw, max(0.0, _one_rank_step(q, hw) * (expected_max(ratios, topo.world) - 1.0)), terms


def _one_rank_step(q: StepQuestion, hw: Hardware) -> float:
    """The same setup's step on one rank (no communication, no step terms), in us."""
    alone = q.at(algorithm=LIBRARY, terms=None, straggler_us=0.0)
    return predict_step(alone, Topology(1, 1), hw).times.step_us


def _corpus_interval(q: StepQuestion, hw: Hardware,
                     step: StepPrediction) -> tuple[tuple[float, float] | None, str | None, float]:
    """(step interval, "corpus calibration", calibrated step) from the published corpus's calibration of linearity,
    against this step's compute on one rank; (None, None, raw step) without a calibration or where the interval
    reaches 0 (the raw step then stays the estimate)."""
    calibration = load_calibration()
    raw = step.times.step_us
    if calibration is None:
        return None, None, raw
    one = _one_rank_step(q, hw)
    interval = calibration.step_interval_us(one, raw)
    if not interval:
        return None, None, raw
    return interval, CORPUS_PROVENANCE, calibration.step_estimate_us(one, raw) or raw


# ---------------------------------------------------------------- the records


def _header(p: ProxyPrediction, cfg: ProxyConfig, argv: list[str]) -> dict:
    c = p.q.compute
    return {"kind": "predicted", "model": p.q.profile.name, "command": " ".join(argv),
            "compute_split_us": {"forward": c.forward_us, "backward": c.backward_us, "optimizer": c.optimizer_us,
                                 "ddp": c.own_us},
            "config": cfg.header_fields(), "hardware": p.hw.name, "topology": str(p.topo),
            "calls": describe_calls(p.step.plan), "setup": p.q.choice.name, "knobs": dict(p.q.choice.knobs),
            "step_interval_us": list(p.interval) if p.interval else None, "interval_source": p.interval_source,
            "step_terms": p.q.terms.summary() if p.q.terms else None, **_estimate_fields(p)}


def _estimate_fields(p: ProxyPrediction) -> dict:
    return {"estimate": CALIBRATED_ESTIMATE if p.calibrated else RAW_ESTIMATE, "raw_step_us": p.step.times.step_us}


def _step_terms_line(p: ProxyPrediction) -> str:
    return "step terms: " + (p.q.terms.said() if p.q.terms else "none (a fitted file without a step_terms "
                                                                      "block: its figures are measured)")


def _header_lines(p: ProxyPrediction, cfg: ProxyConfig) -> list[str]:
    ranks = f"{p.topo.world} rank{'s' if p.topo.world != 1 else ''}"
    return [f"predicted {p.q.profile.name} on {p.topo} ({ranks}) of {p.hw.name}, setup {p.q.choice.name}: "
            f"{p.step.calls} call(s) per step, allreduce {p.q.algorithm} from the cost model; "
            f"compute {p.q.compute_label}",
            f"one step: the cost model predicts every step alike (--steps {cfg.steps} and --warmup-steps "
            f"{cfg.warmup_steps} do not apply to a prediction)",
            *_interval_lines(p.hw, p.topo, p.q.algorithm, p.interval, p.interval_source),
            *p.terms, _step_terms_line(p)]


def _interval_lines(hw: Hardware, topo: Topology, algorithm: str, interval: tuple[float, float] | None,
                    source: str | None = None) -> list[str]:
    """The header's word on the step's 80% interval: how it is made, or why a fitted file gives none."""
    if source == CORPUS_PROVENANCE:
        return ["step 80% interval: corpus calibration (no fit): split conformal on the linearity errors of the "
                "published corpus (analysis/corpus/, docs/model.md), against this step's compute on one rank"]
    if interval:
        return ["step 80% interval (fit resamples): the communication costed on the fit without each of its points, "
                "spread by that point's error (jackknife+), compute as given (docs/model.md, Uncertainty)"]
    if hw.meta.get("uncertainty") is None:
        return []  # a preset, or a fit from before intervals: nothing to say
    if algorithm == LIBRARY:
        return [f"no step interval: {LIBRARY}'s calls are timed with NCCL's own latency constants, which no fit "
                f"measured (--algorithm ring or hier for one)"]
    if not levels_fitted(hw, topo):
        return [f"no step interval: {topo} crosses a link level the fit of {hw.name} did not measure"]
    return []


def _summary(p: ProxyPrediction, cfg: ProxyConfig, run_id: str) -> ProxyResult:
    """The summary record: one step, so every median is its p90."""
    t = p.times
    return ProxyResult(kind="predicted", model=p.q.profile.name, backend=MODEL, **PREDICTED.fields(), library=p.hw.name,
                       device="-",
                       world_size=p.topo.world, nnodes=p.topo.nodes, batch=p.q.batch, bucket_mb=cfg.bucket_mb,
                       bucketing=cfg.bucketing, buckets=p.step.calls, gradient_bytes=p.q.profile.nbytes,
                       compute=p.q.compute_label, steps=1, warmup_steps=0, compute_us_p50=t.compute_us,
                       compute_us_p90=t.compute_us, comm_us_p50=t.comm_us, comm_us_p90=t.comm_us,
                       exposed_comm_us_p50=t.exposed_comm_us, exposed_comm_us_p90=t.exposed_comm_us,
                       step_us_p50=t.step_us, step_us_p90=t.step_us, other_us_p50=t.other_us,
                       other_us_p90=t.other_us, samples_per_s=t.samples_per_s(p.samples) if t.step_us > 0 else None,
                       run_id=run_id,
                       step_interval_us=list(p.interval) if p.interval else None,
                       interval_source=p.interval_source, setup=p.q.choice.name, knobs=dict(p.q.choice.knobs),
                       calibration_us=p.calibration_us, **_estimate_fields(p))
