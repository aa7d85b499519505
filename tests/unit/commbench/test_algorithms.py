"""Every algorithm, through the reference interpreter: right result for world sizes 1..64,
counts that do not divide (count < world included), every dtype and op, and no transfer
that reads a chunk before it is final (checked symbolically, not only by the numbers)."""
import functools

import numpy as np
import pytest

from commbench import algorithms as A
from commbench import collectives as C
from commbench.schedule import (
    Schedule,
    ScheduleError,
    Transfer,
    check_round,
    contributions,
    hazards,
    run,
    split,
    verify,
)
from commbench.topology import INTER, INTRA, Topology, TopologyError, parse_topology

WORLDS = list(range(1, 17)) + [24, 31, 32, 48, 63, 64]
COUNTS = [1, 5, 64, 1001]


def _topologies(world):
    yield Topology(1, world)
    for nodes in (2, 3, 4, 8):
        if world % nodes == 0 and world > nodes:
            yield Topology(nodes, world // nodes)


CASES = [(coll, name, topo, count) for coll, table in A.TABLE.items() for name in table
         for world in WORLDS for topo in _topologies(world) for count in COUNTS
         if coll not in ("allgather", "reduce_scatter") or count % world == 0 or count == 1001]


@pytest.mark.parametrize("collective,name,topo,count", CASES,
                         ids=[f"{c}-{n}-{t}-{k}" for c, n, t, k in CASES])
def test_schedule_computes_its_collective(collective, name, topo, count):
    if collective in ("allgather", "reduce_scatter"):
        count = count - count % topo.world or topo.world  # these work on n equal parts
    schedule = A.build(collective, name, topo, count, count * 4, root=topo.world - 1)
    verify(schedule)  # symbolic: every element holds exactly the right ranks' inputs


# Grouped by (world, dtype, op), so that each group's inputs are made once (_inputs): a 64-rank pattern is a
# 64 x 65,521 table, and making it for each of the 14 algorithm and count cases was most of this test's time.
NUMERIC = [(name, world, count, dtype, op) for world in (1, 2, 3, 5, 8, 12, 17, 64) for dtype in C.DTYPES
           for op in C.OPS for name in A.TABLE["allreduce"] for count in (3, 257)
           if not (op == "avg" and not C.DTYPES[dtype].is_float)]


@functools.lru_cache(maxsize=1)
def _pattern(dtype: str, op: str, world: int) -> C.Pattern:
    return C.make_pattern(C.DTYPES[dtype], op, world)


@pytest.mark.parametrize("name,world,count,dtype,op", NUMERIC)
def test_allreduce_equals_numpy(name, world, count, dtype, op):
    dt = C.DTYPES[dtype]
    topo = Topology(2, world // 2) if world % 2 == 0 and world > 2 else Topology(1, world)
    pattern = _pattern(dtype, op, world)
    inputs = [C.input_values(pattern, r, 0, count) for r in range(world)]
    out = run(A.build("allreduce", name, topo, count, count * dt.itemsize), [x.copy() for x in inputs], op)
    reducer = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    expected = inputs[0].copy()
    for x in inputs[1:]:
        expected = reducer(expected, x).astype(expected.dtype)
    for r in range(world):
        assert np.array_equal(out[r], expected), (name, r)


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter", "broadcast", "reduce"])
@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_other_collectives_numeric(collective, world):
    count = 6 * world
    topo = Topology(1, world)
    inputs = [np.arange(count, dtype=np.int64) * 10 + r for r in range(world)]
    schedule = A.build(collective, "auto", topo, count, count * 8, root=world // 2)
    out = run(schedule, [x.copy() for x in inputs])
    total = sum(inputs)
    for r in range(world):
        if collective == "reduce_scatter":
            lo, hi = schedule.parts[r]
            assert np.array_equal(out[r][lo:hi], total[lo:hi])
        elif collective == "allgather":
            for s in range(world):
                lo, hi = schedule.parts[s]
                assert np.array_equal(out[r][lo:hi], inputs[s][lo:hi])
        elif collective == "broadcast":
            assert np.array_equal(out[r], inputs[world // 2])
        elif r == world // 2:
            assert np.array_equal(out[r], total)


def test_read_before_final_is_caught_symbolically():
    """Ring allgather with two steps swapped forwards a chunk before it arrived: the numbers
    can still look plausible, the contribution masks cannot."""
    good = A.ring_allgather(Topology(1, 4), 8)
    bad = Schedule("swapped", "allgather", 4, 8, (good.rounds[1], good.rounds[0], good.rounds[2]), parts=good.parts)
    verify(good)
    with pytest.raises(ScheduleError, match="holds ranks"):
        verify(bad)


def test_double_counting_is_caught():
    topo = Topology(1, 2)
    twice = Schedule("twice", "allreduce", 2, 4, ((Transfer(0, 1, (0, 4), True),), (Transfer(1, 0, (0, 4), True),)))
    with pytest.raises(ScheduleError, match="already has"):
        contributions(twice)
    verify(A.ring_allreduce(topo, 4))


def test_misrouted_chunk_is_caught():
    ring = A.ring_allreduce(Topology(1, 3), 9)
    first = ring.rounds[0]
    broken = (tuple(Transfer(t.src, t.dst, (0, 3) if t.chunk == (3, 6) else t.chunk, t.reduce) for t in first),
              *ring.rounds[1:])
    with pytest.raises(ScheduleError):
        verify(Schedule("broken", "allreduce", 3, 9, broken))


def test_round_checks():
    with pytest.raises(ScheduleError, match="bad ranks"):
        verify(Schedule("x", "allreduce", 2, 4, ((Transfer(0, 0, (0, 4), True),),)))
    with pytest.raises(ScheduleError, match="outside"):
        verify(Schedule("x", "allreduce", 2, 4, ((Transfer(0, 1, (0, 5), True),),)))
    with pytest.raises(ScheduleError, match=r"Transfer\(src=2, dst=1, chunk=\(3, 5\), reduce=False\) overwrites"):
        check_round((Transfer(0, 1, (0, 4), True), Transfer(3, 1, (5, 6), False), Transfer(2, 1, (3, 5), False)), 4, 8)
    check_round((Transfer(0, 1, (0, 4), True), Transfer(2, 1, (2, 6), True), Transfer(3, 1, (6, 8), False)), 4, 8)
    oneshot = A.oneshot_allreduce(Topology(1, 3), 4)
    assert hazards(oneshot.rounds[0]) == {0, 1, 2}


def test_the_round_check_finds_exactly_the_pairs_that_collide():
    """check_round sorts each rank's writes (was every pair: 63^2 tests a rank in a one-shot round of 64); on
    random rounds it refuses exactly where some pair of writes into one rank overlaps, not both reducing."""
    rng = np.random.default_rng(7)
    refused = 0
    for _ in range(3000):
        into = []
        for src in range(1, int(rng.integers(2, 7))):
            lo = int(rng.integers(0, 12))
            into.append(Transfer(src, 0, (lo, lo + int(rng.integers(0, 5))), bool(rng.random() < 0.6)))
        collide = any(a.chunk[0] < b.chunk[1] and b.chunk[0] < a.chunk[1] and a.chunk[0] < a.chunk[1]
                      and b.chunk[0] < b.chunk[1] and not (a.reduce and b.reduce)
                      for i, a in enumerate(into) for b in into[:i])
        try:
            check_round(tuple(into), 8, 16)
        except ScheduleError:
            assert collide, into
            refused += 1
        else:
            assert not collide, into
    assert 500 < refused < 2500  # both outcomes are exercised
    assert all(not hazards(rnd) for rnd in A.ring_allreduce(Topology(1, 4), 16).rounds)


@pytest.mark.parametrize("name,steps,sent", [("ring", 2 * 7, 2 * 7 / 8), ("rhd", 2 * 3, 7 / 8 * 2), ("oneshot", 1, 1.0),
                                             ("binomial", 2 * 3, None), ("tree", 2 * (1 + 3 - 1), None),
                                             ("twoshot", 2, 2 * 7 / 8)])
def test_steps_and_traffic(name, steps, sent):
    schedule = A.build("allreduce", name, Topology(1, 8), 8000, 32000)
    assert schedule.steps == steps
    if sent is not None and name != "oneshot":
        assert schedule.bytes_sent(3, 4) == pytest.approx(sent * 8000 * 4)
    if name == "oneshot":
        assert schedule.bytes_sent(3, 4) == 7 * 8000 * 4  # every peer reads rank 3's buffer


def test_binary_tree_pipelines_pieces():
    topo = Topology(1, 7)  # depth 2: 0 -> 1, 2 -> 3, 4, 5, 6
    count = 65536 * 8  # 8 pieces
    tree = A.tree_allreduce(topo, count)
    assert tree.steps == 2 * (8 + 2 - 1)
    assert tree.bytes_sent(3, 1) == count  # a leaf sends the buffer up once
    assert tree.bytes_sent(1, 1) == count + 2 * count  # up once, down to each of its two children
    first = tree.rounds[0]
    assert {(t.src, t.dst) for t in first} == {(3, 1), (4, 1), (5, 2), (6, 2)}  # leaves start, together


def test_hier_sends_less_across_nodes():
    topo = Topology(4, 8)
    hier, ring = A.hier_allreduce(topo, 1 << 16), A.ring_allreduce(topo, 1 << 16)

    def busiest_inter_sender(schedule):  # elements the busiest rank sends across nodes (its NIC's load)
        sent = [0] * topo.world
        for t in (t for rnd in schedule.rounds for t in rnd if topo.link(t.src, t.dst) == INTER):
            sent[t.src] += t.count
        return max(sent)
    # ring: the 4 ranks at node boundaries each send 2(n-1)/n of the buffer across;
    # hier: every rank sends 2(N-1)/N of 1/L of it.
    assert busiest_inter_sender(ring) == pytest.approx(2 * 31 / 32 * (1 << 16), rel=0.01)
    assert busiest_inter_sender(hier) == pytest.approx(2 * 3 / 4 * (1 << 16) / 8, rel=0.01)


def test_auto_rule_and_unknown_algorithm():
    assert A.choose("allreduce", Topology(1, 4), 1024) == "oneshot"
    assert A.choose("allreduce", Topology(1, 2), 1024) == "oneshot"  # measured in pairs, docs/algorithms.md
    assert A.choose("allreduce", Topology(1, 2), 1024, pushes=True) == "ring"  # one round with pushes (shm)
    assert A.choose("allreduce", Topology(1, 3), 1024, pushes=True) == "oneshot"
    assert A.choose("allreduce", Topology(1, 2), 1 << 20) == "ring"
    assert A.choose("allreduce", Topology(1, 64), 1024) == "rhd"
    assert A.choose("allreduce", Topology(1, 4), 1 << 20) == "ring"
    assert A.choose("allreduce", Topology(2, 4), 1 << 20) == "hier"
    assert A.choose("allgather", Topology(1, 4), 1 << 20) == "ring"
    for size in (1024, 1 << 20, 1 << 28):  # measured in pairs on 2-4 shm ranks (docs/algorithms.md)
        assert A.choose("alltoall", Topology(1, 4), size) == "pairwise"
        assert A.choose("alltoall", Topology(2, 4), size) == "hier"
        assert A.choose("alltoall", Topology(4, 1), size) == "pairwise"  # one rank per node: nothing to gather
    with pytest.raises(A.AlgorithmError, match="no algorithm 'tree' for allgather"):
        A.build("allgather", "tree", Topology(1, 4), 16, 64)
    with pytest.raises(A.AlgorithmError, match="no algorithm 'ring' for alltoall; available: pairwise, bruck, hier"):
        A.build("alltoall", "ring", Topology(1, 4), 16, 64)
    with pytest.raises(A.AlgorithmError, match="no algorithm for sendrecv"):
        A.build("sendrecv", "ring", Topology(1, 4), 16, 64)


def test_split_and_topology():
    assert split(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))
    assert split(2, 4) == ((0, 1), (1, 2), (2, 2), (2, 2))
    assert parse_topology("2x4", 8) == Topology(2, 4) and parse_topology(None, 3) == Topology(1, 3)
    topo = Topology(2, 4)
    assert topo.link(0, 3) == INTRA and topo.link(3, 4) == INTER
    for bad in ("2x3", "8", "0x8", "axb"):
        with pytest.raises(TopologyError):
            parse_topology(bad, 8)


def test_the_table_and_its_views():
    """Each algorithm once, in TABLE; the views the rest of commbench reads are derived from it."""
    for collective, entries in A.TABLE.items():
        assert all(e.collective == collective and e.name == name for name, e in entries.items())
    assert list(A.available("allreduce")) == ["ring", "hier", "tree", "rhd", "oneshot", "binomial"]
    assert list(A.available("allreduce", gpu=True)) == [*A.available("allreduce"), "twoshot"]
    assert A.TABLE["allreduce"]["twoshot"].gpu_only and A.available("sendrecv") == {}
    assert list(A.available("alltoall")) == ["pairwise", "bruck", "hier"]
    assert A.ALGORITHMS == {c: {n: e.build for n, e in A.available(c).items()} for c in A.TABLE}
    assert A.LIBRARY_ALGORITHM == {"allreduce": "ring", "allgather": "ring", "reduce_scatter": "ring",
                                   "broadcast": "chain", "reduce": "chain"}
    assert A.LIBRARY == "nccl" and A.LIBRARY not in A.TABLE["allreduce"]  # a costing of the ring, not a schedule
    assert A.build("allreduce", "twoshot", Topology(1, 4), 16, 64).name == "twoshot"  # the model takes it
    assert A.entry("broadcast", "chain").schedule(Topology(1, 3), 9, root=2).root == 2
    with pytest.raises(A.AlgorithmError, match="available: ring, hier, tree, rhd, oneshot, binomial, twoshot, auto"):
        A.entry("allreduce", "spiral")
