"""`commbench report`'s timeline.png (issue 32, item 12): the compute drawn on the wall clock the calls were timed
by (a replay on a loaded CPU spins its compute's CPU time over a longer wall time, and the planned phases put every
call after a compute that in fact overlapped them), and a legend of what is drawn: the phases' shades, and only the
collectives the run has."""
from __future__ import annotations

import pytest

from commbench.analysis import report_steps
from commbench.analysis.report_timeline import plot_timeline, wall_at

# a replay of resnet18 (ddp, 2 CPU ranks) on a loaded host: 345 ms of compute CPU time took 2 s of wall time
SPLIT = {"forward": 112274.06, "backward": 207356.351, "optimizer": 13834.857, "ddp": 11723.711}
MARKS = [[0.0, 0.0], [112274.1, 908264.1], [112336.3, 908320.1], [155250.3, 1079619.3], [325492.3, 1979389.7],
         [325492.3, 1984473.5], [325492.3, 1997430.9], [345189.0, 2031205.8]]
CALLS = [[908324.3, 913060.6], [1079624.2, 1150054.8], [1979391.6, 1997388.7]]


def records(marks=MARKS):
    step = {"record": "step", "run_id": "r", "step": 2, "warmup": False, "compute_us": 345189.0, "comm_us": 95000.0,
            "exposed_comm_us": 18000.0, "step_us": 2186100.0, "other_us": 1822911.0, "calls_us": CALLS}
    if marks is not None:
        step["compute_marks_us"] = marks
    return [{"record": "header", "run_id": "r", "compute_split_us": SPLIT},
            {"record": "proxy", "kind": "proxy", "model": "resnet18", "backend": "torch", "library": "gloo",
             "device": "cpu", "world_size": 2, "nnodes": 1, "batch": 2, "bucket_mb": None, "bucketing": "ddp",
             "setup": "ddp", "run_id": "r", "status": "ok", "schedule": False, "timing": "measured"}, step]


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    figures = []
    monkeypatch.setattr(report_steps, "save_png", lambda fig, *a, **k: figures.append(fig) or "timeline.png")

    def draw(recs):
        plot_timeline(recs, str(tmp_path))
        fig = figures.pop()
        ax = fig.axes[0]
        compute = ax.collections[0]
        spans = [(path.vertices[:, 0].min(), path.vertices[:, 0].max()) for path in compute.get_paths()]
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        return spans, legend, [t.get_text() for t in ax.get_yticklabels()]
    return draw


def test_the_compute_is_drawn_as_it_ran_and_overlaps_the_calls_it_overlapped(drawn):
    spans, legend, lanes = drawn(records())
    assert lanes[0] == "compute (as it ran)"
    backward = spans[1]  # ms on the axis
    assert backward[0] == pytest.approx(908.264, abs=0.01) and backward[1] == pytest.approx(1979.39, abs=0.01)
    # the two calls issued during the backward lie inside it, as proxy_steps.png counts them overlapped
    assert all(backward[0] <= start / 1e3 and end / 1e3 <= backward[1] for start, end in CALLS[:2])


def test_an_older_file_draws_the_plan_and_says_so(drawn):
    spans, _, lanes = drawn(records(marks=None))
    assert lanes[0] == "compute (plan)" and spans[1][1] == pytest.approx((SPLIT["forward"] + SPLIT["backward"]) / 1e3,
                                                                          rel=0.1)


def test_the_legend_names_the_shades_and_only_the_collectives_drawn(drawn):
    """The legend listed allgather and reduce_scatter in an allreduce-only run, and the grey shades were unnamed."""
    _, legend, _ = drawn(records())
    assert "allgather" not in legend and "reduce_scatter" not in legend and "allreduce" in legend
    assert {"forward", "backward", "optimizer"} <= set(legend)


def test_wall_at_maps_progress_through_the_marks():
    marks = [[0.0, 0.0], [100.0, 100.0], [200.0, 700.0], [200.0, 900.0], [210.0, 910.0]]
    assert wall_at(marks, 50.0, late=True) == 50.0
    assert wall_at(marks, 150.0, late=False) == 400.0  # an even pace between marks
    assert wall_at(marks, 200.0, late=False) == 700.0  # a phase ending at 200 ends before the wait
    assert wall_at(marks, 200.0, late=True) == 900.0  # one beginning there begins after it
    assert wall_at(marks, 500.0, late=False) == 910.0  # past the last mark: the last


def test_a_poor_fits_prediction_is_marked_and_a_measurement_alone_is_not(monkeypatch, tmp_path):
    """The timeline drew a poor fit's predicted calls without a word (issue 48, item 13)."""
    from dataclasses import replace

    from commbench.costmodel import load_hardware

    figures = []
    monkeypatch.setattr(report_steps, "save_png", lambda fig, *a, **k: figures.append(fig) or "timeline.png")
    hw = load_hardware("dgx-h100")
    hw = replace(hw, meta={**hw.meta, "poor_fit": "median error 31.0% > 25%"})
    plot_timeline(records(), str(tmp_path), hw, "POOR FIT: dgx-h100 (median error 31.0% > 25%)")
    plot_timeline(records(), str(tmp_path), None, "POOR FIT: dgx-h100 (median error 31.0% > 25%)")
    assert [fig.get_suptitle() for fig in figures] == ["POOR FIT: dgx-h100 (median error 31.0% > 25%)", ""]
