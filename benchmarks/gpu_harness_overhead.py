"""What commbench's harness adds per call on a GPU: its torch and cupy backends against a bare loop
of the same NCCL calls (issue 36, item 6). Needs a CUDA device; without one it says so in one
line and exits 2.

One rank (world size 1) per library, each in its own process (torch's NCCL process group and
CuPy's communicator with its gloo control plane do not share one process's default group):

  bare       N back-to-back calls (dist.all_reduce(t) / comm.allReduce on one stream) between
             two CUDA events: per call = elapsed / N; under a graph, the N calls captured in one
             CUDA graph (torch.cuda.graph / CuPy stream capture) and one replay timed;
  commbench  the backend's own prepare() and time_iterations(), as `commbench sweep` times a
             point: an event pair around each call, the mean of the per-call times (time_us);
             cupy with --graph captures the N calls and times one replay.

Rounds alternate the order (bare first on even rounds, commbench first on odd ones: ABBA), and
each round gives added_us = commbench - bare per call. Printed: the median added_us over rounds
and its interquartile range, per library, mode and size. Target: at most 2 us added per call
eager, none under a graph (the IQR reaches 0). torch's backend has no graph mode: its graph
row is the bare loop alone, for scale.

    python benchmarks/gpu_harness_overhead.py --sizes 1K,1M --rounds 6 --iters 200 --json out.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np

EAGER_TARGET_US = 2.0


def _no_gpu() -> str | None:
    """Why this cannot run here (one line), or None."""
    try:
        import torch
    except ImportError:
        return "needs torch"
    if not torch.cuda.is_available():
        return "needs a CUDA device (torch sees none)"
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken CUDA install
        return f"needs CuPy ({type(exc).__name__})"
    return None


def _events_us(run, stream=None) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    run()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def torch_part(sizes: list[int], iters: int, rounds: int) -> list[dict]:
    from commbench.backends.torch_dist import TorchBackend
    from commbench.launch import free_port
    from commbench.launchers import LaunchInfo

    backend = TorchBackend(LaunchInfo.local(0, 1, free_port()), device="cuda", torch_backend="nccl")
    try:
        return [row for nbytes in sizes for row in _torch_size(backend, nbytes, iters, rounds)]
    finally:
        backend.close()


def _torch_size(backend, nbytes: int, iters: int, rounds: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    call = backend.prepare("allreduce", tensor, tensor, "sum", 0, True)

    def bare() -> None:
        for _ in range(iters):
            dist.all_reduce(tensor)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bare()
    measure = {"bare": lambda: _events_us(bare) / iters,
               "commbench": lambda: float(np.mean(backend.time_iterations(call, iters)))}
    replay = _events_us(graph.replay) / iters
    return [_paired("torch", "eager", nbytes, measure, rounds),
            {"library": "torch", "mode": "graph", "nbytes": nbytes, "bare_us": replay, "commbench_us": None,
             "added_us": None, "iqr_us": None, "note": "commbench's torch backend has no --graph"}]


def cupy_part(sizes: list[int], iters: int, rounds: int) -> list[dict]:
    from commbench.backends.cuda.nccl import CupyBackend
    from commbench.launch import free_port
    from commbench.launchers import LaunchInfo

    backend = CupyBackend(LaunchInfo.local(0, 1, free_port()))
    try:
        return [row for nbytes in sizes for row in _cupy_size(backend, nbytes, iters, rounds)]
    finally:
        backend.close()


def _cupy_size(backend, nbytes: int, iters: int, rounds: int) -> list[dict]:
    import cupy

    from commbench.collectives import DTYPES

    comm, nccl, stream = backend.comm, backend._nccl, backend.stream
    buffer = backend.alloc(nbytes // 4, DTYPES["float32"])
    call = backend.prepare("allreduce", buffer, buffer, "sum", 0, True)
    ptr, count = buffer.data.ptr, buffer.size

    def bare() -> None:
        for _ in range(iters):
            comm.allReduce(ptr, ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    for _ in range(3):
        call()
    stream.synchronize()
    with stream:
        stream.begin_capture()
        bare()
        graph = stream.end_capture()
    graph.upload(stream)
    stream.synchronize()
    rows = []
    for mode, graphed in (("eager", False), ("graph", True)):
        backend.graph = graphed
        run = (lambda: graph.launch(stream)) if graphed else bare
        measure = {"bare": lambda run=run: _cupy_events_us(cupy, stream, run) / iters,
                   "commbench": lambda: float(np.mean(backend.time_iterations(call, iters)))}
        rows.append(_paired("cupy", mode, nbytes, measure, rounds))
    return rows


def _cupy_events_us(cupy, stream, run) -> float:
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    run()
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) * 1e3


def _paired(library: str, mode: str, nbytes: int, measure: dict, rounds: int) -> dict:
    """Rounds of (bare, commbench) in ABBA order; the median difference per call and its IQR."""
    added, bare_us, ours_us = [], [], []
    for index in range(rounds):
        order = ("bare", "commbench") if index % 2 == 0 else ("commbench", "bare")
        got = {name: measure[name]() for name in order}
        bare_us.append(got["bare"])
        ours_us.append(got["commbench"])
        added.append(got["commbench"] - got["bare"])
    low, high = np.percentile(added, [25, 75])
    return {"library": library, "mode": mode, "nbytes": nbytes, "bare_us": float(np.median(bare_us)),
            "commbench_us": float(np.median(ours_us)), "added_us": float(np.median(added)),
            "iqr_us": [float(low), float(high)], "note": ""}


def verdict(row: dict) -> str:
    if row["added_us"] is None:
        return "n/a"
    low, high = row["iqr_us"]
    limit = EAGER_TARGET_US if row["mode"] == "eager" else 0.0
    if high <= limit:
        return "pass"
    return "FAIL" if low > limit else "noisy"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1K,1M")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", default=None)
    parser.add_argument("--part", choices=["torch", "cupy"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    reason = _no_gpu()
    if reason:
        print(f"gpu_harness_overhead: {reason}; run it on a GPU (benchmarks/gpu_run.sh does)", file=sys.stderr)
        return 2
    from commbench.sizes import parse_sizes

    sizes = parse_sizes(args.sizes)
    if args.part:
        rows = (torch_part if args.part == "torch" else cupy_part)(sizes, args.iters, args.rounds)
        print(json.dumps(rows))
        return 0
    rows = []
    for part in ("torch", "cupy"):
        proc = subprocess.run([sys.executable, __file__, "--part", part, "--sizes", args.sizes, "--iters",
                               str(args.iters), "--rounds", str(args.rounds)], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            print(f"# {part}: failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        rows += json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"# per call, us; added = commbench - bare, median [IQR] of {args.rounds} ABBA rounds of {args.iters} calls")
    print(f"{'library':>8} {'mode':>6} {'size':>10} {'bare':>9} {'commbench':>10} {'added':>8} {'IQR':>17}  verdict")
    for r in rows:
        ours = "-" if r["commbench_us"] is None else f"{r['commbench_us']:.2f}"
        added = "-" if r["added_us"] is None else f"{r['added_us']:.2f}"
        iqr = "-" if r["iqr_us"] is None else f"[{r['iqr_us'][0]:.2f}, {r['iqr_us'][1]:.2f}]"
        print(f"{r['library']:>8} {r['mode']:>6} {r['nbytes']:>10} {r['bare_us']:>9.2f} {ours:>10} {added:>8} "
              f"{iqr:>17}  {verdict(r)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"rows": rows, "eager_target_us": EAGER_TARGET_US}, handle, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
