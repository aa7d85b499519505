"""Schedules: a custom collective algorithm as data, and the NumPy interpreter that runs it.

A Schedule is rounds of `Transfer(src, dst, chunk, reduce)`. Every rank holds one
working buffer of `count` elements; a transfer reads elements `chunk` of the
source's buffer and writes (`reduce=False`) or reduces into (`reduce=True`) the same
elements of the destination's buffer. Transfers in a round run concurrently: each
reads the state its source had when the round began. The same value is

- executed by the backends (shared memory, torch send/recv, the simulator),
- verified here, on virtual ranks, both numerically and symbolically (which
  ranks' inputs each element holds, so that a transfer that reads a chunk before
  it is final, or counts a rank twice, is caught even when the numbers happen to
  agree),
- costed by the analytic model (the slowest transfer of each round); `Phases` is
  the same schedule compressed for costing at any scale (an algorithm's closed form).

Where the result lives after the last round: allreduce and allgather fill the
whole buffer on every rank; reduce_scatter leaves rank r's reduced chunk at
`chunk_of(r)`; broadcast fills every rank from the root; reduce fills the root.

alltoall moves a block from one offset of the sender to another of the receiver, which
a transfer (same elements at both ends) cannot say. Its schedules therefore name every
block's place in the working buffers, `blocks[s][d]`: where rank s's block for rank d lies
in s's buffer before the first round and in d's buffer after the last (and in every rank's
that forwards it). The backends copy the send buffer into these places and the result out
of them, the local permutation (Bruck's rotations) that an alltoall needs around its rounds.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from commbench.topology import Topology

Chunk = tuple[int, int]  # [start, stop) element range of the working buffer


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    chunk: Chunk
    reduce: bool

    @property
    def count(self) -> int:
        return self.chunk[1] - self.chunk[0]


@dataclass(frozen=True)
class Schedule:
    name: str  # algorithm name (an entry of algorithms.TABLE)
    collective: str  # allreduce, allgather, reduce_scatter, broadcast, reduce
    world: int
    count: int  # elements of every rank's working buffer
    rounds: tuple[tuple[Transfer, ...], ...]
    root: int = 0
    parts: tuple[Chunk, ...] = field(default=())  # reduce_scatter/allgather: rank r's own chunk
    blocks: tuple[tuple[Chunk, ...], ...] = field(default=())  # alltoall: blocks[s][d], rank s's block for d

    @property
    def steps(self) -> int:
        return len(self.rounds)

    def bytes_sent(self, rank: int, itemsize: int) -> int:
        return sum(t.count for rnd in self.rounds for t in rnd if t.src == rank) * itemsize


@dataclass(frozen=True)
class Phases:
    """A schedule in closed form, for costing only: each distinct round once with the number
    of times it repeats, on a topology of at most two nodes that loads every link and NIC as
    the full topology does (so building it costs O(ranks per node), whatever the world).
    Every part is rounded up to the largest, so its cost equals the full schedule's when the
    world divides the count and bounds it from above otherwise (tests pin both)."""
    topology: Topology  # where the rounds are costed, not the job's topology
    count: int  # elements of every rank's working buffer, as in the full schedule
    rounds: tuple[tuple[tuple[Transfer, ...], int], ...]  # (round, repeats)

    @property
    def steps(self) -> int:
        return sum(repeats for _, repeats in self.rounds)


def split(count: int, parts: int) -> tuple[Chunk, ...]:
    """`count` elements in `parts` contiguous chunks whose sizes differ by at most one
    (the first `count % parts` chunks are one longer); chunks may be empty."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


class ScheduleError(ValueError):
    """A schedule that is malformed, races, or does not compute its collective."""


# ---------------------------------------------------------------- validity


def check_round(rnd: tuple[Transfer, ...], world: int, count: int) -> None:
    """Every transfer is in range between two different ranks, and no element of a rank is
    copied into by one transfer while another transfer of the round also writes it."""
    writes: dict[int, list[Transfer]] = {}
    for t in rnd:
        if not (0 <= t.src < world and 0 <= t.dst < world) or t.src == t.dst:
            raise ScheduleError(f"bad ranks in {t}")
        if not 0 <= t.chunk[0] <= t.chunk[1] <= count:
            raise ScheduleError(f"chunk {t.chunk} outside a buffer of {count} elements")
        writes.setdefault(t.dst, []).append(t)
    for into in writes.values():
        if len(into) > 1 and _writes_collide(into):
            _raise_first_collision(into)


