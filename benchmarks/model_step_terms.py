"""The step terms of issue 35 measured on this host's CPU ranks, each by its own small experiment.

1. interference: compute (a fixed GEMM loop, one thread) alone against the same compute while a thread
   of the same rank allreduces 25 MB buckets on gloo (terms_two_ranks.BucketLoop), 2 ranks at once,
   paired A B B A; the ratio with / alone per pair, its median and IQR. The cost model's term is
   `overlap_slowdown` = ratio - 1: the compute's pace is 1 / (1 + s) while a call runs.
2. jitter: 2 ranks time the same compute-only step after a barrier each (as a synchronous step aligns
   them), STEPS times; each rank's CV, and the measured mean of the two ranks' slower step against the
   expected slowest of 2 drawn from the pooled spread (E[max] over the empirical distribution).
3. per-bucket: 1 rank in DDP (gloo, world size 1: no traffic leaves it) over a model of 64 linear layers,
   bucket caps giving 1 to ~64 buckets, each DDP step against the same model's step under no_sync(),
   interleaved; the extra time per step against the number of buckets, least squares: the slope is the
   framework's cost per bucket (hook, launch, wait), the intercept what does not grow with buckets.

    python benchmarks/model_step_terms.py --out runs/terms35
    python benchmarks/model_step_terms.py --out runs/terms35 --experiments jitter --steps 40

Prints Markdown tables; writes DIR/model_step_terms.json (method.write_json), every figure with the
time and the load average it ran under (the machine is shared: timings are noisy, so each figure comes
with its spread).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import method
import numpy as np
from local_ranks import run_local_ranks
from terms_two_ranks import BucketLoop, expected_max_ratio
from training_steps import stamp, stats

EXPERIMENTS = ["interference", "jitter", "buckets"]
GEMM_N = 192  # one GEMM of 192 x 192: ~14 MFLOP, a few ms for a loop of them on one core
BUCKET_BYTES = 25 * 2**20
CAPS_MB = [64.0, 1.0, 0.25, 0.0625]  # 4.2 MB of parameters: 1, ~5, ~17, ~64 buckets


def gemm_work(repeats: int):
    """A compute step of fixed work: `repeats` GEMMs on one thread; returns the callable."""
    import torch

    a, b = torch.randn(GEMM_N, GEMM_N), torch.randn(GEMM_N, GEMM_N)

    def run() -> None:
        for _ in range(repeats):
            torch.mm(a, b)
    return run


def _ranks(rank: int, world: int, port: int, outbox, args: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.new_group(backend="gloo")
    try:
        work = gemm_work(args["repeats"])
        for _ in range(3):
            work()
        if "jitter" in args["experiments"]:
            outbox.put(("jitter", rank, _jitter_steps(work, args["steps"]), stamp()))
        if "interference" in args["experiments"]:
            outbox.put(("interference", rank, _interference_pairs(work, group, world, args["pairs"]), stamp()))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        outbox.put(None)


def _jitter_steps(work, steps: int) -> list[float]:
    import torch.distributed as dist

    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        work()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def _interference_pairs(work, group, world: int, pairs: int) -> list[dict]:
    """Per pair: the compute's wall time alone and beside a BucketLoop, and the loop's bytes per second."""
    import torch
    import torch.distributed as dist

    buckets = [torch.ones(BUCKET_BYTES // 4 + 1) for _ in range(2)]
    rows = []
    for alone_first in method.abba_orders(pairs):
        row = {}
        for arm in (["alone", "comm"] if alone_first else ["comm", "alone"]):
            loop = BucketLoop(group, buckets, world) if arm == "comm" else None
            dist.barrier()
            if loop:
                loop.start()
                time.sleep(0.05)  # the loop under way before the compute starts
            t0, c0 = time.perf_counter(), time.thread_time()
            work()
            row[f"{arm}_wall_us"] = (time.perf_counter() - t0) * 1e6
            row[f"{arm}_cpu_us"] = (time.thread_time() - c0) * 1e6
            if loop:
                loop.finish()
                row["comm_bytes_per_s"] = loop.calls * BUCKET_BYTES / loop.busy_s if loop.busy_s else float("nan")
            dist.barrier()
        rows.append(row)
    return rows


def two_rank_report(messages: list[tuple]) -> dict:
    out = {}
    jitter = {m[1]: m[2] for m in messages if m[0] == "jitter"}
    if jitter:
        out["jitter"] = _jitter_report(jitter, [m[3] for m in messages if m[0] == "jitter"])
    pairs = {m[1]: m[2] for m in messages if m[0] == "interference"}
    if pairs:
        out["interference"] = _interference_report(pairs, [m[3] for m in messages if m[0] == "interference"])
    return out


def _jitter_report(ranks: dict[int, list[float]], stamps: list[dict]) -> dict:
    per_rank = {rank: stats(times) for rank, times in sorted(ranks.items())}
    pooled = [t for times in ranks.values() for t in times]
    slowest = [max(step) for step in zip(*ranks.values())]
    measured = float(np.mean(slowest) / np.median(pooled) - 1)
    expected = expected_max_ratio(pooled, len(ranks))
    table = method.Table(["rank", "steps", "median (ms)", "CV"])
    print("\n## jitter: compute-only steps after a barrier\n\n" + table.header())
    for rank, s in per_rank.items():
        print(table.row([rank, s["n"], f"{s['median'] / 1e3:.2f}", f"{100 * s['cv']:.2f}%"]))
    print(f"\npooled CV {100 * stats(pooled)['cv']:.2f}%; slower of the 2 ranks per step over the pooled median: "
          f"measured {100 * measured:+.2f}%, expected from the pooled spread {100 * expected:+.2f}%")
    return {"per_rank": per_rank, "pooled": stats(pooled), "measured_max_of_2": measured,
            "expected_max_of_2": expected, "stamps": stamps,
            "expected_max": {n: expected_max_ratio(pooled, n) for n in (2, 8, 64, 512)}}


def _interference_report(ranks: dict[int, list[dict]], stamps: list[dict]) -> dict:
    table = method.Table(["rank", "pairs", "alone (ms)", "with allreduce (ms)", "ratio [IQR]", "thread CPU ratio",
                          "gloo GB/s"])
    print("\n## interference: compute alone vs beside a gloo allreduce loop (ABBA pairs)\n\n" + table.header())
    out = {}
    for rank, rows in sorted(ranks.items()):
        wall = method.PairedRatio.of_times([(r["alone_wall_us"], r["comm_wall_us"]) for r in rows])
        cpu = method.PairedRatio.of_times([(r["alone_cpu_us"], r["comm_cpu_us"]) for r in rows])
        alone, comm = (float(np.median([r[f"{k}_wall_us"] for r in rows])) for k in ("alone", "comm"))
        rate = float(np.median([r["comm_bytes_per_s"] for r in rows])) / 1e9
        print(table.row([rank, len(rows), f"{alone / 1e3:.1f}", f"{comm / 1e3:.1f}", wall.text(), cpu.text(),
                         f"{rate:.2f}"]))
        out[rank] = {"wall": wall, "thread_cpu": cpu, "alone_us": alone, "comm_us": comm, "gloo_gbps": rate,
                     "rows": rows}
    ratios = [r for rank in out.values() for r in rank["wall"].ratios]
    out["overlap_slowdown"] = {"median": float(np.median(ratios)) - 1, "q1": float(np.percentile(ratios, 25)) - 1,
                               "q3": float(np.percentile(ratios, 75)) - 1, "pairs": len(ratios)}
    print(f"\noverlap_slowdown (ratio - 1, both ranks' pairs): {out['overlap_slowdown']['median']:.3f} "
          f"[{out['overlap_slowdown']['q1']:.3f}-{out['overlap_slowdown']['q3']:.3f}]")
    out["stamps"] = stamps
    return out


def main() -> int:
    args = parse_args()
    experiments = [e for e in args.experiments.split(",") if e]
    if set(experiments) - set(EXPERIMENTS):
        method.fail(f"--experiments: choose from {', '.join(EXPERIMENTS)}")
    results, start = {}, stamp()
    two = [e for e in experiments if e in ("interference", "jitter")]
    if two:
        options = {"experiments": two, "steps": args.steps, "pairs": args.pairs, "repeats": args.repeats}
        results.update(two_rank_report(list(run_local_ranks(_ranks, (options,), timeout_s=args.timeout_s))))
    if "buckets" in experiments:
        from model_step_buckets import bucket_experiment

        results["buckets"] = bucket_experiment(CAPS_MB, args.rounds, args.bucket_steps)
    path = os.path.join(args.out, "model_step_terms.json")
    method.write_json(path, "model_step_terms", args, start=start, end=stamp(), cpus=os.cpu_count(), **results)
    print(f"\nwrote {path}")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for model_step_terms.json")
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
    parser.add_argument("--pairs", type=int, default=8, help="interference: ABBA pairs per rank")
    parser.add_argument("--steps", type=int, default=60, help="jitter: steps per rank")
    parser.add_argument("--repeats", type=int, default=400, help="GEMMs per compute step")
    parser.add_argument("--rounds", type=int, default=6, help="buckets: interleaved rounds")
    parser.add_argument("--bucket-steps", type=int, default=5, help="buckets: steps per arm and round")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(main())
