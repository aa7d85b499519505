"""A Schedule's rounds -> time: alpha-beta(-gamma) per link level, summed over the rounds.

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
lasts the sum of its rounds plus the hardware's per-call overhead. `phases_us`
costs a closed form (`Phases`, the same rounds compressed), `variants_us` one form
on many variants of a hardware at once.

Units are in the names: bytes, microseconds (`_us`), GB/s = 1e9 bytes/s (`_gbps`),
so bytes / (gbps * 1e3) is microseconds.
"""
from __future__ import annotations

from dataclasses import replace

from commbench.costmodel.hardware import Hardware
from commbench.schedule import Phases, Schedule, Transfer
from commbench.topology import Link, Topology


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


def form_us(form: Phases | Schedule, topo: Topology, hw: Hardware, itemsize: int) -> float:
    """phases_us of a closed form, schedule_us of a full schedule on `topo`: what costs a call_form or table_form."""
    return phases_us(form, hw, itemsize) if isinstance(form, Phases) else schedule_us(form, topo, hw, itemsize)


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
