"""Measured compute kept for the next run of the same model, batch and setup on the same host (issue 48: `proxy
resnet50 --nprocs 2 --batch 16 --backend shm` spent about 295 of its 451 s measuring before each replay).

`proxy --compute measured` times the real model on every rank (proxies/train.py measure_compute); rank 0 then
writes the agreed (slowest rank's) figures to $COMMBENCH_CACHE_DIR (else $XDG_CACHE_HOME/commbench, else
~/.cache/commbench) under compute/, keyed by what they depend on: the profile (name, tensors, bytes, FLOPs), the
batch, the device and precision, the setup and its knobs, the ranks sharing the host, torch's version and the
CPU or GPU model. The next run with that key reads them back and says so (`measured (cached ...)`);
`--remeasure` measures again. A file that is not what this module writes is ignored, never run: it is JSON.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

FIELDS = ("forward_us", "backward_us", "optimizer_us", "own_us")
MAX_CACHE_BYTES = 1 << 16


def key(profile, batch: int, device: str, amp: bool, choice, local_ranks: int, *, host: str) -> str:
    """A name for what the measured figures depend on (see the module's docstring)."""
    import torch

    identity = {"profile": [profile.name, len(profile.tensors), profile.nbytes, profile.forward_flops,
                            profile.backward_flops],
                "batch": batch, "device": device, "amp": amp, "setup": choice.name,
                "knobs": sorted((str(k), str(v)) for k, v in dict(choice.knobs).items()),
                "local_ranks": local_ranks, "torch": torch.__version__, "host": host}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    return f"{profile.name.replace('/', '_')[:40]}-b{batch}-{digest}"


def path_of(name: str) -> Path:
    from commbench.backends.build_cache import cache_root

    return cache_root() / "compute" / f"{name}.json"


def read(name: str) -> tuple[list[float], bool, str] | None:
    """(the four figures, whether they are CPU time, when measured) of `name`, or None (absent, unreadable, or
    not what `write` writes)."""
    path = path_of(name)
    try:
        if not path.is_file() or path.stat().st_size > MAX_CACHE_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    values = [data.get(f) for f in FIELDS] if isinstance(data, dict) else []
    if len(values) != len(FIELDS) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                             and math.isfinite(v) and 0 <= v < 1e12 for v in values):
        return None
    when = data.get("measured_at")
    return [float(v) for v in values], data.get("cpu_time") is True, when if isinstance(when, str) else "?"


def write(name: str, values, cpu_time: bool) -> None:
    """Keep the figures for the next run (a failure to write costs only the next run's measuring)."""
    path = path_of(name)
    record = {**dict(zip(FIELDS, (float(v) for v in values))), "cpu_time": bool(cpu_time),
              "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_text(json.dumps(record), encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        pass
