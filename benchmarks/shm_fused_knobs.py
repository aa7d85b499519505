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
pages where shmem_enabled is never), `seg` (/dev/shm segments of exactly the buffer's size that each rank
creates for its own buffers, mapping its peer's: the shm backend's layout before issue 38's fix, which puts a
power-of-two buffer's own and peer streams a power of two apart), `segpad` (the same with a page of slack per
segment), `seg2k` (segpad with rank 1's arrays 2 KiB in: own and peer streams half a 4 KiB page apart, where
Intel's 4K aliasing of loads against pending stores needs them a multiple of 4 KiB apart; the backend puts them
64 B apart), `backend` (the shm backend's own buffers, from its alloc; needs --backend-port) or `thp` (private
NumPy arrays, transparent huge pages where enabled is madvise or always; the fused kernel then runs with a
private array for the peer's half).

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
from commbench.backends.shm.segments import SEGMENT_SLACK, Segment, unlink
from commbench.sizes import parse_sizes


def _shared(count: int) -> np.ndarray:
    area = mmap.mmap(-1, count * 4 + 64, flags=mmap.MAP_SHARED)
    raw = np.frombuffer(area, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + count]


def _segment(path: str, count: int, create: bool, slack: int, start: int = 0) -> np.ndarray:
    """A /dev/shm segment as the shm backend makes one (posix_fallocate by its creating rank, MAP_POPULATE);
    the array starts `start` bytes in."""
    return np.frombuffer(Segment(path, count * 4 + slack, create).map, dtype=np.float32, count=count,
                         offset=start)


def _segments(rank: int, count: int, barrier, slack: int, stagger: int = 0) -> dict:
    """`seg`/`segpad`/`seg2k` memory: each rank creates its own buffer and output segments, then maps its peer's;
    rank r's arrays start r x `stagger` bytes in."""
    paths = [[f"/dev/shm/cb_knobs_{os.getppid()}_{r}_{k}" for k in ("buf", "dst")] for r in range(2)]
    own = {k: _segment(path, count, True, slack, rank * stagger) for k, path in zip(("own", "dst"), paths[rank])}
    own["own"][...], own["dst"][...] = 1.0, 0.0
    barrier.wait()
    peer = {k: _segment(path, count, False, slack, (1 - rank) * stagger)
            for k, path in zip(("peer", "peerdst"), paths[1 - rank])}
    barrier.wait()
    for path in paths[rank]:
        unlink(path)
    return {**own, **peer}


def _backend(rank: int, port: int):
    """commbench's shm backend in this rank (its gloo control plane, its segments, its executor's planner)."""
    from commbench.backends.shm.backend import ShmBackend
    from commbench.launchers import LaunchInfo
    from commbench.topology import Topology

    return ShmBackend(LaunchInfo.local(rank, 2, port), Topology(1, 2), "auto", 120.0)


def _backend_buffers(backend, rank: int, count: int, barrier) -> dict:
    """`backend` memory: the buffers commbench's shm backend allocates (alloc), the peer's as it maps them."""
    from commbench import collectives as C

    dtype = C.resolve_dtype("float32")
    own, dst = backend.alloc(count, dtype), backend.alloc(count, dtype)
    backend.fill(own, 1.0)
    backend.fill(dst, 0.0)
    barrier.wait()
    return {"own": own.array, "dst": dst.array, "peer": backend._peer_array(1 - rank, own),
            "peerdst": backend._peer_array(1 - rank, dst)}


def _private(count: int) -> np.ndarray:
    raw = np.empty(count + 16, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + count]


def _parse(variant: str) -> tuple[str, str, dict]:
    tool, memory, *rest = variant.split(":")
    knobs = dict(item.split("=") for item in rest[0].split(",")) if rest else {}
    return tool, memory, {key: int(value) if key == "nt" or value == "0" else parse_sizes(value)[0]
                          for key, value in knobs.items()}


def _call(library, tool: str, knobs: dict, arrays: dict, rank: int, counters: np.ndarray | None = None):
    half = len(arrays["own"]) // 2
    part = slice(rank * half, (rank + 1) * half)
    context = shm_native.Context(nt_bytes=0, fused_block=knobs.get("block", 0),
                                 prefetch_bytes=knobs.get("prefetch", 0), fused_nt=knobs.get("nt", 0))
    ops = (shm_native.Op * (1 if counters is None else 2))()
    if counters is not None:  # lockstep: the op, then the executor's spin barrier (8 words apart per rank)
        peers = np.array([8 * (1 - rank)], dtype=np.int64)
        context.counters, context.flags, context.peers, context.npeers = counters.ctypes.data, \
            counters[32:].ctypes.data, peers.ctypes.data, 1
        context.mine, context.flag_words, context.spin_ns = 8 * rank, 0, 10**12
        context.spin_budget_ns = context.spin_floor_ns = 10**12
        ops[1].kind = shm_native.OP_BARRIER
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
    keep = (ops, context, counters if counters is None else peers)
    return lambda: library.cb_shm_run(ctypes.addressof(keep[0]), len(ops), 0, 0, ctypes.addressof(keep[1]))


def _rank(rank: int, count: int, variants: list[str], rounds: int, reps: int, shared: dict, barrier, times,
          calls_per_rep: int = 1, lockstep: bool = False, port: int = 0) -> None:
    library = shm_native.load()
    private = {}
    if any(_parse(variant)[1] == "thp" for variant in variants):  # only when used: 1 GiB touched per rank
        private = {"own": _private(count), "dst": _private(count), "peer": _private(count), "peerdst": _private(count)}
    for array in private.values():
        array[...] = 1.0
    memories = {"shm": {"own": shared["bufs"][rank], "dst": shared["dsts"][rank], "peer": shared["bufs"][1 - rank],
                    "peerdst": shared["dsts"][1 - rank]},
                "thp": private}
    used = {_parse(variant)[1] for variant in variants}
    backend = _backend(rank, port) if port else None
    try:
        for memory, slack, stagger in (("seg", 0, 0), ("segpad", SEGMENT_SLACK, 0), ("seg2k", SEGMENT_SLACK, 2048)):
            if memory in used:
                memories[memory] = _segments(rank, count, barrier, slack, stagger)
        if "backend" in used:
            memories["backend"] = _backend_buffers(backend, rank, count, barrier)
        _timed(library, variants, memories, rank, rounds, reps, barrier, times, calls_per_rep,
               shared["counters"] if lockstep else None)
    finally:
        if backend is not None:
            backend.close()  # its segments unlinked


def _timed(library, variants: list[str], memories: dict, rank: int, rounds: int, reps: int, barrier, times,
           calls_per_rep: int, counters: np.ndarray | None) -> None:
    calls = []
    for variant in variants:
        tool, memory, knobs = _parse(variant)
        calls.append(_call(library, tool, knobs, memories[memory], rank, counters))
    for rnd in range(rounds):
        order = range(len(calls)) if rnd % 2 == 0 else reversed(range(len(calls)))
        for index in order:
            for rep in range(reps + 1):  # one warm-up
                barrier.wait()
                start = time.perf_counter()
                for _ in range(calls_per_rep):
                    calls[index]()
                elapsed = (time.perf_counter() - start) / calls_per_rep
                if rep:
                    times[((rnd * len(calls) + index) * reps + rep - 1) * 2 + rank] = elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+")
    parser.add_argument("--size", default="256M", help="bytes per rank")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--back-to-back", type=int, default=1, metavar="N",
                        help="calls per repetition, back to back with no barrier between them (the time is their "
                             "mean): 1 starts every call together, as copybound does; more, as a sweep's timed loop "
                             "does [default: 1]")
    parser.add_argument("--lockstep", action="store_true",
                        help="every call ends at the shm executor's spin barrier, as in a collective call: the ranks "
                             "run in step (with --back-to-back N, as a sweep's timed loop runs)")
    parser.add_argument("--backend-port", type=int, default=0, metavar="PORT",
                        help="start commbench's shm backend in each rank (its gloo rendezvous on this loopback port), "
                             "as a sweep's ranks have it; needed by `backend` memory [default: none]")
    args = parser.parse_args(argv)
    if any(_parse(variant)[1] == "backend" for variant in args.variants) and not args.backend_port:
        parser.error("`backend` memory needs --backend-port")
    count = parse_sizes(args.size)[0] // 4
    shm_native.load()  # built before the fork
    shared = {"bufs": [_shared(count) for _ in range(2)], "dsts": [_shared(count) for _ in range(2)],
              "counters": np.frombuffer(mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED), dtype=np.int64)}
    for arrays in (shared["bufs"], shared["dsts"]):
        for array in arrays:
            array[...] = 1.0
    context = mp.get_context("fork")
    times = context.Array("d", args.rounds * len(args.variants) * args.reps * 2, lock=False)
    barrier = context.Barrier(2)
    load = os.getloadavg()
    procs = [context.Process(target=_rank, args=(r, count, args.variants, args.rounds, args.reps, shared, barrier,
                                                  times, args.back_to_back, args.lockstep,
                                                  args.backend_port)) for r in range(2)]
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
