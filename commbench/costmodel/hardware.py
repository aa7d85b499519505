"""A machine as the cost model sees it: a Hardware (two link levels, reduce bandwidth, per-call overhead,
device figures), read from a hardware file (`commbench fit` writes one) or a preset in commbench/presets/,
every field validated (HardwareError: one line naming the file).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from commbench.costmodel.compute import ComputeBlock, ComputeError, compute_from_dict
from commbench.files import MAX_FIGURE, NotJson, UnreadableFile, json_kind, parse_json, read_small
from commbench.step_terms import StepTerms, StepTermsError, device_class, step_terms_from_dict
from commbench.step_terms import defaults as step_term_defaults
from commbench.topology import INTRA, Link, Topology

PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "presets")  # commbench/presets


class HardwareError(ValueError):
    """A hardware description that is missing a field or has an impossible value."""


@dataclass(frozen=True)
class Hardware:
    name: str
    ranks_per_node: int  # the node size a command takes when not told one; the cost model reads the Topology's
    intra: Link  # commbench.topology.Link: the one type of a level's figures
    inter: Link
    reduce_gbps: float | None = None  # a += b bandwidth of the device; None: folded into bw (fits do this)
    per_call_overhead_us: float = 0.0
    device_tflops: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # description, sources, fit quality
    device_memory_gb: float | None = None  # one GPU's memory, GB (1e9 bytes) as its vendor states it
    step_terms: StepTerms | None = None  # the file's own; None: its device class's defaults (terms_of)
    compute: ComputeBlock | None = None  # operators' times on one device (costmodel/compute.py); None: none

    def level(self, topo: Topology, src: int, dst: int) -> Link:
        return self.intra if topo.link(src, dst) == INTRA else self.inter

    def doubts(self) -> list[str]:
        """Why this file's predictions are not to be trusted, a line each, as its fit wrote it: fit
        --accept-poor-fit's meta.poor_fit, fit's meta.fitted_under_load; empty when neither."""
        out = []
        if self.meta.get("poor_fit"):
            out.append(f"POOR FIT: {self.name} ({self.meta['poor_fit']}): its predictions do not describe the sweep "
                       "it came from")
        if self.meta.get("fitted_under_load"):
            out.append(f"{self.name} was fitted from runs under load ({self.meta['fitted_under_load']}): its "
                       "figures hold that load")
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["levels"] = {"intra": out.pop("intra"), "inter": out.pop("inter")}
        out["compute"] = None if self.compute is None else self.compute.to_dict()
        if out["compute"] is None:
            del out["compute"]
        return {"schema": 1, **out}

    def save(self, path: str) -> None:
        """Write the hardware file (ValueError, before anything is written, for a figure JSON cannot hold)."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


# any other top-level field (description, sources) goes to meta
HARDWARE_FIELDS = ("schema", "name", "ranks_per_node", "levels", "reduce_gbps", "per_call_overhead_us",
                   "device_tflops", "meta", "device_memory_gb", "step_terms", "compute")


def terms_of(hw: Hardware) -> StepTerms:
    """`hw`'s step terms: the file's own, else its device class's defaults (a fit on CPU ranks says cpu in
    meta.measured_on; a preset or a file that says nothing is a GPU's)."""
    return hw.step_terms or step_term_defaults(device_class(hw.meta))


def hardware_from_dict(data: Any, origin: str = "hardware file") -> Hardware:
    """Validate and build. Every number must be a finite JSON number of the right sign (a count a
    whole number), every object an object; each problem is one HardwareError, 'ORIGIN: what is wrong'."""
    try:
        return _hardware(data, origin)
    except HardwareError as exc:
        raise HardwareError(f"{origin}: {exc}") from None


