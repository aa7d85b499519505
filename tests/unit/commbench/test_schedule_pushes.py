"""schedule.pushed_ahead: the copies a source may run into its destination's buffer at the end of the
round before. Run that way (each rank's pulls, then its pushes, the ranks' steps interleaved in any
order), every algorithm of the table must leave every buffer exactly as the reference interpreter
does; a push the rule refuses would not."""
import numpy as np
import pytest

from commbench import algorithms as A
from commbench.schedule import Schedule, Transfer, hazards, pipelined, pushed_ahead, run
from commbench.topology import Topology


def _apply(buffers: list[np.ndarray], t: Transfer, payload: np.ndarray | None = None) -> None:
    data = buffers[t.src][t.chunk[0]:t.chunk[1]] if payload is None else payload
    view = buffers[t.dst][t.chunk[0]:t.chunk[1]]
    if t.reduce:
        np.add(view, data, out=view)
    else:
        view[...] = data


def _run_with_pushes(schedule: Schedule, buffers: list[np.ndarray], ahead, rng) -> list[np.ndarray]:
    """The shm executor's order: in round k rank r runs its pulls (transfers into r not pushed in round
    k - 1), then its pushes (ahead[k] from r); the ranks' steps interleave at random, each reading the
    state as it is then. Rounds with hazards run as the interpreter runs them (staged)."""
    for k, rnd in enumerate(schedule.rounds):
        early = set(ahead[k - 1]) if k else set()
        if hazards(rnd):
            assert not early and not ahead[k]
            payloads = [buffers[t.src][t.chunk[0]:t.chunk[1]].copy() for t in rnd]
            for t, data in zip(rnd, payloads):
                _apply(buffers, t, data)
            continue
        queues = [[t for t in rnd if t.dst == r and t not in early] + [t for t in ahead[k] if t.src == r]
                  for r in range(schedule.world)]
        while any(queues):
            queue = queues[rng.choice([r for r, q in enumerate(queues) if q])]
            _apply(buffers, queue.pop(0))
    return buffers


def _schedules():
    for collective, table in A.TABLE.items():
        for name in table:
            for world in (2, 3, 4, 5, 8):
                for topo in ([Topology(1, world)] + ([Topology(2, world // 2)] if world % 2 == 0 else [])):
                    count = 24 * world + 5 if collective not in ("allgather", "reduce_scatter") else 24 * world
                    yield A.build(collective, name, topo, count, count * 4, root=world - 1)


SCHEDULES = list(_schedules())


@pytest.mark.parametrize("schedule", SCHEDULES, ids=[f"{s.collective}-{s.name}-{s.world}" for s in SCHEDULES])
@pytest.mark.parametrize("slices", [1, 3])
def test_pushed_execution_leaves_every_buffer_as_the_interpreter(schedule, slices):
    schedule = pipelined(schedule, slices) if schedule.name == "ring" else schedule
    ahead = pushed_ahead(schedule)
    rng = np.random.default_rng(slices)
    inputs = [rng.integers(-1 << 20, 1 << 20, schedule.count, dtype=np.int64) for _ in range(schedule.world)]
    want = run(schedule, [b.copy() for b in inputs])
    for seed in range(4):
        got = _run_with_pushes(schedule, [b.copy() for b in inputs], ahead, np.random.default_rng(seed))
        for rank in range(schedule.world):
            np.testing.assert_array_equal(got[rank], want[rank], err_msg=f"rank {rank}, interleaving {seed}")


def test_a_two_rank_ring_becomes_one_round_of_reduce_and_push():
    ring = A.build("allreduce", "ring", Topology(1, 2), 10, 40)
    ahead = pushed_ahead(ring)
    assert set(ahead[0]) == set(ring.rounds[1]) and ahead[1] == ()
    assert all(not t.reduce for t in ahead[0])
    # on more ranks the allgather's steps run one round early, as pushes (the first beside the last reduce)
    ring5 = A.build("allreduce", "ring", Topology(1, 5), 50, 200)
    assert [len(a) for a in pushed_ahead(ring5)] == [0, 0, 0, 5, 5, 5, 5, 0]


def test_a_push_that_another_transfer_would_read_is_refused():
    """Rank 0 reduces X while 3 copies 2's X, then 0 sends X to 2: pushed a round early, 0 -> 2 could
    overwrite 2's X before 3 has read it."""
    x = (0, 1)
    schedule = Schedule("made", "allreduce", 4, 1, ((Transfer(1, 0, x, True), Transfer(2, 3, x, False)),
                                                   (Transfer(0, 2, x, False),)))
    assert pushed_ahead(schedule) == ((), ())
    forced = (schedule.rounds[1], ())
    inputs = [np.array([v]) for v in (1, 10, 100, 1000)]
    want = run(schedule, [b.copy() for b in inputs])
    assert want[3][0] == 100 and want[2][0] == 11
    got = [_run_with_pushes(schedule, [b.copy() for b in inputs], forced, np.random.default_rng(seed))[3][0]
           for seed in range(16)]
    assert 11 in got  # some order hands rank 3 the pushed value: the refused push would be a race


def test_rounds_with_hazards_push_nothing():
    oneshot = A.build("allreduce", "oneshot", Topology(1, 4), 64, 256)
    assert all(a == () for a in pushed_ahead(oneshot))
