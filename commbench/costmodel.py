"""The analytic cost model: alpha-beta(-gamma) per link level, summed over a Schedule's rounds.

A transfer crosses one level of the topology (`intra` inside a node, `inter`
between nodes) and costs that level's latency plus its bytes over the level's
bandwidth; a reducing transfer adds bytes / reduce bandwidth. Transfers of a
round run at once but share what they run over:

- inside a node, a rank's sends share its outgoing link and its receives share
  its incoming link (NVLink / shared-memory port of one rank);
- between nodes, the transfers leaving (entering) a node share its
  `links_per_node` NICs (None: one NIC per rank, no sharing across ranks), and
  one transfer gets at most one NIC's bandwidth.

A round lasts as long as its busiest resource: latency + bytes / bandwidth, plus
the reduction time of the rank that reduces most in that round. A collective
lasts the sum of its rounds plus the hardware's per-call overhead. Library
backends (gloo, NCCL) are modelled by the algorithm they run (the table's
`library` entries: ring, chain). `algorithm_us` costs a table entry by its closed
form (`Phases`, the same rounds compressed) where it has one, else its schedule.

Units are in the names: bytes, microseconds (`_us`), GB/s = 1e9 bytes/s (`_gbps`),
so bytes / (gbps * 1e3) is microseconds.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from commbench import algorithms
from commbench.files import MAX_FIGURE, NotJson, UnreadableFile, json_kind, parse_json, read_small
from commbench.schedule import Phases, Schedule, Transfer
from commbench.step_terms import StepTerms, StepTermsError, device_class, step_terms_from_dict
from commbench.step_terms import defaults as step_term_defaults
from commbench.topology import INTRA, Link, Topology

PRESET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets")


class HardwareError(ValueError):
    """A hardware description that is missing a field or has an impossible value."""


@dataclass(frozen=True)
class Hardware:
    name: str
    ranks_per_node: int
    intra: Link  # commbench.topology.Link: the one type of a level's figures
    inter: Link
    reduce_gbps: float | None = None  # a += b bandwidth of the device; None: folded into bw (fits do this)
    per_call_overhead_us: float = 0.0
    device_tflops: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # description, sources, fit quality
    device_memory_gb: float | None = None  # one GPU's memory, GB (1e9 bytes) as its vendor states it
    step_terms: StepTerms | None = None  # the file's own; None: its device class's defaults (terms_of)

    def level(self, topo: Topology, src: int, dst: int) -> Link:
        return self.intra if topo.link(src, dst) == INTRA else self.inter

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["levels"] = {"intra": out.pop("intra"), "inter": out.pop("inter")}
        return {"schema": 1, **out}

    def save(self, path: str) -> None:
        """Write the hardware file (ValueError, before anything is written, for a figure JSON cannot hold)."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)


# any other top-level field (description, sources) goes to meta
HARDWARE_FIELDS = ("schema", "name", "ranks_per_node", "levels", "reduce_gbps", "per_call_overhead_us",
                   "device_tflops", "meta", "device_memory_gb", "step_terms")


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
    return Hardware(name, int(_number(data, "ranks_per_node", "", whole=True, at_least=1)), intra, inter,
                    _number(data, "reduce_gbps", "", positive=True, optional=True),
                    _number(data, "per_call_overhead_us", "", optional=True) or 0.0,
                    {key: _number(tflops, key, "device_tflops.", positive=True, optional=True) for key in tflops}, meta,
                    _number(data, "device_memory_gb", "", positive=True, optional=True), terms)


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
        raise HardwareError(f"{name} must be at most {MAX_FIGURE:g}, not {value:.3g}")
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


def with_topology(hw: Hardware, topo: Topology) -> Hardware:
    return hw if hw.ranks_per_node == topo.ranks_per_node else replace(hw, ranks_per_node=topo.ranks_per_node)


# ---------------------------------------------------------------- the cost of a schedule


def link_loads(rnd: tuple[Transfer, ...], topo: Topology, itemsize: int,
               shared_nics: bool = False) -> dict[tuple, list]:
    """What each resource carries in a round: key -> [crosses nodes, total bytes, largest transfer].
    Resources: a rank's outgoing and incoming link per level, or, with `shared_nics`, a node's
    NICs for the transfers between nodes."""
    loads: dict[tuple, list] = {}
    for t in rnd:
        nbytes = t.count * itemsize
        inter = topo.node_of(t.src) != topo.node_of(t.dst)
        by_node = inter and shared_nics
        out_key = ("nic-out", topo.node_of(t.src)) if by_node else ("out", t.src, inter)
        in_key = ("nic-in", topo.node_of(t.dst)) if by_node else ("in", t.dst, inter)
        for key in (out_key, in_key):
            entry = loads.setdefault(key, [inter, 0.0, 0.0])
            entry[1] += nbytes
            entry[2] = max(entry[2], nbytes)
    return loads


def round_us(rnd: tuple[Transfer, ...], topo: Topology, hw: Hardware, itemsize: int) -> float:
    """A round lasts as long as its busiest resource, plus its busiest rank's reduction."""
    loads = link_loads(rnd, topo, itemsize, shared_nics=hw.inter.links_per_node is not None)
    if not loads:
        return 0.0
    reduced: dict[int, float] = {}
    for t in rnd:
        if t.reduce:
            reduced[t.dst] = reduced.get(t.dst, 0.0) + t.count * itemsize
    busiest = max(_resource_us(key, hw.inter if inter else hw.intra, total, largest)
                  for key, (inter, total, largest) in loads.items())
    reduce_us = max(reduced.values()) / (hw.reduce_gbps * 1e3) if reduced and hw.reduce_gbps else 0.0
    return busiest + reduce_us


