"""The step timeline: the pure overlap arithmetic with exact values, and the executed form
(run_step) driven by a fake clock and a fake communication channel, which must agree with it."""
import pytest

from commbench.proxies.buckets import assign
from commbench.proxies.profile import Profile, TensorSpec
from commbench.proxies.timeline import StepPlan, overlap, plan_step, run_step


class FakeClock:
    """Virtual time: compute advances it; nothing else does unless the channel says so."""

    def __init__(self):
        self.t = 1000.0  # an arbitrary origin: results must be relative to the step start
        self.base = self.t

    def now_us(self):
        return self.t

    def begin(self):
        self.base = self.t

    def compute_until(self, progress_us):
        self.t = max(self.t, self.base + progress_us)


class FakeChannel:
    """Allreduce i takes durations[i] on one serial stream; wait_all advances the clock to the last end."""

    def __init__(self, clock, durations):
        self.clock, self.durations = clock, durations
        self.launched = []
        self.free_at = 0.0

    def launch(self, bucket):
        start = max(self.clock.now_us(), self.free_at)
        self.free_at = start + self.durations[bucket]
        self.launched.append((start, self.free_at))

    def wait_all(self):
        out, self.launched = self.launched, []
        self.clock.t = max(self.clock.t, self.free_at)
        return out


PLAN = StepPlan(forward_us=100.0, backward_us=200.0, optimizer_us=10.0, bucket_ready_us=(50.0, 120.0, 200.0),
                bucket_nbytes=(1, 2, 3))


def test_overlap_exact_values_hidden_communication():
    t = overlap(PLAN, [30.0, 30.0, 20.0])
    # buckets start at 150, 220, 300 (each when ready; the stream is free); last ends 320
    assert t.comm_intervals == ((150.0, 180.0), (220.0, 250.0), (300.0, 320.0))
    assert t.step_us == 330.0 and t.compute_us == 310.0 and t.exposed_comm_us == 20.0 and t.comm_us == 80.0


def test_overlap_exact_values_queued_communication():
    t = overlap(PLAN, [100.0, 100.0, 50.0])
    # 150-250, then 250-350 (queued behind the first), then 350-400
    assert t.comm_intervals == ((150.0, 250.0), (250.0, 350.0), (350.0, 400.0))
    assert t.step_us == 410.0 and t.exposed_comm_us == 100.0


def test_no_communication_costs_nothing():
    t = overlap(PLAN, [0.0, 0.0, 0.0])
    assert t.step_us == PLAN.compute_us and t.exposed_comm_us == 0.0


@pytest.mark.parametrize("durations", [[30.0, 30.0, 20.0], [100.0, 100.0, 50.0], [0.0, 500.0, 0.0], [1.0, 2.0, 3.0]])
def test_executed_step_matches_the_pure_timeline(durations):
    clock = FakeClock()
    executed = run_step(PLAN, clock, FakeChannel(clock, durations))
    expected = overlap(PLAN, durations)
    assert executed.step_us == pytest.approx(expected.step_us)
    assert executed.exposed_comm_us == pytest.approx(expected.exposed_comm_us)
    assert executed.other_us == pytest.approx(0.0, abs=1e-9)
    flat = [t for pair in executed.comm_intervals for t in pair]
    assert flat == pytest.approx([t for pair in expected.comm_intervals for t in pair])


class LateClock(FakeClock):
    """A rank descheduled while it computes: the `call`-th wait for compute progress `at_us` returns
    `late_us` of wall time after that compute is done."""

    def __init__(self, late_us, at_us, call=1):
        super().__init__()
        self.late_us, self.at_us, self.calls_left = late_us, at_us, call

    def compute_until(self, progress_us):
        super().compute_until(progress_us)
        if progress_us == self.at_us:
            self.calls_left -= 1
            if self.calls_left == 0:  # wall time passes, compute makes no progress (a CpuClock's view)
                self.t += self.late_us
                self.base += self.late_us


