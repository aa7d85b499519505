"""`commbench sweep`: parse and validate, then run the harness (commbench/bench.py) on every rank."""
from __future__ import annotations

import sys
from dataclasses import replace

import click

from commbench.algorithms import listing
from commbench.commands import scale
from commbench.commands.emulate import emulate_options, emulated_shape
from commbench.commands.helpers.common import UsageFault, check_outputs, find_job, output_options
from commbench.commands.helpers.hw_option import hw_option
from commbench.commands.sweep_options import SweepOptions

SWEEP_EXAMPLES = """
\b
Examples:
  commbench sweep                                   # allreduce 1 KiB-64 MiB on 2 local CPU ranks (gloo)
  commbench sweep --sizes 1K-1G                     # every local GPU with NCCL, or 2 CPU ranks with gloo
  commbench sweep -c allgather -c reduce_scatter --sizes 8-128M --factor 4 --dtype bfloat16 --json out.jsonl
  commbench sweep -c all --sizes 1K,1M,64M --iters 20 --warmup 5 --csv out.csv
  torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m commbench sweep --sizes 1K-1G
  srun -N 4 --ntasks-per-node 8 commbench sweep --sizes 1K-1G
  mpirun -np 16 -x MASTER_ADDR=node01 commbench sweep --sizes 1K-1G
  commbench sweep --emulate 2x2 --link 1gbit --backend hybrid    # 2 emulated nodes, 1 Gbit/s links (root)
  commbench sweep --backend cuda -N 8 --sizes 1K-256M      # commbench's kernels, 8 virtual ranks on one GPU
  torchrun --nproc-per-node 8 -m commbench sweep --backend cupy --graph --monitor

\b
Exit codes: 0 ok, 1 wrong results (#wrong > 0), 2 bad input, 3 a rank failed
(died, hung past --timeout, out of memory), 130 interrupted.
"""


