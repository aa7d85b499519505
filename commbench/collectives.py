"""The collective table: byte counts, bus factors, metrics and verifiable data.

One entry per collective, as nccl-tests keeps one small descriptor per collective
and writes the harness once. Everything that depends on *which* collective runs
lives here: how a requested size becomes element counts (rounded down as
nccl-tests does), the busbw factor, and the exact expected output.

Metrics follow nccl-tests' doc/PERFORMANCE.md (see docs/metrics.md):
    algbw = size / time            size = the larger per-rank buffer, in bytes
    busbw = algbw * bus_factor(n)  GB/s = 1e9 bytes/s

Verifiable data: rank r's input element k is `pattern[r, k mod PERIOD]`, a small
integer exactly representable in every dtype; reductions of these integers are
exact in every dtype (the value range is chosen per dtype, op and world size), so
the expected output is computed analytically, without a reference run. PERIOD is
a prime, so a chunk delivered to the wrong offset or from the wrong rank shows up
as wrong elements unless the offsets differ by a multiple of PERIOD.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

PERIOD = 65521  # largest prime below 2**16

# ---------------------------------------------------------------- dtypes and ops


@dataclass(frozen=True)
class DType:
    name: str
    itemsize: int
    is_float: bool
    exact_int_limit: int  # integers in [0, limit] are exact (floats); wraps for ints
    host: str  # NumPy dtype used to hold values on the host (bfloat16 -> float32)
    nccl_name: str  # as nccl-tests prints it


DTYPES = {d.name: d for d in (
    DType("float32", 4, True, 1 << 24, "float32", "float"),
    DType("float16", 2, True, 1 << 11, "float16", "half"),
    DType("bfloat16", 2, True, 1 << 8, "float32", "bfloat16"),
    DType("float64", 8, True, 1 << 53, "float64", "double"),
    DType("int32", 4, False, (1 << 31) - 1, "int32", "int32"),
    DType("int8", 1, False, 127, "int8", "int8"),
    DType("uint8", 1, False, 255, "uint8", "uint8"),
    DType("int64", 8, False, (1 << 63) - 1, "int64", "int64"),
)}
DTYPE_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "bf16": "bfloat16",
                 "fp32": "float32", "fp16": "float16", "fp64": "float64", "int": "int32", "long": "int64"}
OPS = ("sum", "prod", "max", "min", "avg")

# Largest power-of-two exponent that stays finite, per float dtype (for prod).
_MAX_EXPONENT = {"float16": 15, "bfloat16": 127, "float32": 127, "float64": 1023}


def resolve_dtype(name: str) -> DType:
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return DTYPES[key]


# ---------------------------------------------------------------- the collective table


@dataclass(frozen=True)
class Plan:
    """Element counts for one collective at one requested size on `world` ranks."""
    collective: str
    requested_nbytes: int
    nbytes: int  # size actually used = the larger per-rank buffer (nccl-tests' size column)
    count: int  # elements in that larger buffer (nccl-tests' count column)
    send_count: int
    recv_count: int
    world: int
    root: int
    # alltoallv: elements rank s sends rank d (splits[s][d]); every row sums to send_count (commbench/splits.py)
    splits: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class Collective:
    name: str
    nccl_name: str
    reduces: bool  # takes a reduction op
    rooted: bool  # takes a root
    chunked: bool  # the size splits into one chunk per rank (allgather, reduce_scatter, alltoall)
    send_all: bool  # the send buffer holds n chunks (reduce_scatter, alltoall)
    recv_all: bool  # the receive buffer holds n chunks (allgather, alltoall)
    bus_factor: Callable[[int], float]
    inplace: bool  # in-place is meaningful (alltoall / sendrecv have none)
    alg_factor: Callable[[int], float] = lambda n: 1.0  # algbw = size / time x this (hypercube: (n-1)/n)
    in_all: bool = True  # `-c all` runs it (not hypercube: an algorithm nccl-tests tests, on 2^k ranks only)


COLLECTIVES = {c.name: c for c in (
    #          name            nccl-tests name  reduces rooted chunked send_all recv_all busbw factor   in-place
    Collective("allreduce", "all_reduce", True, False, False, False, False, lambda n: 2 * (n - 1) / n, True),
    Collective("allgather", "all_gather", False, False, True, False, True, lambda n: (n - 1) / n, True),
    Collective("reduce_scatter", "reduce_scatter", True, False, True, True, False, lambda n: (n - 1) / n, True),
    Collective("broadcast", "broadcast", False, True, False, False, False, lambda n: 1.0, True),
    Collective("reduce", "reduce", True, True, False, False, False, lambda n: 1.0, True),
    Collective("alltoall", "alltoall", False, False, True, True, True, lambda n: (n - 1) / n, False),
    Collective("sendrecv", "sendrecv", False, False, False, False, False, lambda n: 1.0, False),
    # nccl-tests 2.x src/gather.cu, scatter.cu, alltoallv.cu, hypercube.cu (GetCollByteCount, GetBw): each
    # rank's chunk is size/n, size the whole buffer; algbw = size / time, busbw = algbw x (n-1)/n; hypercube
    # moves (n-1) chunks into each rank: algbw = size x (n-1)/n / time and busbw = algbw.
    Collective("gather", "gather", False, True, True, False, True, lambda n: (n - 1) / n, True),
    Collective("scatter", "scatter", False, True, True, True, False, lambda n: (n - 1) / n, True),
    Collective("alltoallv", "alltoallv", False, False, True, True, True, lambda n: (n - 1) / n, False),
    Collective("hypercube", "hypercube", False, False, True, False, True, lambda n: 1.0, True,
               alg_factor=lambda n: (n - 1) / n, in_all=False),
)}


def refused_world(collective: str, world: int) -> str | None:
    """Why `collective` cannot run on `world` ranks, or None: nccl-tests' hypercube exchanges with
    rank ^ 2^k, so it needs a power of two (there it prints 'not a power of 2, skipping')."""
    if collective == "sendrecv" and world == 1:
        return "-c sendrecv needs at least 2 ranks (each rank sends to the next one)"
    if collective == "hypercube" and world & (world - 1):
        return f"-c hypercube needs a power-of-two number of ranks (rank r exchanges with r xor 2^k), not {world}"
    return None


def resolve_collectives(names: tuple[str, ...] | list[str]) -> list[str]:
    """Expand `all`, normalise aliases (all_reduce, all-gather), keep order, drop repeats."""
    out: list[str] = []
    for raw in names:
        for name in raw.split(","):
            key = name.strip().lower().replace("-", "_")
            key = {"all_reduce": "allreduce", "all_gather": "allgather", "all_to_all": "alltoall",
                   "reducescatter": "reduce_scatter", "bcast": "broadcast", "send_recv": "sendrecv",
                   "all_to_allv": "alltoallv"}.get(key, key)
            if key == "all":
                keys = [name for name, entry in COLLECTIVES.items() if entry.in_all]
            elif key in COLLECTIVES:
                keys = [key]
            else:
                raise ValueError(f"unknown collective {name.strip()!r}; choose from {', '.join(COLLECTIVES)} or all "
                                 f"(every one but hypercube)")
            out.extend(k for k in keys if k not in out)
    return out


def plan(collective: str, requested_nbytes: int, dtype: DType, world: int, root: int = 0,
         split_weights: tuple[tuple[float, ...], ...] = ()) -> Plan:
    """Round a requested size down to what the collective can use, as nccl-tests does.

    For chunked collectives the per-rank chunk is `size // (itemsize * n)` elements
    and the size used is `chunk * n * itemsize`; otherwise `size // itemsize`.
    A plan with count 0 means the size is too small for this dtype and world.
    alltoallv splits each rank's `count` elements over the peers by `split_weights` (rows: senders;
    none: `chunk` each, nccl-tests' alltoallv); each receive buffer holds the largest column's sum.
    """
    coll = COLLECTIVES[collective]
    if coll.chunked:
        chunk = requested_nbytes // (dtype.itemsize * world)
        chunk -= chunk % 4 if collective == "hypercube" else 0  # hypercube.cu: ALIGN 4 elements per chunk
        count = chunk * world
    else:
        chunk = count = requested_nbytes // dtype.itemsize
    send = chunk * world if coll.send_all else chunk
    recv = chunk * world if coll.recv_all else chunk
    splits = None
    if collective == "alltoallv":
        splits = apportion(split_weights, world, count) if split_weights else ((chunk,) * world,) * world
        recv = max(sum(row[dst] for row in splits) for dst in range(world))
    return Plan(collective, requested_nbytes, count * dtype.itemsize, count, send, recv, world, root, splits)


def apportion(weights: tuple[tuple[float, ...], ...], world: int, count: int) -> tuple[tuple[int, ...], ...]:
    """Each sender's `count` elements shared out over the peers in proportion to its row of `weights`
    (largest remainders, ties to the lower peer), so every row sums to `count` exactly."""
    rows = []
    for row in weights:
        weights = np.asarray(row, dtype=np.float64)
        weights = weights / (weights.max() or 1.0)  # shares: huge weights cannot sum past a float
        share = weights / (weights.sum() or 1.0) * count
        whole = np.floor(share).astype(np.int64)
        left = int(count - whole.sum())
        for peer in sorted(range(world), key=lambda d: (-(share[d] - whole[d]), d))[:left]:
            whole[peer] += 1
        rows.append(tuple(int(x) for x in whole))
    return tuple(rows)


def bandwidths_gbps(collective: str, nbytes: int, world: int, time_us: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) for `nbytes` moved in `time_us`."""
    if time_us <= 0:
        return 0.0, 0.0
    algbw = nbytes / (time_us * 1e-6) / 1e9 * COLLECTIVES[collective].alg_factor(world)
    return algbw, algbw * COLLECTIVES[collective].bus_factor(world)


