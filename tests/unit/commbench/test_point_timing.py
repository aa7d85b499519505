"""commbench/point_timing.py: nccl-tests' blocking modes (-z), leading iterations left out (-K), every
rank's times kept for report --stragglers, and the memory report (-M)."""
import numpy as np
import pytest

from commbench import bench_point
from commbench import point_timing as T
from commbench.results import raw_times


class Logged:
    """A backend that logs what runs, and which calls a time_iterations call timed."""

    rank = 0

    def __init__(self):
        self.log = []

    def time_iterations(self, call, iters):
        for _ in range(iters):
            self.log.append("[")
            call()
            self.log.append("]")
        return np.ones(iters)

    def synchronize(self):
        self.log.append("sync")

    def barrier(self):
        self.log.append("barrier")

    def device_memory(self):
        return {}


@pytest.mark.parametrize("mode,expected", [
    (0, ["[", "call", "]"] * 2),
    (1, ["[", "call", "sync", "barrier", "]"] * 2),  # nccl-tests -z 1: the wait and the barrier are timed
    (3, ["[", "call", "sync", "]", "barrier"] * 2),  # -z 3: the barrier outside the timed region
])
def test_blocking_modes_put_what_they_say_inside_the_timed_region(mode, expected):
    backend = Logged()
    times = T.time_calls(backend, lambda: backend.log.append("call"), 2, mode)
    assert backend.log == expected and len(times) == 2
    assert set(T.BLOCKING) == {0, 1, 3}


def test_skipped_leading_iterations_are_in_no_figure_but_kept():
    matrix = np.array([[900.0, 10, 10, 10], [800.0, 12, 12, 12]])
    stats = bench_point.summarize(matrix, "max", "mean", skip=1)
    assert stats["time_us"] == 12 and stats["max_us"] == 12 and list(stats["skipped_us"]) == [900]
    fields = T.timing_fields(stats, 1.5, 1)
    assert fields["skipped_iters"] == 1 and list(raw_times({"iteration_times_us": fields["skipped_times_us"]})) == [900]
    kept = fields["rank_times_us"]
    assert kept["ranks"] == 2 and list(raw_times({"iteration_times_us": kept["times_us"]})) == [10, 10, 10, 12, 12, 12]
    assert fields["timed_start"] == 1.5


def test_rank_times_beyond_the_bound_are_not_kept():
    stats = bench_point.summarize(np.ones((2, T.MAX_RANK_TIMES // 2 + 1)), "max")
    assert T.timing_fields(stats, None, 0)["rank_times_us"] is None


def test_the_memory_report_says_what_it_reports():
    report = T.memory_report(Logged())
    assert report["host_peak_rss_bytes"] > 1 << 20 and report["rank"] == 0
    (line,) = T.memory_lines([report])
    assert line.startswith("memory: rank 0 on ") and "host peak RSS" in line and line.endswith("MiB")


def test_a_misaligned_buffer_is_a_view_past_its_allocation():
    class Buffers:
        def alloc(self, count, dtype):
            return np.zeros(count, dtype=np.float32)

        def view(self, buffer, start, count):
            return buffer[start:start + count]

    owner, view = T.misaligned(Buffers(), 10, None, 3)
    assert owner.size == 13 and view.size == 10 and view.__array_interface__["data"][0] == \
        owner.__array_interface__["data"][0] + 12
