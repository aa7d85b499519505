"""Topology: nodes x ranks per node, the link level each transfer crosses, and what a level is.

Ranks are numbered node-major, as torchrun, srun and mpirun number them: ranks
`node * ranks_per_node ... + ranks_per_node - 1` share node `node`. A transfer between
two ranks of one node crosses the `intra` level (`shm`, `nvlink`, ...), between nodes
the `inter` level (`tcp`, `ib`, ...). `Link` is the one type for a level's figures:
the cost model's hardware holds one per level, fitted from sweeps or loaded from a
preset (commbench.costmodel).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

INTRA, INTER = "intra", "inter"  # the levels: inside a node, between nodes


@dataclass(frozen=True)
class Link:
    """One link level: what one transfer gets on it, and what it shares."""
    name: str
    bw_gbps: float  # bandwidth one transfer gets on this level, one direction, 1e9 B/s
    latency_us: float  # per transfer (per step)
    links_per_node: int | None = None  # inter level: NICs a node's transfers share; None: one per rank
    # A host's caches: a call whose working set (every buffer of a node's ranks) is at most
    # cache_bytes moves data at cache_bw_gbps instead of bw_gbps (fitted from CPU sweeps).
    cache_bytes: int | None = None
    cache_bw_gbps: float | None = None


@dataclass(frozen=True)
class Topology:
    nodes: int
    ranks_per_node: int

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def link(self, src: int, dst: int) -> str:
        """The level a transfer from `src` to `dst` crosses: INTRA or INTER."""
        return INTRA if self.node_of(src) == self.node_of(dst) else INTER

    def node_ranks(self, node: int) -> list[int]:
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    def local_peers(self, local: int) -> list[int]:
        """The rank with local index `local` on every node, in node order."""
        return [node * self.ranks_per_node + local for node in range(self.nodes)]

    def __str__(self) -> str:
        return f"{self.nodes}x{self.ranks_per_node}"


class TopologyError(ValueError):
    """A topology spec that is malformed or does not match the world size."""


def parse_nodes_by_ranks(spec: str) -> Topology:
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
    topo = parse_nodes_by_ranks(spec)
    if topo.world != world:
        raise TopologyError(f"--topology {spec} has {topo.world} ranks but the job has {world}")
    return topo
