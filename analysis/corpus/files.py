"""What the three corpus loaders read the same way: the JSON file, an object of objects, a number, a system's
hardware (a shipped preset where the machine is that preset, else its own figures).

Each loader raises its own error class (a CorpusFormatError) naming the file; these helpers raise the base
class with the field, and the loader adds the path (or, for the layouts corpus, collects the line).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from commbench.costmodel import Hardware, HardwareError, hardware_from_dict, load_hardware


class CorpusFormatError(ValueError):
    """A corpus file that is not what its loader reads: one line naming the field."""


def read_json(path: str) -> Any:
    """The file's JSON value (CorpusFormatError when it cannot be read or parsed; the loader adds the path). JSON
    only: reading a corpus runs no code."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CorpusFormatError(str(exc)) from None


def objects(data: dict, key: str) -> dict:
    """`data[key]`, a non-empty object whose every value is an object (sources, systems, setups, shapes)."""
    value = data.get(key)
    if not isinstance(value, dict) or not value or not all(isinstance(v, dict) for v in value.values()):
        raise CorpusFormatError(f"{key} must be an object of objects")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def system_hardware(where: str, entry: dict, own: Callable[[dict], dict] | None = None) -> Hardware:
    """The hardware of a `systems` entry: `preset` (the machine is that preset, no figure changed) or `hardware`
    (a hardware file's object written from the source's description, passed through `own` first), not both."""
    preset, data = entry.get("preset"), entry.get("hardware")
    if (preset is None) == (data is None):
        raise CorpusFormatError(f"{where}: give either preset (the machine is that preset) or hardware (its own "
                                f"figures), not both or neither")
    try:
        if preset is not None:
            return load_hardware(str(preset))
        return hardware_from_dict(own(data) if own else data, origin=f"{where}.hardware")
    except HardwareError as exc:
        raise CorpusFormatError(f"{where}.preset: {exc}" if preset is not None else str(exc)) from None
