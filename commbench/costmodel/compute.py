"""The device half of a prediction: what one device spends on each operator class, as data.

A hardware file's `compute` block (written by `commbench compute`, read by every prediction that costs a
layout's compute; docs/compute.md) holds, per operator class, points measured (or published, or defaulted:
each entry says which) on one device:
- `matmul`: (M, N, K, dtype) -> microseconds of one `M x K @ K x N` product. A shape between points gets the
  achieved rate (2 M N K / time) of its nearest points, averaged in log space and weighted by the inverse
  square of their distance in log2(M), log2(N), log2(K): efficiency falls for small and skinny shapes, and
  a measured shape is read back exactly.
- `attention`: (batch x heads, query and key/value lengths, key/value heads' share, head size, causal,
  dtype) -> forward and backward microseconds of scaled dot-product attention, read the same way by the
  score FLOPs' rate.
- `memory_gbps`: the bandwidth memory-bound operators (norms, activations, rotary, residual adds, the loss,
  the optimizer's update) stream at; `op_us`: the fixed cost of one operator call (dispatch or launch).
- `framework_us`: what a real decoder layer's forward and backward spend beyond the sum of its operators
  (module hooks, autograd, views): measured from the layer against its pieces, per layer and phase
  (`forward`, `backward`); and what the parallel wrappers add to the same operators, measured from a whole
  model's micro-batch with and without them: FSDP2 per unit (`fsdp_unit_forward`, `fsdp_unit_backward`),
  tensor parallelism's DTensor per layer (`tp_layer_forward`, `tp_layer_backward`).
- `meta.cpus`: the host's cores where the block is a CPU's: ranks beyond them share a core's time.

Nothing here imports torch: measuring is `commbench/commands/compute.py` (proxies/operator_timing.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

SOURCES = ("measured", "published", "defaulted")
FRAMEWORK_KEYS = ("forward", "backward", "fsdp_unit_forward", "fsdp_unit_backward", "tp_layer_forward",
                  "tp_layer_backward",
                  # the rest of a rank's pieces beyond what the block's operators give them (commbench compute times
                  # the real ones): the head with its loss and the embedding per phase, the update per parameter tensor
                  "head_forward", "head_backward", "embed_forward", "embed_backward", "optimizer_tensor")
DTYPES = ("float32", "bfloat16", "float16", "float8")
MAX_POINTS = 4096  # a block of one model's layouts holds tens
NEAREST = 4  # points averaged for a shape between them


class ComputeError(ValueError):
    """A compute block with a missing or impossible field: one line naming the field."""


@dataclass(frozen=True)
class MatmulPoint:
    m: int
    n: int
    k: int
    dtype: str
    time_us: float
    source: str = "measured"

    @property
    def tflops(self) -> float:
        return 2.0 * self.m * self.n * self.k / (self.time_us * 1e6)


@dataclass(frozen=True)
class AttentionPoint:
    batch_heads: int  # batch x query heads
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool
    dtype: str
    forward_us: float
    backward_us: float
    source: str = "measured"

    def flops(self) -> float:
        return attention_flops(self.batch_heads, self.seq_q, self.seq_kv, self.head_dim, self.causal)


def attention_flops(batch_heads: int, seq_q: int, seq_kv: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs of Q K^T and scores x V (a multiply-add is 2), the masked half skipped when causal over a
    square block (FlashAttention's kernels skip masked tiles)."""
    flops = 4.0 * batch_heads * seq_q * seq_kv * head_dim
    return flops / 2 if causal and seq_q == seq_kv else flops


