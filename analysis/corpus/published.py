"""The corpus of published data-parallel scaling results (published.json beside this module): loaded,
checked, and turned into what a prediction needs. Reading it runs no code: it is JSON, and every
field is checked here (one CorpusError line per problem).

A row is one published (source, model, hardware, precision, batch, GPU count): the throughput at a
reference GPU count (`base_gpus`, 1 unless the source only gives whole nodes) and at `gpus`, in the
source's own unit (`unit`); `samples_per_s` turns both into samples a second for all GPUs, so the
published linearity is  rate(N) / (N / base_gpus x rate(base)).  Its hardware is the `systems` entry
(a hardware file written from the source's description, with its evidence and what was assumed),
its setup the `setups` entry of its source (the names and knobs of proxies/setups.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from commbench.analysis.corpus.files import CorpusFormatError, is_number, objects, read_json
from commbench.costmodel import Hardware, HardwareError, hardware_from_dict
from commbench.proxies.setups import SETUPS, Choice, SetupError, settle

CORPUS_PATH = os.path.join(os.path.dirname(__file__), "published.json")
UNITS = ("images/s per GPU", "images/s", "tokens/s", "wall-clock s")  # a unit starts with one of these
PRECISIONS = ("fp32", "tf32", "amp")


class CorpusError(CorpusFormatError):
    """A corpus file that is not what this module reads (one line)."""


@dataclass(frozen=True)
class Setup:
    name: str  # proxies/setups.py's name: ddp, apex, horovod, ...
    knobs: dict[str, float]  # bucket_mb, first_bucket_mb, message_size, fusion_mb, cycle_ms, accumulate
    stated_in: str  # the source's own code that states it


@dataclass(frozen=True)
class System:
    name: str
    described: str
    hardware: Hardware
    nic_class: str | None  # line rate class of the NICs ("100G", "200G", "400G"): what NIC evidence applies
    oversubscription: float | None  # the fabric's blocking factor where the source gives one (1.0: non-blocking)
    assumed: tuple[str, ...]  # figures the source does not give


@dataclass(frozen=True)
class Row:
    source: str
    table: str
    model: str
    system: str
    gpus_per_node: int
    precision: str
    batch: int
    unit: str
    base_gpus: int
    base: float
    gpus: int
    value: float
    base_no_ddp: float | None = None
    sample_tokens: int | None = None
    samples_per_run: float | None = None

    def samples_per_s(self, value: float, gpus: int) -> float:
        """The source's `value` at `gpus` GPUs as samples a second for all of them."""
        if self.unit.startswith("images/s per GPU"):
            return value * gpus
        if self.unit.startswith("tokens/s"):
            return value / self.sample_tokens
        if self.unit.startswith("wall-clock s"):
            return self.samples_per_run / value
        return value

    @property
    def base_rate(self) -> float:
        return self.samples_per_s(self.base, self.base_gpus)

    @property
    def rate(self) -> float:
        return self.samples_per_s(self.value, self.gpus)

    @property
    def linearity(self) -> float:
        """The published linearity against the row's reference count."""
        return self.rate / (self.gpus / self.base_gpus * self.base_rate)

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)


@dataclass(frozen=True)
class Corpus:
    sources: dict[str, dict[str, str]]
    systems: dict[str, System]
    setups: dict[str, Setup]
    rows: tuple[Row, ...]

    def setup(self, row: Row) -> Setup:
        return self.setups[row.source]


def load_corpus(path: str = CORPUS_PATH) -> Corpus:
    """The corpus at `path`, every field checked (CorpusError, one line naming the file and the field)."""
    try:
        return _corpus(read_json(path))
    except CorpusFormatError as exc:
        raise CorpusError(f"{path}: {exc}") from None


def _corpus(data: Any) -> Corpus:
    if not isinstance(data, dict) or data.get("schema") != 1:
        raise CorpusError("not a corpus of schema 1")
    sources = objects(data, "sources")
    systems = {name: _system(name, entry) for name, entry in objects(data, "systems").items()}
    setups = {name: _setup(name, entry) for name, entry in objects(data, "setups").items()}
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise CorpusError("rows must be a non-empty list")
    parsed = tuple(_row(i, row, sources, systems, setups) for i, row in enumerate(rows))
    return Corpus(sources, systems, setups, parsed)


