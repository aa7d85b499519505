"""proxies/traces/calls.py: a step's calls placed on the compute's progress, waits inferred from the
issuing thread's idle time, and the checks that keep a replay from hanging."""
import math
from dataclasses import replace

import pytest

from commbench.proxies.comm_plan import simulate
from commbench.proxies.traces.calls import (
    Busy,
    JobTrace,
    RankTrace,
    TraceCall,
    TraceError,
    TraceStep,
    build_step,
    check_job,
    step_plan,
)


def call(issue, start, end, nbytes=1024, group=(0, 1)):
    return TraceCall("allreduce", nbytes, "float32", "sum", group, "0", issue, start, end)


def test_progress_counts_busy_time_only():
    busy = Busy([(0, 100), (50, 150), (400, 500)])
    assert busy.spans == [(0, 150), (400, 500)]
    assert busy.progress(120) == 120 and busy.progress(300) == 150 and busy.progress(450) == 200
    assert busy.idle(0, 600) == [(150, 400), (500, 600)]


def test_a_call_the_thread_waited_for_is_needed_where_it_stopped():
    busy = Busy([(0, 100), (300, 400)])  # idle 100..300 while the call ran 120..290
    step = build_step(0, 400, busy, [call(100, 120, 290), call(350, 360, 380)])
    first, second = step.calls
    assert first.progress_us == 100 and first.needed_us == 100 and first.exposed_us == pytest.approx(170)
    assert second.progress_us == 150 and math.isinf(second.needed_us)  # the step ended without waiting
    assert step.compute_us == 200 and step.exposed_us == pytest.approx(170)


def test_the_plan_of_a_step_gives_back_its_timeline():
    busy = Busy([(0, 100), (300, 400)])
    step = build_step(0, 400, busy, [call(100, 120, 290)])
    times = simulate(step_plan(step), [170.0])
    assert times.compute_us == 200 and times.exposed_comm_us == pytest.approx(170) and times.step_us == 370
    bare = simulate(step_plan(step, compute=False), [170.0])
    assert bare.compute_us == 0 and bare.step_us == 170


def job(*ranks_calls, world=2):
    return JobTrace(world, tuple(RankTrace(r, (TraceStep(0, 0, tuple(c)),)) for r, c in enumerate(ranks_calls)),
                    "test")


def test_group_members_that_disagree_are_named():
    check_job(job([call(0, 0, 1)], [call(0, 0, 1)]), "t")
    with pytest.raises(TraceError, match="disagree at its call 1"):
        check_job(job([call(0, 0, 1)], [call(0, 0, 1, nbytes=8)]), "t")
    with pytest.raises(TraceError, match="no trace of rank.* 1"):
        check_job(job([call(0, 0, 1, group=(0,))]), "t")


def test_a_call_that_ended_while_the_thread_computed_was_not_waited_for():
    busy = Busy([(0, 100), (150, 2100)])  # busy again at 150, the call done at 300
    step = build_step(0, 2100, busy, [call(100, 120, 1200)])
    (only,) = step.calls
    assert math.isinf(only.needed_us) and only.exposed_us == 0
    assert step.compute_us == 2100  # the gap no call ended in is the thread's own work


def test_issuing_is_not_compute_and_time_between_ops_is():
    busy = Busy([(0, 100), (110, 200), (215, 300)])  # 10 us between two ops: Python, not a wait
    step = build_step(0, 300, busy, [call(200, 210, 260)], issuing=[(200, 215)])
    assert step.compute_us == 300 - 15 and step.calls[0].progress_us == 200


@pytest.mark.parametrize("group,said", [
    ((0, 0), "'group' is [0, 0]; it must be distinct ranks"),
    ((-1, 0), "group [-1, 0] names ranks beyond the job's 2"),
    ((1,), "rank 0 issues a call on group [1], which it is not in"),
    ((), "'group' is []"),
])
def test_a_group_a_replay_cannot_make_is_refused_before_any_rank_starts(group, said):
    """Groups [0, 0] and [-1, 0] were accepted, and a rank issuing on a group it is not in failed in the ranks
    with an AttributeError (issue 48, item 21). The error names the event the call was read from."""
    bad = replace(call(0, 0, 1, group=group), where="r0.json: event 7 ('record_param_comms')")
    with pytest.raises(TraceError) as caught:
        check_job(job([bad], [call(0, 0, 1, group=(1,))] if group == (1,) else []), "t")
    assert str(caught.value).startswith("r0.json: event 7 ('record_param_comms'): ") and said in str(caught.value)


def test_a_call_without_an_event_is_named_by_its_rank_and_place():
    bad = replace(call(0, 0, 1), nbytes=-8)
    with pytest.raises(TraceError, match=r"^t: rank 1's call 2: 'nbytes' is -8"):
        check_job(job([call(0, 0, 1), call(0, 0, 1)], [call(0, 0, 1), bad]), "t")
    with pytest.raises(TraceError, match="'collective' is 'sendrecv'; a replay issues allreduce"):
        check_job(job([replace(call(0, 0, 1), collective="sendrecv")], []), "t")


def test_calls_past_the_bound_are_one_line(monkeypatch):
    from commbench.proxies.traces import calls as trace_calls

    monkeypatch.setattr(trace_calls, "MAX_CALLS", 3)
    check_job(job([call(0, 0, 1)] * 3, [call(0, 0, 1)] * 3), "t")
    with pytest.raises(TraceError, match="rank 0 issues 4 calls; a replay takes at most 3"):
        check_job(job([call(0, 0, 1)] * 4, [call(0, 0, 1)] * 4), "t")


def test_calls_spanning_many_waits_give_the_same_exposed_time_from_the_running_total(monkeypatch):
    """Past EXACT_GAPS a call's exposed time comes from the waits' running total (a crafted trace's calls x waits
    took minutes); it is the sum the gaps give one by one."""
    from commbench.proxies.traces import calls as trace_calls

    ops = Busy([(100.0 * i, 100.0 * i + 40.0) for i in range(200)])  # idle 60 us after every op
    calls = [call(100.0 * i + 40.0, 100.0 * i + 45.0, 100.0 * i + 80.0 + 100.0 * (i % 7)) for i in range(150)]
    exact = build_step(0.0, 20000.0, ops, calls)
    monkeypatch.setattr(trace_calls, "EXACT_GAPS", 0)
    totals = build_step(0.0, 20000.0, ops, calls)
    assert any(c.exposed_us > 60 for c in exact.calls) and exact.exposed_us == totals.exposed_us
    assert [c.exposed_us for c in totals.calls] == pytest.approx([c.exposed_us for c in exact.calls])
