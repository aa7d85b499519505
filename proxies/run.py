"""What the `proxy`, `train` and `profiles` commands call beside the ranks' own work: the
predicted proxy step (the cost model, no ranks), `--validate`'s comparison, the profile
listings and `profiles extract`. Options become a ProxyConfig and a job plan in
commbench/commands/proxy_plan.py."""
from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from typing import Any

from commbench.algorithms import LIBRARY
from commbench.proxies import buckets as B
from commbench.proxies.catalog import ModelError
from commbench.proxies.config import ProxyConfig
from commbench.proxies.profile import Profile, ProfileError, load_profile
from commbench.result_sink import append_record
from commbench.results import CORPUS_PROVENANCE, FIT_PROVENANCE, ValidateRecord


class ProxyUsageError(ValueError):
    """Bad input to proxy/train/profiles: one line, exit 2."""


# ---------------------------------------------------------------- sim


def predict_proxy(cfg: ProxyConfig, plan: Any, argv: list[str]) -> int:
    """A proxy step predicted by the cost model (no ranks) on `plan.nodes` x `plan.ranks_per_node`
    (a job.Plan): the table and a kind=predicted record. Under a launcher only rank 0 predicts."""
    if not plan.lead:
        return 0
    from commbench.analysis.scaling import predict_step, step_interval_us
    from commbench.costmodel import load_hardware, with_topology
    from commbench.proxies.steps import ProxyResult, StepLog
    from commbench.proxies.timeline import flops_times_us
    from commbench.topology import Topology

    profile = load_profile(cfg.model)
    batch = cfg.batch or profile.default_batch
    topo = Topology(plan.nodes, plan.ranks_per_node)
    hw = with_topology(load_hardware(cfg.hw), topo)
    ddp = 0.0
    if cfg.compute == "flops":
        forward, backward, update, label = (*flops_times_us(profile, batch, cfg.tflops), 0.0,
                                            f"flops at {cfg.tflops:g} TFLOP/s")
    elif cfg.compute == "measured":
        forward, backward, update, ddp = _measure_here(profile, batch, cfg)
        label = f"measured on this host (DDP's own work {ddp / 1e3:.2f} ms, measured at 1 rank)"
    else:
        forward = backward = update = 0.0
        label = "none"
    algorithm = LIBRARY if cfg.algorithm == "auto" else cfg.algorithm  # the library's ring unless told
    choice = cfg.choice(topo.nodes, topo.ranks_per_node)
    hw, late, terms = _evidence_terms(hw, profile, batch, topo, (forward, backward, update, ddp), cfg, choice)
    pred = predict_step(profile, batch, topo, hw, forward, backward, update, cfg.bucket_mb, cfg.bucketing, algorithm,
                        ddp, late, choice=choice)
    interval = step_interval_us(profile, batch, topo, hw, forward, backward, update, cfg.bucket_mb, cfg.bucketing,
                                algorithm, ddp, late, choice=choice)
    source = FIT_PROVENANCE if interval else None
    if interval is None and topo.world > 1:
        interval, source = _corpus_interval(profile, batch, hw, (forward, backward, update, ddp), cfg, pred, choice)
    samples = batch * choice.get("accumulate") * topo.world
    log = StepLog(cfg.json_path, True, samples)
    ranks = f"{topo.world} rank{'s' if topo.world != 1 else ''}"
    log.header({"kind": "predicted", "model": profile.name, "command": " ".join(argv),
                "compute_split_us": {"forward": forward, "backward": backward, "optimizer": update, "ddp": ddp},
                "config": json.loads(cfg.to_json()), "hardware": hw.name, "topology": str(topo),
                "calls": describe_calls(pred.plan), "setup": choice.name, "knobs": dict(choice.knobs),
                "step_interval_us": list(interval) if interval else None, "interval_source": source},
               [f"predicted {profile.name} on {topo} ({ranks}) of {hw.name}, setup {choice.name}: {pred.calls} call(s) "
                f"per step, allreduce {algorithm} from the cost model; compute {label}",
                f"one step: the cost model predicts every step alike (--steps {cfg.steps} and --warmup-steps "
                f"{cfg.warmup_steps} do not apply to a prediction)",
                *_interval_lines(hw, topo, algorithm, interval, source), *(f"without a fit: {t}" for t in terms)])
    t = pred.times
    log.step(1, False, {"compute_us": t.compute_us, "comm_us": t.comm_us, "exposed_comm_us": t.exposed_comm_us,
                        "step_us": t.step_us, "other_us": t.other_us,
                        "calls_us": [list(i) for i in t.comm_intervals]})
    log.summary(ProxyResult(kind="predicted", model=profile.name, backend="model", library=hw.name, device="-",
                            world_size=topo.world, nnodes=topo.nodes, batch=batch, bucket_mb=cfg.bucket_mb,
                            bucketing=cfg.bucketing, buckets=pred.calls, gradient_bytes=profile.nbytes,
                            compute=label, steps=1, warmup_steps=0, compute_us_p50=t.compute_us,
                            compute_us_p90=t.compute_us, comm_us_p50=t.comm_us, comm_us_p90=t.comm_us,
                            exposed_comm_us_p50=t.exposed_comm_us, exposed_comm_us_p90=t.exposed_comm_us,
                            step_us_p50=t.step_us, step_us_p90=t.step_us, other_us_p50=t.other_us,
                            other_us_p90=t.other_us,
                            samples_per_s=t.samples_per_s(samples), run_id=log.run_id,
                            step_interval_us=list(interval) if interval else None, interval_source=source,
                            setup=choice.name, knobs=dict(choice.knobs)))
    if interval:
        print(f"# step 80% interval ({source}): {interval[0] / 1e3:.2f}-{interval[1] / 1e3:.2f} ms (predicted "
              f"{t.step_us / 1e3:.2f} ms)", flush=True)
    return 0


