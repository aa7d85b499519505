"""A model's gradient profile: what DDP would communicate for it, and when.

A profile lists every trainable parameter tensor in registration order (name,
shape, dtype) with the backward FLOPs per sample that have run when its gradient
becomes ready (`ready_flops`) and its position in gradient-ready order
(`ready_index`), plus the forward and backward FLOPs per sample, the input shape,
the sample unit, a default batch and where the model came from. Schema 2 adds the
model's sharding units (`units`): the modules an FSDP wrapping policy wraps, each
with its parameter tensors and the forward and backward FLOPs spent in it, in the
order the forward runs them. Schema 3 adds, for decoder-only transformers, the model's shape
(`transformer`: proxies/transformer.py), what parallel layouts and memory per GPU need. Schema 4 adds a
traced profile's compute (traces/extracted_profile.py) as time (`traced`), its FLOPs 0: a trace counts none. Profiles
ship as JSON in proxies/profiles/ and are built by extract.py; nothing in this module needs torch.

This module reads a profile file (`profile_from_dict` checks every field for type and range; `load_profile`
takes a shipped name or a path); the values it builds, and how they are saved, are proxies/profile_types.py's.
"""
from __future__ import annotations

import json
import math
import os
import unicodedata
from typing import Any

from commbench import files
from commbench.proxies.profile_types import (  # noqa: F401 - the value types, imported from here by their users
    DTYPE_BYTES,
    SCHEMA_VERSION,
    TENSOR_FIELDS,
    UNIT_FIELDS,
    Profile,
    ProfileError,
    TensorSpec,
    TracedCompute,
    UnitSpec,
)
from commbench.proxies.transformer import TransformerShape, shape_from_dict

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
READABLE_SCHEMAS = (1, 2, 3, 4)  # schema 1: no units; 1 and 2: no transformer shape; 1 to 3: no traced compute
REQUIRED = ("name", "tensors", "forward_flops", "backward_flops", "input_shape", "sample_unit", "default_batch")

# What a profile file may hold: generous beyond any model trained to date, and finite, so that what is
# built from a profile (buckets, the replay's timeline, a prediction) stays finite too.
MAX_FILE_BYTES = 256 * 2**20
MAX_TENSORS = 1_000_000
MAX_UNITS = MAX_TENSORS
MAX_PARAMETERS = 10**14  # 100 T parameters
MAX_TENSOR_DIMS = 8
MAX_FLOPS = 1e21  # per sample, forward or backward
MAX_BATCH = 2**20
MAX_INPUT_DIM = 2**31
MAX_TEXT = 4096  # characters in a name, a sample unit or a source entry
MAX_TRACED_US = 86400e6  # a traced forward or backward per sample: a day


def profile_from_dict(data: Any, origin: str) -> Profile:
    """Validate and build; every problem is one ProfileError naming the field. Only data is read:
    nothing in a profile is imported or run (`source` is kept as text for people to read)."""
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: not a profile (expected a JSON object)")
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise ProfileError(f"{origin}: missing field(s) {', '.join(missing)}")
    schema = data.get("schema", SCHEMA_VERSION)
    if type(schema) is not int or schema not in READABLE_SCHEMAS:
        readable = ", ".join(map(str, READABLE_SCHEMAS[:-1])) + f" and {READABLE_SCHEMAS[-1]}"
        raise ProfileError(f"{origin}: schema {_brief(data['schema'])}; this commbench reads schema {readable}")
    forward = _number(data["forward_flops"], "forward_flops", origin, MAX_FLOPS)
    backward = _number(data["backward_flops"], "backward_flops", origin, MAX_FLOPS)
    batch = _integer(data["default_batch"], "default_batch", origin, 1, MAX_BATCH)
    shape = _dims(data["input_shape"], "input_shape", origin, 1, MAX_INPUT_DIM)
    entries = _list(data["tensors"], "tensors", origin)
    if not entries:
        raise ProfileError(f"{origin}: 'tensors' is empty")
    if len(entries) > MAX_TENSORS:
        raise ProfileError(f"{origin}: {len(entries)} tensors; a profile holds at most {MAX_TENSORS:,d}")
    tensors = tuple(_tensor(entry, i, origin, backward) for i, entry in enumerate(entries))
    if sorted(t.ready_index for t in tensors) != list(range(len(tensors))):
        raise ProfileError(f"{origin}: tensors' ready_index must number them 0..{len(tensors) - 1}, each once")
    total = sum(t.numel for t in tensors)
    if total > MAX_PARAMETERS:
        raise ProfileError(f"{origin}: the tensors hold {total:.3g} parameters; a profile holds at most "
                           f"{MAX_PARAMETERS:.0e}")
    stated = data.get("parameters", total)
    if type(stated) is not int or stated != total:
        raise ProfileError(f"{origin}: 'parameters' says {_brief(stated)} but the tensors hold {total}")
    units = _units(data.get("units", []), tensors, forward, backward, origin)
    return Profile(_text(data["name"], "name", origin), tensors, forward, backward, shape,
                   _text(data["sample_unit"], "sample_unit", origin), batch, _source(data.get("source"), origin), units,
                   _transformer(data.get("transformer"), total, origin), _traced(data.get("traced"), tensors, origin))


