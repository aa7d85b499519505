"""--backend cuda's host side without a GPU: schedules cut into kernel launches, launch tables
and pointers, grid sizes and block spans, emulated on NumPy buffers block by block, in
several orders, and compared with what the sim backend computes for the same schedule."""
import itertools

import numpy as np
import pytest

from commbench import algorithms as A
from commbench.backends.cuda import plan as P
from commbench.backends.sim import RankArrays, SimBackend
from commbench.schedule import ScheduleError, hazards, verify
from commbench.topology import Topology

ORDERS = ("forward", "reverse", "shuffle")


def build(collective, name, topo, count):
    return A.build(collective, name, topo, count, count * 4, root=topo.world - 1)


def sim_result(schedule, topo, inputs, op):
    """What the sim backend's executor leaves in every rank's working buffer."""
    arrays = RankArrays([a.copy() for a in inputs])
    SimBackend(topo.world, topo, schedule.name).executor(schedule, arrays, op)()
    return arrays.arrays


def emulated(schedule, inputs, op, groups, order, itemsize, fast_kernels=True):
    """The launch tables of one program per group, run on NumPy copies of the inputs."""
    buffers = {}
    for rank, values in enumerate(inputs):
        buffers[(rank, P.WORK)] = values.copy()
        buffers[(rank, P.STAGE)] = np.full_like(values, -1)
    memory = P.AddressSpace(buffers, itemsize)
    programs = [P.program(schedule, group, fast_kernels) for group in groups]
    P.emulate(programs, memory, op, schedule.world, order=order)
    return [buffers[(rank, P.WORK)] for rank in range(len(inputs))]


def random_inputs(world, count, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-3, 4, count).astype(np.float64) for _ in range(world)]


CASES = [(c, name) for c, table in A.TABLE.items() for name in table]  # twoshot (GPU-only) included


@pytest.mark.parametrize("collective,name", CASES)
@pytest.mark.parametrize("world,count", [(2, 4099), (3, 70001), (5, 7), (8, 33333)])
def test_launch_tables_reproduce_sim(collective, name, world, count):
    """Virtual ranks (one launch for every rank) and one stream per rank (peer, ipc), in
    every block order, at element sizes 1, 2 and 8 (spans and alignment differ)."""
    topo = Topology(1, world)
    schedule = build(collective, name, topo, count)
    inputs = random_inputs(world, schedule.count)  # alltoall: its block layout, not count
    for op in ("sum", "max"):
        want = sim_result(schedule, topo, inputs, op)
        for groups, order, itemsize in itertools.product(([list(range(world))], [[r] for r in range(world)]),
                                                         ORDERS, (1, 2, 8)):
            got = emulated(schedule, inputs, op, groups, order, itemsize)
            for rank in range(world):
                np.testing.assert_array_equal(got[rank], want[rank], err_msg=f"{op} {order} {itemsize} B rank {rank}")


@pytest.mark.parametrize("name", ["hier", "ring", "rhd"])
def test_several_nodes_and_prod(name):
    topo = Topology(2, 3)
    schedule = build("allreduce", name, topo, 5000)
    inputs = [np.where(a > 0, 2.0, 1.0) for a in random_inputs(6, 5000, seed=1)]
    want = sim_result(schedule, topo, inputs, "prod")
    for order in ORDERS:
        got = emulated(schedule, inputs, "prod", [[r] for r in range(6)], order, 4)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_generic_round_kernel_also_runs_oneshot_and_twoshot():
    """Without the dedicated kernels, the same schedules through schedule_round agree too."""
    topo = Topology(1, 4)
    for name in ("oneshot", "twoshot"):
        schedule = build("allreduce", name, topo, 10007)
        inputs = random_inputs(4, 10007)
        want = sim_result(schedule, topo, inputs, "sum")
        got = emulated(schedule, inputs, "sum", [[0, 1, 2, 3]], "reverse", 4, fast_kernels=False)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_without_staging_oneshot_in_place_races():
    """The emulation catches a race: one-shot writing in place while peers still read."""
    topo = Topology(1, 4)
    schedule = build("allreduce", "oneshot", topo, 4096)
    inputs = random_inputs(4, 4096)
    want = sim_result(schedule, topo, inputs, "sum")
    tasks, _ = P.plan_round(schedule.rounds[0])
    unstaged = tuple(P.Task(P.Ref(t.out.rank, P.WORK, t.out.offset), t.ins, t.count) for t in tasks)
    buffers = {(r, P.WORK): inputs[r].copy() for r in range(4)}
    memory = P.AddressSpace(buffers, 4)
    P.emulate([[P.RoundLaunch(unstaged)]], memory, "sum", 4)
    assert not all(np.array_equal(buffers[(r, P.WORK)], want[r]) for r in range(4))


