"""How a Schedule becomes CUDA kernel launches: pure host logic, no GPU, no CuPy.

`--backend cuda` (sched.py) runs commbench's schedules with the kernels in cuda/.
Everything it decides before launching lives here, so that it is tested on a machine
without a GPU against the sim backend (tests/unit/backends/cuda/test_plan.py):

- `program(schedule, ranks)`: the steps one stream runs for one collective call: kernel
  launches and barriers. A round of the schedule becomes one launch of
  `schedule_round` (its transfers as `Task`s: an output range and the input ranges
  reduced into it, fused per output, cut into disjoint pieces), plus a staged
  write-back where the round reads what it writes (one-shot in place). one-shot and
  two-shot allreduce use their own kernels (cuda/allreduce.cu).
- `LaunchConfig`, `assign_blocks`, `block_span`: grid and block sizes, and which
  elements each block handles (the kernels' cb::block_span, mirrored exactly).
- `pack_round`: the entry table and input pointer table a launch reads, as the
  bytes uploaded to the GPU (`ENTRY_DTYPE` mirrors `struct RoundEntry`).
- `emulate`: runs programs on NumPy buffers through those same tables and pointers,
  block by block in any order, as the GPU would; equal to sim's result in every
  order means the tables are right and no launch races with itself.

`ranks` are the ranks whose outputs one stream computes: every rank (virtual ranks
on one GPU), the rank of one GPU (several GPUs in one process, or one process per
GPU). The steps are the same for every group, so streams meet at the same barriers.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

from commbench.schedule import REDUCERS, Schedule, Transfer, split

ENTRY_DTYPE = np.dtype([("out", "<u8"), ("count", "<i8"), ("in_offset", "<i4"), ("n_in", "<i4"),
                        ("first_block", "<i4"), ("n_blocks", "<i4")])  # struct RoundEntry, 32 bytes
WORK, STAGE = "work", "stage"  # a rank's working buffer, and its staging buffer for hazard rounds
INPUT = "input"  # out of place: a rank's input, read where the working buffer would hold a copy of it


@dataclass(frozen=True)
class LaunchConfig:
    threads: int = 512  # per block; __launch_bounds__(512) in the kernels
    pack_bytes: int = 16  # one uint4 load
    bytes_per_block: int = 64 << 10  # output bytes a block should move at least (fewer blocks for small pieces)
    max_blocks: int = 1024  # per launch: several waves on 132 SMs, bounded scheduling overhead

    def pack_elements(self, itemsize: int) -> int:
        return max(1, self.pack_bytes // itemsize)

    def blocks_for(self, nbytes: int) -> int:
        return max(1, min(self.max_blocks, math.ceil(nbytes / self.bytes_per_block)))


@dataclass(frozen=True)
class Ref:
    """Element `offset` of `rank`'s working (or staging) buffer."""
    rank: int
    buffer: str
    offset: int


@dataclass(frozen=True)
class Task:
    """out[0:count] = ins[0][0:count] op ... op ins[k-1][0:count] (a copy when k = 1)."""
    out: Ref
    ins: tuple[Ref, ...]
    count: int


@dataclass(frozen=True)
class RoundLaunch:
    tasks: tuple[Task, ...]


@dataclass(frozen=True)
class AllreduceLaunch:
    """cuda/allreduce.cu: `kernel` oneshot or twoshot (with `phase`); row y writes outs[y],
    the output of rank first_rank + y; ins are every rank's buffers, in rank order."""
    kernel: str
    phase: int
    ins: tuple[Ref, ...]
    outs: tuple[Ref, ...]
    first_rank: int
    count: int


@dataclass(frozen=True)
class Barrier:
    """Every stream of the job reaches this point before any goes on."""


Step = Union[RoundLaunch, AllreduceLaunch, Barrier]