def _traced(value: Any, tensors: tuple[TensorSpec, ...], origin: str) -> TracedCompute | None:
    """The optional traced compute: times per sample in range, a ready time per tensor within the backward."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProfileError(f"{origin}: 'traced' must be an object")
    forward = _number(value.get("forward_us"), "traced.forward_us", origin, MAX_TRACED_US)
    backward = _number(value.get("backward_us"), "traced.backward_us", origin, MAX_TRACED_US)
    ready = _list(value.get("ready_us"), "traced.ready_us", origin)
    if len(ready) != len(tensors):
        raise ProfileError(f"{origin}: 'traced.ready_us' has {len(ready)} entries for {len(tensors)} tensors")
    ready_us = tuple(_number(r, f"traced.ready_us[{i}] ({tensors[i].name})", origin, backward * (1 + 1e-9))
                     for i, r in enumerate(ready))  # within the backward
    batch = _integer(value.get("batch"), "traced.batch", origin, 1, MAX_BATCH)
    return TracedCompute(_text(value.get("device"), "traced.device", origin), batch, forward, backward, ready_us)


def _transformer(value: Any, parameters: int, origin: str) -> TransformerShape | None:
    """The optional shape; its parameter count must be the tensors' (the same model)."""
    if value is None:
        return None
    try:
        shape = shape_from_dict(value)
    except (ValueError, TypeError) as exc:
        raise ProfileError(f"{origin}: {exc}") from None
    if shape.parameters != parameters:
        raise ProfileError(f"{origin}: the transformer shape holds {shape.parameters} parameters, the tensors "
                           f"{parameters}")
    return shape


def _list(value: Any, name: str, origin: str) -> list:
    if not isinstance(value, (list, tuple)):  # JSON's arrays, or Profile.to_dict's tuples
        raise ProfileError(f"{origin}: '{name}' must be a list")
    return value


def _number(value: Any, name: str, origin: str, maximum: float) -> float:
    """A finite number from 0 to `maximum` (JSON true/false are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{origin}: '{name}' must be a number, not {_brief(value)}")
    if not 0 <= value <= maximum:  # NaN fails both comparisons
        raise ProfileError(f"{origin}: '{name}' is {_brief(value)}; it must be a finite number from 0 to {maximum:g}")
    return float(value)


def _integer(value: Any, name: str, origin: str, minimum: int, maximum: int) -> int:
    if type(value) is not int or not minimum <= value <= maximum:
        raise ProfileError(f"{origin}: '{name}' is {_brief(value)}; it must be an integer from {minimum} to "
                           f"{maximum:,d}")
    return value


def _dims(value: Any, name: str, origin: str, minimum: int, maximum: int) -> tuple[int, ...]:
    dims = _list(value, name, origin)
    if len(dims) > MAX_TENSOR_DIMS:
        raise ProfileError(f"{origin}: '{name}' has {len(dims)} dimensions; at most {MAX_TENSOR_DIMS}")
    return tuple(_integer(d, name, origin, minimum, maximum) for d in dims)


def _text(value: Any, name: str, origin: str) -> str:
    """A string a terminal shows as it is: no control characters (escape sequences), not too long."""
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise ProfileError(f"{origin}: '{name}' must be a non-empty string of at most {MAX_TEXT} characters")
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise ProfileError(f"{origin}: '{name}' holds control characters: {_brief(value)}")
    return value


def _brief(value: Any) -> str:
    """A value as an error line shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _source(value: Any, origin: str) -> dict[str, Any]:
    """Where the model came from, for people to read: text, numbers, null, or lists of these."""
    source = {} if value is None else value
    if not isinstance(source, dict):
        raise ProfileError(f"{origin}: 'source' must be an object")
    for key, item in source.items():
        _text(key, "source key", origin)
        for part in item if isinstance(item, list) else [item]:
            if isinstance(part, str):
                _text(part, f"source.{key}", origin)
            elif part is not None and not (isinstance(part, (int, float)) and math.isfinite(part)):
                raise ProfileError(f"{origin}: 'source.{key}' must hold text, finite numbers, null or lists of them")
    return source


def _tensor(entry: Any, i: int, origin: str, backward_flops: float) -> TensorSpec:
    where = f"{origin}: tensors[{i}]"
    if isinstance(entry, dict):
        entry = [entry.get(k) for k in TENSOR_FIELDS]
    if not isinstance(entry, list) or len(entry) != 5 or None in entry:
        raise ProfileError(f"{where}: expected [{', '.join(TENSOR_FIELDS)}]")
    name, shape, dtype, ready_flops, ready_index = entry
    name = _text(name, f"tensors[{i}] name", origin)
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ProfileError(f"{where} ({name}): unknown dtype {_brief(dtype)}; known: {', '.join(DTYPE_BYTES)}")
    dims = _dims(shape, f"tensors[{i}] ({name}) shape", origin, 0, MAX_PARAMETERS)
    ready = _number(ready_flops, f"tensors[{i}] ({name}) ready_flops", origin, MAX_FLOPS)
    if ready > backward_flops * (1 + 1e-9):
        raise ProfileError(f"{where} ({name}): ready_flops {ready:g} is more than the backward's {backward_flops:g}")
    index = _integer(ready_index, f"tensors[{i}] ({name}) ready_index", origin, 0, MAX_TENSORS)
    return TensorSpec(name, dims, dtype, ready, index)


