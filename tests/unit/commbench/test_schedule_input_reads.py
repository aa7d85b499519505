"""schedule.input_reads: out of place without the copy of the input into the working buffer. Run with
its reads (a transfer reads its source's chunk, and a reduce its destination's, from the rank's input
where it says so) on working buffers that hold garbage at first, and with pushes (pushed_ahead) as the
shm executor runs them, every schedule it accepts ends with the interpreter's result on every rank."""
import numpy as np
import pytest

from commbench import algorithms as A
from commbench.schedule import Transfer, input_reads, pipelined, pushed_ahead, run
from commbench.topology import Topology


def _apply(inputs, working, t: Transfer, flags: tuple[bool, bool]) -> None:
    lo, hi = t.chunk
    src = (inputs if flags[0] else working)[t.src][lo:hi]
    if t.reduce:
        working[t.dst][lo:hi] = (inputs if flags[1] else working)[t.dst][lo:hi] + src
    else:
        working[t.dst][lo:hi] = src


def _run_reading_inputs(schedule, inputs, reads, ahead, rng) -> list[np.ndarray]:
    """Each rank's pulls, then its pushes (each with the reads of the round it came from), the ranks'
    steps interleaved at random; no round here has hazards (input_reads refuses them)."""
    working = [np.full(schedule.count, np.nan) for _ in inputs]
    for k, rnd in enumerate(schedule.rounds):
        early = set(ahead[k - 1]) if k else set()
        queues = [[(t, reads[k][t]) for t in rnd if t.dst == r and t not in early] +
                  [(t, reads[k + 1][t]) for t in ahead[k] if t.src == r] for r in range(schedule.world)]
        while any(queues):
            queue = queues[rng.choice([r for r, q in enumerate(queues) if q])]
            _apply(inputs, working, *queue.pop(0))
    return working


def _schedules():
    for name in A.TABLE["allreduce"]:
        for world in (2, 3, 4, 5, 8):
            for topo in [Topology(1, world)] + ([Topology(2, world // 2)] if world % 2 == 0 else []):
                yield A.build("allreduce", name, topo, 24 * world + 5, 4 * (24 * world + 5))


SCHEDULES = list(_schedules())


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"{s.name}-{s.world}-{s.rounds and len(s.rounds)}"
                                                     for s in SCHEDULES])
@pytest.mark.parametrize("slices", [1, 3])
def test_reading_the_inputs_gives_the_interpreters_result(schedule, slices):
    schedule = pipelined(schedule, slices) if schedule.name == "ring" else schedule
    reads = input_reads(schedule)
    if reads is None:
        assert schedule.name == "oneshot" or schedule.world == 1, f"{schedule.name} refused"
        return
    rng = np.random.default_rng(slices)
    inputs = [rng.integers(-1 << 20, 1 << 20, schedule.count).astype(np.float64) for _ in range(schedule.world)]
    want = run(schedule, [b.copy() for b in inputs])
    for seed in range(3):
        got = _run_reading_inputs(schedule, inputs, reads, pushed_ahead(schedule), np.random.default_rng(seed))
        for rank in range(schedule.world):
            np.testing.assert_array_equal(got[rank], want[rank], err_msg=f"rank {rank}, interleaving {seed}")


def test_a_second_reduce_into_a_chunk_in_one_round_reads_the_first_ones_result():
    """The tree's parent adds both children's pieces in one round: only the first reads the input."""
    tree = A.build("allreduce", "tree", Topology(1, 3), 30, 120)
    reads = input_reads(tree)
    into_root = [(t, reads[0][t]) for t in tree.rounds[0] if t.dst == 0 and t.reduce]
    assert len(into_root) == 2 and into_root[0][1][1] is True and into_root[1][1][1] is False


def test_what_cannot_read_its_inputs():
    assert input_reads(A.build("allreduce", "oneshot", Topology(1, 3), 30, 120)) is None  # a hazard round
    assert input_reads(A.build("allreduce", "ring", Topology(1, 1), 30, 120)) is None  # nothing written: copy
    ring = input_reads(A.build("allreduce", "ring", Topology(1, 2), 10, 40))
    assert all(flags == (True, True) for flags in ring[0].values())  # the reduce reads both inputs
    assert all(flags == (False, False) for flags in ring[1].values())  # the all-gather copies results