# ---------------------------------------------------------------- rounds -> tasks


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def plan_round(rnd: Sequence[Transfer]) -> tuple[list[Task], list[Task]]:
    """(tasks, write-back) for one round. Each destination's transfers are cut at every
    chunk boundary into disjoint pieces; a piece is the copy that lands there, or the
    destination's own elements reduced with every transfer that reduces into them.
    A piece that another transfer of the round reads from this destination goes to
    the staging buffer, copied back (write-back) after a barrier."""
    reads: dict[int, list[tuple[int, int]]] = {}
    for t in rnd:
        reads.setdefault(t.src, []).append(t.chunk)
    tasks, writeback = [], []
    for dst in sorted({t.dst for t in rnd}):
        mine = [t for t in rnd if t.dst == dst]
        cuts = sorted({c for t in mine for c in t.chunk})
        for lo, hi in zip(cuts, cuts[1:]):
            covering = [t for t in mine if t.chunk[0] <= lo and hi <= t.chunk[1]]
            if not covering:
                continue
            copy = next((t for t in covering if not t.reduce), None)
            sources = (copy.src,) if copy else (dst, *(t.src for t in covering))
            staged = any(_overlaps((lo, hi), c) for c in reads.get(dst, []))
            out = Ref(dst, STAGE if staged else WORK, lo)
            tasks.append(Task(out, tuple(Ref(s, WORK, lo) for s in sources), hi - lo))
            if staged:
                writeback.append(Task(Ref(dst, WORK, lo), (Ref(dst, STAGE, lo),), hi - lo))
    return tasks, writeback


def reads_inputs(schedule: Schedule, fast_kernels: bool = True) -> bool:
    """Whether `program(..., reads_input=True)` exists: the allreduce kernels' first launch reads every
    rank's input directly, so out of place needs no copy into the output first."""
    return fast_kernels and schedule.collective == "allreduce" and schedule.name in ("oneshot", "twoshot")


def program(schedule: Schedule, ranks: Sequence[int], fast_kernels: bool = True,
            reads_input: bool = False) -> list[Step]:
    """The steps one stream runs for `schedule`, computing the outputs of `ranks`.
    Barrier first (every rank's input is ready and nobody still reads the previous
    call), after every round, and after every write-back, as the shm backend does.
    `reads_input` (where reads_inputs says so): out of place, the first launch reads INPUT."""
    if reads_input and not reads_inputs(schedule, fast_kernels):
        raise ValueError(f"{schedule.name} {schedule.collective} cannot read its inputs in place of a copy")
    if fast_kernels and schedule.collective == "allreduce" and schedule.name in ("oneshot", "twoshot"):
        return _allreduce_program(schedule, list(ranks), reads_input)
    owned = set(ranks)
    steps: list[Step] = [Barrier()]
    for rnd in schedule.rounds:
        tasks, writeback = plan_round(rnd)
        steps += [RoundLaunch(tuple(t for t in tasks if t.out.rank in owned)), Barrier()]
        if writeback:
            steps += [RoundLaunch(tuple(t for t in writeback if t.out.rank in owned)), Barrier()]
    return steps


def _allreduce_program(schedule: Schedule, ranks: list[int], reads_input: bool = False) -> list[Step]:
    """Out of place (`reads_input`), oneshot reads every input and writes each output directly: no
    copy before it, no staging and no write-back after it (in place, writing a buffer that peers
    still read needs both); twoshot's reduce-scatter reads the inputs, its allgather the outputs."""
    if ranks != list(range(ranks[0], ranks[0] + len(ranks))):
        raise ValueError(f"the allreduce kernels need consecutive ranks, got {ranks}")
    ins, count = tuple(Ref(r, WORK, 0) for r in range(schedule.world)), schedule.count
    first = tuple(Ref(r, INPUT, 0) for r in range(schedule.world)) if reads_input else ins
    outs = tuple(Ref(r, WORK, 0) for r in ranks)
    if schedule.name == "twoshot":
        return [Barrier(), AllreduceLaunch("twoshot", 0, first, outs, ranks[0], count), Barrier(),
                AllreduceLaunch("twoshot", 1, ins, outs, ranks[0], count), Barrier()]
    if reads_input:
        return [Barrier(), AllreduceLaunch("oneshot", 0, first, outs, ranks[0], count), Barrier()]
    stage = tuple(Ref(r, STAGE, 0) for r in ranks)
    writeback = tuple(Task(Ref(r, WORK, 0), (Ref(r, STAGE, 0),), count) for r in ranks)
    return [Barrier(), AllreduceLaunch("oneshot", 0, ins, stage, ranks[0], count), Barrier(),
            RoundLaunch(writeback), Barrier()]