@dataclass(frozen=True)
class ComputeBlock:
    device: str  # what was timed: "cpu (AMD EPYC 7B13, 1 thread)", "NVIDIA H100 80GB HBM3"
    matmul: tuple[MatmulPoint, ...] = ()
    attention: tuple[AttentionPoint, ...] = ()
    memory_gbps: float | None = None
    op_us: float | None = None
    framework_us: dict[str, float] = field(default_factory=dict)  # FRAMEWORK_KEYS: per layer, unit, phase
    sources: dict[str, str] = field(default_factory=dict)  # memory_gbps, op_us, framework_us -> measured/...
    meta: dict[str, Any] = field(default_factory=dict)  # how it was measured: threads, repeats, layouts, date

    # ------------------------------------------------------------ reading the points

    def has(self, klass: str, dtype: str | None = None) -> bool:
        points = {"matmul": self.matmul, "attention": self.attention}.get(klass)
        if points is None:
            return getattr(self, klass, None) not in (None, {})
        return any(dtype is None or p.dtype == dtype for p in points)

    def matmul_us(self, m: int, n: int, k: int, dtype: str) -> float:
        """One M x K @ K x N product (ComputeError when the block has none of `dtype`)."""
        points = [p for p in self.matmul if p.dtype == dtype]
        if not points:
            raise ComputeError(f"the compute block of {self.device} has no {dtype} matrix products")
        if min(m, n, k) <= 0:
            return 0.0
        here = (math.log2(m), math.log2(n), math.log2(k))
        rate = _nearest_rate(here, [((math.log2(p.m), math.log2(p.n), math.log2(p.k)), p.tflops) for p in points])
        return 2.0 * m * n * k / (rate * 1e6)

    def attention_us(self, batch_heads: int, seq_q: int, seq_kv: int, head_dim: int, causal: bool,
                     dtype: str) -> tuple[float, float]:
        """(forward, backward) microseconds of one attention call, from the nearest points of the same causality
        (either, if the block has only the other)."""
        points = [p for p in self.attention if p.dtype == dtype]
        if not points:
            raise ComputeError(f"the compute block of {self.device} has no {dtype} attention")
        if min(batch_heads, seq_q, seq_kv, head_dim) <= 0:
            return 0.0, 0.0
        alike = [p for p in points if p.causal == (causal and seq_q == seq_kv)] or points
        here = (math.log2(batch_heads), math.log2(seq_q), math.log2(seq_kv), math.log2(head_dim))
        flops = attention_flops(batch_heads, seq_q, seq_kv, head_dim, causal)

        def at(phase: str) -> float:
            rates = [((math.log2(p.batch_heads), math.log2(p.seq_q), math.log2(p.seq_kv), math.log2(p.head_dim)),
                      p.flops() / (getattr(p, phase) * 1e6)) for p in alike]
            return flops / (_nearest_rate(here, rates) * 1e6)

        return at("forward_us"), at("backward_us")

    @property
    def cpu_time(self) -> bool:
        """Whether the block was timed in a thread's CPU time (proxies/operator_timing.Clock): a replay then spins
        its times as CPU time too."""
        return self.meta.get("clock") == "thread CPU time"

    def core_share(self, ranks_per_host: int) -> float:
        """How many times longer a rank's compute runs than measured when `ranks_per_host` ranks, each with the
        threads it was measured with, share this block's CPU cores (1 on a GPU, or with cores enough)."""
        cpus, threads = self.meta.get("cpus"), self.meta.get("threads") or 1
        if not self.device.startswith("cpu") or not cpus:
            return 1.0
        return max(1.0, ranks_per_host * threads / cpus)

    def memory_us(self, nbytes: float) -> float:
        if not self.memory_gbps:
            raise ComputeError(f"the compute block of {self.device} has no memory_gbps")
        return nbytes / (self.memory_gbps * 1e3)

    # ------------------------------------------------------------ the file

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["matmul"] = [asdict(p) for p in self.matmul]
        out["attention"] = [asdict(p) for p in self.attention]
        return out


def _nearest_rate(here: tuple[float, ...], rated: list[tuple[tuple[float, ...], float]]) -> float:
    """The rate at `here`: a point's own where one sits there, else the log-space average of the NEAREST
    points' rates weighted by 1 / distance^2."""
    by_distance = sorted((math.dist(here, where), rate) for where, rate in rated)
    if by_distance[0][0] < 1e-9:
        return by_distance[0][1]
    near = by_distance[:NEAREST]
    weights = [1.0 / d ** 2 for d, _ in near]
    return math.exp(sum(w * math.log(r) for w, (_, r) in zip(weights, near)) / sum(weights))


def compute_from_dict(data: Any) -> ComputeBlock:
    """Validate a hardware file's `compute` block (ComputeError: one line naming the field)."""
    if not isinstance(data, dict):
        raise ComputeError("compute must be a JSON object")
    device = data.get("device")
    if not isinstance(device, str) or not device:
        raise ComputeError("compute.device must be a non-empty string")
    matmul = tuple(_matmul(p, f"compute.matmul[{i}]") for i, p in enumerate(_list(data, "matmul")))
    attention = tuple(_attention(p, f"compute.attention[{i}]") for i, p in enumerate(_list(data, "attention")))
    framework = data.get("framework_us", {})
    if framework is None:
        framework = {}
    if not isinstance(framework, dict) or set(framework) - set(FRAMEWORK_KEYS):
        raise ComputeError(f"compute.framework_us must be an object of microseconds: {', '.join(FRAMEWORK_KEYS)}")
    sources = data.get("sources") or {}
    if not isinstance(sources, dict) or any(v not in SOURCES for v in sources.values()):
        raise ComputeError(f"compute.sources: each one of {', '.join(SOURCES)}")
    meta = data.get("meta", {})
    if not isinstance(meta, dict):
        raise ComputeError("compute.meta must be a JSON object")
    _check_meta(meta)
    op_us = _figure(data, "op_us", "compute.", optional=True, zero=True)
    if op_us is not None and op_us > MOST_OP_US:
        raise ComputeError(f"compute.op_us must be at most {MOST_OP_US:g} (one operator's fixed cost)")
    return ComputeBlock(device, matmul, attention, _figure(data, "memory_gbps", "compute.", optional=True),
                        op_us,
                        {k: _figure(framework, k, "compute.framework_us.", zero=True) for k in framework},
                        {str(k): str(v) for k, v in sources.items()}, meta)