def describe_calls(plan) -> dict:
    """A step's calls as the header keeps them: per (collective, group), calls and bytes, and each call's size."""
    return {"by_collective": [{"collective": c, "group": g, "calls": n, "nbytes": b}
                              for (c, g), (n, b) in plan.bytes_by().items()],
            "calls": [{"collective": c.collective, "group": c.group, "nbytes": c.nbytes, "dtype": c.dtype,
                       "label": c.label} for c in plan.comms]}


def _evidence_terms(hw: Any, profile: Profile, batch: int, topo: Any, compute: tuple, cfg: ProxyConfig, choice):
    """(hardware, straggler delay in us, what was applied): predict-scaling's terms for a hardware without a
    fit (analysis/predict_scaling.evidence_terms), the stragglers' delay over this step's compute alone."""
    from commbench.analysis.predict_scaling import evidence_terms
    from commbench.analysis.stragglers import expected_max

    hw, ratios, terms = evidence_terms(hw, None)
    if ratios is None or topo.world == 1:
        return hw, 0.0, terms
    one = _one_rank_step(profile, batch, hw, compute, cfg, choice)
    return hw, max(0.0, one * (expected_max(ratios, topo.world) - 1.0)), terms


def _one_rank_step(profile: Profile, batch: int, hw: Any, compute: tuple, cfg: ProxyConfig, choice) -> float:
    """The same setup's step on one rank (no communication), in us."""
    from commbench.analysis.scaling import predict_step
    from commbench.topology import Topology

    return predict_step(profile, batch, Topology(1, 1), replace(hw, ranks_per_node=1), *compute[:3], cfg.bucket_mb,
                        cfg.bucketing, LIBRARY, compute[3], choice=choice).times.step_us


def _corpus_interval(profile: Profile, batch: int, hw: Any, compute: tuple, cfg: ProxyConfig, pred: Any, choice):
    """(step interval, "corpus calibration") from the published corpus's calibration of linearity, against this
    step's compute on one rank; (None, None) without a calibration or where the interval reaches 0."""
    from commbench.analysis.calibration import load_calibration

    calibration = load_calibration()
    if calibration is None:
        return None, None
    interval = calibration.step_interval_us(_one_rank_step(profile, batch, hw, compute, cfg, choice),
                                            pred.times.step_us)
    return (interval, CORPUS_PROVENANCE) if interval else (None, None)