def _units(value: Any, tensors: tuple[TensorSpec, ...], forward: float, backward: float,
           origin: str) -> tuple[UnitSpec, ...]:
    """The sharding units: each tensor in exactly one unit, names once each, and FLOPs that add up to the
    profile's (an empty list: no units, as schema 1 files)."""
    entries = _list(value, "units", origin)
    if len(entries) > MAX_UNITS:
        raise ProfileError(f"{origin}: {len(entries)} units; a profile holds at most {MAX_UNITS:,d}")
    units = tuple(_unit(entry, k, origin, len(tensors)) for k, entry in enumerate(entries))
    if not units:
        return units
    owner: dict[int, str] = {}
    names: set[str] = set()
    for unit in units:
        if unit.name in names:
            raise ProfileError(f"{origin}: unit {unit.name!r} is listed twice")
        names.add(unit.name)
        for index in unit.tensors:
            if index in owner:
                where = "twice in unit" if owner[index] == unit.name else f"in two units, {owner[index]!r} and"
                raise ProfileError(f"{origin}: tensors[{index}] ({tensors[index].name}) is {where} {unit.name!r}")
            owner[index] = unit.name
    orphans = [t.name for i, t in enumerate(tensors) if i not in owner]
    if orphans:
        more = f" and {len(orphans) - 1} more" if len(orphans) > 1 else ""
        raise ProfileError(f"{origin}: tensor {orphans[0]}{more} in no unit; every tensor belongs to one unit")
    for key, total in (("forward_flops", forward), ("backward_flops", backward)):
        summed = sum(getattr(u, key) for u in units)
        if not math.isclose(summed, total, rel_tol=1e-6, abs_tol=1.0):
            raise ProfileError(f"{origin}: the units' {key} add up to {summed:g}, the profile's {key} is {total:g}")
    return units


def _unit(entry: Any, k: int, origin: str, tensor_count: int) -> UnitSpec:
    where = f"{origin}: units[{k}]"
    if isinstance(entry, dict):
        entry = [entry.get(key) for key in UNIT_FIELDS]
    if not isinstance(entry, (list, tuple)) or len(entry) != 4 or None in entry:
        raise ProfileError(f"{where}: expected [{', '.join(UNIT_FIELDS)}]")
    name, members, forward, backward = entry
    if name != "":  # "" is the root module
        name = _text(name, f"units[{k}] name", origin)
    members = _list(members, f"units[{k}] ({name!r}) tensors", origin)
    for index in members:
        if type(index) is not int or not 0 <= index < tensor_count:
            raise ProfileError(f"{where} ({name!r}): tensor index {_brief(index)} is not one of the profile's "
                               f"tensors (0..{tensor_count - 1})")
    return UnitSpec(name, tuple(members), _number(forward, f"units[{k}] ({name!r}) forward_flops", origin, MAX_FLOPS),
                    _number(backward, f"units[{k}] ({name!r}) backward_flops", origin, MAX_FLOPS))


# ---------------------------------------------------------------- finding profiles


def shipped() -> list[str]:
    """Names of the profiles that ship with commbench."""
    if not os.path.isdir(PROFILE_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(PROFILE_DIR) if f.endswith(".json"))


def load_profile(spec: str) -> Profile:
    """A shipped profile by name (resnet50, bert-base, ...) or a profile JSON file, validated
    (`profile_from_dict`); reading one never imports or runs anything it names."""
    if os.path.exists(spec):
        path = spec
    else:
        path = os.path.join(PROFILE_DIR, f"{spec}.json")
        if not os.path.exists(path):
            raise ProfileError(f"unknown model {spec!r}; known: {', '.join(shipped())} "
                               f"(or a profile file from `commbench profiles extract`)")
    try:
        text = files.read_small(path, MAX_FILE_BYTES, "a profile").decode("utf-8")
        data = json.loads(text, parse_constant=lambda word: _not_finite(path, word))
    except ProfileError:
        raise
    except files.UnreadableFile as exc:  # not a regular file (a FIFO, a device), or too large
        raise ProfileError(str(exc)) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, deep nesting
        raise ProfileError(f"{path}: not a profile ({str(exc).splitlines()[0] or type(exc).__name__})") from exc
    return profile_from_dict(data, path)


def _not_finite(path: str, word: str) -> float:
    """json's hook for NaN, Infinity and -Infinity, which Python's json reads but JSON does not allow."""
    raise ProfileError(f"{path}: holds {word}; numbers in a profile must be finite")
