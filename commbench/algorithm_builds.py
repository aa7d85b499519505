"""commbench's collective algorithms as schedules: each a function (topology, count) -> Schedule built from
ring, tree and halving rounds, and the closed forms (Phases) of the ring and hier ones for costing at any
scale. The table that names them, says what each serves and chooses among them is commbench/algorithms.py;
docs/algorithms.md gives each one's traffic and steps.
"""
from __future__ import annotations

import math
from typing import Callable

from commbench.schedule import Chunk, Phases, Schedule, Transfer, split
from commbench.topology import Topology

Rounds = list[list[Transfer]]


# ---------------------------------------------------------------- building blocks


def _ring_reduce_scatter(members: list[int], parts: tuple[Chunk, ...], steps: int | None = None) -> Rounds:
    """Members reduce `parts` around a ring so that member i ends with parts[i] complete.
    Step k: member i sends part (i - k - 1) to member i + 1, which adds it in. `steps`: the first
    that many only (a closed form's one round: the whole ring is members^2 transfers)."""
    n = len(members)
    return [[Transfer(members[i], members[(i + 1) % n], parts[(i - k - 1) % n], True) for i in range(n)]
            for k in range(n - 1 if steps is None else min(steps, n - 1))]


def _ring_allgather(members: list[int], parts: tuple[Chunk, ...], steps: int | None = None) -> Rounds:
    """Member i starts with parts[i]; step k: member i forwards part (i - k) to member i + 1 (`steps`: as above)."""
    n = len(members)
    return [[Transfer(members[i], members[(i + 1) % n], parts[(i - k) % n], False) for i in range(n)]
            for k in range(n - 1 if steps is None else min(steps, n - 1))]


def _subparts(chunk: Chunk, pieces: int) -> tuple[Chunk, ...]:
    return tuple((chunk[0] + a, chunk[0] + b) for a, b in split(chunk[1] - chunk[0], pieces))


def _parallel(*groups: Rounds) -> Rounds:
    """Run several groups' rounds side by side (round k of each group together)."""
    depth = max((len(g) for g in groups), default=0)
    return [[t for g in groups if k < len(g) for t in g[k]] for k in range(depth)]


def _schedule(name: str, collective: str, topo: Topology, count: int, rounds: Rounds, root: int = 0,
              parts: tuple[Chunk, ...] = ()) -> Schedule:
    kept = tuple(tuple(t for t in rnd if t.count > 0) for rnd in rounds)  # empty chunks move nothing
    return Schedule(name, collective, topo.world, count, tuple(r for r in kept if r), root, parts)


# ---------------------------------------------------------------- allreduce


def ring_allreduce(topo: Topology, count: int) -> Schedule:
    """Reduce-scatter then all-gather around one ring: 2(n-1) steps, 2(n-1)/n of the buffer sent per rank."""
    members, parts = list(range(topo.world)), split(count, topo.world)
    rounds = _ring_reduce_scatter(members, parts) + _ring_allgather(members, parts)
    return _schedule("ring", "allreduce", topo, count, rounds)


def hier_allreduce(topo: Topology, count: int) -> Schedule:
    """Hierarchical: ring reduce-scatter inside each node (local rank i owns part i), ring
    allreduce of part i among the local-rank-i ranks of all nodes, ring all-gather inside
    each node. Inter-node traffic per rank: 2(N-1)/N of 1/L of the buffer."""
    per_node, nodes = topo.ranks_per_node, topo.nodes
    parts = split(count, per_node)
    node_groups = [topo.node_ranks(n) for n in range(nodes)]
    intra_rs = _parallel(*(_ring_reduce_scatter(g, parts) for g in node_groups))
    cross = []
    for local in range(per_node):
        peers, sub = topo.local_peers(local), _subparts(parts[local], nodes)
        cross.append(_ring_reduce_scatter(peers, sub) + _ring_allgather(peers, sub))
    intra_ag = _parallel(*(_ring_allgather(g, parts) for g in node_groups))
    return _schedule("hier", "allreduce", topo, count, intra_rs + _parallel(*cross) + intra_ag)


def binomial_allreduce(topo: Topology, count: int) -> Schedule:
    """Binomial tree: reduce towards rank 0 in ceil(log2 n) steps, then broadcast back down the
    same tree. Each step moves the whole buffer; latency-bound, for small messages."""
    n = topo.world
    distances = []
    d = 1
    while d < n:
        distances.append(d)
        d *= 2
    whole = (0, count)
    reduce = [[Transfer(r, r - d, whole, True) for r in range(d, n, 2 * d)] for d in distances]
    bcast = [[Transfer(r - d, r, whole, False) for r in range(d, n, 2 * d)] for d in reversed(distances)]
    return _schedule("binomial", "allreduce", topo, count, reduce + bcast)


