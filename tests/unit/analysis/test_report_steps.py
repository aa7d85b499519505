"""`commbench report`'s step breakdown (its pictures; index.md's tables are analysis/report_tables.py's): each
run's median step split into compute, overlapped and exposed communication and other, adding up to that step;
an older file's exposed (then step - compute) capped at its communication; runs of one setup named by their
files."""
from __future__ import annotations

import pytest

from commbench.analysis.report_steps import plot_steps, step_rows
from commbench.analysis.report_tables import index_lines


def _summary(source, run_id="r", kind="proxy", **medians):
    return {"record": "proxy", "kind": kind, "model": "resnet18", "world_size": 2, "backend": "torch",
            "library": "gloo", "batch": 16, "status": "ok", "run_id": run_id, "_file": source,
            **{f"{k}_p50": v for k, v in medians.items()}}


def _step(source, index, compute, comm, exposed, step, other="absent", run_id="r"):
    record = {"record": "step", "run_id": run_id, "step": index, "warmup": False, "compute_us": compute,
              "comm_us": comm, "exposed_comm_us": exposed, "step_us": step, "_file": source}
    if other != "absent":
        record["other_us"] = other
    return record


def test_the_bars_are_the_median_step_and_add_up_to_it():
    steps = [_step("a.jsonl", i, 1000.0, comm, exposed, 1000.0 + exposed + other, other)
             for i, (comm, exposed, other) in enumerate([(50.0, 10.0, 5.0), (80.0, 30.0, 900.0), (60.0, 20.0, 7.0)])]
    (row,) = step_rows([*steps, _summary("a.jsonl", compute_us=1000.0, comm_us=60.0, exposed_comm_us=20.0,
                                         other_us=7.0, step_us=1027.0)])
    alone, overlapped, exposed, other = row["parts"]
    assert row["split_ms"] == pytest.approx(1.027)  # the middle step of 1.015, 1.027, 1.930 ms
    assert (exposed, other, overlapped) == pytest.approx((0.020, 0.007, 0.040))  # overlapped = comm - exposed
    assert alone + overlapped + exposed + other == pytest.approx(row["split_ms"])
    assert row["derived"] is False


def test_an_older_file_caps_exposed_at_the_communication_and_calls_the_rest_other():
    # written when exposed was step - compute: 500 us of a descheduled rank counted as communication
    step = _step("old.jsonl", 1, 1000.0, 60.0, 560.0, 1560.0)
    (row,) = step_rows([step, _summary("old.jsonl", compute_us=1000.0, comm_us=60.0, exposed_comm_us=560.0,
                                       step_us=1560.0)])
    alone, overlapped, exposed, other = row["parts"]
    assert exposed == pytest.approx(0.060) and other == pytest.approx(0.500) and overlapped == 0.0
    assert row["derived"] is True
    assert any(line.startswith("| resnet18 proxy") and "\\*" in line for line in index_lines([row], []))


def test_training_is_not_split_and_two_runs_of_one_setup_are_named_by_file(tmp_path):
    records = [_summary(name, run_id=name, compute_us=1000.0, comm_us=50.0, exposed_comm_us=10.0, other_us=0.0,
                        step_us=1010.0) for name in ("before.jsonl", "after.jsonl")]
    records.append(_summary("t.jsonl", kind="train", step_us=900.0))
    rows = step_rows(records)
    assert [row["label"].rsplit(", ", 1)[-1] for row in rows[:2]] == ["before.jsonl", "after.jsonl"]
    assert rows[2]["parts"] is None and rows[2]["split_ms"] == pytest.approx(0.9)
    # no step records: the summary's medians stand in, other the rest of the median step
    assert sum(rows[0]["parts"]) == pytest.approx(1.010)
    path = plot_steps(rows, str(tmp_path))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_measured_runs_stand_beside_the_predicted_curve_of_their_model_and_batch(tmp_path):
    from commbench.analysis.report_steps import measured_runs, plot_scaling

    curve = [{"record": "scaling", "model": "resnet18", "hardware": "hw", "algorithm": "nccl", "batch": 8,
              "compute": "c", "gpus": g, "samples_per_s": 12.0 * g * 0.95, "speedup": g * 0.95, "linearity": 0.95}
             for g in (1, 2, 4)]
    runs = [_summary(f"t{n}.jsonl", kind="train", step_us=1e6) | {"world_size": n, "batch": 8,
                                                                   "samples_per_s": 10.0 * n * (1 if n == 1 else 0.7)}
            for n in (1, 2)]
    other_batch = _summary("p.jsonl", compute_us=1.0, step_us=2.0) | {"samples_per_s": 5.0}  # batch 16: not beside
    found = measured_runs([*curve, *runs, other_batch])
    assert [r["world_size"] for r in found[("resnet18", 8, "train", "torch", "gloo")]] == [1, 2]
    assert ("resnet18", 16, "proxy", "torch", "gloo") in found  # measured, but no curve of batch 16 in the files
    path = plot_scaling([*curve, *runs, other_batch], str(tmp_path))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_every_title_of_proxy_steps_fits_in_the_picture(tmp_path, monkeypatch):
    """proxy_steps.png's right-hand title ran past the picture's edge (issue 32, item 12)."""
    from commbench.analysis import report_steps

    kept = []
    real = report_steps.save_png

    def keep(fig, out_dir, name, rect=None):
        fig.tight_layout(rect=rect)
        renderer = fig.canvas.get_renderer()
        kept.extend((ax.title.get_text(), ax.title.get_window_extent(renderer), fig.bbox) for ax in fig.axes)
        return real(fig, out_dir, name, rect)

    monkeypatch.setattr(report_steps, "save_png", keep)
    rows = step_rows([_summary("a.jsonl", compute_us=1000.0, comm_us=60.0, exposed_comm_us=20.0, other_us=7.0,
                               step_us=1027.0)])
    plot_steps(rows, str(tmp_path))
    assert len(kept) == 2
    for title, box, figure in kept:
        assert title and figure.x0 <= box.x0 and box.x1 <= figure.x1, (title, box, figure)