def _resource_us(key: tuple, level: Link, total: float, largest: float) -> float:
    """A node's NICs carry its transfers together, but one transfer uses one NIC."""
    if key[0].startswith("nic"):
        return level.latency_us + max(total / level.links_per_node, largest) / (level.bw_gbps * 1e3)
    return level.latency_us + total / (level.bw_gbps * 1e3)


def working_set_bytes(count: int, itemsize: int, topo: Topology) -> int:
    """What a call keeps in a node's caches: every local rank's working buffer."""
    return count * itemsize * topo.ranks_per_node


def in_cache(hw: Hardware, working_set: int) -> Hardware:
    """The hardware as a call with this working set sees it: cache bandwidth where it fits."""
    def pick(level: Link) -> Link:
        fits = level.cache_bytes is not None and working_set <= level.cache_bytes
        return replace(level, bw_gbps=level.cache_bw_gbps) if fits else level
    intra, inter = pick(hw.intra), pick(hw.inter)
    return hw if intra is hw.intra and inter is hw.inter else replace(hw, intra=intra, inter=inter)


def schedule_us(schedule: Schedule, topo: Topology, hw: Hardware, itemsize: int) -> float:
    """Predicted time of one call: per-call overhead plus the sum of the rounds."""
    hw = in_cache(hw, working_set_bytes(schedule.count, itemsize, topo))
    return hw.per_call_overhead_us + sum(round_us(rnd, topo, hw, itemsize) for rnd in schedule.rounds)


def phases_us(phases: Phases, hw: Hardware, itemsize: int) -> float:
    """The same for a schedule in closed form: each distinct round costed once, times its repeats."""
    hw = in_cache(hw, working_set_bytes(phases.count, itemsize, phases.topology))
    return hw.per_call_overhead_us + sum(repeats * round_us(rnd, phases.topology, hw, itemsize)
                                         for rnd, repeats in phases.rounds)


def variants_us(form: Phases | Schedule, topo: Topology, hws: list[Hardware], itemsize: int) -> list[float]:
    """phases_us (a Phases) or schedule_us (a Schedule on `topo`) of one call on each of `hws`, hardware
    that differs only in its figures (latency, bandwidth, cache bandwidth, overhead: a fit's resampled
    variants), the same numbers at a fraction of the cost: what the rounds load is found once, not per
    hardware. A round's busiest resource on a level is the one with the most bytes (a level's resources
    share its latency and bandwidth), so each round costs max over its levels of latency + bytes / bw."""
    import numpy as np

    first = hws[0]
    if any(h.inter.links_per_node != first.inter.links_per_node or h.reduce_gbps != first.reduce_gbps
           or h.intra.cache_bytes != first.intra.cache_bytes or h.inter.cache_bytes != first.inter.cache_bytes
           for h in hws):
        raise ValueError("variants_us: hardware that differs in more than its figures")
    if isinstance(form, Phases):
        topo, rounds = form.topology, form.rounds
    else:
        rounds = tuple((rnd, 1) for rnd in form.rounds)
    seen = [in_cache(h, working_set_bytes(form.count, itemsize, topo)) for h in hws]
    figures = {inter: (np.array([(h.inter if inter else h.intra).latency_us for h in seen]),
                       np.array([(h.inter if inter else h.intra).bw_gbps for h in seen])) for inter in (False, True)}
    total = np.zeros(len(hws))
    for rnd, repeats in rounds:
        loads = link_loads(rnd, topo, itemsize, shared_nics=first.inter.links_per_node is not None)
        if not loads:
            continue
        busiest: dict[bool, float] = {}
        for key, (inter, load, largest) in loads.items():
            nbytes = max(load / first.inter.links_per_node, largest) if key[0].startswith("nic") else load
            busiest[inter] = max(busiest.get(inter, 0.0), nbytes)
        rnd_us = np.max([figures[inter][0] + nbytes / (figures[inter][1] * 1e3) for inter, nbytes in busiest.items()],
                        axis=0)
        reduced: dict[int, float] = {}
        for t in rnd:
            if t.reduce:
                reduced[t.dst] = reduced.get(t.dst, 0.0) + t.count * itemsize
        if reduced and first.reduce_gbps:
            rnd_us = rnd_us + max(reduced.values()) / (first.reduce_gbps * 1e3)
        total = total + repeats * rnd_us
    return [float(v) for v in np.array([h.per_call_overhead_us for h in seen]) + total]


def algorithm_us(hw: Hardware, topo: Topology, collective: str, algorithm: str, count: int, itemsize: int,
                 root: int = 0) -> float:
    """One call of a table algorithm: by the entry's closed form where it has one (O(ranks per
    node) work at any world size), else by its full schedule."""
    entry = algorithms.entry(collective, algorithm)
    if entry.phases is not None:
        return phases_us(entry.phases(topo, count), hw, itemsize)
    return schedule_us(entry.schedule(topo, count, root), topo, hw, itemsize)