# ---------------------------------------------------------------- verifiable data


def _hash(rank: np.ndarray, index: np.ndarray) -> np.ndarray:
    """A cheap integer mix of (rank, index), non-negative, as int64."""
    return ((index * 2654435761 + rank * 40503 + 12345) >> 7) & 0x7FFFFFFF


@dataclass(frozen=True)
class Pattern:
    """Inputs of every rank (one period each) and how to reduce them exactly."""
    dtype: DType
    op: str | None
    world: int
    table: np.ndarray  # int64, shape (world, PERIOD): rank r's input value at index k mod PERIOD

    def reduced(self) -> np.ndarray:
        """Exact reduction over ranks of one period, as float64 or int64 host values."""
        t = self.table
        if self.op in ("sum", "avg"):
            total = t.sum(axis=0)
            return total / self.world if self.op == "avg" else total
        if self.op == "prod":
            # Values are 1 or 2, so the product is 2**(number of twos): exact, and finite by construction.
            twos = (t == 2).sum(axis=0).astype(np.int64)
            return np.ldexp(1.0, twos) if self.dtype.is_float else np.left_shift(np.int64(1), twos)
        if self.op == "max":
            return t.max(axis=0)
        if self.op == "min":
            return t.min(axis=0)
        raise ValueError(f"collective needs an op, got {self.op!r}")


