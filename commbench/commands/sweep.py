"""`commbench sweep`: parse and validate, then run the harness (commbench/bench.py) on every rank."""
from __future__ import annotations

import json
import os
import sys

import click

from commbench.commands.common import UsageFault, check_writable

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
  commbench sweep --backend cuda -N 8 --sizes 1K-256M      # commbench's kernels, 8 virtual ranks on one GPU
  torchrun --nproc-per-node 8 -m commbench sweep --backend cupy --graph --monitor

\b
Exit codes: 0 ok, 1 wrong results (#wrong > 0), 2 bad input, 3 a rank failed
(died, hung past --timeout, out of memory), 130 interrupted.
"""


@click.command(epilog=SWEEP_EXAMPLES)
@click.option("--sizes", "-s", default=None, metavar="RANGE|LIST",
              help="Message sizes in bytes: a range START-END (binary K/M/G/T suffixes, e.g. 1K-1G) or a "
                   "comma list (1K,4K,1M). Rounded down per collective as nccl-tests does. "
                   "[default: 1K-64M; 1K-1M with --backend sim, which holds every rank's buffers]")
@click.option("--factor", "-f", type=float, default=None, help="Multiply the size by this between steps [default: 2].")
@click.option("--step", default=None, metavar="BYTES", help="Add this many bytes between steps instead of --factor.")
@click.option("--collective", "-c", "collective_names", multiple=True, default=("allreduce",), show_default=True,
              metavar="NAME", help="allreduce, allgather, reduce_scatter, broadcast, reduce, alltoall, sendrecv, "
                                   "or all. Repeatable, or comma-separated.")
@click.option("--root", type=int, default=0, show_default=True, help="Root rank of broadcast and reduce.")
@click.option("--dtype", "-d", default="float32", show_default=True,
              help="float32, float16, bfloat16, float64, int32, int8, uint8, int64.")
@click.option("--op", "-o", default="sum", show_default=True, help="Reduction: sum, prod, max, min, avg.")
@click.option("--placement", type=click.Choice(["out-of-place", "in-place", "both"]), default="both",
              show_default=True, help="Buffers: separate send/receive, shared, or both columns (as nccl-tests).")
@click.option("--warmup", "-w", type=int, default=None, help="Warm-up iterations per point [default: adaptive].")
@click.option("--iters", "-n", type=int, default=None,
              help="Timed iterations per point [default: adaptive, to fill --min-time].")
@click.option("--min-time", type=float, default=0.2, show_default=True, metavar="SECONDS",
              help="Adaptive mode: time budget of the timed iterations per point (at least 5, at most 1000 iterations).")
@click.option("--backend", "-b", default="torch", show_default=True,
              help="Where collectives run: torch (torch.distributed: gloo/NCCL), cupy (NCCL through CuPy, one "
                   "rank per GPU), or commbench's own algorithms on shm (shared memory, one host), p2p (torch "
                   "send/recv, any nodes), hybrid (shm inside a node, send/recv between nodes), cuda (commbench's "
                   "CUDA kernels, docs/gpu.md), sim (virtual ranks in one process, checked; timed by the cost "
                   "model with --hw).")
@click.option("--algorithm", "-A", default="auto", show_default=True,
              help="shm/p2p/hybrid/cuda/sim: ring, hier, tree, rhd, oneshot, binomial (allreduce; cuda also "
                   "twoshot), ring (allgather, reduce_scatter), chain (broadcast, reduce), or auto (by size and "
                   "topology, docs/algorithms.md).")
@click.option("--cuda-mode", type=click.Choice(["auto", "virtual", "peer", "ipc"]), default="auto", show_default=True,
              help="cuda: virtual (every rank's buffers on one GPU, one process), peer (rank r on GPU r, one "
                   "process), ipc (one process per GPU, CUDA IPC); auto: ipc under a launcher, else peer when "
                   "--nprocs GPUs are visible, else virtual.")
@click.option("--graph", is_flag=True, default=False,
              help="cupy/cuda: capture each point's timed calls in one CUDA graph and replay it (nccl-tests -G).")
@click.option("--monitor", is_flag=True, default=False,
              help="Sample GPU (NVML: utilisation, memory, power, SM clock, PCIe, NVLink) and host (CPU, memory, "
                   "NIC) telemetry on rank 0's host; per-point averages in the JSON, a summary line at the end.")
@click.option("--topology", "-T", default=None, metavar="NODESxRANKS",
              help="Nodes x ranks per node for the algorithms, e.g. 8x8 [default: the launcher's layout, "
                   "or one node].")
@click.option("--hw", default=None, metavar="FILE|PRESET",
              help="sim: time each call with the cost model of this hardware (from `commbench fit`, or a preset).")
@click.option("--torch-backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True,
              help="torch.distributed backend: gloo on CPU and NCCL on GPU by default.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: cuda when torch sees a GPU, else cpu.")
@click.option("--nprocs", "-N", type=int, default=None,
              help="Local ranks to spawn when no launcher (torchrun, srun, mpirun) started this process "
                   "[default: number of GPUs (2 virtual ranks for cuda on one GPU), or 2 on CPU].")
@click.option("--launcher", type=click.Choice(["auto", "spawn", "torchrun", "slurm", "mpi"]), default="auto",
              show_default=True, help="Force how ranks are found; auto reads the environment.")
@click.option("--rank-agg", "-a", type=click.Choice(["max", "avg", "min"]), default="max", show_default=True,
              help="Combine ranks' times (as nccl-tests -a).")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Verify every result; any wrong element makes the run exit 1.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write JSON Lines: a header record, one record per point (flushed as measured), a summary.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write one CSV row per point.")
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True, metavar="SECONDS",
              help="Stop if a rank dies or no collective completes within this long.")
def sweep(**options) -> None:
    """Benchmark collectives across message sizes (nccl-tests-style table, checked results).

    Without a launcher, spawns --nprocs local ranks that rendezvous on loopback.
    Under torchrun, SLURM (srun) or MPI (mpirun) every rank runs this command and
    joins the existing job.
    """
    from commbench import bench, launch

    env = os.environ
    launcher = None if options["launcher"] == "auto" else options["launcher"]
    launcher = launcher or launch.detect_launcher(env)
    if _in_one_process(options, launcher):  # every rank lives in this process: nothing to launch or join
        cfg, _ = _sweep_config(options, world=None)
        sys.exit(bench.run_sweep(cfg, launch.LaunchInfo.local(0, 1, 0), sys.argv))
    if launcher in (None, "spawn") and launch.SPAWN_VAR not in env:
        cfg, world = _sweep_config(options, world=None)
        code = launch.spawn_local("commbench.bench", world, {bench.CONFIG_VAR: cfg.to_json(),
                                                             bench.ARGV_VAR: json.dumps(sys.argv)})
        sys.exit(code)
    info = _launch_info(launch, env, launcher)
    if options["nprocs"] is not None and options["nprocs"] != info.world_size and info.rank == 0:
        click.echo(f"commbench: note: --nprocs {options['nprocs']} ignored: {launcher} started "
                   f"{info.world_size} rank(s)", err=True)
    cfg, _ = _sweep_config(options, world=info.world_size)
    sys.exit(bench.run_sweep(cfg, info, sys.argv))


def _in_one_process(options: dict, launcher: str | None) -> bool:
    """sim, and cuda with its ranks in this process (virtual or peer); resolves --cuda-mode auto."""
    if options["backend"] == "sim":
        return True
    if options["backend"] != "cuda":
        if options["cuda_mode"] != "auto":
            raise UsageFault("--cuda-mode only applies to --backend cuda (where its ranks' buffers live)")
        return False
    from commbench.backends.cuda_sched import resolve_mode

    gpus = _gpus(options)
    world = options["nprocs"] if options["nprocs"] is not None else (gpus if gpus > 1 else 2)
    mode = resolve_mode(options["cuda_mode"], launcher or "single", world, gpus)
    if mode != "ipc" and launcher is not None:
        raise UsageFault(f"--cuda-mode {mode} runs every rank in one process: start it without {launcher}, "
                         f"or use --cuda-mode ipc (one process per GPU)")
    options["cuda_mode"] = mode
    return mode != "ipc"


def _gpus(options: dict) -> int:
    """Visible CUDA devices for --backend cupy/cuda, or one line (exit 2) saying what is missing."""
    from commbench.backends import BackendError
    from commbench.backends.gpu import require_gpu

    try:
        return require_gpu(options["backend"])
    except BackendError as exc:
        raise UsageFault(str(exc)) from exc


def _launch_info(launch, env, launcher):
    try:
        return launch.from_environment(env, launcher)
    except launch.LaunchError as exc:
        raise UsageFault(str(exc)) from exc


def _sweep_config(options: dict, world: int | None):
    """Validate everything that can be checked before any rank starts; (SweepConfig, world size)."""
    from commbench import bench
    from commbench import collectives as C
    from commbench.backends import BackendError, backend_class
    from commbench.sizes import SizeError, parse_sizes

    default_sizes = "1K-1M" if options["backend"] == "sim" else "1K-64M"
    try:
        sizes = parse_sizes(options["sizes"] or default_sizes, options["factor"], options["step"])
        names = C.resolve_collectives(options["collective_names"])
        dtype = C.resolve_dtype(options["dtype"])
    except (SizeError, ValueError) as exc:
        raise UsageFault(str(exc)) from exc
    op = options["op"].lower()
    if op not in C.OPS:
        raise UsageFault(f"unknown op {options['op']!r}; choose from {', '.join(C.OPS)}")
    _check_counts(options)
    try:
        backend_class(options["backend"])
        device, library = _resolve_device(options)
    except BackendError as exc:
        raise UsageFault(str(exc)) from exc
    if options["graph"] and options["backend"] not in ("cupy", "cuda"):
        raise UsageFault("--graph captures CUDA work in a graph: use it with --backend cupy or cuda")
    if world is None:
        world = options["nprocs"] if options["nprocs"] is not None else _default_nprocs(options, device)
    if world < 1:
        raise UsageFault(f"--nprocs {world}: need at least 1 rank")
    if not 0 <= options["root"] < world and any(C.COLLECTIVES[n].rooted for n in names):
        raise UsageFault(f"--root {options['root']}: must be a rank in 0..{world - 1}")
    _check_supported(options["backend"], library, names, dtype, op, world)
    _check_algorithm(options, names, world)
    for flag in ("json_path", "csv_path"):
        check_writable(options[flag])
    placements = bench.PLACEMENTS if options["placement"] == "both" else (options["placement"],)
    cfg = bench.SweepConfig(
        collectives=tuple(names), sizes=tuple(sizes), dtype=dtype.name, op=op, root=options["root"],
        placements=tuple(placements), warmup=options["warmup"], iters=options["iters"],
        min_time_s=options["min_time"], rank_agg=options["rank_agg"], check=options["check"],
        backend=options["backend"], torch_backend=options["torch_backend"], device=device,
        json_path=options["json_path"], csv_path=options["csv_path"], timeout_s=options["timeout_s"],
        algorithm=options["algorithm"], topology=options["topology"], nprocs=world, hw=options["hw"],
        cuda_mode=options["cuda_mode"], graph=options["graph"], monitor=options["monitor"])
    return cfg, world


def _check_counts(options: dict) -> None:
    if options["iters"] is not None and options["iters"] < 1:
        raise UsageFault(f"--iters {options['iters']}: need at least 1")
    if options["warmup"] is not None and options["warmup"] < 0:
        raise UsageFault(f"--warmup {options['warmup']}: cannot be negative")
    if not options["min_time"] > 0:
        raise UsageFault(f"--min-time {options['min_time']}: must be positive")
    if not options["timeout_s"] > 0:
        raise UsageFault(f"--timeout {options['timeout_s']}: must be positive")


def _check_algorithm(options: dict, names: list[str], world: int) -> None:
    from commbench import algorithms
    from commbench.backends import SCHEDULE_BACKENDS
    from commbench.topology import TopologyError, parse_topology

    backend, algorithm = options["backend"], options["algorithm"]
    if options["hw"] and backend != "sim":
        raise UsageFault("--hw times the sim backend's calls; other backends measure theirs")
    if options["hw"]:
        from commbench.analysis.costmodel import HardwareError, load_hardware

        try:
            load_hardware(options["hw"])
        except HardwareError as exc:
            raise UsageFault(str(exc)) from exc
    if backend not in SCHEDULE_BACKENDS:
        if algorithm != "auto" or options["topology"]:
            raise UsageFault(f"--algorithm/--topology choose commbench's own algorithms: use them with --backend "
                             f"{', '.join(SCHEDULE_BACKENDS)} (--backend {backend} runs the library's)")
        return
    for name in names:
        table = algorithms.ALGORITHMS.get(name)
        if table and backend == "cuda":  # schedules only the kernels run (two-shot)
            from commbench.backends.cuda_plan import KERNEL_ALGORITHMS

            table = {**table, **KERNEL_ALGORITHMS.get(name, {})}
        if not table:
            raise UsageFault(f"--backend {backend} has no algorithm for {name}; it runs "
                             f"{', '.join(algorithms.ALGORITHMS)} (use --backend torch for {name})")
        if algorithm != "auto" and algorithm not in table:
            raise UsageFault(f"no algorithm {algorithm!r} for {name}; available: {', '.join(table)}, auto")
    try:
        parse_topology(options["topology"], world)
    except TopologyError as exc:
        raise UsageFault(str(exc)) from exc


def _resolve_device(options: dict) -> tuple[str, str]:
    from commbench.backends import GPU_BACKENDS, BackendError

    if options["backend"] in GPU_BACKENDS:
        if options["device"] == "cpu":
            raise BackendError(f"--backend {options['backend']} runs on GPUs; on the CPU: --backend torch, shm or sim")
        _gpus(options)
        return "cuda", "nccl" if options["backend"] == "cupy" else f"cuda-{options['cuda_mode']}"
    if options["backend"] != "torch":
        if options["device"] == "cuda":
            raise BackendError(f"--backend {options['backend']} runs on the CPU; GPUs: --backend torch, cupy or cuda")
        return "cpu", "schedule"
    from commbench.backends.torch_dist import resolve_device

    return resolve_device(options["device"], options["torch_backend"])


def _default_nprocs(options: dict, device: str) -> int:
    if options["backend"] in ("cupy", "cuda"):
        gpus = _gpus(options)
        return gpus if gpus > 1 or options["backend"] == "cupy" else 2  # cuda on one GPU: 2 virtual ranks
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return 2


def _check_supported(backend: str, library: str, names: list[str], dtype, op: str, world: int) -> None:
    """Op/dtype combinations the backend lacks, before any rank starts (exit 2, not a fault)."""
    from commbench import algorithms
    from commbench import collectives as C
    from commbench.backends.schedule_base import schedule_unsupported
    from commbench.backends.torch_dist import unsupported as torch_unsupported

    if backend in ("torch", "cupy") and "sendrecv" in names and world == 1:
        raise UsageFault("-c sendrecv needs at least 2 ranks (each rank sends to the next one)")
    for name in names:
        name_op = op if C.COLLECTIVES[name].reduces else None
        if backend == "torch":
            reason = torch_unsupported(library, name, dtype, name_op, "both")
        elif backend != "cupy" and name in algorithms.ALGORITHMS:  # others: _check_algorithm names the problem
            reason = schedule_unsupported(backend, name, dtype, name_op)
        else:
            reason = None
        if reason:
            raise UsageFault(f"--op {op} with --dtype {dtype.name}: {reason}")
