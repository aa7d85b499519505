"""The report's training-step plots: proxy/train/predicted step breakdowns, scaling curves
with the ideal line, and the ACSpeed-style scatter of acc_ratio against the baseline's
linearity (one colour per cluster size), from `proxy` and `scaling` records."""
from __future__ import annotations

import os
from collections import defaultdict

from commbench.files import shown


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


PARTS = ("compute alone", "compute overlapped with communication", "exposed communication", "other")
COLOURS = ("#4c72b0", "#8fbc8f", "#c44e52", "#dd8452")
COMM, COMM_COLOUR = "communication (allreduces in flight)", "#8172b3"
MIN_MS = 1e-6  # below a nanosecond a part is rounding, drawn as 0


def step_rows(records: list[dict]) -> list[dict]:
    """One row per proxy/train/predicted summary: its label, the medians of its columns (ms), and the
    split of its median step (the measured step whose time is the median, the lower of the two middle
    ones for an even count): compute alone, overlapped, exposed, other, adding up to that step."""
    steps: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("record") == "step" and not r.get("warmup"):
            steps[(r.get("_file"), r.get("run_id"))].append(r)
    rows = []
    for r in (r for r in records if r.get("record") == "proxy" and r.get("status", "ok") == "ok"):
        nodes = r.get("nnodes") or 1
        layout = f"{nodes}x{r['world_size'] // nodes}" if nodes > 1 and r["world_size"] % nodes == 0 else ""
        parallel = (r.get("layout") or {}).get("layout")  # proxy or train --layout: the parallel layout's name
        label = (f"{r['model']} {r['kind']}, {r['world_size']} ranks{f' ({layout})' if layout else ''}, "
                 f"{f'layout {parallel}, ' if parallel else ''}{r['backend']}/{r['library']}, batch {r['batch']}")
        medians = {k: _ms(r.get(f"{k}_us_p50")) for k in ("compute", "comm", "exposed_comm", "other", "step")}
        rows.append({"label": label, "file": r.get("_file") or "", "step_ms": medians["step"], "medians": medians,
                     **_median_step(r, steps.get((r.get("_file"), r.get("run_id")), []))})
    files = {row["label"]: {other["file"] for other in rows if other["label"] == row["label"]} for row in rows}
    for row in rows:  # two runs of one setup: named by their files
        if len(files[row["label"]]) > 1:
            row["label"] += f", {os.path.basename(row['file'])}"
    return rows


def _median_step(summary: dict, steps: list[dict]) -> dict:
    """The split of the run's median step: {'parts': (alone, overlapped, exposed, other) ms or None
    (real training: a step is not split), 'comm_ms', 'split_ms' (the step split), 'derived'}.
    A file written before `other` existed measured exposed as step - compute: it is capped at the
    step's communication here and the rest shown as other (derived: True)."""
    timed = sorted((s for s in steps if s.get("step_us") is not None), key=lambda s: s["step_us"])
    step = timed[(len(timed) - 1) // 2] if timed else {k: summary.get(f"{k}_p50") for k in
                                                        ("compute_us", "comm_us", "exposed_comm_us", "other_us",
                                                         "step_us")}
    if step.get("compute_us") is None or step.get("step_us") is None:
        return {"parts": None, "comm_ms": None, "split_ms": _ms(step.get("step_us"))}
    compute, comm, total = _ms(step["compute_us"]), _ms(step.get("comm_us")) or 0.0, _ms(step["step_us"])
    exposed = max(0.0, _ms(step.get("exposed_comm_us")) or 0.0)
    derived = step.get("other_us") is None
    if derived:
        exposed = min(exposed, comm)
    other = max(0.0, total - compute - exposed) if derived or not timed else _ms(step["other_us"])
    if not derived and timed:  # a calibrated prediction: what the calibration adds is drawn with other (neither
        other += _ms(step.get("calibration_us")) or 0.0  # compute nor communication), so the parts make the step
    overlapped = min(max(0.0, comm - exposed), compute)
    return {"parts": (compute - overlapped, overlapped, exposed, other), "comm_ms": comm, "split_ms": total,
            "derived": derived}


def _ms(value_us: float | None) -> float | None:
    return None if value_us is None else value_us / 1e3