class SweepCommand(click.Command):
    """sweep's parser: nccl-tests' flags on a sweep line (`-b 8 -e 1M`, `-c 0`, `-g 2`) are answered in one
    line each, with the command that takes them as typed (commands/sweep_letters.py)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from commbench.commands import sweep_letters

        given = list(args)  # click's parser consumes `args`
        fault = sweep_letters.other_meaning(given)
        if fault:
            raise click.UsageError(fault)
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            fault = sweep_letters.lacking(exc.option_name, given)
            if fault:
                raise click.UsageError(fault) from exc
            raise


MAX_ROOT = 1 << 24  # a root no job's ranks reach: refused even where the collective ignores it


@click.command(cls=SweepCommand, epilog=SWEEP_EXAMPLES)
@click.option("--sizes", "-s", default=None, metavar="RANGE|LIST",
              help="Message sizes in bytes: a range START-END (binary K/M/G/T suffixes, e.g. 1K-1G) or a "
                   "comma list (1K,4K,1M). Rounded down per collective as nccl-tests does. "
                   "[default: 1K-64M; 1K-1M with --backend sim, which holds every rank's buffers]")
@click.option("--factor", "-f", type=float, default=None, help="Multiply the size by this between steps [default: 2].")
@click.option("--step", default=None, metavar="BYTES", help="Add this many bytes between steps instead of --factor.")
@click.option("--collective", "-c", "collective_names", multiple=True, default=("allreduce",), show_default=True,
              metavar="NAME", help="allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, sendrecv, "
                                   "gather, scatter, alltoallv, hypercube, or all. Repeatable, or comma-separated.")
@click.option("--root", type=int, default=0, show_default=True,
              help="Root rank of broadcast, reduce, gather and scatter.")
@click.option("--splits", default="uniform", show_default=True, metavar="uniform|skewed[:ALPHA[:SEED]]|FILE",
              help="alltoallv: what each rank sends each peer: alike (nccl-tests' alltoallv), skewed as a "
                   "mixture-of-experts router's tokens (seeded), or a JSON matrix of weights (docs/nccl-tests.md).")
@click.option("--dtype", "-d", default="float32", show_default=True,
              help="float32, float16, bfloat16, float64, int32, int8, uint8, int64.")
@click.option("--op", "-o", default="sum", show_default=True, help="Reduction: sum, prod, max, min, avg.")
@click.option("--placement", type=click.Choice(["out-of-place", "in-place", "both"]), default="both",
              show_default=True, help="Buffers: separate send/receive, shared, or both columns (as nccl-tests).")
@click.option("--warmup", "-w", type=int, default=None, help="Warm-up iterations per point [default: adaptive].")
@click.option("--iters", "-n", type=int, default=None,
              help="Timed iterations per point [default: adaptive, to fill --min-time].")
@click.option("--min-time", type=float, default=0.2, show_default=True, metavar="SECONDS",
              help="Adaptive mode: time budget of the timed iterations per point "
                   "(at least 5, at most 1000 iterations).")
@click.option("--backend", "-b", default="torch", show_default=True,
              help="Where collectives run: torch (torch.distributed: gloo/NCCL), cupy (NCCL through CuPy, one "
                   "rank per GPU), or commbench's own algorithms on shm (shared memory, one host), p2p (torch "
                   "send/recv, any nodes), hybrid (shm inside a node, send/recv between nodes), cuda (commbench's "
                   "CUDA kernels, docs/gpu.md), sim (virtual ranks in one process, checked; timed by the cost "
                   "model with --hw).")
@click.option("--algorithm", "-A", default="auto", show_default=True,
              help=f"shm/p2p/hybrid/cuda/sim: {listing()}; or auto (by size and topology, docs/algorithms.md).")
@click.option("--tuning", "tuning", default=None, metavar="FILE",
              help="shm/p2p/hybrid/cuda/sim: the tuning table `auto` follows (written by commbench tune; "
                   "default: the one shipped for the backend, else the built-in rule).")
@click.option("--cuda-mode", type=click.Choice(["auto", "virtual", "peer", "ipc"]), default="auto", show_default=True,
              help="cuda: virtual (every rank's buffers on one GPU, one process), peer (rank r on GPU r, one "
                   "process), ipc (one process per GPU, CUDA IPC); auto: ipc under a launcher, else peer when "
                   "--nprocs GPUs are visible, else virtual.")
@click.option("--graph", is_flag=True, default=False,
              help="cupy/cuda: capture each point's timed calls in one CUDA graph and replay it (nccl-tests -G).")
@click.option("--nccl-tests-rows", is_flag=True, hidden=True,
              help="Rows of nccl-tests' 13 columns only (no algorithm column, no noisy mark): `commbench nccl-tests`.")
@click.option("--monitor", is_flag=True, default=False,
              help="Sample GPU (NVML: utilisation, memory, power, SM clock, PCIe, NVLink) and host (CPU, memory, "
                   "NIC) telemetry on rank 0's host; per-point averages in the JSON, a summary line at the end.")
@click.option("--topology", "-T", default=None, metavar="NODESxRANKS",
              help="Nodes x ranks per node for the algorithms, e.g. 8x8; spawned here, that many ranks [default: "
                   "the launcher's layout, or one node].")
@click.option("--nodes", type=int, default=None, help="Nodes: --nodes N --gpus-per-node G is --topology NxG.")
@click.option("--gpus-per-node", type=int, default=None,
              help="Ranks per node [default with --nodes: --nprocs / N, or local GPUs, or 1].")
@hw_option("sim: time each call with the cost model of this hardware (from `commbench fit`, or a preset).",
           name="hw")
@click.option("--torch-backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True,
              help="torch.distributed backend: gloo on CPU and NCCL on GPU by default.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: cuda when torch sees a GPU, else cpu.")
@click.option("--nprocs", "-N", type=int, default=None,
              help="Local ranks to spawn when no launcher (torchrun, srun, mpirun) started this process "
                   "[default: number of GPUs (2 virtual ranks for cuda on one GPU), or 2 on CPU].")
@click.option("--oversubscribe", is_flag=True, default=False,
              help="Spawn more local ranks than this host carries (4 per core, about 400 MiB each): refused without.")
@click.option("--launcher", type=click.Choice(["auto", "spawn", "torchrun", "slurm", "mpi"]), default="auto",
              show_default=True, help="Force how ranks are found; auto reads the environment.")
@click.option("--rank-agg", "-a", type=click.Choice(["max", "avg", "min"]), default="max", show_default=True,
              help="Combine ranks' times of each iteration into its one sample (nccl-tests -a averages; "
                   "docs/metrics.md).")
@click.option("--stat", type=click.Choice(["mean", "p50", "min"]), default="mean", show_default=True,
              help="The time printed and recorded (time_us, its algbw/busbw, the footer's average): the mean of "
                   "the per-iteration samples as nccl-tests prints, their median, or the fastest. The record names "
                   "it (stat) and keeps the others and the raw samples.")
@click.option("--skip-iters", type=int, default=0, show_default=True, metavar="K",
              help="Time K more iterations first and leave them out of every figure (nccl-tests -K).")
@click.option("--p99", "show_p99", is_flag=True, help="A p99 column beside each time (nccl-tests -I).")
@click.option("--timestamps", is_flag=True,
              help="Each row ends with when its timed calls began, in UTC (nccl-tests -S; records: timed_start).")
@click.option("--memory-report", is_flag=True,
              help="At the end, each rank's memory: the host process's peak RSS, and on a GPU the allocator's and "
                   "NVML's figures (nccl-tests -M).")
@click.option("--misalign", "misalign_nbytes", type=int, default=0, show_default=True, metavar="BYTES",
              help="Start every buffer this many bytes past its allocation (a multiple of the dtype's size; "
                   "nccl-tests -u).")
@click.option("--blocking", type=click.Choice(["0", "1", "3"]), default="0", show_default=True,
              help="0: calls back to back; 1: each call, a wait for it and a barrier, all timed; 3: the barrier "
                   "left out of the timing (nccl-tests -z).")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Verify every result; any wrong element makes the run exit 1.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write JSON Lines: a header record, one record per point (flushed as measured), a summary.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write one CSV row per point.")
@output_options(append=True)
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True, metavar="SECONDS",
              help="Stop if a rank dies or no collective completes within this long.")
@emulate_options
def sweep(**options) -> None:
    """Benchmark collectives across message sizes (nccl-tests-style table, checked results).

    Without a launcher, spawns --nprocs local ranks that rendezvous on loopback.
    Under torchrun, SLURM (srun) or MPI (mpirun) every rank runs this command and
    joins the existing job.
    """
    from commbench import job
    from commbench.bench import SWEEP_JOB

    cfg, plan = plan_sweep(SweepOptions.from_click(options))
    job.end(job.run(SWEEP_JOB, cfg, plan, sys.argv), plan)


def plan_sweep(o: SweepOptions):
    """The sweep's options checked into (SweepConfig, job.Plan), or one line and exit 2."""
    from commbench import job

    _check_counts(o)
    o = scale.for_sweep(o, joined=job.launcher_of(o.launcher) is not None)
    shape = emulated_shape(o.emulate, o.link, {"--nprocs": o.nprocs, "--topology": o.topology,
                                               "--launcher": o.launcher != "auto"})
    cls, request = _backend(o, "torchrun" if shape else job.launcher_of(o.launcher))
    if shape:
        return _emulated(o, cls, request, *shape)
    if cls.in_process(request):  # every rank lives in this process: nothing to launch or join
        cfg, world = _sweep_config(o, cls, request, world=None)
        return cfg, job.Plan("local", world)
    return _spawn_or_join(o, cls, request)


