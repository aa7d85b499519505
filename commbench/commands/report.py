"""`commbench report`: plots (PNG) and a summary (index.md) of any result files, beside a cost model's
prediction of them when --hw is given."""
from __future__ import annotations

import click

from commbench.commands.common import UsageFault, check_directory, output_options, warn
from commbench.commands.fit import warn_poor
from commbench.costmodel import HardwareError, load_hardware
from commbench.results import RecordError


@click.command("report", epilog="""
\b
Examples:
  commbench report shm.jsonl gloo.jsonl -o report/
  commbench report shm.jsonl --hw shm-hw.json -o report/     # the fitted model dashed beside the measurements
""")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory to write.")
@click.option("--hw", "hw_spec", default=None, metavar="FILE|PRESET",
              help="Also draw this cost model's prediction of every measured setup (dashed).")
@output_options(append=False)
def report_command(files: tuple[str, ...], out_dir: str, hw_spec: str | None, force: bool) -> None:
    """Plot bus bandwidth and time against size (PNG) and summarise the runs (index.md)."""
    # analysis inside the command: report draws with matplotlib, and the analysis modules add ~40 ms to
    # every `commbench --help` (commands/fit.py)
    from commbench.analysis import report as R
    from commbench.analysis.fit import FitError

    try:
        hw = load_hardware(hw_spec) if hw_spec else None
        warn_poor(hw, hw_spec)
        records = R.read_all(list(files), warn)
    except (HardwareError, RecordError, R.ReportError) as exc:
        raise UsageFault(str(exc)) from exc
    check_directory(out_dir, "index.md", force)
    try:
        index, pngs = R.write_report(records, list(files), out_dir, hw, warn)
    except FitError as exc:  # --hw: a measured point no schedule models
        raise UsageFault(str(exc)) from exc
    except OSError as exc:
        raise UsageFault(f"cannot write the report to {out_dir}: {exc.strerror or exc}") from exc
    for path in pngs:
        click.echo(f"# wrote {path}")
    click.echo(f"# wrote {index}")

