"""commbench's collective algorithms: the one table of them (`TABLE`) that every other module reads, and
`auto`'s choice among them. Each is a function (topology, count) -> Schedule, built in
commbench/algorithm_builds.py (all-to-all's in commbench/alltoall.py) and named here.

Every schedule (all-to-all's in commbench/alltoall.py) is runnable (shm, p2p, hybrid, sim, cuda),
checked (schedule.verify) and costed (the analytic model). An entry (`Algorithm`) says its collective,
whether only the GPU kernels run it (`gpu_only`: twoshot), whether a library (gloo, NCCL) runs it for its
collective (`library`: the model and the fit cost libraries by it), and its closed form for costing at any
scale (`phases`, optional; tests pin it to the full schedule). docs/algorithms.md: each one's traffic, steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from commbench.algorithm_builds import (
    binomial_allreduce,
    chain_broadcast,
    chain_reduce,
    hier_allreduce,
    hier_allreduce_phases,
    oneshot_allreduce,
    rhd_allreduce,
    ring_allgather,
    ring_allgather_phases,
    ring_allreduce,
    ring_allreduce_phases,
    ring_reduce_scatter,
    ring_reduce_scatter_phases,
    tree_allreduce,
    twoshot_allreduce,
)
from commbench.alltoall import ALLTOALL, choose_alltoall
from commbench.collectives import COLLECTIVES
from commbench.schedule import Phases, Schedule
from commbench.topology import Topology
from commbench.tuning import RULE, TuningTable

# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Algorithm:
    """One entry of the table: an algorithm of one collective."""
    name: str
    collective: str
    build: Callable[..., Schedule]  # (topology, count), or (topology, count, root) for a rooted collective
    gpu_only: bool = False  # only --backend cuda runs it (its own kernels); the model and the verifier take it too
    library: bool = False  # what a library (gloo, NCCL) runs for this collective: libraries are costed as it
    phases: Callable[[Topology, int], Phases] | None = None  # its closed form, for costing at any scale

    def schedule(self, topo: Topology, count: int, root: int = 0) -> Schedule:
        return self.build(topo, count, root) if COLLECTIVES[self.collective].rooted else self.build(topo, count)


def _by_collective(*entries: Algorithm) -> dict[str, dict[str, Algorithm]]:
    table: dict[str, dict[str, Algorithm]] = {}
    for e in entries:
        table.setdefault(e.collective, {})[e.name] = e
    return table


TABLE: dict[str, dict[str, Algorithm]] = _by_collective(  # collective -> name -> entry, every algorithm once
    Algorithm("ring", "allreduce", ring_allreduce, library=True, phases=ring_allreduce_phases),
    Algorithm("hier", "allreduce", hier_allreduce, phases=hier_allreduce_phases),
    Algorithm("tree", "allreduce", tree_allreduce),
    Algorithm("rhd", "allreduce", rhd_allreduce),
    Algorithm("oneshot", "allreduce", oneshot_allreduce),
    Algorithm("binomial", "allreduce", binomial_allreduce),
    Algorithm("twoshot", "allreduce", twoshot_allreduce, gpu_only=True),
    Algorithm("ring", "allgather", ring_allgather, library=True, phases=ring_allgather_phases),
    Algorithm("ring", "reduce_scatter", ring_reduce_scatter, library=True, phases=ring_reduce_scatter_phases),
    Algorithm("chain", "broadcast", chain_broadcast, library=True),
    Algorithm("chain", "reduce", chain_reduce, library=True),
    *(Algorithm(name, "alltoall", build) for name, build in ALLTOALL.items()),  # pairwise, bruck, hier
)

# Names a prediction costs a call by beside the table's (commbench/costmodel/call.py): what the library (DDP's
# NCCL) runs, by NCCL's tuning model; its ring, one channel per NIC of a node (`nccl` before); the rule's choice.
LIBRARY, LIBRARY_RING, AUTO = "nccl", "nccl-ring", "auto"


def listing() -> str:
    """The table in one line, for help texts: each list of names with the collectives it serves."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for collective, entries in TABLE.items():
        names = tuple(f"{name} (cuda only)" if e.gpu_only else name for name, e in entries.items())
        groups.setdefault(names, []).append(collective)
    return "; ".join(f"{', '.join(names)} ({', '.join(collectives)})" for names, collectives in groups.items())


