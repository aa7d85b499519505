"""commbench's all-to-all algorithms: each a function (topology, count) -> Schedule (algorithms.TABLE
lists them; docs/algorithms.md, "All-to-all", gives their rounds and bytes).

`count` is each rank's send (= receive) buffer, n blocks of count // n elements: block d of rank
s's send buffer ends in block s of rank d's receive buffer (collectives.expected_segments). A
transfer keeps its offset, so an all-to-all schedule places every block in the working buffers
(Schedule.blocks, counted in blocks here: a layout) and moves it between ranks at that place:

- pairwise: layout "colored", 2n blocks: block (s, d) at 2((s + d) mod n) + [s > d]. A rank's
  outgoing and incoming blocks never share a place, so no round reads what it writes (no hazards:
  no staging in any executor), for twice the buffer;
- bruck and hier: layout "rotated", n blocks: block (s, d) at (d - s) mod n, Bruck's own rotation
  (hier's in two levels). Rounds write the places they send from, so executors stage (hazards),
  as Bruck's implementations pack a temporary buffer in every step.

The backends copy the send buffer into the layout before the rounds and the result out of it
after (schedule_base), the local permutation every all-to-all pays; the model costs the rounds.
"""
from __future__ import annotations

from typing import Callable

from commbench.schedule import Schedule, Transfer
from commbench.topology import Topology

Layout = Callable[[int, int], int]  # (source rank, destination rank) -> the block's place, in blocks


def _schedule(name: str, topo: Topology, count: int, places: int, layout: Layout,
              rounds: list[list[tuple[int, int, int, int]]]) -> Schedule:
    """rounds of (src, dst, first place, places) -> a Schedule on a buffer of `places` blocks."""
    n, size = topo.world, count // topo.world
    blocks = tuple(tuple((layout(s, d) * size, (layout(s, d) + 1) * size) for d in range(n)) for s in range(n))
    moved = tuple(tuple(Transfer(src, dst, (first * size, (first + length) * size), False)
                        for src, dst, first, length in rnd) for rnd in rounds)
    return Schedule(name, "alltoall", n, places * size, tuple(r for r in moved if r and size), blocks=blocks)


def pairwise_alltoall(topo: Topology, count: int) -> Schedule:
    """Pairwise exchange: n-1 rounds; in round k rank r sends its block for r + k and receives
    the block of r - k. (n-1)/n of the buffer sent per rank, one block per round."""
    n = topo.world

    def colored(s: int, d: int) -> int:
        return 2 * ((s + d) % n) + (1 if s > d else 0)
    rounds = [[(r, (r + k) % n, colored(r, (r + k) % n), 1) for r in range(n)] for k in range(1, n)]
    return _schedule("pairwise", topo, count, 2 * n, colored, rounds)


def bruck_alltoall(topo: Topology, count: int) -> Schedule:
    """Bruck: ceil(log2 n) rounds; in round k rank r sends to r + 2^k every block whose remaining
    distance (place j = (d - s) mod n, counted from where it is) has bit k set. About n/2 blocks
    per round, (n/2) log2 n sent per rank for n a power of two: fewer rounds, more bytes."""
    n = topo.world
    rounds = []
    step = 1
    while step < n:  # the places with bit `step` set form runs of `step` places
        runs = [(start, min(start + step, n) - start) for start in range(step, n, 2 * step)]
        rounds.append([(r, (r + step) % n, first, length) for r in range(n) for first, length in runs])
        step *= 2
    return _schedule("bruck", topo, count, n, lambda s, d: (d - s) % n, rounds)


def hier_alltoall(topo: Topology, count: int) -> Schedule:
    """Two levels (N nodes x L ranks): inside each node, rank (a, i) hands rank (a, j) its N blocks
    for the ranks of local index j (L-1 pairwise rounds of N blocks); then rank (a, j) sends rank
    (b, j) the L blocks gathered for it (N-1 pairwise rounds of L blocks), one message per node
    pair and local index instead of L. The second level lands every block where it ends, so no
    scatter follows. Sent per rank: (L-1)/L of the buffer inside the node, (N-1)/N across."""
    nodes, local = topo.nodes, topo.ranks_per_node

    def rotated(s: int, d: int) -> int:
        return ((topo.node_of(d) - topo.node_of(s)) % nodes) * local + (topo.local_rank(d) - topo.local_rank(s)) % local

    def rank(node: int, index: int) -> int:
        return (node % nodes) * local + index % local
    inside = [[(rank(a, i), rank(a, i + k), across * local + k, 1) for a in range(nodes) for i in range(local)
               for across in range(nodes)] for k in range(1, local)]
    between = [[(rank(a, j), rank(a + k, j), k * local, local) for a in range(nodes) for j in range(local)]
               for k in range(1, nodes)]
    return _schedule("hier", topo, count, topo.world, rotated, inside + between)


ALLTOALL: dict[str, Callable[[Topology, int], Schedule]] = {  # algorithms.TABLE's alltoall entries, in order
    "pairwise": pairwise_alltoall, "bruck": bruck_alltoall, "hier": hier_alltoall}


def choose_alltoall(topo: Topology) -> str:
    """`auto`'s rule: hier across nodes of several ranks (one cross-node message per node pair and
    local index instead of L), else pairwise at every size (measured: docs/algorithms.md)."""
    return "hier" if topo.nodes > 1 and topo.ranks_per_node > 1 else "pairwise"
