"""The `commbench` command line. Thin: it parses, validates, and calls one library function.

Heavy modules (torch, the backends) are imported inside commands, so `--help`
starts fast. Errors a user can cause print one line and exit with code 2.
"""
from __future__ import annotations

import json
import os
import sys

import click

from commbench import __version__

EXIT_USAGE = 2

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

\b
Exit codes: 0 ok, 1 wrong results (#wrong > 0), 2 bad input, 3 a rank failed
(died, hung past --timeout, out of memory), 130 interrupted.
"""


class UsageFault(click.ClickException):
    exit_code = EXIT_USAGE


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="commbench")
def cli() -> None:
    """commbench: communication benchmarks for distributed training (nccl-tests-style sweeps)."""


@cli.command(epilog=SWEEP_EXAMPLES)
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
              help="Where collectives run: torch (torch.distributed: gloo/NCCL), or commbench's own algorithms "
                   "on shm (shared memory, one host), p2p (torch send/recv, any nodes), hybrid (shm inside a "
                   "node, send/recv between nodes), sim (virtual ranks in one process, checked; timed by the "
                   "cost model with --hw).")
@click.option("--algorithm", "-A", default="auto", show_default=True,
              help="shm/p2p/hybrid/sim: ring, hier, tree, rhd, oneshot, binomial (allreduce), ring (allgather, "
                   "reduce_scatter), chain (broadcast, reduce), or auto (by size and topology, docs/algorithms.md).")
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
                   "[default: number of GPUs, or 2 on CPU].")
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
    if options["backend"] == "sim":  # every virtual rank lives in this process: nothing to launch or join
        cfg, _ = _sweep_config(options, world=None)
        sys.exit(bench.run_sweep(cfg, launch.LaunchInfo.local(0, 1, 0), sys.argv))
    launcher = None if options["launcher"] == "auto" else options["launcher"]
    launcher = launcher or launch.detect_launcher(env)
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
    if world is None:
        world = options["nprocs"] if options["nprocs"] is not None else _default_nprocs(device)
    if world < 1:
        raise UsageFault(f"--nprocs {world}: need at least 1 rank")
    if not 0 <= options["root"] < world and any(C.COLLECTIVES[n].rooted for n in names):
        raise UsageFault(f"--root {options['root']}: must be a rank in 0..{world - 1}")
    _check_supported(options["backend"], library, names, dtype, op, world)
    _check_algorithm(options, names, world)
    for flag in ("json_path", "csv_path"):
        _check_writable(options[flag])
    placements = bench.PLACEMENTS if options["placement"] == "both" else (options["placement"],)
    cfg = bench.SweepConfig(
        collectives=tuple(names), sizes=tuple(sizes), dtype=dtype.name, op=op, root=options["root"],
        placements=tuple(placements), warmup=options["warmup"], iters=options["iters"],
        min_time_s=options["min_time"], rank_agg=options["rank_agg"], check=options["check"],
        backend=options["backend"], torch_backend=options["torch_backend"], device=device,
        json_path=options["json_path"], csv_path=options["csv_path"], timeout_s=options["timeout_s"],
        algorithm=options["algorithm"], topology=options["topology"], nprocs=world, hw=options["hw"])
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
        if not table:
            raise UsageFault(f"--backend {backend} has no algorithm for {name}; it runs "
                             f"{', '.join(algorithms.ALGORITHMS)} (use --backend torch for {name})")
        if algorithm != "auto" and algorithm not in table:
            raise UsageFault(f"no algorithm {algorithm!r} for {name}; available: {', '.join(table)}, auto")
    try:
        parse_topology(options["topology"], world)
    except TopologyError as exc:
        raise UsageFault(str(exc)) from exc


def _check_writable(path: str | None) -> None:
    if not path:
        return
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise UsageFault(f"cannot create the directory of {path}: {exc.strerror}") from exc
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageFault(f"cannot write {path}: permission denied")


def _resolve_device(options: dict) -> tuple[str, str]:
    from commbench.backends import BackendError

    if options["backend"] != "torch":
        if options["device"] == "cuda":
            raise BackendError(f"--backend {options['backend']} runs on the CPU; GPUs: --backend torch")
        return "cpu", "schedule"
    from commbench.backends.torch_dist import resolve_device

    return resolve_device(options["device"], options["torch_backend"])


def _default_nprocs(device: str) -> int:
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

    if backend == "torch" and "sendrecv" in names and world == 1:
        raise UsageFault("-c sendrecv needs at least 2 ranks (each rank sends to the next one)")
    for name in names:
        name_op = op if C.COLLECTIVES[name].reduces else None
        if backend == "torch":
            reason = torch_unsupported(library, name, dtype, name_op, "both")
        elif name in algorithms.ALGORITHMS:  # other collectives: _check_algorithm names the problem
            reason = schedule_unsupported(backend, name, dtype, name_op)
        else:
            reason = None
        if reason:
            raise UsageFault(f"--op {op} with --dtype {dtype.name}: {reason}")


# ---------------------------------------------------------------- the analytic model


@cli.command("fit", epilog="""
\b
Examples:
  commbench sweep --backend shm --sizes 1K-256M --json shm.jsonl && commbench fit shm.jsonl -o shm-hw.json
  commbench fit node.jsonl cluster.jsonl --setup torch/nccl/- --base dgx-a100 -o hw.json
""")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Hardware JSON to write.")
@click.option("--setup", default=None, metavar="BACKEND/LIBRARY/ALGORITHM",
              help="Which measured setup to fit when the files hold several (the error lists them).")
@click.option("--base", default=None, metavar="PRESET|FILE",
              help="Hardware to take the levels the data cannot fit from (e.g. inter-node for a one-node sweep).")
@click.option("--sizes", "size_range", default=None, metavar="MIN-MAX",
              help="Fit only points whose size lies in this range, e.g. 64K-4M (one bandwidth per level cannot "
                   "follow a host's caches: fit the range you will predict).")
def fit_command(files: tuple[str, ...], output: str, setup: str | None, base: str | None,
                size_range: str | None) -> None:
    """Fit latency and bandwidth per link level to measured sweeps (JSON Lines)."""
    from commbench.analysis import fit as F
    from commbench.analysis.costmodel import HardwareError, load_hardware
    from commbench.results import read_records
    from commbench.sizes import SizeError, parse_size

    try:
        low, _, high = (size_range or "").partition("-")
        lo, hi = (parse_size(low), parse_size(high or low)) if size_range else (0, float("inf"))
    except SizeError as exc:
        raise UsageFault(f"--sizes: {exc}") from exc
    try:
        records = [r for path in files for r in read_records(path)
                   if r.get("record") != "result" or lo <= r.get("nbytes", 0) <= hi]
        hw = F.fit(records, setup, load_hardware(base) if base else None)
    except (F.FitError, HardwareError) as exc:
        raise UsageFault(str(exc)) from exc
    except (OSError, ValueError) as exc:
        raise UsageFault(f"cannot read the results: {str(exc).splitlines()[0]}") from exc
    _check_writable(output)
    hw.save(output)
    meta = hw.meta
    r2 = "n/a (every time equal)" if meta["r2"] is None else f"{meta['r2']:.4f}"
    click.echo(f"# fitted {meta['fitted_from']}: {meta['points']} points, R^2 {r2}, "
               f"MAPE {100 * meta['mape']:.1f}%, median error {100 * meta['median_ape']:.1f}%")
    for name, level in (("intra", hw.intra), ("inter", hw.inter)):
        fitted = "fitted" if meta["levels_fitted"][name] else "not fitted"
        click.echo(f"#   {name:5s} {level.bw_gbps:10.3f} GB/s  {level.latency_us:9.3f} us/step  ({fitted})")
    click.echo(f"#   per-call overhead {hw.per_call_overhead_us:.3f} us")
    for note in meta["notes"]:
        click.echo(f"#   note: {note}")
    click.echo(f"# wrote {output}")


@cli.command("predict", epilog="""
\b
Examples:
  commbench predict --hw dgx-a100 -c allreduce --sizes 1K-1G --topology 16x8 --algorithm ring
  commbench predict --hw shm-hw.json --sizes 1K-256M --topology 1x4 --algorithm auto --json pred.jsonl
""")
@click.option("--hw", "hw_spec", required=True, metavar="FILE|PRESET", help="Hardware JSON (from fit) or a preset.")
@click.option("--collective", "-c", "collective_names", multiple=True, default=("allreduce",), show_default=True)
@click.option("--sizes", "-s", default="1K-1G", show_default=True, metavar="RANGE|LIST")
@click.option("--factor", "-f", type=float, default=None)
@click.option("--dtype", "-d", default="float32", show_default=True)
@click.option("--topology", "-T", required=True, metavar="NODESxRANKS")
@click.option("--algorithm", "-A", default="auto", show_default=True)
@click.option("--root", type=int, default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the predictions as JSON Lines (kind: predicted).")
def predict_command(hw_spec, collective_names, sizes, factor, dtype, topology, algorithm, root, json_path) -> None:
    """Predict collective times and bandwidths from the cost model (no ranks needed)."""
    from commbench import collectives as C
    from commbench.analysis.costmodel import HardwareError, load_hardware, with_topology
    from commbench.analysis.predict import predict
    from commbench.results import ResultSink
    from commbench.sizes import SizeError, parse_sizes
    from commbench.table import Table
    from commbench.topology import TopologyError, parse_layout

    try:
        hw = load_hardware(hw_spec)
        size_list = parse_sizes(sizes, factor)
        names = C.resolve_collectives(collective_names)
        dt = C.resolve_dtype(dtype)
        topo = parse_layout(topology)
        if not 0 <= root < topo.world:
            raise ValueError(f"--root {root}: must be a rank in 0..{topo.world - 1}")
        results = predict(with_topology(hw, topo), names, size_list, dt, topo, algorithm, root)
    except (HardwareError, SizeError, TopologyError, ValueError, KeyError) as exc:
        raise UsageFault(str(exc).strip("'\"")) from exc
    _check_writable(json_path)
    sink = ResultSink(json_path) if json_path else None
    table = Table(["in-place"], show_algorithm=True)
    table.comment(f"commbench predict: {hw.name} on {topo} ({topo.world} ranks), predicted by the cost model")
    for name in names:
        table.header(name)
        for result in (r for r in results if r.collective == name):
            table.row({"in-place": result}, dt.nccl_name)
            if sink:
                sink.result(result)
        table.footer(checked=False)
    if sink:
        sink.close()


@cli.command("report", epilog="""
\b
Examples:
  commbench report shm.jsonl gloo.jsonl -o report/
  commbench report shm.jsonl --hw shm-hw.json -o report/     # the fitted model dashed beside the measurements
""")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Directory to write.")
@click.option("--hw", "hw_spec", default=None, metavar="FILE|PRESET",
              help="Also draw this cost model's prediction of every measured setup (dashed).")
def report_command(files: tuple[str, ...], out_dir: str, hw_spec: str | None) -> None:
    """Plot bus bandwidth and time against size (PNG) and summarise the runs (index.md)."""
    from commbench.analysis.costmodel import HardwareError, load_hardware
    from commbench.analysis.report import report

    try:
        hw = load_hardware(hw_spec) if hw_spec else None
        index, pngs = report(list(files), out_dir, hw)
    except (HardwareError, ValueError) as exc:  # UnicodeDecodeError too: a file that is not JSON Lines
        raise UsageFault(str(exc).splitlines()[0]) from exc
    except OSError as exc:
        raise UsageFault(f"cannot write the report to {out_dir}: {exc.strerror or exc}") from exc
    for path in pngs:
        click.echo(f"# wrote {path}")
    click.echo(f"# wrote {index}")


@cli.command("compare", epilog="""
\b
Examples:
  commbench compare base.jsonl new.jsonl                      # busbw, regressions beyond 5% fail
  commbench compare base.jsonl new.jsonl --metric time --threshold 10 --json cmp.jsonl

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
def compare_command(base: str, new: str, threshold: float, metric: str, json_path: str | None) -> None:
    """Compare two sweeps point by point; exit 1 on any regression (a CI check).

    Result records are matched on collective, backend, library, algorithm, dtype, op,
    placement, world size and size; a point measured several times counts with its median.
    """
    from commbench.analysis import compare as K

    try:
        comparison = K.compare_files(base, new, metric, threshold)
    except K.CompareError as exc:
        raise UsageFault(str(exc)) from exc
    _check_writable(json_path)
    setup = K.describe_setup(comparison)
    click.echo(f"# commbench compare: {base} (base) vs {new} (new){': ' + setup if setup else ''}")
    for line in K.format_table(comparison):
        click.echo(line)
    click.echo(K.summary_line(comparison))
    if json_path:
        K.write_jsonl(comparison, json_path)
    from commbench.results import read_records

    wrong = sum(1 for r in read_records(new) if r.get("record") == "result" and r.get("wrong"))
    if wrong:
        click.echo(f"# {new}: {wrong} point(s) with wrong results (not compared): failing", err=True)
    if comparison.regressions or wrong:
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: click's usage errors become one line and exit code 2."""
    if not (sys.argv[1:] if argv is None else argv):  # bare `commbench`: the overview, not an error
        click.echo(cli.get_help(click.Context(cli, info_name="commbench")))
        return 0
    try:
        cli.main(args=argv, prog_name="commbench", standalone_mode=False)
    except click.exceptions.Abort:
        print("commbench: interrupted", file=sys.stderr)
        return 130
    except click.ClickException as exc:
        print(f"commbench: error: {exc.format_message()}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
