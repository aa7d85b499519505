"""The cost of one call: `call_us(hw, topo, collective, algorithm, nbytes, itemsize) -> (us, choice)`, the
one function every prediction (predict-scaling, predict-layout, proxy --backend sim, check) asks.

`algorithm` is a name of commbench's algorithm table (commbench/algorithms.py), or one of the names beside it:
`nccl` (algorithms.LIBRARY) is what NCCL would run for an allreduce: its own choice of ring or tree, protocol
and channels, timed by its own tuning model (nccl_tuning.py, NCCL 2.20.3), and returned as the call's
`choice`; `nccl-ring` (algorithms.LIBRARY_RING) is how `nccl` was costed before: the ring with one channel
per NIC of a node, each carrying its share of the buffer (on one node, or with one NIC, the ring); `auto` the
table's rule (algorithms.choose). An allreduce is costed by the entry's closed form where it has one (ring and
hier: O(ranks per node) work at any world size, pinned to the full schedules by tests), else its full
schedule; an all-gather or a reduce-scatter by the ring (NCCL runs both as rings, so do commbench's
schedules), the library's names with one channel per NIC of a node across nodes.
"""
from __future__ import annotations

from commbench import algorithms
from commbench.algorithms import AUTO, LIBRARY, LIBRARY_RING
from commbench.costmodel.hardware import Hardware
from commbench.costmodel.nccl_tuning import NcclChoice
from commbench.costmodel.nccl_tuning import allreduce as nccl_allreduce
from commbench.costmodel.rounds import phases_us, schedule_us, variants_us
from commbench.schedule import Phases, Schedule
from commbench.topology import Topology

# what a prediction can cost an allreduce by: the library's two names and every table entry (auto: the rule's)
ALLREDUCE_ALGORITHMS = (LIBRARY, LIBRARY_RING, *algorithms.available("allreduce", gpu=True))
# Costing an algorithm without a closed form builds its whole schedule: twoshot on 1,000 GPUs took
# 4.4 s per bucket on the 2-core CI machine (2026-11-23); 256 GPUs keep a prediction within seconds.
FULL_SCHEDULE_MAX_RANKS = 256


def call_us(hw: Hardware, topo: Topology, collective: str, algorithm: str, nbytes: int,
            itemsize: int) -> tuple[float, NcclChoice | None]:
    """One call of `collective` on `nbytes` per rank over `topo`, by `algorithm`: its predicted time (0 on one
    rank or no element: nothing to do) and what NCCL runs for it (an allreduce by `nccl`; else None).
    ValueError: an algorithm without a closed form past FULL_SCHEDULE_MAX_RANKS; AlgorithmError: no such one."""
    count = nbytes // itemsize
    if topo.world == 1 or count == 0:
        return 0.0, None
    if collective == "allreduce" and algorithm == LIBRARY:
        choice = nccl_allreduce(hw, topo, count * itemsize)
        return choice.time_us, choice
    form = call_form(hw, topo, collective, algorithm, nbytes, itemsize)
    return (phases_us(form, hw, itemsize) if isinstance(form, Phases) else schedule_us(form, topo, hw, itemsize)), None


def call_form(hw: Hardware, topo: Topology, collective: str, algorithm: str, nbytes: int,
              itemsize: int) -> Phases | Schedule | None:
    """What call_us costs a call by (None: nothing to do): an allreduce by `algorithm`'s closed form or full
    schedule (`nccl` by the library ring: the rounds a fit's figures can vary, which NCCL's model has not), an
    all-gather or a reduce-scatter by the ring, with one channel per NIC of a node for the library's names."""
    count = nbytes // itemsize
    if topo.world == 1 or count == 0:
        return None
    if collective != "allreduce":
        channels = (hw.inter.links_per_node or 1) if algorithm in (LIBRARY, LIBRARY_RING) and topo.nodes > 1 else 1
        return algorithms.entry(collective, "ring").phases(topo, count, channels)
    name = LIBRARY_RING if algorithm == LIBRARY else algorithm
    name = algorithms.choose("allreduce", topo, nbytes) if name == AUTO else name
    if name == LIBRARY_RING:
        channels = (hw.inter.links_per_node or 1) if topo.nodes > 1 else 1
        return algorithms.ring_allreduce_phases(topo, count, channels)
    entry = algorithms.entry("allreduce", name)
    if entry.phases is None and topo.world > FULL_SCHEDULE_MAX_RANKS:
        raise ValueError(f"{name} has no closed form and is costed from its full schedule, whose work grows as "
                         f"ranks^2: at most {FULL_SCHEDULE_MAX_RANKS} GPUs (ring, hier and nccl scale further)")
    return entry.phases(topo, count) if entry.phases is not None else entry.schedule(topo, count, 0)


def call_variants_us(hws: list[Hardware], topo: Topology, collective: str, algorithm: str, nbytes: int,
                     itemsize: int) -> list[float]:
    """call_form's cost on each of `hws`, hardware that differs only in its figures (a fit's resampled
    variants: rounds.variants_us), its rounds built once; `nccl`'s by the library ring, as call_form's."""
    form = call_form(hws[0], topo, collective, algorithm, nbytes, itemsize)
    return [0.0] * len(hws) if form is None else variants_us(form, topo, hws, itemsize)


def table_form(topo: Topology, collective: str, algorithm: str, count: int, nbytes: int,
               root: int = 0) -> Phases | Schedule:
    """What a measured point of a table algorithm (`auto`: the rule's choice) is costed by, as check, fit and
    report cost a sweep's record: its full schedule, the rounds that ran, on up to FULL_SCHEDULE_MAX_RANKS ranks;
    its closed form beyond (O(ranks per node) work: a 32,768-rank record's schedule held 2 x 10^9 transfers),
    the same cost when the world divides the count, at most one element a part above it otherwise. ValueError:
    past that bound, an algorithm without a closed form; AlgorithmError: no such one."""
    name = algorithms.choose(collective, topo, nbytes) if algorithm == AUTO and collective in algorithms.ALGORITHMS \
        else algorithm
    entry = algorithms.entry(collective, name)
    if topo.world <= FULL_SCHEDULE_MAX_RANKS:
        return entry.schedule(topo, count, root)
    if entry.phases is None:
        raise ValueError(f"{collective} by {name} has no closed form and is costed from its full schedule, whose "
                         f"work grows with the ranks: at most {FULL_SCHEDULE_MAX_RANKS} ranks, not {topo.world}")
    return entry.phases(topo, count)


def algorithm_us(hw: Hardware, topo: Topology, collective: str, algorithm: str, count: int, itemsize: int,
                 root: int = 0) -> float:
    """One call of a table algorithm on `count` elements (any root): by the entry's closed form where it has
    one (O(ranks per node) work at any world size), else by its full schedule."""
    entry = algorithms.entry(collective, algorithm)
    if entry.phases is not None:
        return phases_us(entry.phases(topo, count), hw, itemsize)
    return schedule_us(entry.schedule(topo, count, root), topo, hw, itemsize)
