"""How much does commbench's harness add to what a bare torch.distributed loop measures?

Section 1, "harness overhead", 2 ranks. Two local CPU ranks (gloo on loopback,
OMP_NUM_THREADS=1 per rank as torchrun sets it) measure, in the same processes and on
the same process group, an in-place float32 sum allreduce at each size in two ways:

  bare       dist.barrier(), then N back-to-back dist.all_reduce(t), each timed with
             time.perf_counter; both ranks' per-call times are then gathered
             (dist.all_gather) and reduced by commbench.bench_point.summarize;
  commbench  commbench.bench_point.measure_point (in-place, check off) on a TorchBackend,
             then commbench.bench_point.collect, exactly as `commbench sweep` builds its
             numbers.

Each round gives two statistics per method, computed for both by the same function
(bench_point.summarize: one sample per call, the slowest rank's time of that call):

  mean  the mean of those samples: commbench's time_us (--stat mean), the number its
        busbw comes from;
  p50   their median: commbench's p50_us.

Both methods use the same N and the same warm-up count (chosen once per size by the
rule in method.py, which is commbench's adaptive rule). Each round is one pair of the
paired method (method.py): bare then commbench in rounds 1, 3, 5..., commbench then
bare in rounds 2, 4, 6... (ABBA), and each pair gives ratio = commbench / bare. The
columns are the median over rounds of each method, the median pair ratio and the
interquartile range (IQR) of the pair ratios. Target: |ratio - 1| <= 5% at >= 64 KiB
and <= 10% below (slower or faster: either way the harness would misreport). Verdict,
for the mean and for the p50 separately, on the IQR of the pair ratios:

  pass   the whole IQR lies within the target;
  FAIL   the whole IQR lies outside it (on one side);
  noisy  the IQR crosses an edge of the target: this run can neither show nor rule
         out an overhead of that size.

On a small VM the 2-rank gloo time is mostly the time a sleeping vCPU takes to wake
when its peer's data arrives: per-call times are heavy-tailed, even bimodal, so the
pair ratios scatter too and "noisy" is a common verdict there. Section 2 measures the
harness's cost without that noise.

Section 2, "loop overhead", 1 rank. A world-size-1 gloo process group in one process:
no peer process to wait for, so no cross-process wake-up (gloo still hands each call
to its worker thread). The same two methods, --loop-iters calls (fixed, 2000) at each
of --loop-sizes (1K,64K,1M), the same alternating rounds. It reports, for the mean
and the p50, the ratio and the difference commbench - bare in microseconds per call:
what commbench's timing loop itself costs per call, and that difference as a
percentage of the 2-rank bare time at the same size from section 1, i.e. the share
of a 2-rank measurement the harness loop can account for.

Run from the repository root (about 1.5 minutes with the defaults on 2 cores):

    python benchmarks/harness_overhead.py
    python benchmarks/harness_overhead.py --sizes 1K-64K --rounds 2 --json out/overhead.json
"""
from __future__ import annotations

import argparse
import os
import sys

import method
import torch
from bare_loop import bare_allreduce_stats, calibrate
from local_ranks import RankFailure, run_local_ranks

from commbench import bench_point
from commbench import collectives as C
from commbench.backends import BackendConfig
from commbench.backends.torch_dist import TorchBackend
from commbench.launchers import LaunchInfo
from commbench.sizes import SizeError, format_size, parse_sizes
from commbench.sweep_config import SweepConfig

WORLD = 2
SMALL_LIMIT, LARGE_LIMIT, LARGE_FROM_NBYTES = 0.10, 0.05, 64 << 10


# ---------------------------------------------------------------- commbench's harness


def commbench_allreduce_stats(backend: TorchBackend, cfg: SweepConfig, plan: C.Plan,
                              pattern: C.Pattern) -> dict[str, float] | None:
    """time_us, p50_us, ... exactly as `commbench sweep` reports them for the in-place column
    (rank 0; None elsewhere)."""
    outcome = bench_point.measure_point(backend, cfg, plan, "in-place", pattern)
    return bench_point.collect(backend, outcome, cfg.rank_agg)  # what bench.Sweep reports


