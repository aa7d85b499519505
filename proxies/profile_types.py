"""What a model's gradient profile holds (proxies/profile.py reads one from its file, checked field by field):
its parameter tensors (`TensorSpec`), its FSDP sharding units (`UnitSpec`), a traced profile's compute as
time (`TracedCompute`), the whole (`Profile`) with what is derived from it (sizes, gradient-ready order, the
backward's share done at each gradient), and the file it saves to (schema `SCHEMA_VERSION`: the header
indented, a line per tensor and per unit). Nothing here needs torch."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from commbench.proxies.transformer import TransformerShape

SCHEMA_VERSION = 4  # the schema a profile is written in (proxies/profile.py reads READABLE_SCHEMAS)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
TENSOR_FIELDS = ("name", "shape", "dtype", "ready_flops", "ready_index")  # a tensor's row in the file
UNIT_FIELDS = ("name", "tensors", "forward_flops", "backward_flops")  # a unit's row


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
class UnitSpec:
    """One sharding unit: the module FSDP wraps (its path, as `model.get_submodule(name)` finds it;
    "" is the root module with the parameters no wrapped module holds), the indices of its parameter
    tensors in Profile.tensors, and the FLOPs per sample its own forward and backward run (a nested
    unit's FLOPs are the nested unit's; FLOPs outside every wrapped module are the root's)."""
    name: str
    tensors: tuple[int, ...]
    forward_flops: float
    backward_flops: float


@dataclass(frozen=True)
class TracedCompute:
    """A traced profile's compute: its traced step's issuing thread busy, per sample, on the device it ran on."""
    device: str  # what the trace ran on: the GPU's name, or the CPU's host
    batch: int  # the traced step's per-rank batch, which the times are divided by
    forward_us: float  # per sample: from the step's start to the backward's
    backward_us: float  # per sample: the backward
    ready_us: tuple[float, ...]  # per tensor, registration order: the backward done when its gradient is ready

    def times_us(self, batch: int) -> tuple[float, float]:
        """(forward, backward) microseconds of a step of `batch` samples, at the traced time per sample."""
        return self.forward_us * batch, self.backward_us * batch


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
    units: tuple[UnitSpec, ...] = ()  # sharding units in forward execution order; () if not extracted
    transformer: TransformerShape | None = None  # a decoder-only transformer's shape; None for other models
    traced: TracedCompute | None = None  # the compute as traced (a profile from a trace); None: FLOPs give it

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def unit_nbytes(self, unit: UnitSpec) -> int:
        """The bytes of a unit's parameters (what FSDP all-gathers for it, unsharded)."""
        return sum(self.tensors[i].nbytes for i in unit.tensors)

    def ready_order(self) -> list[int]:
        """Tensor indices in the order their gradients become ready in backward."""
        return sorted(range(len(self.tensors)), key=lambda i: self.tensors[i].ready_index)

    def compute_work(self) -> tuple[float, float]:
        """(forward, backward) per sample in the measure that shares the compute out: FLOPs, or traced microseconds."""
        traced = self.traced
        return (traced.forward_us, traced.backward_us) if traced else (self.forward_flops, self.backward_flops)

    def ready_work(self, index: int) -> float:
        """The backward's work (compute_work's measure) done when tensor `index`'s gradient is ready."""
        return self.tensors[index].ready_flops if self.traced is None else self.traced.ready_us[index]

    def ready_share(self, index: int) -> float:
        """The part of the backward done when tensor `index`'s gradient is ready (1 for a backward of no work)."""
        total = self.compute_work()[1]
        return self.ready_work(index) / total if total > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tensors"] = [[t.name, list(t.shape), t.dtype, t.ready_flops, t.ready_index] for t in self.tensors]
        out["units"] = [[u.name, list(u.tensors), u.forward_flops, u.backward_flops] for u in self.units]
        for key in ("transformer", "traced"):  # optional: absent where there is none
            if getattr(self, key) is None:
                del out[key]
        return {"schema": SCHEMA_VERSION, "parameters": self.parameters, "tensor_fields": list(TENSOR_FIELDS),
                "unit_fields": list(UNIT_FIELDS), **out}

    def save(self, path: str) -> None:
        """Readable JSON: the header fields indented, one line per tensor and per unit."""
        data = self.to_dict()
        lists = {key: data.pop(key) for key in ("tensors", "units")}
        traced = data.pop("traced", None)
        head = json.dumps(data, indent=1)[:-2]  # without the closing brace
        if traced is not None:  # on one line: its ready_us has an entry per tensor
            head += f',\n "traced": {json.dumps(traced)}'
        body = ",\n".join(f' "{key}": [' + ",".join(f"\n  {json.dumps(row)}" for row in rows)
                          + ("\n ]" if rows else "]") for key, rows in lists.items())
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"{head},\n{body}\n}}\n")