def ms_text(value_ms: float) -> str:
    """Four significant digits, never in exponent notation (21210 ms, not 2.121e+04 ms); any unit."""
    import numpy as np

    return np.format_float_positional(value_ms, precision=4, unique=False, fractional=False, trim="-")


SMALL_PARTS = ("compute", "communication", "exposed comm.", "other")  # the right panel's bars of each run
COMPUTE_COLOUR = "#64b5cd"
COMPUTE = "compute (alone + overlapped)"


def _plot_small_parts(ax, rows: list[dict]) -> None:
    """Per split row: its compute (alone + overlapped), communication, exposed communication and other (ms) as
    bars on a log axis, each named on the axis and its value written; a zero is written, not drawn."""
    bars = [(y + offset, value, colour, name) for y, row in enumerate(rows) if row["parts"] for offset, value, colour,
            name in zip((-0.3, -0.1, 0.1, 0.3), (sum(row["parts"][:2]), row["comm_ms"], *row["parts"][2:]),
                        (COMPUTE_COLOUR, COMM_COLOUR, *COLOURS[2:]), SMALL_PARTS)]
    values = [value for _, value, _, _ in bars if value >= MIN_MS]
    floor = min(values, default=1.0) / 3
    for y, value, colour, _ in bars:
        if value >= MIN_MS:
            ax.barh(y, value, height=0.18, color=colour)
        ax.text(max(value, floor), y, f" {ms_text(value)}" if value >= MIN_MS else " 0", va="center", fontsize=6.5)
    for y, row in enumerate(rows):
        if row["parts"] is None:
            ax.text(floor, y, " real training: its step is not split", va="center", fontsize=7)
    if values:
        ax.set_xlim(floor, max(values) * 4)
    ax.set_yticks([y for y, _, _, _ in bars], [name for _, _, _, name in bars], fontsize=7)
    ax.yaxis.tick_right()
    ax.yaxis.set_label_position("right")
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the rows of the left panel, top down
    ax.set(xscale="log", xlabel="time in the median step (ms, log axis)", ylabel="part of the step",
           title="The median step's own parts (ms)")
    import matplotlib.ticker

    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels ran into each other
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _pos: f"{value:g}"))


def mark_figure(fig, mark: str | None) -> None:
    """Write `mark` (report.model_mark: why the predictions drawn are not to be trusted) above the whole
    picture in red, wrapped to its width; nothing without one."""
    if mark:
        import textwrap

        width = max(40, int(fig.get_figwidth() * 12))  # characters of 9 pt bold on a line of the figure
        text = "\n".join(textwrap.fill(line, width) for line in mark.split("\n")).replace("$", r"\$")
        fig.suptitle(text, color="#b00000", fontsize=9, fontweight="bold")


