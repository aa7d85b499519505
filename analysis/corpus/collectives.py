"""Published collective measurements (collectives.json beside this module) and the calibrated interval they
give `commbench predict` without a fit (docs/model.md, "`predict` without a fit").

A row is one published nccl-tests figure: a system (its own hardware description, or a preset where the
machine is that preset), nodes x GPUs, a collective, a size and the busbw. The size is `printed` (with
the count, type and time the source prints: the loader recomputes the busbw from them with commbench's
formula, collectives.bandwidths_gbps, and refuses a row that disagrees), `derived` (the largest size the
source's command runs: begin x factor^k <= end) or `unknown` (the row is compared with the model's
large-message busbw, where the size does not matter).

Its residual is  ln(measured time / predicted time)  of `commbench predict --algorithm auto` on that
system (for a row of unknown size: ln(predicted / measured busbw) at large messages): 0 when the model is
exact, negative when it predicts too slow. The interval of a new prediction t is [t exp(r_lo),
t exp(r_hi)] with r_lo, r_hi the split-conformal order statistics of analysis/calibration.py, calibrated
on every row that is not `beyond_nic`: a row whose busbw an algorithm NCCL may have run (tree, NVLS tree
on two nodes) can push past the NICs' rate measures that algorithm, which the model does not cost, and
is predicted and reported (benchmarks/model_published.py --collectives) but not calibrated.

The residuals are computed from the corpus when first asked for, not stored: a change to the cost
model changes them with it. Reading the corpus runs no code (JSON, every field checked here).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from commbench import collectives as C
from commbench.analysis import calibration
from commbench.analysis.corpus.files import CorpusFormatError, is_number, objects, read_json, system_hardware
from commbench.costmodel import Hardware

COLLECTIVES_PATH = os.path.join(os.path.dirname(__file__), "collectives.json")
SCHEMA = 2
ALGORITHM = "auto"  # what the rows are predicted with: predict's default
SIZE_SAID = ("printed", "derived", "unknown")
ROUNDING = 0.005  # printed busbw against the one recomputed from printed size and time (both 3-5 digits)
PEAK_SIZES = (1 << 32, 1 << 33)  # a row of unknown size: the model's busbw from its time per byte between these
NO_INTER = {"name": "none", "bw_gbps": 1e-3, "latency_us": 0.0}  # a one-node system's; its rows never cross it


class CollectiveCorpusError(CorpusFormatError):
    """A collectives corpus that is not what this module reads (one line)."""


@dataclass(frozen=True)
class Row:
    source: str
    system: str
    nodes: int
    gpus_per_node: int
    collective: str
    nbytes: int | None  # None: the source gives no size and no command that fixes it
    size_said: str  # printed, derived or unknown
    busbw_gbps: float
    time_us: float | None = None  # printed rows only
    count: int | None = None  # printed rows: nccl-tests' count column
    dtype: str | None = None  # printed rows: commbench's name of the type column
    beyond_nic: str | None = None  # why an algorithm may push the busbw past the NICs' rate; None: calibrated
    note: str = ""

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def measured_us(self) -> float:
        """The printed time, else the one the busbw stands for at nbytes (collectives.py's definitions)."""
        if self.time_us is not None:
            return self.time_us
        if self.nbytes is None:
            raise ValueError(f"{self.source}: a row of unknown size has no time")
        return self.nbytes * C.COLLECTIVES[self.collective].bus_factor(self.world) / self.busbw_gbps / 1e3


@dataclass(frozen=True)
class Corpus:
    sources: dict[str, dict[str, Any]]
    systems: dict[str, Hardware]
    rows: tuple[Row, ...]

    @property
    def calibrated_rows(self) -> tuple[Row, ...]:
        return tuple(row for row in self.rows if row.beyond_nic is None)


def load_collectives(path: str = COLLECTIVES_PATH) -> Corpus:
    """The corpus at `path`, every field checked (CollectiveCorpusError, one line naming the file)."""
    try:
        data = read_json(path)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise CollectiveCorpusError(f"not a collectives corpus of schema {SCHEMA}")
        sources = objects(data, "sources")
        _left_out(data.get("left_out", []), sources)
        one_node: set[str] = set()
        systems = {name: _system(name, entry, one_node) for name, entry in objects(data, "systems").items()}
        rows = data.get("rows")
        if not isinstance(rows, list) or not rows:
            raise CollectiveCorpusError("rows must be a non-empty list")
        parsed = tuple(_row(i, row, sources, systems, one_node) for i, row in enumerate(rows))
        unused = sorted(set(sources) - {row.source for row in parsed})
        if unused:
            raise CollectiveCorpusError(f"sources {', '.join(unused)} have no row (a source left out goes in left_out)")
        return Corpus(sources, systems, parsed)
    except CorpusFormatError as exc:
        raise CollectiveCorpusError(f"{path}: {exc}") from None


def _left_out(entries: Any, sources: dict) -> None:
    """Rows taken out of the corpus keep their source and the reason, so that they are not entered again."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) and e.get("source") and e.get("reason")
                                                for e in entries):
        raise CollectiveCorpusError("left_out must be a list of objects with a source and a reason")
    kept = sorted({e["source"] for e in entries} & set(sources))
    if kept:
        raise CollectiveCorpusError(f"left_out sources {', '.join(kept)} are also in sources")


def _system(name: str, entry: dict, one_node: set[str]) -> Hardware:
    """A preset where the machine is that preset (no figure changed), else the machine's own hardware file; a
    machine of one node (no inter level) gets a stand-in its rows never cross."""
    def own(data):
        levels = data.get("levels") if isinstance(data, dict) else None
        if not isinstance(levels, dict) or "inter" in levels:
            return data
        one_node.add(name)
        return {**data, "levels": {**levels, "inter": NO_INTER}}

    hw = system_hardware(f"systems.{name}", entry, own)
    return replace(hw, name=name, meta={"described": str(entry.get("described", ""))})


def _row(i: int, row: Any, sources: dict, systems: dict, one_node: set[str]) -> Row:
    where = f"rows[{i}]"
    if not isinstance(row, dict):
        raise CollectiveCorpusError(f"{where} must be an object")
    where = f"{where} ({row.get('source')})"
    for key, known in (("source", sources), ("system", systems), ("collective", C.COLLECTIVES),
                       ("size_said", SIZE_SAID)):
        if row.get(key) not in known:
            raise CollectiveCorpusError(f"{where}.{key} {row.get(key)!r} is not known")
    for key in ("nodes", "gpus_per_node", "busbw_gbps"):
        if not _positive(row.get(key)):
            raise CollectiveCorpusError(f"{where}.{key} must be a positive number")
    if row["system"] in one_node and row["nodes"] != 1:
        raise CollectiveCorpusError(f"{where}: system {row['system']} has no inter level, so its rows are one node")
    beyond = row.get("beyond_nic")
    if beyond is not None and (not isinstance(beyond, str) or not beyond or row["nodes"] < 2):
        raise CollectiveCorpusError(f"{where}.beyond_nic: a reason, on a row across nodes")
    parsed = Row(row["source"], row["system"], int(row["nodes"]), int(row["gpus_per_node"]), row["collective"],
                 None, row["size_said"], float(row["busbw_gbps"]), beyond_nic=beyond, note=str(row.get("note", "")))
    return {"printed": _printed, "derived": _derived, "unknown": _unknown}[parsed.size_said](where, row, parsed)


def _printed(where: str, row: dict, parsed: Row) -> Row:
    """Size, count, type and time as printed: commbench's busbw of them must be the printed busbw. An
    all_gather table read as allreduce (or a size entered as anything but the printed one) fails here."""
    for key in ("nbytes", "count", "time_us"):
        if not _positive(row.get(key)) or key != "time_us" and not isinstance(row[key], int):
            kind = "number" if key == "time_us" else "integer"
            raise CollectiveCorpusError(f"{where}.{key} must be a positive {kind} (the printed {key})")
    try:
        dtype = C.resolve_dtype(str(row.get("dtype")))
    except ValueError as exc:
        raise CollectiveCorpusError(f"{where}.dtype: {exc}") from None
    parsed = replace(parsed, nbytes=int(row["nbytes"]), count=int(row["count"]), dtype=dtype.name,
                     time_us=float(row["time_us"]))
    plan = C.plan(parsed.collective, parsed.nbytes, dtype, parsed.world)
    column = plan.count // parsed.world if C.COLLECTIVES[parsed.collective].chunked else plan.count
    if plan.nbytes != parsed.nbytes or column != parsed.count:
        raise CollectiveCorpusError(f"{where}: size {parsed.nbytes} and count {parsed.count} are not one "
                                    f"{parsed.collective} of {parsed.world} ranks in {dtype.name} (nccl-tests prints "
                                    f"count {column} for that size)")
    busbw = C.bandwidths_gbps(parsed.collective, parsed.nbytes, parsed.world, parsed.time_us)[1]
    if abs(busbw / parsed.busbw_gbps - 1) > ROUNDING:
        raise CollectiveCorpusError(f"{where}: {parsed.collective}'s busbw of size {parsed.nbytes} in "
                                    f"{parsed.time_us:g} us on {parsed.world} ranks is {busbw:.4g} GB/s, not the "
                                    f"printed {parsed.busbw_gbps:g}")
    return parsed


def _derived(where: str, row: dict, parsed: Row) -> Row:
    """The largest size the source's command runs: begin x factor^k (or begin + k x step) <= end."""
    sweep = row.get("sweep")
    if row.get("time_us") is not None or not isinstance(sweep, dict):
        raise CollectiveCorpusError(f"{where}: a derived size comes with its sweep and without a time")
    largest = sweep_largest_bytes(sweep)
    if largest is None or row.get("nbytes") != largest:
        raise CollectiveCorpusError(f"{where}.nbytes {row.get('nbytes')!r} is not the largest size of the sweep "
                                    f"{sweep} ({largest})")
    return replace(parsed, nbytes=largest)


def _unknown(where: str, row: dict, parsed: Row) -> Row:
    if any(row.get(key) is not None for key in ("nbytes", "time_us", "count")):
        raise CollectiveCorpusError(f"{where}: a row of unknown size has no nbytes, time_us or count")
    return parsed


def sweep_largest_bytes(sweep: dict) -> int | None:
    """nccl-tests' sizes are begin, then x factor (-f) or + step (-i) while <= end: the last of them.
    None for a sweep that is not one (a missing or non-positive field, a factor below 2)."""
    begin, end = sweep.get("begin_bytes"), sweep.get("end_bytes")
    factor, step = sweep.get("factor"), sweep.get("step_bytes")
    if not all(isinstance(v, int) and v > 0 for v in (begin, end)) or begin > end \
            or (factor is None) == (step is None) or not isinstance(factor or step, int) \
            or (factor is not None and factor < 2) or (step is not None and step < 1):
        return None
    if factor is not None:
        size = begin
        while size * factor <= end:
            size *= factor
        return size
    return begin + (end - begin) // step * step


def _positive(value: Any) -> bool:
    return is_number(value) and value > 0


def row_residual(corpus: Corpus, row: Row, predicted_us: Callable[[Hardware, Row], float]) -> float:
    """ln(measured / predicted time); a row of unknown size: ln(predicted / measured busbw) at large messages
    (the model's busbw from its time per byte between PEAK_SIZES: the size does not matter there)."""
    hw = corpus.systems[row.system]  # the row's node size is its topology's (predicted_us builds it)
    if row.nbytes is not None:
        return math.log(row.measured_us / predicted_us(hw, row))
    small, large = (predicted_us(hw, replace(row, nbytes=nbytes)) for nbytes in PEAK_SIZES)
    busbw = C.bandwidths_gbps(row.collective, PEAK_SIZES[1] - PEAK_SIZES[0], row.world, large - small)[1]
    return math.log(busbw / row.busbw_gbps)


def residuals(corpus: Corpus, predicted_us: Callable[[Hardware, Row], float],
              rows: tuple[Row, ...] | None = None) -> dict[str, list[float]]:
    """Each row's residual, by source, in corpus order (calibration.leave_one_source_out's input): the
    calibrated rows unless `rows` says which; `predicted_us(hardware, row)` is what `commbench predict`
    prints for it (analysis/predict.py's row_us)."""
    out: dict[str, list[float]] = {}
    for row in corpus.calibrated_rows if rows is None else rows:
        out.setdefault(row.source, []).append(row_residual(corpus, row, predicted_us))
    return out


@lru_cache(maxsize=4)
def shipped_residuals(predicted_us: Callable[[Hardware, Row], float]) -> tuple[float, ...]:
    """The log-time residuals of the shipped corpus's calibrated rows (computed once a process)."""
    return tuple(r for values in residuals(load_collectives(), predicted_us).values() for r in values)


def shipped_bounds(predicted_us: Callable[[Hardware, Row], float]) -> tuple[float, float]:
    """The log-time offsets (low, high) of the shipped corpus's calibrated rows."""
    return calibration.bounds(shipped_residuals(predicted_us))


def shipped_centre(predicted_us: Callable[[Hardware, Row], float]) -> float:
    """The log-time offset that centres a prediction without a fit: the calibrated rows' median residual, which
    lies inside shipped_bounds (calibration.centre), so the calibrated time t exp(centre) is inside its interval."""
    return calibration.centre(shipped_residuals(predicted_us))


def time_interval_us(time_us: float, offsets: tuple[float, float]) -> tuple[float, float]:
    """The 80% interval of a predicted time without a fit: t exp(r_lo), t exp(r_hi)."""
    low, high = offsets
    return time_us * math.exp(low), time_us * math.exp(high)
