"""Running commbench's commands for emulated_cluster.py and emulated_link.py, and reading what they wrote.

Every run on the emulated cluster is a `commbench ...` subprocess with a wall-clock limit (run),
whose JSON Lines the modes then read back by record kind (records); rates and sizes are written
as the commands take them (rate_bps, size_label).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

COMMBENCH = [sys.executable, "-m", "commbench"]


def run(argv: list[str], limit_s: float) -> tuple[int, str]:
    """One bounded command; its exit code and its last stderr line (all of it beside its --json, .stderr)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return 124, f"killed after {limit_s:.0f} s"
    if "--json" in argv:
        with open(argv[argv.index("--json") + 1] + ".stderr", "w", encoding="utf-8") as handle:
            handle.write(proc.stderr or "")
    lines = (proc.stderr or "").strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


def records(path: str, kind: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [r for r in map(json.loads, handle) if r.get("record") == kind]


def rate_bps(text: str) -> float:
    from commbench.emulate import parse_rate
    return parse_rate(text)


def size_label(nbytes: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)