def uses_staging(steps: Sequence[Step]) -> bool:
    """Whether any step writes a staging buffer (the backend then allocates one per rank)."""
    for step in steps:
        outs = [t.out for t in step.tasks] if isinstance(step, RoundLaunch) else \
            list(step.outs) if isinstance(step, AllreduceLaunch) else []
        if any(ref.buffer == STAGE for ref in outs):
            return True
    return False


# ---------------------------------------------------------------- launch configuration


def assign_blocks(task_bytes: Sequence[int], task_packs: Sequence[int], cfg: LaunchConfig) -> list[int]:
    """Blocks per task: the launch's budget (cfg.blocks_for its bytes) shared in proportion
    to bytes, at least one each, never more than the task has packs."""
    total = sum(task_bytes)
    budget = cfg.blocks_for(total)
    return [max(1, min(packs, budget * nbytes // max(total, 1))) for nbytes, packs in zip(task_bytes, task_packs)]


def block_span(out_address: int, count: int, n_blocks: int, block: int, itemsize: int,
               pack_bytes: int = 16) -> tuple[int, int]:
    """Elements [begin, end) that `block` of `n_blocks` handles (cb::block_span in
    cuda/common.cuh): block 0 also takes the lead before the first 16-byte boundary of
    the output, the rest is cut into equal runs of whole packs."""
    pack = max(1, pack_bytes // itemsize)
    lead = min(count, ((pack_bytes - out_address % pack_bytes) % pack_bytes) // itemsize)
    per = -(-(count - lead) // n_blocks)
    per = max(pack, -(-per // pack) * pack)
    begin = 0 if block == 0 else lead + block * per
    return min(begin, count), min(lead + (block + 1) * per, count)


def pack_round(tasks: Sequence[Task], address: Callable[[Ref], int], itemsize: int,
               cfg: LaunchConfig) -> tuple[np.ndarray, np.ndarray, int]:
    """(entries, input pointers, grid blocks) of one schedule_round launch."""
    pack = cfg.pack_elements(itemsize)
    blocks = assign_blocks([t.count * itemsize * (len(t.ins) + 1) for t in tasks],
                           [math.ceil(t.count / pack) for t in tasks], cfg)
    entries = np.zeros(len(tasks), dtype=ENTRY_DTYPE)
    inputs = np.array([address(ref) for t in tasks for ref in t.ins], dtype=np.uint64)
    first, offset = 0, 0
    for i, (task, n_blocks) in enumerate(zip(tasks, blocks)):
        entries[i] = (address(task.out), task.count, offset, len(task.ins), first, n_blocks)
        first, offset = first + n_blocks, offset + len(task.ins)
    return entries, inputs, first


def allreduce_grid(launch: AllreduceLaunch, itemsize: int, world: int, cfg: LaunchConfig) -> tuple[int, int]:
    """(blocks per row, rows) of a oneshot/twoshot launch: a row's blocks share its output."""
    per_row = launch.count if launch.kernel == "oneshot" else math.ceil(launch.count / max(world, 1))
    blocks = cfg.blocks_for(per_row * itemsize * (world + 1))
    return min(blocks, max(1, math.ceil(per_row / cfg.pack_elements(itemsize)))), len(launch.outs)


# ---------------------------------------------------------------- emulation on NumPy


class AddressSpace:
    """Fake device addresses for NumPy buffers: base(rank, buffer) is 256-byte aligned, as
    cudaMalloc's; `view(address, count)` finds the array an address points into."""

    def __init__(self, buffers: dict[tuple[int, str], np.ndarray], itemsize: int):
        self.itemsize, self._bases, self._arrays = itemsize, [], []
        base = 1 << 20
        for key in sorted(buffers):
            self._bases.append((base, key))
            self._arrays.append(buffers[key])
            base += (len(buffers[key]) * itemsize + 4096) // 256 * 256 + 256
        self._keys = {key: b for b, key in self._bases}

    def address(self, ref: Ref) -> int:
        return self._keys[(ref.rank, ref.buffer)] + ref.offset * self.itemsize

    def view(self, address: int, count: int) -> np.ndarray:
        i = bisect.bisect_right([b for b, _ in self._bases], address) - 1
        start = (address - self._bases[i][0]) // self.itemsize
        return self._arrays[i][start:start + count]


def _reduce_into(out: np.ndarray, ins: list[np.ndarray], op: str) -> None:
    acc = ins[0].copy()
    for data in ins[1:]:
        REDUCERS[op](acc, data, out=acc)
    out[...] = acc


def emulate_round(entries: np.ndarray, inputs: np.ndarray, memory: AddressSpace, op: str,
                  block_order: Sequence[int], pack_bytes: int = 16) -> None:
    """Run one schedule_round launch block by block, in `block_order`, writes visible at once."""
    firsts = list(entries["first_block"])
    for block in block_order:
        e = entries[bisect.bisect_right(firsts, block) - 1]
        out_address, count = int(e["out"]), int(e["count"])
        begin, end = block_span(out_address, count, int(e["n_blocks"]), block - int(e["first_block"]),
                                memory.itemsize, pack_bytes)
        if begin < end:
            ptrs = inputs[int(e["in_offset"]):int(e["in_offset"]) + int(e["n_in"])]
            ins = [memory.view(int(p), count)[begin:end] for p in ptrs]
            _reduce_into(memory.view(out_address, count)[begin:end], ins, op)


def emulate_allreduce(launch: AllreduceLaunch, memory: AddressSpace, op: str, world: int, cfg: LaunchConfig,
                      reverse: bool = False) -> None:
    """Run one oneshot/twoshot launch block by block (cuda/allreduce.cu, mirrored)."""
    blocks, rows = allreduce_grid(launch, memory.itemsize, world, cfg)
    ins = [memory.address(ref) for ref in launch.ins]
    order = [(y, b) for y in range(rows) for b in range(blocks)]
    for y, b in reversed(order) if reverse else order:
        out, q = memory.address(launch.outs[y]), launch.first_rank + y
        if launch.kernel == "oneshot":
            work = [(ins, 0, launch.count)]
        else:  # phase 0: my segment, from every rank; phase 1: every other segment, from its owner
            work = [(ins if launch.phase == 0 else [ins[p]], start, stop)
                    for p, (start, stop) in enumerate(split(launch.count, world)) if (launch.phase == 0) == (p == q)]
        for sources, start, stop in work:
            begin, end = block_span(out + start * memory.itemsize, stop - start, blocks, b, memory.itemsize,
                                    cfg.pack_bytes)
            views = [memory.view(p, launch.count)[start + begin:start + end] for p in sources]
            _reduce_into(memory.view(out, launch.count)[start + begin:start + end], views, op)


def emulate(programs: Sequence[Sequence[Step]], memory: AddressSpace, op: str, world: int,
            cfg: LaunchConfig = LaunchConfig(), order: str = "forward") -> None:
    """Run one program per stream in lock step (a barrier waits for all streams).
    order: forward, reverse (streams and blocks backwards) or shuffle (seeded)."""
    rng = np.random.default_rng(0)
    for index in range(len(programs[0])):
        streams = list(range(len(programs)))
        if order == "reverse":
            streams.reverse()
        for s in streams:
            step = programs[s][index]
            if isinstance(step, RoundLaunch) and step.tasks:
                entries, inputs, grid = pack_round(step.tasks, memory.address, memory.itemsize, cfg)
                blocks = list(range(grid))
                blocks = blocks[::-1] if order == "reverse" else \
                    list(rng.permutation(grid)) if order == "shuffle" else blocks
                emulate_round(entries, inputs, memory, op, blocks, cfg.pack_bytes)
            elif isinstance(step, AllreduceLaunch):
                emulate_allreduce(step, memory, op, world, cfg, reverse=order == "reverse")
