"""Experiments 3 and 4 of model_terms.py, the two that need two ranks at once: contention and stragglers.

3. contention: a model's backward alone against the same backward while a second thread on the
   same rank allreduces DDP-sized buckets on gloo (BucketLoop), paired; 4. stragglers: two ranks
   timing their own compute-only steps at once, against the 1-rank step times of experiment 1
   resampled to E[max of N] (expected_max_ratio). Both run in the same two local ranks
   (_two_ranks), one message per rank and model; two_rank_experiments prints their tables.
"""
from __future__ import annotations

import math
import statistics
import threading
import time

import method
import numpy as np
from training_steps import BATCHES, grad_bytes, iqr_text, stamp, stats, timed_step, trainer_for

CONTENTION_MODELS = ["resnet50", "vgg16"]
STRAGGLER_MODEL = "resnet18"
STRAGGLER_NS = [2, 4, 8, 64, 1000]
BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb


class BucketLoop:
    """A thread that allreduces 25 MB buckets over a gradient-sized buffer on `group` until both ranks
    have asked it to stop (the stop flag rides in each bucket's last element, so both ranks stop after the
    same call and neither hangs)."""

    def __init__(self, group, buckets: list, world: int):
        self.buckets = buckets  # made once per model and reused, as DDP's are (no allocation in the timed window)
        self.group, self.world, self.stop = group, world, threading.Event()
        self.calls, self.busy_s = 0, 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import torch.distributed as dist

        t0 = time.perf_counter()
        while True:
            for bucket in self.buckets:
                bucket[-1] = 1.0 if self.stop.is_set() else 0.0
                dist.all_reduce(bucket, group=self.group)
                self.calls += 1
                if bucket[-1].item() >= self.world:
                    self.busy_s = time.perf_counter() - t0
                    return

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()

