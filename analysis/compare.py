"""Compare two sweeps point by point: the regression check people run in CI (as asv / pytest-benchmark compare).

`result` records of a base and a new JSON Lines file are matched on the setup of
each point (KEY_FIELDS). Per matched point the ratio new/base of one metric
(busbw_gbps, higher is better; or time_us, lower is better) becomes a change in %
and a verdict: `regression` when worse by more than the threshold and more than the
measured noise, `improvement` when better by as much, `within noise` when the change
passes the threshold but not the noise, else `same`. The noise of a point is the
spread of its own measurements: with repeated runs of a key in a file, their robust
standard deviation (1.4826 x the median absolute deviation) over their median; with one
run, how far its iterations' p90 lies above their p50; the larger of base's and new's. Two runs of one setup on a
machine whose speed wanders are then told apart from a real change. A key measured several times in one
file (repeated runs, concatenated files) counts with the median of its values;
for an even count, the worse of the two middle values, so that busbw and time
agree with each other and with `commbench report` (busbw of the median time).
Records without a positive value of the metric (null: not timed, as the sim
backend without --hw) are skipped and counted.
"""
from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from commbench.files import shown_values
from commbench.results import CompareRecord, RecordError, ResultSink, read_records

KEY_FIELDS = ("collective", "backend", "library", "algorithm", "dtype", "op", "placement", "world_size", "nnodes",
              "nbytes")
_EPS_PCT = 1e-9  # a change exactly at the threshold is "same", whatever the float rounding


class CompareError(ValueError):
    """The two files cannot be compared (the message says why, in one line)."""


@dataclass(frozen=True)
class Metric:
    name: str  # as on the command line
    field: str  # the result field
    unit: str
    higher_is_better: bool


METRICS = {"busbw": Metric("busbw", "busbw_gbps", "GB/s", True), "time": Metric("time", "time_us", "us", False)}

Key = tuple


@dataclass(frozen=True)
class Point:
    """One point of the comparison; base or new is None when the key is in one file only."""
    key: Key
    base: float | None  # median over the base file's records of this key
    new: float | None
    base_runs: int
    new_runs: int
    verdict: str
    noise_pct: float | None = None

    def get(self, name: str) -> Any:
        return self.key[KEY_FIELDS.index(name)]

    @property
    def ratio(self) -> float | None:
        return None if self.base is None or self.new is None else self.new / self.base

    @property
    def change_pct(self) -> float | None:
        ratio = self.ratio
        return None if ratio is None else 100.0 * (ratio - 1.0)

    def label(self) -> str:
        return f"{self.get('collective')} {self.get('nbytes')} B {self.get('placement')}"


@dataclass(frozen=True)
class Comparison:
    metric: Metric
    threshold_pct: float
    points: tuple[Point, ...]  # matched in both files with a value in both, sorted
    only_base: tuple[Point, ...]
    only_new: tuple[Point, ...]
    skipped_base: int  # result records without a usable value of the metric
    skipped_new: int
    unvalued: int  # keys in both files that lack a value in one of them

    @property
    def regressions(self) -> list[Point]:
        return [p for p in self.points if p.verdict == "regression"]

    @property
    def improvements(self) -> list[Point]:
        return [p for p in self.points if p.verdict == "improvement"]

    @property
    def within_noise(self) -> list[Point]:
        return [p for p in self.points if p.verdict == "within noise"]

    @property
    def worst(self) -> Point:
        """The point that changed most for the worse (or improved least)."""
        sign = 1.0 if self.metric.higher_is_better else -1.0
        return min(self.points, key=lambda p: sign * p.change_pct)

    def rows(self) -> list[Point]:
        """Every point, compared or in one file only, in table order."""
        return sorted(self.points + self.only_base + self.only_new, key=lambda p: _sort_key(p.key))


def verdict(base: float, new: float, metric: Metric, threshold_pct: float, noise_pct: float = 0.0) -> str:
    change = 100.0 * (new / base - 1.0)
    better = change if metric.higher_is_better else -change
    if abs(better) <= threshold_pct + _EPS_PCT:
        return "same"
    if abs(better) <= noise_pct + _EPS_PCT:
        return "within noise"
    return "improvement" if better > 0 else "regression"


def noise_pct(values: list[float], spreads: list[float]) -> float:
    """A side's noise in %: of repeated runs, their robust spread (1.4826 x the median absolute
    deviation, a standard deviation that one outlier run does not inflate) over their median;
    of one run, its iterations' own spread."""
    if len(values) > 2:
        middle = statistics.median(values)
        return 100.0 * 1.4826 * statistics.median(abs(v - middle) for v in values) / middle
    if len(values) == 2:
        return 100.0 * abs(values[0] - values[1]) / statistics.mean(values)
    return 100.0 * max(spreads, default=0.0)