def plot_steps(rows: list[dict], out_dir: str) -> str:
    """Left: each run's median step as shares of it (100%), so a 2 ms step reads as well as a 2 s one,
    its time written at the end. Right: its compute, communication, exposed communication and other time on
    a log axis, each bar named, where a bar of 1% of the step is as readable as the step itself."""
    plt = _plt()
    fig, (ax, ax_ms) = plt.subplots(1, 2, figsize=(14, 0.9 * len(rows) + 2.0), gridspec_kw={"width_ratios": (3, 2)})
    for y, row in enumerate(rows):
        if row["parts"] is None:
            ax.barh(y, 100.0, color="#999999", label="real training step (not split)")
            ax.text(101, y, f"{ms_text(row['split_ms'])} ms", va="center", fontsize=8)
            continue
        left, total = 0.0, sum(row["parts"]) or 1.0
        for part, colour, name in zip(row["parts"], COLOURS, PARTS):
            share = 100.0 * part / total
            ax.barh(y, share, left=left, color=colour, label=name)
            if share >= 6:
                ax.text(left + share / 2, y, f"{share:.0f}%", ha="center", va="center", fontsize=7, color="white")
            left += share
        ax.text(101, y, f"{ms_text(row['split_ms'])} ms" + (" *" if row.get("derived") else ""), va="center",
                fontsize=8)
    _plot_small_parts(ax_ms, rows)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    from matplotlib.patches import Patch

    unique[COMPUTE] = Patch(color=COMPUTE_COLOUR)
    unique[COMM] = Patch(color=COMM_COLOUR)
    fig.legend(unique.values(), unique.keys(), fontsize=8, loc="lower center", ncol=(len(unique) + 1) // 2,
               frameon=False)  # two rows, each entry whole
    ax.set_yticks(range(len(rows)), [row["label"] for row in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # top down, row by row beside the right panel's bars
    ax.set(xlim=(0, 118), xlabel="share of the median step (%); its time at the right",
           title="The median step itself: compute + exposed communication + other")
    ax_ms.grid(True, axis="x", which="both", alpha=0.3)
    ax.grid(True, axis="x", alpha=0.3)
    path = save_png(fig, out_dir, "proxy_steps.png", rect=(0, 0.5 / fig.get_figheight(), 1, 1))  # the legend's
    return path


def _curves(records: list[dict]) -> dict[tuple, list[dict]]:
    curves: dict[tuple, list[dict]] = defaultdict(list)
    for r in (r for r in records if r.get("record") == "scaling"):  # one curve per setup, never two runs merged
        curves[(r["model"], r["hardware"], r["algorithm"], r["batch"], r["compute"])].append(r)
    return {key: sorted(points, key=lambda p: p["gpus"]) for key, points in curves.items()}


MAX_DOUBTS, DOUBT_CHARS = 4, 300  # what a picture's mark holds of them at most (a crafted file may hold any number)


def scaling_mark(records: list[dict]) -> str:
    """The doubts predict-scaling's records carry of their hardware files (ScalingRecord.hardware_doubts), a line
    each, escaped as a file's text is shown, the first MAX_DOUBTS cut to DOUBT_CHARS; "" when none says any."""
    doubts = {d[:DOUBT_CHARS] for r in records if r.get("record") == "scaling"
              and isinstance(r.get("hardware_doubts"), list)
              for d in [d for d in r["hardware_doubts"][:64] if isinstance(d, str)][:MAX_DOUBTS]}
    return "\n".join(shown(d) for d in sorted(doubts)[:MAX_DOUBTS])


def plot_scaling(records: list[dict], out_dir: str) -> str | None:
    curves = _curves(records)
    if not curves:
        return None
    plt = _plt()
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(13, 5))
    measured = measured_runs(records)
    drawn: set[tuple] = set()
    for i, ((model, hw, algorithm, batch, _), points) in enumerate(sorted(curves.items())):
        colour = plt.cm.tab10(i % 10)
        gpus = [p["gpus"] for p in points]
        rate = [p["samples_per_s"] for p in points]
        one = rate[0] / points[0]["speedup"]  # the 1-GPU throughput the speedups are relative to
        ax_t.plot(gpus, rate, "o-", ms=3, color=colour, label=f"{model} on {hw}, {algorithm}, batch {batch}")
        ax_t.plot(gpus, [g * one for g in gpus], ":", color=colour, alpha=0.7)
        ax_l.plot(gpus, [p["linearity"] for p in points], "o-", ms=3, color=colour, label=f"{model}, {algorithm}")
        if any(p.get("estimate") == "calibrated" for p in points):  # the model's own figure beside the estimate
            ax_l.plot(gpus, [p.get("raw_linearity", p["linearity"]) for p in points], "--", lw=1, color=colour,
                      alpha=0.6, label=f"{model}, {algorithm}: raw (before calibration)")
        for key, runs in measured.items():
            if key[:2] == (model, batch) and key not in drawn:
                drawn.add(key)
                _draw_measured(ax_t, ax_l, key, runs, colour)
    ax_t.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="throughput (samples/s, all GPUs)",
             title="Throughput: predicted (line; dotted: ideal, N x 1 GPU)"
                   + (", measured (markers)" if drawn else ""))
    ax_l.set(xscale="log", xlabel="GPUs", ylabel="linearity = throughput(N) / (N x throughput(1))",
             title="Scaling linearity" + (" (measured: where its own 1-rank run exists)" if drawn else ""),
             ylim=(0, 1.05))
    import matplotlib

    ticks = sorted({p["gpus"] for points in curves.values() for p in points}
                   | {r["world_size"] for key in drawn for r in measured[key]})
    plain = matplotlib.ticker.FuncFormatter(lambda value, _pos: f"{value:g}")
    for ax in (ax_t, ax_l):
        ax.grid(True, which="both", alpha=0.3)
        ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=8, rotation=45 if len(ticks) > 8 else 0)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_t.yaxis.set_major_formatter(plain)
    ax_t.yaxis.set_minor_formatter(plain if ax_t.get_ylim()[1] < 10 * ax_t.get_ylim()[0] else
                                   matplotlib.ticker.NullFormatter())
    ax_t.legend(fontsize=8)
    ax_l.legend(fontsize=8)
    mark_figure(fig, scaling_mark(records))
    path = save_png(fig, out_dir, "scaling.png")
    return path


