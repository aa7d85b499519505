"""shm's schedule executor: a call as one flat plan of steps, run natively or in Python.

A call runs as one flat plan of steps (barriers, copies, reductions over views fixed when the call
is prepared), executed by the native executor (shm_native.c: the whole plan in one ctypes call; its
barrier spins, then hands the wait back to waits.py to block) or by the Python one below (one NumPy
call or barrier closure per step), the reference and the fallback: $COMMBENCH_SHM_EXECUTOR (native.py).
Both keep the barrier protocol (waits.py) on the same counters and give bitwise the same results.
A transfer is a pull: the destination rank reads the source's chunk straight from the source's segment
and adds it into (NumPy), or copies it into, its own buffer; nothing is copied twice. The exception is a
push (schedule.pushed_ahead): a copy the source runs into the destination's buffer at the end of the
round before, where that gives the same result; the native executor fuses a reduce with the push of
its result (one pass: a 2-rank ring reads each input once and writes each output once).

Rounds with hazards (a rank written where a peer reads it in the same round:
one-shot allreduce in place) stage the result in a private buffer and write it
back after a barrier.
"""
from __future__ import annotations

import ctypes
import functools
import time
from typing import Any, Callable

import numpy as np

from commbench.backends.base import BackendError
from commbench.backends.bfloat16 import from_float32, to_float32
from commbench.backends.shm import native
from commbench.backends.shm import plan as shm_plan
from commbench.backends.shm.segments import ShmBuffer
from commbench.backends.shm.waits import OVERSUBSCRIBED_SPIN_CHECKS, Barrier
from commbench.schedule import Schedule, Transfer, hazards, input_reads, pipelined, pushed_ahead

PIPELINE_SLICES_PER_LLC = 8  # in flight per round: ~4 slices (a reduce and a copy, 2 ranks) in the cache
_NUMPY_REDUCE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def choose_native(control, rank: int, timeout_s: float, barrier: Barrier,
                  allowed: bool) -> tuple[native.NativeExecutor | None, str, str | None, shm_plan.Chosen | None]:
    """(native state or None, which executor runs, the header's note when auto fell back to python, the plan
    it runs with); the native one runs with the planner's values (plan.py: rank 0's, on every rank, through
    the control channel `control`). `allowed`: the backend runs its calls natively when it can."""
    try:
        wanted = native.requested()
        shm_plan.override()  # a bad $COMMBENCH_SHM_PLAN: the same line on every rank, before any waits
    except ValueError as exc:
        raise BackendError(str(exc)) from exc
    if wanted == "python" or not allowed:
        return None, "python", None, None
    try:
        library, path = native.load_built()
    except native.NativeUnavailable as exc:
        library, path, why = None, None, exc
    chosen = control.broadcast_object(shm_plan.choose(path, job_timeout_s=timeout_s) if rank == 0 and path else None)
    if library is None:
        if wanted == "native":
            raise BackendError(f"${native.EXECUTOR_VAR}=native: {why}") from why
        return None, "python", f"note: shm executor python, the native fast path is unavailable here: {why}", None
    state = native.NativeExecutor(library, *barrier.native_layout(), OVERSUBSCRIBED_SPIN_CHECKS)
    chosen = chosen or shm_plan.Chosen(shm_plan.Plan(), "default: rank 0 runs no native executor")
    state.tune(chosen.plan.context_values())
    return state, "native", None, chosen


