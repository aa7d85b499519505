"""commbench against its CPU peers, side by side in one run: allreduce float32 sum, 2 ranks.

Three tools measure the same sizes (bytes per rank), --rounds times, the order of the
tools rotating from round to round so that drift in the machine falls on all alike:

  commbench  the real CLI: `commbench sweep --placement in-place --json ...` on 2 CPU
             ranks with gloo (adaptive iterations, results checked); its time_us;
  bare       a bare torch.distributed gloo loop in 2 fresh ranks
             (harness_overhead.bare_run_rank);
  mpi        Open MPI through mpi4py, comm.Allreduce(MPI.IN_PLACE, buffer)
             (mpi_allreduce.py under mpirun).

The bare and MPI loops size their warm-up and iteration counts by commbench's own
adaptive rule (method.py), time each call with time.perf_counter after a barrier, and
take each rank's mean, then the maximum over ranks: the number commbench reports.
Every column is the median over rounds; busbw follows nccl-tests (algbw = bytes /
time / 1e9, busbw = algbw * 2(n-1)/n), computed here from the median time for all
three tools; commbench's own busbw column is checked against the same formula.
ratio = commbench time / peer time (above 1: commbench measured a slower time).

MPI runs with --bind-to none, as the torch ranks are unbound, and with Open MPI's
default transport (shared memory on one host, where gloo uses TCP on loopback):
--mpi-args "--mca btl self,tcp" compares on the same transport. Without mpirun or
mpi4py the MPI column is skipped with one line saying so. To get them (as root):

    apt-get update && apt-get install -y openmpi-bin libopenmpi-dev
    pip install mpi4py    # a wheel, or built against libopenmpi-dev

Run from the repository root (about 1 minute with the defaults on 2 cores):

    python benchmarks/peers_cpu.py
    python benchmarks/peers_cpu.py --sizes 1K-64K --rounds 1 --json out/peers_cpu.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys

import method
from harness_overhead import RankFailure, bare_run_rank, run_local_ranks
from sweep_repeat import commbench_command, measured_results

from commbench.sizes import SizeError, format_size, parse_sizes

WORLD = 2
TOOLS = ("commbench", "bare", "mpi")
HERE = os.path.dirname(os.path.abspath(__file__))


class ToolFailure(RuntimeError):
    """One tool's run failed; the others still report."""


# ---------------------------------------------------------------- the three tools


def run_commbench(sizes: list[int], args: argparse.Namespace, tag: str) -> dict[int, float]:
    """nbytes -> time_us of the in-place column of one `commbench sweep` run."""
    json_path, log_path = (os.path.join(args.out_dir, f"commbench_{tag}.{ext}") for ext in ("jsonl", "log"))
    command = [*commbench_command(), "sweep", "--sizes", ",".join(map(str, sizes)), "--placement", "in-place",
               "--nprocs", str(WORLD), "--device", "cpu", "--torch-backend", "gloo",
               "--min-time", str(args.min_time), "--json", json_path]
    _run_logged(command, log_path, args.timeout)
    times = {}
    for record in measured_results(json_path):
        _check_busbw(record)
        times[record["nbytes"]] = record["time_us"]
    return times


def _check_busbw(record: dict) -> None:
    """commbench's busbw must be the nccl-tests formula applied to its own time_us."""
    _, busbw = method.allreduce_bandwidths_gbps(record["nbytes"], record["time_us"], record["world_size"])
    if abs(record["busbw_gbps"] - busbw) > 1e-9 * max(busbw, 1.0):
        print(f"# warning: commbench reports busbw {record['busbw_gbps']:.6g} GB/s at {record['nbytes']} B; "
              f"the nccl-tests formula gives {busbw:.6g}", file=sys.stderr)


def run_bare(sizes: list[int], args: argparse.Namespace, tag: str) -> dict[int, float]:
    """nbytes -> time_us of the bare torch.distributed loop in 2 fresh local ranks."""
    try:
        return {row["nbytes"]: row["time_us"]
                for row in run_local_ranks(bare_run_rank, (sizes, args.min_time), WORLD, args.timeout)}
    except RankFailure as exc:
        raise ToolFailure(str(exc)) from exc


def mpi_missing() -> str | None:
    """Why the MPI column cannot run here, or None."""
    if shutil.which("mpirun") is None:
        return "mpirun not found"
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed for {sys.executable}"
    return None


def run_mpi(sizes: list[int], args: argparse.Namespace, tag: str) -> dict[int, float]:
    """nbytes -> time_us of mpi_allreduce.py under mpirun."""
    json_path, log_path = (os.path.join(args.out_dir, f"mpi_{tag}.{ext}") for ext in ("jsonl", "log"))
    command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(WORLD),
               "-x", f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}", *shlex.split(args.mpi_args),
               sys.executable, os.path.join(HERE, "mpi_allreduce.py"), "--sizes", ",".join(map(str, sizes)),
               "--min-time", str(args.min_time), "--json", json_path]
    _run_logged(command, log_path, args.timeout)
    if not os.path.exists(json_path):
        raise ToolFailure(f"mpirun wrote no results (see {log_path})")
    with open(json_path, encoding="utf-8") as handle:
        return {row["nbytes"]: row["time_us"] for row in map(json.loads, handle)}


