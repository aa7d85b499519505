"""`replay`: a user's own job from its trace (PyTorch profiler, NCCL's COLL log): the table of what it
communicated, then the same calls replayed on real ranks (proxies/traces/replay.py) or, with --hw,
predicted on other hardware (analysis/predict_trace.py). docs/replay.md says how to capture each format."""
from __future__ import annotations

import sys

import click

from commbench.commands.emulate import emulate_options, emulated_shape
from commbench.commands.helpers.common import UsageFault, check_writable, find_job, output_options
from commbench.commands.helpers.hw_option import hw_option
from commbench.commands.helpers.options import Range, check

COMPUTE_SCALE = Range(1e-6, 1e6)  # a device a million times faster or slower than the traced one, at most

EXAMPLES = """
\b
Examples:
  commbench replay rank0.json rank1.json                     # the table, then a replay on 2 local ranks
  commbench replay trace/rank*.json --table-only             # the table only
  commbench replay rank*.json --hw dgx-h100 -T 2x8 --json p.jsonl   # predicted on 2 nodes of 8 GPUs
  commbench replay nccl.log --compute none                   # NCCL's log: calls back to back (it has no times)
  commbench replay rank*.json --emulate 2x1 --link 1gbit     # on an emulated cluster of 2 nodes (root)

\b
Exit codes: 0 ok, 2 bad input (a trace that cannot be read: one line naming it), 3 a rank failed, 130 interrupted.
"""


@click.command("replay", epilog=EXAMPLES)
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--steps", type=int, default=10, show_default=True, help="Measured steps of the replay.")
@click.option("--warmup-steps", type=int, default=2, show_default=True, help="Steps run first, left out.")
@click.option("--compute", type=click.Choice(["trace", "none"]), default="trace", show_default=True,
              help="trace: emulate the traced compute between calls; none: the calls back to back.")
@click.option("--table-only", is_flag=True, help="Print the table of the trace's calls; replay nothing.")
@hw_option("Predict the calls on this hardware (cost model).", name="hw")
@click.option("--topology", "-T", default=None, metavar="NODESxRANKS",
              help="With --hw: the job's ranks on nodes [default: one node of the trace's ranks].")
@click.option("--compute-scale", type=float, default=1.0, show_default=True,
              help=f"With --hw: the other device's compute speed-up over the traced one "
                   f"({COMPUTE_SCALE.low:g} to {COMPUTE_SCALE.high:g}).")
@click.option("--torch-backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--launcher", type=click.Choice(["auto", "spawn", "torchrun", "slurm", "mpi"]), default="auto",
              show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True, metavar="SECONDS")
@click.option("--oversubscribe", is_flag=True, help="Allow more local ranks than 4 per core (one per traced rank).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="JSON Lines: a header, one record per step, a summary (what check and report read).")
@emulate_options
@output_options(append=False)
def replay_command(traces, steps, warmup_steps, compute, table_only, hw, topology, compute_scale, torch_backend,
                   device, launcher, timeout_s, oversubscribe, json_path, force, emulate, link) -> None:
    """Tabulate, replay or predict the communication of a traced job (TRACE: one profiler JSON per rank, one
    execution trace per rank in rank order, or NCCL log(s); docs/replay.md)."""
    from commbench.proxies.traces.calls import TraceError
    from commbench.proxies.traces.files import read_traces

    check({"--compute-scale": (COMPUTE_SCALE, compute_scale)})  # inf made every step's compute 0 us
    if steps < 1 or warmup_steps < 0 or not compute_scale > 0 or not 0 < timeout_s < 1e6:
        raise UsageFault("--steps must be at least 1, --warmup-steps at least 0, --compute-scale above 0, "
                         "--timeout above 0 (and below 1e6 s)")
    if not table_only:
        check_writable(json_path, "--json", force)
    try:
        job_trace = read_traces(list(traces))
    except TraceError as exc:
        raise UsageFault(str(exc)) from exc
    _, info = find_job(launcher)
    lead = info is None or info.rank == 0
    if lead:
        from commbench.commands.replay_table import print_table

        print_table(job_trace)
    if table_only:
        return
    if hw:
        from commbench.commands.replay_table import predict_and_print

        sys.exit(predict_and_print(job_trace, hw, topology, compute_scale, json_path, sys.argv))
    shape = emulated_shape(emulate, link, {"--launcher": launcher != "auto"})
    _replay(job_trace, traces, steps, warmup_steps, compute, torch_backend, device, launcher, timeout_s,
            json_path, info, shape, oversubscribe)


def _replay(job_trace, traces, steps, warmup_steps, compute, torch_backend, device, launcher, timeout_s,
            json_path, info, shape, oversubscribe) -> None:
    import os

    from commbench import job
    from commbench.backends import BackendConfig
    from commbench.commands.helpers.backend_options import settle_backend
    from commbench.proxies.traces.replay import TRACE_REPLAY_JOB, TraceReplayConfig

    world = info.world_size if info is not None else shape[0] * shape[1] if shape else job_trace.world
    if world != job_trace.world:
        raise UsageFault(f"the trace is of {job_trace.world} ranks; this job has {world}")
    if shape:  # an emulated cluster of this host: every rank reads the trace files here
        plan = job.Plan("emulate", world, None, shape[0], shape[1], link_bps=shape[2])
    elif info is not None:
        plan = job.Plan("join", info.world_size, info, info.nnodes, info.local_world_size)
    else:
        plan = job.Plan("spawn", world, None, 1, world)
    request = BackendConfig(backend="torch", torch_backend=torch_backend, device=device, nprocs=plan.world,
                            timeout_s=timeout_s)
    cls, settled = settle_backend(request, {"spawn": "spawn", "emulate": "torchrun"}.get(plan.mode)
                                  or job.launcher_of(launcher))
    if plan.mode != "join":  # this host starts every rank of the trace: as many as its cores and memory carry
        _check_host(job_trace, plan.world, cls.resolve_device(settled)[0], oversubscribe)
    cfg = TraceReplayConfig(traces=tuple(os.path.abspath(t) for t in traces), steps=steps,
                            warmup_steps=warmup_steps, compute=compute, backend=settled, json_path=json_path)
    job.end(job.run(TRACE_REPLAY_JOB, cfg, plan, sys.argv), plan)


def _check_host(job_trace, world: int, device: str, oversubscribe: bool) -> None:
    """Before any rank starts: the trace's ranks as local processes (a trace of 4,096 ranks forked 4,096), and
    on the CPU their buffers (a call of 4 TB failed in every rank)."""
    from commbench.commands.helpers.options import check_local_ranks, check_memory
    from commbench.proxies.traces.replay import buffer_bytes

    check_local_ranks(world, oversubscribe, "local ranks (one per traced rank)")
    if device == "cpu":
        check_memory(sum(buffer_bytes(job_trace, rank) for rank in range(world)),
                     f"the trace's {world} rank(s), each holding a buffer of every call size it issues,")