def _hardware(data: Any, origin: str) -> Hardware:
    data = _object(data, "a hardware file")
    if data.get("schema", 1) != 1:
        raise HardwareError(f"schema {data['schema']!r}: this commbench reads hardware files of schema 1")
    levels = _object(_required(data, "levels", ""), "levels")
    intra, inter = (_link(_object(_required(levels, key, "levels."), f"levels.{key}"), f"levels.{key}")
                    for key in ("intra", "inter"))
    tflops = _object(data.get("device_tflops") or {}, "device_tflops")
    name = data.get("name", origin)
    if not isinstance(name, str):
        raise HardwareError(f"name must be a string, not {json_kind(name)}")
    meta = {k: v for k, v in data.items() if k not in HARDWARE_FIELDS}
    meta.update(_object(data.get("meta") or {}, "meta"))
    try:
        terms = None if data.get("step_terms") is None else step_terms_from_dict(data["step_terms"], device_class(meta))
    except StepTermsError as exc:
        raise HardwareError(str(exc)) from None
    try:
        compute = None if data.get("compute") is None else compute_from_dict(data["compute"])
    except ComputeError as exc:
        raise HardwareError(str(exc)) from None
    return Hardware(name, int(_number(data, "ranks_per_node", "", whole=True, at_least=1)), intra, inter,
                    _number(data, "reduce_gbps", "", positive=True, optional=True),
                    _number(data, "per_call_overhead_us", "", optional=True) or 0.0,
                    {key: _number(tflops, key, "device_tflops.", positive=True, optional=True) for key in tflops}, meta,
                    _number(data, "device_memory_gb", "", positive=True, optional=True), terms, compute)


def _link(data: dict[str, Any], where: str) -> Link:
    name = data.get("name", where)
    if not isinstance(name, str):
        raise HardwareError(f"{where}.name must be a string, not {json_kind(name)}")
    prefix = where + "."
    links = _number(data, "links_per_node", prefix, whole=True, at_least=1, optional=True)
    cache_bytes = _number(data, "cache_bytes", prefix, whole=True, at_least=1, optional=True)
    cache_bw = _number(data, "cache_bw_gbps", prefix, positive=True, optional=True)
    if (cache_bytes is None) != (cache_bw is None):
        raise HardwareError(f"{where}: cache_bytes and cache_bw_gbps go together")
    return Link(name, _number(data, "bw_gbps", prefix, positive=True), _number(data, "latency_us", prefix),
                None if links is None else int(links), None if cache_bytes is None else int(cache_bytes), cache_bw)


def _required(data: dict[str, Any], key: str, prefix: str) -> Any:
    if key not in data:
        raise HardwareError(f"missing field '{prefix}{key}'")
    return data[key]


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise HardwareError(f"{where} must be a JSON object, not {json_kind(value)}")
    return value


def _number(data: dict[str, Any], key: str, prefix: str, *, positive: bool = False, whole: bool = False,
            at_least: float = 0.0, optional: bool = False) -> float | None:
    """data[key] as a finite number >= at_least (> 0 if positive; integral if whole); None if optional and
    absent or null."""
    value = data.get(key) if optional else _required(data, key, prefix)
    if value is None and optional:
        return None
    name = prefix + key
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HardwareError(f"{name} must be a number, not {json_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise HardwareError(f"{name} must be a finite number, not {value}")
    if whole and value != int(value):
        raise HardwareError(f"{name} must be a whole number, not {value!r}")
    if value < at_least or positive and not value > 0:
        bound = "positive" if positive else f"at least {at_least:g}" if at_least else "non-negative"
        raise HardwareError(f"{name} must be {bound}, not {value!r}")
    if value > MAX_FIGURE:  # 1e308 us of latency would print 300-digit times and overflow to inf%
        shown = f"{value:.3g}" if isinstance(value, float) else f"{str(value)[:12]}... ({len(str(value))} digits)"
        raise HardwareError(f"{name} must be at most {MAX_FIGURE:g}, not {shown}")
    return float(value) if not whole else value


def presets() -> list[str]:
    if not os.path.isdir(PRESET_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(PRESET_DIR) if f.endswith(".json"))


MAX_HARDWARE_BYTES = 1 << 20  # a fitted hardware file is a few KiB


def load_hardware(spec: str) -> Hardware:
    """A hardware JSON file (from `commbench fit`) or the name of a preset, validated (hardware_from_dict):
    every problem, an unreadable or binary file too, is one HardwareError naming the file."""
    path = spec if os.path.exists(spec) else os.path.join(PRESET_DIR, f"{spec}.json")
    if not os.path.exists(path):
        raise HardwareError(f"no hardware file or preset {spec!r}; presets: {', '.join(presets()) or 'none'}")
    try:
        data = parse_json(read_small(path, MAX_HARDWARE_BYTES, "a hardware file"))
    except NotJson as exc:
        raise HardwareError(f"{path}: {exc}: not a hardware file (expected JSON from commbench fit)") from None
    except UnreadableFile as exc:
        raise HardwareError(str(exc)) from exc
    except OSError as exc:
        raise HardwareError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return hardware_from_dict(data, origin=path)