def _writes_collide(into: list[Transfer]) -> bool:
    """Whether two of the transfers into one rank write a common element, not both reducing: their spans
    sorted by start, a span collides with an earlier one exactly when it starts before the farthest end so far
    (of a copy, or of any span where it is itself a copy). O(k log k): a one-shot round of 64 ranks was 63^2
    pair tests a rank."""
    reach_any = reach_copy = -1
    for lo, hi, reduce in sorted((t.chunk[0], t.chunk[1], t.reduce) for t in into if t.chunk[0] < t.chunk[1]):
        if lo < reach_copy or (not reduce and lo < reach_any):
            return True
        reach_any = max(reach_any, hi)
        if not reduce:
            reach_copy = max(reach_copy, hi)
    return False


def _raise_first_collision(into: list[Transfer]) -> None:
    """The first transfer, in the round's order, that writes what an earlier one writes (the error's words)."""
    for index, t in enumerate(into):
        if any(_overlap(t.chunk, u.chunk) and not (u.reduce and t.reduce) for u in into[:index]):
            raise ScheduleError(f"{t} overwrites elements another transfer of the round writes")


def hazards(rnd: tuple[Transfer, ...]) -> set[int]:
    """Ranks that are written, in this round, where another transfer of the round reads
    them. Transfers read the state their source had when the round began, so an executor
    that works in place must stage these ranks' results until every read is done
    (one-shot allreduce in place is the usual case; ring schedules have none)."""
    reads: dict[int, list[Chunk]] = {}
    for t in rnd:
        reads.setdefault(t.src, []).append(t.chunk)
    return {t.dst for t in rnd if any(_overlap(t.chunk, c) for c in reads.get(t.dst, []))}


def _overlap(a: Chunk, b: Chunk) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] < a[1] and b[0] < b[1]


def pipelined(schedule: Schedule, slices: int) -> Schedule:
    """`schedule` with every chunk cut into `slices` slices and run as a wavefront: round w holds
    step w - s of slice s, so a slice's next step reads what its previous step wrote one round
    (a slice, not the whole chunk) ago, while that is still in the cache. Right for schedules
    whose steps all move whole chunks of one partition of the buffer (ring); verify() says."""
    if slices <= 1:
        return schedule
    steps = schedule.rounds

    def part(chunk: Chunk, index: int) -> Chunk:
        lo, hi = chunk
        return lo + (hi - lo) * index // slices, lo + (hi - lo) * (index + 1) // slices

    rounds = tuple(tuple(Transfer(t.src, t.dst, part(t.chunk, index), t.reduce)
                         for index in range(slices) if 0 <= wave - index < len(steps) for t in steps[wave - index])
                   for wave in range(len(steps) + slices - 1))
    return replace(schedule, rounds=rounds)


def pushed_ahead(schedule: Schedule) -> tuple[tuple[Transfer, ...], ...]:
    """For each round, the copies of the NEXT round that their source may run at the end of this one,
    writing into the destination's buffer (a push) instead of the destination reading them in the next
    round (a pull), with the same result. An executor that reduces a chunk and pushes it on while it is
    in its registers (shm's native one, blockwise) saves a pass over the chunk and, when a round is
    left empty, its barrier: a 2-rank ring becomes one round.

    A copy t = (s -> d, X) of round k + 1 moves to round k when neither round has hazards (so in round
    k + 1 no other transfer reads d's X, which would see the new value, nor writes s's X, which must be
    final when s's round-k steps end) and, in round k, no transfer writes d's X and none reads it but
    s's own (s reads before it pushes). Pushes land before the barrier that ends round k, so round
    k + 1 starts with them in place."""
    rounds = schedule.rounds
    ahead: list[tuple[Transfer, ...]] = []
    for k, rnd in enumerate(rounds):
        nxt = rounds[k + 1] if k + 1 < len(rounds) else ()
        if not nxt or hazards(rnd) or hazards(nxt):
            ahead.append(())
            continue
        ahead.append(tuple(t for t in nxt if not t.reduce and not any(
            _overlap(u.chunk, t.chunk) and (u.dst == t.dst or (u.src == t.dst and u.dst != t.src)) for u in rnd)))
    return tuple(ahead)


