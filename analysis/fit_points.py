"""What a fit reads of a results file (analysis/fit.py fits them): the measured points it can use, each rebuilt
as the Schedule that ran it (commbench's own algorithm, or the ring a library runs) and counted as features,
[1, intra rounds, inter rounds, intra bytes, inter bytes] on each round's busiest resource; which setup's
points a fit takes; FitError where the records cannot support one. check.py and intervals.py cost their points
the same way."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from commbench.algorithms import LIBRARY_ALGORITHM
from commbench.collectives import DTYPES
from commbench.costmodel import link_loads, table_form, working_set_bytes
from commbench.schedule import Phases, Schedule
from commbench.topology import Topology


class FitError(ValueError):
    """The results cannot support a fit (the message says which points are missing)."""


@dataclass(frozen=True)
class Point:
    record: dict
    topo: Topology
    schedule: Schedule | Phases  # what it is costed by (schedule_for)
    features: np.ndarray  # [1, rounds_intra, rounds_inter, bytes_intra, bytes_inter]
    working_set: int  # bytes of every local rank's buffer (what competes for the caches)


def setup_of(record: dict) -> str:
    """The name of what ran a point: backend/library/algorithm."""
    return "/".join(str(x) for x in (record["backend"], record["library"], record.get("algorithm") or "-"))


def backend_of(setup: str) -> str:
    return setup.rsplit("/", 1)[0]


def setups_name(chosen: list[dict]) -> str:
    """backend/library/algorithm, the algorithms joined by + when `auto` chose several."""
    algorithms = sorted({r.get("algorithm") or "-" for r in chosen})
    return f"{backend_of(setup_of(chosen[0]))}/{'+'.join(algorithms)}"


def schedule_for(record: dict) -> tuple[Topology, Schedule | Phases]:
    """The topology a result record ran on, and what its point is costed by (costmodel.table_form: the schedule
    that ran it, or past FULL_SCHEDULE_MAX_RANKS ranks its closed form); FitError, naming the point, when none
    models it."""
    world, nodes = int(record["world_size"]), int(record.get("nnodes") or 1)
    topo = Topology(nodes, world // nodes) if world % nodes == 0 else Topology(1, world)
    name = record.get("algorithm") or LIBRARY_ALGORITHM.get(record["collective"])
    if name is None:
        raise FitError(f"no schedule models {record['collective']}")
    root = record.get("root") or 0
    if record.get("count") is None:
        raise FitError(f"the {record['collective']} point of {record['nbytes']} bytes ({setup_of(record)}) has no "
                       "count: a fit needs the element count of each point")
    try:
        return topo, table_form(topo, record["collective"], name, int(record["count"]), int(record["nbytes"]), root)
    except (ValueError, LookupError, ZeroDivisionError) as exc:
        raise FitError(f"cannot model the {record['collective']} point of {record['nbytes']} bytes on {world} ranks "
                       f"({setup_of(record)}): {exc}") from exc


def features(form: Schedule | Phases, topo: Topology, itemsize: int) -> np.ndarray:
    """[1, intra rounds, inter rounds, intra bytes, inter bytes] on each round's busiest resource (a closed
    form's rounds times their repeats, on its own topology)."""
    out = np.zeros(5)
    out[0] = 1.0
    rounds = form.rounds if isinstance(form, Phases) else ((rnd, 1) for rnd in form.rounds)
    topo = form.topology if isinstance(form, Phases) else topo
    for rnd, repeats in rounds:
        loads = link_loads(rnd, topo, itemsize)  # per rank and level: NIC sharing is not fitted
        level = 1 if any(inter for inter, _, _ in loads.values()) else 0
        out[1 + level] += repeats
        out[3 + level] += repeats * max(total for inter, total, _ in loads.values() if inter == bool(level))
    return out


def usable(records: list[dict]) -> list[dict]:
    """Measured, checked-clean, timed result records (in-place where the collective has it)."""
    results = [r for r in records if r.get("record") == "result" and r.get("kind", "measured") == "measured"
               and r.get("time_us") and (r.get("wrong") in (0, None))]
    in_place = {(r["collective"], r["backend"]) for r in results if r["placement"] == "in-place"}
    return [r for r in results if r["placement"] == "in-place" or (r["collective"], r["backend"]) not in in_place]


def points(records: list[dict]) -> list[Point]:
    out = []
    for r in records:
        if r["collective"] not in LIBRARY_ALGORITHM:
            continue
        topo, schedule = schedule_for(r)
        itemsize = DTYPES[r["dtype"]].itemsize
        out.append(Point(r, topo, schedule, features(schedule, topo, itemsize),
                         working_set_bytes(schedule.count, itemsize, topo)))
    return out


def select(results: list[dict], setup: str | None) -> list[dict]:
    """The points to fit: all of one backend/library (whatever algorithms `auto` chose per size: each
    point is rebuilt as the schedule that ran it, and the link figures are the same), or `setup`:
    BACKEND/LIBRARY/ALGORITHM, or BACKEND/LIBRARY for all of its algorithms."""
    setups = Counter(setup_of(r) for r in results)
    if setup is None:
        if len({backend_of(s) for s in setups}) > 1:
            listing = ", ".join(f"{s} ({n} points)" for s, n in setups.most_common())
            raise FitError(f"the results hold several setups: {listing}; choose one with --setup")
        return results
    chosen = [r for r in results if setup in (setup_of(r), backend_of(setup_of(r)))]
    if not chosen:
        raise FitError(f"no measured points for setup {setup!r}; found: {', '.join(setups) or 'none'}")
    return chosen