def _spawn_or_join(o: SweepOptions, cls, request):
    """(SweepConfig, Plan) for ranks in processes: spawn them here, or join the launcher's job
    (its variables are read only then, so an in-process backend never depends on them)."""
    from commbench import job

    launcher, info = find_job(o.launcher)
    if info is None:
        cfg, world = _sweep_config(o, cls, request, world=None)
        return cfg, job.Plan("spawn", world)
    if o.nprocs is not None and o.nprocs != info.world_size and info.rank == 0:
        click.echo(f"commbench: note: --nprocs {o.nprocs} ignored: {launcher} started "
                   f"{info.world_size} rank(s)", err=True)
    cfg, world = _sweep_config(o, cls, request, world=info.world_size, local_ranks=info.local_world_size,
                               launched=True)
    return cfg, job.Plan("join", world, info)


def _emulated(o: SweepOptions, cls, request, nodes: int, ranks: int, link_bps: int):
    """(SweepConfig, Plan) for ranks on an emulated cluster: torchrun starts them, node by node."""
    from commbench import job

    if cls.in_process(request):
        raise UsageFault(f"--backend {cls.name} runs every rank in this process: nothing to run on an emulated "
                         f"cluster (try --backend torch, p2p or hybrid)")
    if cls.one_host and nodes > 1:
        raise UsageFault(f"--backend {cls.name} needs every rank on one host: --emulate {nodes}x{ranks} has "
                         f"{nodes} nodes (try --backend hybrid: shared memory inside a node)")
    cfg, world = _sweep_config(o, cls, request, world=nodes * ranks, local_ranks=nodes * ranks)
    return cfg, job.Plan("emulate", world, None, nodes, ranks, link_bps=link_bps)


