"""The GPU speed checks of docs/gpu.md, side by side in one run (needs a CUDA device and CuPy).

1. reduce-copy against the device's own copy: a device-to-device copy of S bytes
   (cudaMemcpyAsync: reads S, writes S) and commbench's reduce-copy kernel (out = a + b,
   fp16 arrays of S bytes each: reads 2 S, writes S), timed with CUDA events on the same
   GPU, rounds alternating; GB/s = bytes read + written / time. Target: reduce-copy >= 80%
   of the copy at >= 64 MiB.
2. `--backend cuda --cuda-mode virtual -N 8` ring and one-shot allreduce busbw at the
   same sizes, as a fraction of that copy bandwidth (reported; every virtual link is the
   same HBM, so the copy is the ceiling's scale, not a target).
3. NCCL through CuPy (`--backend cupy`) and through torch (`--backend torch --device
   cuda`), the same library driven two ways on the same GPUs, runs alternating (the order
   swapped every round): time_us per size and their ratio. Target: within 5% (0.95-1.05)
   at >= 1 MiB. It needs 2 GPUs: on one, an in-place allreduce of one rank moves nothing,
   and the times are each driver's launch cost (shown, verdict n/a).

    python benchmarks/gpu_bandwidth.py --json out/gpu_bandwidth.json
    python benchmarks/gpu_bandwidth.py --sizes 64M,256M --rounds 1

Without a GPU it says so in one line and exits 2. Verdicts: pass / FAIL per target.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from method import Table, fail, median, ratio_text

from commbench.results import read_records
from commbench.sizes import SizeError, format_size, parse_sizes


def _events_ms(cupy, fn, repeat: int) -> float:
    """Mean time of `fn` in ms over `repeat` calls after one warm call (which also compiles a
    kernel), timed as the backends time theirs (CUDA events on the current stream)."""
    from commbench.backends.cuda.device import time_calls

    fn()
    return float(time_calls(fn, repeat, cupy.cuda.get_current_stream()).mean()) / 1e3


def _copy_and_reduce_gbps(cupy, nbytes: int, rounds: int, repeat: int) -> tuple[float, float]:
    """Median GB/s over `rounds` of a device copy of `nbytes` and of reduce-copy on three fp16
    arrays of `nbytes` each; the arrays are dropped on return."""
    from commbench.backends.cuda.kernels import reduce_copy

    src, dst = cupy.ones(nbytes, dtype=cupy.uint8), cupy.empty(nbytes, dtype=cupy.uint8)
    a, b, out = (cupy.ones(nbytes // 2, dtype=cupy.float16) for _ in range(3))  # S bytes each
    moved = a.nbytes + b.nbytes + out.nbytes
    stream = cupy.cuda.get_current_stream().ptr  # the events record on it too
    copies, reduces = [], []
    for _ in range(rounds):
        copy_ms = _events_ms(cupy, lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, 3,
                                                                          stream), repeat)
        reduce_ms = _events_ms(cupy, lambda: reduce_copy(out, a, b, "float16", "sum"), repeat)
        copies.append(2 * nbytes / copy_ms / 1e6)
        reduces.append(moved / reduce_ms / 1e6)
    return median(copies), median(reduces)


def kernel_section(sizes: list[int], rounds: int, repeat: int) -> list[dict]:
    import cupy

    table = Table(["size", "copy GB/s", "reduce-copy GB/s", "ratio", "target", "verdict"])
    print("1. reduce-copy (fp16 sum) against a device-to-device copy; GB/s = bytes read + written / time")
    print(table.header())
    rows = []
    for nbytes in sizes:
        copy_gbps, reduce_gbps = _copy_and_reduce_gbps(cupy, nbytes, rounds, repeat)
        ratio = reduce_gbps / copy_gbps
        verdict = ("pass" if ratio >= 0.8 else "FAIL") if nbytes >= 64 << 20 else "-"
        print(table.row([format_size(nbytes), copy_gbps, reduce_gbps, ratio_text(ratio), ">= 0.80", verdict]))
        rows.append({"nbytes": nbytes, "copy_gbps": copy_gbps, "reduce_copy_gbps": reduce_gbps, "ratio": ratio,
                     "verdict": verdict})
    cupy.get_default_memory_pool().free_all_blocks()  # nothing held while the sweeps below run
    return rows


def _sweep(out_dir: Path, name: str, *args: str) -> dict[int, dict]:
    path = out_dir / f"{name}.jsonl"
    command = [sys.executable, "-m", "commbench", "sweep", *args, "--placement", "in-place", "--json", str(path),
               "--force"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        fail(f"{' '.join(command[2:])} exited {proc.returncode}: {last}", 1)
    return {r["requested_nbytes"]: r for r in read_records(str(path)) if r["record"] == "result"}


def virtual_section(out_dir: Path, sizes: list[int], copy_gbps: dict[int, float]) -> list[dict]:
    table = Table(["algorithm", "size", "busbw GB/s", "copy GB/s", "busbw/copy"])
    print("\n2. --backend cuda, 8 virtual ranks on one GPU, allreduce busbw against the copy bandwidth")
    print(table.header())
    rows = []
    for algorithm in ("ring", "oneshot"):
        results = _sweep(out_dir, f"virtual-{algorithm}", "--backend", "cuda", "--cuda-mode", "virtual", "-N", "8",
                         "--algorithm", algorithm, "--sizes", ",".join(map(str, sizes)))
        for nbytes in sizes:
            busbw = results[nbytes]["busbw_gbps"]
            print(table.row([algorithm, format_size(nbytes), busbw, copy_gbps[nbytes],
                             ratio_text(busbw / copy_gbps[nbytes])]))
            rows.append({"algorithm": algorithm, "nbytes": nbytes, "busbw_gbps": busbw,
                         "fraction_of_copy": busbw / copy_gbps[nbytes]})
    return rows


def nccl_section(out_dir: Path, sizes: list[int], rounds: int, gpus: int) -> list[dict]:
    table = Table(["size", "cupy us", "torch us", "cupy/torch", "target", "verdict"])
    print(f"\n3. NCCL through CuPy and through torch, allreduce in place, {gpus} rank(s), {rounds} alternating rounds")
    print(table.header())
    spec = ",".join(map(str, sizes))
    times: dict[str, dict[int, list[float]]] = {"cupy": {}, "torch": {}}
    drivers = [("cupy", ["--backend", "cupy"]), ("torch", ["--backend", "torch", "--device", "cuda"])]
    for r in range(rounds):
        for name, args in drivers if r % 2 == 0 else drivers[::-1]:
            for nbytes, result in _sweep(out_dir, f"{name}-{r}", *args, "-N", str(gpus), "--sizes", spec).items():
                times[name].setdefault(nbytes, []).append(result["time_us"])
    rows = []
    for nbytes in sizes:
        cupy_us, torch_us = median(times["cupy"][nbytes]), median(times["torch"][nbytes])
        ratio = cupy_us / torch_us
        verdict = ("pass" if 0.95 <= ratio <= 1.05 else "FAIL") if nbytes >= 1 << 20 else "-"
        verdict = verdict if gpus >= 2 else "n/a (1 GPU)"
        print(table.row([format_size(nbytes), cupy_us, torch_us, ratio_text(ratio), "0.95-1.05", verdict]))
        rows.append({"nbytes": nbytes, "cupy_us": cupy_us, "torch_us": torch_us, "ratio": ratio, "verdict": verdict})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64M,256M,1G", help="sections 1-2 (default 64M,256M,1G)")
    parser.add_argument("--nccl-sizes", default="1M,4M,16M,64M,256M", help="section 3 (default 1M-256M by 4)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--repeat", type=int, default=20, help="kernel calls per timing in section 1 (default 20)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    try:
        sizes, nccl_sizes = parse_sizes(args.sizes), parse_sizes(args.nccl_sizes)
    except SizeError as exc:
        fail(str(exc))
    if args.rounds < 1 or args.repeat < 1:
        fail("--rounds and --repeat must be at least 1")

    from commbench.backends import BackendError
    from commbench.backends.cuda.device import require_gpu

    try:
        gpus = require_gpu("cuda")
    except BackendError as exc:
        fail(f"needs a CUDA device and CuPy: {exc}")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        kernel = kernel_section(sizes, args.rounds, args.repeat)
        virtual = virtual_section(out_dir, sizes, {row["nbytes"]: row["copy_gbps"] for row in kernel})
        nccl = nccl_section(out_dir, nccl_sizes, args.rounds, gpus)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"gpus": gpus, "reduce_copy": kernel, "virtual": virtual, "nccl": nccl},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