def make_pattern(dtype: DType, op: str | None, world: int) -> Pattern:
    """Rank-and-index dependent inputs whose reduction is exact in `dtype` for `op`."""
    ranks = np.arange(world, dtype=np.int64)[:, None]
    index = np.arange(PERIOD, dtype=np.int64)[None, :]
    mix = _hash(ranks, index)
    if op == "prod":
        # Twos only on ranks below the dtype's exponent budget: the product stays finite.
        budget = _MAX_EXPONENT.get(dtype.name, 62)  # ints wrap exactly; keep 2**m inside int64
        table = np.where((mix % 4 == 0) & (ranks < budget), 2, 1)
    elif op in ("sum", "avg"):
        limit = dtype.exact_int_limit if dtype.is_float else 1 << 62  # integers wrap exactly
        span = min(128, limit // max(world, 1) + 1)
        if span >= 2:
            table = mix % span
        else:  # more ranks than exact integers: exactly one rank holds a 1 per index
            table = ((ranks + index) % world == 0).astype(np.int64)
    else:
        table = mix % 128  # max/min and data movement: 0..127 fits every dtype exactly
    return Pattern(dtype, op, world, np.ascontiguousarray(table, dtype=np.int64))


def periodic(values: np.ndarray, start: int, count: int) -> np.ndarray:
    """`values[(start + i) % len(values)]` for i in range(count), without index arrays."""
    period = len(values)
    offset = start % period
    rotated = np.concatenate([values[offset:], values[:offset]]) if offset else values
    return np.resize(rotated, count)


def to_host(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Integer/float64 values -> the host dtype, with integer wrap-around for int types."""
    if dtype.is_float:
        return values.astype(dtype.host)
    return values.astype(np.int64).astype(dtype.host)  # two's-complement wrap, as the device does


def input_values(pattern: Pattern, rank: int, start: int, count: int) -> np.ndarray:
    """Elements [start, start + count) of rank `rank`'s send buffer (host dtype)."""
    return to_host(periodic(pattern.table[rank], start, count), pattern.dtype)


@dataclass(frozen=True)
class Segment:
    """A run of expected output: recv[start:start+count] == source[offset + i]."""
    start: int
    count: int
    source: np.ndarray  # one period of host values
    offset: int


def expected_segments(pattern: Pattern, p: Plan, rank: int) -> list[Segment]:
    """Where each part of `rank`'s receive buffer comes from; [] when it is undefined."""
    n, t, name = p.world, pattern.table, p.collective
    chunk = p.recv_count // n if COLLECTIVES[name].recv_all else p.recv_count
    host = lambda v: to_host(v, pattern.dtype)  # noqa: E731
    if name == "allreduce" or (name == "reduce" and rank == p.root):
        return [Segment(0, p.recv_count, host(pattern.reduced()), 0)]
    if name == "reduce":
        return []
    if name == "broadcast":
        return [Segment(0, p.recv_count, host(t[p.root]), 0)]
    if name == "sendrecv":
        return [Segment(0, p.recv_count, host(t[(rank - 1) % n]), 0)]
    if name == "reduce_scatter":
        return [Segment(0, p.recv_count, host(pattern.reduced()), rank * p.recv_count)]
    if name in ("allgather", "hypercube") or (name == "gather" and rank == p.root):
        return [Segment(src * chunk, chunk, host(t[src]), 0) for src in range(n)]
    if name == "gather":
        return []
    if name == "scatter":
        return [Segment(0, p.recv_count, host(t[p.root]), rank * p.recv_count)]
    if name == "alltoall":
        return [Segment(src * chunk, chunk, host(t[src]), rank * chunk) for src in range(n)]
    if name == "alltoallv":
        return _alltoallv_segments(pattern, p, rank)
    raise ValueError(name)


def split_offsets(splits: tuple[tuple[int, ...], ...], rank: int) -> tuple[list[int], list[int]]:
    """alltoallv on `rank`: where each peer's part starts in its send buffer and in its receive buffer
    (peers' parts follow one another in rank order, as MPI_Alltoallv's displacements)."""
    send = np.concatenate([[0], np.cumsum(splits[rank])[:-1]])
    column = [row[rank] for row in splits]
    recv = np.concatenate([[0], np.cumsum(column)[:-1]])
    return [int(x) for x in send], [int(x) for x in recv]


def _alltoallv_segments(pattern: Pattern, p: Plan, rank: int) -> list[Segment]:
    """Rank `rank` receives from each source s the part s sends it, from where it sits in s's send buffer."""
    _, recv_at = split_offsets(p.splits, rank)
    return [Segment(recv_at[src], p.splits[src][rank], to_host(pattern.table[src], pattern.dtype),
                    split_offsets(p.splits, src)[0][rank]) for src in range(p.world) if p.splits[src][rank]]


def tolerance(pattern: Pattern) -> float:
    """0 for exact results; avg on floats divides, so allow a few units in the last place."""
    if pattern.op == "avg" and pattern.dtype.is_float:
        eps = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}.get(pattern.dtype.name, 2.0 ** -52)
        return 2 * eps
    return 0.0


def count_wrong(actual: np.ndarray, expected: np.ndarray, rel_tol: float) -> int:
    """Elements of `actual` that differ from `expected` (NaN counts as wrong)."""
    if rel_tol == 0.0:
        return int(np.count_nonzero(actual != expected))
    exp = expected.astype(np.float64)
    ok = np.abs(actual.astype(np.float64) - exp) <= rel_tol * np.maximum(np.abs(exp), 1.0)
    return int(actual.size - np.count_nonzero(ok))


def sentinel(dtype: DType) -> float:
    """A value no verifiable output contains for most ops: NaN for floats, -1/255 for ints."""
    if dtype.is_float:
        return float("nan")
    return 255 if dtype.name == "uint8" else -1
