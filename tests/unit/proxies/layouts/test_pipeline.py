"""Pipeline schedules: each order runs every pass once, and the step and bubble that follow from the orders are
the closed forms of Narayanan et al. 2021 (section 2.2) where those hold."""
import pytest

from commbench.proxies.layouts.pipeline import Pass, in_flight, order, run


@pytest.mark.parametrize("schedule,pp,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1),
                                             ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3),
                                             ("interleaved", 4, 4, 2)])
def test_every_pass_once_and_each_backward_after_its_forward(schedule, pp, m, v):
    for stage in range(pp):
        passes = order(schedule, pp, stage, m, v)
        wanted = {(kind, i, c) for kind in "FB" for i in range(m) for c in range(v)}
        assert sorted((p.kind, p.microbatch, p.chunk) for p in passes) == sorted(wanted)
        seen = set()
        for p in passes:
            assert p.kind == "F" or ("F", p.microbatch, p.chunk) in seen
            seen.add((p.kind, p.microbatch, p.chunk))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(2, 1), (4, 4), (4, 16), (8, 3)])
def test_gpipe_and_1f1b_take_m_plus_pp_minus_1_slots(schedule, pp, m):
    step = run(schedule, pp, m, [10.0] * pp, [20.0] * pp)
    assert step.step_us == pytest.approx((m + pp - 1) * 30.0)
    assert step.bubble == pytest.approx((pp - 1) / (m + pp - 1))


@pytest.mark.parametrize("pp,m,v", [(4, 8, 2), (4, 16, 4), (2, 4, 3), (8, 8, 2)])
def test_interleaving_divides_the_bubble_by_the_virtual_stages(pp, m, v):
    forward, backward = 10.0, 20.0  # a rank's whole share of the model, per micro-batch
    step = run("interleaved", pp, m, [forward / v] * (pp * v), [backward / v] * (pp * v), virtual_stages=v)
    assert step.step_us == pytest.approx(m * 30.0 + (pp - 1) * 30.0 / v)


def test_transfers_between_stages_lengthen_the_fill_and_drain():
    """GPipe pays each hop once filling and once draining; 1F1B at least that, and more where a stage's steady
    state waits for a gradient's round trip."""
    plain = run("gpipe", 4, 8, [10.0] * 4, [20.0] * 4).step_us
    assert run("gpipe", 4, 8, [10.0] * 4, [20.0] * 4, transfer_us=1.0).step_us == pytest.approx(plain + 2 * 3 * 1.0)
    assert run("1f1b", 4, 8, [10.0] * 4, [20.0] * 4, transfer_us=1.0).step_us >= plain + 2 * 3 * 1.0


def test_a_slow_stage_sets_the_pace():
    step = run("1f1b", 4, 16, [10.0, 10.0, 20.0, 10.0], [20.0, 20.0, 40.0, 20.0])
    assert step.step_us >= 16 * 60.0 and step.busy_us[2] == pytest.approx(16 * 60.0)


def test_activations_held_follow_from_the_order():
    assert in_flight(order("gpipe", 4, 0, 8)) == 8
    assert [in_flight(order("1f1b", 4, s, 8)) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight(order("1f1b", 4, 0, 2)) == 2
    # interleaved: (pp - 1) x 2 + (v - 1) x pp warm-up chunks, and one more before the first backward
    assert in_flight(order("interleaved", 4, 0, 8, 2)) == 3 * 2 + 4 + 1


def test_unknown_schedule_and_wrong_stage_count():
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        order("zigzag", 2, 0, 2)
    with pytest.raises(ValueError, match="need 4 forward"):
        run("1f1b", 4, 2, [1.0] * 3, [1.0] * 3)
    assert order("1f1b", 2, 1, 2) == [Pass("F", 0), Pass("B", 0), Pass("F", 1), Pass("B", 1)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_held_at_once_is_what_the_order_holds(schedule):
    """The closed form the layout search uses, against the order itself, stage by stage."""
    from commbench.proxies.layouts.pipeline import held_at_once, in_flight, order

    for pp in (1, 2, 3, 4, 8):
        for m in (1, 2, 4, 8, 12, 16):
            for v in ((2, 3) if schedule == "interleaved" else (1,)):
                for stage in range(pp):
                    assert held_at_once(schedule, pp, stage, m, v) == in_flight(order(schedule, pp, stage, m, v)), \
                        (schedule, pp, stage, m, v)