def compare(base_records: Iterable[dict], new_records: Iterable[dict], metric: str = "busbw",
            threshold_pct: float = 5.0, names: tuple[str, str] = ("base", "new")) -> Comparison:
    """Match the result records of two runs and judge each matched point."""
    _check_options(metric, threshold_pct)
    m = METRICS[metric]
    base_records, new_records = list(base_records), list(new_records)
    stats = [sorted({str(r.get("stat") or "mean") for r in side if isinstance(r, dict) and r.get("record") == "result"})
             for side in (base_records, new_records)]
    if stats[0] != stats[1]:  # a p50 against a mean compares two statistics, not two runs
        raise CompareError(f"{names[0]} holds {'/'.join(stats[0])} times and {names[1]} {'/'.join(stats[1])} times "
                           f"(sweep --stat): compare runs of one --stat")
    base_values, base_skipped = _group(base_records, m.field, names[0])
    new_values, new_skipped = _group(new_records, m.field, names[1])
    base_spread, new_spread = _spreads(base_records), _spreads(new_records)
    common = base_values.keys() & new_values.keys()
    if not common:
        raise CompareError(f"{names[0]} and {names[1]} have no point in common (matched on "
                           f"{', '.join(KEY_FIELDS)})")
    points, unvalued = [], 0
    for key in sorted(common, key=_sort_key):
        b, n = base_values[key], new_values[key]
        if not b or not n:
            unvalued += 1
            continue
        base, new = _median(b, m), _median(n, m)
        noise = max(noise_pct(b, base_spread.get(key, [])), noise_pct(n, new_spread.get(key, [])))
        points.append(Point(key, base, new, len(b), len(n), verdict(base, new, m, threshold_pct, noise), noise))
    if not points:
        raise CompareError(f"no point in common has {m.field} in both {names[0]} and {names[1]} "
                           f"(null: not timed, e.g. --backend sim without --hw)")
    only_base = tuple(_one_side(base_values, key, m, "only in base") for key in base_values.keys() - common)
    only_new = tuple(_one_side(new_values, key, m, "only in new") for key in new_values.keys() - common)
    return Comparison(m, float(threshold_pct), tuple(points), only_base, only_new, base_skipped, new_skipped,
                      unvalued)


def _check_options(metric: str, threshold_pct: float) -> None:
    if metric not in METRICS:
        raise CompareError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    if not isinstance(threshold_pct, (int, float)) or isinstance(threshold_pct, bool):
        raise CompareError(f"--threshold {threshold_pct!r}: must be a positive percentage")
    if not (threshold_pct > 0 and math.isfinite(threshold_pct)):
        raise CompareError(f"--threshold {threshold_pct:g}: must be a positive percentage")


def load(path: str, warn=None) -> list[dict]:
    """The records of a results file, every line checked (results.read_records), their strings as shown
    (files.shown_values, as report reads them); CompareError, one line naming the file (and line), when it
    cannot be read, a line is malformed, or it holds no result."""
    try:
        records = [shown_values(r) for r in read_records(path, warn)]
    except RecordError as exc:
        raise CompareError(str(exc)) from exc
    if not any(r["record"] == "result" for r in records):
        raise CompareError(f"{path} holds no result records (expected JSON Lines from `commbench sweep --json`)")
    return records


def _group(records: Iterable[dict], field: str, name: str) -> tuple[dict[Key, list[float]], int]:
    """Key -> the usable values of `field` (an empty list: the key is there, never with a value); skipped count."""
    values: dict[Key, list[float]] = {}
    skipped = 0
    for record in records:
        if not isinstance(record, dict) or record.get("record") != "result":
            continue
        bucket = values.setdefault(_key(record), [])
        value = record.get(field) if not record.get("wrong") else None  # a wrong result has no speed to compare
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            bucket.append(float(value))
        else:
            skipped += 1
    if not values:
        raise CompareError(f"{name} holds no result records")
    return values, skipped


def _key(record: dict) -> Key:
    return tuple(_scalar(record.get(name)) for name in KEY_FIELDS)


def _scalar(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, float)) else json.dumps(value, sort_keys=True)


# table order: one block per setup and placement (out-of-place first, as nccl-tests' columns), sizes ascending
# within it even where `auto` picks another algorithm per size
_SORT_ORDER = tuple(KEY_FIELDS.index(f) for f in ("collective", "backend", "library", "dtype", "op", "world_size",
                                                   "placement", "nbytes", "algorithm"))
_PLACEMENT_ORDER = {"out-of-place": "0", "in-place": "1"}


def _sort_key(key: Key) -> tuple:
    values = [key[i] for i in _SORT_ORDER]
    values = [_PLACEMENT_ORDER.get(v, v) if isinstance(v, str) else v for v in values]
    return tuple((v is None, type(v).__name__ if not isinstance(v, (int, float)) else "", v if v is not None else 0)
                 for v in values)


