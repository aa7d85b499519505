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


def _figures(monkeypatch):
    """The figures report draws, kept (each laid out as saved) instead of written."""
    from commbench.analysis import report_steps

    figures = []

    def keep(fig, out_dir, name, rect=None):
        fig.tight_layout(rect=rect)
        figures.append(fig)
        return name

    monkeypatch.setattr(report_steps, "save_png", keep)
    return figures


def test_runs_that_differ_in_what_they_ran_draw_in_colours_of_their_own(monkeypatch, tmp_path):
    """A bf16 and an fp32 run drew identical lines (colour followed the placement only; issue 48, item 13): every
    series that differs in what ran (dtype, algorithm, backend, world, reduction, placement) has its own colour
    and a legend entry naming what differs, and a prediction is drawn in its run's colour, dashed."""
    from commbench.analysis.report import plot

    variants = [{}, {"dtype": "bfloat16"}, {"algorithm": "tree"}, {"backend": "p2p"}, {"world_size": 8},
                {"op": "max"}, {"placement": "out-of-place"}]
    records = [_record(n, 10.0 + i, run_id=str(i)) | variant | {"op": variant.get("op", "sum")}
               for i, variant in enumerate(variants) for n in (1024, 4096)]  # a run each, as sweep writes them
    records += [_record(n, 9.0, kind="predicted", run_id="p") | {"op": "sum"} for n in (1024, 4096)]
    figures = _figures(monkeypatch)
    plot(collect_series(records), str(tmp_path))
    (fig,) = figures
    for ax in fig.axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        measured = [line for label, line in lines.items() if not label.endswith("(predicted)")]
        assert len(measured) == len(variants)
        assert len({line.get_color() for line in measured}) == len(variants), sorted(lines)
        predicted = next(line for label, line in lines.items() if label.endswith("(predicted)"))
        twin = lines[predicted.get_label().removesuffix(" (predicted)")]
        assert predicted.get_color() == twin.get_color() and predicted.get_linestyle() == "--"
    legend = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert {"shm/ring, 4 ranks, float32, op sum, in-place", "shm/ring, 4 ranks, bfloat16, op sum, in-place",
            "shm/tree, 4 ranks, float32, op sum, in-place", "p2p/ring, 4 ranks, float32, op sum, in-place",
            "shm/ring, 8 ranks, float32, op sum, in-place", "shm/ring, 4 ranks, float32, op max, in-place",
            "shm/ring, 4 ranks, float32, op sum, out-of-place"} <= set(legend)


def _poor(meta):
    from dataclasses import replace

    from commbench.costmodel import load_hardware

    hw = load_hardware("dgx-h100")
    return replace(hw, meta={**hw.meta, **meta})