def _overhead_rank(rank: int, world: int, port: int, outbox, sizes: list[int], rounds: int, min_time_s: float,
                   fixed_iters: int | None, fixed_warmup: int | None, timeout_s: float) -> None:
    """Both methods at each size, alternating for `rounds` rounds; rank 0 puts each round's mean and p50."""
    launch = LaunchInfo.local(rank, world, port)
    backend = TorchBackend(launch, device="cpu", torch_backend="gloo", timeout_s=timeout_s)
    dtype = C.resolve_dtype("float32")
    pattern = C.make_pattern(dtype, "sum", world)
    try:
        for nbytes in sizes:
            plan = C.plan("allreduce", nbytes, dtype, world)
            tensor = torch.ones(plan.count, dtype=torch.float32)
            warmup, iters = calibrate(tensor, min_time_s, fixed_warmup, fixed_iters)
            cfg = SweepConfig(sizes=(plan.nbytes,), placements=("in-place",), warmup=warmup, iters=iters, check=False,
                              backend=BackendConfig(torch_backend="gloo", device="cpu", timeout_s=timeout_s))
            bare, ours = [], []
            for round_index in range(rounds):
                bare_first = round_index % 2 == 0
                if bare_first:
                    bare.append(bare_allreduce_stats(tensor, iters, warmup))
                ours.append(commbench_allreduce_stats(backend, cfg, plan, pattern))
                if not bare_first:
                    bare.append(bare_allreduce_stats(tensor, iters, warmup))
            if rank == 0:
                outbox.put({"nbytes": plan.nbytes, "iters": iters, "warmup": warmup,
                            **{f"{method_name}_{stat}_rounds_us": [r[key] for r in results]
                               for method_name, results in (("bare", bare), ("commbench", ours))
                               for stat, key in STATISTICS.items()}})
    finally:
        backend.close()
    if rank == 0:
        outbox.put(None)


# ---------------------------------------------------------------- report

STATISTICS = {"mean": "time_us", "p50": "p50_us"}  # name in this report: commbench's field


def summarize_size(raw: dict) -> dict:
    """Per statistic: medians over rounds, the paired ratio (median, IQR, every pair's) and the verdict."""
    limit = LARGE_LIMIT if raw["nbytes"] >= LARGE_FROM_NBYTES else SMALL_LIMIT
    row = {**raw, "limit": limit}
    for stat in STATISTICS:
        bare_rounds, ours_rounds = raw[f"bare_{stat}_rounds_us"], raw[f"commbench_{stat}_rounds_us"]
        pairs = method.PairedRatio.of_times(list(zip(bare_rounds, ours_rounds)))
        diffs = [ours - bare for bare, ours in zip(bare_rounds, ours_rounds)]
        row.update({f"bare_{stat}_us": method.median(bare_rounds), f"commbench_{stat}_us": method.median(ours_rounds),
                    f"{stat}_ratio": pairs.median, f"{stat}_ratio_q1": pairs.q1, f"{stat}_ratio_q3": pairs.q3,
                    f"{stat}_pair_ratios": list(pairs.ratios), f"{stat}_diff_us": method.median(diffs),
                    f"{stat}_noise": pairs.spread,
                    f"{stat}_verdict": method.judge_within(pairs, 1 - limit, 1 + limit)})
    return row


HEADERS = ["size", "iters", *(h for stat in STATISTICS for h in (
    f"bare {stat}_us", f"cb {stat}_us", f"{stat} cb/bare [IQR]", f"{stat} verdict")), "target %"]


def table_row(row: dict) -> list[object]:
    cells: list[object] = [format_size(row["nbytes"]), row["iters"]]
    for stat in STATISTICS:
        cells += [row[f"bare_{stat}_us"], row[f"commbench_{stat}_us"],
                  f"{row[f'{stat}_ratio']:.3f} [{row[f'{stat}_ratio_q1']:.3f}-{row[f'{stat}_ratio_q3']:.3f}]",
                  row[f"{stat}_verdict"]]
    return cells + [f"+-{100 * row['limit']:.0f}"]


LOOP_HEADERS = ["size", "iters", *(h for stat in STATISTICS for h in (
    f"bare {stat}_us", f"cb {stat}_us", f"{stat} diff_us", f"{stat} cb/bare", f"{stat} IQR/median %",
    f"{stat} diff % 2-rank"))]


def loop_row(row: dict, two_rank: dict[int, dict]) -> list[object]:
    """A row of section 2; "diff % 2-rank": the difference as a share of section 1's bare time at this size."""
    cells: list[object] = [format_size(row["nbytes"]), row["iters"]]
    for stat in STATISTICS:
        share = row.get(f"{stat}_diff_of_2rank")
        cells += [row[f"bare_{stat}_us"], row[f"commbench_{stat}_us"], f"{row[f'{stat}_diff_us']:+.2f}",
                  method.ratio_text(row[f"{stat}_ratio"]), f"{100 * row[f'{stat}_noise']:.1f}",
                  "n/a" if share is None else f"{100 * share:+.2f}"]
    return cells