def _spreads(records: list[dict]) -> dict[Key, list[float]]:
    """Key -> each record's own spread: how far its iterations' p90 lies above their p50, relative."""
    spreads: dict[Key, list[float]] = {}
    for record in records:
        if isinstance(record, dict) and record.get("record") == "result":
            p50, p90 = record.get("p50_us"), record.get("p90_us")
            if isinstance(p50, (int, float)) and isinstance(p90, (int, float)) and p50 > 0 and p90 >= p50:
                spreads.setdefault(_key(record), []).append(p90 / p50 - 1.0)
    return spreads


def _median(values: list[float], metric: Metric) -> float:
    """The median; of an even count, the worse middle value (the slower time, the lower busbw)."""
    return statistics.median_low(values) if metric.higher_is_better else statistics.median_high(values)


def _one_side(values: dict[Key, list[float]], key: Key, metric: Metric, label: str) -> Point:
    value = _median(values[key], metric) if values[key] else None
    runs = len(values[key])
    if label == "only in base":
        return Point(key, value, None, runs, 0, label)
    return Point(key, None, value, 0, runs, label)


# ---------------------------------------------------------------- output


def to_record(point: Point, comparison: Comparison) -> CompareRecord:
    """The record of one point ("record": "compare")."""
    m = comparison.metric
    change = point.change_pct
    return CompareRecord(**dict(zip(KEY_FIELDS, point.key)), metric=m.field, higher_is_better=m.higher_is_better,
                         threshold_pct=comparison.threshold_pct, base=point.base, new=point.new,
                         base_runs=point.base_runs, new_runs=point.new_runs, ratio=point.ratio,
                         change_pct=None if change is None else round(change, 6), verdict=point.verdict,
                         noise_pct=None if point.noise_pct is None else round(point.noise_pct, 6))


def write_jsonl(comparison: Comparison, path: str, append: bool = False) -> None:
    with ResultSink(path, append=append) as sink:
        sink.write_all(to_record(point, comparison) for point in comparison.rows())


_EXTRA = ("backend", "library", "algorithm", "dtype", "op", "world_size")  # shown as columns only when they vary


def format_table(comparison: Comparison) -> list[str]:
    """The table printed on stdout: one line per point, units in the headers."""
    rows = comparison.rows()
    extra = [f for f in _EXTRA if len({p.get(f) for p in rows}) > 1]
    unit = comparison.metric.unit
    heads = [("size", "(B)", ">12"), ("collective", "", "<14"), ("placement", "", "<12")]
    heads += [(f if f != "world_size" else "ranks", "", "<10") for f in extra]
    heads += [("base", f"({unit})", ">11"), ("new", f"({unit})", ">11"), ("change", "(%)", ">8"),
              ("noise", "(%)", ">7"), ("verdict", "", "<12")]
    lines = [_line([h for h, _, _ in heads], heads), _line([u for _, u, _ in heads], heads)]
    for p in rows:
        change = "-" if p.change_pct is None else f"{p.change_pct:+.1f}"
        cells = [str(p.get("nbytes")), str(p.get("collective")), str(p.get("placement"))]
        cells += [str(p.get(f)) if p.get(f) is not None else "-" for f in extra]
        noise = "-" if p.noise_pct is None else f"{p.noise_pct:.1f}"
        cells += [_number(p.base), _number(p.new), change, noise, p.verdict]
        lines.append(" " + _line(cells, heads)[1:])
    return lines


def describe_setup(comparison: Comparison) -> str:
    """The key fields that are the same in every row, e.g. 'torch/gloo, float32 sum, 2 ranks'."""
    rows = comparison.rows()
    same = {f: rows[0].get(f) for f in _EXTRA if len({p.get(f) for p in rows}) == 1}
    parts = []
    if "backend" in same and "library" in same:
        algo = f"/{same['algorithm']}" if same.get("algorithm") else ""
        parts.append(f"{same['backend']}/{same['library']}{algo}")
    if "dtype" in same:
        parts.append(f"{same['dtype']} {same['op']}" if same.get("op") else str(same["dtype"]))
    if "world_size" in same:
        parts.append(f"{same['world_size']} ranks")
    return ", ".join(parts)


def summary_line(comparison: Comparison) -> str:
    c = comparison
    worst = c.worst
    line = (f"# compared {len(c.points)} points ({c.metric.field}, threshold {c.threshold_pct:g}%): "
            f"{len(c.regressions)} regressions, {len(c.improvements)} improvements, "
            f"{len(c.within_noise)} within noise, "
            f"worst {worst.change_pct:+.1f}% ({worst.label()})")
    extras = []
    if c.only_base or c.only_new:
        extras.append(f"{len(c.only_base)} only in base, {len(c.only_new)} only in new")
    if c.skipped_base or c.skipped_new:
        extras.append(f"skipped {c.skipped_base} base and {c.skipped_new} new records without {c.metric.field}")
    return line + ("; " + "; ".join(extras) if extras else "")


def _line(cells: list[str], heads: list[tuple[str, str, str]]) -> str:
    return "#" + " ".join(f"{cell:{spec}}" for cell, (_, _, spec) in zip(cells, heads)).rstrip()


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"
