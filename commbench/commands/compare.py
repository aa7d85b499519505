"""`commbench compare`: two sweeps point by point, regressions beyond a threshold failing the command
(exit 1: a CI check), optionally as records and a chart."""
from __future__ import annotations

import os
import sys

import click

from commbench.commands.helpers.common import UsageFault, check_outputs, output_options, warn
from commbench.errors import EXIT_WRONG
from commbench.results import OutputError


@click.command("compare", epilog="""
\b
Examples:
  commbench compare base.jsonl new.jsonl                      # busbw, regressions beyond 5% fail
  commbench compare base.jsonl new.jsonl --metric time --threshold 10 --json cmp.jsonl
  commbench compare base.jsonl new.jsonl --plot before_after.png   # both runs against size, the noise band

\b
Exit codes: 0 no regression, 1 at least one regression, 2 bad input (a file missing or without
result records, no point in common, --threshold <= 0).
""")
@click.argument("base", metavar="BASE.jsonl", type=click.Path(dir_okay=False))
@click.argument("new", metavar="NEW.jsonl", type=click.Path(dir_okay=False))
@click.option("--threshold", "-t", type=float, default=5.0, show_default=True, metavar="PERCENT",
              help="A point worse by more than this is a regression, better by more an improvement.")
@click.option("--metric", "-m", type=click.Choice(["busbw", "time"]), default="busbw", show_default=True,
              help="busbw_gbps (higher is better) or time_us (lower is better).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write one JSON line per point (record: compare).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, metavar="FILE.png",
              help="Draw base and new against size, the band inside which no change is called, the verdicts "
                   "(commbench report draws the same from --json's file).")
@output_options(append=True)
def compare_command(base: str, new: str, threshold: float, metric: str, json_path: str | None,
                    plot_path: str | None, force: bool, append: bool) -> None:
    """Compare two sweeps point by point; exit 1 on any regression (a CI check).

    Result records are matched on collective, backend, library, algorithm, dtype, op,
    placement, world size and size; a point measured several times counts with its median.
    """
    # analysis inside the command: its modules add ~40 ms to every `commbench --help` (commands/fit.py)
    from commbench.analysis import compare as K

    try:
        new_records = K.load(new, warn)
        comparison = K.compare(K.load(base, warn), new_records, metric, threshold, (base, new))
    except K.CompareError as exc:
        raise UsageFault(str(exc)) from exc
    if plot_path and not plot_path.lower().endswith(".png"):
        raise UsageFault(f"--plot {plot_path}: the chart is a PNG; give a file name ending in .png")
    check_outputs(("--json", json_path), ("--plot", plot_path), inputs=(base, new), force=force, append=append,
                  whole=("--plot",))
    setup = K.describe_setup(comparison)
    click.echo(f"# commbench compare: {base} (base) vs {new} (new){': ' + setup if setup else ''}")
    for line in K.format_table(comparison):
        click.echo(line)
    click.echo(K.summary_line(comparison))
    if json_path:
        try:
            K.write_jsonl(comparison, json_path, append)
        except OutputError as exc:
            raise UsageFault(str(exc)) from exc
    if plot_path:
        _plot_comparison(K, comparison, plot_path, (base, new))
    wrong = sum(1 for r in new_records if r.get("record") == "result" and r.get("wrong"))
    if wrong:
        click.echo(f"# {new}: {wrong} point(s) with wrong results (not compared): failing", err=True)
    if comparison.regressions or wrong:
        sys.exit(EXIT_WRONG)


def _plot_comparison(K, comparison, plot_path: str, names: tuple[str, str]) -> None:
    from commbench.analysis.report_compare import plot_compare  # matplotlib

    records = [K.to_record(point, comparison).to_dict() for point in comparison.points]
    try:
        plot_compare(records, os.path.dirname(os.path.abspath(plot_path)), os.path.basename(plot_path),
                     (os.path.basename(names[0]), os.path.basename(names[1])))
    except OSError as exc:
        raise UsageFault(f"cannot write {plot_path}: {exc.strerror or exc}") from exc
    click.echo(f"# wrote {plot_path}")