def _system(name: str, entry: dict) -> System:
    try:  # a data-parallel system states its own hardware (no preset: nic_class and oversubscription go with it)
        hardware = hardware_from_dict(entry.get("hardware"), f"systems.{name}.hardware")
    except HardwareError as exc:
        raise CorpusError(str(exc)) from None
    ratio = entry.get("oversubscription")
    if ratio is not None and not (is_number(ratio) and ratio >= 1):
        raise CorpusError(f"systems.{name}.oversubscription must be a number >= 1 or null")
    nic = entry.get("nic_class")
    if nic is not None and not isinstance(nic, str):
        raise CorpusError(f"systems.{name}.nic_class must be a string or null")
    assumed = tuple(map(str, entry.get("assumed", [])))
    return System(name, str(entry.get("described", "")), hardware, nic, ratio, assumed)


def _setup(name: str, entry: dict) -> Setup:
    if entry.get("name") not in SETUPS:
        raise CorpusError(f"setups.{name}.name must be one of {', '.join(SETUPS)}")
    knobs = {k: v for k, v in entry.items() if k not in ("name", "stated_in")}
    if not all(is_number(v) and v > 0 for v in knobs.values()):
        raise CorpusError(f"setups.{name}: every knob must be a positive number")
    if not entry.get("stated_in"):
        raise CorpusError(f"setups.{name}.stated_in: say where the source's code states it")
    setup = Setup(entry["name"], knobs, str(entry["stated_in"]))
    try:
        setup_choice(setup)
    except SetupError as exc:  # a knob the entry does not take, a value out of its range
        raise CorpusError(f"setups.{name}: {exc}") from None
    return setup


def _row(i: int, row: Any, sources: dict, systems: dict, setups: dict) -> Row:
    where = f"rows[{i}]"
    if not isinstance(row, dict):
        raise CorpusError(f"{where} must be an object")
    for key, known in (("source", sources), ("system", systems)):
        if row.get(key) not in known:
            raise CorpusError(f"{where}.{key} {row.get(key)!r} is not in {key}s")
    if row["source"] not in setups:
        raise CorpusError(f"{where}: source {row['source']!r} has no entry in setups")
    if row.get("precision") not in PRECISIONS:
        raise CorpusError(f"{where}.precision must be one of {', '.join(PRECISIONS)}")
    unit = row.get("unit")
    if not isinstance(unit, str) or not unit.startswith(UNITS):
        raise CorpusError(f"{where}.unit must start with one of: {'; '.join(UNITS)}")
    fields = {k: row.get(k) for k in ("gpus_per_node", "batch", "base_gpus", "base", "gpus", "value")}
    for key, value in fields.items():
        if not (is_number(value) and value > 0):
            raise CorpusError(f"{where}.{key} must be a positive number")
    extra = {k: row.get(k) for k in ("base_no_ddp", "sample_tokens", "samples_per_run") if row.get(k) is not None}
    if not all(is_number(v) and v > 0 for v in extra.values()):
        raise CorpusError(f"{where}: base_no_ddp, sample_tokens and samples_per_run must be positive numbers")
    if unit.startswith("tokens/s") and "sample_tokens" not in extra or \
            unit.startswith("wall-clock s") and "samples_per_run" not in extra:
        raise CorpusError(f"{where}: a {unit!r} row needs sample_tokens or samples_per_run")
    if fields["gpus"] <= fields["base_gpus"]:
        raise CorpusError(f"{where}: gpus must be more than base_gpus")
    return Row(row["source"], str(row.get("table", "")), str(row.get("model", "")), row["system"],
               int(fields["gpus_per_node"]), row["precision"], int(fields["batch"]), unit, int(fields["base_gpus"]),
               float(fields["base"]), int(fields["gpus"]), float(fields["value"]), extra.get("base_no_ddp"),
               extra.get("sample_tokens"), extra.get("samples_per_run"))


def setup_choice(setup: Setup) -> Choice:
    """The setup table's entry (proxies/setups.py) with the knobs the source's code states: what its rows are
    predicted with, as `predict-scaling --setup NAME --KNOB VALUE` predicts them."""
    return settle(setup.name, dict(setup.knobs))