def test_rounds_become_launches_and_barriers():
    topo = Topology(1, 4)
    ring = P.program(build("allreduce", "ring", topo, 1000), [0, 1, 2, 3])
    launches = [s for s in ring if isinstance(s, P.RoundLaunch)]
    assert len(launches) == 2 * (4 - 1) and all(len(s.tasks) == 4 for s in launches)
    assert sum(isinstance(s, P.Barrier) for s in ring) == len(launches) + 1 and isinstance(ring[0], P.Barrier)
    assert all(len(t.ins) == 2 and t.out.buffer == P.WORK for s in launches[:3] for t in s.tasks)  # reduce: own + peer
    assert all(len(t.ins) == 1 for s in launches[3:] for t in s.tasks)  # all-gather: copies
    assert [type(s) for s in P.program(build("allreduce", "oneshot", topo, 1000), [2])] == \
        [P.Barrier, P.AllreduceLaunch, P.Barrier, P.RoundLaunch, P.Barrier]
    assert [s.phase for s in P.program(build("allreduce", "twoshot", topo, 1000), [1])
            if isinstance(s, P.AllreduceLaunch)] == [0, 1]


def test_programs_of_every_group_meet_at_the_same_barriers():
    topo = Topology(2, 2)
    for collective, name in CASES:
        schedule = build(collective, name, topo, 999)
        shapes = {tuple(isinstance(s, P.Barrier) for s in P.program(schedule, [r])) for r in range(4)}
        assert len(shapes) == 1, (collective, name)


def test_oneshot_round_fuses_every_input_and_stages_where_peers_read():
    schedule = build("allreduce", "oneshot", Topology(1, 4), 1000)
    tasks, writeback = P.plan_round(schedule.rounds[0])
    assert len(tasks) == 4 and all(len(t.ins) == 4 and t.out.buffer == P.STAGE for t in tasks)
    assert {t.out.rank for t in writeback} == hazards(schedule.rounds[0]) == {0, 1, 2, 3}


def test_overlapping_reductions_are_cut_into_disjoint_pieces():
    from commbench.schedule import Transfer

    rnd = (Transfer(1, 0, (0, 10), True), Transfer(2, 0, (5, 20), True), Transfer(3, 2, (0, 4), False))
    tasks, writeback = P.plan_round(rnd)
    pieces = {(t.out.rank, t.out.offset, t.count): tuple(r.rank for r in t.ins) for t in tasks}
    assert pieces == {(0, 0, 5): (0, 1), (0, 5, 5): (0, 1, 2), (0, 10, 10): (0, 2), (2, 0, 4): (3,)}
    assert not writeback  # rank 2 is read at [5, 20) and written at [0, 4): no overlap


@pytest.mark.parametrize("world", range(1, 10))
def test_twoshot_schedule_is_a_correct_hazard_free_allreduce(world):
    for count in (1, world, 3 * world + 1, 1000):
        schedule = A.twoshot_allreduce(Topology(1, world), count)
        verify(schedule)
        assert all(not hazards(rnd) for rnd in schedule.rounds)
        assert schedule.steps == (2 if world > 1 else 0)


def test_twoshot_is_the_tables_gpu_only_entry():
    assert {name for name, e in A.TABLE["allreduce"].items() if e.gpu_only} == {"twoshot"}
    assert "twoshot" in A.available("allreduce", gpu=True) and "twoshot" not in A.available("allreduce")


