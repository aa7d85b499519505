"""Where real DDP training at 2 CPU ranks spends the time its replay does not (issue 15, item 1).

`commbench check` predicts a replay's step within a few percent, and a real training step of the
same setup 2-18% too fast (docs/model.md, Accuracy): the gap is between the replay and training
themselves. The replay's compute is the model's phases timed without DDP, both ranks at once
(Trainer.phase_times_us: thread CPU time). Here the same two ranks alternate, in pairs of
alternating order (A B, B A, ...), a step timed phase by phase under DDP's no_sync() (the model in
DDP, no bucket copies, no allreduce: what the replay is given) with a real DDP step (the hooks copy
each gradient into its bucket and launch its allreduce; the backward ends when every allreduce is
done; the optimizer follows). Each phase on the wall clock and as the main thread's CPU time, and
the CPU of the rank's other threads (gloo's) over the step. A barrier before each step aligns the
ranks, as a synchronous step does. (Under no_sync DDP still broadcasts the models' buffers in the
forward, BatchNorm's running statistics: the resnets' no_sync forward holds that small call.)

    python benchmarks/training_phases.py --out runs/phases [--models vgg16,alexnet] [--pairs 6]
    python benchmarks/training_phases.py --out runs/phases --denormals --models vgg16 [--steps 8]

Prints a Markdown table per rank and model; writes DIR/training_phases.json (method.write_json).
--denormals checks one candidate instead, at 1 rank: the share of subnormal floats in each step's
gradients (x86 takes slow microcode assists on them unless flush-to-zero is on, and PyTorch leaves
it off; the replay reduces zeros), and `a += b` over the gradients against over zeros, CPU time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import method
from training_steps import BATCHES, phased_step, stamp, stats, trainer_for

PHASES = ("forward", "backward", "optimizer")


def _step(trainer, real: bool) -> dict:
    """One phase-timed step after a barrier: real DDP, or under no_sync(); with the other threads' CPU."""
    import torch.distributed as dist

    dist.barrier()
    p0, t0 = time.process_time(), time.thread_time()
    if real:
        row = phased_step(trainer)
    else:
        with trainer.wrapped.no_sync():
            row = phased_step(trainer)
    row["other_threads_cpu_us"] = ((time.process_time() - p0) - (time.thread_time() - t0)) * 1e6
    return row


def _ranks(rank: int, world: int, port: int, outbox, spec: dict) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for name in spec["models"]:
            trainer = trainer_for(name, BATCHES[name])
            trainer.wrap(None, None)
            for _ in range(spec["warmup"]):
                _step(trainer, True)
                _step(trainer, False)
            rows = {"nosync": [], "ddp": []}
            for real_first in method.abba_orders(spec["pairs"]):
                for real in ((True, False) if real_first else (False, True)):
                    rows["ddp" if real else "nosync"].append(_step(trainer, real))
            outbox.put((rank, name, rows, stamp()))
            trainer.wrapped = trainer.model = trainer.optimizer = None  # the Reducer before the group
            del trainer
        if rank != 0:  # every rank's last message is in the pipe before rank 0 ends the run
            outbox.close()
            outbox.join_thread()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        outbox.put(None)


def denormals(name: str, steps: int) -> list[dict]:
    """Per step of `name` at 1 rank: the share of subnormal gradient values, and the CPU time of adding
    the gradients to a copy of themselves against adding zeros of the same size."""
    import torch

    torch.set_num_threads(1)
    trainer = trainer_for(name, BATCHES[name])
    tiny = torch.finfo(torch.float32).tiny
    rows = []
    for index in range(steps):
        trainer.backward(trainer.forward())
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        row = {"step": index, "subnormal_share": ((grads != 0) & (grads.abs() < tiny)).float().mean().item()}
        for label, values in (("gradients", grads), ("zeros", torch.zeros_like(grads))):
            target = values.clone()
            c0 = time.thread_time()
            target.add_(values)
            row[f"add_{label}_cpu_us"] = (time.thread_time() - c0) * 1e6
        rows.append(row)
        trainer.update()
    return rows


def summarise(rows: dict) -> dict:
    """Per arm and phase, the median wall and CPU time; and the DDP arm minus the no_sync arm, paired."""
    out: dict = {}
    for arm, steps in rows.items():
        out[arm] = {key: stats([s[key] for s in steps]) for key in steps[0]}
    pairs = list(zip(rows["nosync"], rows["ddp"]))
    out["extra_us"] = {key: method.median([b[key] - a[key] for a, b in pairs]) for key in rows["ddp"][0]}
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="alexnet,vgg16,resnet18,resnet50")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--denormals", action="store_true", help="the denormal-float check instead (1 rank)")
    parser.add_argument("--steps", type=int, default=8, help="--denormals: steps per model")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in BATCHES:
            method.fail(f"unknown model {m!r}; known: {', '.join(BATCHES)}")
    if args.pairs < 1 or args.warmup < 1 or args.steps < 1:
        method.fail("--pairs, --warmup and --steps take a whole number >= 1")
    if args.denormals:
        denormals_report(args, models)
    else:
        phases_report(args, models)
    return 0


def denormals_report(args: argparse.Namespace, models: list[str]) -> None:
    """--denormals: each model's steps at 1 rank, a table row per step, and their JSON."""
    start = stamp()
    print(f"# training_phases --denormals: {' '.join(sys.argv)}\n\nstart {start}\n")
    table = method.Table(["model", "step", "subnormal %", "add gradients ms", "add zeros ms"], min_width=6)
    print(table.header())
    found = {}
    for name in models:
        found[name] = denormals(name, args.steps)
        for row in found[name]:
            print(table.row([name, row["step"], f"{100 * row['subnormal_share']:.4f}",
                             f"{row['add_gradients_cpu_us'] / 1e3:.1f}", f"{row['add_zeros_cpu_us'] / 1e3:.1f}"]))
    path = os.path.join(args.out, "training_phases-denormals.json")
    method.write_json(path, "training_phases", args, start=start, end=stamp(), denormals=found)
    print(f"\nwrote {path}")


def phases_report(args: argparse.Namespace, models: list[str]) -> None:
    """The 2-rank pairs of every model, a table row per rank, arm and their difference, and their JSON."""
    from local_ranks import run_local_ranks

    start = stamp()
    print(f"# training_phases: {' '.join(sys.argv)}\n\nstart {start}\n")
    spec = {"models": models, "pairs": args.pairs, "warmup": args.warmup}
    results: dict = {}
    table = method.Table(["model", "rank", "arm"] + [f"{p} wall/CPU ms" for p in PHASES]
                         + ["step wall ms", "gloo CPU ms"], min_width=6)
    print(table.header())
    for rank, name, rows, end in run_local_ranks(_ranks, (spec,), world=2, timeout_s=1800):
        res = results.setdefault(name, {})[str(rank)] = {**summarise(rows), "rows": rows, "end": end}
        for arm in ("nosync", "ddp", "extra_us"):
            cell = res[arm] if arm == "extra_us" else {k: v["median"] for k, v in res[arm].items()}
            print(table.row([name, rank, "DDP - no_sync" if arm == "extra_us" else arm]
                            + [f"{cell[f'{p}_wall_us'] / 1e3:.1f} / {cell[f'{p}_cpu_us'] / 1e3:.1f}" for p in PHASES]
                            + [f"{cell['sum_wall_us'] / 1e3:.1f}", f"{cell['other_threads_cpu_us'] / 1e3:.1f}"]))
    path = os.path.join(args.out, "training_phases.json")
    method.write_json(path, "training_phases", args, start=start, end=stamp(), batches=BATCHES, results=results)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
