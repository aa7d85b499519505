"""The report's training-step plots: proxy/train/predicted step breakdowns, scaling curves
with the ideal line, and the ACSpeed-style scatter of acc_ratio against the baseline's
linearity (one colour per cluster size), from `proxy` and `scaling` records."""
from __future__ import annotations

import os
from collections import defaultdict


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def step_rows(records: list[dict]) -> list[dict]:
    """One row per proxy/train/predicted summary: label and the step split in milliseconds."""
    rows = []
    for r in (r for r in records if r.get("record") == "proxy" and r.get("status", "ok") == "ok"):
        step = r["step_us_p50"] / 1e3
        label = f"{r['model']} {r['kind']}, {r['world_size']} ranks, {r['backend']}/{r['library']}, batch {r['batch']}"
        if r.get("compute_us_p50") is None:  # real training: the step alone
            rows.append({"label": label, "step_ms": step, "parts": None})
            continue
        compute, comm = r["compute_us_p50"] / 1e3, (r.get("comm_us_p50") or 0) / 1e3
        exposed = max(0.0, (r.get("exposed_comm_us_p50") or 0) / 1e3)
        overlapped = min(max(0.0, comm - exposed), compute)
        rows.append({"label": label, "step_ms": step,
                     "parts": (compute - overlapped, overlapped, exposed)})
    return rows


def plot_steps(rows: list[dict], out_dir: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(11, 0.6 * len(rows) + 1.6))
    colours = ("#4c72b0", "#8fbc8f", "#c44e52")
    names = ("compute alone", "compute with communication overlapped", "exposed communication")
    for y, row in enumerate(rows):
        if row["parts"] is None:
            ax.barh(y, row["step_ms"], color="#999999", label="real training step" if y == 0 else None)
            continue
        left = 0.0
        for part, colour, name in zip(row["parts"], colours, names):
            ax.barh(y, part, left=left, color=colour, label=name)
            left += part
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="lower right")
    ax.set_yticks(range(len(rows)), [row["label"] for row in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("step time, median (ms)")
    ax.set_title("Training step: compute, overlapped and exposed communication")
    ax.grid(True, axis="x", alpha=0.3)
    path = save_png(fig, out_dir, "proxy_steps.png")
    return path


def _curves(records: list[dict]) -> dict[tuple, list[dict]]:
    curves: dict[tuple, list[dict]] = defaultdict(list)
    for r in (r for r in records if r.get("record") == "scaling"):  # one curve per setup, never two runs merged
        curves[(r["model"], r["hardware"], r["algorithm"], r["batch"], r["compute"])].append(r)
    return {key: sorted(points, key=lambda p: p["gpus"]) for key, points in curves.items()}


def plot_scaling(records: list[dict], out_dir: str) -> str | None:
    curves = _curves(records)
    if not curves:
        return None
    plt = _plt()
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(13, 5))
    for i, ((model, hw, algorithm, batch, _), points) in enumerate(sorted(curves.items())):
        colour = plt.cm.tab10(i % 10)
        gpus = [p["gpus"] for p in points]
        rate = [p["samples_per_s"] for p in points]
        one = rate[0] / points[0]["speedup"]  # the 1-GPU throughput the speedups are relative to
        ax_t.plot(gpus, rate, "o-", ms=3, color=colour, label=f"{model} on {hw}, {algorithm}, batch {batch}")
        ax_t.plot(gpus, [g * one for g in gpus], ":", color=colour, alpha=0.7)
        ax_l.plot(gpus, [p["linearity"] for p in points], "o-", ms=3, color=colour, label=f"{model}, {algorithm}")
    ax_t.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="throughput (samples/s, all GPUs)",
             title="Predicted throughput (dotted: ideal, N x 1 GPU)")
    ax_l.set(xscale="log", xlabel="GPUs", ylabel="linearity = throughput(N) / (N x throughput(1))",
             title="Predicted scaling linearity", ylim=(0, 1.05))
    for ax in (ax_t, ax_l):
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    path = save_png(fig, out_dir, "scaling.png")
    return path


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


def index_lines(rows: list[dict], records: list[dict]) -> list[str]:
    """Markdown tables of the steps and the scaling points."""
    lines = []
    if rows:
        lines += ["## Training steps", "", "| run | step (ms) | compute alone | overlapped | exposed comm |",
                  "|---|---|---|---|---|"]
        for row in rows:
            parts = row["parts"] or (None, None, None)
            cells = " | ".join("-" if p is None else f"{p:.2f}" for p in parts)
            lines.append(f"| {row['label']} | {row['step_ms']:.2f} | {cells} |")
        lines.append("")
    scaling = [r for r in records if r.get("record") == "scaling"]
    if scaling:
        lines += ["## Predicted scaling", "",
                  "| model | hardware | algorithm | GPUs | samples/s | linearity | acc_ratio |",
                  "|---|---|---|---|---|---|---|"]
        for r in scaling:
            acc = "-" if r.get("acc_ratio") is None else f"{r['acc_ratio']:.3f}"
            lines.append(f"| {r['model']} | {r['hardware']} | {r['algorithm']} | {r['gpus']} | "
                         f"{r['samples_per_s']:.1f} | {r['linearity']:.3f} | {acc} |")
        lines.append("")
    return lines


def save_png(fig, out_dir: str, name: str) -> str:
    """Lay out, write and close one figure as out_dir/name; its path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
