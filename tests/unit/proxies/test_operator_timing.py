"""The operator clock: medians of real runs, at least MIN_REPEATS of them, on this thread's CPU time."""
import pytest

torch = pytest.importorskip("torch")

from commbench.proxies import operator_timing as T  # noqa: E402


def test_the_clock_runs_each_operator_its_repeats_and_times_the_second_part_alone():
    torch.set_num_threads(1)
    clock = T.Clock("cpu", 0.0)
    assert clock.kind == "thread CPU time"
    calls = []
    clock.median_us(lambda: calls.append(1))
    assert len(calls) == 1 + T.MIN_REPEATS  # one warm-up
    made = []

    def slow_setup():
        made.append(sum(range(200_000)))  # outside the time
        return 0

    assert clock.median_us(slow_setup, lambda _: None) < clock.median_us(slow_setup)


def test_a_bigger_product_takes_longer():
    torch.set_num_threads(1)
    clock = T.Clock("cpu", 0.005)
    assert T.time_matmul(clock, 256, 256, 256, "float32") > T.time_matmul(clock, 16, 16, 16, "float32")
    forward, backward = T.time_attention(clock, 2, 32, 32, 16, causal=True, dtype="float32")
    assert forward > 0 and backward > 0
    assert 0.1 < T.memory_gbps(clock, 1 << 20, "float32") < 1e5  # GB/s a host's memory or caches stream at