def input_reads(schedule: Schedule) -> tuple[dict[Transfer, tuple[bool, bool]], ...] | None:
    """Out of place without copying the input into the working buffer first: per round, for every
    transfer, whether it reads its source's chunk and (a reduce) its destination's from that rank's
    input instead of its working buffer. True where nothing has written the chunk yet (no earlier
    round; for a destination, no earlier reduce into it in the round either, as the executors and the
    interpreter apply them in order), so it still holds what the copy would have put there; pushes
    (pushed_ahead) read what their round would have begun with, so they keep these too. None where
    that does not work: a chunk partly written, a round with hazards, or a rank whose buffer is not
    wholly written by the end (allreduce: every element of every rank is; the input is never written)."""
    written: list[list[Chunk]] = [[] for _ in range(schedule.world)]
    reads = []
    for rnd in schedule.rounds:
        if hazards(rnd):
            return None
        flags, now = {}, list(written)
        for t in rnd:  # a source is read as the round began; a destination after the round's earlier reduces into it
            src, dst = _untouched(written[t.src], t.chunk), _untouched(now[t.dst], t.chunk) if t.reduce else False
            if src is None or dst is None:
                return None
            flags[t] = (src, dst)
            now[t.dst] = _merged(now[t.dst], t.chunk)
        written = now
        reads.append(flags)
    whole = (0, schedule.count)
    return None if any(_untouched(chunks, whole) is not False for chunks in written) else tuple(reads)


def _merged(chunks: list[Chunk], chunk: Chunk) -> list[Chunk]:
    """Sorted, disjoint, non-touching `chunks` with `chunk` added (a new list: the round's reads keep the old)."""
    lo, hi = chunk
    if hi <= lo:
        return chunks
    out: list[Chunk] = []
    for a, b in chunks:
        if b < lo or a > hi:
            out.append((a, b))
        else:
            lo, hi = min(lo, a), max(hi, b)
    out.append((lo, hi))
    return sorted(out)


def _untouched(chunks: list[Chunk], chunk: Chunk) -> bool | None:
    """True when no element of `chunk` is in `chunks` (sorted, disjoint), False when all are (or it is
    empty), None when some are."""
    lo0, hi0 = chunk
    if hi0 <= lo0:
        return False  # reads nothing: either buffer will do
    covered = sum(max(0, min(hi, hi0) - max(lo, lo0)) for lo, hi in chunks)
    if covered == 0:
        return True
    return False if covered == hi0 - lo0 else None


# ---------------------------------------------------------------- the reference interpreter


REDUCERS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def run(schedule: Schedule, buffers: list[np.ndarray], op: str = "sum", check: bool = True) -> list[np.ndarray]:
    """Execute `schedule` on virtual ranks (one array each, modified in place) and return them.
    avg is sum here; the backend divides at the end, as NCCL does."""
    reducer = REDUCERS[op]
    for rnd in schedule.rounds:
        if check:
            check_round(rnd, schedule.world, schedule.count)
        # Sources are read as they were when the round began: take the slices first.
        payloads = [buffers[t.src][t.chunk[0]:t.chunk[1]].copy() for t in rnd]
        for t, data in zip(rnd, payloads):
            view = buffers[t.dst][t.chunk[0]:t.chunk[1]]
            if t.reduce:
                reducer(view, data, out=view)
            else:
                view[...] = data
    return buffers


def contributions(schedule: Schedule) -> np.ndarray:
    """Symbolic run: for every rank and element, the set of ranks whose input it holds,
    as a bit mask (uint64 for up to 64 ranks; object ints beyond). Reducing a mask
    that shares a bit with the destination (a rank counted twice) is an error."""
    world, count = schedule.world, schedule.count
    masks = initial_masks(schedule)
    for index, rnd in enumerate(schedule.rounds):
        check_round(rnd, world, count)
        payloads = [masks[t.src, t.chunk[0]:t.chunk[1]].copy() for t in rnd]
        for t, data in zip(rnd, payloads):
            view = masks[t.dst, t.chunk[0]:t.chunk[1]]
            if t.reduce:
                if np.any(view & data):
                    raise ScheduleError(f"round {index}: {t} adds a rank's contribution that rank {t.dst} already has")
                view |= data
            else:
                view[...] = data
    return masks


