"""NCCL's own choice for an allreduce (ring or tree, LL / LL128 / Simple, how many channels) and
the time NCCL's tuning model predicts for it: what `nccl` (algorithms.LIBRARY) costs in
predict-scaling and proxy --backend sim.

The numbers are NCCL 2.20.3's (github.com/NVIDIA/nccl, commit b6475625fbca, the tag's
makefiles/version.mk says 2.20.3): src/graph/tuning.cc (ncclTopoTuneModel: base and per-hop
latencies, bandwidth factors and caps; ncclTopoGetAlgoTime: tree correction, ring plateau),
src/graph/search.cc (ncclTopoDupChannels, the intra-node search's top speed), the channel rule
of getAlgoInfo in src/enqueue.cc and its thread limits (src/include/device.h, comm.h). Only the
numbers and formulas are taken; this is commbench's own code. docs/model.md says what is
modelled and what is not.

NCCL's time for a call is `latency + bytes / (1000 x algorithm bandwidth)` (us, GB/s), for each
algorithm x protocol, and it runs the fastest. The bandwidth NCCL starts from is its topology
search's (channels x per-channel GB/s); here it is commbench's: between nodes one channel per
NIC (`inter.links_per_node`, at most one per GPU of the node; None: one per GPU) at the NIC's
`bw_gbps`, at most the GPU's `intra.bw_gbps` in all; on one node `intra.bw_gbps` split into
channels of at most the search's top speed; then NCCL's own doubling of channels. Everything
else (latencies included) is NCCL's constant, not the hardware file's.
What NCCL cannot know from the hardware file (GPU generation, CPU vendor) comes from an optional
`"nccl": {"arch": "ampere", "cpu": "intel"}` object in the file (those are the defaults).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from commbench.costmodel.hardware import Hardware
from commbench.topology import Topology

ALGORITHMS = ("tree", "ring")  # NCCL's order; a tie keeps the first
PROTOCOLS = ("LL", "LL128", "Simple")
ARCHS = ("volta", "ampere", "hopper")
CPUS = ("intel", "amd")

# tuning.cc baseLat: fixed latency per call (us)
BASE_LATENCY_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
# tuning.cc hwLat: latency per step (us) by what the step crosses
HOP_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)},
}
# tuning.cc caps, by [1 node, 2 nodes, more]: llMaxBws (one node: by GPU; more: by CPU vendor),
# perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws (GB/s; the last three per channel)
LL_MAX_ONE_NODE_GBPS = {"volta": 39.0, "ampere": 87.7, "hopper": 87.7}
LL_MAX_NODES_GBPS = {"intel": (39.0, 20.4), "amd": (22.5, 19.0)}  # 2 nodes, more
RING_LL128_CHANNEL_GBPS = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7)}
TREE_LL128_CHANNEL_GBPS = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0)}
TREE_CHANNEL_GBPS = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0)}
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}  # getNetOverhead: per inter-node ring step, x3 for Simple
# ncclTopoGetAlgoTime: tree bandwidth x factor by log2(bytes / 64), 64 B .. 256 MB; 1.0 above
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
# search.cc: the intra-node search's first speed (GB/s per channel), its channel limit
# (init.cc: MAXCHANNELS/2), the duplication threshold; connect.cc doubles again (MAXCHANNELS 32)
TOP_INTRA_SPEED_GBPS = {"volta": 40.0, "ampere": 40.0, "hopper": 60.0}
SEARCH_MAX_CHANNELS, MAX_CHANNELS, DUPLICATE_FROM_GBPS = 16, 32, 25.0
# enqueue.cc getAlgoInfo: channels drop while bytes < channels x threads x threshold (device.h, comm.h)
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}  # ring LL: x ranks
PCI_BW_GBPS = 12.0  # topo.h: ring Simple runs 256 threads when the graph's bandwidth is at most this


@dataclass(frozen=True)
class NcclSystem:
    """What NCCL's tuning reads about a job, taken from commbench's hardware and topology."""
    nodes: int
    ranks_per_node: int
    graph_channels: int  # the topology search's channels, after its duplication
    channel_gbps: float  # per channel (NCCL's graph bwIntra = bwInter for rings)
    nvlink: bool  # the intra level is NVLink: NCCL's NVLink latencies, and LL128 allowed
    arch: str = "ampere"
    cpu: str = "intel"

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def channels(self) -> int:
        """comm->nChannels: connect.cc doubles the search's channels once more."""
        return min(MAX_CHANNELS, 2 * self.graph_channels)


