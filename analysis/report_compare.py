"""The report's before/after chart of `commbench compare`: for each compared setup, the metric
(busbw or time) against size for base and new, the band around base inside which compare
reports no change (the larger of the threshold and the points' measured noise, as its verdicts
use), and the regressions and improvements marked. From `compare` records (compare --json),
or from a comparison directly (compare --plot)."""
from __future__ import annotations

import math
import os
from collections import defaultdict

from commbench.analysis.report_steps import save_png

SETUP_FIELDS = ("collective", "backend", "library", "algorithm", "dtype", "op", "placement", "world_size", "nnodes")
MARKS = {"regression": ("v", "#c44e52"), "improvement": ("^", "#55a868")}


def _panel_title(key: tuple, points: list[dict]) -> str:
    collective, backend, library, algorithm, dtype, op, placement, world, nodes = key[1:]
    what = f"{backend}/{library}" + (f"/{algorithm}" if algorithm and algorithm != library else "")
    counts = {v: sum(1 for p in points if p["verdict"] == v) for v in ("regression", "improvement", "within noise")}
    said = ", ".join(f"{n} {v}{'s' if n != 1 and v != 'within noise' else ''}" for v, n in counts.items() if n)
    return (f"{collective} {dtype}{' ' + op if op else ''}, {what}, {world} ranks"
            + (f" on {nodes} nodes" if nodes and nodes > 1 else "") + f", {placement}\n{said or 'no change'}")


def plot_compare(records: list[dict], out_dir: str, name: str = "compare.png",
                 names: tuple[str, str] = ("base", "new")) -> str | None:
    """One panel per compared setup (collective, backend, ..., placement) of every `compare` record
    with both values; None when there is none."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("record") == "compare" and r.get("base") and r.get("new"):
            groups[(r.get("_file", ""), *(r.get(f) for f in SETUP_FIELDS))].append(r)
    if not groups:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(2, len(groups))
    rows = math.ceil(len(groups) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.4 * rows), squeeze=False)
    for ax, (key, points) in zip(axes.flat, sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0])))):
        _draw(ax, sorted(points, key=lambda p: p["nbytes"]), names)
        ax.set_title(_panel_title(key, points), fontsize=9)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    files = sorted({key[0] for key in groups if key[0]})
    fig.suptitle(f"before/after: {names[0]} vs {names[1]}" + (f" ({', '.join(map(os.path.basename, files))})"
                                                               if files else ""), fontsize=10)
    return save_png(fig, out_dir, name)


def no_change_band(point: dict) -> tuple[float, float]:
    """The values of new that compare calls `same` or `within noise` for this point: |new / base - 1|
    within the larger of the threshold and the noise (analysis/compare.py, verdict)."""
    allowed = max(point["threshold_pct"], point.get("noise_pct") or 0.0) / 100.0
    return point["base"] * max(0.0, 1.0 - allowed), point["base"] * (1.0 + allowed)


def _draw(ax, points: list[dict], names: tuple[str, str]) -> None:
    import matplotlib

    from commbench.sizes import format_size

    sizes = [p["nbytes"] for p in points]
    base, new = [p["base"] for p in points], [p["new"] for p in points]
    low, high = zip(*(no_change_band(p) for p in points))
    ax.fill_between(sizes, [max(v, b * 0.01) for v, b in zip(low, base)], high,  # a log axis holds no 0
                    color="#4c72b0", alpha=0.15, lw=0, label="no change: base +- the larger of threshold and noise")
    ax.plot(sizes, base, "o-", ms=3, color="#4c72b0", label=f"{names[0]} (median)")
    ax.plot(sizes, new, "s--", ms=3, color="#dd8452", label=f"{names[1]} (median)")
    for verdict, (marker, colour) in MARKS.items():
        marked = [(s, n) for s, n, p in zip(sizes, new, points) if p["verdict"] == verdict]
        if marked:
            ax.scatter(*zip(*marked), marker=marker, s=60, color=colour, zorder=3, label=verdict)
        for s, n, p in zip(sizes, new, points):
            if p["verdict"] == verdict and p.get("change_pct") is not None:
                ax.annotate(f"{p['change_pct']:+.0f}%", (s, n), xytext=(6, -3), textcoords="offset points",
                            fontsize=7, color=colour)
    metric = points[0]["metric"]
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=4))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
        lambda value, _pos: format_size(int(value)).replace(" ", "") if value >= 1 else ""))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    positive = [v for v in base + new if v > 0]
    if metric == "time_us" or (positive and max(positive) > 100 * min(positive)):
        ax.set_yscale("log")
    ax.set(xlabel="message size (bytes per rank)",
           ylabel="bus bandwidth (GB/s)" if metric == "busbw_gbps" else "time per call (us)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