def _interval_lines(hw: Any, topo: Any, algorithm: str, interval: tuple[float, float] | None,
                    source: str | None = None) -> list[str]:
    """The header's word on the step's 80% interval: how it is made, or why a fitted file gives none."""
    from commbench.analysis.intervals import levels_fitted

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


def _measure_here(profile: Profile, batch: int, cfg: ProxyConfig) -> tuple[float, float, float, float]:
    import torch

    from commbench.proxies.train import measure_compute

    try:
        return measure_compute(profile, batch, torch.device("cuda" if cfg.device == "cuda" else "cpu"), cfg.amp,
                               trust_code=cfg.trust_profile_code, bucket_mb=cfg.bucket_mb, choice=cfg.choice(),
                               show_progress=True)[0]
    except (MemoryError, ModelError) as exc:
        raise ProxyUsageError(str(exc).splitlines()[0]) from exc


# ---------------------------------------------------------------- --validate


def train_twin(cfg: ProxyConfig) -> ProxyConfig:
    """The training run that checks a proxy: same model, batch, ranks, buckets, backend, steps."""
    base = cfg.json_path[:-6] if cfg.json_path.endswith(".jsonl") else cfg.json_path
    return replace(cfg, json_path=f"{base}.train.jsonl", compute="measured", tflops=None)


def summary_of(path: str) -> dict[str, Any] | None:
    from commbench.result_reader import read_records

    if not os.path.exists(path):
        return None
    records = [r for r in read_records(path) if r.get("record") == "proxy"]
    return records[-1] if records else None


def report_validation(cfg: ProxyConfig, train_cfg: ProxyConfig, show_paths: bool = True) -> None:
    """Print the proxy's error against real training, append a validate record; name the two
    record files only when they are kept (`show_paths`: --json was given)."""
    proxy, real = summary_of(cfg.json_path), summary_of(train_cfg.json_path)
    if not proxy or not real or not real["step_us_p50"]:
        print("# validate: a run wrote no summary; nothing to compare")
        return
    error = (proxy["step_us_p50"] - real["step_us_p50"]) / real["step_us_p50"]
    print(f"# validate: proxy step {proxy['step_us_p50'] / 1e3:.2f} ms vs real training "
          f"{real['step_us_p50'] / 1e3:.2f} ms (medians): proxy error {100 * error:+.1f}%")
    if show_paths:
        print(f"#           records: {cfg.json_path} (proxy), {train_cfg.json_path} (training)")
    append_record(cfg.json_path, ValidateRecord(
        model=proxy["model"], world_size=proxy["world_size"], batch=proxy["batch"],
        proxy_step_us=proxy["step_us_p50"], train_step_us=real["step_us_p50"], error=error,
        train_json=train_cfg.json_path, run_id=proxy.get("run_id", "")))


# ---------------------------------------------------------------- profiles


def show_profile(model: str, show_buckets: bool, bucket_mb: float | None, mode: str, as_json: bool,
                 show_units: bool = False) -> str:
    try:
        profile = load_profile(model)
        layout = B.assign(profile, bucket_mb, mode)
    except (ProfileError, ValueError) as exc:
        raise ProxyUsageError(str(exc)) from exc
    if show_buckets:
        described = {"model": profile.name, "bucket_mb": bucket_mb, "bucketing": mode, **B.describe(layout)}
        if as_json:
            return json.dumps(described)
        lines = [f"# {profile.name}: {len(layout)} bucket(s), {profile.nbytes:,d} bytes, launch order "
                 f"({'DDP default: 25 MiB, first bucket 1 MiB' if bucket_mb is None else f'cap {bucket_mb:g} MiB'})",
                 f"# {'bucket':>6} {'bytes':>14} {'MiB':>9} {'tensors':>8}  first .. last gradient"]
        for b in layout:
            first, last = profile.tensors[b.tensors[0]].name, profile.tensors[b.tensors[-1]].name
            lines.append(f"  {b.index:>6} {b.nbytes:>14,d} {b.nbytes / 2**20:>9.3f} {len(b.tensors):>8}  "
                         f"{first} .. {last}")
        return "\n".join(lines)
    if show_units:
        return _units_table(profile, as_json)
    if as_json:
        return json.dumps(profile.to_dict())
    lines = [f"# {profile.name}: {profile.parameters:,d} parameters in {len(profile.tensors)} tensors "
             f"({profile.nbytes / 2**20:.1f} MiB), {profile.forward_flops / 1e9:.3f} GFLOP forward and "
             f"{profile.backward_flops / 1e9:.3f} GFLOP backward per sample",
             f"# input {'x'.join(map(str, profile.input_shape))} per sample ({profile.sample_unit}), "
             f"default batch {profile.default_batch}",
             _units_summary(profile),
             *(f"# {key}: {value}" for key, value in profile.source.items()),
             f"# {'tensor':48s} {'shape':>20s} {'dtype':>9s} {'ready at':>9s}"]
    for t in profile.tensors:
        share = t.ready_flops / profile.backward_flops if profile.backward_flops else 1.0
        lines.append(f"  {t.name:48s} {'x'.join(map(str, t.shape)):>20s} {t.dtype:>9s} {100 * share:>8.1f}%")
    return "\n".join(lines)