def _check_meta(meta: dict) -> None:
    """What the prediction and the replay read of `meta`: the cores and threads (a CPU block's core share), the
    dtype it was measured in, the clock it was timed with."""
    for key in ("cpus", "threads"):
        value = meta.get(key)
        if value is not None and (type(value) is not int or not 1 <= value <= 1 << 20):
            raise ComputeError(f"compute.meta.{key} must be a whole number from 1 (or null), not {value!r}")
    if meta.get("dtype") is not None and meta["dtype"] not in DTYPES:
        raise ComputeError(f"compute.meta.dtype must be one of {', '.join(DTYPES)}")
    if meta.get("clock") is not None and not isinstance(meta["clock"], str):
        raise ComputeError("compute.meta.clock must be a string")


def _list(data: dict, key: str) -> list:
    value = data.get(key) or []
    if not isinstance(value, list):
        raise ComputeError(f"compute.{key} must be a list")
    if len(value) > MAX_POINTS:
        raise ComputeError(f"compute.{key}: {len(value):,} points; at most {MAX_POINTS:,}")
    return value


def _matmul(point: Any, where: str) -> MatmulPoint:
    if not isinstance(point, dict):
        raise ComputeError(f"{where} must be a JSON object")
    dims = [int(_figure(point, d, where + ".", whole=True)) for d in ("m", "n", "k")]
    return MatmulPoint(*dims, _dtype(point, where), _figure(point, "time_us", where + "."), _source(point, where))


def _attention(point: Any, where: str) -> AttentionPoint:
    if not isinstance(point, dict):
        raise ComputeError(f"{where} must be a JSON object")
    dims = [int(_figure(point, d, where + ".", whole=True)) for d in ("batch_heads", "seq_q", "seq_kv", "head_dim")]
    causal = point.get("causal")
    if type(causal) is not bool:
        raise ComputeError(f"{where}.causal must be true or false")
    return AttentionPoint(*dims, causal, _dtype(point, where), _figure(point, "forward_us", where + "."),
                          _figure(point, "backward_us", where + "."), _source(point, where))


def _dtype(point: dict, where: str) -> str:
    dtype = point.get("dtype")
    if dtype not in DTYPES:
        raise ComputeError(f"{where}.dtype must be one of {', '.join(DTYPES)}")
    return dtype


def _source(point: dict, where: str) -> str:
    source = point.get("source", "measured")
    if source not in SOURCES:
        raise ComputeError(f"{where}.source must be one of {', '.join(SOURCES)}")
    return source


MAX_COMPUTE_FIGURE = 1e15  # microseconds, dimensions, GB/s: finite, and far beyond any device
LEAST = {"memory_gbps": 1e-3, "time_us": 1e-3, "forward_us": 1e-3, "backward_us": 1e-3}  # below: no device's
MOST_OP_US = 1e6  # one operator's fixed cost: a second is no dispatch


def _figure(data: dict, key: str, prefix: str, *, optional: bool = False, whole: bool = False,
            zero: bool = False) -> float | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not math.isfinite(value)):
        raise ComputeError(f"{prefix}{key} must be a finite number")
    if abs(value) > MAX_COMPUTE_FIGURE:  # a 400-digit integer is no figure either (and isfinite overflows on it)
        raise ComputeError(f"{prefix}{key} must be at most {MAX_COMPUTE_FIGURE:g}")
    least = LEAST.get(key, 0.0)
    if value < least:
        raise ComputeError(f"{prefix}{key} must be at least {least:g}, not {value!r}")
    if value < 0 or (value == 0 and not zero) or (whole and value != int(value)):
        kind = "a whole number" if whole else "a number"
        raise ComputeError(f"{prefix}{key} must be {kind} {'from 0' if zero else 'above 0'} to "
                           f"{MAX_COMPUTE_FIGURE:g}, not {value!r}")
    return float(value)
