"""The terms of a DDP step that the cost model does not count, each measured by its own experiment.

The model (analysis/scaling.py predict_step, proxies/timeline.py) predicts a step as forward,
backward, each bucket's allreduce launched when its last gradient is ready, optimizer after,
from measured compute (Trainer.phase_times_us: thread CPU time, no DDP) and the fitted
collective model. Against real `commbench train` on gloo at 2 CPU ranks it is 6-22% optimistic.
The candidates, one experiment each (CPU, one intra-op thread per rank):

1. floor: at 1 rank, no DDP, a full step's wall time vs the sum of its phases' thread CPU
   times (what the model counts), steps and phased steps interleaved; also thread CPU vs wall.
2. ddp: at 1 rank (gloo, world size 1, FileStore), the same step without DDP, with DDP, with
   DDP gradient_as_bucket_view=True, and with that plus zero_grad(set_to_none=False) (the
   only way both of DDP's gradient copies go), arms interleaved forward/reverse; DDP's own
   cost per step beside passes x gradient bytes / this host's copy bandwidth.
3. contention: at 2 ranks, a model's backward alone vs while a second thread on the same rank
   runs gloo allreduces of DDP-sized buckets (25 MB) over a gradient-sized buffer; paired;
   the backward's wall and thread CPU time, and the CPU time of the rank's other threads
   (gloo's) over the same window (process CPU minus thread CPU).
4. stragglers: the 1-rank step times of (1) resampled: E[max of N iid draws] / median - 1
   (exact over the empirical distribution), vs 2 ranks timing their own compute-only steps
   at once (a barrier before each step, as a synchronous step aligns them).
5. link: `commbench sweep --emulate 2x1 --link 1gbit` then `commbench fit`, the fitted inter
   bandwidth vs the nominal 0.125 GB/s (needs root); sendrecv (out of place: it has no
   in-place points) is not accepted by fit, so its largest size's busbw is reported.

    python benchmarks/model_terms.py --out runs/terms
    python benchmarks/model_terms.py --out runs/terms --quick --experiments floor,ddp

Prints Markdown tables; writes DIR/model_terms.json (model_terms-EXP-EXP.json for a subset of the
experiments) through method.write_json. Experiments 3 and 4 (two ranks) are in terms_two_ranks.py; the
trainers and step clocks this shares with training_phases.py in training_steps.py.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import method
import numpy as np
from terms_two_ranks import STRAGGLER_MODEL, two_rank_experiments
from training_steps import BATCHES, grad_bytes, iqr_text, phased_step, stamp, stats, timed_step, trainer_for

EXPERIMENTS = ["floor", "ddp", "contention", "stragglers", "link"]


def arm_orders(arms: list[str], pairs: int) -> list[list[str]]:
    """ABBA for any number of arms: forward, reverse, forward, ... (each arm first and last alike)."""
    return [list(arms) if i % 2 == 0 else list(reversed(arms)) for i in range(pairs)]


# ---------------------------------------------------------------- 1. the floor outside the phases


def floor_experiment(models: list[str], pairs: int, straggler_pairs: int) -> dict:
    print("\n## 1. Per-step floor outside the phases (1 rank, no DDP, 1 thread)\n")
    table = method.Table(["model", "batch", "pairs", "step wall ms", "step CPU ms", "phases CPU ms",
                          "floor ms", "floor %", "CPU/wall", "phase_times_us ms", "load"], min_width=6)
    print(table.header())
    out = {}
    for name in models:
        trainer = trainer_for(name, BATCHES[name])
        for _ in range(2):
            trainer.step()
        before = trainer.phase_times_us(repeats=3)
        n = straggler_pairs if name == STRAGGLER_MODEL else pairs
        steps, phased = [], []
        start = stamp()
        for step_first in method.abba_orders(n):
            if step_first:
                steps.append(timed_step(trainer))
                phased.append(phased_step(trainer))
            else:
                phased.append(phased_step(trainer))
                steps.append(timed_step(trainer))
        after = trainer.phase_times_us(repeats=3)
        walls = [w for w, _ in steps]
        floors = [w - p["sum_cpu_us"] for (w, _), p in zip(steps, phased)]
        shares = [f / w for f, w in zip(floors, walls)]
        ratio = method.PairedRatio.of_times([(p["sum_cpu_us"], w) for (w, _), p in zip(steps, phased)])
        res = {"batch": BATCHES[name], "pairs": n, "start": start, "end": stamp(),
               "step_wall_us": walls, "step_cpu_us": [c for _, c in steps], "phased": phased,
               "step_wall": stats(walls), "step_cpu": stats([c for _, c in steps]),
               "phases_cpu": stats([p["sum_cpu_us"] for p in phased]),
               "phases_wall": stats([p["sum_wall_us"] for p in phased]),
               "floor_us": stats(floors), "floor_share": stats(shares), "wall_over_phases_cpu": ratio,
               "cpu_over_wall": stats([c / w for w, c in steps]),
               "phase_times_us_before": before, "phase_times_us_after": after}
        out[name] = res
        print(table.row([name, BATCHES[name], n, iqr_text(res["step_wall"], 1e-3), iqr_text(res["step_cpu"], 1e-3),
                         iqr_text(res["phases_cpu"], 1e-3), iqr_text(res["floor_us"], 1e-3, 2),
                         iqr_text(res["floor_share"], 100, 2), f"{res['cpu_over_wall']['median']:.3f}",
                         f"{sum(before) / 1e3:.1f}/{sum(after) / 1e3:.1f}", start["loadavg"]]))
        del trainer
    return out


# ---------------------------------------------------------------- 2. DDP's own work at 1 rank


def copy_bandwidth(nbytes: int, repeats: int) -> dict:
    """This host's copy bandwidth for a buffer of `nbytes` (bytes of the buffer per second, GB/s), one thread:
    torch copy_, torch mul(out=) (what DDP's hook does: copy and divide), numpy copyto; best and median."""
    import torch

    count = nbytes // 4
    src, dst = torch.rand(count), torch.empty(count)
    src_np, dst_np = src.numpy(), dst.numpy()
    kinds = {"torch_copy": lambda: dst.copy_(src), "torch_mul_out": lambda: torch.mul(src, 0.5, out=dst),
             "numpy_copyto": lambda: np.copyto(dst_np, src_np)}
    out = {}
    for kind, fn in kinds.items():
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[kind] = {"best_gbps": nbytes / min(times) / 1e9, "median_gbps": nbytes / statistics.median(times) / 1e9,
                     "times_s": times}
    return out


class Arm:
    """A trainer (its own model, same seed), optionally in DDP, and how it zeroes gradients."""

    def __init__(self, name: str, batch: int, ddp: bool, bucket_view: bool = False, set_to_none: bool = True):
        import torch

        self.trainer = trainer_for(name, batch)
        self.set_to_none = set_to_none
        if ddp:
            self.trainer.wrapped = torch.nn.parallel.DistributedDataParallel(
                self.trainer.model, gradient_as_bucket_view=bucket_view)

    def step(self) -> tuple[float, float, float]:
        """(wall, this thread's CPU, the process's CPU: all threads, gloo's included) microseconds."""
        t = self.trainer
        w0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        t.backward(t.forward())
        t.optimizer.step()
        t.optimizer.zero_grad(set_to_none=self.set_to_none)
        return ((time.perf_counter() - w0) * 1e6, (time.thread_time() - c0) * 1e6,
                (time.process_time() - p0) * 1e6)


DDP_ARMS = {"plain": {"ddp": False}, "ddp": {"ddp": True},
            "ddp_view": {"ddp": True, "bucket_view": True},
            "ddp_view_keep": {"ddp": True, "bucket_view": True, "set_to_none": False}}


def ddp_experiment(models: list[str], pairs: int, copy_repeats: int) -> dict:
    import torch.distributed as dist

    print("\n## 2. DDP's own work per step (1 rank, gloo world size 1, 1 thread)\n")
    store_dir = tempfile.mkdtemp(prefix="cb-terms-")
    store = dist.FileStore(os.path.join(store_dir, "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    table = method.Table(["model", "grad MB", "arm", "step wall ms", "vs plain ms", "vs plain %", "CPU vs plain ms",
                          "proc CPU vs plain ms", "copy 1/2/3 pass ms", "load"], min_width=6)
    print(table.header())
    out = {}
    try:
        for name in models:
            out[name] = _ddp_model(name, pairs, copy_repeats, table)
    finally:
        dist.destroy_process_group()
    return out


def _ddp_model(name: str, pairs: int, copy_repeats: int, table: method.Table) -> dict:
    """Every arm of DDP_ARMS on model `name`, interleaved; each against the plain arm, beside the copy cost."""
    arms = {key: Arm(name, BATCHES[name], **spec) for key, spec in DDP_ARMS.items()}
    for arm in arms.values():
        for _ in range(3):
            arm.step()
    nbytes = grad_bytes(arms["plain"].trainer)
    copy = copy_bandwidth(nbytes, copy_repeats)
    start = stamp()
    times: dict[str, list[tuple[float, float, float]]] = {key: [] for key in arms}
    for order in arm_orders(list(arms), pairs):
        for key in order:
            times[key].append(arms[key].step())
    copy_after = copy_bandwidth(nbytes, copy_repeats)
    bw = statistics.median([copy[k]["median_gbps"] for k in ("torch_copy", "torch_mul_out")]
                           + [copy_after[k]["median_gbps"] for k in ("torch_copy", "torch_mul_out")])
    predicted = {p: p * nbytes / (bw * 1e9) * 1e6 for p in (1, 2, 3)}
    res = {"batch": BATCHES[name], "grad_bytes": nbytes, "pairs": pairs, "start": start, "end": stamp(),
           "copy_before": copy, "copy_after": copy_after, "copy_gbps_used": bw,
           "predicted_copy_us": predicted, "arms": {}}
    for key, ts in times.items():
        a = res["arms"][key] = _against_plain(ts, times["plain"])
        print(table.row([name, f"{nbytes / 1e6:.1f}", key, iqr_text(a["wall"], 1e-3),
                         iqr_text(a["minus_plain_wall_us"], 1e-3, 2), iqr_text(a["share_of_plain"], 100, 2),
                         iqr_text(a["minus_plain_cpu_us"], 1e-3, 2),
                         iqr_text(a["minus_plain_process_cpu_us"], 1e-3, 2),
                         "/".join(f"{predicted[p] / 1e3:.1f}" for p in (1, 2, 3)), start["loadavg"]]))
    print(f"  copy bandwidth {name} ({nbytes / 1e6:.0f} MB, GB/s best/median): " + ", ".join(
        f"{k} {copy[k]['best_gbps']:.2f}/{copy[k]['median_gbps']:.2f}" for k in copy))
    for arm in arms.values():
        arm.trainer.wrapped = None
    return res


def _against_plain(ts: list[tuple[float, float, float]], plain: list[tuple[float, float, float]]) -> dict:
    """One arm's (wall, thread CPU, process CPU) steps, and each minus the plain arm's step of the same round."""
    diffs = [t[0] - p[0] for t, p in zip(ts, plain)]
    cdiffs = [t[1] - p[1] for t, p in zip(ts, plain)]
    pdiffs = [t[2] - p[2] for t, p in zip(ts, plain)]
    shares = [d / p[0] for d, p in zip(diffs, plain)]
    return {"wall_us": [t[0] for t in ts], "cpu_us": [t[1] for t in ts],
            "process_cpu_us": [t[2] for t in ts],
            "wall": stats([t[0] for t in ts]), "cpu": stats([t[1] for t in ts]),
            "process_cpu": stats([t[2] for t in ts]),
            "minus_plain_wall_us": stats(diffs), "minus_plain_cpu_us": stats(cdiffs),
            "minus_plain_process_cpu_us": stats(pdiffs),
            "share_of_plain": stats(shares),
            "ratio_to_plain": method.PairedRatio.of_times([(p[0], t[0]) for p, t in zip(plain, ts)])}


# ---------------------------------------------------------------- 5. link bandwidth, emulated


def emulated_namespaces() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith("cbemu-")]


