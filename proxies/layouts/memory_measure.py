"""Memory per device a real training step holds, measured, to check proxies/layouts/memory.py against.

`measure_peak` trains a transformers model for a few steps on one rank (CPU or GPU) as a user's loop would
(AdamW, `zero_grad(set_to_none=True)`), bare, under DDP or under FSDP2 (a unit per decoder layer and the
root), and reads the peak from torch's own tracker (`torch.distributed._tools.mem_tracker.MemTracker`,
`FSDPMemTracker` for FSDP2): every tensor's storage counted by what it is (parameters, gradients, optimizer
state, activations, temporaries), not what the allocator reserves. `predicted_peak` is the model's figure for
the same step. benchmarks/memory_measured.py prints both; docs/memory.md has the results.

On one rank, DDP and FSDP2 keep what they keep on many (DDP's gradient buckets, FSDP2's gathered copies),
so the accounting is checked; what a shard of many ranks holds is the same arithmetic divided by the degrees.
`layout_peaks` checks that on local gloo ranks: `train --layout`'s own training of each layout (TP, SP, CP and
FSDP2 or DDP; proxies/layouts/train/), the fullest rank's peak of its second step, against
`predicted_layout_peak`. A pipeline is not measured: its stages call a module once per micro-batch, which
MemTracker refuses.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from commbench.proxies.catalog import build
from commbench.proxies.layouts import memory as M
from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.layouts.train.local import peak_by_kind
from commbench.proxies.transformer import TransformerShape, from_config

WRAPPERS = ("none", "ddp", "fsdp")
DTYPES = ("float32", "bfloat16")
STEPS = 2  # the second step's peak: the optimizer's state exists from the first


@dataclass(frozen=True)
class MeasuredPeak:
    total_nbytes: int
    by_kind: dict[str, int]  # the tracker's categories at the peak (PARAM, GRAD, OPT, ACT, TEMP, ...)


def measure_peak(constructor: str, seq_len: int, batch: int, dtype: str, wrapper: str) -> MeasuredPeak:
    """The peak of one training step of `constructor` (a transformers spec, proxies/catalog.py) on this
    process's device, `batch` sequences of `seq_len`, parameters and activations in `dtype`, under `wrapper`."""
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    built = build(constructor, (seq_len,))
    model = _wrapped(built.module.to(getattr(torch, dtype)), wrapper)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    args, kwargs = built.make_inputs(batch, "cpu")
    for _ in range(STEPS):
        tracker = FSDPMemTracker(model, optimizer) if wrapper == "fsdp" else MemTracker()
        if wrapper != "fsdp":
            tracker.track_external(model, optimizer)
        with tracker:
            out = model(*args, **kwargs)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del out
        kinds = peak_by_kind(tracker)
    return MeasuredPeak(kinds.pop("Total"), kinds)


def _wrapped(module, wrapper: str):
    """`module` bare, in DDP, or with FSDP2 on each decoder layer and the root, on a one-rank group."""
    import torch
    import torch.distributed as dist

    if wrapper == "none":
        return module
    if not dist.is_initialized():  # one rank: an in-memory store, no port to find free
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if wrapper == "ddp":
        return torch.nn.parallel.DistributedDataParallel(module)
    from torch.distributed.fsdp import fully_shard

    for layer in module.model.layers:
        fully_shard(layer)
    return fully_shard(module)


def shape_of(constructor: str, seq_len: int, dtype: str) -> TransformerShape:
    """The shape proxies/layouts/memory.py reads, from the same model's config, at `dtype`'s width."""
    config = build(constructor, (seq_len,)).module.config
    return from_config(config, seq_len, dtype_bytes=4 if dtype == "float32" else 2)


def predicted_peak(shape: TransformerShape, batch: int, wrapper: str) -> M.MemoryBreakdown:
    """proxies/layouts/memory.py's figure for the step measure_peak runs: one rank, AdamW's two moments in the
    parameters' dtype (no fp32 master copy: the loop above keeps none), gradients through the forward only
    under DDP (its buckets; set_to_none frees the others)."""
    width = shape.dtype_bytes
    precision = M.Precision(f"adamw-{8 * width}bit", width, width, 2 * width)
    choices = M.MemoryChoices(microbatch=batch, sharding="fsdp" if wrapper == "fsdp" else "none",
                              gradients_held=wrapper == "ddp")
    return M.memory_per_gpu(shape, Parallelism(), choices, precision)


SGD_MOMENTUM_FP32 = M.Precision("sgd-momentum-32bit", 4, 4, 4)  # `train --layout`'s optimizer: one fp32 buffer


def layout_peaks(layouts: list, transformer: TransformerShape, microbatch: int = 1, world: int = 4,
                 timeout_s: float = 300) -> dict[str, MeasuredPeak]:
    """The peak of the second step of `train --layout`'s training of each layout (a Parallelism, no pipeline) on
    `world` local gloo ranks, the fullest rank's: name -> MeasuredPeak."""
    from commbench.proxies.layouts.train.local import train_layouts, trained_shape

    piped = [par.name for par in layouts if par.pp > 1]
    if piped:
        raise ValueError(f"{', '.join(piped)}: a pipeline's memory is not measured here (its stages call a module "
                         "once per micro-batch, which MemTracker refuses)")
    runs = train_layouts({par.name: par for par in layouts},
                         {par.name: trained_shape(par, transformer, microbatch) for par in layouts},
                         world, steps=STEPS, timeout_s=timeout_s, memory=True)
    out = {}
    for name, ranks in runs.items():
        kinds = dict(max(ranks, key=lambda run: run.peak["Total"]).peak)
        out[name] = MeasuredPeak(kinds.pop("Total"), kinds)
    return out


def predicted_layout_peak(par: Parallelism, transformer: TransformerShape, microbatch: int = 1) -> M.MemoryBreakdown:
    """proxies/layouts/memory.py's figure for one rank of `train --layout`'s step: float32 throughout, SGD with
    momentum, the embedding and head whole on every TP rank (its TP plan covers the decoder layers), gradients
    through the forward only under DDP (its buckets; one replica runs bare: proxies/layouts/train/build.py)."""
    from commbench.proxies.layouts.train.model import TRAINED_DTYPE_BYTES, replicas_wrapper

    replicated = par.dp * par.cp > 1
    fsdp = replicated and replicas_wrapper(par) == "fsdp"
    choices = M.MemoryChoices(microbatch=microbatch, sharding="fsdp" if fsdp else "none",
                              gradients_held=replicated and not fsdp, vocab_parallel=False)
    return M.memory_per_gpu(replace(transformer, dtype_bytes=TRAINED_DTYPE_BYTES), par, choices, SGD_MOMENTUM_FP32)
