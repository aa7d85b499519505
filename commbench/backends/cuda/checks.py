"""What the kernels in cuda/ must compute, checked the same way on the CPU and on a GPU.

One set of checks, two places to run them: `HostDevice` runs the kernels' host build
(host.py) on NumPy arrays, `GpuDevice` the NVRTC build on CuPy arrays. The
reference is the array library's own arithmetic (`reference`): 16-bit floats computed in
float32 and rounded once, which is the correctly rounded result the kernels' paired
instructions give; bfloat16 through its bits, within one unit in the last place;
everything else exact, integer sums and products wrapping. Every output range has guard
elements before and after it that a kernel must leave alone, and on the host every load
and 16-byte store must fall inside the ranges a kernel was given (a fault otherwise).

Used by tests/unit/backends/cuda/test_host.py (the host build, in CI), tests/unit/backends/cuda/test_sched.py (the
same checks on a GPU) and `commbench selftest` (a quick subset, wherever it runs).
Each check returns a list of failures, one line each; empty means it passed.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np

from commbench.backends.cuda import kernels as K
from commbench.backends.cuda import plan as P
from commbench.collectives import DTYPES

GUARD = 7  # what memory around an output holds: a write before or after the range shows
MISALIGNED = ((0, 0, 0), (1, 1, 1), (1, 2, 3))  # element offsets of (a, b, out): aligned, equal, scalar path


def random_values(xp: Any, dtype: str, count: int, seed: int, small: bool = False) -> Any:
    """Random values of `dtype` in storage (bfloat16 as its bits); small: 1..3 (exact products
    over 8 ranks); integers over their whole range (sums and products wrap)."""
    from commbench.backends.cuda.device import to_store

    rng = np.random.default_rng(seed)
    if small:
        host = rng.integers(1, 4, count)
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(np.dtype(dtype))
        host = rng.integers(info.min, info.max, count, endpoint=True)
    else:
        host = rng.standard_normal(count) * 100
    return xp.asarray(to_store(host.astype(DTYPES[dtype].host), DTYPES[dtype]))


def reference(xp: Any, dtype: str, op: str, a: Any, b: Any) -> Any:
    """a op b by the array library (NumPy or CuPy); 16-bit floats computed in float32 and
    rounded once (as the kernel's __hadd2 & co. round the exact result), bfloat16 through its bits."""
    fn = {"sum": xp.add, "prod": xp.multiply, "max": xp.maximum, "min": xp.minimum}[op]
    if dtype == "bfloat16":
        widen = lambda x: (x.astype(xp.uint32) << 16).view(xp.float32)  # noqa: E731
        wide = fn(widen(a), widen(b)).view(xp.uint32)
        return ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).astype(xp.uint16)
    if dtype == "float16":
        return fn(a.astype(xp.float32), b.astype(xp.float32)).astype(xp.float16)
    return fn(a, b)


def fold(xp: Any, dtype: str, op: str, inputs: Sequence[Any]) -> Any:
    """inputs[0] op inputs[1] op ..., left to right, rounded after every step, as the kernels reduce."""
    acc = inputs[0]
    for x in inputs[1:]:
        acc = reference(xp, dtype, op, acc, x)
    return acc


def wrong(xp: Any, dtype: str, got: Any, want: Any) -> int:
    """Elements of `got` outside the tolerance: bfloat16 one unit in the last place (the
    float32 reference may round twice), everything else exact (NaN equal to NaN)."""
    if dtype == "bfloat16":
        return int((xp.abs(got.astype(xp.int32) - want.astype(xp.int32)) > 1).sum())
    same = got == want
    if DTYPES[dtype].is_float:
        same |= xp.isnan(got) & xp.isnan(want)
    return int(got.size - same.sum())


