"""The report's index.md tables of training steps (analysis/report_steps.py draws the same rows): each run's
column medians, the median step's own parts that add up to it, each parallel layout's wait per dimension, and
the predicted scaling points."""
from __future__ import annotations

import statistics
from collections import defaultdict


def index_lines(rows: list[dict], records: list[dict]) -> list[str]:
    """Markdown tables of the steps and the scaling points."""
    lines = []
    if rows:
        lines += ["## Training steps", "", "Each column's own median over the measured steps (ms); a step "
                  "is compute + exposed communication + other (docs/proxies.md), their medians need not add up.", "",
                  "| run | step | compute | comm | exposed comm | other |", "|---|---|---|---|---|---|"]
        for row in rows:
            cells = " | ".join("-" if row["medians"][k] is None else f"{row['medians'][k]:.2f}"
                               for k in ("step", "compute", "comm", "exposed_comm", "other"))
            mark = " \\*" if row.get("derived") else ""
            lines.append(f"| {row['label']}{mark} | {cells} |")
        lines += _median_step_lines(rows)
        if any(row.get("derived") for row in rows):
            lines.append("\n\\* written before commbench measured exposed communication apart: its exposed column "
                         "is step - compute, as then computed; the chart caps it at the step's communication and "
                         "draws the rest as other.")
        lines.append("")
    lines += _layout_lines(rows, records)
    scaling = [r for r in records if r.get("record") == "scaling"]
    if scaling:
        lines += ["## Predicted scaling", "",
                  "samples/s and linearity are the estimate (`estimate`: calibrated, the raw prediction moved by the "
                  "corpus calibration's median error; raw, the cost model's own); raw linearity is the cost model's "
                  "own figure, before any calibration (docs/model.md).", "",
                  "| model | hardware | algorithm | GPUs | samples/s | linearity | linearity 80% | raw linearity | "
                  "estimate | acc_ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in scaling:
            acc = "-" if r.get("acc_ratio") is None else f"{r['acc_ratio']:.3f}"
            span = r.get("linearity_interval")
            span = f"{span[0]:.3f}-{span[1]:.3f}" if span else "-"
            raw = r.get("raw_linearity")
            lines.append(f"| {r['model']} | {r['hardware']} | {r['algorithm']} | {r['gpus']} | "
                         f"{r['samples_per_s']:.1f} | {r['linearity']:.3f} | {span} | "
                         f"{'-' if raw is None else f'{raw:.3f}'} | {r.get('estimate') or '-'} | {acc} |")
        lines.append("")
    return lines


def _layout_lines(rows: list[dict], records: list[dict]) -> list[str]:
    """Per parallel layout replayed (proxy --layout): each dimension's median wait per step (ms, rank 0's
    exposed_by_dim_us; pp: the bubble with the transfers)."""
    waits: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("record") == "step" and not r.get("warmup") and r.get("exposed_by_dim_us") is not None:
            waits[(r.get("_file"), r.get("run_id"))].append(r["exposed_by_dim_us"])
    summaries = [r for r in records if r.get("record") == "proxy" and r.get("status", "ok") == "ok"]
    found = [(row, waits[(r.get("_file"), r.get("run_id"))]) for row, r in zip(rows, summaries)
             if waits.get((r.get("_file"), r.get("run_id")))]
    if not found:
        return []
    dims = [d for d in ("tp", "cp", "ep", "pp", "dp") if any(d in w for _, steps in found for w in steps)]
    lines = ["## Parallel layouts", "", "Rank 0's wait per dimension and step, the median over the measured steps (ms; "
             "pp: the pipeline's bubble with its transfers; 0 where the dimension made no call).", "",
             "| run | " + " | ".join(dims) + " |", "|---|" + "---|" * len(dims)]
    for row, steps in found:
        lines.append(f"| {row['label']} | " + " | ".join(
            f"{statistics.median(w.get(d, 0.0) for w in steps) / 1e3:.2f}" for d in dims) + " |")
    return [*lines, ""]


def _median_step_lines(rows: list[dict]) -> list[str]:
    """The chart's figures: the median step's own parts (ms), which add up to that step; each column's
    median above need not (a step with the median time is not the one with the median communication)."""
    split = [row for row in rows if row["parts"]]
    if not split:
        return []
    lines = ["", "The median step itself (proxy_steps.png draws these): its own parts, which add up to it.", "",
             "| run | step | compute | comm | exposed comm | other |", "|---|---|---|---|---|---|"]
    for row in split:
        alone, overlapped, exposed, other = row["parts"]
        lines.append(f"| {row['label']} | {row['split_ms']:.2f} | {alone + overlapped:.2f} | {row['comm_ms']:.2f} | "
                     f"{exposed:.2f} | {other:.2f} |")
    return lines
