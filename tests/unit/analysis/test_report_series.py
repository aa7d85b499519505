"""`commbench report` keeps runs apart: a series per file, setup, dtype and placement, one per
auto run, and a prediction drawn against what it predicts."""
from __future__ import annotations

from commbench.analysis.report import collect_series, plot_prediction


def _record(nbytes, time_us, placement="in-place", algorithm="ring", run_id="a", source="a.jsonl", kind="measured",
            dtype="float32"):
    return {"record": "result", "collective": "allreduce", "backend": "shm", "library": "schedule",
            "algorithm": algorithm, "dtype": dtype, "placement": placement, "world_size": 4, "nnodes": 1,
            "nbytes": nbytes, "time_us": time_us, "p50_us": time_us, "p90_us": 1.5 * time_us, "min_us": time_us / 2,
            "run_id": run_id, "_file": source, "kind": kind}


def test_two_runs_of_one_setup_are_two_series_named_by_file():
    records = [_record(n, 10.0, source="before.jsonl", run_id="x") for n in (1024, 4096)]
    records += [_record(n, 12.0, source="after.jsonl", run_id="y") for n in (1024, 4096)]
    labels = sorted(s.label for s in collect_series(records))
    assert labels == ["shm/ring, 4 ranks, after.jsonl", "shm/ring, 4 ranks, before.jsonl"]


def test_an_auto_run_is_one_series_and_placements_stay_apart():
    records = [_record(1024, 5.0, algorithm="oneshot"), _record(1 << 20, 50.0, algorithm="ring"),
               _record(1024, 6.0, placement="out-of-place", algorithm="oneshot"),
               _record(1 << 20, 60.0, placement="out-of-place", algorithm="ring")]
    series = collect_series(records)
    assert sorted(s.label for s in series) == ["shm/auto, 4 ranks, in-place", "shm/auto, 4 ranks, out-of-place"]
    assert all(len(s.nbytes) == 2 for s in series)
    band = next(s for s in series if s.placement == "in-place")
    assert band.low_us == (2.5, 25.0) and band.high_us == (7.5, 75.0)  # no raw times: min .. p90


def test_the_prediction_plot_pairs_each_measured_point_with_its_prediction(tmp_path):
    records = [_record(n, t) for n, t in ((1024, 10.0), (4096, 20.0))]
    records += [_record(n, t, kind="predicted") for n, t in ((1024, 11.0), (4096, 19.0))]
    path = plot_prediction(collect_series(records), str(tmp_path))
    assert path and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert plot_prediction(collect_series(records[:2]), str(tmp_path)) is None  # nothing predicted: no plot


def test_index_md_says_each_line_style_as_drawn(tmp_path):
    """index.md said "dashed = predicted" while measured out-of-place lines were dotted (issue 32, item 12): the
    key comes from the one function that styles the lines, and names only the styles drawn."""
    from commbench.analysis.report import line_style, plot, write_index

    records = [_record(n, 10.0, placement=p) for n in (1024, 4096) for p in ("in-place", "out-of-place")]
    series = collect_series(records)
    assert {s.placement: line_style(s)[0] for s in series} == {"in-place": "-", "out-of-place": ":"}
    pngs = plot(series, str(tmp_path))
    index = open(write_index(series, pngs, str(tmp_path), ["a.jsonl"]), encoding="utf-8").read()
    assert "Solid with dots: measured in-place; dotted with squares: measured out-of-place." in index
    assert "dashed" not in index  # nothing predicted here
