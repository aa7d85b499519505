"""`commbench fit`: a cost model fitted to measured sweeps, written as a hardware file (the commands that read
one load it through commands/helpers/hw_option.py)."""
from __future__ import annotations

from dataclasses import replace

import click

from commbench.commands.helpers.common import UsageFault, check_outputs, output_options, warn
from commbench.commands.helpers.hw_option import load_hw
from commbench.results import RecordError, read_records
from commbench.sizes import SizeError, parse_size


@click.command("fit", epilog="""
\b
Examples:
  commbench sweep --backend shm --sizes 1K-256M --json shm.jsonl && commbench fit shm.jsonl -o shm-hw.json
  commbench fit node.jsonl cluster.jsonl --setup torch/nccl/- --base dgx-a100 -o hw.json
  commbench fit shm.jsonl proxy-25mb.jsonl proxy-1mb.jsonl -o hw.json    (links, and step terms from the replays)
  commbench fit proxy-25mb.jsonl proxy-1mb.jsonl --base hw.json -o hw2.json  (step terms added to hw.json)

\b
A proxy run among FILES fits the step terms (docs/model.md, Step terms): overlap_slowdown and
per_bucket_us from the other time of multi-rank CPU replays (two --bucket-mb for per_bucket_us),
step_cv from 1-rank replays; predict-scaling and proxy --hw then use them.
""")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Hardware JSON to write.")
@click.option("--setup", default=None, metavar="BACKEND/LIBRARY/ALGORITHM",
              help="Which measured setup to fit when the files hold several (the error lists them); "
                   "BACKEND/LIBRARY takes all of its algorithms (one run with --algorithm auto fits whole).")
@click.option("--base", default=None, metavar="PRESET|FILE",
              help="Hardware to take the levels the data cannot fit from (e.g. inter-node for a one-node sweep), and "
                   "the step terms proxy runs cannot pin (with only proxy runs given: the file the terms go onto).")
@click.option("--sizes", "size_range", default=None, metavar="MIN-MAX",
              help="Fit only points whose size lies in this range, e.g. 64K-64M (the fit adds a cache regime "
                   "where the data show one; leave out sizes you will not predict).")
@click.option("--accept-poor-fit", is_flag=True,
              help="Write a fit that does not describe its data (R^2 < 0 or median error > 25%), marked poor.")