def summarize_loop_size(raw: dict, two_rank: dict[int, dict]) -> dict:
    row = summarize_size(raw)
    for stat in STATISTICS:
        del row[f"{stat}_verdict"]  # section 2 reports a cost, not a verdict
        if row["nbytes"] in two_rank:
            row[f"{stat}_diff_of_2rank"] = row[f"{stat}_diff_us"] / two_rank[row["nbytes"]][f"bare_{stat}_us"]
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Target: commbench/bare within 5% at >= 64 KiB and 10% below.")
    parser.add_argument("--sizes", default=method.DEFAULT_SIZES,
                        help="bytes per rank: a list (1K,64K) or a range START-END doubling, as commbench sweep "
                             "[default: %(default)s]")
    parser.add_argument("--rounds", type=int, default=10,
                        help="alternating rounds per method and size, in both sections; even keeps the order "
                             "balanced [default: 10]")
    parser.add_argument("--min-time", type=float, default=method.DEFAULT_MIN_TIME_S, metavar="SECONDS",
                        help="time budget of one round's timed iterations, as commbench --min-time [default: 0.2]")
    parser.add_argument("--iters", type=int, default=None, help="fix N instead of sizing it from --min-time")
    parser.add_argument("--warmup", type=int, default=None, help="fix the warm-up count per round")
    parser.add_argument("--loop-sizes", default="1K,64K,1M",
                        help="sizes of section 2 (1 rank, loop overhead) [default: %(default)s]")
    parser.add_argument("--loop-iters", type=int, default=2000,
                        help="timed calls per round in section 2, fixed; 0 skips section 2 [default: 2000]")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="give up when a rank reports nothing for this long [default: 300]")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results (with every round) here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
        loop_sizes = parse_sizes(args.loop_sizes) if args.loop_iters else []
    except SizeError as exc:
        method.fail(str(exc))
    if min(sizes + loop_sizes) < 4:
        method.fail("sizes must be at least 4 bytes (one float32 element)")
    if args.rounds < 1 or (args.iters is not None and args.iters < 1) or (args.warmup is not None and args.warmup < 0) \
            or args.loop_iters < 0:
        method.fail("--rounds and --iters must be at least 1, --warmup and --loop-iters at least 0")
    print(f"# harness overhead: allreduce float32 sum in-place, {WORLD} ranks, gloo on loopback, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {args.rounds} rounds, times = median over rounds", flush=True)
    print("# mean = mean over calls of each call's max over ranks (commbench time_us); p50 = their median "
          "(commbench p50_us)", flush=True)
    rows, loop_rows = [], []
    try:
        table = method.Table(HEADERS)
        print(table.header(), flush=True)
        for raw in run_local_ranks(_overhead_rank, (sizes, args.rounds, args.min_time, args.iters, args.warmup,
                                                    args.timeout), WORLD, args.timeout):
            rows.append(summarize_size(raw))
            print(table.row(table_row(rows[-1])), flush=True)
        _print_verdicts(rows)
        if loop_sizes:
            two_rank = {row["nbytes"]: row for row in rows}
            print(f"\n# loop overhead: the same two methods in 1 rank (world size 1, gloo), no peer process to wake; "
                  f"{args.loop_iters} calls per round, {args.rounds} rounds; diff = commbench - bare per call; "
                  f"diff % 2-rank = diff / the 2-rank bare time above", flush=True)
            loop_table = method.Table(LOOP_HEADERS)
            print(loop_table.header(), flush=True)
            for raw in run_local_ranks(_overhead_rank, (loop_sizes, args.rounds, args.min_time, args.loop_iters,
                                                        args.warmup, args.timeout), 1, args.timeout):
                loop_rows.append(summarize_loop_size(raw, two_rank))
                print(loop_table.row(loop_row(loop_rows[-1], two_rank)), flush=True)
            _print_loop_summary(loop_rows)
    except RankFailure as exc:
        method.fail(str(exc), code=3)
    if args.json_path:
        _write_json(args, rows, loop_rows)
    return 0


def _print_verdicts(rows: list[dict]) -> None:
    counts = []
    for stat in STATISTICS:
        verdicts = [row[f"{stat}_verdict"] for row in rows]
        counts.append(f"{stat}: " + ", ".join(f"{verdicts.count(v)} {v}" for v in ("pass", "FAIL", "noisy")))
    print(f"# {len(rows)} sizes; {'; '.join(counts)} (target |ratio - 1| <= 5% at >= 64 KiB, 10% below, judged "
          "on the IQR of the pair ratios)")
    if any(row[f"{stat}_verdict"] == "noisy" for row in rows for stat in STATISTICS):
        print("# noisy: the IQR of the pair ratios crosses an edge of the target: this run cannot decide either way "
              "(the 1-rank loop overhead isolates the harness's own cost)")


def _print_loop_summary(rows: list[dict]) -> None:
    parts = []
    for stat in STATISTICS:
        diffs = [row[f"{stat}_diff_us"] for row in rows]
        shares = [abs(row[f"{stat}_diff_of_2rank"]) for row in rows if f"{stat}_diff_of_2rank" in row]
        parts.append(f"{stat} {min(diffs):+.2f} to {max(diffs):+.2f} us (median of the pair differences per size)"
                     + (f" (at most {100 * max(shares):.2f}% of the 2-rank bare {stat})" if shares else ""))
    print(f"# commbench - bare per call over these sizes: {'; '.join(parts)}; negative: commbench measured less")


def _write_json(args: argparse.Namespace, rows: list[dict], loop_rows: list[dict]) -> None:
    method.write_json(args.json_path, "harness_overhead", args, world_size=WORLD, torch=torch.__version__,
                      statistics=STATISTICS, rows=rows,
                      loop_overhead={"world_size": 1, "iters": args.loop_iters, "rows": loop_rows})
    print(f"# wrote {args.json_path}")


if __name__ == "__main__":
    sys.exit(main())
