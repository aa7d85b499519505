"""`commbench report`'s timeline.png: one proxy replay's step drawn as it ran beside the step the model
predicts for it. Per run (a replay whose steps record their calls, calls_us): the setup's compute phases as
planned (proxies/setups.py), rank 0's calls in its median step as measured, and, with --hw, the calls as the
cost model times them on the same plan (analysis/scaling.predict_step), coloured by collective."""
from __future__ import annotations

import statistics

from commbench.backends.registry import record_capabilities

COLOURS = {"allreduce": "tab:blue", "allgather": "tab:green", "reduce_scatter": "tab:orange"}
PHASE_COLOURS = {"forward": "0.75", "backward": "0.55", "optimizer": "0.35", "own": "0.9"}
PHASE_NAMES = {"forward": "forward", "backward": "backward", "optimizer": "optimizer", "own": "the setup's own work"}
MAX_RUNS = 10
MARK_ROUNDING_US = 1.0  # marks are written to 0.1 us: a phase's end within this of a mark is at that mark


def timeline_runs(records: list[dict]) -> list[tuple[dict, dict, dict]]:
    """(header, summary, median step) of each replay (or sim proxy) whose steps carry calls_us."""
    headers = {r.get("run_id"): r for r in records if r.get("record") == "header"}
    out = []
    for summary in (r for r in records if r.get("record") == "proxy" and r.get("kind") in ("proxy", "predicted")):
        steps = [r for r in records if r.get("record") == "step" and r.get("run_id") == summary.get("run_id")
                 and not r.get("warmup") and isinstance(r.get("calls_us"), list) and r.get("step_us")]
        header = headers.get(summary.get("run_id"))
        if steps and header and isinstance(header.get("compute_split_us"), dict):
            middle = statistics.median_low([s["step_us"] for s in steps])
            out.append((header, summary, next(s for s in steps if s["step_us"] == middle)))
    return out[:MAX_RUNS]


def _plan_and_prediction(header: dict, summary: dict, hw):
    """The run's plan (compute phases, calls) and, with `hw`, the predicted step's call intervals (a sim proxy's
    own calls are predicted already: none more)."""
    from commbench.analysis.scaling import StepQuestion, predict_step, split_compute, step_plan
    from commbench.topology import Topology

    nodes = int(summary.get("nnodes") or 1)
    topo = Topology(nodes, int(summary["world_size"]) // nodes)
    q = StepQuestion.from_record(summary, split_compute(header["compute_split_us"]), topo)
    plan = step_plan(q, topo)
    predicted = None
    if hw is not None and summary.get("kind") == "proxy":
        algorithm = (header.get("config") or {}).get("algorithm")
        algorithm = "ring" if algorithm in (None, "auto") or not record_capabilities(summary).schedule else algorithm
        predicted = predict_step(q.at(algorithm=algorithm), topo, hw).times
    return plan, predicted


def plot_timeline(records: list[dict], out_dir: str, hw=None, mark: str | None = None) -> str | None:
    """timeline.png of up to MAX_RUNS replays (None: no replay recorded its calls); `mark` (report.model_mark)
    written above it when it draws `hw`'s prediction."""
    from commbench.analysis.report_steps import _plt, mark_figure, save_png

    runs = timeline_runs(records)
    if not runs:
        return None
    plt = _plt()
    shown_phases: set[str] = set()
    shown_kinds: set[str] = set()
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.2 + 1.3 * len(runs)), squeeze=False)
    predicted = [_draw_run(ax, header, summary, step, hw, shown_phases=shown_phases, shown_kinds=shown_kinds)
                 for ax, (header, summary, step) in zip(axes[:, 0], runs)]
    # the legend names what is drawn: the compute's phases (its grey shades) and the collectives the runs have
    keys = [(PHASE_NAMES.get(n, n), PHASE_COLOURS[n]) for n in PHASE_COLOURS if n in shown_phases]
    keys += [(k, c) for k, c in COLOURS.items() if k in shown_kinds]
    keys += [(k, "tab:red") for k in sorted(shown_kinds - set(COLOURS))]
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=c) for _, c in keys], [k for k, _ in keys], loc="lower center",
               ncol=max(1, len(keys)), fontsize=8)
    if any(predicted):  # hw's prediction is drawn: what its file says of it, above it
        mark_figure(fig, mark)
    return save_png(fig, out_dir, "timeline.png", rect=(0, 0.06, 1, 1))