MEASURED_MARKERS = {"train": ("X", "real DDP training"), "proxy": ("D", "proxy replay")}


def measured_runs(records: list[dict]) -> dict[tuple, list[dict]]:
    """Measured runs (train and proxy summaries, status ok) that a predicted scaling curve can be set
    beside: (model, batch, kind, backend, library) -> the runs, by world size."""
    runs: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("record") == "proxy" and r.get("kind") in MEASURED_MARKERS and r.get("status", "ok") == "ok" \
                and r.get("samples_per_s"):
            runs[(r["model"], r["batch"], r["kind"], r["backend"], r["library"])].append(r)
    return {key: sorted(points, key=lambda p: p["world_size"]) for key, points in runs.items()}


def _draw_measured(ax_t, ax_l, key: tuple, runs: list[dict], colour) -> None:
    """A measured setup's throughput at each world size (markers, no line: separate runs); its linearity
    against its own 1-rank run where the files hold one."""
    _, _, kind, backend, library = key
    marker, what = MEASURED_MARKERS[kind]
    label = f"measured: {what}, {backend}/{library}"
    ax_t.scatter([r["world_size"] for r in runs], [r["samples_per_s"] for r in runs], marker=marker, s=45,
                 facecolors="none" if kind == "proxy" else colour, edgecolors=colour, zorder=3, label=label)
    one = next((r["samples_per_s"] for r in runs if r["world_size"] == 1), None)
    if one:
        ax_l.scatter([r["world_size"] for r in runs], [r["samples_per_s"] / (r["world_size"] * one) for r in runs],
                     marker=marker, s=45, facecolors="none" if kind == "proxy" else colour, edgecolors=colour,
                     zorder=3, label=label)


def plot_acc_ratio(records: list[dict], out_dir: str) -> str | None:
    """x: the baseline's linearity, y: acc_ratio of the candidate, one colour per GPU count."""
    scaling = [r for r in records if r.get("record") == "scaling"]
    def key(r: dict) -> tuple:
        return r["model"], r["hardware"], r["batch"], r["compute"], r["gpus"]
    base = {key(r): r for r in scaling if r["algorithm"] == r.get("baseline")}
    points = [(base[key(r)], r) for r in scaling if r.get("acc_ratio") is not None and key(r) in base]
    if not points:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 6))
    sizes = sorted({c["gpus"] for _, c in points})
    colours = {g: plt.cm.viridis(i / max(1, len(sizes) - 1)) for i, g in enumerate(sizes)}
    for b, c in points:
        ax.scatter(b["linearity"], c["acc_ratio"], color=colours[c["gpus"]], s=30)
        ax.annotate(c["model"], (b["linearity"], c["acc_ratio"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    for g in sizes:
        ax.scatter([], [], color=colours[g], label=f"{g} GPUs")
    ax.axhline(1.0, color="grey", lw=0.8)
    b0, c0 = points[0]
    ax.set(xlabel=f"baseline ({b0['algorithm']}) linearity", ylabel=f"acc_ratio = {c0['algorithm']} / {b0['algorithm']}"
           " throughput", title="Speed-up of the candidate over the baseline (ACSpeed-style)", xlim=(0, 1.05))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, title="cluster size")
    path = save_png(fig, out_dir, "acc_ratio.png")
    return path


def save_png(fig, out_dir: str, name: str, rect: tuple[float, float, float, float] | None = None) -> str:
    """Lay out (within `rect` of the figure: room for a legend below), write and close one figure as
    out_dir/name; its path."""
    import matplotlib.pyplot as plt

    fig.tight_layout(rect=rect)
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