@dataclass(frozen=True)
class NcclChoice:
    """NCCL's pick for one call, with the time its own model gives it."""
    algorithm: str  # ring | tree
    protocol: str  # LL | LL128 | Simple
    channels: int  # channels the call runs on
    time_us: float

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def system(hw: Hardware, topo: Topology) -> NcclSystem:
    """NCCL's view of `topo` on `hw` (ValueError, one line, for an unknown nccl.arch or nccl.cpu)."""
    arch, cpu = _settings(hw)
    per_node = topo.ranks_per_node
    if topo.nodes > 1:
        channels = min(hw.inter.links_per_node or per_node, per_node)  # one channel per NIC, a NIC per GPU at most
        speed = hw.inter.bw_gbps if per_node == 1 else min(hw.inter.bw_gbps, hw.intra.bw_gbps / channels)
    else:
        channels = min(SEARCH_MAX_CHANNELS, math.ceil(hw.intra.bw_gbps / TOP_INTRA_SPEED_GBPS[arch]))
        speed = hw.intra.bw_gbps / channels
    channels = min(channels, SEARCH_MAX_CHANNELS)
    if speed >= DUPLICATE_FROM_GBPS and not (arch == "hopper" and speed < 50.0 and channels > 4):
        doubled = min(2 * channels, SEARCH_MAX_CHANNELS)
        speed /= -(-doubled // channels)
        channels = doubled
    return NcclSystem(topo.nodes, per_node, channels, speed, "nvlink" in hw.intra.name.lower(), arch, cpu)


def _settings(hw: Hardware) -> tuple[str, str]:
    given = hw.meta.get("nccl") or {}
    if not isinstance(given, dict):
        raise ValueError(f"{hw.name}: 'nccl' must be an object such as {{\"arch\": \"ampere\", \"cpu\": \"intel\"}}")
    arch, cpu = given.get("arch", "ampere"), given.get("cpu", "intel")
    if arch not in ARCHS or cpu not in CPUS:
        raise ValueError(f"{hw.name}: nccl.arch must be one of {', '.join(ARCHS)} and nccl.cpu one of "
                         f"{', '.join(CPUS)} (got {arch!r}, {cpu!r})")
    return arch, cpu


@lru_cache(maxsize=256)
def allreduce_table(setup: NcclSystem) -> dict[tuple[str, str], tuple[float, float]]:
    """(algorithm, protocol) -> (latency_us, algorithm GB/s) for an allreduce, as ncclTopoTuneModel
    fills them; a disabled pair (LL128 off NVLink) has bandwidth 0."""
    return {(a, p): (_latency_us(setup, a, p), _bandwidth_gbps(setup, a, p)) for a in ALGORITHMS for p in PROTOCOLS}


def _column(nodes: int) -> int:
    return min(nodes, 3) - 1  # the caps' [1 node, 2 nodes, more]


def _bandwidth_gbps(setup: NcclSystem, algorithm: str, protocol: str) -> float:
    if protocol == "LL128" and not setup.nvlink:
        return 0.0  # NCCL enables LL128 by default only over NVLink
    col, ch = _column(setup.nodes), setup.graph_channels
    ll_max = LL_MAX_ONE_NODE_GBPS[setup.arch] if setup.nodes == 1 else LL_MAX_NODES_GBPS[setup.cpu][col - 1]
    bus = ch * setup.channel_gbps
    if algorithm == "ring":
        if protocol == "LL":
            bus = min(ll_max, bus / 4)
        elif protocol == "LL128":
            bus = min(bus * (0.7 if setup.ranks_per_node < 2 else 0.92), ch * RING_LL128_CHANNEL_GBPS[setup.arch][col])
        return bus * setup.ranks / (2 * (setup.ranks - 1))  # bus bandwidth to algorithm bandwidth
    bus = min(bus * 0.92, ch * TREE_CHANNEL_GBPS[setup.arch][col])
    if protocol == "LL":
        bus = min(bus / 3.8, ll_max)
    elif protocol == "LL128":
        bus = min(bus * (7 / 9 if setup.nodes == 1 else 120 / 128), ch * TREE_LL128_CHANNEL_GBPS[setup.arch][col])
    if setup.ranks_per_node == 1:
        bus *= 0.85  # one GPU a node: the search's plain tree pattern
    return bus * 0.5


def _latency_us(setup: NcclSystem, algorithm: str, protocol: str) -> float:
    i = PROTOCOLS.index(protocol)
    intra = HOP_LATENCY_US["nvlink" if setup.nvlink else "pci"][algorithm][i]
    inter = HOP_LATENCY_US["net"][algorithm][i]  # + the transport's latency, which IB and sockets set to 0
    base = BASE_LATENCY_US[algorithm][i]
    if algorithm == "tree":
        return base + 2 * ((setup.ranks_per_node - 1) * intra + _log2(setup.nodes) * inter)
    steps = 2 * (setup.ranks - 1)
    inter_steps = 2 * setup.nodes if setup.nodes > 1 else 0
    if setup.nodes > 1:
        intra = max(intra, NET_OVERHEAD_US[setup.cpu] * (3 if protocol == "Simple" else 1))
    return base + (steps - inter_steps) * intra + inter_steps * inter


def _log2(n: int) -> int:
    """NCCL's log2i: floor(log2 n), 0 for n < 2."""
    return max(n, 1).bit_length() - 1


def predicted_us(setup: NcclSystem, algorithm: str, protocol: str, nbytes: int) -> float | None:
    """ncclTopoGetAlgoTime for one allreduce of `nbytes` (None: the pair is disabled)."""
    latency, bandwidth = allreduce_table(setup)[algorithm, protocol]
    if bandwidth == 0:
        return None
    if algorithm == "tree":
        step = _log2(nbytes >> 6)
        bandwidth *= TREE_CORRECTION[protocol][step] if step < len(TREE_CORRECTION[protocol]) else 1.0
    elif protocol == "Simple" and setup.nodes > 1 and nbytes / (setup.channels * setup.ranks) >= 64:
        latency *= 1.4 if setup.arch != "volta" else 1.9  # the ring's plateau
    return latency + nbytes / (1000 * bandwidth)


def run_channels(setup: NcclSystem, algorithm: str, protocol: str, nbytes: int) -> int:
    """getAlgoInfo: fewer channels (then fewer threads) while each thread would get too little."""
    channels = setup.channels
    threads = MAX_THREADS[protocol]
    if algorithm == "ring" and protocol == "Simple" and setup.graph_channels * setup.channel_gbps <= PCI_BW_GBPS:
        threads = 256
    threshold = THREAD_THRESHOLD[protocol] * (setup.ranks if (algorithm, protocol) == ("ring", "LL") else 1)
    while nbytes < channels * threads * threshold:
        if channels >= 2:
            channels -= 1
        elif threads % 128 == 0:
            threads //= 2
        else:
            break
    return channels


def choose(setup: NcclSystem, nbytes: int) -> NcclChoice:
    """The pair NCCL runs for an allreduce of `nbytes` (per rank) on `setup`: the fastest by its model."""
    best = None
    for algorithm in ALGORITHMS:
        for protocol in PROTOCOLS:
            time_us = predicted_us(setup, algorithm, protocol, nbytes)
            if time_us is not None and (best is None or time_us < best[0]):
                best = (time_us, algorithm, protocol)
    time_us, algorithm, protocol = best
    return NcclChoice(algorithm, protocol, run_channels(setup, algorithm, protocol, nbytes), time_us)


def allreduce(hw: Hardware, topo: Topology, nbytes: int) -> NcclChoice:
    """NCCL's choice and predicted time for one allreduce of `nbytes` per rank (world of at least 2)."""
    return choose(system(hw, topo), nbytes)
