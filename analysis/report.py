"""`commbench report`: plots and a Markdown summary from any result files.

For every collective: bus bandwidth against size (log x) and time against size
(log-log), one colour per setup (backend/library/algorithm, ranks), measured
points solid, predicted ones (`kind: predicted`, or the `--hw` model's prediction
of each measured setup) dashed. index.md lists the setups with their headline
numbers and links the PNGs. Proxy, train and scaling records get their own plots
(report_steps.py): the step breakdown, scaling curves and the acc_ratio scatter.
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

from commbench import collectives as C
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


def _label(record: dict) -> str:
    """backend/algorithm (or torch/library, or the model's name), ranks, nodes."""
    if record["backend"] == "model":
        what = f"model {record['library']} {record.get('algorithm') or ''}".strip()
    elif record["backend"] == "torch":
        what = f"torch/{record['library']}"
    else:
        what = f"{record['backend']}/{record.get('algorithm') or '-'}"
    nodes = record.get("nnodes") or 1
    return f"{what}, {record['world_size']} ranks" + (f" on {nodes} nodes" if nodes > 1 else "")


def collect_series(records: list[dict]) -> list[Series]:
    """Group timed result records into one series per (collective, setup, kind), in-place where it exists."""
    results = [r for r in records if r.get("record") == "result" and r.get("time_us")]
    in_place = {(r["collective"], r["backend"]) for r in results if r["placement"] == "in-place"}
    groups: dict[tuple, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r["placement"] != "in-place" and (r["collective"], r["backend"]) in in_place:
            continue
        kind = PREDICTED if r.get("kind") == PREDICTED else MEASURED
        groups[(r["collective"], _label(r), kind)][r["nbytes"]].append(r)
    series = []
    for (collective, label, kind), points in sorted(groups.items()):
        sizes = sorted(points)
        times = [sorted(p["time_us"] for p in points[s])[len(points[s]) // 2] for s in sizes]  # median of repeats
        world = next(iter(points.values()))[0]["world_size"]
        busbw = [C.bandwidths_gbps(collective, s, world, t)[1] for s, t in zip(sizes, times)]
        series.append(Series(collective, label, kind, tuple(sizes), tuple(times), tuple(busbw)))
    return series


def model_series(records: list[dict], hw) -> list[Series]:
    """The model's prediction of every measured setup in `records` (dashed beside it)."""
    from commbench.analysis.fit import LIBRARY_ALGORITHM, predict_records

    measured = [r for r in records if r.get("record") == "result" and r.get("kind", MEASURED) == MEASURED
                and r.get("time_us") and r["collective"] in LIBRARY_ALGORITHM]
    if not measured:
        return []
    times = predict_records(measured, hw)
    predicted = []
    for r, t in zip(measured, times):
        predicted.append({**r, "time_us": float(t), "kind": PREDICTED})
    return collect_series(predicted)


def plot(series: list[Series], out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for collective in sorted({s.collective for s in series}):
        mine = [s for s in series if s.collective == collective]
        labels = sorted({s.label for s in mine})
        colours = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
        fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5))
        for s in mine:
            style = "-" if s.kind == MEASURED else "--"
            marker = "o" if s.kind == MEASURED else None
            name = s.label + ("" if s.kind == MEASURED else " (predicted)")
            ax_bw.plot(s.nbytes, s.busbw_gbps, style, marker=marker, ms=3, color=colours[s.label], label=name)
            ax_t.plot(s.nbytes, s.time_us, style, marker=marker, ms=3, color=colours[s.label], label=name)
        for ax, ylabel in ((ax_bw, "bus bandwidth (GB/s, 1e9 B/s)"), (ax_t, "time per call (us)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("message size (bytes per rank)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_size_label))
        ax_t.set_yscale("log")
        ax_bw.set_title(f"{collective}: bus bandwidth")
        ax_t.set_title(f"{collective}: time")
        ax_bw.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{collective}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


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
            lines.append(f"| {s.collective} | {s.label} | {s.kind} | {len(s.nbytes)} | {s.time_us[0]:.3g} us at "
                         f"{s.nbytes[0]} B | {s.busbw_gbps[-1]:.3g} GB/s at {s.nbytes[-1]} B | "
                         f"{max(s.busbw_gbps):.3g} GB/s |")
        lines += ["", "Solid: measured; dashed: predicted by the cost model. busbw as nccl-tests defines it "
                  "(docs/metrics.md).", ""]
    lines += list(extra)
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in pngs]
    path = os.path.join(out_dir, "index.md")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


class ReportError(ValueError):
    """The files hold nothing the report draws."""


def read_all(paths: list[str], warn=None) -> list[dict]:
    """Every record of the files, each line checked (results.read_records: RecordError names the file and
    line); ReportError when none is a timed result, an ok proxy summary or a scaling point."""
    records = [r for p in paths for r in read_records(p, warn)]
    drawable = any(r["record"] == "result" and r.get("time_us") or r["record"] == "scaling"
                   or r["record"] == "proxy" and r.get("status", "ok") == "ok" for r in records)
    if not drawable:
        raise ReportError("no timed result, proxy or scaling records in " + ", ".join(paths))
    return records


def write_report(records: list[dict], paths: list[str], out_dir: str, hw=None) -> tuple[str, list[str]]:
    """Write the PNGs and index.md of records read by read_all; returns (index path, png paths)."""
    from commbench.analysis import report_steps as R

    series = collect_series(records) + (model_series(records, hw) if hw is not None else [])
    steps = R.step_rows(records)
    os.makedirs(out_dir, exist_ok=True)
    pngs = plot(series, out_dir) if series else []
    if steps:
        pngs.append(R.plot_steps(steps, out_dir))
    pngs += [p for p in (R.plot_scaling(records, out_dir), R.plot_acc_ratio(records, out_dir)) if p]
    return write_index(series, pngs, out_dir, paths, R.index_lines(steps, records)), pngs


def report(paths: list[str], out_dir: str, hw=None, warn=None) -> tuple[str, list[str]]:
    """Read the files, then write the PNGs and index.md; returns (index path, png paths)."""
    return write_report(read_all(paths, warn), paths, out_dir, hw)