def _two_ranks(rank: int, world: int, port: int, outbox, args: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    comm_group = dist.new_group(backend="gloo")
    try:
        if args["stragglers"]:
            outbox.put(("stragglers", rank, _straggler_steps(args["straggler_steps"]), stamp()))
        for name in args["contention"]:
            _contention(rank, world, name, comm_group, args["pairs"], outbox)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        outbox.put(None)


def _straggler_steps(steps: int) -> list[tuple[float, float]]:
    """This rank's compute-only steps, each after a barrier (as a synchronous step aligns the ranks)."""
    import torch.distributed as dist

    trainer = trainer_for(STRAGGLER_MODEL, BATCHES[STRAGGLER_MODEL])
    for _ in range(3):
        trainer.step()
    dist.barrier()
    times = []
    for _ in range(steps):
        dist.barrier()
        times.append(timed_step(trainer))
    return times


def _contention(rank: int, world: int, name: str, comm_group, pairs: int, outbox) -> None:
    """Model `name`'s backward alone and beside a BucketLoop, in ABBA pairs; one message with every pair."""
    import torch

    trainer = trainer_for(name, BATCHES[name])
    nbytes = grad_bytes(trainer)
    per, count = BUCKET_BYTES // 4, max(1, nbytes // 4)
    buckets = [torch.ones(min(per, count - i) + 1) for i in range(0, count, per)]
    for _ in range(2):
        trainer.step()
    rows = []
    for alone_first in method.abba_orders(pairs):
        row = {}
        for arm in (["alone", "comm"] if alone_first else ["comm", "alone"]):
            row.update(_backward_arm(trainer, arm, comm_group, buckets, world))
        rows.append(row)
    outbox.put(("contention", rank, name, nbytes, rows, stamp()))


def _backward_arm(trainer, arm: str, comm_group, buckets: list, world: int) -> dict:
    """One backward, alone or ("comm") beside the bucket loop: its wall, thread CPU and process CPU."""
    import torch.distributed as dist

    row = {}
    loss = trainer.forward()
    loop = BucketLoop(comm_group, buckets, world) if arm == "comm" else None
    dist.barrier()
    if loop:
        loop.start()
        time.sleep(0.05)  # the loop under way before the backward starts
    w0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    trainer.backward(loss)
    wall, cpu = (time.perf_counter() - w0) * 1e6, (time.thread_time() - c0) * 1e6
    row[f"{arm}_process_cpu_us"] = (time.process_time() - p0) * 1e6  # gloo's threads included
    if loop:
        loop.finish()
        row["comm_calls"] = loop.calls
        row["comm_bytes_per_s"] = loop.calls * BUCKET_BYTES / loop.busy_s if loop.busy_s else math.nan
    trainer.optimizer.zero_grad(set_to_none=True)
    row[f"{arm}_wall_us"], row[f"{arm}_cpu_us"] = wall, cpu
    dist.barrier()
    return row


def expected_max_ratio(samples: list[float], n: int) -> float:
    """E[max of n iid draws from the empirical distribution] / median - 1, exactly:
    E = sum_k x_(k) ((k/m)^n - ((k-1)/m)^n) over the sorted sample x_(1..m)."""
    x = np.sort(np.asarray(samples, dtype=float))
    m = len(x)
    k = np.arange(1, m + 1)
    weights = (k / m) ** n - ((k - 1) / m) ** n
    return float((x * weights).sum() / np.median(x) - 1)


def two_rank_experiments(args, floor: dict | None) -> tuple[dict, dict]:
    from local_ranks import run_local_ranks

    want_stragglers = "stragglers" in args.experiments
    contention_models = [m for m in CONTENTION_MODELS if m in args.models] if "contention" in args.experiments else []
    spec = {"stragglers": want_stragglers, "straggler_steps": args.straggler_steps, "contention": contention_models,
            "pairs": args.contention_pairs}
    start = stamp()
    messages = list(run_local_ranks(_two_ranks, (spec,), world=2, timeout_s=540))
    contention, stragglers = {}, {}
    if contention_models:
        contention = _contention_report([m for m in messages if m[0] == "contention"], start)
    if want_stragglers:
        stragglers = _stragglers_report([m for m in messages if m[0] == "stragglers"], floor, start)
    return contention, stragglers


def _contention_report(messages: list[tuple], start: dict) -> dict:
    print("\n## 3. Backward slowed by a concurrent gloo allreduce loop (2 ranks, 1 thread each)\n")
    table = method.Table(["model", "rank", "pairs", "alone wall ms", "comm wall ms", "wall ratio",
                          "alone CPU ms", "comm CPU ms", "CPU ratio", "comm MB/s", "gloo CPU ms", "load"],
                         min_width=6)
    print(table.header())
    contention: dict = {}
    for _, rank, name, nbytes, rows, end in messages:
        res = _contention_result(nbytes, rows, end)
        contention.setdefault(name, {})[str(rank)] = res
        print(table.row([name, rank, len(rows), iqr_text(res["alone_wall"], 1e-3), iqr_text(res["comm_wall"], 1e-3),
                         res["wall_ratio"].text(), iqr_text(res["alone_cpu"], 1e-3), iqr_text(res["comm_cpu"], 1e-3),
                         res["cpu_ratio"].text(), f"{res['comm_mb_per_s']:.0f}",
                         iqr_text(res["other_threads_cpu_during_backward_us"], 1e-3),
                         f"{start['loadavg']} -> {end['loadavg']}"]))
    return contention


def _contention_result(nbytes: int, rows: list[dict], end: dict) -> dict:
    """One rank's pairs of one model: the paired ratios comm/alone and the statistics of each arm."""
    wall = method.PairedRatio.of_times([(r["alone_wall_us"], r["comm_wall_us"]) for r in rows])
    cpu = method.PairedRatio.of_times([(r["alone_cpu_us"], r["comm_cpu_us"]) for r in rows])
    return {"grad_bytes": nbytes, "rows": rows, "wall_ratio": wall, "cpu_ratio": cpu, "end": end,
            "alone_wall": stats([r["alone_wall_us"] for r in rows]),
            "comm_wall": stats([r["comm_wall_us"] for r in rows]),
            "alone_cpu": stats([r["alone_cpu_us"] for r in rows]),
            "comm_cpu": stats([r["comm_cpu_us"] for r in rows]),
            "comm_mb_per_s": method.median([r["comm_bytes_per_s"] / 1e6 for r in rows]),
            "other_threads_cpu_during_backward_us": stats([r["comm_process_cpu_us"] - r["comm_cpu_us"]
                                                           for r in rows]),
            "other_threads_cpu_alone_us": stats([r["alone_process_cpu_us"] - r["alone_cpu_us"]
                                                 for r in rows])}


def _stragglers_report(messages: list[tuple], floor: dict | None, start: dict) -> dict:
    print(f"\n## 4. Stragglers: E[max over N ranks] / median - 1 ({STRAGGLER_MODEL} batch "
          f"{BATCHES[STRAGGLER_MODEL]} step wall times)\n")
    per_rank = {rank: [w for w, _ in times] for _, rank, times, _ in messages}
    ranks = [per_rank[r] for r in sorted(per_rank)]
    steps = min(len(r) for r in ranks)
    pooled = [t for r in ranks for t in r[:steps]]
    pooled_median = statistics.median(pooled)
    stragglers = {"two_ranks": _measured_stragglers(ranks, steps, pooled, start)}
    table = method.Table(["source", "steps", "median ms", "p90 ms", "CV %"] + [f"N={n} %" for n in STRAGGLER_NS],
                         min_width=6)
    print(table.header())
    if floor and STRAGGLER_MODEL in floor:
        one = floor[STRAGGLER_MODEL]["step_wall_us"]
        s = stats(one)
        stragglers["one_rank"] = {"stats": s, "emax_over_median_minus_1": {
            str(n): expected_max_ratio(one, n) for n in STRAGGLER_NS}}
        print(table.row(["1 rank (exp. 1), resampled", s["n"], s["median"] / 1e3, s["p90"] / 1e3, s["cv"] * 100]
                        + [100 * expected_max_ratio(one, n) for n in STRAGGLER_NS]))
    s = stats(pooled)
    print(table.row(["2 ranks pooled, resampled", s["n"], s["median"] / 1e3, s["p90"] / 1e3, s["cv"] * 100]
                    + [100 * expected_max_ratio(pooled, n) for n in STRAGGLER_NS]))
    print(table.row(["2 ranks measured max", steps, pooled_median / 1e3, "", ""]
                    + [100 * stragglers["two_ranks"]["measured_emax_over_median_minus_1"]]
                    + [""] * (len(STRAGGLER_NS) - 1)))
    print(table.row(["2 ranks measured max / step mean", steps, "", "", ""]
                    + [100 * stragglers["two_ranks"]["measured_emax_over_step_mean_minus_1"]]
                    + [""] * (len(STRAGGLER_NS) - 1)))
    return stragglers


def _measured_stragglers(ranks: list[list[float]], steps: int, pooled: list[float], start: dict) -> dict:
    """The two ranks' slowest step against the pooled median, and against that step's own mean over ranks."""
    pooled_median = statistics.median(pooled)
    measured = [max(r[i] for r in ranks) / pooled_median - 1 for i in range(steps)]
    # the same per step against that step's own mean over ranks: the imbalance between ranks, not the
    # machine's drift from step to step (which a synchronous step pays once, not per rank)
    within = [max(r[i] for r in ranks) / statistics.mean(r[i] for r in ranks) - 1 for i in range(steps)]
    return {"per_rank_wall_us": ranks, "pooled": stats(pooled),
            "measured_emax_over_median_minus_1": float(np.mean(measured)),
            "per_step_max_over_median_minus_1": stats(measured),
            "measured_emax_over_step_mean_minus_1": float(np.mean(within)),
            "resampled_from_two_rank_pool_n2": expected_max_ratio(pooled, 2),
            "per_rank": {str(i): stats(r) for i, r in enumerate(ranks)}, "start": start}
