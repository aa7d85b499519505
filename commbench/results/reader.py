"""Reading records back: read_records reads a JSON Lines results file and checks every line
(check_record: declared types, the fields readers need, finite numbers, known names); a bad one is
one RecordError naming the file and the line. A truncated last line (a run killed mid-write) is
skipped with a warning."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from commbench import collectives as C
from commbench.files import MAX_FIGURE, NotJson, UnreadableFile, json_kind, lines, open_regular, parse_json
from commbench.results.records import RESULT_FIELDS, CompareRecord, Record, Result, SweepSummary
from commbench.results.step_records import LayoutRecord, ProxyResult, ScalingRecord, StepRecord, ValidateRecord
from commbench.results.times import TimesBudget, unpack_in_place

# Each record type by its `record` name: what a line is read back as (records.py, step_records.py)
RECORD_TYPES: dict[str, type[Record]] = {cls.RECORD: cls for cls in (
    Result, SweepSummary, StepRecord, ProxyResult, ValidateRecord, ScalingRecord, LayoutRecord, CompareRecord)}


class RecordError(ValueError):
    """A results file that cannot be read as records: one line naming the file and the line."""


# The fields commbench's readers (fit, report, compare) need in a record. A record may lack any other
# (a hand-made file, one converted from another tool): readers take it as its default or as null.
REQUIRED_FIELDS = {
    "result": ("collective", "backend", "library", "dtype", "placement", "world_size", "nbytes"),
    "proxy": ("kind", "model", "backend", "library", "world_size", "batch", "step_us_p50"),
    "scaling": ("model", "hardware", "batch", "compute", "gpus", "algorithm", "samples_per_s", "speedup",
                "linearity"),
    "layout": ("model", "hardware", "gpus", "layout", "step_us", "tokens_per_s", "memory_nbytes"),
}
AT_LEAST_ONE = ("world_size", "nnodes", "gpus", "nodes", "gpus_per_node", "batch")  # counts of things, >= 1
# The largest job a record may declare, in ranks (its world, nodes, GPUs): predict-scaling's own bound (its
# MAX_GPUS), far above any cluster built. Past it a record is refused: the readers' work grows with it.
MAX_RANKS = 1 << 20
RANK_COUNTS = ("world_size", "nnodes", "gpus", "nodes", "gpus_per_node")
# The most records read from one results file: a sweep writes one a point (1K-1G, 7 collectives, 2
# placements: 588), a proxy run one a step; `check` of 100,000 takes about a minute on a 2-core host.
MAX_RECORDS_PER_FILE = 100_000
PLACEMENT_NAMES = ("out-of-place", "in-place")

_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {  # an annotation's base name: test, and its name
    "None": (lambda v: v is None, "null"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "float": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "Any": (lambda v: True, "anything"),
}


def check_record(record: Any, budget: TimesBudget | None = None) -> str | None:
    """What is wrong with one record read from a file (None: nothing). Every field a record type
    declares must hold its declared type where present (numbers finite; an int field a whole number),
    the readers' fields (REQUIRED_FIELDS) must be present, counts at least 1, and a result's numbers
    non-negative, its collective, dtype and placement ones commbench knows, its packed times whole (unpacked
    here once, within `budget`: read_records passes the file's, and kept in the record as UnpackedTimes).
    The header is free-form; a record type this version does not know is left alone (a newer file)."""
    if not isinstance(record, dict):
        return f"not a JSON object but {json_kind(record)}: every line of a results file is one record"
    bad = _non_finite(record)
    if bad:
        return f"{bad[0]} is {bad[1]}: only finite numbers are accepted" if bad[1] in ("NaN", "infinite") else \
            f"{bad[0]} is {bad[1]}: no count or size of a run comes near it"
    kind = record.get("record")
    if not isinstance(kind, str):
        return "no 'record' field naming the record type" if kind is None else \
            f"'record' must be a string, not {json_kind(kind)}"
    cls = RECORD_TYPES.get(kind)
    if cls is None:
        return None
    missing = [name for name in REQUIRED_FIELDS.get(kind, ()) if name not in record]
    if missing:
        return f"{kind} record: missing field {missing[0]!r}"
    for f in dataclasses.fields(cls):
        if f.name in record:
            problem = _type_problem(str(f.type), record[f.name])
            if problem:
                return f"{kind} record: {f.name} must be {problem}, not {json_kind(record[f.name])}"
    return _value_problem(kind, record, budget)


def _type_problem(annotation: str, value: Any) -> str | None:
    """None when `value` fits the dataclass annotation (e.g. 'float | None'), else what it should be."""
    kinds = [part.strip().split("[")[0] for part in annotation.split("|")]
    if any(_KINDS[k][0](value) for k in kinds if k in _KINDS) or not any(k in _KINDS for k in kinds):
        return None
    return " or ".join(_KINDS[k][1] for k in kinds if k in _KINDS)


def _value_problem(kind: str, record: dict[str, Any], budget: TimesBudget | None) -> str | None:
    for name in AT_LEAST_ONE:
        value = record.get(name)
        if isinstance(value, (int, float)) and value < 1:
            return f"{kind} record: {name} must be at least 1, not {value!r}"
        if name in RANK_COUNTS and isinstance(value, (int, float)) and value > MAX_RANKS:
            return f"{kind} record: {name} {value!r} is above {MAX_RANKS:,d}, the largest job commbench models"
    if kind == "scaling" and not record["speedup"] > 0:
        return f"scaling record: speedup must be positive, not {record['speedup']!r}"
    if kind != "result":
        return None
    for name in RESULT_FIELDS:
        value = record.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            return f"result record: {name} cannot be negative ({value!r})"
    known = (("collective", C.COLLECTIVES), ("dtype", C.DTYPES), ("placement", PLACEMENT_NAMES))
    for name, names in known:
        if record[name] not in names:
            return f"result record: unknown {name} {record[name]!r}; known: {', '.join(names)}"
    kept = record.get("rank_times_us")  # its count of ranks, as a record's own counts (not true, not 2.5)
    ranks = kept.get("ranks") if isinstance(kept, dict) else 1
    if not (_KINDS["int"][0](ranks) and 1 <= ranks <= LARGEST_INTEGER):
        return f"result record: rank_times_us.ranks must be a whole number, at least 1, not {json_kind(ranks)}"
    if ranks > MAX_RANKS:
        return f"result record: rank_times_us.ranks {ranks:,d} is above {MAX_RANKS:,d}, the largest job commbench " \
            "models"
    if any(isinstance(record.get(k), dict) for k in ("iteration_times_us", "skipped_times_us", "rank_times_us")):
        try:  # packed: unpacked here, once, bounded, kept beside the record for the readers (UnpackedTimes)
            unpack_in_place(record, budget or TimesBudget())
        except ValueError as exc:
            return f"result record: {exc}"
    root = record.get("root")
    if root is not None and root >= record["world_size"]:
        return f"result record: root {root} is not a rank of {record['world_size']}"
    started = record.get("timed_start")
    if started is not None and not 0 <= started < LATEST_EPOCH_S:
        return f"result record: timed_start {started!r} is not a time (epoch seconds before the year 9999)"
    return None


LATEST_EPOCH_S = 253402300800  # 9999-12-31T23:59:59Z + 1 s: what time.gmtime renders everywhere


LARGEST_INTEGER = 2**63 - 1  # what a count or size is stored in (int64); beyond it, float() and numpy overflow


def _non_finite(value: Any, where: str = "") -> tuple[str, str] | None:
    """(field path, 'NaN', 'infinite', 'above 2**63' or 'above 1e30') of the first number that is not
    finite or too large for any count, size, time or rate, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the record", "NaN" if math.isnan(value) else "infinite"
    if isinstance(value, int) and abs(value) > LARGEST_INTEGER:
        return where or "the record", "above 2**63"
    if isinstance(value, float) and abs(value) > MAX_FIGURE:
        return where or "the record", "above 1e30"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def read_records(path: str, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """All records of a JSON Lines results file, each line checked (check_record), a result's packed times
    unpacked once and within one TimesBudget for the file (past it: RecordError). Blank lines are
    ignored; a truncated last line (a run killed mid-write) is skipped, with `warn(message)`; any
    other bad line, or a record past MAX_RECORDS_PER_FILE, is one RecordError: 'PATH:LINE: what is wrong'."""
    records, budget = [], TimesBudget()
    try:
        with open_regular(path) as handle:
            for number, raw in enumerate(lines(handle), 1):
                record = _parse_line(path, number, raw, warn, budget)
                if record is not None:
                    records.append(record)
                    if len(records) > MAX_RECORDS_PER_FILE:
                        raise RecordError(f"{path}:{number}: more than {MAX_RECORDS_PER_FILE:,d} records, more than "
                                          f"commbench reads from one results file: split it, or keep one run a file")
    except UnreadableFile as exc:
        raise RecordError(str(exc) if str(exc).startswith(path) else f"{path}: {exc}") from exc
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return records


def _parse_line(path: str, number: int, raw: bytes, warn: Callable[[str], None] | None,
                budget: TimesBudget) -> dict | None:
    if not raw.strip():
        return None
    try:
        record = parse_json(raw.rstrip(b"\r\n"))
    except NotJson as exc:
        if exc.decode_error and not raw.endswith(b"\n"):  # the last line, cut short
            if warn:
                warn(f"{path}:{number}: the last line is cut short (a run killed mid-write): skipped")
            return None
        raise RecordError(f"{path}:{number}: {exc}: a results file is JSON Lines, one record a line") from None
    problem = check_record(record, budget)
    if problem:
        raise RecordError(f"{path}:{number}: {problem}")
    return record