def _nccl(nbytes, time_us):
    return _record(nbytes, time_us) | {"backend": "torch", "library": "nccl", "device": "cuda", "world_size": 8,
                                       "count": nbytes // 4, "op": "sum"}


def test_a_poor_fit_is_marked_on_every_picture_of_its_predictions(monkeypatch, tmp_path):
    """check and predict warn of a poor fit (fit --accept-poor-fit), the report's pictures did not (issue 48,
    item 13): each picture that draws its predictions says so above it, inside the picture, and index.md too."""
    from commbench.analysis.report import write_report

    figures = _figures(monkeypatch)
    records = [_nccl(n, 10.0 * n / 1024) for n in (1024, 4096, 16384)]
    hw = _poor({"poor_fit": "median error 31.0% > 25%: half the points are further off than that"})
    index, pngs = write_report(records, ["a.jsonl"], str(tmp_path), hw)
    assert [p.rsplit("/", 1)[-1] for p in pngs] == ["allreduce.png", "predicted_vs_measured.png"]
    assert len(figures) == 2
    for fig in figures:
        mark = fig.get_suptitle()
        assert mark.startswith("POOR FIT: dgx-h100") and "median error 31.0%" in mark.replace("\n", " ")
        box, frame = fig._suptitle.get_window_extent(fig.canvas.get_renderer()), fig.bbox
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1, (mark, box, frame)
    assert "Note: POOR FIT: dgx-h100 (median error 31.0%" in open(index, encoding="utf-8").read()


def test_a_good_fit_and_no_model_leave_the_pictures_unmarked(monkeypatch, tmp_path):
    from commbench.analysis.report import model_mark, write_report

    figures = _figures(monkeypatch)
    records = [_nccl(n, 10.0 * n / 1024) for n in (1024, 4096, 16384)]
    write_report(records, ["a.jsonl"], str(tmp_path / "good"), _poor({}))
    write_report(records, ["a.jsonl"], str(tmp_path / "none"))
    assert len(figures) == 3 and all(fig.get_suptitle() == "" for fig in figures)
    assert model_mark(None) is None and model_mark(_poor({})) is None
    loaded = model_mark(_poor({"fitted_under_load": "load 5.0 on 2 cores\n$x$"}))
    assert loaded == "dgx-h100 was fitted from runs under load (load 5.0 on 2 cores\\n$x$): its figures hold that load"


def test_the_time_panel_names_a_band_only_where_one_is_drawn(monkeypatch, tmp_path):
    """A predict file alone has no iterations: its time panel said "p10-p90 of the iterations (band)" with no
    band drawn (issue 48, item 13)."""
    from commbench.analysis.report import plot

    figures = _figures(monkeypatch)
    predicted = [_record(n, 10.0, kind="predicted") for n in (1024, 4096)]
    plot(collect_series(predicted), str(tmp_path))
    plot(collect_series([_record(n, 10.0) for n in (1024, 4096)]), str(tmp_path))
    alone, measured = (fig.axes[1].get_title() for fig in figures)
    assert "band" in measured and "p10-p90" in measured
    assert "p10-p90" not in alone and "no band" in alone


def test_scaling_curves_of_a_poor_fit_carry_the_mark_into_their_picture(monkeypatch, tmp_path, capsys):
    """predict-scaling of a poor fit warned on stderr, but its records did not say so and scaling.png, drawn from
    the records alone, was unmarked (issue 48, item 13): the records keep the file's doubts and the picture says
    them above it, as index.md does."""
    import json

    from commbench.analysis.report import write_report
    from commbench.cli import main
    from commbench.results import read_records

    hw_path, out = tmp_path / "poor.json", tmp_path / "s.jsonl"
    _poor({"poor_fit": "median error 31.0% > 25%"}).save(str(hw_path))
    assert main(["predict-scaling", "resnet50", "--hw", str(hw_path), "--gpus", "1,8,16", "--batch", "32",
                 "--throughput-1gpu", "329", "--json", str(out)]) == 0
    assert "is a poor fit" in capsys.readouterr().err
    records = read_records(str(out))
    assert {tuple(r["hardware_doubts"]) for r in records if r["record"] == "scaling"} == {
        ("POOR FIT: dgx-h100 (median error 31.0% > 25%): its predictions do not describe the sweep it came from",)}
    figures = _figures(monkeypatch)
    index, pngs = write_report(records, [str(out)], str(tmp_path / "r"))
    scaling = [fig for fig, name in zip(figures, pngs) if name == "scaling.png"]
    assert len(scaling) == 1 and scaling[0].get_suptitle().startswith("POOR FIT: dgx-h100")
    assert "Note: POOR FIT: dgx-h100" in open(index, encoding="utf-8").read()
    good = tmp_path / "good.jsonl"
    assert main(["predict-scaling", "resnet50", "--hw", "dgx-h100", "--gpus", "1,8", "--batch", "32",
                 "--throughput-1gpu", "329", "--json", str(good)]) == 0
    assert all(json.loads(line).get("hardware_doubts") is None for line in good.read_text().splitlines())


def test_a_crafted_file_of_doubts_marks_at_most_a_few_short_lines():
    from commbench.analysis.report_steps import DOUBT_CHARS, MAX_DOUBTS, scaling_mark

    records = [{"record": "scaling", "hardware_doubts": [f"doubt {i} " + "x" * 10_000 for i in range(100)]}
               for _ in range(1000)] + [{"record": "scaling", "hardware_doubts": "not a list"}]
    lines = scaling_mark(records).split("\n")
    assert len(lines) == MAX_DOUBTS and all(len(line) <= DOUBT_CHARS for line in lines)
    assert scaling_mark([{"record": "scaling", "hardware_doubts": ["a\x1b[2Jb"]}]) == "a\\x1b[2Jb"
    assert scaling_mark([{"record": "scaling", "hardware_doubts": [None, 1, {"a": 1}, ["b"], "real"]}]) == "real"