def test_a_layout_run_is_named_by_its_layout_with_each_dimensions_median_wait():
    layout = {"layout": "tp2,fsdp2", "tp": 2, "dp": 2}
    steps = [{**_step("l.jsonl", i, 1000.0, w, w, 1000.0 + w, 0.0), "exposed_by_dim_us": {"tp": w, "dp": 2 * w}}
             for i, w in enumerate([100.0, 300.0, 200.0])]
    records = [*steps, {**_summary("l.jsonl", compute_us=1000.0, comm_us=200.0, exposed_comm_us=200.0,
                                   other_us=0.0, step_us=1200.0), "layout": layout},
               {**_summary("t.jsonl", run_id="t", kind="train", step_us=1500.0), "layout": layout}]
    rows = step_rows(records)
    assert [row["label"].split(", ")[2] for row in rows] == ["layout tp2,fsdp2"] * 2
    lines = index_lines(rows, records)
    table = lines[lines.index("## Parallel layouts") + 6:]
    assert table[0].split(" | ")[1:] == ["0.20", "0.40 |"]  # tp, then dp: the medians of 0.1, 0.3, 0.2 ms
    assert "| tp | dp |" in lines[lines.index("## Parallel layouts") + 4] and not table[1]  # training: no waits


def test_the_right_panel_names_each_bar_with_its_units_and_draws_the_compute(tmp_path, monkeypatch):
    """proxy_steps.png's right panel had no labels and no compute bar (issue 48, item 13): each run's compute
    (alone + overlapped), communication, exposed communication and other are bars of their own, each named on
    the axis, the axes saying what they hold and in which unit; a training run says it is not split."""
    from commbench.analysis import report_steps

    figures = []
    monkeypatch.setattr(report_steps, "save_png", lambda fig, *a, **k: figures.append(fig) or "proxy_steps.png")
    rows = step_rows([_summary("a.jsonl", compute_us=1000.0, comm_us=60.0, exposed_comm_us=20.0, other_us=7.0,
                               step_us=1027.0), _summary("t.jsonl", run_id="t", kind="train", step_us=900.0)])
    plot_steps(rows, str(tmp_path))
    (fig,) = figures
    right = fig.axes[1]
    assert "ms" in right.get_xlabel() and "log" in right.get_xlabel() and right.get_ylabel()
    assert [t.get_text() for t in right.get_yticklabels()] == ["compute", "communication", "exposed comm.", "other"]
    widths = [bar.get_width() for bar in right.patches]
    assert widths == pytest.approx([1.0, 0.060, 0.020, 0.007])  # ms: compute is alone 0.96 + overlapped 0.04
    assert [bar.get_y() + bar.get_height() / 2 for bar in right.patches] == pytest.approx([-0.3, -0.1, 0.1, 0.3])
    assert any("not split" in t.get_text() for t in right.texts)
    assert right.get_ylim() == fig.axes[0].get_ylim()  # its bars beside their run's row
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "compute (alone + overlapped)" in legend and "communication (allreduces in flight)" in legend
