"""A model's gradient profile: what DDP would communicate for it, and when.

A profile lists every trainable parameter tensor in registration order (name,
shape, dtype) with the backward FLOPs per sample that have run when its gradient
becomes ready (`ready_flops`) and its position in gradient-ready order
(`ready_index`), plus the forward and backward FLOPs per sample, the input shape,
the sample unit, a default batch and where the model came from. Profiles ship as
JSON in proxies/profiles/ and are built by extract.py; nothing in this module
needs torch.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

PROFILE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
SCHEMA_VERSION = 1
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


class ProfileError(ValueError):
    """A profile that cannot be found, does not parse, or lacks a field (one line for the user)."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    ready_flops: float  # backward FLOPs per sample done when this gradient is ready
    ready_index: int  # position in gradient-ready order (0: the first gradient DDP sees)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Profile:
    name: str
    tensors: tuple[TensorSpec, ...]  # registration order (model.parameters())
    forward_flops: float  # per sample, torch.utils.flop_counter
    backward_flops: float  # per sample
    input_shape: tuple[int, ...]  # one sample
    sample_unit: str  # images, sequences, utterances
    default_batch: int
    source: dict[str, Any] = field(default_factory=dict)  # package, version, constructor, reference

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def ready_order(self) -> list[int]:
        """Tensor indices in the order their gradients become ready in backward."""
        return sorted(range(len(self.tensors)), key=lambda i: self.tensors[i].ready_index)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tensors"] = [[t.name, list(t.shape), t.dtype, t.ready_flops, t.ready_index] for t in self.tensors]
        return {"schema": SCHEMA_VERSION, "parameters": self.parameters, "tensor_fields":
                ["name", "shape", "dtype", "ready_flops", "ready_index"], **out}

    def save(self, path: str) -> None:
        """Readable JSON: the header fields indented, one line per tensor."""
        data = self.to_dict()
        tensors = data.pop("tensors")
        head = json.dumps(data, indent=1)[:-2]  # without the closing brace
        rows = ",\n".join("  " + json.dumps(row) for row in tensors)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f'{head},\n "tensors": [\n{rows}\n ]\n}}\n')


REQUIRED = ("name", "tensors", "forward_flops", "backward_flops", "input_shape", "sample_unit", "default_batch")


def profile_from_dict(data: Any, origin: str) -> Profile:
    """Validate and build; every problem is one ProfileError naming the field."""
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: not a profile (expected a JSON object)")
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise ProfileError(f"{origin}: missing field(s) {', '.join(missing)}")
    tensors = tuple(_tensor(entry, i, origin) for i, entry in enumerate(_list(data["tensors"], "tensors", origin)))
    if not tensors:
        raise ProfileError(f"{origin}: 'tensors' is empty")
    if sorted(t.ready_index for t in tensors) != list(range(len(tensors))):
        raise ProfileError(f"{origin}: tensors' ready_index must number them 0..{len(tensors) - 1}, each once")
    try:
        forward, backward = float(data["forward_flops"]), float(data["backward_flops"])
        batch, shape = int(data["default_batch"]), tuple(int(d) for d in data["input_shape"])
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{origin}: bad forward_flops/backward_flops/default_batch/input_shape ({exc})") from exc
    if forward < 0 or backward < 0 or batch < 1:
        raise ProfileError(f"{origin}: FLOPs cannot be negative and default_batch must be at least 1")
    source = data.get("source") or {}
    if not isinstance(source, dict):
        raise ProfileError(f"{origin}: 'source' must be an object")
    profile = Profile(str(data["name"]), tensors, forward, backward, shape, str(data["sample_unit"]), batch, source)
    stated = data.get("parameters", profile.parameters)
    if not isinstance(stated, int) or stated != profile.parameters:
        raise ProfileError(f"{origin}: 'parameters' says {stated!r} but the tensors hold {profile.parameters}")
    return profile


def _list(value: Any, name: str, origin: str) -> list:
    if not isinstance(value, list):
        raise ProfileError(f"{origin}: '{name}' must be a list")
    return value


def _tensor(entry: Any, i: int, origin: str) -> TensorSpec:
    where = f"{origin}: tensors[{i}]"
    if isinstance(entry, dict):
        entry = [entry.get(k) for k in ("name", "shape", "dtype", "ready_flops", "ready_index")]
    if not isinstance(entry, list) or len(entry) != 5 or None in entry:
        raise ProfileError(f"{where}: expected [name, shape, dtype, ready_flops, ready_index]")
    name, shape, dtype, ready_flops, ready_index = entry
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ProfileError(f"{where} ({name}): unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    try:
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise ValueError("negative dimension")
        return TensorSpec(str(name), dims, dtype, float(ready_flops), int(ready_index))
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{where} ({name}): bad shape, ready_flops or ready_index ({exc})") from exc


# ---------------------------------------------------------------- finding profiles


def shipped() -> list[str]:
    """Names of the profiles that ship with commbench."""
    if not os.path.isdir(PROFILE_DIR):
        return []
    return sorted(f[:-5] for f in os.listdir(PROFILE_DIR) if f.endswith(".json"))


def load_profile(spec: str) -> Profile:
    """A shipped profile by name (resnet50, bert-base, ...) or a profile JSON file."""
    if os.path.exists(spec):
        path = spec
    else:
        path = os.path.join(PROFILE_DIR, f"{spec}.json")
        if not os.path.exists(path):
            raise ProfileError(f"unknown model {spec!r}; known: {', '.join(shipped())} "
                               f"(or a profile file from `commbench profiles extract`)")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    return profile_from_dict(data, path)
