"""Tuning tables: which algorithm `auto` runs, per backend and device, as a measurement found.

A table holds, for one backend and library (e.g. cuda / cuda-virtual, shm / shm), rows of
(collective, world size, nodes, sizes up to `up_to_nbytes`) -> algorithm. `commbench tune`
writes one from paired sweeps of every algorithm (commands/tune.py); `--tuning FILE` uses it;
commbench ships tables for what has been measured (commbench/presets/tuning/*.json, each naming
the run it comes from). Where no row matches (another world size, another collective), the
built-in rule in algorithms.choose decides, and a record says which one chose ("rule", or the
table's name).

The file is JSON, read as data (never run):

    {"format": "commbench-tuning/1", "name": "...", "backend": "cuda", "library": "cuda-virtual",
     "source": "what measured it (command, machine, date)",
     "rows": [{"collective": "allreduce", "world": 8, "nodes": 1, "up_to_nbytes": 131071,
               "algorithm": "oneshot"}, ... {"up_to_nbytes": null, ...}]}

`world` or `nodes` null: any. Rows of one collective and shape are read in size order; a size
above every bound of a shape's rows takes its last row (null: no bound).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from commbench.files import NotJson, parse_json

FORMAT = "commbench-tuning/1"
RULE = "rule"  # what a record says when the built-in rule chose
PRESETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets", "tuning")


class TuningError(ValueError):
    """A tuning file that cannot be used: one line naming the file and the problem."""


@dataclass(frozen=True)
class TuningRow:
    collective: str
    world: int | None
    nodes: int | None
    up_to_nbytes: int | None  # inclusive upper bound; None: every larger size
    algorithm: str


@dataclass(frozen=True)
class TuningTable:
    name: str
    backend: str
    library: str
    source: str
    rows: tuple[TuningRow, ...]

    def lookup(self, collective: str, world: int, nodes: int, nbytes: int) -> str | None:
        """The algorithm for this point, or None where no row's shape matches."""
        rows = [r for r in self.rows if r.collective == collective and r.world in (None, world)
                and r.nodes in (None, nodes)]
        if not rows:
            return None
        exact = [r for r in rows if r.world == world] or rows  # a row for this world size beats a wildcard
        ordered = sorted(exact, key=lambda r: float("inf") if r.up_to_nbytes is None else r.up_to_nbytes)
        return next((r.algorithm for r in ordered if r.up_to_nbytes is None or nbytes <= r.up_to_nbytes),
                    ordered[-1].algorithm)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "name": self.name, "backend": self.backend, "library": self.library,
                           "source": self.source, "rows": [asdict(r) for r in self.rows]}, indent=1) + "\n"


def _int_or_none(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TuningError(f"{what} must be a non-negative integer or null, not {value!r}")
    return value


def parse(text: str, where: str) -> TuningTable:
    """A table from its JSON text; TuningError (one line naming `where`) if it is not one."""
    try:
        data = parse_json(text)  # nesting too deep, a huge integer: one line too
    except NotJson as exc:
        raise TuningError(f"{where}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TuningError(f"{where}: not a tuning file (its \"format\" is not {FORMAT!r}; commbench tune writes one)")
    try:
        rows = tuple(TuningRow(str(r["collective"]), _int_or_none(r.get("world"), "world"),
                               _int_or_none(r.get("nodes"), "nodes"),
                               _int_or_none(r.get("up_to_nbytes"), "up_to_nbytes"), str(r["algorithm"]))
                     for r in data["rows"])
        return TuningTable(str(data.get("name") or os.path.basename(where)), str(data["backend"]),
                           str(data["library"]), str(data.get("source", "")), rows)
    except (KeyError, TypeError) as exc:
        raise TuningError(f"{where}: a tuning file needs backend, library and rows of collective and algorithm "
                          f"(missing or wrong: {exc})") from None
    except TuningError as exc:
        raise TuningError(f"{where}: {exc}") from None


def load(path: str) -> TuningTable:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(1 << 22)
    except OSError as exc:
        raise TuningError(f"--tuning {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise TuningError(f"--tuning {path}: not a text file") from None
    return parse(text, path)


def shipped(backend: str, library: str, folder: str = PRESETS) -> TuningTable | None:
    """The table commbench ships for this backend and library, if one was measured."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except OSError:
        return None
    for name in names:
        with open(os.path.join(folder, name), encoding="utf-8") as handle:
            table = parse(handle.read(), name)
        if table.backend == backend and table.library == library:
            return table
    return None


def for_backend(path: str | None, backend: str, library: str) -> TuningTable | None:
    """The table `auto` follows: --tuning's file (which must be for this backend), else the shipped one."""
    if path is None:
        return shipped(backend, library)
    table = load(path)
    if table.backend != backend:
        raise TuningError(f"--tuning {path} was measured on --backend {table.backend} ({table.library}), "
                          f"not --backend {backend}")
    return table


def rows_from_winners(collective: str, world: int, nodes: int, winners: list[tuple[int, str]]) -> tuple[TuningRow, ...]:
    """Rows from (size, fastest algorithm) pairs: each run of sizes with one winner is a row up to its
    largest size; the last row has no bound."""
    rows: list[TuningRow] = []
    for index, (nbytes, algorithm) in enumerate(sorted(winners)):
        last = index == len(winners) - 1
        if rows and rows[-1].algorithm == algorithm:
            rows[-1] = TuningRow(collective, world, nodes, None if last else nbytes, algorithm)
        else:
            rows.append(TuningRow(collective, world, nodes, None if last else nbytes, algorithm))
    return tuple(rows)
