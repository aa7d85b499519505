"""The raw per-iteration times a result keeps beside its percentiles: packed when written
(pack_times: a plain list up to RAW_TIMES_INLINE_MAX values, float32-zlib-base64 beyond), unpacked
and bounded when read (raw_times), so any statistic can be recomputed after the run. A file is read with
one TimesBudget: its records' packed times are unpacked once (unpack_in_place) and in all at most
MAX_RAW_TIMES_PER_FILE, whatever a small file of compressed zeros declares."""
from __future__ import annotations

import base64
import zlib
from typing import Any

import numpy as np

from commbench.files import json_kind, parse_json

RAW_TIMES_INLINE_MAX = 64  # up to this many per-iteration times stay a plain JSON list; more are packed
RAW_TIMES_ENCODING = "float32-zlib-base64"


def pack_times(per_iteration_us: Any) -> list[float] | dict[str, Any] | None:
    """What a record keeps of its per-iteration times: up to RAW_TIMES_INLINE_MAX finite values as a plain
    list (exact), more as little-endian float32, zlib-compressed, base64 (about 4 bytes a value; float32
    keeps 7 significant digits); None when nothing was timed."""
    if per_iteration_us is None:
        return None
    values = np.asarray(per_iteration_us, dtype=float).ravel()
    if values.size == 0:
        return None
    if values.size <= RAW_TIMES_INLINE_MAX and np.isfinite(values).all():
        return [float(v) for v in values]
    data = zlib.compress(values.astype("<f4").tobytes(), 6)
    return {"encoding": RAW_TIMES_ENCODING, "count": int(values.size), "data": base64.b64encode(data).decode("ascii")}


MAX_RAW_TIMES = 10**7  # --iters' own bound: a packed record never holds more (40 MB unpacked)
# The most packed per-iteration times one file is read with, all its records together: three points at
# --iters' own bound (a default sweep keeps at most 1,000 a point). A few kilobytes of zlib-compressed zeros
# declare 10,000,000 values; 100 such records made `check` spend minutes unpacking (issue 32).
MAX_RAW_TIMES_PER_FILE = 3 * MAX_RAW_TIMES


class TimesBudget:
    """What one read of a file may still unpack: each packed record's declared count is taken from it
    before its data is inflated, and a record past it is a ValueError naming the bound."""

    def __init__(self, limit: int = MAX_RAW_TIMES_PER_FILE):
        self.limit, self.left = limit, limit

    def take(self, count: int) -> None:
        if count > self.left:
            raise ValueError(f"iteration_times_us: the file's records declare more than {self.limit:,d} per-iteration "
                             f"times in all, more than commbench reads from one file (a sweep keeps at most "
                             f"{MAX_RAW_TIMES:,d} a point): split the file, or keep fewer iterations")
        self.left -= count


class UnpackedTimes(dict):
    """A record's packed times as read from a file: the same keys (so it is written back as it was read),
    and the values unpacked once when the file was checked (`float32`, as stored), for raw_times."""

    def __init__(self, packed: dict[str, Any], values: np.ndarray):
        super().__init__(packed)
        self.values = values


def unpack_in_place(record: dict[str, Any], budget: TimesBudget) -> None:
    """Unpack a record's packed times once, within `budget`, keeping them beside it (UnpackedTimes), so a
    reader's raw_times inflates nothing again. ValueError as raw_times, or past the budget."""
    for holder, key in ((record, "iteration_times_us"), (record, "skipped_times_us"),
                        (record.get("rank_times_us") or {}, "times_us")):  # every packed field, in one budget
        packed = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(packed, dict) and not isinstance(packed, UnpackedTimes):
            holder[key] = UnpackedTimes(packed, _unpack(packed, budget))
        elif isinstance(packed, list):
            budget.take(len(packed))
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in packed):
                raise ValueError(f"{key} holds something other than numbers")


def raw_times(record: Any) -> np.ndarray:
    """The per-iteration times (us) a result keeps, from a record dict (JSON Lines or a CSV row) or a
    Result, in iteration order; empty when it keeps none (a file written before they were kept, a point
    not timed, a prediction). ValueError for an encoding this version does not know."""
    packed = record.get("iteration_times_us") if isinstance(record, dict) else getattr(record, "iteration_times_us",
                                                                                          None)
    if isinstance(packed, str):  # a CSV cell holds the JSON form
        packed = parse_json(packed) if packed.strip() else None
    if packed is None:
        return np.empty(0)
    if isinstance(packed, list):
        return np.asarray(packed, dtype=float)
    if isinstance(packed, UnpackedTimes):  # read_records unpacked it already
        return packed.values.astype(float)
    return _unpack(packed, TimesBudget(MAX_RAW_TIMES)).astype(float)


def _unpack(packed: Any, budget: TimesBudget) -> np.ndarray:
    """A packed form's values as stored (float32), its count taken from `budget` before anything is inflated."""
    if not isinstance(packed, dict) or packed.get("encoding") != RAW_TIMES_ENCODING:
        what = packed.get("encoding") if isinstance(packed, dict) else packed
        raise ValueError(f"iteration_times_us: unknown encoding {what!r}")
    count, data = packed.get("count"), packed.get("data")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_RAW_TIMES:
        raise ValueError(f"iteration_times_us: count must be a whole number in 1..{MAX_RAW_TIMES:,d}, "
                         f"not {json_kind(count)}")
    if not isinstance(data, str):
        raise ValueError(f"iteration_times_us: data must be a string, not {json_kind(data)}")
    budget.take(count)
    try:  # at most what `count` values take, and one byte more to see a file that holds more
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(data, validate=True), 4 * count + 1)
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"iteration_times_us: data is not {RAW_TIMES_ENCODING} ({exc})") from None
    if len(raw) != 4 * count:
        held = "more" if len(raw) > 4 * count else f"{len(raw) / 4:g}"
        raise ValueError(f"iteration_times_us: {held} values, the record says {count}")
    return np.frombuffer(raw, dtype="<f4")