def test_a_broken_twoshot_fails_verification():
    schedule = A.twoshot_allreduce(Topology(1, 3), 30)
    first = tuple(t for t in schedule.rounds[0] if t.src != 2)  # rank 2's contribution lost
    with pytest.raises(ScheduleError):
        verify(type(schedule)(schedule.name, schedule.collective, 3, 30, (first, schedule.rounds[1])))


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_block_spans_cover_each_element_once_and_align_every_block_but_the_first(itemsize):
    for misalign, count, n_blocks in itertools.product(range(0, 16, itemsize), (1, 3, 17, 1000, 4097), (1, 2, 7, 64)):
        address = (1 << 20) + misalign
        spans = [P.block_span(address, count, n_blocks, b, itemsize) for b in range(n_blocks)]
        covered = np.zeros(count, dtype=int)
        for begin, end in spans:
            covered[begin:end] += 1
        assert (covered == 1).all()
        assert all((address + b * itemsize) % 16 == 0 for b, e in spans[1:] if b < e)


def test_assign_blocks_shares_the_budget_by_bytes():
    cfg = P.LaunchConfig(bytes_per_block=1000, max_blocks=100)
    blocks = P.assign_blocks([50_000, 25_000, 10], [10_000, 10_000, 1], cfg)
    assert blocks == [50, 25, 1]  # a budget of 76 blocks (75 010 bytes at 1000 per block), in proportion
    assert P.assign_blocks([10**9], [3], cfg) == [3]  # never more blocks than packs
    assert cfg.blocks_for(1) == 1 and cfg.blocks_for(10**12) == 100


def test_pack_round_tables():
    tasks = [P.Task(P.Ref(0, P.WORK, 4), (P.Ref(0, P.WORK, 4), P.Ref(1, P.WORK, 4)), 100),
             P.Task(P.Ref(1, P.STAGE, 0), (P.Ref(0, P.WORK, 0),), 8)]
    bases = {(0, P.WORK): 1 << 20, (1, P.WORK): 2 << 20, (1, P.STAGE): 3 << 20}
    entries, inputs, grid = P.pack_round(tasks, lambda r: bases[(r.rank, r.buffer)] + 4 * r.offset, 4, P.LaunchConfig())
    assert entries.dtype == P.ENTRY_DTYPE and entries.tobytes()[:8] == np.uint64((1 << 20) + 16).tobytes()
    assert list(inputs) == [(1 << 20) + 16, (2 << 20) + 16, 1 << 20]
    assert list(entries["in_offset"]) == [0, 2] and list(entries["n_in"]) == [2, 1]
    assert list(entries["first_block"]) == [0, 1] and grid == 2 and list(entries["count"]) == [100, 8]


@pytest.mark.parametrize("name", ["oneshot", "twoshot"])
@pytest.mark.parametrize("world,count", [(2, 4099), (3, 70001), (8, 33333)])
def test_out_of_place_reads_the_inputs_without_a_copy_or_staging(name, world, count):
    """Out of place (issue 36: oneshot 13.8 us against 5.7 in place on an H200), the first launch
    reads every rank's input (INPUT) and writes the outputs: the result of the in-place program run
    on a copy of the inputs, with the inputs untouched and, for oneshot, no staging nor write-back."""
    topo = Topology(1, world)
    schedule = build("allreduce", name, topo, count)
    inputs = random_inputs(world, count, seed=3)
    want = sim_result(schedule, topo, inputs, "sum")
    for groups, order in itertools.product(([list(range(world))], [[r] for r in range(world)]), ORDERS):
        buffers = {}
        for rank, values in enumerate(inputs):
            buffers[(rank, P.INPUT)], buffers[(rank, P.WORK)] = values.copy(), np.full_like(values, -7)
        programs = [P.program(schedule, group, reads_input=True) for group in groups]
        assert not any(map(P.uses_staging, programs)) or name != "oneshot"
        P.emulate(programs, P.AddressSpace(buffers, 4), "sum", world, order=order)
        for rank in range(world):
            np.testing.assert_array_equal(buffers[(rank, P.WORK)], want[rank], err_msg=f"{order} rank {rank}")
            np.testing.assert_array_equal(buffers[(rank, P.INPUT)], inputs[rank])
    assert [type(s).__name__ for s in P.program(schedule, list(range(world)), reads_input=True)].count(
        "AllreduceLaunch") == (1 if name == "oneshot" else 2)


def test_only_the_allreduce_kernels_read_inputs():
    ring = build("allreduce", "ring", Topology(1, 4), 100)
    assert not P.reads_inputs(ring) and P.reads_inputs(build("allreduce", "oneshot", Topology(1, 4), 100))
    with pytest.raises(ValueError, match="cannot read its inputs"):
        P.program(ring, [0, 1, 2, 3], reads_input=True)
