"""Topology: nodes x ranks per node, and the link level each transfer crosses.

Ranks are numbered node-major, as torchrun, srun and mpirun number them: ranks
`node * ranks_per_node ... + ranks_per_node - 1` share node `node`. A level has a
name (`shm`, `nvlink`, `tcp`, `ib`, ...) and, once fitted or loaded from a
preset, a bandwidth and a latency; the analytic model reads them from here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Level:
    name: str
    bw_gbps: float | None = None  # per link, 1e9 B/s; None until fitted
    latency_us: float | None = None


@dataclass(frozen=True)
class Topology:
    nodes: int
    ranks_per_node: int
    intra: Level = Level("intra")
    inter: Level = Level("inter")

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def link(self, src: int, dst: int) -> Level:
        """The level a transfer from `src` to `dst` uses."""
        return self.intra if self.node_of(src) == self.node_of(dst) else self.inter

    def node_ranks(self, node: int) -> list[int]:
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    def local_peers(self, local: int) -> list[int]:
        """The rank with local index `local` on every node, in node order."""
        return [node * self.ranks_per_node + local for node in range(self.nodes)]

    def __str__(self) -> str:
        return f"{self.nodes}x{self.ranks_per_node}"


class TopologyError(ValueError):
    """A topology spec that is malformed or does not match the world size."""


def parse_layout(spec: str) -> Topology:
    """`NODESxRANKS` (e.g. `8x8`) on its own, for predictions that need no job."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", spec)
    if not match:
        raise TopologyError(f"bad --topology {spec!r}: expected NODESxRANKS, e.g. 2x4")
    nodes, per_node = int(match.group(1)), int(match.group(2))
    if nodes < 1 or per_node < 1:
        raise TopologyError(f"bad --topology {spec!r}: nodes and ranks per node must be at least 1")
    return Topology(nodes, per_node)


def parse_topology(spec: str | None, world: int) -> Topology:
    """`NODESxRANKS` that must match a job of `world` ranks; None or empty means one node."""
    if not spec:
        return Topology(1, world)
    topo = parse_layout(spec)
    if topo.world != world:
        raise TopologyError(f"--topology {spec} has {topo.world} ranks but the job has {world}")
    return topo
