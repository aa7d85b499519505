"""Is a full `commbench sweep` fast enough, and does it give the same answer twice?

Runs the real command line, `commbench sweep --sizes 1K-1G --json runI.jsonl`
(default: 2 local CPU ranks, gloo, adaptive iterations, both placements, check on),
--runs times as subprocesses, and beside each one a bare torch.distributed loop
(bare_loop.bare_run_rank: 2 fresh local gloo ranks, in-place float32 sum
allreduce, warm-up and iteration counts chosen by commbench's own adaptive rule with
the same --min-time, --iters, --warmup and --nprocs as given in --cli-args) at the
sizes >= --spread-from. The runs interleave in pairs, in ABBA order (method.py):
commbench run 1, bare run 1, bare run 2, commbench run 2, ... so both see the same
machine at the same times. It reports:

- the wall time of each commbench run, against the target of under 120 s (2-core
  machine); the bare runs' wall times are shown too, with no target;
- for each size >= 1 MiB: the spread of busbw between runs, max / min - 1, for each
  commbench placement and for the bare loop, against the target of within 10%.
  busbw is computed from time_us (each rank's mean, max over ranks) for both.

The bare loop's spread is the machine's own run-to-run variation at that size, so the
verdict on each commbench point is:

  pass   commbench's spread is within the target;
  FAIL   commbench's spread exceeds the target and the bare loop's spread;
  noisy  commbench's spread exceeds the target, but the bare loop, on the same machine
         in the same interleaved runs, spread as much or more: the variation belongs to
         the machine, and this run cannot show whether commbench adds any.

Beside the spreads, each pair of runs gives one ratio per size, commbench's in-place
busbw / the bare loop's, reported as the median and interquartile range over pairs
(in --json with every pair's value): the paired view of whether commbench measures
what a bare loop measures. With 2 runs each spread is one pair of numbers: a single slow vCPU wake-up pattern
can move it by tens of percent; more runs (--runs 4) make the comparison firmer.

Each commbench run's table goes to runI.log and its results to runI.jsonl in
--out-dir; the bare results go to the --json summary. Run from the repository root;
the full check takes --runs x (one sweep + one bare run), about 3 minutes for 2 runs:

    python benchmarks/sweep_repeat.py
    python benchmarks/sweep_repeat.py --sizes 1M-4M --runs 2 --cli-args "--min-time 0.05"
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time

import method
from bare_loop import bare_run_rank
from local_ranks import RankFailure, run_local_ranks

from commbench import collectives as C
from commbench.results import read_records
from commbench.sizes import SizeError, format_size, parse_size, parse_sizes

BARE = "bare in-place"


def commbench_command() -> list[str]:
    """The installed `commbench` console script beside this Python, else `python -m commbench`."""
    script = os.path.join(os.path.dirname(sys.executable), "commbench")
    return [script] if os.access(script, os.X_OK) else [sys.executable, "-m", "commbench"]


def run_cli_sweep(sizes: str, json_path: str, log_path: str, extra: list[str]) -> tuple[float, int]:
    """One `commbench sweep` to completion; (wall seconds, exit code). Its stdout and stderr go to log_path."""
    command = [*commbench_command(), "sweep", "--sizes", sizes, "--json", json_path, "--force", *extra]
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        start = time.perf_counter()
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
        return time.perf_counter() - start, code


def measured_results(json_path: str) -> list[dict]:
    """The result records of a commbench JSON Lines file ([] if it is missing)."""
    if not os.path.exists(json_path):
        return []
    return [r for r in read_records(json_path) if r.get("record") == "result"]


def busbw_by_point(results: list[dict]) -> dict[tuple[int, str], float]:
    return {(r["nbytes"], r["placement"]): r["busbw_gbps"] for r in results}


def spread_rows(runs: list[dict[tuple[int, str], float]], min_nbytes: int, max_spread: float) -> list[dict]:
    """One row per (size, placement) measured in every run and at least min_nbytes."""
    common = set.intersection(*(set(run) for run in runs)) if runs else set()
    rows = []
    for nbytes, placement in sorted(common, key=lambda key: (key[0], key[1] != "out-of-place")):
        if nbytes < min_nbytes:
            continue
        values = [run[(nbytes, placement)] for run in runs]
        spread = max(values) / min(values) - 1 if min(values) > 0 else float("inf")
        rows.append({"nbytes": nbytes, "placement": placement, "busbw_gbps": values, "spread": spread,
                     "passed": spread <= max_spread})
    return rows


# ---------------------------------------------------------------- the bare loop beside it


def bare_options(extra: list[str]) -> argparse.Namespace:
    """The commbench sweep options in --cli-args that decide how many ranks and calls the bare loop gets."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--nprocs", "-N", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=method.DEFAULT_MIN_TIME_S)
    parser.add_argument("--iters", "-n", type=int, default=None)
    parser.add_argument("--warmup", "-w", type=int, default=None)
    known, _ = parser.parse_known_args(extra)
    return known