@output_options(append=False)
def fit_command(files: tuple[str, ...], output: str, setup: str | None, base: str | None,
                size_range: str | None, accept_poor_fit: bool, force: bool) -> None:
    """Fit latency and bandwidth per link level to measured sweeps (JSON Lines), and the step terms to proxy runs."""
    # analysis.fit inside the command: with the other analysis modules the commands use it would add
    # ~40 ms to every `commbench --help` (predict-scaling's adds scipy, ~0.4 s).
    from commbench.analysis import fit as F

    lo, hi = _size_bounds(size_range)
    try:
        loaded = [(path, read_records(path, warn)) for path in files]  # a file given twice counts twice, as before
        base_hw = load_hw(base, say_poor=False) if base else None
    except RecordError as exc:
        raise UsageFault(str(exc)) from exc
    is_run = [any(r.get("record") in ("step", "proxy") for r in rs) for _, rs in loaded]  # a proxy run's file
    runs = [path for (path, _), run in zip(loaded, is_run) if run]
    records = [r for (_, rs), run in zip(loaded, is_run) if not run for r in rs
               if r.get("record") != "result" or lo <= r["nbytes"] <= hi]
    check_outputs(("-o", output), inputs=files, force=force)
    links = bool(records) or not runs  # sweeps given: their links fitted; only proxy runs: --base's links kept
    try:
        hw = F.fit(records, setup, base_hw) if links else _base_only(base_hw, runs)
    except F.FitError as exc:
        raise UsageFault(str(exc)) from exc
    if runs:
        hw = _with_step_terms(hw, runs, [r for (_, rs), run in zip(loaded, is_run) if run for r in rs], links,
                              base_hw.step_terms if base_hw is not None else None)
    hw = _marked(hw, F.poor_fit(hw.meta), [r for _, rs in loaded for r in rs], output, accept_poor_fit)
    try:
        hw.save(output)
    except OSError as exc:
        raise UsageFault(f"cannot write {output}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a figure JSON cannot hold (NaN): refused before anything is written
        raise UsageFault(f"cannot write {output}: {exc}") from exc
    if links:
        _print_fit(hw, output)
    else:
        click.echo(f"# step terms fitted; links as --base {base} has them (not fitted here)\n"
                   f"#   step terms: {hw.step_terms.said()}\n# wrote {output}")


def _marked(hw, poor: str | None, records: list[dict], output: str, accept_poor_fit: bool):
    """`hw` marked where its figures cannot be trusted as they stand: a poor fit (refused unless kept with
    --accept-poor-fit), runs measured on a busy host (analysis/hosts.busy_hosts); each said here and on every
    use (commands/helpers/hw_option.warn_poor)."""
    if poor and not accept_poor_fit:
        raise UsageFault(f"the fit does not describe its data ({poor}); nothing written. Fit one setup and size "
                         f"range at a time (--setup, --sizes), or keep it marked poor with --accept-poor-fit")
    if poor:
        hw = replace(hw, meta={**hw.meta, "poor_fit": poor})
        click.echo(f"commbench: warning: poor fit kept (--accept-poor-fit): {poor}; predictions from {output} "
                   f"will say so", err=True)
    from commbench.analysis.hosts import busy_hosts

    busy = busy_hosts(records)
    if busy:  # the figures (links, step terms) hold other work's share of the cores: said here and on every use
        hw = replace(hw, meta={**hw.meta, "fitted_under_load": busy})
        click.echo(f"commbench: warning: measured under load ({busy}): the fitted figures hold the other work's "
                   f"share of the cores; predictions from {output} will say so. Measure again on a quiet host",
                   err=True)
    return hw


def _base_only(base_hw, runs: list[str]):
    """Only proxy runs given: the step terms go onto --base's links (a fit needs sweeps for its own)."""
    if base_hw is None:
        raise UsageFault(f"{', '.join(runs)}: proxy runs fit only the step terms; give sweeps (result records) to fit "
                         f"the links as well, or --base FILE|PRESET to add the step terms to")
    return base_hw


def _with_step_terms(hw, runs: list[str], records: list[dict], links: bool = False, base_terms=None):
    """`hw` with the step terms the proxy runs `runs` fit (analysis/fit_step_terms.py); each term they cannot pin
    keeps `hw`'s own, else --base's (`base_terms`), else the class default of `hw`'s device (a GPU preset's, not
    the runs' CPU one), said on stderr. Runs that pin no term are refused
    where they were all there was to fit; beside sweeps (`links`) the links are written and the terms left, said."""
    import time

    from commbench.analysis import fit_step_terms as S
    from commbench.costmodel.hardware import terms_of

    rows, skipped = S.step_rows(records)
    device = "cuda" if rows and all(r.device != "cpu" for r in rows) else "cpu"
    evidence = f"commbench fit {' '.join(runs)}, {time.strftime('%Y-%m-%d', time.gmtime())}"
    start = hw.step_terms or (base_terms if base_terms is not None else terms_of(hw))
    try:
        terms, notes = S.fit_step_terms(rows, device, evidence, start)
    except S.StepTermsFitError as exc:
        if not links:
            raise UsageFault(f"{exc}{''.join('; ' + note for note in skipped)}") from exc
        warn(f"step terms: none written ({exc}{''.join('; ' + note for note in skipped)})")
        return hw
    for note in [*skipped, *notes]:
        warn(f"step terms: {note}")
    return replace(hw, step_terms=terms)


def _size_bounds(size_range: str | None) -> tuple[float, float]:
    """--sizes MIN-MAX (or one size) as (low, high) bytes; no --sizes: every size."""
    try:
        low, _, high = (size_range or "").partition("-")
        return (parse_size(low), parse_size(high or low)) if size_range else (0, float("inf"))
    except SizeError as exc:
        raise UsageFault(f"--sizes: {exc}") from exc


def _print_fit(hw, output: str) -> None:
    """The fit's summary: its quality, each level's figures, where it was measured, its notes."""
    meta = hw.meta
    r2 = "n/a (every time equal)" if meta["r2"] is None else f"{meta['r2']:.4f}"
    click.echo(f"# fitted {meta['fitted_from']}: {meta['points']} points, R^2 {r2}, "
               f"MAPE {100 * meta['mape']:.1f}%, median error {100 * meta['median_ape']:.1f}%")
    for name, level in (("intra", hw.intra), ("inter", hw.inter)):
        fitted = "fitted" if meta["levels_fitted"][name] else "not fitted"
        click.echo(f"#   {name:5s} {level.bw_gbps:10.3f} GB/s  {level.latency_us:9.3f} us/step  ({fitted})")
    click.echo(f"#   per-call overhead {hw.per_call_overhead_us:.3f} us")
    if hw.step_terms is not None:
        click.echo(f"#   step terms: {hw.step_terms.said()}")
    where = meta.get("measured_on")
    if where:
        cores = f"a host of {where['cpus']} cores" if where["cpus"] else "a host of unknown cores"
        click.echo(f"#   measured on {where['device']}: at most {where['ranks_per_host']} rank(s) on {cores}")
    for note in meta["notes"]:
        click.echo(f"#   note: {note}")
    click.echo(f"# wrote {output}")


