"""The ETA of a sweep's points to come (commbench/eta.py; issue 48, item 9): `sweep --sizes 1K-1G` said
"ETA 703642s" at 7 of 42 points of a 161 s run, and "ETA 681433s" at 5 of 42 of a 90 s run here: a line
through the noise of 1-8 KiB, carried to 1 GiB. The estimate is a lower bound, and says so, until the
sizes show a cost per byte; then it carries that cost on, never above the time per byte measured."""
from __future__ import annotations

import io
import json

import pytest
from conftest import REPO

from commbench import point_timing as timing
from commbench.eta import PointTime, Trend, point_estimate
from commbench.sweep_config import SweepConfig
from commbench.table import Progress

SIZES_1K_1G = [1 << (10 + i) for i in range(21) for _ in range(2)]  # both placements of each size, in run order
LOADED = json.loads((REPO / "tests" / "data" / "eta_loaded_sweep.json").read_text())["points"]


def progress_after(walls: list[float], calls_and_times: list[tuple[int, float]] | None = None) -> Progress:
    clock = [0.0]
    cfg = SweepConfig()
    progress = Progress(len(SIZES_1K_1G), stream=io.StringIO(), enabled=False, clock=lambda: clock[0],
                        nbytes=SIZES_1K_1G, calls_for=lambda call_us: timing.planned_calls(cfg, call_us))
    for index, wall in enumerate(walls):
        progress.update("point")
        clock[0] += wall
        progress.advance(*(calls_and_times[index][::-1] if calls_and_times else ()))
    return progress


def test_noise_at_the_small_sizes_is_no_cost_per_byte():
    """The 7 points of 1-8 KiB a loaded host took 0.45-0.9 s for: the old line through them said 256,047 s."""
    progress = progress_after([0.45, 0.5, 0.48, 0.55, 0.5, 0.6, 0.9])
    eta = progress.eta(4.0)
    assert eta.at_least and eta.seconds < 60, eta
    log = io.StringIO()
    progress.stream, progress.logging, progress._logged = log, True, -10.0
    progress.update("allreduce 8 KiB in-place")
    assert " ETA at least " in log.getvalue()


def test_a_loaded_runs_estimates_are_bounded_and_their_lower_bounds_hold():
    """The points of a loaded `sweep --sizes 1K-1G` (tests/data/eta_loaded_sweep.json), replayed: after every
    point, an ETA marked as a lower bound is one, and every other is within a factor 2 of what was left."""
    walls = [wall for _, wall, _, _ in LOADED]
    total = sum(walls)
    for done in range(1, len(LOADED)):
        progress = progress_after(walls[:done], [(calls, call_us) for _, _, calls, call_us in LOADED[:done]])
        eta, left = progress.eta(sum(walls[:done])), total - sum(walls[:done])
        if eta.at_least:
            assert eta.seconds <= left, (done, eta, left)
        else:
            assert left / 2 <= eta.seconds <= 2 * left, (done, eta, left)
    assert not progress.eta(total - walls[-1]).at_least  # the cost per byte showed before the end


def test_a_cost_per_byte_counts_once_it_passes_the_smaller_sizes_slowest():
    few = Trend.of([(1024, 1.0), (2048, 1.9), (4096, 2.1)])  # one smaller size: its noise is unknown
    assert not few.resolved and few.at(1 << 30) == (2.1, True)
    spike = Trend.of([(1024, 1.0), (2048, 1.9), (4096, 1.2), (8192, 3.0)])  # 3x the fastest, not 2x the slowest
    assert not spike.resolved and spike.at(1 << 30) == (3.0, True)
    grown = Trend.of([(1024, 1.0), (2048, 1.2), (1 << 20, 1.0), (2 << 20, 3.0)])
    assert grown.resolved and grown.per_byte == pytest.approx(2.0 / ((2 << 20) - 1024))  # from the median's size
    assert grown.at(4 << 20) == (pytest.approx(3.0 + grown.per_byte * (2 << 20)), False)


def test_the_cost_per_byte_is_never_above_the_time_per_byte_seen():
    trend = Trend.of([(1024, 0.0), (2048, 0.0), (1 << 20, 0.0), (2 << 20, 2.0)])  # the small sizes took nothing
    assert trend.resolved and trend.per_byte == pytest.approx(2.0 / (2 << 20))  # not 2 s over 2 MiB - 2 KiB


def test_calls_show_a_cost_per_byte_before_the_wall_time_does():
    """The adaptive rule holds a point near --min-time until 5 calls fill it: the wall time is flat to
    32 MiB on gloo, while one call's time grows from 512 KiB. Beyond the calls' trend, calls_for counts
    the calls the rule will make (5 timed at 1 GiB, not --min-time's worth)."""
    cfg = SweepConfig()
    points = [PointTime(n, 0.3, timing.planned_calls(cfg, us), us)
              for n, us in ((1024, 1000.0), (4096, 1000.0), (16384, 1100.0), (1 << 20, 3000.0))]
    estimate = point_estimate(points, 1 << 30, lambda us: timing.planned_calls(cfg, us))
    per_byte_us = (3000.0 - 1000.0) / ((1 << 20) - 4096)
    call_us = 3000.0 + per_byte_us * ((1 << 30) - (1 << 20))
    assert estimate.at_least  # what the harness does around the calls may grow too: none seen yet
    assert estimate.seconds == pytest.approx(timing.planned_calls(cfg, call_us) * call_us * 1e-6, rel=0.1)
    assert timing.planned_calls(cfg, call_us) == 1 + 1 + 5 + 1  # first call, one warm-up, 5 timed, the check
