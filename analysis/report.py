"""`commbench report`: plots and a Markdown summary from any result files.

For every collective: bus bandwidth against size (log x) and time against size
(log-log), one colour per series that differs in what ran (backend/library/algorithm,
ranks, dtype, reduction, placement, file; the legend names what differs), measured
points solid (out-of-place dotted), predicted ones (`kind: predicted`, or the `--hw`
model's prediction of each measured setup) dashed in their run's colour; a poor fit's
or a loaded host's `--hw` is said above every picture that draws its predictions.
index.md lists the setups with their headline numbers and links the PNGs. Proxy,
train and scaling records get their own plots (report_steps.py): the step breakdown,
scaling curves and the acc_ratio scatter; compare records (compare --json) the
before/after chart (report_compare.py).
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

from commbench import collectives as C
from commbench.analysis import report_steps as R
from commbench.analysis.report_compare import plot_compare
from commbench.analysis.report_tables import index_lines
from commbench.backends.registry import record_capabilities
from commbench.files import shown, shown_values
from commbench.results import read_records

MEASURED, PREDICTED = "measured", "predicted"


@dataclass(frozen=True)
class Series:
    collective: str
    label: str
    kind: str
    nbytes: tuple[int, ...]
    time_us: tuple[float, ...]
    busbw_gbps: tuple[float, ...]
    p50_us: tuple[float, ...] = ()  # median per-iteration time per size (nan: not kept)
    low_us: tuple[float, ...] = ()  # p10 of the iterations (from the raw times; else the fastest)
    high_us: tuple[float, ...] = ()  # p90 of the iterations
    placement: str = "in-place"
    setup: str = ""  # backend/library or algorithm, ranks, nodes: one colour per setup and placement
    stat: str = "mean"  # which statistic time_us is (the records' `stat`, sweep --stat)


def _setup(record: dict) -> str:
    """backend/algorithm (or torch/library, or the model's name), ranks, nodes. A schedule backend's
    run is one setup whatever algorithms `auto` chose per size (the table says which)."""
    capabilities = record_capabilities(record)
    if not capabilities.ran:
        what = f"model {record['library']} {record.get('algorithm') or ''}".strip()
    elif not capabilities.schedule:
        what = f"{record['backend']}/{record['library']}"
    else:
        what = f"{record['backend']}/{record.get('_algorithm') or record.get('algorithm') or '-'}"
    nodes = record.get("nnodes") or 1
    return f"{what}, {record['world_size']} ranks" + (f" on {nodes} nodes" if nodes > 1 else "")



def _auto_runs(results: list[dict]) -> None:
    """Mark the records of a run whose schedule changed with size (--algorithm auto) as one setup."""
    algorithms: dict[tuple, set] = defaultdict(set)
    for r in results:
        algorithms[(r.get("_file"), r.get("run_id"), r["collective"], r["backend"])].add(r.get("algorithm"))
    for r in results:
        capabilities = record_capabilities(r)  # a run of commbench's schedules (a prediction names each point's)
        if capabilities.schedule and capabilities.ran and len(algorithms[(r.get("_file"), r.get("run_id"),
                                                                          r["collective"], r["backend"])]) > 1:
            r["_algorithm"] = "auto"


def collect_series(records: list[dict]) -> list[Series]:
    """One series per run (file), collective, setup, dtype, reduction, placement and kind; the label names the
    parts that differ between the series of a collective (file, dtype, reduction, placement), and plot gives
    each label its own colour."""
    results = [dict(r) for r in records if r.get("record") == "result" and r.get("time_us")]
    _auto_runs(results)
    groups: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        kind = PREDICTED if r.get("kind") == PREDICTED else MEASURED
        key = (r["collective"], _setup(r), r.get("dtype"), r.get("op"), r["placement"], r.get("_file", ""), kind)
        groups[key][r["nbytes"]].append(r)
    varying = {part: {k[0]: len({kk[part] for kk in groups if kk[0] == k[0] and kk[part] is not None}) > 1
                      for k in groups} for part in (2, 3, 4, 5)}  # a record without an op (a model's) differs in none
    series = []
    for key, points in sorted(groups.items(), key=lambda item: tuple(str(part) for part in item[0])):
        collective, setup, dtype, op, placement, source, kind = key
        label = ", ".join([setup, *([dtype] if varying[2][collective] else []),
                           *([f"op {op}"] if varying[3][collective] and op else []),
                           *([placement] if varying[4][collective] else []),
                           *([os.path.basename(source)] if varying[5][collective] and source else [])])
        series.append(_series(collective, label, kind, placement, points, setup))
    return series


def _series(collective: str, label: str, kind: str, placement: str, points: dict[int, list[dict]],
            setup: str) -> Series:
    import numpy as np

    from commbench.results import raw_times

    sizes = sorted(points)
    chosen = [sorted(points[s], key=lambda p: p["time_us"])[len(points[s]) // 2] for s in sizes]  # median run
    times = [p["time_us"] for p in chosen]
    world = chosen[0]["world_size"]
    busbw = [C.bandwidths_gbps(collective, s, world, t)[1] for s, t in zip(sizes, times)]
    low, high, p50 = [], [], []
    for p in chosen:
        raw = raw_times(p) if p.get("iteration_times_us") else np.empty(0)
        if raw.size:
            lo, mid, hi = np.percentile(raw, [10, 50, 90])
        else:
            lo, mid, hi = (p.get(k) if p.get(k) is not None else float("nan") for k in ("min_us", "p50_us", "p90_us"))
        low.append(float(lo))
        p50.append(float(mid))
        high.append(float(hi))
    return Series(collective, label, kind, tuple(sizes), tuple(times), tuple(busbw), tuple(p50), tuple(low),
                  tuple(high), placement, setup, "/".join(sorted({str(p.get("stat") or "mean") for p in chosen})))


def model_series(records: list[dict], hw) -> list[Series]:
    """The model's prediction of every measured setup in `records` (dashed beside it)."""
    from commbench.algorithms import LIBRARY_ALGORITHM
    from commbench.analysis.fit import predict_records

    measured = [r for r in records if r.get("record") == "result" and r.get("kind", MEASURED) == MEASURED
                and r.get("time_us") and r["collective"] in LIBRARY_ALGORITHM]
    if not measured:
        return []
    times = predict_records(measured, hw)
    predicted = []
    for r, t in zip(measured, times):
        predicted.append({**r, "time_us": float(t), "kind": PREDICTED})
    return collect_series(predicted)


def line_style(series: Series) -> tuple[str, str | None, str]:
    """(line style, marker, the words index.md says of it) of one series: the one place both are decided."""
    if series.kind == PREDICTED:
        return "--", None, "dashed: predicted by the cost model"
    if series.placement == "out-of-place":
        return ":", "s", "dotted with squares: measured out-of-place"
    return "-", "o", f"solid with dots: measured{' in-place' if series.placement == 'in-place' else ''}"


def plot(series: list[Series], out_dir: str, mark: str | None = None) -> list[str]:
    """One PNG per collective: busbw and time against size; the time panel shades each measured
    series' p10-p90 of the iterations; busbw on a log axis (any positive value). One colour per label, that
    is per run that differs from the others in what it ran (setup, dtype, reduction, placement, file), a
    prediction in its run's colour; `mark` (model_mark) written above a picture that draws a prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for collective in sorted({s.collective for s in series}):
        mine = [s for s in series if s.collective == collective]
        labels = list(dict.fromkeys(s.label for s in sorted(mine, key=lambda s: s.kind != MEASURED)))
        palette = plt.cm.tab10 if len(labels) <= 10 else plt.cm.tab20  # a band never shares another's colour
        colours = {label: palette(i % palette.N) for i, label in enumerate(labels)}
        fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5.2))
        for s in mine:
            colour = colours[s.label]
            style, marker, _ = line_style(s)
            name = s.label + ("" if s.kind == MEASURED else " (predicted)")
            ax_bw.plot(s.nbytes, s.busbw_gbps, style, marker=marker, ms=3, color=colour, label=name)
            ax_t.plot(s.nbytes, s.time_us, style, marker=marker, ms=3, color=colour, label=name)
            if s.kind == MEASURED and s.low_us and any(v == v for v in s.low_us):  # nan != nan: no band
                ax_t.fill_between(s.nbytes, s.low_us, s.high_us, color=colour, alpha=0.15, lw=0)
        _size_axes(matplotlib, (ax_bw, ax_t), mine)
        if any(s.kind == PREDICTED for s in mine):
            R.mark_figure(fig, mark)
        files.append(R.save_png(fig, out_dir, f"{collective}.png"))
    return files


def _size_axes(matplotlib, axes, mine: list[Series]) -> None:
    """The two panels' axes against size: bytes on log 2, time on log, busbw on log when any is positive."""
    ax_bw, ax_t = axes
    for ax, ylabel in ((ax_bw, "bus bandwidth (GB/s, 1e9 B/s)"), (ax_t, "time per call (us)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes per rank)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=4))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_size_label))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_t.set_yscale("log")
    if any(v > 0 for s in mine for v in s.busbw_gbps):  # log for every collective, so that charts compare
        ax_bw.set_yscale("log")
    collective = mine[0].collective
    stat = "/".join(sorted({s.stat for s in mine if s.kind == MEASURED})) or "predicted"
    ax_bw.set_title(f"{collective}: bus bandwidth (of the {stat} time)")
    banded = any(s.kind == MEASURED and s.low_us and any(v == v for v in s.low_us) for s in mine)
    ax_t.set_title(f"{collective}: time, {stat} (line)" + (" and p10-p90 of the iterations (band)" if banded else
                                                          ": predictions have no iterations (no band)"))
    ax_bw.legend(fontsize=7, loc="best")


def model_mark(hw) -> str | None:
    """What a picture drawing `hw`'s predictions says above it when the file says they are not to be trusted,
    as check and predict warn of it (commands/helpers/hw_option.warn_poor): fit --accept-poor-fit's meta.poor_fit,
    fit's meta.fitted_under_load; None when neither."""
    notes = hw.doubts() if hw is not None else []
    return "\n".join(shown(note) for note in notes) or None  # a newline a file holds is escaped, not drawn


def _proxy_pairs(records: list[dict], hw) -> list[tuple[str, float, float]]:
    """(label, measured, predicted) of each proxy replay's and training run's median step, as `commbench check`
    predicts it."""
    if hw is None:
        return []
    from commbench.analysis.check import check

    rows, _ = check([r for r in records if r.get("record") in ("header", "proxy")], hw)
    return [(f"{r.setup} ({'training' if r.kind == 'train' else 'replay'} step)", r.measured_us, r.predicted_us)
            for r in rows if r.what == "step"]


def plot_prediction(series: list[Series], out_dir: str, extra: list[tuple[str, float, float]] = (),
                    mark: str | None = None) -> str | None:
    """Predicted against measured time, every point of every setup both exist for (and `extra`: proxy
    steps), with the line of perfect prediction and +-25%; the title gives the median and largest error,
    `mark` (model_mark) is written above it."""
    pairs = list(extra)
    for s in series:
        if s.kind != MEASURED:
            continue
        twin = next((p for p in series if p.kind == PREDICTED and p.collective == s.collective
                     and p.label == s.label), None)
        if twin:
            predicted = dict(zip(twin.nbytes, twin.time_us))
            pairs += [(s.label, t, predicted[n]) for n, t in zip(s.nbytes, s.time_us) if n in predicted]
    if not pairs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    errors = np.array([abs(p / m - 1) for _, m, p in pairs])
    fig, ax = plt.subplots(figsize=(6.5, 6))
    for i, label in enumerate(sorted({label for label, _, _ in pairs})):
        mine = [(m, p) for lab, m, p in pairs if lab == label]
        ax.scatter(*zip(*mine), s=14, color=plt.cm.tab10(i % 10), label=label)
    low = min(min(m, p) for _, m, p in pairs) / 1.5
    high = max(max(m, p) for _, m, p in pairs) * 1.5
    line = np.array([low, high])
    ax.plot(line, line, "k-", lw=1, label="predicted = measured")
    ax.fill_between(line, line / 1.25, line * 1.25, color="grey", alpha=0.15, label="+-25%")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high),
           xlabel="measured time (us): a call, or a proxy's median step",
           ylabel="predicted time (us)",
           title=f"prediction vs measurement: median |error| {100 * np.median(errors):.1f}%, "
                 f"max {100 * errors.max():.0f}%")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    R.mark_figure(fig, mark)
    path = R.save_png(fig, out_dir, "predicted_vs_measured.png")
    return path


def _size_label(value: float, _pos) -> str:
    from commbench.sizes import format_size

    return format_size(int(value)).replace(" ", "") if value >= 1 else ""


def write_index(series: list[Series], pngs: list[str], out_dir: str, sources: list[str],
                extra: list[str] = ()) -> str:
    lines = ["# commbench report", "", f"From: {', '.join(sources)}", ""]
    if series:
        lines += ["| collective | setup | kind | sizes | smallest: time | largest: busbw | peak busbw |",
                  "|---|---|---|---|---|---|---|"]
        for s in series:
            lines.append(f"| {s.collective} | {s.label} | {s.kind} | {len(s.nbytes)} | {R.ms_text(s.time_us[0])} us "
                         f"at {s.nbytes[0]} B | {R.ms_text(s.busbw_gbps[-1])} GB/s at {s.nbytes[-1]} B | "
                         f"{R.ms_text(max(s.busbw_gbps))} GB/s |")
        key = "; ".join(dict.fromkeys(line_style(s)[2] for s in series))  # what the charts draw, said as drawn
        lines += ["", key[:1].upper() + key[1:] + ". busbw as nccl-tests defines it (docs/metrics.md).", ""]
    lines += list(extra)
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in pngs]
    path = os.path.join(out_dir, "index.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


class ReportError(ValueError):
    """The files hold nothing the report draws."""


NOTHING_TO_DRAW = "no timed result, proxy, scaling or compare record"


def _drawable(record: dict) -> bool:
    return bool(record["record"] == "result" and record.get("time_us") or record["record"] in ("scaling", "compare")
                or record["record"] == "proxy" and record.get("status", "ok") == "ok")


def read_all(paths: list[str], warn=None) -> list[dict]:
    """Every record of the files, each line checked (results.read_records: RecordError names the file and
    line), its strings as they are shown (files.shown_values: a newline, an escape or a lone surrogate a file
    holds forges no line of a table and breaks no figure), marked with its file (`_file`: a series never mixes
    runs); ReportError when none is a timed result, an ok proxy summary or a scaling point, and `warn` for each
    file that holds none (e.g. a sweep of --backend sim without --hw: checked, not timed)."""
    records = [{**shown_values(r), "_file": p} for p in paths for r in read_records(p, warn)]  # drawn and printed
    if not any(_drawable(r) for r in records):
        raise ReportError(f"{NOTHING_TO_DRAW} in " + ", ".join(paths))
    for path in idle_files(records, paths):
        if warn:
            warn(f"{path}: {NOTHING_TO_DRAW}: it adds nothing to the report")
    return records


def idle_files(records: list[dict], paths: list[str]) -> list[str]:
    """The files of `paths` none of whose records the report draws."""
    drawn = {r.get("_file") for r in records if _drawable(r)}
    return [p for p in paths if p not in drawn]


def write_report(records: list[dict], paths: list[str], out_dir: str, hw=None, warn=None) -> tuple[str, list[str]]:
    """Write the PNGs and index.md of records read by read_all; returns (index path, png paths). With
    `hw`, runs it does not apply to (check.applicable) are not predicted: a note each, in index.md and
    through `warn`."""
    notes = [f"{p}: {NOTHING_TO_DRAW}: nothing drawn from it" for p in idle_files(records, paths)]
    series = collect_series(records)
    mark = model_mark(hw)  # on every picture that draws hw's predictions, and here
    notes += mark.split("\n") if mark else []
    notes += [line for line in R.scaling_mark(records).split("\n")  # the --hw file's own, whole, said once
              if line and not any(note.startswith(line) for note in notes)]
    if hw is not None:
        from commbench.analysis.check import applicable

        fitting, foreign = applicable(records, hw)
        series += model_series(fitting, hw)
        notes += [f"not predicted: {note}" for note in foreign]
        for note in foreign:
            if warn:
                warn(f"not predicted: {note}")
    steps = R.step_rows(records)
    os.makedirs(out_dir, exist_ok=True)
    pngs = plot(series, out_dir, mark) if series else []
    pngs += [p for p in (plot_prediction(series, out_dir, _proxy_pairs(records, hw), mark),) if p]  # applicable only
    if steps:
        pngs.append(R.plot_steps(steps, out_dir))
    from commbench.analysis.report_timeline import plot_timeline

    pngs += [p for p in (plot_timeline(records, out_dir, hw, mark),) if p]
    pngs += [p for p in (R.plot_scaling(records, out_dir), R.plot_acc_ratio(records, out_dir),
                         plot_compare(records, out_dir)) if p]
    extra = [*(f"Note: {note}" for note in notes), *([""] if notes else []), *index_lines(steps, records)]
    return write_index(series, pngs, out_dir, paths, extra), pngs


def report(paths: list[str], out_dir: str, hw=None, warn=None) -> tuple[str, list[str]]:
    """Read the files, then write the PNGs and index.md; returns (index path, png paths)."""
    return write_report(read_all(paths, warn), paths, out_dir, hw, warn)