@pytest.mark.parametrize("durations", [[30.0, 30.0, 20.0], [100.0, 100.0, 50.0], [1.0, 2.0, 3.0]])
def test_time_descheduled_is_other_not_exposed_communication(durations):
    """The wall time a late compute adds is neither compute nor communication: exposed stays within
    the communication measured, and step = compute + exposed + other exactly."""
    pure = overlap(PLAN, durations)
    # late in the forward: everything after moves; the split is the pure one plus 5 ms of other
    clock = LateClock(late_us=5000.0, at_us=PLAN.forward_us)
    t = run_step(PLAN, clock, FakeChannel(clock, durations))
    assert t.exposed_comm_us == pytest.approx(pure.exposed_comm_us) and t.other_us == pytest.approx(5000.0)
    assert t.step_us == pytest.approx(pure.step_us + 5000.0)
    # late after the last launch, before the wait (the backward's end is reached twice: at the last
    # bucket's launch, then before the wait): the allreduces end while the rank is away, none is waited for
    clock = LateClock(late_us=5000.0, at_us=PLAN.forward_us + PLAN.backward_us, call=2)
    t = run_step(PLAN, clock, FakeChannel(clock, durations))
    assert t.exposed_comm_us == 0.0 and t.comm_us == pytest.approx(sum(durations))
    assert t.other_us == pytest.approx(5000.0) and t.step_us == pytest.approx(PLAN.compute_us + 5000.0)
    assert t.compute_us + t.exposed_comm_us + t.other_us == pytest.approx(t.step_us)


def test_pure_timeline_has_no_other_time():
    for durations in ([30.0, 30.0, 20.0], [100.0, 100.0, 50.0]):
        t = overlap(PLAN, durations)
        assert t.other_us == 0.0 and t.compute_us + t.exposed_comm_us == t.step_us


def test_bucket_ready_times_follow_backward_flops():
    tensors = (TensorSpec("a", (1 << 18,), "float32", 100.0, 2), TensorSpec("b", (1 << 18,), "float32", 40.0, 1),
               TensorSpec("c", (1 << 18,), "float32", 10.0, 0))
    profile = Profile("toy", tensors, 50.0, 100.0, (1,), "samples", 1)
    buckets = assign(profile, mode="none")  # c, b, a
    plan = plan_step(profile, buckets, forward_us=7.0, backward_us=1000.0, optimizer_us=3.0)
    assert plan.bucket_ready_us == (100.0, 400.0, 1000.0)
    assert plan.bucket_nbytes == (1 << 20,) * 3 and plan.compute_us == 1010.0


def test_ddp_own_work_is_half_with_the_backward_and_half_after_the_last_allreduce():
    tensors = (TensorSpec("a", (1 << 18,), "float32", 100.0, 2), TensorSpec("b", (1 << 18,), "float32", 40.0, 1),
               TensorSpec("c", (1 << 18,), "float32", 10.0, 0))
    profile = Profile("toy", tensors, 50.0, 100.0, (1,), "samples", 1)
    buckets = assign(profile, mode="none")
    plain = plan_step(profile, buckets, forward_us=10.0, backward_us=1000.0, optimizer_us=5.0)
    ddp = plan_step(profile, buckets, forward_us=10.0, backward_us=1000.0, optimizer_us=5.0, ddp_us=200.0)
    assert ddp.compute_us == plain.compute_us + 200.0
    assert ddp.backward_us == 1100.0 and ddp.optimizer_us == 105.0
    assert ddp.bucket_ready_us == (110.0, 440.0, 1100.0)  # the copies into buckets stretch the backward evenly
    # the copy back runs after the last allreduce: a bucket finishing after the backward is followed by it in full
    late = overlap(ddp, [10.0, 10.0, 400.0])
    assert late.step_us == 10.0 + 1100.0 + 400.0 + 105.0


def test_busy_time_is_the_union_of_intervals():
    from commbench.proxies.timeline import busy_us

    assert busy_us([(0, 10), (5, 15), (20, 30)]) == 25  # two in flight at once count once
    assert busy_us([(20, 30), (0, 10)]) == 20 and busy_us([]) == 0