def _units_summary(profile: Profile) -> str:
    if not profile.units:
        return "# sharding units: none in this profile (a schema 1 file; `commbench profiles extract` adds them)"
    largest = max(profile.units, key=profile.unit_nbytes)
    return (f"# sharding units: {len(profile.units)}, the largest {largest.name or '(root)'} with "
            f"{profile.unit_nbytes(largest) / 2**20:.1f} MiB (profiles show --units lists them)")


def _units_table(profile: Profile, as_json: bool) -> str:
    """The sharding units in forward order: tensors, bytes and FLOPs per sample (`profiles show --units`)."""
    rows = [{"unit": u.name, "tensors": len(u.tensors), "nbytes": profile.unit_nbytes(u),
             "forward_flops": u.forward_flops, "backward_flops": u.backward_flops} for u in profile.units]
    if as_json:
        return json.dumps({"model": profile.name, "wrapping": profile.source.get("units"), "units": rows})
    lines = [_units_summary(profile), f"# wrapping: {profile.source.get('units', 'not recorded')}",
             f"# {'unit':40s} {'tensors':>8s} {'MiB':>10s} {'GFLOP fwd':>11s} {'GFLOP bwd':>11s}"]
    for row in rows:
        lines.append(f"  {row['unit'] or '(root)':40s} {row['tensors']:>8d} {row['nbytes'] / 2**20:>10.3f} "
                     f"{row['forward_flops'] / 1e9:>11.4f} {row['backward_flops'] / 1e9:>11.4f}")
    return "\n".join(lines)


MAX_SAMPLE_ELEMENTS = 1 << 26  # one sample's input (64 Mi values: a 3x4096x4096 image is 50 Mi)


def extract_profile(spec: str, input_shape: str | None, name: str | None, batch: int | None,
                    unit: str | None, wrap: str | None = None) -> Profile:
    from commbench.proxies.extract import extract

    try:
        shape = tuple(int(d) for d in input_shape.replace("x", ",").split(",")) if input_shape else ()
    except ValueError as exc:
        raise ProxyUsageError(f"--input-shape {input_shape!r}: expected integers like 3,224,224") from exc
    if input_shape is not None and (not shape or min(shape) < 1 or math.prod(shape) > MAX_SAMPLE_ELEMENTS):
        raise ProxyUsageError(f"--input-shape {input_shape!r}: each dimension at least 1, at most "
                              f"{MAX_SAMPLE_ELEMENTS:,d} elements a sample")
    if batch is not None and batch < 1:
        raise ProxyUsageError(f"--batch {batch}: must be at least 1")
    try:
        return extract(spec, shape, name, batch, unit, tuple(filter(None, (wrap or "").split(","))))
    except ModelError as exc:
        raise ProxyUsageError(str(exc)) from exc
    except (RuntimeError, TypeError, ValueError) as exc:  # the model rejected the inputs (a bad --input-shape)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProxyUsageError(f"{spec}: one forward and backward failed: {first}") from exc