def _draw_run(ax, header: dict, summary: dict, step: dict, hw, *, shown_phases: set[str],
              shown_kinds: set[str]) -> bool:
    """One run's lanes on `ax`: compute, calls measured and, with `hw`, calls predicted; adds the phases and
    collectives drawn to the sets; whether it drew hw's prediction."""
    plan, predicted = _plan_and_prediction(header, summary, hw)
    marks = step.get("compute_marks_us")
    spans = [(p.start_us, p.end_us) for p in plan.phases]
    if isinstance(marks, list) and len(marks) > 1:  # the compute as it ran, on the calls' wall clock
        spans = [(wall_at(marks, start, late=True), wall_at(marks, end, late=False)) for start, end in spans]
    phase_names = [p.name for p in plan.phases]
    lanes = [("compute (as it ran)" if isinstance(marks, list) and len(marks) > 1 else "compute (plan)",
              [(start, end, PHASE_COLOURS.get(name, "0.6")) for (start, end), name in zip(spans, phase_names)])]
    shown_phases.update(phase_names)
    kinds = [c.collective for c in plan.comms]
    shown_kinds.update(kinds[:len(step["calls_us"])])
    measured = "calls predicted" if summary.get("kind") == "predicted" else "calls measured"
    lanes.append((measured, [(s, e, COLOURS.get(k, "tab:red")) for (s, e), k in zip(step["calls_us"], kinds)]))
    if predicted is not None:
        lanes.append(("calls predicted", [(s, e, COLOURS.get(k, "tab:red")) for (s, e), k in
                                           zip(predicted.comm_intervals, kinds)]))
    for row, (_, bars) in enumerate(lanes):
        ax.broken_barh([(s / 1e3, max(e - s, 0.0) / 1e3) for s, e, _ in bars], (row - 0.35, 0.7),
                       facecolors=[c for _, _, c in bars], edgecolor="white", linewidth=0.3)
    ax.axvline(step["step_us"] / 1e3, color="black", linewidth=1)
    if predicted is not None:
        ax.axvline(predicted.step_us / 1e3, color="black", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(lanes)), [name for name, _ in lanes])
    ax.invert_yaxis()
    ax.set_title(f"{summary['model']} {summary.get('setup') or 'ddp'}, {summary['world_size']} ranks on "
                 f"{summary.get('nnodes') or 1} node(s): median step {step['step_us'] / 1e3:.1f} ms "
                 + ("predicted" if summary.get("kind") == "predicted" else "measured")
                 + (f", {predicted.step_us / 1e3:.1f} ms predicted (dashed)" if predicted is not None else ""),
                 fontsize=9)
    ax.set_xlabel("ms from the step's start (rank 0)")
    return predicted is not None


def wall_at(marks: list[list[float]], progress_us: float, late: bool) -> float:
    """Wall time at which the compute reached `progress_us`, from a step's compute_marks_us ([progress, wall],
    in order; a wait is two marks of one progress): `late`, the last time it stood there (a phase begins after
    a wait), else the first (a phase ends before one); between marks the compute ran at an even pace."""
    points = [(float(x), float(wall)) for x, wall in marks]
    if late:
        i = max((k for k, (x, _) in enumerate(points) if x <= progress_us + MARK_ROUNDING_US), default=0)
        j = i + 1
    else:
        j = min((k for k, (x, _) in enumerate(points) if x >= progress_us - MARK_ROUNDING_US),
                default=len(points) - 1)
        i = max(j - 1, 0)
    if j >= len(points) or i == j or points[j][0] <= points[i][0]:
        return points[min(i, len(points) - 1)][1] if late else points[j][1]
    (x0, w0), (x1, w1) = points[i], points[j]
    share = min(max((progress_us - x0) / (x1 - x0), 0.0), 1.0)
    return w0 + share * (w1 - w0)