def link_experiment(out_dir: str, collectives: list[str]) -> dict:
    import json

    print("\n## 5. Link bandwidth on the emulated cluster (2x1, --link 1gbit, nominal 0.125 GB/s)\n")
    if os.geteuid() != 0:
        print("skipped: needs root")
        return {"skipped": "not root"}
    res = {"namespaces_before": emulated_namespaces()}
    if res["namespaces_before"]:
        subprocess.run([sys.executable, "-m", "commbench", "emulate", "clean"], check=False)
    table = method.Table(["collective", "inter bw GB/s", "of nominal", "inter lat us", "fit", "load"], min_width=8)
    print(table.header())
    for coll in collectives:
        jsonl, hw = os.path.join(out_dir, f"emu-{coll}.jsonl"), os.path.join(out_dir, f"emu-{coll}-hw.json")
        start = stamp()
        placement = "out-of-place" if coll == "sendrecv" else "in-place"  # sendrecv has no in-place points
        sweep = subprocess.run([sys.executable, "-m", "commbench", "sweep", "--emulate", "2x1", "--link", "1gbit",
                                "--backend", "torch", "-c", coll, "--sizes", "1M-64M", "--placement", placement,
                                "--json", jsonl, "--force"], capture_output=True, text=True, timeout=540)
        fit = subprocess.run([sys.executable, "-m", "commbench", "fit", jsonl, "-o", hw, "--force"],
                             capture_output=True,
                             text=True, timeout=120) if sweep.returncode == 0 else None
        entry = {"start": start, "end": stamp(), "sweep_rc": sweep.returncode, "sweep_stdout": sweep.stdout[-4000:],
                 "sweep_stderr": sweep.stderr[-2000:], "fit_rc": fit.returncode if fit else None,
                 "fit_stdout": fit.stdout[-3000:] if fit else "", "fit_stderr": fit.stderr[-2000:] if fit else ""}
        entry["points"] = _sweep_points(jsonl)
        if fit and fit.returncode == 0:
            with open(hw, encoding="utf-8") as handle:
                entry["hardware"] = json.load(handle)
            inter = _level(entry["hardware"], "inter")
            entry["inter"] = inter
            bw = inter.get("bw_gbps", math.nan) if inter else math.nan
            lat = inter.get("latency_us", inter.get("alpha_us", math.nan)) if inter else math.nan
            print(table.row([coll, bw, f"{bw / 0.125:.1%}", lat, "ok", f"{start['loadavg']}"]))
        else:
            top = max(entry["points"], key=lambda r: r["nbytes"]) if entry["points"] else None
            bw = top["busbw_gbps"] if top else math.nan  # no fit (fit takes no sendrecv): the largest size's busbw
            print(table.row([coll, bw, f"{bw / 0.125:.1%}" if top else "", "",
                             f"no fit (sweep rc {sweep.returncode}, fit rc {entry['fit_rc']}): largest size's busbw",
                             start["loadavg"]]))
        res[coll] = entry
    res["namespaces_after"] = emulated_namespaces()
    if res["namespaces_after"]:
        subprocess.run([sys.executable, "-m", "commbench", "emulate", "clean"], check=False)
    print(f"\ncbemu namespaces before: {res['namespaces_before'] or 'none'}; "
          f"after: {res['namespaces_after'] or 'none'}")
    return res