def reduce_copy_blocks(count: int, itemsize: int, cfg: P.LaunchConfig = P.LaunchConfig()) -> int:
    """The grid kernels.reduce_copy launches (its formula, for the host, which has no CuPy)."""
    packs = -(-count // cfg.pack_elements(itemsize))
    return max(1, min(cfg.blocks_for(3 * count * itemsize), packs))


# ---------------------------------------------------------------- where the kernels run


class HostDevice:
    """The host build on NumPy arrays (aligned as cudaMalloc's), loads and stores bounded."""

    def __init__(self, kernels: Any):
        self.xp, self.kernels = np, kernels

    def function(self, file: str, name: str) -> Any:
        return self.kernels.function(name)

    def full(self, count: int, value: Any, dtype: Any) -> np.ndarray:
        from commbench.backends.cuda.host import aligned

        array = aligned(count, dtype)
        array[...] = value
        return array

    def asarray(self, values: np.ndarray) -> np.ndarray:
        """A copy that starts on a 256-byte boundary, as CuPy's allocations do."""
        return self.full(values.size, values, values.dtype)

    def table(self, arrays: Sequence[np.ndarray]) -> np.ndarray:
        return np.array([a.ctypes.data for a in arrays], dtype=np.uint64)

    def watching(self, arrays: Sequence[np.ndarray]) -> Any:
        return self.kernels.bounds(arrays)

    def reduce_copy(self, out: Any, a: Any, b: Any, dtype: str, op: str, blocks: int | None, threads: int) -> None:
        blocks = blocks or reduce_copy_blocks(out.size, out.itemsize)
        kernel = self.kernels.function(K.kernel_name("reduce_copy", dtype, op))
        kernel((blocks,), (threads,), (out, a, b, np.int64(out.size)))


class GpuDevice:
    """The NVRTC build on CuPy arrays of the current GPU."""

    def __init__(self):
        import cupy

        self.xp, self.device = cupy, cupy.cuda.Device().id

    def function(self, file: str, name: str) -> Any:
        return K.function(file, name, self.device)

    def full(self, count: int, value: Any, dtype: Any) -> Any:
        return self.xp.full(count, value, dtype=dtype)

    def asarray(self, values: Any) -> Any:
        return values

    def table(self, arrays: Sequence[Any]) -> Any:
        return self.xp.asarray(np.array([_pointer(a) for a in arrays], dtype=np.uint64))

    def watching(self, arrays: Sequence[Any]) -> Any:
        return nullcontext()

    def reduce_copy(self, out: Any, a: Any, b: Any, dtype: str, op: str, blocks: int | None, threads: int) -> None:
        if blocks is None and threads == P.LaunchConfig().threads:
            K.reduce_copy(out, a, b, dtype, op)  # the launch the GPU benchmarks time
            return
        kernel = self.function("reduce_copy.cu", K.kernel_name("reduce_copy", dtype, op))
        kernel((blocks or reduce_copy_blocks(out.size, out.itemsize),), (threads,), (out, a, b, np.int64(out.size)))


def _guarded(dev: Any, count: int, offset: int, like: Any) -> tuple[Any, Any]:
    """(whole buffer of GUARD, the `count` elements at `offset` in it, with guards after)."""
    whole = dev.full(offset + count + 4, GUARD, like.dtype)
    return whole, whole[offset:offset + count]


def _guards_hold(xp: Any, whole: Any, offset: int, count: int) -> bool:
    return bool((whole[:offset] == GUARD).all()) and bool((whole[offset + count:] == GUARD).all())


# ---------------------------------------------------------------- the checks


def check_reduce_copy(dev: Any, dtype: str, op: str, counts: Sequence[int], offsets: Sequence[tuple] = MISALIGNED,
                      blocks: int | None = None, threads: int = 512, seed: int = 1) -> list[str]:
    """reduce_copy (out = a op b) for every count and (a, b, out) element offset; `blocks`
    None is the grid the backends use."""
    xp, failures, top = dev.xp, [], max(counts, default=0) + 3
    a_all, b_all = (dev.asarray(random_values(xp, dtype, top, s)) for s in (seed, seed + 1))
    for count in counts:
        for sa, sb, so in offsets:
            whole, out = _guarded(dev, count, so, a_all)
            x, y = a_all[sa:sa + count], b_all[sb:sb + count]
            with dev.watching([x, y, out]):
                dev.reduce_copy(out, x, y, dtype, op, blocks, threads)
            where = (f"reduce_copy {dtype} {op} count {count}, a[{sa}:] b[{sb}:] out[{so}:], "
                     f"grid {blocks or 'auto'}x{threads}")
            bad = wrong(xp, dtype, out, reference(xp, dtype, op, x, y))
            if bad:
                failures.append(f"{where}: {bad} wrong")
            if not _guards_hold(xp, whole, so, count):
                failures.append(f"{where}: wrote outside the range")
    return failures


def check_allreduce_kernels(dev: Any, dtype: str, world: int, count: int, op: str, small: bool = False,
                            offsets: Sequence[int] | None = None, blocks: int | None = None,
                            threads: int = 512, seed: int = 0) -> list[str]:
    """oneshot_allreduce (every row into its own output) and twoshot reduce-scatter then
    all-gather (in place) over `world` rank buffers, rank r's at element offset offsets[r]
    (default 0: aligned); `blocks` None is the grid plan.allreduce_grid gives."""
    xp, offsets = dev.xp, list(offsets or [0] * world)
    out_offsets = offsets[1:] + offsets[:1]  # one-shot's outputs: rank r's at rank r + 1's offset
    ins = [random_values(xp, dtype, count, seed + r, small) for r in range(world)]
    want, failures = fold(xp, dtype, op, ins), []
    cfg, itemsize = P.LaunchConfig(threads=threads), ins[0].itemsize
    for kernel in ("oneshot", "twoshot"):
        step = P.AllreduceLaunch(kernel, 0, (), tuple(P.Ref(r, P.WORK, 0) for r in range(world)), 0, count)
        grid = P.allreduce_grid(step, itemsize, world, cfg)
        grid = (blocks, grid[1]) if blocks else grid
        buffers = [_guarded(dev, count, offsets[r], ins[r]) for r in range(world)]
        sources = [b[1] for b in buffers]
        for (_, target), x in zip(buffers, ins):
            target[...] = x
        if kernel == "oneshot":
            outs = [_guarded(dev, count, out_offsets[r], ins[r]) for r in range(world)]
            names = [K.kernel_name("oneshot_allreduce", dtype, op)]
        else:
            outs, names = buffers, [K.kernel_name("twoshot_reduce_scatter", dtype, op),
                                    K.kernel_name("twoshot_allgather", dtype)]
        args = (dev.table(sources), dev.table([o[1] for o in outs]), np.int32(world), np.int32(0), np.int64(count))
        with dev.watching(sources + [o[1] for o in outs]):
            for name in names:
                dev.function("allreduce.cu", name)(grid, (threads,), args)
        where = f"{kernel} {dtype} {op} world {world} count {count} offsets {offsets} grid {grid}x{threads}"
        for r, (whole, out) in enumerate(outs):
            bad = wrong(xp, dtype, out, want)
            if bad:
                failures.append(f"{where}: rank {r}: {bad} wrong")
            if not _guards_hold(xp, whole, (out_offsets if kernel == "oneshot" else offsets)[r], count):
                failures.append(f"{where}: rank {r}: wrote outside the range")
    return failures


def check_round_inputs(dev: Any, dtype: str, op: str, k: int, count: int, offsets: Sequence[int],
                       threads: int = 512, seed: int = 0) -> list[str]:
    """schedule_round with one entry reducing k inputs (a copy when k = 1), input i at
    element offset offsets[i] and the output at offsets[k], its grid from plan.pack_round,
    then the same entry cut in two, each half given its own blocks."""
    xp, failures = dev.xp, []
    ins_host = [random_values(xp, dtype, count, seed + i) for i in range(k)]
    want, itemsize = fold(xp, dtype, op, ins_host), ins_host[0].itemsize
    cfg = P.LaunchConfig(threads=threads)
    for pieces in (1, 2):
        inputs = [_guarded(dev, count, offsets[i], ins_host[i]) for i in range(k)]
        for (_, target), x in zip(inputs, ins_host):
            target[...] = x
        whole, out = _guarded(dev, count, offsets[k], ins_host[0])
        arrays = {(i, P.WORK): inputs[i][1] for i in range(k)} | {(k, P.WORK): out}
        cuts = [0, count // 2, count] if pieces == 2 else [0, count]
        tasks = [P.Task(P.Ref(k, P.WORK, lo), tuple(P.Ref(i, P.WORK, lo) for i in range(k)), hi - lo)
                 for lo, hi in zip(cuts, cuts[1:]) if hi > lo]
        address = lambda ref, arrays=arrays: _pointer(arrays[(ref.rank, ref.buffer)]) + ref.offset * itemsize
        where = f"schedule_round {dtype} {op} k={k} count {count} offsets {list(offsets)} in {pieces} piece(s)"
        if tasks:
            entries, pointers, grid = P.pack_round(tasks, address, itemsize, cfg)
            args = (xp.asarray(entries.view(np.uint8)), np.int32(len(entries)), xp.asarray(pointers))
            with dev.watching([a for a in arrays.values()]):
                dev.function("schedule_round.cu", K.kernel_name("schedule_round", dtype, op))((grid,), (threads,), args)
        bad = wrong(xp, dtype, out, want)
        if bad:
            failures.append(f"{where}: {bad} wrong")
        if not _guards_hold(xp, whole, offsets[k], count):
            failures.append(f"{where}: wrote outside the range")
    return failures


def _pointer(array: Any) -> int:
    return array.ctypes.data if isinstance(array, np.ndarray) else int(array.data.ptr)


def check_scale(dev: Any, dtype: str, values: Any, factor: float, threads: int = 512) -> list[str]:
    """scale_<dtype> (avg's data *= factor, computed in float, or double for float64, and
    rounded once) over `values` (storage), launched with sched's grid."""
    xp = dev.xp
    whole, data = _guarded(dev, values.size, 1, values)
    data[...] = values
    cast = np.float64 if dtype == "float64" else np.float32
    blocks = max(1, min(1024, -(-values.size // threads)))
    with dev.watching([data]):
        dev.function("reduce_copy.cu", K.kernel_name("scale", dtype))(
            (blocks,), (threads,), (np.uint64(_pointer(data)), np.int64(values.size), cast(factor)))
    if dtype == "bfloat16":  # NaN equal to NaN, whatever its bits
        wide = ((values.astype(xp.uint32) << 16).view(xp.float32) * xp.float32(factor)).view(xp.uint32)
        want = ((wide + 0x7FFF + ((wide >> 16) & 1)) >> 16).astype(xp.uint16)
        nan = lambda bits: (bits & 0x7FFF) > 0x7F80  # noqa: E731
        bad = int(values.size - ((data == want) | (nan(data) & nan(want))).sum())
    else:
        wide = values.astype(cast) * cast(factor)
        want = wide.astype(values.dtype)
        bad = int(values.size - ((data == want) | (xp.isnan(data) & xp.isnan(want))).sum())
    failures = [f"scale {dtype} x {factor} over {values.size} values: {bad} wrong"] if bad else []
    if not _guards_hold(xp, whole, 1, values.size):
        failures.append(f"scale {dtype}: wrote outside the range")
    return failures


def path_counts(dtype: str, threads: int, blocks: int = 1) -> list[int]:
    """Counts that reach each path of reduce_span for `blocks` x `threads`: nothing, one
    element, a pack minus one, exact packs, one pass of UNROLL packs per thread (and one
    pack, one element either side), odd tails."""
    e = max(1, 16 // DTYPES[dtype].itemsize)
    full = 4 * threads * e * blocks  # cb::UNROLL packs per thread, every block full
    return sorted({0, 1, e - 1, e, e + 1, 2 * e, 3 * e + 5, full - e, full - 1, full, full + 1, full + e,
                   2 * full + threads * e + 3, math.ceil(2.5 * full) + e // 2 + 1})


# ---------------------------------------------------------------- whole schedules (host build only)


def exact_inputs(dtype: str, op: str, world: int, count: int, seed: int = 0) -> list[np.ndarray]:
    """Inputs every dtype reduces exactly over `world` <= 8 ranks in any order: -3..3 for
    sums, max, min and avg (0..3 unsigned), powers of two for products (at most 2^8)."""
    rng = np.random.default_rng(seed)
    unsigned = dtype == "uint8"
    values = np.array([1, 2] if unsigned else [-2, -1, 1, 2]) if op == "prod" else \
        np.arange(0 if unsigned else -3, 4)
    return [rng.choice(values, count).astype(np.float64) for _ in range(world)]


def check_schedule(kernels: Any, schedule: Any, dtype: str, op: str, streams: str = "one", reverse: bool = False,
                   seed: int = 0) -> list[str]:
    """Run `schedule` through the host build as --backend cuda does (plan's programs:
    `streams` one (virtual ranks on one GPU) or per-rank (peer and ipc modes); avg as sum,
    then scale by 1/n) and compare every rank's buffer with the schedule's NumPy
    interpreter (commbench.schedule.run): equal, or for avg within the harness's tolerance."""
    from commbench.backends.cuda.device import from_store, to_store
    from commbench.backends.cuda.host import aligned, run_programs, scale
    from commbench.collectives import Pattern, count_wrong, tolerance
    from commbench.schedule import run

    d, world, count = DTYPES[dtype], schedule.world, schedule.count
    inputs = exact_inputs(dtype, op, world, count, seed)
    want = run(schedule, [x.copy() for x in inputs], op)
    buffers = {}
    for rank, x in enumerate(inputs):
        stored = to_store(x.astype(d.host), d)
        buffers[(rank, P.WORK)], buffers[(rank, P.STAGE)] = aligned(count, stored.dtype), aligned(count, stored.dtype)
        buffers[(rank, P.WORK)][...] = stored
    groups = [list(range(world))] if streams == "one" else [[r] for r in range(world)]
    programs = [P.program(schedule, group) for group in groups]
    with kernels.bounds(list(buffers.values())):
        run_programs(kernels, programs, buffers, d, op, world, reverse=reverse)
        for rank in range(world) if op == "avg" else ():
            scale(kernels, buffers[(rank, P.WORK)], d, 1.0 / world)
    where = f"{schedule.name} {schedule.collective} {dtype} {op}, {world} ranks, {count} elements, {streams} stream(s)"
    tol = tolerance(Pattern(d, op, world, np.empty((world, 0), dtype=np.int64)))
    failures = []
    for rank in range(world):
        expected, got = want[rank] / world if op == "avg" else want[rank], buffers[(rank, P.WORK)]
        if op == "avg":
            bad = count_wrong(from_store(got, d), expected, tol)
        else:  # integers through int64, so that they wrap as the kernels' do
            bad = int((got != to_store(expected.astype(d.host if d.is_float else np.int64).astype(d.host), d)).sum())
        if bad:
            failures.append(f"{where}: rank {rank}: {bad} wrong")
    return failures
