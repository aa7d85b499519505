"""`replay`'s printing: the table of a trace's calls (nccl-tests' columns and the job's), and a prediction
of its steps on other hardware, printed as proxy prints a step and written as a predicted proxy record."""
from __future__ import annotations

import click

from commbench.commands.helpers.common import UsageFault
from commbench.files import shown


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def print_table(job) -> None:
    """What rank 0 of the traced job communicated, per collective and size, over the traced steps."""
    from commbench.proxies.traces.files import table_rows

    trace = job.ranks[0]
    steps = len(trace.steps)
    step_us = [s.step_us for s in trace.steps]
    click.echo(f"# {shown(job.source)}: {job.world} rank(s), {steps} step(s), {len(job.groups())} group(s); "
               f"rank 0's calls per collective and size (every member of a group issues the same)")
    if any(step_us):
        mean = sum(step_us) / len(step_us)
        compute = sum(s.compute_us for s in trace.steps) / steps
        exposed = sum(s.exposed_us for s in trace.steps) / steps
        click.echo(f"# traced step {mean / 1e3:.2f} ms (mean): compute {compute / 1e3:.2f} ms, exposed "
                   f"communication {exposed / 1e3:.2f} ms, other {(mean - compute - exposed) / 1e3:.2f} ms")
    click.echo(f"# {'collective':>14} {'size':>11} {'dtype':>8} {'group':>12} {'calls':>6} {'time(us)':>9} "
               f"{'busbw(GB/s)':>11} {'share':>6} {'exposed(ms)':>11} {'overlap(ms)':>11}")
    for row in table_rows(job):
        group = ",".join(map(str, row.group)) if len(row.group) <= 4 else f"{len(row.group)} ranks"
        click.echo(f"  {shown(row.collective):>14} {_size(row.nbytes):>11} {shown(row.dtype):>8} {group:>12} "
                   f"{row.calls:>6} {_cell(row.time_us, '.1f'):>9} {_cell(row.busbw_gbps, '.3f'):>11} "
                   f"{'-' if row.share is None else format(row.share * 100, '.1f') + '%':>6} "
                   f"{row.exposed_us / 1e3:>11.3f} {row.overlapped_us / 1e3:>11.3f}")
    click.echo("# time: the median call's run (the worker's or kernel's span); share: the calls' run time over the "
               "step's; exposed: per step, the issuing thread waiting while they ran; overlap: the rest")
    for note in job.notes:
        click.echo(f"# note: {shown(note)}")


def predict_and_print(job, hw_spec: str, topology: str | None, compute_scale: float, json_path: str | None,
                      argv: list[str]) -> int:
    from commbench.analysis.predict_trace import predict_trace
    from commbench.commands.helpers.hw_option import load_hw
    from commbench.costmodel import HardwareError
    from commbench.errors import EXIT_OK
    from commbench.topology import TopologyError, parse_topology

    try:
        hw = load_hw(hw_spec)
        topo = parse_topology(topology, job.world)
        p = predict_trace(job, hw, topo, compute_scale)
    except (HardwareError, TopologyError, ValueError) as exc:
        raise UsageFault(str(exc).splitlines()[0]) from exc
    click.echo(f"# predicted on {shown(hw.name)} ({topo.nodes}x{topo.ranks_per_node}), cost model; traced compute"
               + ("" if compute_scale == 1.0 else f" / {compute_scale:g}") + "; calls one at a time in issue order")
    click.echo(f"# {'step':>6} {'compute(ms)':>12} {'comm(ms)':>10} {'exposed(ms)':>12} {'step(ms)':>10}")
    for k, step in enumerate(p.steps_us):
        click.echo(f"  {k + 1:>6} {p.compute_us[k] / 1e3:>12.2f} {p.comm_us[k] / 1e3:>10.2f} "
                   f"{p.exposed_us[k] / 1e3:>12.2f} {step / 1e3:>10.2f}")
    click.echo(f"# median {p.median(p.compute_us) / 1e3:>12.2f} {p.median(p.comm_us) / 1e3:>10.2f} "
               f"{p.median(p.exposed_us) / 1e3:>12.2f} {p.median(p.steps_us) / 1e3:>10.2f}")
    if json_path:
        _write(job, p, hw_spec, topo, argv, json_path)
    return EXIT_OK


def _write(job, p, hw_spec: str, topo, argv: list[str], json_path: str) -> None:
    from commbench.backends.registry import PREDICTED
    from commbench.results import ProxyResult, ResultSink, new_run_id

    run_id = new_run_id()
    calls = job.ranks[0].steps
    with ResultSink(json_path) as sink:
        sink.header({"run_id": run_id, "kind": "predicted", "model": "trace", "command": " ".join(argv),
                     "config": {"hw": hw_spec, "topology": f"{topo.nodes}x{topo.ranks_per_node}"},
                     "trace": {"source": job.source, "world": job.world, "notes": list(job.notes)}})
        sink.write(ProxyResult(kind="predicted", model="trace", backend="sim", library=p.hw, device="-",
                               world_size=job.world, nnodes=topo.nodes, batch=1, bucket_mb=None, bucketing="trace",
                               buckets=sum(len(s.calls) for s in calls),
                               gradient_bytes=sum(c.nbytes for s in calls for c in s.calls), compute="trace",
                               steps=len(p.steps_us), warmup_steps=0, compute_us_p50=p.median(p.compute_us),
                               compute_us_p90=max(p.compute_us), comm_us_p50=p.median(p.comm_us),
                               comm_us_p90=max(p.comm_us), exposed_comm_us_p50=p.median(p.exposed_us),
                               exposed_comm_us_p90=max(p.exposed_us), step_us_p50=p.median(p.steps_us),
                               step_us_p90=max(p.steps_us), samples_per_s=None, run_id=run_id, setup="trace",
                               **PREDICTED.fields()))
