"""What caps shm's fused reduce-and-push below a copy of the same bytes (issue 38): the kernel alone, two
processes at once, each knob switched, paired.

Two forked processes (the two cores) run, per repetition, started together (a barrier) and timed each:

  copy        shm_native's streaming copy of S bytes between two buffers of the rank's own (copybound's kernel);
  fused       the 2-rank ring with pushes' one operation: rank r reduces half r of its buffer with half r of the
              peer's (read from the peer's buffer) and stores the result in both (shm_native.c reduce_push):
              per rank S/2 + S/2 read, S/2 + S/2 written, the copy's traffic;
  fusedlocal  the same operation on the rank's own buffers only (no peer pages, no line the other core wrote);
  fusedoop    out of place: the inputs read from the ranks' sources, the result stored in the ranks' outputs.

Memory: `shm` (MAP_SHARED anonymous mappings made before the fork: shmem, as /dev/shm segments are, 4 KiB
pages where shmem_enabled is never) or `thp` (private NumPy arrays, transparent huge pages where enabled is
madvise or always; the fused kernel then runs with a private array for the peer's half).

Variants are `tool:memory[:block=B,prefetch=P,nt=N]` (nt: 1 + bits, 1 out, 2 push: 4 both, 1 neither); each
round runs every variant --reps times, in ABBA order over rounds; reported per variant: the median per-round
slot time (max over the ranks of each repetition, median over repetitions), and the ratio to the first
variant within each round (median, q1). Example:

    python benchmarks/shm_fused_knobs.py --size 256M --rounds 6 copy:thp copy:shm fused:shm fused:thp
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import multiprocessing as mp
import os
import sys
import time

import numpy as np

from commbench.backends.shm import native as shm_native
from commbench.sizes import parse_sizes


def _shared(count: int) -> np.ndarray:
    area = mmap.mmap(-1, count * 4 + 64, flags=mmap.MAP_SHARED)
    raw = np.frombuffer(area, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + count]


def _private(count: int) -> np.ndarray:
    raw = np.empty(count + 16, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + count]


def _parse(variant: str) -> tuple[str, str, dict]:
    tool, memory, *rest = variant.split(":")
    knobs = dict(item.split("=") for item in rest[0].split(",")) if rest else {}
    return tool, memory, {key: int(value) if key == "nt" or value == "0" else parse_sizes(value)[0]
                          for key, value in knobs.items()}


def _call(library, tool: str, knobs: dict, arrays: dict, rank: int):
    half = len(arrays["own"]) // 2
    part = slice(rank * half, (rank + 1) * half)
    context = shm_native.Context(nt_bytes=0, fused_block=knobs.get("block", 0),
                                 prefetch_bytes=knobs.get("prefetch", 0), fused_nt=knobs.get("nt", 0))
    ops = (shm_native.Op * 1)()
    op = ops[0]
    op.dtype, op.stream = 0, 1
    if tool == "copy":
        op.kind, op.count, op.out, op.a = shm_native.OP_COPY, len(arrays["own"]), arrays["dst"].ctypes.data, \
            arrays["own"].ctypes.data
    elif tool == "fusedoop":
        out, theirs = arrays["dst"][part], arrays["peerdst"][part]
        op.kind, op.count, op.reduction = shm_native.OP_REDUCE, half, 0
        op.out, op.a, op.b, op.out2 = out.ctypes.data, arrays["own"][part].ctypes.data, \
            arrays["peer"][part].ctypes.data, theirs.ctypes.data
    else:
        peer = arrays["peer"] if tool == "fused" else arrays["dst"]
        mine = arrays["own"][part]
        op.kind, op.count, op.reduction = shm_native.OP_REDUCE, half, 0
        op.out, op.a, op.b, op.out2 = mine.ctypes.data, mine.ctypes.data, peer[part].ctypes.data, \
            peer[part].ctypes.data
    keep = (ops, context)
    return lambda: library.cb_shm_run(ctypes.addressof(keep[0]), 1, 0, 0, ctypes.addressof(keep[1]))


def _rank(rank: int, count: int, variants: list[str], rounds: int, reps: int, shared: dict, barrier, times) -> None:
    library = shm_native.load()
    private = {"own": _private(count), "dst": _private(count), "peer": _private(count), "peerdst": _private(count)}
    for array in private.values():
        array[...] = 1.0
    memories = {"shm": {"own": shared["bufs"][rank], "dst": shared["dsts"][rank], "peer": shared["bufs"][1 - rank],
                    "peerdst": shared["dsts"][1 - rank]},
                "thp": private}
    calls = []
    for variant in variants:
        tool, memory, knobs = _parse(variant)
        calls.append(_call(library, tool, knobs, memories[memory], rank))
    for rnd in range(rounds):
        order = range(len(calls)) if rnd % 2 == 0 else reversed(range(len(calls)))
        for index in order:
            for rep in range(reps + 1):  # one warm-up
                barrier.wait()
                start = time.perf_counter()
                calls[index]()
                elapsed = time.perf_counter() - start
                if rep:
                    times[((rnd * len(calls) + index) * reps + rep - 1) * 2 + rank] = elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--size", default="256M", help="bytes per rank")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    count = parse_sizes(args.size)[0] // 4
    shm_native.load()  # built before the fork
    shared = {"bufs": [_shared(count) for _ in range(2)], "dsts": [_shared(count) for _ in range(2)]}
    for arrays in shared.values():
        for array in arrays:
            array[...] = 1.0
    context = mp.get_context("fork")
    times = context.Array("d", args.rounds * len(args.variants) * args.reps * 2, lock=False)
    barrier = context.Barrier(2)
    load = os.getloadavg()
    procs = [context.Process(target=_rank, args=(r, count, args.variants, args.rounds, args.reps, shared, barrier,
                                                  times)) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    grid = np.array(times[:]).reshape(args.rounds, len(args.variants), args.reps, 2).max(axis=3)
    slot_ms = np.median(grid, axis=2) * 1e3  # rounds x variants
    end = os.getloadavg()
    print(f"# {args.size} per rank, {args.rounds} rounds x {args.reps} reps, load {load[0]:.2f} -> {end[0]:.2f}")
    for index, variant in enumerate(args.variants):
        ratio = slot_ms[:, 0] / slot_ms[:, index]
        gbps = count * 4 * 2 / np.median(slot_ms[:, index]) / 1e6  # bytes read + written per rank
        print(f"{variant:40s} {np.median(slot_ms[:, index]):8.2f} ms  {gbps:6.2f} GB/s moved/rank  "
              f"first/this {np.median(ratio):.3f} q1 {np.quantile(ratio, 0.25):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
