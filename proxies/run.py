"""What the `proxy`, `train` and `profiles` commands call beside the ranks' own work:
`--validate`'s comparison, the profile listings and `profiles extract`. Options become a
ProxyConfig and a job plan in commbench/commands/proxy_plan.py; the predicted proxy step (the
cost model, no ranks) is analysis/predict_proxy.py."""
from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from typing import Any

from commbench.proxies import buckets as B
from commbench.proxies.catalog import ModelError
from commbench.proxies.config import ProxyConfig
from commbench.proxies.profile import Profile, ProfileError, load_profile
from commbench.results import ValidateRecord, append_record


class ProxyUsageError(ValueError):
    """Bad input to proxy/train/profiles: one line, exit 2."""


# ---------------------------------------------------------------- --validate


def train_twin(cfg: ProxyConfig) -> ProxyConfig:
    """The training run that checks a proxy: same model, batch, ranks, buckets, backend, steps."""
    base = cfg.json_path[:-6] if cfg.json_path.endswith(".jsonl") else cfg.json_path
    return replace(cfg, json_path=f"{base}.train.jsonl", compute="measured", tflops=None, compute_block=None)


def summary_of(path: str) -> dict[str, Any] | None:
    from commbench.results import read_records

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
             f"({profile.nbytes / 2**20:.1f} MiB), {compute_words(profile)}",
             f"# input {'x'.join(map(str, profile.input_shape))} per sample ({profile.sample_unit}), "
             f"default batch {profile.default_batch}",
             _units_summary(profile),
             *(f"# {key}: {value}" for key, value in profile.source.items()),
             f"# {'tensor':48s} {'shape':>20s} {'dtype':>9s} {'ready at':>9s}"]
    for i, t in enumerate(profile.tensors):
        share = profile.ready_share(i)
        lines.append(f"  {t.name:48s} {'x'.join(map(str, t.shape)):>20s} {t.dtype:>9s} {100 * share:>8.1f}%")
    return "\n".join(lines)


def compute_words(profile: Profile) -> str:
    """A profile's compute per sample as a line says it: its FLOPs, or a traced profile's time on its device."""
    traced = profile.traced
    if traced is not None:
        return (f"{traced.forward_us / 1e3:.4g} ms forward and {traced.backward_us / 1e3:.4g} ms backward per sample "
                f"as traced on {traced.device} (batch {traced.batch}; no FLOPs)")
    return (f"{profile.forward_flops / 1e9:.3f} GFLOP forward and {profile.backward_flops / 1e9:.3f} GFLOP "
            f"backward per sample")


def _units_summary(profile: Profile) -> str:
    if not profile.units:
        why = "a trace gives none" if profile.traced else "a schema 1 file; `commbench profiles extract` adds them"
        return f"# sharding units: none in this profile ({why})"
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
