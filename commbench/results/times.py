"""The raw per-iteration times a result keeps beside its percentiles: packed when written
(pack_times: a plain list up to RAW_TIMES_INLINE_MAX values, float32-zlib-base64 beyond), unpacked
and bounded when read (raw_times), so any statistic can be recomputed after the run."""
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
    if not isinstance(packed, dict) or packed.get("encoding") != RAW_TIMES_ENCODING:
        what = packed.get("encoding") if isinstance(packed, dict) else packed
        raise ValueError(f"iteration_times_us: unknown encoding {what!r}")
    count, data = packed.get("count"), packed.get("data")
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_RAW_TIMES:
        raise ValueError(f"iteration_times_us: count must be a whole number in 1..{MAX_RAW_TIMES:,d}, "
                         f"not {json_kind(count)}")
    if not isinstance(data, str):
        raise ValueError(f"iteration_times_us: data must be a string, not {json_kind(data)}")
    try:  # at most what `count` values take, and one byte more to see a file that holds more
        inflate = zlib.decompressobj()
        raw = inflate.decompress(base64.b64decode(data, validate=True), 4 * count + 1)
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"iteration_times_us: data is not {RAW_TIMES_ENCODING} ({exc})") from None
    if len(raw) != 4 * count:
        held = "more" if len(raw) > 4 * count else f"{len(raw) / 4:g}"
        raise ValueError(f"iteration_times_us: {held} values, the record says {count}")
    return np.frombuffer(raw, dtype="<f4").astype(float)