def _run_logged(command: list[str], log_path: str, timeout_s: float) -> None:
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        try:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  check=False).returncode
        except subprocess.TimeoutExpired as exc:
            raise ToolFailure(f"no result within {timeout_s:g} s (see {log_path})") from exc
    if code != 0:
        raise ToolFailure(f"exit code {code} (see {log_path})")


RUNNERS = {"commbench": run_commbench, "bare": run_bare, "mpi": run_mpi}


# ---------------------------------------------------------------- rounds and report


def measure(sizes: list[int], tools: list[str], args: argparse.Namespace) -> dict[str, list[dict[int, float]]]:
    """tool -> one {nbytes: time_us} per round that succeeded; the tool order rotates each round."""
    rounds: dict[str, list[dict[int, float]]] = {tool: [] for tool in tools}
    for index in range(args.rounds):
        order = tools[index % len(tools):] + tools[:index % len(tools)]
        for tool in order:
            try:
                rounds[tool].append(RUNNERS[tool](sizes, args, tag=f"round{index + 1}"))
            except ToolFailure as exc:
                print(f"# {tool}, round {index + 1}: failed: {exc}", flush=True)
        print(f"# round {index + 1} of {args.rounds} done ({', '.join(order)})", flush=True)
    return rounds


def summarize(sizes: list[int], rounds: dict[str, list[dict[int, float]]]) -> list[dict]:
    rows = []
    for nbytes in sizes:
        row: dict = {"nbytes": nbytes}
        for tool in TOOLS:
            values = [r[nbytes] for r in rounds.get(tool, []) if nbytes in r]
            time_us = method.median(values)
            row[f"{tool}_rounds_us"] = values
            row[f"{tool}_time_us"] = time_us
            row[f"{tool}_busbw_gbps"] = method.allreduce_bandwidths_gbps(nbytes, time_us, WORLD)[1] if values \
                else float("nan")
        row["ratio_commbench_bare"] = row["commbench_time_us"] / row["bare_time_us"]
        row["ratio_commbench_mpi"] = row["commbench_time_us"] / row["mpi_time_us"]
        rows.append(row)
    return rows


def print_report(rows: list[dict]) -> None:
    times = method.Table(["size", "bytes", *(f"{t} time_us" for t in TOOLS), "ratio cb/bare", "ratio cb/mpi"])
    print("\n# time per allreduce, median over rounds (ratio = commbench time / peer time)")
    print(times.header())
    for row in rows:
        print(times.row([format_size(row["nbytes"]), row["nbytes"], *(row[f"{t}_time_us"] for t in TOOLS),
                         method.ratio_text(row["ratio_commbench_bare"]),
                         method.ratio_text(row["ratio_commbench_mpi"])]))
    bandwidth = method.Table(["size", "bytes", *(f"{t} busbw_gbps" for t in TOOLS)])
    print(f"\n# bus bandwidth (nccl-tests: algbw * 2(n-1)/n, n = {WORLD}), from the median times")
    print(bandwidth.header())
    for row in rows:
        print(bandwidth.row([format_size(row["nbytes"]), row["nbytes"], *(row[f"{t}_busbw_gbps"] for t in TOOLS)]))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=method.DEFAULT_SIZES,
                        help="bytes per rank, as commbench --sizes; multiples of 4 [default: %(default)s]")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each tool; odd makes each median one measured value [default: 3]")
    parser.add_argument("--min-time", type=float, default=method.DEFAULT_MIN_TIME_S, metavar="SECONDS",
                        help="time budget of the timed iterations per size, for all three tools [default: 0.2]")
    parser.add_argument("--mpi-args", default="", metavar="ARGS",
                        help='more mpirun options, one quoted string, e.g. "--mca btl self,tcp"')
    parser.add_argument("--out-dir", default="out/peers_cpu", help="logs and per-run results [default: %(default)s]")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="give up on one tool's run after this long [default: 600]")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results (every round) here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
    except SizeError as exc:
        method.fail(str(exc))
    if any(nbytes % 4 or nbytes < 4 for nbytes in sizes):
        method.fail("sizes must be positive multiples of 4 bytes (float32 elements)")
    if args.rounds < 1:
        method.fail("--rounds must be at least 1")
    os.makedirs(args.out_dir, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # every tool's ranks, as torchrun and commbench set it
    tools = list(TOOLS)
    missing = mpi_missing()
    if missing:
        print(f"# Open MPI skipped: {missing} (see the install commands in benchmarks/README.md)")
        tools.remove("mpi")
    print(f"# peers on CPU: allreduce float32 sum, {WORLD} ranks, {', '.join(tools)}, {args.rounds} rounds, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {os.cpu_count()} CPUs, logs in {args.out_dir}/",
          flush=True)
    rows = summarize(sizes, measure(sizes, tools, args))
    print_report(rows)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump({"benchmark": "peers_cpu", "command": " ".join(sys.argv), "world_size": WORLD,
                       "config": vars(args), "tools": tools, "mpi_skipped": missing, "rows": _no_nan(rows)},
                      handle, indent=1)
        print(f"# wrote {args.json_path}")
    return 0


def _no_nan(rows: list[dict]) -> list[dict]:
    """NaN (a tool that did not run) as JSON null."""
    return [{k: None if isinstance(v, float) and v != v else v for k, v in row.items()} for row in rows]


if __name__ == "__main__":
    sys.exit(main())