def tree_allreduce(topo: Topology, count: int) -> Schedule:
    """Pipelined binary tree (rank i's children are 2i+1 and 2i+2), as NCCL's tree pipelines:
    the buffer in P pieces; piece j leaves depth e for its parent at step j + (D - e), so a
    parent has added both children's piece before sending it on; then the same pieces flow
    back down, piece j leaving depth e at step j + e. 2(P + D - 1) steps (D = tree depth);
    every rank but the root sends the buffer up once, every parent sends it down once per child."""
    n, pieces = topo.world, split(count, _pipeline_pieces(count, topo.world))
    depth = [0] * n
    for r in range(1, n):
        depth[r] = depth[(r - 1) // 2] + 1
    tree_depth, steps = max(depth), len(pieces) + max(depth) - 1
    up = [[Transfer(r, (r - 1) // 2, pieces[t - (tree_depth - depth[r])], True) for r in range(1, n)
           if 0 <= t - (tree_depth - depth[r]) < len(pieces)] for t in range(steps)]
    down = [[Transfer((r - 1) // 2, r, pieces[t - (depth[r] - 1)], False) for r in range(1, n)
             if 0 <= t - (depth[r] - 1) < len(pieces)] for t in range(steps)]
    return _schedule("tree", "allreduce", topo, count, up + down)


def rhd_allreduce(topo: Topology, count: int) -> Schedule:
    """Rabenseifner: recursive-halving reduce-scatter and recursive-doubling all-gather on the
    largest power of two p <= n ranks; the n - p extra ranks first fold their buffer into a
    partner and get the result back at the end. 2 log2(p) (+2) steps, about 2(p-1)/p of the
    buffer sent per rank."""
    n = topo.world
    p = 1 << (n.bit_length() - 1)
    extras = list(range(p, n))
    rounds: Rounds = []
    if extras:
        rounds.append([Transfer(e, e - p, (0, count), True) for e in extras])
    owned = {r: (0, count) for r in range(p)}
    halving = []
    d = p // 2
    while d >= 1:
        step = []
        for r in range(p):
            partner = r ^ d
            lo, hi = owned[r]
            mid = lo + (hi - lo) // 2
            keep, give = ((lo, mid), (mid, hi)) if r < partner else ((mid, hi), (lo, mid))
            step.append(Transfer(r, partner, give, True))
            owned[r] = keep
        halving.append(d)
        rounds.append(step)
        d //= 2
    for d in reversed(halving):
        step = [Transfer(r, r ^ d, owned[r], False) for r in range(p)]
        owned = {r: (min(owned[r][0], owned[r ^ d][0]), max(owned[r][1], owned[r ^ d][1])) for r in range(p)}
        rounds.append(step)
    if extras:
        rounds.append([Transfer(e - p, e, (0, count), False) for e in extras])
    return _schedule("rhd", "allreduce", topo, count, rounds)


def oneshot_allreduce(topo: Topology, count: int) -> Schedule:
    """Every rank reads every peer's whole buffer and reduces it into its own: one step,
    (n-1) buffers read per rank. For small messages, where the step count is the cost."""
    n = topo.world
    rounds = [[Transfer(s, r, (0, count), True) for r in range(n) for s in range(n) if s != r]]
    return _schedule("oneshot", "allreduce", topo, count, rounds)


def twoshot_allreduce(topo: Topology, count: int) -> Schedule:
    """Two-shot: rank r reads part r of every rank and reduces it (one step), then reads
    part p from rank p for every p (one step). 2 steps, 2(n-1)/n of the buffer read per
    rank, no round writes what another reads: in place without staging. Its kernels
    (cuda/allreduce.cu) are the only executor (`gpu_only`)."""
    n, parts = topo.world, split(count, topo.world)
    gather = [Transfer(s, r, parts[r], True) for r in range(n) for s in range(n) if s != r]
    spread = [Transfer(p, r, parts[p], False) for r in range(n) for p in range(n) if p != r]
    return _schedule("twoshot", "allreduce", topo, count, [gather, spread])


# ---------------------------------------------------------------- other collectives


def ring_allgather(topo: Topology, count: int) -> Schedule:
    """count = the output buffer; rank r's input is part r. n-1 steps, (n-1)/n of the buffer sent."""
    parts = split(count, topo.world)
    return _schedule("ring", "allgather", topo, count, _ring_allgather(list(range(topo.world)), parts),
                     parts=parts)


def ring_reduce_scatter(topo: Topology, count: int) -> Schedule:
    """count = the input buffer; rank r keeps part r reduced. n-1 steps, (n-1)/n of the buffer sent."""
    parts = split(count, topo.world)
    return _schedule("ring", "reduce_scatter", topo, count, _ring_reduce_scatter(list(range(topo.world)), parts),
                     parts=parts)


def _pipeline_pieces(count: int, world: int) -> int:
    """Pipeline depth of the chain algorithms: enough pieces to keep every hop busy,
    each at least 64 Ki elements so per-step overhead stays small."""
    return max(1, min(count // 65536, 4 * world, 64)) if world > 1 else 1


def chain_broadcast(topo: Topology, count: int, root: int = 0) -> Schedule:
    """Pipelined chain root -> root+1 -> ...: the buffer in P pieces, piece j crosses hop h at
    step j + h. P + n - 2 steps; every rank but the last sends the buffer once."""
    n, pieces = topo.world, split(count, _pipeline_pieces(count, topo.world))
    order = [(root + i) % n for i in range(n)]
    rounds = [[Transfer(order[h], order[h + 1], pieces[t - h], False) for h in range(n - 1) if 0 <= t - h < len(pieces)]
              for t in range(len(pieces) + n - 2)]
    return _schedule("chain", "broadcast", topo, count, rounds, root=root)


def chain_reduce(topo: Topology, count: int, root: int = 0) -> Schedule:
    """Pipelined chain towards the root: the last rank starts, each piece is added in at every
    hop. P + n - 2 steps; every rank but the root sends the buffer once."""
    n, pieces = topo.world, split(count, _pipeline_pieces(count, topo.world))
    order = [(root + i) % n for i in range(n)]  # order[0] is the root; order[n-1] starts
    rounds = [[Transfer(order[h], order[h - 1], pieces[t - (n - 1 - h)], True) for h in range(n - 1, 0, -1)
               if 0 <= t - (n - 1 - h) < len(pieces)] for t in range(len(pieces) + n - 2)]
    return _schedule("chain", "reduce", topo, count, rounds, root=root)


# ---------------------------------------------------------------- closed forms (for costing at any scale)


def _two_nodes(topo: Topology) -> Topology:
    """Where a ring or hier round is costed: every node of such a round sends and receives
    alike (one ring hop across each node boundary, or one per local rank), so two nodes
    load each link and NIC as N do."""
    return Topology(min(topo.nodes, 2), topo.ranks_per_node)


def _ring_phases(topo: Topology, count: int, reduces: tuple[bool, ...], channels: int = 1) -> Phases:
    """A ring's phases: every step moves one part one hop around the ring, so each phase is
    one round repeated n-1 times. `channels`: that many rings side by side, each with its
    share of every part (NCCL's channels, one per NIC)."""
    n, small = topo.world, _two_nodes(topo)
    if n == 1:
        return Phases(small, count, ())
    # two ranks a node stand for all: each rank's links carry one part a step and each node's NICs one hop
    # either way, as in the whole ring (a round of 4 transfers, not 2 x ranks per node)
    members = [rank for node in range(small.nodes) for rank in small.node_ranks(node)[:2]]
    parts = ((0, math.ceil(math.ceil(count / n) / channels)),) * len(members)
    steps = [(_ring_reduce_scatter if reduce else _ring_allgather)(members, parts, 1)[0] for reduce in reduces]
    return Phases(small, count, tuple((tuple(step) * channels, n - 1) for step in steps))


def ring_allreduce_phases(topo: Topology, count: int, channels: int = 1) -> Phases:
    """ring_allreduce in closed form: a reduce-scatter round and an all-gather round, n-1 times each."""
    return _ring_phases(topo, count, (True, False), channels)


def ring_allgather_phases(topo: Topology, count: int, channels: int = 1) -> Phases:
    return _ring_phases(topo, count, (False,), channels)


def ring_reduce_scatter_phases(topo: Topology, count: int, channels: int = 1) -> Phases:
    return _ring_phases(topo, count, (True,), channels)


def hier_allreduce_phases(topo: Topology, count: int) -> Phases:
    """hier_allreduce in closed form: the node rings' reduce-scatter round L-1 times, the
    cross-node rings' reduce-scatter and all-gather rounds N-1 times each, the node rings'
    all-gather round L-1 times."""
    per_node, nodes, small = topo.ranks_per_node, topo.nodes, _two_nodes(topo)
    part = math.ceil(count / per_node)
    sub = math.ceil(part / nodes)

    def inside(ring: Callable[..., Rounds]) -> tuple[Transfer, ...]:
        return tuple(t for k in range(small.nodes) for t in ring(small.node_ranks(k), ((0, part),) * per_node, 1)[0])

    def across(ring: Callable[..., Rounds]) -> tuple[Transfer, ...]:
        peers = [small.local_peers(local) for local in range(per_node)]
        return tuple(t for ranks in peers for t in ring(ranks, ((0, sub),) * small.nodes, 1)[0])

    rounds = []
    if per_node > 1:
        rounds.append((inside(_ring_reduce_scatter), per_node - 1))
    if nodes > 1:
        rounds += [(across(_ring_reduce_scatter), nodes - 1), (across(_ring_allgather), nodes - 1)]
    if per_node > 1:
        rounds.append((inside(_ring_allgather), per_node - 1))
    return Phases(small, count, tuple(rounds))