def _bit(rank: int, world: int):
    return np.uint64(1) << np.uint64(rank) if world <= 64 else 1 << rank


def initial_masks(schedule: Schedule) -> np.ndarray:
    """Which rank's input each element holds before the first round: 0 (nothing) where the
    content is undefined, e.g. outside a rank's own part in allgather, or off the root in
    broadcast."""
    world = schedule.world
    masks = np.zeros((world, schedule.count), dtype=np.uint64 if world <= 64 else object)
    for r in range(world):
        if schedule.collective == "allgather":
            start, stop = schedule.parts[r]
            masks[r, start:stop] = _bit(r, world)
        elif schedule.collective == "alltoall":
            for start, stop in schedule.blocks[r]:
                masks[r, start:stop] = _bit(r, world)
        elif schedule.collective != "broadcast" or r == schedule.root:
            masks[r, :] = _bit(r, world)
    return masks


def verify(schedule: Schedule) -> None:
    """Raise ScheduleError unless every element that must hold the result holds exactly
    the right ranks' inputs (each reduction counts every rank once)."""
    if schedule.collective == "alltoall":
        check_blocks(schedule)
    masks = contributions(schedule)
    world = schedule.world
    full = (1 << world) - 1
    full_mask = np.uint64(full) if world <= 64 else full
    for rank, region, want in _required(schedule, full_mask, _bit(schedule.root, world)):
        got = masks[rank, region[0]:region[1]]
        bad = np.nonzero(got != want)[0]
        if bad.size:
            raise ScheduleError(f"{schedule.name} {schedule.collective} on {world} ranks: rank {rank} element "
                                f"{region[0] + bad[0]} holds ranks {_ranks(got[bad[0]])}, expected {_ranks(want)}")


def _required(schedule: Schedule, full, root_mask):
    """(rank, chunk, mask) triples the result must satisfy."""
    whole = (0, schedule.count)
    name, world = schedule.collective, schedule.world
    if name == "allreduce":
        return [(r, whole, full) for r in range(world)]
    if name == "reduce":
        return [(schedule.root, whole, full)]
    if name == "broadcast":
        return [(r, whole, root_mask) for r in range(world)]
    if name == "reduce_scatter":
        return [(r, schedule.parts[r], full) for r in range(world)]
    if name == "allgather":
        return [(r, schedule.parts[s], _bit(s, world)) for r in range(world) for s in range(world)]
    if name == "alltoall":  # transfers keep offsets, so rank s's bit at d's blocks[s][d] is s's block for d
        return [(d, schedule.blocks[s][d], _bit(s, world)) for d in range(world) for s in range(world)]
    raise ScheduleError(f"no verification rule for {name}")


def check_blocks(schedule: Schedule) -> None:
    """An alltoall's block places: n x n blocks of one length inside the buffer, rank r's own blocks
    (blocks[r][*], its input) disjoint, and the blocks it receives (blocks[*][r], its result) disjoint."""
    n, blocks = schedule.world, schedule.blocks
    if len(blocks) != n or any(len(row) != n for row in blocks):
        raise ScheduleError(f"{schedule.name} alltoall: blocks is not {n} x {n}")
    lengths = {hi - lo for row in blocks for lo, hi in row}
    if len(lengths) != 1 or any(not 0 <= lo <= hi <= schedule.count for row in blocks for lo, hi in row):
        raise ScheduleError(f"{schedule.name} alltoall: blocks of different lengths or outside the buffer")
    for r in range(n):
        for group, what in (([blocks[r][d] for d in range(n)], "input"), ([blocks[s][r] for s in range(n)], "result")):
            ordered = sorted(group)
            if any(a[1] > b[0] for a, b in zip(ordered, ordered[1:])):
                raise ScheduleError(f"{schedule.name} alltoall: rank {r}'s {what} blocks overlap")


def _ranks(mask) -> list[int]:
    value = int(mask)
    return [r for r in range(value.bit_length()) if value >> r & 1]
