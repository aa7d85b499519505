"""What every backend that runs commbench's own schedules (shm, p2p, sim) shares: how a
collective call maps onto a schedule's single working buffer.

A schedule works in place on one buffer per rank (commbench/schedule.py). For a
collective call with a send and a receive buffer that means:

| collective     | working buffer          | out-of-place adds (timed)                        |
|----------------|-------------------------|--------------------------------------------------|
| allreduce      | recv                    | copy send -> recv first                          |
| reduce         | recv                    | copy send -> recv first                          |
| broadcast      | recv                    | the root copies send -> recv first               |
| allgather      | recv (n parts)          | copy send -> this rank's part of recv first      |
| reduce_scatter | send (n parts)          | copy send -> a scratch buffer, run there, then   |
|                |                         | copy this rank's part -> recv                    |
| alltoall       | scratch (the schedule's | copy send's n blocks to their places             |
|                | block layout)           | (Schedule.blocks), run, copy n blocks -> recv    |

In place, the harness lays the buffers out as nccl-tests does, so the working
buffer already holds the input and (for reduce_scatter) the result lands in recv.
avg runs as sum and divides the result by n at the end, as NCCL does.
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Callable

from commbench import algorithms
from commbench.backends.base import Backend, BackendError, cpu_only
from commbench.collectives import DType
from commbench.schedule import Schedule
from commbench.topology import Topology, TopologyError, parse_topology
from commbench.tuning import TuningTable


def schedule_unsupported(backend: str, collective: str, dtype: DType, op: str | None) -> str | None:
    """Why commbench's schedules cannot run this on `backend`, or None (checked before any rank starts)."""
    if collective not in algorithms.ALGORITHMS:
        return f"no schedule for {collective} (available: {', '.join(algorithms.ALGORITHMS)}); use --backend torch"
    if op == "avg" and not dtype.is_float:
        return f"avg needs a float dtype with --backend {backend}"
    return None


def job_topology(topology_spec: str | None, launch: Any) -> Topology:
    """`--topology`, or the launcher's layout (nodes x ranks per node); a mismatch is one BackendError."""
    try:
        if topology_spec:
            return parse_topology(topology_spec, launch.world_size)
        return Topology(launch.nnodes, launch.local_world_size)
    except TopologyError as exc:
        raise BackendError(str(exc)) from exc