def _backend(o: SweepOptions, launcher: str | None):
    """(backend class, settled BackendConfig): the options a backend reads, checked by the backend."""
    from commbench.backends import BackendConfig
    from commbench.commands.helpers.backend_options import settle_backend
    from commbench.commands.helpers.hw_option import load_hw

    if o.hw:
        load_hw(o.hw)  # loaded as --hw was parsed: a poor fit said here, once
    return settle_backend(BackendConfig(
        backend=o.backend, torch_backend=o.torch_backend, device=o.device, algorithm=o.algorithm,
        topology=o.topology, nprocs=o.nprocs, hw=o.hw, cuda_mode=o.cuda_mode, graph=o.graph, timeout_s=o.timeout_s,
        tuning=o.tuning), launcher)


def _sweep_config(o: SweepOptions, cls, request, world: int | None, local_ranks: int | None = None,
                  launched: bool = False):
    """Validate everything that can be checked before any rank starts; (SweepConfig, world size)."""
    from commbench import collectives as C
    from commbench import splits
    from commbench.backends import BackendError
    from commbench.sizes import SizeError
    from commbench.sweep_config import PLACEMENTS, SweepConfig

    try:
        sizes = _measured_sizes(o, cls)
        names = C.resolve_collectives(o.collective_names)
        dtype = C.resolve_dtype(o.dtype)
    except (SizeError, ValueError) as exc:
        raise UsageFault(str(exc)) from exc
    op = o.op.lower()
    if op not in C.OPS:
        hint = ("; -o is the reduction op, as in nccl-tests: results go to --json FILE or --csv FILE"
                if any(mark in op for mark in "./") else "")
        raise UsageFault(f"unknown op {o.op!r}; choose from {', '.join(C.OPS)}{hint}")
    try:
        device, library = cls.resolve_device(request)
        if world is None:
            world = request.nprocs if request.nprocs is not None else cls.default_world(request, device)
        if world < 1:
            raise UsageFault(f"--nprocs {world}: need at least 1 rank")
        # a rooted collective needs a rank of this run; any other ignores the root, as nccl-tests' all_reduce_perf
        # ignores -r, but a value no run could have is refused alike
        if not 0 <= o.root < (world if any(C.COLLECTIVES[n].rooted for n in names) else MAX_ROOT):
            raise UsageFault(f"--root {o.root}: must be a rank in 0..{world - 1}")
        if _asks_for_all(o.collective_names):
            names = _runnable(names, cls, request, library, dtype, op, world, launched)
        split_weights = _world_checks(names, world, o.splits)
        cls.check_request(request, library, names, dtype, op, world)
    except (BackendError, splits.SplitsError) as exc:
        raise UsageFault(str(exc)) from exc
    _check_scale(o, cls, request, device, sizes, world, local_ranks or world, launched)
    check_outputs(("--json", o.json_path), ("--csv", o.csv_path), force=o.force, append=o.append)
    placements = PLACEMENTS if o.placement == "both" else (o.placement,)
    cfg = SweepConfig(
        collectives=tuple(names), sizes=tuple(sizes), dtype=dtype.name, op=op, root=o.root,
        placements=tuple(placements), warmup=o.warmup, iters=o.iters, min_time_s=o.min_time, rank_agg=o.rank_agg,
        stat=o.stat, check=o.check, backend=replace(request, device=device, nprocs=world), json_path=o.json_path,
        csv_path=o.csv_path, append=o.append, monitor=o.monitor, nccl_tests_rows=o.nccl_tests_rows,
        splits=o.splits, split_weights=split_weights, **_timing_options(o, dtype))
    return cfg, world


def _measured_sizes(o: SweepOptions, cls) -> list[int]:
    """The sizes --sizes (or the backend's default), --factor and --step give; SizeError past the bound."""
    from commbench.sizes import MAX_MEASURED_SIZES, SizeError, parse_sizes

    spec = o.sizes if o.sizes is not None else cls.default_sizes
    sizes = parse_sizes(spec, o.factor, o.step)
    if len(sizes) > MAX_MEASURED_SIZES:
        raise SizeError(f"--sizes {spec} expands to {len(sizes):,d} sizes: a sweep measures at most "
                        f"{MAX_MEASURED_SIZES:,d} (each its warm-up, timed calls and check); use a larger "
                        f"--step or a --factor")
    return sizes


