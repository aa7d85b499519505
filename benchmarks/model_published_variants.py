"""Interval variants tried against the published corpus (issue 35, item 4), each leave-one-source-out as the shipped
interval is: every row's 80% interval and centre come from the other sources' rows only. Run by
`python benchmarks/model_published.py --variants`; nothing here is shipped unless its figures say so (docs/model.md,
"Narrower intervals: variants tried").

- `pooled`: what predict-scaling ships (split conformal on every other source's residual);
- `per precision`: the residuals of the other sources' rows of the row's own precision class (amp or not), where
  there are 9 or more (an 80% interval of fewer is unbounded), else pooled;
- `scaled by comm share`: locally weighted split conformal (Lei et al. 2018, section 5.2), each residual divided by
  the raw prediction's communication share of its step (comm_us / step_us, at least 0.05) and the row's interval
  multiplied back by its own: errors of the communication model scale with the communication;
- `scaled by 100 ms / step`: the same with a per-step cost's share (a fixed cost per step weighs most at short steps);
- `GPU overlap_slowdown s`: the step term, not measured on a GPU (defaulted 0), set for each held-out source to the
  value of a grid (0-1) that gives the other sources' residuals the least median absolute deviation, then pooled.
"""
from __future__ import annotations

import math
import statistics

import numpy as np

SLOWDOWNS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def _bounds(values: np.ndarray) -> tuple[float, float]:
    from commbench.analysis import calibration as C

    return C.bounds(list(values))


def _figures(rows, residuals: list[np.ndarray], scales: np.ndarray | None, group=None) -> str:
    """Coverage, median width and median |error| of the centred estimate over every row, leave-one-source-out.
    `residuals[i]`: the residuals row i's interval is made from (one array per row: a variant may change them)."""
    n = len(rows)
    scale = np.ones(n) if scales is None else scales
    inside, widths, errors = [], [], []
    for i, row in enumerate(rows):
        others = [j for j in range(n) if rows[j].source != row.source]
        same = [j for j in others if group is None or group(rows[j]) == group(row)]
        kept = same if len(same) >= 9 else others
        z = residuals[i][kept] / scale[kept]
        low, high = (b * scale[i] for b in _bounds(z))
        centre = float(np.median(z)) * scale[i]
        r = residuals[i][i]
        inside.append(low <= r <= high)
        widths.append(high - low)
        errors.append(abs(r - centre))
    return (f"coverage {100 * sum(inside) / n:.1f}%, median width {100 * statistics.median(widths):.2f} points, "
            f"median |error| of the centred estimate {100 * statistics.median(errors):.2f} points")


def report_variants(corpus, predict) -> None:
    """`predict(slowdown)` -> [(linearity, ScalingRecord)] per corpus row, with the GPU overlap_slowdown given."""
    rows = corpus.rows
    published = np.array([row.linearity for row in rows])
    by_s = {s: predict(s) for s in SLOWDOWNS}
    residual = {s: published - np.array([p for p, _ in by_s[s]]) for s in SLOWDOWNS}
    base = residual[0.0]
    comm = np.array([max(0.05, point.comm_us / point.step_us) for _, point in by_s[0.0]])
    per_step = np.array([1e5 / point.step_us for _, point in by_s[0.0]])
    print("\n## Interval variants, leave-one-source-out (issue 35 item 4; targets: width <= 8, |error| <= 3, "
          "coverage >= 80%)\n")
    same = [base] * len(rows)
    print(f"- pooled (shipped): {_figures(rows, same, None)}")
    print(f"- per precision (amp or not): {_figures(rows, same, None, lambda row: row.precision == 'amp')}")
    print(f"- scaled by comm share: {_figures(rows, same, comm)}")
    print(f"- scaled by 100 ms / step: {_figures(rows, same, per_step)}")
    chosen = []
    for row in rows:
        others = [j for j, other in enumerate(rows) if other.source != row.source]
        chosen.append(min(SLOWDOWNS, key=lambda s: _mad(residual[s][others])))
    print(f"- GPU overlap_slowdown s per held-out source ({', '.join(sorted({f'{s:g}' for s in chosen}))}): "
          f"{_figures(rows, [residual[s] for s in chosen], None)}")
    print(f"- correlation of the residuals with the communication share r = {np.corrcoef(base, comm)[0, 1]:.2f} "
          f"(unfloored: {_unfloored_r(base, by_s[0.0]):.2f}), with 100 ms / step r = "
          f"{np.corrcoef(base, per_step)[0, 1]:.2f}")
    for s in SLOWDOWNS[1:]:
        print(f"  - s = {s:g} on every row: {_figures(rows, [residual[s]] * len(rows), None)}; median residual "
              f"{100 * float(np.median(residual[s])):+.2f} points (s = 0: {100 * float(np.median(base)):+.2f})")


def _unfloored_r(residuals: np.ndarray, predicted) -> float:
    return float(np.corrcoef(residuals, [point.comm_us / point.step_us for _, point in predicted])[0, 1])


def _mad(values: np.ndarray) -> float:
    return float(np.median(np.abs(values - np.median(values)))) if len(values) else math.inf
