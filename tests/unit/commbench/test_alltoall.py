"""The all-to-all schedules (commbench/alltoall.py) through the reference interpreter: every block
lands where the collective table expects it (worlds 1-8, Bruck on more and non-powers of two,
hier on 1 and 2 nodes), checked symbolically and numerically; their rounds, bytes and hazards;
and a block layout or transfer that lies is caught."""
import math
from dataclasses import replace

import numpy as np
import pytest

from commbench import algorithms as A
from commbench import collectives as C
from commbench.schedule import ScheduleError, Transfer, hazards, run, verify
from commbench.topology import Topology

NAMES = ("pairwise", "bruck", "hier")


def _topologies(name):
    for world in range(1, 9):
        yield Topology(1, world)
        if name == "hier" and world % 2 == 0 and world > 2:
            yield Topology(2, world // 2)
    if name == "bruck":
        yield from (Topology(1, w) for w in (11, 13, 16, 23))
    if name == "hier":
        yield from (Topology(2, 1), Topology(3, 2), Topology(4, 3))


CASES = [(name, topo) for name in NAMES for topo in _topologies(name)]


def _through(schedule, send, size):
    """What the schedule backends do (schedule_base._alltoall_call): send's blocks to their places, the
    rounds, the blocks out to the receive buffers."""
    world = schedule.world
    working = [np.full(schedule.count, -1, dtype=send[0].dtype) for _ in range(world)]
    for r in range(world):
        for d in range(world):
            lo, _ = schedule.blocks[r][d]
            working[r][lo:lo + size] = send[r][d * size:(d + 1) * size]
    run(schedule, working)
    return [np.concatenate([working[r][schedule.blocks[s][r][0]:][:size] for s in range(world)]) for r in range(world)]


@pytest.mark.parametrize("name,topo", CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_every_block_lands_where_the_collective_table_expects(name, topo):
    world, size = topo.world, 7
    count = size * world
    schedule = A.build("alltoall", name, topo, count, count * 4)
    verify(schedule)  # symbolic: rank d's place for s's block holds s's input, nothing else
    plan = C.plan("alltoall", count * 4, C.DTYPES["int32"], world)
    pattern = C.make_pattern(C.DTYPES["int32"], None, world)
    send = [C.input_values(pattern, r, 0, plan.send_count) for r in range(world)]
    recv = _through(schedule, send, size)
    for r in range(world):
        for segment in C.expected_segments(pattern, plan, r):
            want = C.periodic(segment.source, segment.offset, segment.count)
            assert np.array_equal(recv[r][segment.start:segment.start + segment.count], want), (name, topo, r)


def _sent_blocks(schedule, rank, size):
    return schedule.bytes_sent(rank, 1) // size


@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_pairwise_rounds_bytes_and_no_hazards(world):
    size = 3
    schedule = A.build("alltoall", "pairwise", Topology(1, world), size * world, 0)
    assert schedule.steps == world - 1 and schedule.count == 2 * world * size  # twice the buffer: no hazards
    assert all(_sent_blocks(schedule, r, size) == world - 1 for r in range(world))
    assert all(len(rnd) == world and not hazards(rnd) for rnd in schedule.rounds)
    assert {(t.src, t.dst) for t in schedule.rounds[0]} == {(r, (r + 1) % world) for r in range(world)}


@pytest.mark.parametrize("world", [2, 3, 4, 5, 7, 8, 16])
def test_bruck_rounds_and_bytes(world):
    size = 2
    schedule = A.build("alltoall", "bruck", Topology(1, world), size * world, 0)
    rounds = math.ceil(math.log2(world))
    assert schedule.steps == rounds and schedule.count == world * size
    per_round = [sum(1 for j in range(1, world) if j >> k & 1) for k in range(rounds)]  # places with bit k set
    assert all(_sent_blocks(schedule, r, size) == sum(per_round) for r in range(world))
    if world & (world - 1) == 0:
        assert sum(per_round) == world // 2 * rounds
    assert all(rnd and hazards(rnd) for rnd in schedule.rounds)  # in place: executors stage (module doc)


@pytest.mark.parametrize("nodes,local", [(1, 4), (2, 1), (2, 2), (2, 3), (3, 2)])
def test_hier_rounds_and_bytes_per_level(nodes, local):
    size, topo = 5, Topology(nodes, local)
    schedule = A.build("alltoall", "hier", topo, size * topo.world, 0)
    assert schedule.steps == (local - 1) + (nodes - 1)
    inside = [t for rnd in schedule.rounds for t in rnd if topo.node_of(t.src) == topo.node_of(t.dst)]
    across = [t for rnd in schedule.rounds for t in rnd if topo.node_of(t.src) != topo.node_of(t.dst)]
    for r in range(topo.world):
        assert sum(t.count for t in inside if t.src == r) == (local - 1) * nodes * size
        assert sum(t.count for t in across if t.src == r) == (nodes - 1) * local * size
        # across nodes, one message per peer node carrying the L blocks gathered for it
        assert sorted(t.count for t in across if t.src == r) == [local * size] * (nodes - 1)


def test_a_lying_layout_or_a_misrouted_block_is_caught():
    schedule = A.build("alltoall", "pairwise", Topology(1, 4), 12, 48)
    blocks = [list(row) for row in schedule.blocks]
    blocks[0][1], blocks[0][2] = blocks[0][2], blocks[0][1]  # rank 0's input placed where the rounds do not look
    with pytest.raises(ScheduleError, match="rank [12]"):
        verify(replace(schedule, blocks=tuple(map(tuple, blocks))))
    overlapping = [list(row) for row in schedule.blocks]
    overlapping[1][3] = overlapping[1][2]
    with pytest.raises(ScheduleError, match="rank 1's input blocks overlap"):
        verify(replace(schedule, blocks=tuple(map(tuple, overlapping))))
    first = tuple(Transfer(t.src, (t.dst + 1) % 4 if t.src == 0 else t.dst, t.chunk, False)
                  for t in schedule.rounds[0])
    with pytest.raises(ScheduleError):
        verify(replace(schedule, rounds=(first, *schedule.rounds[1:])))
    with pytest.raises(ScheduleError, match="not 4 x 4"):
        verify(replace(schedule, blocks=schedule.blocks[:3]))
