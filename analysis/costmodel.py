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
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from commbench import algorithms
from commbench.schedule import Phases, Schedule, Transfer
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

    def level(self, topo: Topology, src: int, dst: int) -> Link:
        return self.intra if topo.link(src, dst) == INTRA else self.inter

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["levels"] = {"intra": out.pop("intra"), "inter": out.pop("inter")}
        return {"schema": 1, **out}

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.to_dict(), handle, indent=1)
            handle.write("\n")


def hardware_from_dict(data: dict[str, Any], origin: str = "hardware file") -> Hardware:
    """Validate and build; every problem is one HardwareError naming the field."""
    try:
        levels = data["levels"]
        intra, inter = (_link(levels[key], f"levels.{key}") for key in ("intra", "inter"))
        ranks = int(data["ranks_per_node"])
    except KeyError as exc:
        raise HardwareError(f"{origin}: missing field {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise HardwareError(f"{origin}: {exc}") from exc
    if ranks < 1:
        raise HardwareError(f"{origin}: ranks_per_node must be at least 1")
    reduce_gbps = data.get("reduce_gbps")
    if reduce_gbps is not None and not reduce_gbps > 0:
        raise HardwareError(f"{origin}: reduce_gbps must be positive or null")
    overhead = float(data.get("per_call_overhead_us") or 0.0)
    if overhead < 0:
        raise HardwareError(f"{origin}: per_call_overhead_us cannot be negative")
    meta = {k: v for k, v in data.items() if k not in ("schema", "levels", "ranks_per_node", "reduce_gbps",
                                                       "per_call_overhead_us", "device_tflops", "name", "meta")}
    meta.update(data.get("meta") or {})
    return Hardware(str(data.get("name", origin)), ranks, intra, inter, reduce_gbps, overhead,
                    dict(data.get("device_tflops") or {}), meta)


def _link(data: dict[str, Any], where: str) -> Link:
    for key in ("bw_gbps", "latency_us"):
        if key not in data:
            raise HardwareError(f"missing field '{where}.{key}'")
    bw, latency = float(data["bw_gbps"]), float(data["latency_us"])
    if not bw > 0 or latency < 0:
        raise HardwareError(f"{where}: bw_gbps must be positive and latency_us non-negative")
    links = data.get("links_per_node")
    if links is not None and int(links) < 1:
        raise HardwareError(f"{where}: links_per_node must be at least 1 or null")
    cache_bytes, cache_bw = data.get("cache_bytes"), data.get("cache_bw_gbps")
    if (cache_bytes is None) != (cache_bw is None) or cache_bytes is not None and not (cache_bytes > 0 < cache_bw):
        raise HardwareError(f"{where}: cache_bytes and cache_bw_gbps go together and must be positive")
    return Link(str(data.get("name", where)), bw, latency, None if links is None else int(links),
                None if cache_bytes is None else int(cache_bytes), None if cache_bw is None else float(cache_bw))


def presets() -> list[str]:
    if not os.path.isdir(PRESET_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(PRESET_DIR) if f.endswith(".json"))


def load_hardware(spec: str) -> Hardware:
    """A hardware JSON file (from `commbench fit`) or the name of a preset."""
    path = spec if os.path.exists(spec) else os.path.join(PRESET_DIR, f"{spec}.json")
    if not os.path.exists(path):
        raise HardwareError(f"no hardware file or preset {spec!r}; presets: {', '.join(presets()) or 'none'}")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise HardwareError(f"{path}: not readable JSON ({exc})") from exc
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


def algorithm_us(hw: Hardware, topo: Topology, collective: str, algorithm: str, count: int, itemsize: int,
                 root: int = 0) -> float:
    """One call of a table algorithm: by the entry's closed form where it has one (O(ranks per
    node) work at any world size), else by its full schedule."""
    entry = algorithms.entry(collective, algorithm)
    if entry.phases is not None:
        return phases_us(entry.phases(topo, count), hw, itemsize)
    return schedule_us(entry.schedule(topo, count, root), topo, hw, itemsize)


# ---------------------------------------------------------------- textbook forms (tests pin the schedules to these)


def ring_allreduce_us(p: int, nbytes: float, link: Link, reduce_gbps: float | None = None) -> float:
    """2(p-1) alpha + 2(p-1)/p S / bw (+ (p-1)/p S / gamma): the textbook ring on one level."""
    if p == 1:
        return 0.0
    t = 2 * (p - 1) * link.latency_us + 2 * (p - 1) / p * nbytes / (link.bw_gbps * 1e3)
    return t + ((p - 1) / p * nbytes / (reduce_gbps * 1e3) if reduce_gbps else 0.0)


def ring_allgather_us(p: int, nbytes: float, link: Link) -> float:
    """(p-1) alpha + (p-1)/p S / bw, S = the output buffer."""
    return (p - 1) * link.latency_us + (p - 1) / p * nbytes / (link.bw_gbps * 1e3) if p > 1 else 0.0


def oneshot_allreduce_us(p: int, nbytes: float, link: Link) -> float:
    """alpha + (p-1) S / bw: every rank receives every peer's whole buffer over its one link."""
    return link.latency_us + (p - 1) * nbytes / (link.bw_gbps * 1e3) if p > 1 else 0.0