class ScheduleBackend(Backend):
    topology: Topology
    algorithm: str  # an algorithm name or "auto"
    dtype: DType | None = None
    _last: Schedule | None = None
    tuning: TuningTable | None = None  # what `auto` follows (use_tuning); None: the built-in rule
    _chosen_by: str | None = None  # the last schedule's chooser: a table's name, "rule", None (not auto)
    pushes = False  # runs schedule.pushed_ahead's copies as pushes (shm): `auto` may choose for that
    runs_schedules = True
    launches_async = False  # calls run to completion (the proxy hands them to a thread)
    runs_rank_groups = False  # a schedule spans the whole world (no subgroups: every rank of the job)
    makes_ddp_calls = False

    @classmethod
    def resolve_device(cls, cfg) -> tuple[str, str]:
        return cpu_only(cfg)

    @classmethod
    def default_world(cls, cfg, device: str) -> int:
        return 2

    @classmethod
    def algorithm_table(cls, collective: str) -> dict[str, Any]:
        """The algorithms this backend runs for `collective` (name -> table entry)."""
        return algorithms.available(collective, gpu=cls.needs_gpu)

    @classmethod
    def check_request(cls, cfg, library: str, collectives: list[str], dtype: DType, op: str, world: int) -> None:
        from commbench.collectives import COLLECTIVES

        for name in collectives:
            reason = schedule_unsupported(cfg.backend, name, dtype, op if COLLECTIVES[name].reduces else None) \
                if name in algorithms.ALGORITHMS else None  # no schedule at all: said below
            if reason:
                raise BackendError(f"--op {op} with --dtype {dtype.name}: {reason}")
        for name in collectives:
            table = cls.algorithm_table(name)
            if not table:
                raise BackendError(f"--backend {cfg.backend} has no algorithm for {name}; it runs "
                                   f"{', '.join(algorithms.ALGORITHMS)} (use --backend torch for {name})")
            if cfg.algorithm != "auto" and cfg.algorithm not in table:
                raise BackendError(f"no algorithm {cfg.algorithm!r} for {name}; available: {', '.join(table)}, auto")
        try:
            parse_topology(cfg.topology, world)
        except TopologyError as exc:
            raise BackendError(str(exc)) from exc

    def setup_text(self) -> str:
        return f"algorithm {self.algorithm}, topology {self.topology}"

    def header_notes(self, collectives: tuple[str, ...], placements: tuple[str, ...], hw: str | None) -> list[str]:
        return []

    def unsupported(self, collective: str, dtype: DType, op: str | None, placement: str) -> str | None:
        return schedule_unsupported(self.name, collective, dtype, op)

    def describe(self) -> dict[str, Any]:
        if self._last is None:
            return {"algorithm": None, "steps": None}
        return {"algorithm": self._last.name, "steps": self._last.steps, "tuning": self._chosen_by}

    def use_tuning(self, table: TuningTable | None) -> None:
        """The table `auto` follows from now on (None: the built-in rule only)."""
        self.tuning = table

    def schedule(self, collective: str, count: int, itemsize: int, root: int) -> Schedule:
        name, self._chosen_by = self.algorithm, None
        try:
            if name == "auto" and collective in algorithms.ALGORITHMS:
                name, self._chosen_by = algorithms.chosen_by(collective, self.topology, count * itemsize,
                                                             self.pushes, self.tuning)
            return algorithms.build(collective, name, self.topology, count, count * itemsize, root, self.pushes)
        except algorithms.AlgorithmError as exc:
            raise BackendError(str(exc)) from exc

    def prepare(self, collective: str, send: Any, recv: Any, op: str | None, root: int,
                inplace: bool) -> Callable[[], None]:
        send_count, recv_count = self.length(send), self.length(recv)
        count = send_count if collective == "reduce_scatter" else recv_count
        schedule = self.schedule(collective, count, self.itemsize(recv), root)
        self._last = schedule
        if collective == "alltoall":
            return self._alltoall_call(schedule, send, recv)
        steps: list[Callable[[], None]] = []
        working = recv
        direct = self.executor_reading(schedule, recv, send, op or "sum") \
            if not inplace and collective == "allreduce" else None
        if collective == "reduce_scatter":
            working = send if inplace else self.scratch(count, recv)
            if not inplace:
                steps.append(lambda: self.copy(working, send))
        elif not inplace and collective == "allgather":
            slot = self.rank_view(recv, lambda r: schedule.parts[r][0], send_count)
            steps.append(lambda: self.copy(slot, send))
        elif not inplace and direct is None and (collective != "broadcast" or root in self.local_ranks):
            steps.append(lambda: self.copy(recv, send, only_rank=root if collective == "broadcast" else None))
        steps.append(direct or self.executor(schedule, working, op or "sum"))
        if collective == "reduce_scatter":
            part = self.rank_view(working, lambda r: schedule.parts[r][0], recv_count)
            if op == "avg":
                steps.append(lambda: self.scale(part, 1.0 / schedule.world))
            if not inplace:
                steps.append(lambda: self.copy(recv, part))
        elif op == "avg":
            steps.append(lambda: self.scale(working, 1.0 / schedule.world))
        if len(steps) == 1:
            return steps[0]

        def call() -> None:
            for step in steps:
                step()
        return call

    def _alltoall_call(self, schedule: Schedule, send: Any, recv: Any) -> Callable[[], None]:
        """alltoall (always out of place): every block of send to its place in a scratch buffer, the
        rounds there, then the block of every source from its place to recv (the local permutation)."""
        world, (start, stop) = schedule.world, schedule.blocks[0][0]
        size, working = stop - start, self.scratch(schedule.count, recv)
        ins = [(self.rank_view(working, lambda r, d=d: schedule.blocks[r][d][0], size),
                self.rank_view(send, lambda r, d=d: d * size, size)) for d in range(world)]
        outs = [(self.rank_view(recv, lambda r, s=s: s * size, size),
                 self.rank_view(working, lambda r, s=s: schedule.blocks[s][r][0], size)) for s in range(world)]
        run = self.executor(schedule, working, "sum")

        def call() -> None:
            for dst, src in ins:
                self.copy(dst, src)
            run()
            for dst, src in outs:
                self.copy(dst, src)
        return call

    # ---------------------------------------------------------------- what each backend provides

    @abstractmethod
    def length(self, buffer: Any) -> int:
        """Elements in (each rank's part of) `buffer`."""

    @abstractmethod
    def itemsize(self, buffer: Any) -> int:
        """Bytes per element of `buffer`."""

    @abstractmethod
    def scratch(self, count: int, like: Any) -> Any:
        """A working buffer of `count` elements of `like`'s dtype, kept while the call is prepared."""

    @abstractmethod
    def copy(self, dst: Any, src: Any, only_rank: int | None = None) -> None:
        """dst[:] = src (for every local rank, or only `only_rank`)."""

    @abstractmethod
    def scale(self, buffer: Any, factor: float) -> None:
        """buffer *= factor (the avg division)."""

    @abstractmethod
    def executor(self, schedule: Schedule, working: Any, op: str) -> Callable[[], None]:
        """A zero-argument callable that runs `schedule` on `working` with reduction `op`."""

    def executor_reading(self, schedule: Schedule, working: Any, source: Any, op: str) -> Callable[[], None] | None:
        """Out of place, as `executor` but reading the input `source` where the schedule reads what a copy of
        it into `working` would hold, so that copy is not needed; None where this backend or schedule
        cannot (the copy runs first)."""
        return None
