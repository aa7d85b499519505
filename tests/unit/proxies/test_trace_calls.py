"""proxies/trace_calls.py: a step's calls placed on the compute's progress, waits inferred from the
issuing thread's idle time, and the checks that keep a replay from hanging."""
import math

import pytest

from commbench.proxies.comm_plan import simulate
from commbench.proxies.trace_calls import (
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
