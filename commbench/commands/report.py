"""`commbench report`: plots (PNG) and a summary (index.md) of any result files, beside a cost model's
prediction of them when --hw is given."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from commbench.commands.helpers.common import UsageFault, check_directory, output_options, warn
from commbench.commands.helpers.hw_option import hw_option, load_hw
from commbench.costmodel import HardwareError
from commbench.results import RecordError


@dataclass(frozen=True)
class ReportOptions:
    """`report`'s command line as one frozen value, built once from click's parameters: each field is the
    option's destination name, with click's default."""
    files: tuple[str, ...]
    out_dir: str | None = None
    stragglers: bool = False
    spike_factor: float = 3.0
    json_path: str | None = None
    hw_spec: str | None = None
    force: bool = False

    @classmethod
    def from_click(cls, params: dict[str, Any]) -> ReportOptions:
        """The options from click's parameters (a TypeError names an option without a field)."""
        return cls(**params)


@click.command("report", epilog="""
\b
Examples:
  commbench report shm.jsonl gloo.jsonl -o report/
  commbench report shm.jsonl --hw shm-hw.json -o report/     # the fitted model dashed beside the measurements
  commbench report --stragglers sweep.jsonl --json stragglers.json   # the slowest rank and node, spikes
""")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out_dir", default=None, type=click.Path(file_okay=False),
              help="The directory to write the plots (PNG) and index.md in: required, except with --stragglers "
                   "(which prints its report instead).")
@click.option("--stragglers", is_flag=True,
              help="Print instead the slowest rank and node of every point (the wait it caused the others), the "
                   "iterations that spiked and when, and per node (nccl-tests' analyze_perf_json --straggler "
                   "--spikes --nodes).")
@click.option("--spike", "spike_factor", type=float, default=3.0, show_default=True, metavar="K",
              help="--stragglers: an iteration over K x its point's median is a spike.")
@click.option("--json", "json_path", default=None, type=click.Path(dir_okay=False),
              help="--stragglers: also write the report as one JSON document.")
@hw_option("Also draw this cost model's prediction of every measured setup (dashed).")
@output_options(append=False)
def report_command(**params) -> None:
    """Plot bus bandwidth and time against size (PNG) and summarise the runs (index.md); with
    --stragglers, which rank and node held each point up and which iterations spiked."""
    o = ReportOptions.from_click(params)
    if o.stragglers:
        if o.out_dir or o.hw_spec:
            raise UsageFault(f"--stragglers prints its report (and --json writes it): not with "
                             f"{'-o' if o.out_dir else '--hw'}")
        from commbench.commands.report_stragglers import stragglers as straggler_report

        return straggler_report(list(o.files), o.spike_factor, o.json_path, o.force)
    if o.out_dir is None:
        raise UsageFault("missing -o/--output DIRECTORY (or --stragglers, which prints its report)")
    if o.json_path:
        raise UsageFault("--json writes the --stragglers report: give --stragglers, or leave --json out")
    _write_report(o, o.out_dir)


def _write_report(o: ReportOptions, out_dir: str) -> None:
    """The plots and index.md of `o.files` in `out_dir`, with --hw's prediction beside them."""
    # analysis inside the command: report draws with matplotlib, and the analysis modules add ~40 ms to
    # every `commbench --help` (commands/fit.py)
    from commbench.analysis import report as R
    from commbench.analysis.fit import FitError

    files = list(o.files)
    try:
        hw = load_hw(o.hw_spec) if o.hw_spec else None
        records = R.read_all(files, warn)
    except (HardwareError, RecordError, R.ReportError) as exc:
        raise UsageFault(str(exc)) from exc
    check_directory(out_dir, "index.md", o.force)
    try:
        index, pngs = R.write_report(records, files, out_dir, hw, warn)
    except FitError as exc:  # --hw: a measured point no schedule models
        raise UsageFault(str(exc)) from exc
    except OSError as exc:
        raise UsageFault(f"cannot write the report to {out_dir}: {exc.strerror or exc}") from exc
    for path in pngs:
        click.echo(f"# wrote {path}")
    click.echo(f"# wrote {index}")