def _sweep_points(path: str) -> list[dict]:
    """(nbytes, time_us, algbw, busbw) of each measured point of a sweep's JSON Lines."""
    import json

    points = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                r = json.loads(line)
                if r.get("record") == "result" and r.get("time_us"):
                    points.append({k: r.get(k) for k in ("nbytes", "time_us", "algbw_gbps", "busbw_gbps")})
    return points


def _level(hardware: dict, name: str) -> dict | None:
    """The fitted level called `name` wherever the hardware JSON keeps it (a dict by level, or a list)."""
    levels = hardware.get("levels", hardware)
    if isinstance(levels, dict) and isinstance(levels.get(name), dict):
        return levels[name]
    if isinstance(levels, list):
        for level in levels:
            if isinstance(level, dict) and level.get("name") == name:
                return level
    return None


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    """The options, checked, with each experiment's pairs and repeats settled (fewer with --quick)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for model_terms.json and the emulated sweeps")
    parser.add_argument("--models", default=",".join(BATCHES), help=f"subset of {','.join(BATCHES)}")
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS), help=f"subset of {','.join(EXPERIMENTS)}")
    parser.add_argument("--quick", action="store_true", help="fewer pairs (a check that it runs, not a measurement)")
    parser.add_argument("--link-collectives", default="allreduce,sendrecv")
    parser.add_argument("--straggler-steps", type=int, default=None, help="steps per rank and 1-rank steps for (4); "
                        "default 30 (8 with --quick)")
    args = parser.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.experiments = [e for e in args.experiments.split(",") if e]
    for m in args.models:
        if m not in BATCHES:
            method.fail(f"unknown model {m!r}; known: {', '.join(BATCHES)}")
    for e in args.experiments:
        if e not in EXPERIMENTS:
            method.fail(f"unknown experiment {e!r}; known: {', '.join(EXPERIMENTS)}")
    args.floor_pairs = 3 if args.quick else 10
    args.ddp_pairs, args.copy_repeats = (2, 3) if args.quick else (12, 7)
    args.contention_pairs = 2 if args.quick else 6
    if args.straggler_steps is None:
        args.straggler_steps = 8 if args.quick else 30
    args.straggler_pairs = args.straggler_steps
    return args


def main() -> int:
    args = parse_args()

    import torch

    torch.set_num_threads(1)
    print(f"# model_terms: {' '.join(sys.argv)}\n\nstart {stamp()}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, cores {os.cpu_count()}")
    results: dict = {"start": stamp(), "batches": BATCHES}
    floor = None
    if "floor" in args.experiments or "stragglers" in args.experiments:
        models = args.models if "floor" in args.experiments else [STRAGGLER_MODEL]
        floor = results["floor"] = floor_experiment(models, args.floor_pairs, args.straggler_pairs)
    if "ddp" in args.experiments:
        results["ddp"] = ddp_experiment(args.models, args.ddp_pairs, args.copy_repeats)
    if "contention" in args.experiments or "stragglers" in args.experiments:
        results["contention"], results["stragglers"] = two_rank_experiments(args, floor)
    if "link" in args.experiments:
        results["link"] = link_experiment(args.out, [c for c in args.link_collectives.split(",") if c])
    results["end"] = stamp()
    name = "model_terms" if args.experiments == EXPERIMENTS else "model_terms-" + "-".join(args.experiments)
    path = os.path.join(args.out, name + ".json")
    method.write_json(path, "model_terms", args, **results)
    print(f"\nwrote {path}; end {results['end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