class ShmExecutor:
    """How ShmBackend runs a schedule (the backend owns one): this rank's place among the `members`,
    the buffers it reads (`peer_array(rank, buffer)`: a peer's view of a buffer), the barrier it meets
    (waits.Barrier) and the native state (None: the Python executor runs every call)."""
    # Large rings as a wavefront of LLC-sized slices (pipeline_slices): off, as measured (docs/performance.md):
    # at 256 MiB 1.05x faster once, 1.6-2.3x slower in the later runs, quiet or loaded (33 barriers per call
    # instead of 3, each a rendezvous of two ranks, and slices below the non-temporal copy threshold).
    pipeline = False

    def __init__(self, rank: int, members: list[int], peer_array: Callable[[int, ShmBuffer], np.ndarray],
                 barrier: Barrier, state: native.NativeExecutor | None, pushes: bool) -> None:
        self.rank, self.members, self._peer_array, self._barrier = rank, members, peer_array, barrier
        self.native = state  # the compiled executor's state, or None
        # Copies that a round's source can run at the end of the round before (schedule.pushed_ahead) are pushed
        # into the peer's buffer there (ShmBackend.pushes; the native executor fuses a reduce with the push of
        # its result, and a round left empty loses its barrier).
        self.pushes = pushes
        self.llc_bytes = native.llc_bytes()

    def executor(self, schedule: Schedule, working: ShmBuffer, op: str) -> Callable[[], None]:
        """The whole call as one flat plan of steps (pulls and barriers), run by the native executor
        (one ctypes call) or by the Python one (one call per step, nothing else)."""
        return self._call(self._plan(schedule, working), working, op)

    def executor_reading(self, schedule: Schedule, working: ShmBuffer, source: ShmBuffer,
                         op: str) -> Callable[[], None] | None:
        """Out of place: the plan reads each rank's input (`source`) where the working buffer would
        still hold a copy of it (schedule.input_reads), so no copy runs first (None: it would be needed)."""
        plan = self._plan(schedule, working, source)
        return None if plan is None else self._call(plan, working, op)

    def _call(self, plan: list[tuple], working: ShmBuffer, op: str) -> Callable[[], None]:
        if self.native is not None and native.unsupported(working.array.dtype, op) is None:
            # Large copies bypass the cache where the ranks' buffers do not fit in it anyway (paired against
            # Open MPI, quiet, 21:23-21:24: 16 MiB 0.84-0.96 without, 0.87-1.13 with; but at 4 MiB, where they
            # fit, streaming cost 0.99 -> 0.72, so it is only for buffers past the LLC). Out of place the ranks touch
            # twice that (inputs and outputs), but counting both cost 8 MiB 153 -> 224 us and gained nothing at
            # 4-32 MiB (three alternating sweeps each, unpaired, 2026-11-26 04:54), so the outputs alone decide.
            return self._native_call(plan, op, working.array.nbytes * len(self.members) >= self.llc_bytes)
        reduce, arrive = reducer(op, working.array.dtype), self._barrier.arrive_and_wait
        ops = tuple(arrive if step[0] == "barrier" else _python_step(reduce, step) for step in plan)

        def call() -> None:
            for operation in ops:
                operation()
        return call

    def _native_call(self, plan: list[tuple], op: str, stream: bool) -> Callable[[], None]:
        """The plan as native Ops; a barrier that outlasts the spin returns here to block (and to notice a
        dead peer or the timeout), then the call resumes at that barrier."""
        state = self.native
        ops = state.ops(plan, op, stream)
        run, ops_address, count, context = state.run, ctypes.addressof(ops), len(plan), state.address
        first, stalled, blocked = state.first_call(ops), state.stalled, state.blocked
        wait_long = self._barrier.wait_long

        def call() -> None:
            at = first()
            while at >= 0:
                started = time.perf_counter()
                wait_long(*stalled())
                blocked(time.perf_counter() - started)
                at = run(ops_address, count, at, 1, context)
        call.keep = (ops, plan)  # the Op array and the views its pointers point into live as long as the call
        return call

    def _plan(self, schedule: Schedule, working: ShmBuffer, source: ShmBuffer | None = None) -> list[tuple] | None:
        """Steps ("barrier",), ("copy", dst, src), ("reduce", out, a, b), ("push", peer's dst, src) over views
        fixed now (a push is a copy into a peer's buffer). `source`: read the input where the schedule
        reads what a copy of it would hold (None returned when that does not work for this schedule)."""
        plan: list[tuple] = [_BARRIER]  # every rank's input is in place, nobody reads the last call
        sliced = pipelined(schedule, self.pipeline_slices(schedule, working.array.itemsize))
        rounds, ahead = sliced.rounds, pushed_ahead(sliced) if self.pushes else ((),) * sliced.steps
        reads = input_reads(sliced) if source is not None else ({},) * sliced.steps
        if reads is None:
            return None
        last = len(rounds) - 1
        for index, rnd in enumerate(rounds):
            early = set(ahead[index - 1]) if index else set()
            pulls = tuple(t for t in rnd if t not in early)  # the rest ran as pushes in the round before
            if not pulls and not ahead[index]:
                continue  # every transfer of the round ran in the one before: no barrier for it (on every rank)
            steps, staged = self._round_steps(pulls, working, self._reader(working, source, reads[index]))
            after = self._reader(working, source, reads[index + 1] if index < last else {})
            pushes = [("push", self._peer_array(t.dst, working)[t.chunk[0]:t.chunk[1]], after(t, t.src))
                      for t in ahead[index] if t.src == self.rank]
            plan += [*steps, *pushes, _BARRIER, *staged]  # staged: hazard rounds write back after every peer has read
            # Whether a round needs the write-back barrier is decided from the round itself, so every rank
            # meets the same barriers even when only some stage. After the last round the next call's first
            # barrier does its work (nobody reads this call's result before it; the write-back is our own
            # buffer, which no peer reads after the barrier above).
            if hazards(rnd) and index < last:
                plan.append(_BARRIER)
        return plan

    def pipeline_slices(self, schedule: Schedule, itemsize: int) -> int:
        """Into how many slices a ring's chunks are cut (schedule.pipelined) when the ranks' buffers
        together exceed the last-level cache: a slice of 1/PIPELINE_SLICES_PER_LLC of it, so that a
        chunk a peer has just reduced is copied from the cache, not from memory (1: not cut)."""
        if not self.pipeline or schedule.name != "ring" or \
                schedule.count * itemsize * schedule.world <= self.llc_bytes:
            return 1
        largest = max(t.count for rnd in schedule.rounds for t in rnd) * itemsize
        return -(-largest // (self.llc_bytes // PIPELINE_SLICES_PER_LLC))

    def round_plan(self, rnd, working: ShmBuffer, op: str) -> tuple[list[Callable[[], Any]], list[Callable[[], Any]]]:
        """One round's steps as Python callables (the hybrid backend's executor)."""
        reduce = reducer(op, working.array.dtype)
        steps, staged = self._round_steps(rnd, working)
        return [_python_step(reduce, s) for s in steps], [_python_step(reduce, s) for s in staged]

    def _reader(self, working: ShmBuffer, source: ShmBuffer | None,
                reads: dict) -> Callable[[Transfer, int], np.ndarray]:
        """view(t, rank): the chunk of t that `rank` (t's source or destination) holds as the round begins,
        from its input where `reads` (schedule.input_reads' round) says so, else from its working buffer."""
        def view(t: Transfer, rank: int) -> np.ndarray:
            from_input = reads.get(t, (False, False))[0 if rank == t.src else 1]
            buffer = source if from_input else working
            array = buffer.array if rank == self.rank else self._peer_array(rank, buffer)
            return array[t.chunk[0]:t.chunk[1]]
        return view

    def _round_steps(self, rnd, working: ShmBuffer, view: Callable[[Transfer, int], np.ndarray] | None = None
                     ) -> tuple[list[tuple], list[tuple]]:
        """(this rank's pulls in a round, the write-backs after its barrier) as plan steps; `view`: where a
        transfer's operands are read (_reader; default the working buffers)."""
        mine = working.array
        incoming = [t for t in rnd if t.dst == self.rank]
        view = view or self._reader(working, None, {})
        if self.rank not in hazards(rnd):
            return [("reduce", mine[t.chunk[0]:t.chunk[1]], view(t, t.dst), view(t, t.src)) if t.reduce else
                    ("copy", mine[t.chunk[0]:t.chunk[1]], view(t, t.src)) for t in incoming], []
        # Stage into a private copy of my whole buffer region that this round writes.
        lo, hi = min(t.chunk[0] for t in incoming), max(t.chunk[1] for t in incoming)
        stage, region = np.empty(hi - lo, dtype=mine.dtype), mine[lo:hi]
        first = incoming[0]
        if first.reduce and first.chunk == (lo, hi):  # stage = mine op peer in one pass, not copy then reduce
            steps = [("reduce", stage, region, self._peer_array(first.src, working)[lo:hi])]
            incoming = incoming[1:]
        else:
            steps = [("copy", stage, region)]
        for t in incoming:
            dst = stage[t.chunk[0] - lo:t.chunk[1] - lo]
            steps.append(_step(dst, self._peer_array(t.src, working)[t.chunk[0]:t.chunk[1]], t.reduce))
        return steps, [("copy", region, stage)]


_BARRIER = ("barrier",)


def _step(dst: np.ndarray, src: np.ndarray, is_reduce: bool) -> tuple:
    """A pull as a plan step: dst op= src, or dst = src."""
    return ("reduce", dst, dst, src) if is_reduce else ("copy", dst, src)


def _python_step(reduce, step: tuple) -> Callable[[], Any]:
    """A plan step as one pre-built call: partials of NumPy's C functions (no Python frame per step)."""
    if step[0] in ("copy", "push"):
        return functools.partial(step[1].__setitem__, Ellipsis, step[2])
    out, a, b = step[1:]
    return functools.partial(reduce, a, b, out)


def pull(reduce, dst: np.ndarray, src: np.ndarray, is_reduce: bool) -> Callable[[], Any]:
    """One pre-built step: dst op= src, or dst = src (views fixed when the call is prepared). Partials of
    the C functions, not lambdas: no Python frame per step; dst[...] = src is NumPy's cheapest copy call
    (same dtype and shape: a plain copy)."""
    return functools.partial(reduce, dst, src, dst) if is_reduce else functools.partial(dst.__setitem__, Ellipsis, src)


def reducer(op: str, store: np.dtype) -> Callable[[np.ndarray, np.ndarray, np.ndarray], Any]:
    if store != np.uint16:
        return _NUMPY_REDUCE["sum" if op == "avg" else op]
    fn = _NUMPY_REDUCE["sum" if op == "avg" else op]

    def bf16(dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:  # NumPy has no bfloat16: widen, reduce, round
        dst[...] = from_float32(fn(to_float32(a), to_float32(b)))
    return lambda d, s, out: bf16(out, d, s)
