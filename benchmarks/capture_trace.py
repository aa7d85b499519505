"""Capture a PyTorch profiler trace of a small real data-parallel job on local CPU ranks (gloo).

Each rank trains a small MLP with torch DDP (default buckets, or --bucket-mb) or FSDP2
(fully_shard per layer) on random data and profiles the last steps with torch.profiler, as
docs/replay.md says to: one trace file per rank, `rank<R>.json` under --out, and the traced run's
own step times (`steps.json`: per rank, each profiled step's wall time in microseconds); with
--execution-trace, each rank's execution trace of the same steps too (`et_rank<R>.json`).

    python benchmarks/capture_trace.py --out /tmp/ddp --setup ddp --nprocs 2 --steps 3
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(width: int, layers: int):
    import torch

    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
                                 for _ in range(layers)])


def _wrap(model, setup: str, bucket_mb: float | None):
    from torch.nn.parallel import DistributedDataParallel

    if setup == "ddp":
        return DistributedDataParallel(model, **({} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}))
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        fully_shard(layer)
    return fully_shard(model)


def _rank(rank: int, args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.nprocs)
    torch.manual_seed(0)
    model = _wrap(_model(args.width, args.layers), args.setup, args.bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(args.batch, args.width)
    schedule = torch.profiler.schedule(wait=0, warmup=args.warmup, active=args.steps)
    steps_us = []
    observer = None
    if args.execution_trace:  # the execution trace of the same steps, beside the profiler's
        observer = torch.profiler.ExecutionTraceObserver().register_callback(
            os.path.join(args.out, f"et_rank{rank}.json"))
        observer.start()
    path = os.path.join(args.out, f"rank{rank}.json")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                                on_trace_ready=lambda p: p.export_chrome_trace(path), record_shapes=True) as prof:
        for _ in range(args.warmup + args.steps):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            model(data).square().mean().backward()
            optimizer.step()
            steps_us.append((time.perf_counter() - start) * 1e6)
            prof.step()
    if observer is not None:
        observer.stop()
        observer.unregister_callback()
    gathered = [None] * args.nprocs
    dist.all_gather_object(gathered, steps_us[args.warmup:])
    if rank == 0:
        with open(os.path.join(args.out, "steps.json"), "w", encoding="utf-8") as f:
            json.dump({"setup": args.setup, "nprocs": args.nprocs, "steps_us": gathered}, f)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--setup", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, default=None)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--execution-trace", action="store_true",
                        help="Also write each rank's execution trace (ExecutionTraceObserver), et_rank<R>.json.")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(args,), nprocs=args.nprocs)


if __name__ == "__main__":
    main()
