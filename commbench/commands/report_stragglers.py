"""`commbench report --stragglers FILES`: which rank and node held each point up and which iterations
spiked, printed (and with --json, written as one JSON document); analysis/stragglers_report.py reads it."""
from __future__ import annotations

import json

import click

from commbench.commands.helpers.common import UsageFault, check_outputs, warn
from commbench.files import shown_values
from commbench.results import RecordError, read_records
from commbench.sizes import format_size

SPIKES_SHOWN = 3  # per point on screen; the JSON has all


def stragglers(files: list[str], spike_factor: float, json_path: str | None, force: bool) -> None:
    from commbench.analysis import stragglers_report as S

    check_outputs(("--json", json_path), force=force, append=False)
    try:
        records = [shown_values(record) for path in files for record in read_records(path, warn)]  # as shown
        found = S.report(records, spike_factor)
    except (RecordError, S.StragglerError) as exc:
        raise UsageFault(str(exc)) from exc
    for line in lines(found):
        click.echo(line)
    if json_path:
        try:
            with open(json_path, "w", encoding="utf-8") as out:
                json.dump({"record": "stragglers", "files": files, **found}, out, indent=1)
                out.write("\n")
        except OSError as exc:
            raise UsageFault(f"--json {json_path}: {exc.strerror or exc}") from exc
        click.echo(f"# wrote {json_path}")


def lines(found: dict) -> list[str]:
    """The report as printed: one line per point, then the ranks and nodes that were slowest."""
    points = found["points"]
    out = [f"# stragglers: {len(points)} point(s), {found['kept_rank_times']} with every rank's times; a spike is an "
           f"iteration over {found['spike_factor']:g} x its point's median",
           "# slowest rank: the one the others waited for most: its share of all the waiting, and the wait per "
           "iteration it caused",
           f"#{'collective':>15s} {'size':>8s} {'placement':>13s}  {'slowest rank':<28s} {'slowest node':<26s} spikes"]
    for p in points:
        out.append(f" {p['collective'] or '?':>15s} {format_size(p['nbytes'] or 0):>8s} {p['placement'] or '?':>13s}  "
                   f"{_rank(p['slowest_rank']):<28s} {_node(p['slowest_node']):<26s} {_spikes(p['spikes'])}")
    counts = found["slowest_rank_counts"]
    if counts:
        out.append("# slowest rank, points: " + ", ".join(f"rank {rank} in {n}" for rank, n in counts.items()))
    for node in found["nodes"]:
        out.append(f"# node {node['host']}: ranks {','.join(map(str, node['ranks']))}, caused "
                   f"{node['caused_wait_us']:.1f} us of waiting over all points, slowest node in {node['slowest_in']}")
    if found["kept_rank_times"] < len(points):
        out.append(f"# {len(points) - found['kept_rank_times']} point(s) keep no per-rank times (one rank, an older "
                   f"file, or a prediction): spikes only")
    return out


def _rank(slowest: dict | None) -> str:
    if not slowest:
        return "-"
    where = f" ({slowest['host']})" if slowest.get("host") else ""
    return f"rank {slowest['rank']}{where} {100 * slowest['share_of_waits']:.0f}% +{slowest['per_iteration_us']:.1f} us"


def _node(slowest: dict | None) -> str:
    if not slowest:
        return "-"
    return f"{slowest['host']} +{slowest['per_iteration_us']:.1f} us"


def _spikes(spikes: list[dict]) -> str:
    """How many, and the largest few: iteration, time, times the median, when, which rank held it up."""
    if not spikes:
        return "0"
    shown = []
    for spike in sorted(spikes, key=lambda s: -s["time_us"])[:SPIKES_SHOWN]:
        when = f" at {spike['at_utc'][11:]}" if spike["at_utc"] else ""
        last = f" by rank {spike['held_by']}" if spike["held_by"] is not None else ""
        shown.append(f"#{spike['iteration']} {spike['time_us']:.0f} us ({spike['times_median']:.1f}x){when}{last}")
    return f"{len(spikes)}: {'; '.join(shown)}" + (" ..." if len(spikes) > SPIKES_SHOWN else "")