def available(collective: str, gpu: bool = False) -> dict[str, Algorithm]:
    """The algorithms a schedule backend runs for `collective` (empty: none), in table order:
    every entry but the GPU-only ones, which `gpu` (--backend cuda) adds."""
    return {name: e for name, e in TABLE.get(collective, {}).items() if gpu or not e.gpu_only}


# collective -> name -> builder, GPU-only entries left out: what the CPU schedule backends run
ALGORITHMS: dict[str, dict[str, Callable[..., Schedule]]] = {
    c: {name: e.build for name, e in available(c).items()} for c in TABLE if available(c)}

# collective -> the algorithm a library runs for it (fit and report model library sweeps as this)
LIBRARY_ALGORITHM: dict[str, str] = {c: name for c, entries in TABLE.items() for name, e in entries.items()
                                     if e.library}

ONESHOT_MAX_BYTES = 64 << 10  # below this, one step beats 2(n-1) steps (docs/algorithms.md)
ONESHOT_MAX_RANKS = 8


def chosen_by(collective: str, topo: Topology, nbytes: int, pushes: bool = False,
              tuning: TuningTable | None = None) -> tuple[str, str]:
    """(algorithm, what chose it): the tuning table's row for this point (its name), else the rule (RULE)."""
    if tuning is not None:
        name = tuning.lookup(collective, topo.world, topo.nodes, nbytes)
        if name is not None:
            entry(collective, name)  # a table naming an algorithm there is not: one AlgorithmError
            return name, tuning.name
    return choose(collective, topo, nbytes, pushes), RULE


def choose(collective: str, topo: Topology, nbytes: int, pushes: bool = False,
           tuning: TuningTable | None = None) -> str:
    """`auto`: `tuning`'s row for this point if any (chosen_by), else the rule: small allreduce oneshot
    on 2-8 ranks, rhd on more; hier across nodes; else ring; alltoall: choose_alltoall; others their one
    algorithm (docs/algorithms.md). `pushes` (the executor pushes: a 2-rank ring is one round): ring on 2 ranks."""
    if tuning is not None:
        return chosen_by(collective, topo, nbytes, pushes, tuning)[0]
    table = ALGORITHMS.get(collective)
    if not table:
        raise KeyError(collective)
    if collective != "allreduce":
        return choose_alltoall(topo) if collective == "alltoall" else next(iter(table))
    if pushes and topo.world == 2:
        return "ring"
    if nbytes <= ONESHOT_MAX_BYTES and topo.world > 1:
        return "oneshot" if topo.world <= ONESHOT_MAX_RANKS else "rhd"
    if topo.nodes > 1 and topo.ranks_per_node > 1:
        return "hier"
    return "ring"


class AlgorithmError(ValueError):
    """An algorithm that does not exist for a collective."""


def entry(collective: str, name: str) -> Algorithm:
    """The table entry of algorithm `name` for `collective`, or one AlgorithmError saying what there is."""
    entries = TABLE.get(collective, {})
    if name not in entries:
        if not entries:
            raise AlgorithmError(f"no algorithm for {collective} (commbench's schedules cover "
                                 f"{', '.join(TABLE)}; use --backend torch for {collective})")
        raise AlgorithmError(f"no algorithm {name!r} for {collective}; available: {', '.join(entries)}, auto")
    return entries[name]


def build(collective: str, algorithm: str, topo: Topology, count: int, nbytes: int, root: int = 0,
          pushes: bool = False, tuning: TuningTable | None = None) -> Schedule:
    """The Schedule of `algorithm` (or the `auto` choice, `pushes` and `tuning` as choose's) for `collective`:
    any entry, GPU-only ones included (which backend may run it is `available`'s question, asked before)."""
    name = choose(collective, topo, nbytes, pushes, tuning) if algorithm == AUTO and collective in ALGORITHMS \
        else algorithm
    return entry(collective, name).schedule(topo, count, root)
