"""`commbench check`: the cost model's prediction of the user's own runs, row by row, with the error."""
from __future__ import annotations

import os

import click

from commbench.commands.helpers.common import UsageFault, check_outputs, output_options
from commbench.commands.helpers.hw_option import hw_option
from commbench.errors import EXIT_WRONG
from commbench.files import shown

CHECK_EXAMPLES = """
\b
Examples:
  commbench sweep --backend shm --sizes 1K-256M --json shm.jsonl
  commbench fit shm.jsonl -o shm-hw.json
  commbench sweep --backend shm -N 4 --sizes 1K-256M --json shm4.jsonl
  commbench check shm4.jsonl --hw shm-hw.json              # the 2-rank fit, checked on 4 ranks
                                      # (on fewer than 4 cores: rows marked oversubscribed, not judged)
  commbench check p.jsonl --hw hw.json --max-error 10     # a proxy replay's step; exit 1 beyond 10%
  commbench proxy resnet50 -N 2 --validate --json v.jsonl && commbench check v.jsonl v.train.jsonl --hw hw.json
                                      # real DDP training too, its compute taken from the replay beside it

\b
Exit codes: 0 checked (and, with --max-error, the median |error| within it), 1 median |error|
above --max-error, 2 bad input (no file, no point the model can predict; with --max-error, no
row left to judge once oversubscribed runs are left out).
"""


@click.command("check", epilog=CHECK_EXAMPLES)
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@hw_option("The cost model to check: a `commbench fit` output or a preset.", required=True)
@click.option("--max-error", type=float, default=None, metavar="PERCENT",
              help="Exit 1 when the median |error| over the rows exceeds this.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write one check record per row and a check_summary record (JSON Lines).")
@click.option("--include-oversubscribed", is_flag=True,
              help="Count rows of runs with more CPU ranks on a host than its cores in the summary (marked and "
                   "left out by default: the model has no notion of cores).")
@output_options(append=True)
def check_command(files: tuple[str, ...], hw_spec: str, max_error: float | None, json_path: str | None,
                  include_oversubscribed: bool, force: bool, append: bool) -> None:
    """Predict every measured point of sweep and proxy runs with the cost model, and print predicted
    against measured with the error per row (predicted / measured - 1: negative = optimistic), and
    the median and largest |error| (all rows; sweep points >= 64 KiB; proxy steps; training steps, predicted
    with the compute of a replay of the same setup in the same files; layout runs without a given rate, from
    the --hw file's compute block; and a `--compute measured` layout replay's own pieces against the block's).
    Rows of runs whose CPU ranks outnumber their host's cores are marked oversubscribed and left out of the
    summary."""
    from commbench.analysis import check as K
    from commbench.analysis import report as R
    from commbench.analysis.intervals import uncertainty
    from commbench.commands.helpers.hw_option import load_hw, warn_poor
    from commbench.costmodel import HardwareError
    from commbench.results import RecordError

    if max_error is not None and not 0 < max_error < 1e6:
        raise UsageFault(f"--max-error {max_error:g}: a percentage above 0")
    check_outputs(("--json", json_path), inputs=[*files, *([hw_spec] if os.path.exists(hw_spec) else [])],
                  force=force, append=append)
    try:
        hw = load_hw(hw_spec, say_poor=False)
        uncertainty(hw)  # a damaged interval block: one line here, not a traceback per row
        records = R.read_all(list(files))
    except (HardwareError, RecordError, R.ReportError) as exc:
        raise UsageFault(str(exc)) from exc
    rows, notes = K.check(records, hw)
    for note in notes:
        click.echo(f"# note: {shown(note)}")
    if not rows:
        raise UsageFault(f"nothing in {', '.join(files)} that {hw.name} can predict: give sweep (result), proxy "
                         f"replay, or training records beside a replay of the same setup")
    warn_poor(hw, hw_spec)  # after the input is known good: a refusal stays one line
    _table(rows, hw)
    summary = K.summary(rows, include_oversubscribed)
    _summary_lines(rows, summary, include_oversubscribed)
    if json_path:
        _write(json_path, append, [row.to_json() for row in rows] + [{**summary, "hardware": hw.name}])
    if max_error is not None and not summary["all"]["rows"]:
        raise UsageFault("--max-error: no row to judge, every one is of an oversubscribed run (more CPU ranks on a "
                         "host than its cores); --include-oversubscribed judges them anyway")
    if max_error is not None and summary["all"]["median_abs_error"] * 100 > max_error:
        click.echo(f"# median |error| {100 * summary['all']['median_abs_error']:.1f}% is above --max-error "
                   f"{max_error:g}%")
        raise SystemExit(EXIT_WRONG)