def bare_sizes(sizes: str, min_nbytes: int, world: int) -> list[int]:
    """The sizes >= min_nbytes of --sizes, rounded as commbench rounds a float32 allreduce."""
    float32 = C.resolve_dtype("float32")
    planned = (C.plan("allreduce", nbytes, float32, world).nbytes for nbytes in parse_sizes(sizes))
    return sorted({nbytes for nbytes in planned if nbytes >= min_nbytes and nbytes >= 4})


def run_bare(sizes: list[int], options: argparse.Namespace, timeout_s: float) -> tuple[float, list[dict], str | None]:
    """One bare run in fresh local ranks: (wall seconds, one dict per size, error or None)."""
    start = time.perf_counter()
    try:
        rows = list(run_local_ranks(bare_run_rank, (sizes, options.min_time, options.warmup, options.iters),
                                    options.nprocs, timeout_s))
        error = None
    except RankFailure as exc:
        rows, error = [], str(exc)
    for row in rows:
        row["busbw_gbps"] = method.allreduce_bandwidths_gbps(row["nbytes"], row["time_us"], options.nprocs)[1]
    return time.perf_counter() - start, rows, error


def judge(row: dict, bare_spread: float | None, max_spread: float) -> str:
    """pass within the target; noisy when the bare loop spread as much; else FAIL."""
    if row["spread"] <= max_spread:
        return "pass"
    if bare_spread is not None and row["spread"] <= bare_spread:
        return "noisy"
    return "FAIL"


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1K-1G", help="passed to commbench sweep --sizes [default: %(default)s]")
    parser.add_argument("--runs", type=int, default=2,
                        help="how many commbench sweeps, and as many bare runs [default: 2]")
    parser.add_argument("--out-dir", default="out/sweep_repeat", help="where runI.jsonl and runI.log go "
                                                                       "[default: %(default)s]")
    parser.add_argument("--cli-args", default="", metavar="ARGS",
                        help='more commbench sweep options, one quoted string, e.g. "--nprocs 2 --min-time 0.1"; '
                             "--nprocs, --min-time, --iters and --warmup apply to the bare loop too")
    parser.add_argument("--spread-from", default="1M", metavar="SIZE",
                        help="compare busbw between runs at this size and above; the bare loop runs these sizes "
                             "[default: %(default)s]")
    parser.add_argument("--max-wall", type=float, default=120.0, metavar="SECONDS",
                        help="target wall time of one sweep [default: 120]")
    parser.add_argument("--max-spread", type=float, default=0.10, metavar="FRACTION",
                        help="target busbw spread between runs, max/min - 1 [default: 0.10]")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="give up on a bare run when its ranks report nothing for this long [default: 600]")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the summary here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spread_from, extra, options, sizes = checked_options(args)
    os.makedirs(args.out_dir, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # every run's ranks, as torchrun and commbench sweep set it
    _print_plan(args, options, sizes)
    runs = Runs()
    for index, commbench_first in enumerate(method.abba_orders(args.runs), start=1):
        if commbench_first:
            commbench_run(index, args, extra, runs)
            bare_run(index, args, options, sizes, runs)
        else:
            bare_run(index, args, options, sizes, runs)
            commbench_run(index, args, extra, runs)
    report(args, options, runs, sizes, spread_from)
    return 0


def checked_options(args: argparse.Namespace) -> tuple[int, list[str], argparse.Namespace, list[int]]:
    """(--spread-from in bytes, the --cli-args, the bare loop's options from them, the bare loop's sizes);
    a bad option ends the run (exit 2)."""
    try:
        parse_sizes(args.sizes)
        spread_from = parse_size(args.spread_from)
    except SizeError as exc:
        method.fail(str(exc))
    if args.runs < 1:
        method.fail("--runs must be at least 1")
    extra = shlex.split(args.cli_args)
    options = bare_options(extra)
    if options.nprocs < 1 or (options.iters is not None and options.iters < 1) or \
            (options.warmup is not None and options.warmup < 0) or not options.min_time > 0:
        method.fail("--cli-args: --nprocs and --iters must be at least 1, --warmup at least 0, --min-time positive")
    return spread_from, extra, options, bare_sizes(args.sizes, spread_from, options.nprocs)


def _print_plan(args: argparse.Namespace, options: argparse.Namespace, sizes: list[int]) -> None:
    print(f"# commbench sweep --sizes {args.sizes} {args.cli_args}".rstrip() + f", {args.runs} runs, "
          f"logs and results in {args.out_dir}/", flush=True)
    print(f"# beside each: a bare torch.distributed loop, {options.nprocs} fresh gloo ranks, in-place, "
          f"{len(sizes)} sizes >= {args.spread_from}, --min-time {options.min_time:g}"
          + (f", --iters {options.iters}" if options.iters is not None else "")
          + (f", --warmup {options.warmup}" if options.warmup is not None else "")
          + f", OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; runs interleaved", flush=True)


class Runs:
    """What the interleaved runs gave so far: per commbench sweep its wall time and busbw per point,
    per bare run its sizes and busbw per size."""

    def __init__(self):
        self.walls: list[dict] = []
        self.busbw: list[dict[tuple[int, str], float]] = []
        self.bare: list[dict] = []
        self.bare_busbw: list[dict[tuple[int, str], float]] = []


def commbench_run(index: int, args: argparse.Namespace, extra: list[str], runs: Runs) -> None:
    json_path = os.path.join(args.out_dir, f"run{index}.jsonl")
    log_path = os.path.join(args.out_dir, f"run{index}.log")
    wall_s, code = run_cli_sweep(args.sizes, json_path, log_path, extra)
    results = measured_results(json_path)
    verdict = "pass" if wall_s < args.max_wall and code == 0 else "FAIL"
    print(f"run {index} commbench: wall {wall_s:.1f} s (target < {args.max_wall:g} s), exit code {code}, "
          f"{len(results)} points: {verdict}" + ("" if code == 0 else f" (see {log_path})"), flush=True)
    runs.walls.append({"run": index, "wall_s": wall_s, "exit_code": code, "points": len(results),
                       "passed": verdict == "pass"})
    runs.busbw.append(busbw_by_point(results))


def bare_run(index: int, args: argparse.Namespace, options: argparse.Namespace, sizes: list[int], runs: Runs) -> None:
    if sizes:
        bare_wall_s, bare_rows, error = run_bare(sizes, options, args.timeout)
        print(f"run {index} bare:      wall {bare_wall_s:.1f} s, {len(bare_rows)} sizes"
              + (f": failed: {error}" if error else ""), flush=True)
        runs.bare.append({"run": index, "wall_s": bare_wall_s, "error": error, "sizes": bare_rows})
        runs.bare_busbw.append({(row["nbytes"], BARE): row["busbw_gbps"] for row in bare_rows})


def report(args: argparse.Namespace, options: argparse.Namespace, runs: Runs, sizes: list[int],
           spread_from: int) -> None:
    """The spread table with its verdicts, the paired ratios, and the JSON summary."""
    pair_rows = paired_rows(runs.busbw, runs.bare_busbw, sizes)
    rows = spread_rows(runs.busbw, spread_from, args.max_spread)
    bare_rows = spread_rows(runs.bare_busbw, spread_from, args.max_spread) if runs.bare_busbw else []
    bare_spread = {row["nbytes"]: row["spread"] for row in bare_rows}
    for row in rows:
        row["bare_spread"] = bare_spread.get(row["nbytes"])
        row["verdict"] = judge(row, row["bare_spread"], args.max_spread)
    _print_spread(rows, bare_rows, args)
    if pair_rows:
        print("\n# paired: commbench in-place busbw / bare busbw, per pair of runs: median [q1-q3] (pairs)")
        for row in pair_rows:
            print(f"#   {format_size(row['nbytes'])}: {row['ratio_text']} ({len(row['ratios'])})")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump({"benchmark": "sweep_repeat", "command": " ".join(sys.argv), "config": vars(args),
                       "bare_options": vars(options), "runs": runs.walls, "bare_runs": runs.bare, "spread": rows,
                       "paired": pair_rows,
                       "bare_spread": [{k: v for k, v in row.items() if k != "passed"} for row in bare_rows]},
                      handle, indent=1)
        print(f"# wrote {args.json_path}")


def _print_spread(rows: list[dict], bare_rows: list[dict], args: argparse.Namespace) -> None:
    if args.runs < 2:
        print("# one run: no spread to report")
        return
    if not rows:
        print(f"# no size >= {args.spread_from} was measured in every commbench run: no spread to report")
        return
    table = method.Table(["size", "measured by", *(f"run{i} busbw_gbps" for i in range(1, args.runs + 1)),
                          "spread %", "bare spread %", "target %", "verdict"],
                         widths={"measured by": len("commbench out-of-place")})
    print("\n# busbw (GB/s, from time_us) in each run; spread = max / min - 1 between runs")
    print(table.header())
    bare_by_size = {row["nbytes"]: row for row in bare_rows}
    for nbytes in sorted({row["nbytes"] for row in rows}):
        for row in (r for r in rows if r["nbytes"] == nbytes):
            print(table.row([format_size(nbytes), f"commbench {row['placement']}", *row["busbw_gbps"],
                             f"{100 * row['spread']:.1f}", _percent(row["bare_spread"]),
                             f"{100 * args.max_spread:.0f}", row["verdict"]]))
        bare = bare_by_size.get(nbytes)
        if bare is not None:
            print(table.row([format_size(nbytes), BARE, *bare["busbw_gbps"], f"{100 * bare['spread']:.1f}",
                             "", "", "(machine)"]))
    verdicts = [row["verdict"] for row in rows]
    print(f"# commbench, {len(rows)} points: "
          + ", ".join(f"{verdicts.count(v)} {v}" for v in ("pass", "FAIL", "noisy"))
          + f" (target: busbw spread <= {100 * args.max_spread:.0f}%)")
    if "noisy" in verdicts:
        print("# noisy: commbench's spread exceeds the target, but the bare loop, in the same interleaved runs, "
              "spread as much or more: the machine varies that much; this run cannot tell whether commbench adds to it")


def paired_rows(busbw_runs: list[dict], bare_busbw_runs: list[dict], sizes: list[int]) -> list[dict]:
    """Per size: the ratio commbench in-place busbw / bare busbw of each pair of runs, median and IQR."""
    out = []
    for nbytes in sizes:
        ratios = tuple(ours[(nbytes, "in-place")] / bare[(nbytes, BARE)]
                       for ours, bare in zip(busbw_runs, bare_busbw_runs)
                       if (nbytes, "in-place") in ours and (nbytes, BARE) in bare and bare[(nbytes, BARE)] > 0)
        if ratios:
            pair = method.PairedRatio(ratios)
            out.append({"nbytes": nbytes, "ratios": list(ratios), "median": pair.median, "q1": pair.q1,
                        "q3": pair.q3, "ratio_text": pair.text()})
    return out


def _percent(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{100 * value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
