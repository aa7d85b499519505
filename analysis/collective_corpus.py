"""Published collective measurements (analysis/corpus/collectives.json) and the calibrated interval they
give `commbench predict` without a fit (docs/model.md, "`predict` without a fit").

A row is one published nccl-tests figure: a system (a preset, with the figures the source's own
description changes), nodes x GPUs, a collective, a size and the busbw (and time, where printed). Its
residual is  ln(measured time / predicted time)  of `commbench predict --algorithm auto` on that
system: 0 when the model is exact, negative when it predicts too slow. The interval of a new prediction
t is [t exp(r_lo), t exp(r_hi)] with r_lo, r_hi the split-conformal order statistics of
analysis/calibration.py (the same rule, the same level), calibrated on every row; the benchmark
(benchmarks/model_published.py --collectives) holds each source out of its own calibration.

The residuals are computed from the corpus when first asked for, not stored: a change to the cost
model changes them with it. Reading the corpus runs no code (JSON, every field checked here).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from commbench import collectives as C
from commbench.analysis import calibration
from commbench.costmodel import Hardware, HardwareError, load_hardware

COLLECTIVES_PATH = os.path.join(os.path.dirname(__file__), "corpus", "collectives.json")
ALGORITHM = "auto"  # what the rows are predicted with: predict's default
LEVEL_FIELDS = ("name", "bw_gbps", "latency_us", "links_per_node")
CONSISTENT = 0.02  # a row's printed time and busbw agree within this (both printed to 3-4 digits)


class CollectiveCorpusError(ValueError):
    """A collectives corpus that is not what this module reads (one line)."""


@dataclass(frozen=True)
class Row:
    source: str
    system: str
    nodes: int
    gpus_per_node: int
    collective: str
    nbytes: int
    size_said: str
    busbw_gbps: float
    time_us: float | None  # as printed; None: the source gives the busbw only

    @property
    def measured_us(self) -> float:
        """The printed time, else the one the busbw stands for (nccl-tests' definitions, collectives.py)."""
        if self.time_us is not None:
            return self.time_us
        world = self.nodes * self.gpus_per_node
        return self.nbytes * C.COLLECTIVES[self.collective].bus_factor(world) / self.busbw_gbps / 1e3


@dataclass(frozen=True)
class Corpus:
    sources: dict[str, dict[str, Any]]
    systems: dict[str, Hardware]
    rows: tuple[Row, ...]


def load_collectives(path: str = COLLECTIVES_PATH) -> Corpus:
    """The corpus at `path`, every field checked (CollectiveCorpusError, one line naming the file)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CollectiveCorpusError(f"{path}: {exc}") from None
    try:
        if not isinstance(data, dict) or data.get("schema") != 1:
            raise CollectiveCorpusError("not a collectives corpus of schema 1")
        sources = _objects(data, "sources")
        systems = {name: _system(name, entry) for name, entry in _objects(data, "systems").items()}
        rows = data.get("rows")
        if not isinstance(rows, list) or not rows:
            raise CollectiveCorpusError("rows must be a non-empty list")
        return Corpus(sources, systems, tuple(_row(i, row, sources, systems) for i, row in enumerate(rows)))
    except CollectiveCorpusError as exc:
        raise CollectiveCorpusError(f"{path}: {exc}") from None


def _objects(data: dict, key: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict) or not value or not all(isinstance(v, dict) for v in value.values()):
        raise CollectiveCorpusError(f"{key} must be an object of objects")
    return value


def _system(name: str, entry: dict) -> Hardware:
    """The preset the entry names, with the level figures and reduce_gbps the source's description changes."""
    try:
        hw = load_hardware(str(entry.get("preset")))
    except HardwareError as exc:
        raise CollectiveCorpusError(f"systems.{name}.preset: {exc}") from None
    levels = {}
    for level in ("intra", "inter"):
        changes = entry.get(level, {})
        if not isinstance(changes, dict) or set(changes) - set(LEVEL_FIELDS) or not all(
                _positive(v) for k, v in changes.items() if k != "name"):
            raise CollectiveCorpusError(f"systems.{name}.{level}: only positive {', '.join(LEVEL_FIELDS[1:])} "
                                        f"(and a name)")
        levels[level] = replace(getattr(hw, level), **changes)
    reduce_gbps = entry.get("reduce_gbps", hw.reduce_gbps)
    if reduce_gbps is not None and not _positive(reduce_gbps):
        raise CollectiveCorpusError(f"systems.{name}.reduce_gbps must be a positive number")
    return replace(hw, name=name, reduce_gbps=reduce_gbps, meta={"described": str(entry.get("described", ""))},
                   **levels)


def _row(i: int, row: Any, sources: dict, systems: dict) -> Row:
    where = f"rows[{i}]"
    if not isinstance(row, dict):
        raise CollectiveCorpusError(f"{where} must be an object")
    for key, known in (("source", sources), ("system", systems), ("collective", C.COLLECTIVES)):
        if row.get(key) not in known:
            raise CollectiveCorpusError(f"{where}.{key} {row.get(key)!r} is not known")
    for key in ("nodes", "gpus_per_node", "nbytes", "busbw_gbps"):
        if not _positive(row.get(key)):
            raise CollectiveCorpusError(f"{where}.{key} must be a positive number")
    if row.get("time_us") is not None and not _positive(row["time_us"]):
        raise CollectiveCorpusError(f"{where}.time_us must be a positive number or absent")
    if not row.get("size_said"):
        raise CollectiveCorpusError(f"{where}.size_said: say whether the source printed the size")
    parsed = Row(row["source"], row["system"], int(row["nodes"]), int(row["gpus_per_node"]), row["collective"],
                 int(row["nbytes"]), str(row["size_said"]), float(row["busbw_gbps"]),
                 None if row.get("time_us") is None else float(row["time_us"]))
    if parsed.time_us is not None:  # a printed time and busbw must be one measurement of nbytes (2% for rounding)
        implied = replace(parsed, time_us=None).measured_us
        if abs(implied / parsed.time_us - 1) > CONSISTENT:
            raise CollectiveCorpusError(f"{where}: time_us {parsed.time_us:g} and busbw_gbps {parsed.busbw_gbps:g} "
                                        f"disagree for nbytes {parsed.nbytes} ({implied:.4g} us)")
    return parsed


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def residuals(corpus: Corpus, predicted_us: Callable[[Hardware, Row], float]) -> dict[str, list[float]]:
    """ln(measured / predicted time) of every row, by source (calibration.leave_one_source_out's input);
    `predicted_us(hardware, row)` is what `commbench predict` prints for it (analysis/predict.py's row_us)."""
    out: dict[str, list[float]] = {}
    for row in corpus.rows:
        hw = replace(corpus.systems[row.system], ranks_per_node=row.gpus_per_node)
        out.setdefault(row.source, []).append(math.log(row.measured_us / predicted_us(hw, row)))
    return out


@lru_cache(maxsize=4)
def shipped_bounds(predicted_us: Callable[[Hardware, Row], float]) -> tuple[float, float]:
    """The log-time offsets (low, high) of the shipped corpus, every source (computed once a process)."""
    return calibration.bounds([r for values in residuals(load_collectives(), predicted_us).values() for r in values])


def time_interval_us(time_us: float, offsets: tuple[float, float]) -> tuple[float, float]:
    """The 80% interval of a predicted time without a fit: t exp(r_lo), t exp(r_hi)."""
    low, high = offsets
    return time_us * math.exp(low), time_us * math.exp(high)