def test_a_failed_allreduce_reaches_the_step():
    from commbench.proxies.channels import ThreadChannel
    from commbench.proxies.clocks import SleepClock

    def broken():
        raise RuntimeError("Connection closed by peer")
    channel = ThreadChannel([lambda: None, broken], lambda: None, SleepClock())
    channel.launch(0)
    channel.launch(1)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        channel.wait_all()
    channel.launch(0)  # the channel is usable again: nothing of the failed step is left queued
    assert len(channel.wait_all()) == 1
    channel.close()


def test_communication_taking_cpu_from_the_backward_slows_it_by_its_share():
    from commbench.proxies.timeline import compute_with_steal

    plan = StepPlan(forward_us=10.0, backward_us=100.0, optimizer_us=5.0, bucket_ready_us=(20.0, 100.0),
                    bucket_nbytes=(1, 1))
    # nothing taken: the same step as overlap's, to the microsecond
    for comm in ([30.0, 10.0], [200.0, 50.0], [0.0, 0.0]):
        plain, walked = overlap(plan, comm), compute_with_steal(plan, comm, [0.0, 0.0])
        assert walked.step_us == pytest.approx(plain.step_us) and walked.exposed_comm_us == pytest.approx(
            plain.exposed_comm_us) and _flat(walked.comm_intervals) == pytest.approx(_flat(plain.comm_intervals))
    # bucket 0 (ready at 30 us) runs 40 us and takes half a core: the backward does 20 us of work in those 40,
    # so it ends at 30 + 40 + 60 = 130 instead of 110; bucket 1 then runs 130-140, the optimizer to 145
    t = overlap(plan, [40.0, 10.0], [20.0, 0.0])
    assert _flat(t.comm_intervals) == pytest.approx([30.0, 70.0, 130.0, 140.0])
    assert t.step_us == pytest.approx(145.0) and t.exposed_comm_us == pytest.approx(10.0)
    assert t.other_us == pytest.approx(20.0)  # what the allreduce took from the compute
    assert t.compute_us + t.exposed_comm_us + t.other_us == pytest.approx(t.step_us)
    # a whole core taken: the backward stops while bucket 0 runs
    assert overlap(plan, [40.0, 10.0], [40.0, 0.0]).step_us == pytest.approx(10 + 20 + 40 + 80 + 10 + 5)


def _flat(intervals) -> list[float]:
    return [x for pair in intervals for x in pair]


def test_a_bucket_ready_a_hair_after_the_backward_still_ends_the_walk():
    from commbench.proxies.timeline import compute_with_steal

    plan = StepPlan(10.0, 100.0, 5.0, (50.0, 100.0 * (1 + 1e-10)), (1, 1))  # profile rounding past the end
    t = compute_with_steal(plan, [10.0, 10.0], [5.0, 5.0])
    assert t.step_us == pytest.approx(10 + 105 + 10 + 5, rel=1e-6)


def test_an_executed_step_marks_its_compute_on_the_wall_clock():
    """A rank descheduled in its backward: the compute's marks say where on the wall clock (the calls' clock) each
    point was reached, so report's timeline draws the compute as it ran, not as planned (issue 32, item 12)."""
    clock = LateClock(late_us=500.0, at_us=PLAN.forward_us + 120.0)
    t = run_step(PLAN, clock, FakeChannel(clock, [30.0, 30.0, 20.0]))
    marks = dict(t.compute_marks[:-3])  # progress -> wall, up to the backward's last bucket
    assert marks[0.0] == 0.0 and marks[PLAN.forward_us] == 100.0
    assert marks[PLAN.forward_us + 50.0] == 150.0 and marks[PLAN.forward_us + 120.0] == 720.0  # 500 us late
    backward_end, after_wait, done = t.compute_marks[-3:]
    assert backward_end == (300.0, 800.0) and after_wait[0] == 300.0 and after_wait[1] >= backward_end[1]
    assert done == (PLAN.compute_us, t.step_us)
    # every call the step made lies on the same clock as the marks: the last one ends at or before the wait's end
    assert max(end for _, end in t.comm_intervals) <= after_wait[1]