def _asks_for_all(collective_names) -> bool:
    return any(name.strip().lower() == "all" for raw in collective_names for name in raw.split(","))


def _runnable(names: list[str], cls, request, library: str, dtype, op: str, world: int, launched: bool) -> list[str]:
    """`-c all`: the collectives this backend runs with these options, asked of the backend one at a
    time (its check_request), and one line on stderr naming the ones left out and why. When it runs
    none of them, the first refusal is the error."""
    import os

    from commbench.backends import BackendError

    kept, left_out = [], []
    for name in names:
        try:
            cls.check_request(request, library, [name], dtype, op, world)
            kept.append(name)
        except BackendError as exc:
            left_out.append((name, str(exc).split(";")[0]))
    if not kept:
        raise BackendError(left_out[0][1])
    if left_out and (not launched or os.environ.get("RANK", "0") == "0"):
        print("commbench: -c all leaves out " + ", ".join(f"{name} ({why})" for name, why in left_out),
              file=sys.stderr)
    return kept



def _world_checks(names: list[str], world: int, splits_spec: str) -> tuple:
    """A collective `world` ranks cannot run (hypercube on 3) is one line; alltoallv's split weights."""
    from commbench import collectives as C
    from commbench import splits

    refused = next((C.refused_world(n, world) for n in names if C.refused_world(n, world)), None)
    if refused:
        raise UsageFault(refused)
    return splits.weights(splits_spec, world) if "alltoallv" in names else ()


def _timing_options(o: SweepOptions, dtype) -> dict:
    """--skip-iters, --p99, --timestamps, --memory-report, --misalign, --blocking, checked (one line each)."""
    from commbench.commands.helpers import options as O

    shift, blocking = o.misalign_nbytes, int(o.blocking)
    O.check({"--skip-iters": (O.NONNEGATIVE_COUNT, o.skip_iters),
             "--misalign": (O.Range(0, 1 << 16, integer=True), shift)})  # an offset from alignment, not a size
    if shift % dtype.itemsize:
        raise UsageFault(f"--misalign {shift}: not a multiple of {dtype.name}'s {dtype.itemsize} B (buffers are "
                         f"arrays of elements on every backend)")
    if blocking and o.graph:
        raise UsageFault(f"--blocking {blocking}: a CUDA graph (--graph) cannot wait or hold a barrier between calls")
    return {"skip_iters": o.skip_iters, "show_p99": o.show_p99, "timestamps": o.timestamps,
            "memory_report": o.memory_report, "misalign_nbytes": shift, "blocking": blocking}


def _check_counts(o: SweepOptions) -> None:
    from commbench.commands.helpers import options as O

    O.check({"--iters": (O.COUNT, o.iters), "--warmup": (O.NONNEGATIVE_COUNT, o.warmup),
             "--min-time": (O.SECONDS, o.min_time), "--timeout": (O.TIMEOUT, o.timeout_s),
             "--nprocs": (O.COUNT, o.nprocs)})


def _check_scale(o: SweepOptions, cls, request, device: str, sizes: list[int], world: int, local_ranks: int,
                 launched: bool = False) -> None:
    """Refuse what this host cannot hold or run before any rank starts: more local ranks than it
    carries, more virtual ranks than the backend can step through, buffers larger than its memory."""
    from commbench.commands.helpers import options as O

    if local_ranks > 1 and not cls.in_process(request):
        O.check_local_ranks(local_ranks, o.oversubscribe, launched=launched)
    if cls.max_virtual_ranks is not None and world > cls.max_virtual_ranks:
        raise UsageFault(f"--nprocs {world}: {cls.name} runs every virtual rank's schedule in this process and "
                         f"its work grows as ranks^2: at most {cls.max_virtual_ranks}; `commbench predict` costs "
                         f"larger clusters")
    if device == "cpu":  # send and receive buffers of the largest size, on every rank this host holds
        O.check_memory(2 * max(sizes) * local_ranks, f"{local_ranks} rank(s) x 2 buffers of {max(sizes):,d} B")