def _summary_lines(rows, summary: dict, include_oversubscribed: bool) -> None:
    """The note on oversubscribed rows, and the median and largest |error| of each part of the summary."""
    over = sum(1 for r in rows if r.oversubscribed)
    if over:
        verdict = ("counted in the summary (--include-oversubscribed), though the model has no notion of cores"
                   if include_oversubscribed else "left out of the summary: the model has no notion of cores "
                   "(--include-oversubscribed counts them)")
        click.echo(f"# note: {over} row(s) of runs with more CPU ranks on a host than its cores, marked "
                   f"oversubscribed: {verdict}")
    for key, label in (("all", "all rows"), ("sweep_64k_up", "sweep points >= 64 KiB"), ("proxy_steps", "proxy steps"),
                       ("train_steps", "training steps"), ("compute_pieces", "compute pieces, apart")):
        part = summary[key]
        if part["rows"]:
            coverage = "" if part["coverage"] is None else f", {100 * part['coverage']:.0f}% inside the 80% interval"
            click.echo(f"# {label:<24} {part['rows']:>5} row(s): median |error| "
                       f"{100 * part['median_abs_error']:.1f}%, max {100 * part['max_abs_error']:.1f}%, "
                       f"{part['optimistic']} optimistic{coverage}")


def _write(path: str, append: bool, records: list[dict]) -> None:
    """The check records, one JSON line each, through the one writer of records (ResultSink); a write that
    fails (a full disk) is one line."""
    from commbench.results import OutputError, ResultSink

    try:
        with ResultSink(path, append=append) as sink:
            sink.write_free_form(records)
    except OutputError as exc:
        raise UsageFault(str(exc)) from exc


def _table(rows, hw) -> None:
    """One row per point; every column as wide as its widest cell, so no long name or large time shifts the
    rest. Each time carries its unit: a sweep point's in us, a step's (and its comm's) in ms, as the proxy's and
    train's own tables print them (a 10.9 s step read 10977439.9 before). With intervals, why they are wide where
    they are (intervals.wide_note)."""
    from commbench.analysis.intervals import wide_note

    click.echo(f"# predicted by {shown(hw.name)}; error = predicted / measured - 1")
    width = max(len(r.setup) for r in rows)  # the records' strings as shown (report.read_all)
    whats = [f"{r.what} (training)" if r.kind == "train" else r.what for r in rows]
    measured, predicted = [_time(r, r.measured_us) for r in rows], [_time(r, r.predicted_us) for r in rows]
    spans = [f"{_time(r, r.interval_us[0], unit=False)}-{_time(r, r.interval_us[1])}" if r.interval_us else ""
             for r in rows]
    point_w = max(26, *map(len, whats))
    measured_w, predicted_w = max(12, *map(len, measured)), max(12, *map(len, predicted))
    span_w = max(len("80% interval"), *map(len, spans))
    extra = f"  {'80% interval':>{span_w}}" if any(spans) else ""
    click.echo(f"#{'setup':>{width - 1}}  {'point':<{point_w}} {'measured':>{measured_w}} "
               f"{'predicted':>{predicted_w}} {'error':>8}{extra}")
    for r, what, span, m, p in zip(rows, whats, spans, measured, predicted):
        interval = f"  {span:>{span_w}} {'in' if r.inside else 'OUT'}" if span else ""
        click.echo(f"{r.setup:>{width}}  {what:<{point_w}} {m:>{measured_w}} {p:>{predicted_w}} "
                   f"{100 * r.error:>+7.1f}%{interval}")
    note = wide_note(hw) if any(spans) else None
    if note:
        click.echo(f"# {note}")


def _time(row, time_us: float, unit: bool = True) -> str:
    """A row's time with its unit: us for a sweep point (one decimal, as the sweep's table), ms for a step or
    its comm (two decimals, as the proxy's and train's tables)."""
    if row.kind in ("sweep", "compute"):  # a sweep point, or a piece of a layout rank's compute
        return f"{time_us:.1f}" + (" us" if unit else "")
    return f"{time_us / 1e3:.2f}" + (" ms" if unit else "")
