"""Memory per GPU of a parallel layout: parameters, gradients, optimizer state and activations.

A layout's degrees are proxies/layouts/parallelism.py's Parallelism: tp, pp, cp, ep, dp (world = tp * pp * cp * dp;
the EP group is drawn from the dp * cp ranks, as Megatron-Core and torchtitan draw it), sequence
parallelism and the experts' tp. `MemoryChoices` holds the rest: the micro-batch size in sequences, the
sharding, checkpointing, and the micro-batches whose activations each pipeline stage holds at once
(1F1B: stage k holds pp - k; any schedule: per stage, as proxies/layouts/pipeline.py's `in_flight` counts them
from the schedule's order). Formulas and their sources: docs/layouts.md, "Shapes and memory".

- Model states follow ZeRO's accounting (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
  Toward Training Trillion Parameter Models", sec. 3.1 and 5): mixed-precision Adam keeps 2 bytes
  of bf16/fp16 parameters, 2 of gradients and K = 12 of optimizer state (fp32 master copy, momentum,
  variance) per parameter; `MEGATRON` keeps fp32 gradients (Megatron-LM's main_grad), 2 + 4 + 12.
  Sharding divides by the data-parallel degree: zero1 the optimizer state, zero2 also the gradients,
  fsdp (ZeRO-3, FSDP full shard) also the parameters, which then need an unsharded buffer for the
  layers being gathered (two layers: the one computing and the one prefetched).
- Activations per layer follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", sec. 4, Table 2), generalised from GPT's layer to the shape's (grouped-query
  heads, gated MLP, FFN size, experts); a GPT layer gives their sbh(34 + 5as/h) and its TP, SP,
  selective and full forms exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from commbench.proxies.transformer import TransformerShape

if TYPE_CHECKING:  # the degrees are read off the layout; layouts/parallelism.py's table of setups is not needed here
    from commbench.proxies.layouts.parallelism import Parallelism

CHECKPOINTING = ("none", "selective", "full")
SHARDING = ("none", "zero1", "zero2", "fsdp")
GIB = 2**30


@dataclass(frozen=True)
class Precision:
    name: str
    param_bytes: int  # per parameter, as the forward reads it
    grad_bytes: int
    optimizer_bytes: int  # fp32 master copy + Adam's two moments


ZERO = Precision("zero", 2, 2, 12)  # ZeRO sec. 3.1: (2 + 2 + K) psi, K = 12
MEGATRON = Precision("megatron", 2, 4, 12)  # bf16 parameters, fp32 gradient buffers


@dataclass(frozen=True)
class MemoryBreakdown:
    """One GPU's memory in bytes, on the pipeline stage that needs the most."""
    stage: int
    parameters_nbytes: int
    gradients_nbytes: int
    optimizer_nbytes: int
    activations_nbytes: int
    buffers_nbytes: int  # FSDP's gathered parameters at the loss's peak: the root unit (held gradients: + 2 layers)
    gradients_held: bool = True  # through the forward (MemoryChoices.gradients_held)
    backward_buffers_nbytes: int = 0  # FSDP's two layers gathered in the backward, beside the gradients

    @property
    def model_states_nbytes(self) -> int:
        return self.parameters_nbytes + self.gradients_nbytes + self.optimizer_nbytes

    @property
    def total_nbytes(self) -> int:
        """The peak: every part at once where the gradients live through the forward; else the larger of the
        loss's peak (no gradients yet, every activation held) and the backward's end (the gradients, no
        activations)."""
        if self.gradients_held:
            return self.model_states_nbytes + self.activations_nbytes + self.buffers_nbytes
        return self.parameters_nbytes + self.optimizer_nbytes + self.buffers_nbytes + \
            max(self.activations_nbytes, self.gradients_nbytes + self.backward_buffers_nbytes)


def model_state_nbytes(parameters: float, shard_degree: int, sharding: str,
                       precision: Precision = ZERO) -> tuple[float, float, float]:
    """Bytes of parameters, gradients and optimizer state for `parameters` replicated over
    `shard_degree` data-parallel ranks, with `sharding` dividing what it shards by that degree."""
    if sharding not in SHARDING:
        raise ValueError(f"sharding {sharding!r}: one of {', '.join(SHARDING)}")
    depth = SHARDING.index(sharding)  # 0 none, 1 optimizer, 2 + gradients, 3 + parameters
    return (parameters * precision.param_bytes / (shard_degree if depth >= 3 else 1),
            parameters * precision.grad_bytes / (shard_degree if depth >= 2 else 1),
            parameters * precision.optimizer_bytes / (shard_degree if depth >= 1 else 1))


def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage: as even as can be; what does not divide goes to the middle stages
    first, since the first and last stages also hold the embedding and the head (Llama 3 paper,
    Dubey et al. 2024, sec. 3.3.2: one layer fewer on the first and last stages)."""
    if not 1 <= pp <= layers:
        raise ValueError(f"pipeline degree {pp}: from 1 to the {layers} layers")
    counts = [layers // pp] * pp
    order = list(range(1, pp - 1)) + [0, pp - 1] if pp > 2 else list(range(pp))
    for stage in order[:layers % pp]:
        counts[stage] += 1
    return counts


def layer_activation_nbytes(shape: TransformerShape, index: int, microbatch: int, tp: int = 1, cp: int = 1, *,
                            sequence_parallel: bool = True, checkpointing: str = "none",
                            dropout: bool = False, expert_tp: int | None = None) -> float:
    """Bytes one layer keeps for its backward per micro-batch (Korthikanti et al. 2022, sec. 4):
    activations of the shape's dtype_bytes (their 16-bit 2 bytes; 4 for a float32 run), 1-byte dropout masks,
    s this CP rank's share of the sequence."""
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing {checkpointing!r}: one of {', '.join(CHECKPOINTING)}")
    s, b, h, w = shape.seq_len / cp, microbatch, shape.hidden, shape.dtype_bytes
    sb = s * b
    if checkpointing == "full":  # only the layer's input (sec. 4.3: 2sbh), split by SP
        return w * sb * h / (tp if sequence_parallel else 1)
    # not split by TP unless SP splits it: the two norms' inputs (4sbh), the attention and MLP inputs
    # (2sbh each), the two dropout masks (sbh each); MLA's latent down-projections
    replicated = 4 * w * sb * h + (2 * sb * h if dropout else 0)
    if shape.kv_lora_rank:
        replicated += w * sb * (shape.q_lora_rank + shape.kv_lora_rank + shape.qk_rope_head_dim)
    # split by TP: Q, K, V, the output projection's input, the MLP's intermediates
    split = w * sb * (shape.heads * shape.head_dim + shape.kv_heads * (shape.head_dim + shape.value_head_dim)
                      + shape.heads * shape.value_head_dim)
    if checkpointing == "none":  # softmax output 2as^2b; with dropout its mask as^2b and output 2as^2b
        split += (2 * w + 1 if dropout else w) * shape.heads * s * s * b
    if shape.is_moe_layer(index):
        replicated += 4 * sb * shape.experts + 2 * w * sb * shape.top_k * h  # fp32 router logits, dispatch, combine
        split += w * sb * shape.shared_experts * _mlp_intermediates(shape, shape.expert_ffn)
        split += w * sb * shape.top_k * _mlp_intermediates(shape, shape.expert_ffn) * tp / (expert_tp or tp)
    else:
        split += w * sb * _mlp_intermediates(shape, shape.ffn)
    return replicated / (tp if sequence_parallel else 1) + split / tp


def _mlp_intermediates(shape: TransformerShape, intermediate: int) -> int:
    """Elements per token an MLP keeps: gate, up and their product (gated); or the activation's
    input and output (GPT: 8h for 4h, Korthikanti's 16sbh)."""
    return (3 if shape.gated_mlp else 2) * intermediate


# Bytes per logit (sequence x vocabulary / tp) at the loss's backward beyond the logits themselves: the loss
# upcasts the logits to fp32 (transformers' ForCausalLMLoss, torchtitan's cross_entropy_loss), keeps the fp32
# log-softmax output for the backward (4), and its backward holds that output's gradient (4) and the fp32
# logits' gradient (4) at once. Measured on CPU with torch's MemTracker: 14.0 bytes a logit at bf16, 15.4 at
# fp32 (docs/memory.md, benchmarks/memory_measured.py).
LOSS_FP32_BYTES = 12


def output_activation_nbytes(shape: TransformerShape, microbatch: int, tp: int = 1, cp: int = 1) -> float:
    """The last stage's final norm and output layer at the peak of its loss: the head's input (Korthikanti et
    al. 2022, sec. 4.3: 4sbh/t for 16-bit) and, per logit (sbv/t), the logits in the model's dtype and the
    loss's fp32 buffers (LOSS_FP32_BYTES). Korthikanti's 4sbv/t counts the fp32 log-softmax output only; a
    real step also holds its gradient and the logits' while the loss's backward runs. `tp` 1 for a head that
    tensor parallelism leaves whole (MemoryChoices.vocab_parallel False)."""
    sb = shape.seq_len / cp * microbatch
    return (2 * shape.dtype_bytes * sb * shape.hidden + (shape.dtype_bytes + LOSS_FP32_BYTES) * sb * shape.vocab) / tp


@dataclass(frozen=True)
class MemoryChoices:
    """What memory depends on beside a layout's degrees (proxies/layouts/parallelism.py's Parallelism: tp, pp, cp, ep,
    dp, sequence parallelism, the experts' tp): the micro-batch, the schedule's in-flight micro-batches, the
    sharding of the model states, checkpointing and dropout."""
    microbatch: int = 1
    # micro-batches of its layers each stage holds at once: None, 1F1B's (stage k: pp - k); an int, the first
    # stage's, one fewer per later stage; a tuple, each stage's own (proxies/layouts/pipeline.py's in_flight of a
    # schedule's order, divided by the virtual stages for interleaved 1F1B: a chunk holds 1/v of the layers)
    in_flight: int | float | tuple[float, ...] | None = None
    sharding: str = "none"
    checkpointing: str = "none"
    dropout: bool = False
    shard_degree: int | None = None  # ranks the model states shard over; None: dp x cp (HSDP: a node's replicas)
    # whether gradients exist while the forward runs: DDP's buckets, a pipeline's or accumulation's earlier
    # micro-batches, Megatron's main_grad buffers keep them; FSDP2 with one micro-batch a step frees them
    # (zero_grad(set_to_none=True)), so its peak is the larger of the loss's and the backward's end
    gradients_held: bool = True
    # the embedding, the head and the loss split over tp (Megatron-LM's vocab-parallel layers, torchtitan's
    # loss_parallel); False: whole on every TP rank, as `train --layout` lays them out (its TP plan covers the
    # decoder layers only: proxies/layouts/train/parts.py)
    vocab_parallel: bool = True


def memory_per_gpu(shape: TransformerShape, par: Parallelism, choices: MemoryChoices = MemoryChoices(),
                   precision: Precision = ZERO) -> MemoryBreakdown:
    """The breakdown of layout `par` (its degrees) on the stage whose total is largest (the first holds the most
    activations, the last the head)."""
    _check(shape, par, choices)
    counts = stage_layers(shape.layers, par.pp)
    best = None
    for stage in range(par.pp):
        breakdown = _stage_memory(shape, par, choices, precision, stage, counts)
        if best is None or breakdown.total_nbytes > best.total_nbytes:
            best = breakdown
    return best


def _check(shape: TransformerShape, layout: Parallelism, choices: MemoryChoices) -> None:
    for name in ("tp", "pp", "cp", "ep", "dp"):
        if getattr(layout, name) < 1:
            raise ValueError(f"layout: {name} must be at least 1")
    if choices.microbatch < 1:
        raise ValueError("layout: microbatch must be at least 1")
    if isinstance(choices.in_flight, tuple) and len(choices.in_flight) != layout.pp:
        raise ValueError(f"layout: in_flight gives {len(choices.in_flight)} stages' counts for pp {layout.pp}")
    ranks = layout.dp * layout.cp * _expert_ranks(layout)
    if ranks % layout.ep:
        raise ValueError(f"layout: ep {layout.ep} must divide dp x cp{' x tp' if _expert_ranks(layout) > 1 else ''} "
                         f"= {ranks}")
    if shape.moe and shape.experts % layout.ep:
        raise ValueError(f"layout: ep {layout.ep} does not divide the {shape.experts} experts")
    if shape.heads % layout.tp:
        raise ValueError(f"layout: tp {layout.tp} does not divide the {shape.heads} heads")


def stage_parameters(shape: TransformerShape, layout: Parallelism, stage: int,
                     counts: list[int] | None = None, vocab_parallel: bool = True) -> tuple[float, float, float]:
    """(dense, expert, largest layer's) parameters one GPU of pipeline stage `stage` holds: its layers' split by
    tp (experts by ep x expert tp), the embedding on the first stage, the final norm and head on the last."""
    tp, etp = layout.tp, layout.expert_tp or layout.tp
    counts = counts or stage_layers(shape.layers, layout.pp)
    first = sum(counts[:stage])
    dense, experts, largest_layer = 0.0, 0.0, 0.0
    for index in range(first, first + counts[stage]):
        p = shape.layer_parameters(index)
        layer_dense = (p["attention"] + p["mlp"] + p["shared_experts"]) / tp + p["router"] + p["norms"]
        layer_experts = p["experts"] / (layout.ep * etp)
        dense, experts = dense + layer_dense, experts + layer_experts
        largest_layer = max(largest_layer, layer_dense + layer_experts)
    return dense + root_parameters(shape, layout, stage, vocab_parallel), experts, largest_layer


def root_parameters(shape: TransformerShape, layout: Parallelism, stage: int, vocab_parallel: bool = True) -> float:
    """The parameters of stage `stage` outside its layers, per GPU: the embedding on the first stage, the final
    norm and the head on the last (FSDP's root unit), split over tp where `vocab_parallel`."""
    tp = layout.tp if vocab_parallel else 1
    root = shape.vocab * shape.hidden / tp if stage == 0 else 0.0
    if stage == layout.pp - 1:  # a tied head is a second copy when it sits on another stage
        tied_elsewhere = shape.tied_embeddings and layout.pp > 1
        root += shape.hidden + (shape.vocab * shape.hidden / tp if tied_elsewhere or not shape.tied_embeddings else 0)
    return root


def _expert_ranks(layout: Parallelism) -> int:
    """The tensor-parallel ranks that join the experts' data-parallel ranks: tp when the experts have no tensor
    parallelism of their own (expert_tp 1, Megatron-Core's etp1), else 1."""
    return layout.tp if layout.expert_tp == 1 else 1


def _stage_memory(shape: TransformerShape, layout: Parallelism, choices: MemoryChoices, precision: Precision,
                  stage: int, counts: list[int]) -> MemoryBreakdown:
    tp, c = layout.tp, choices
    first = sum(counts[:stage])
    dense, experts, largest_layer = stage_parameters(shape, layout, stage, counts, c.vocab_parallel)
    replicas = c.shard_degree or layout.dp * layout.cp
    expert_replicas = max(1, (c.shard_degree or layout.dp * layout.cp * _expert_ranks(layout)) // layout.ep)
    states = [a + b for a, b in zip(model_state_nbytes(dense, replicas, c.sharding, precision),
                                    model_state_nbytes(experts, expert_replicas, c.sharding, precision))]
    if isinstance(c.in_flight, tuple):
        held = c.in_flight[stage]
    else:
        held = max(1, (c.in_flight or layout.pp) - stage)
    activations = held * sum(layer_activation_nbytes(
        shape, index, c.microbatch, tp, layout.cp, sequence_parallel=layout.sequence_parallel,
        checkpointing=c.checkpointing, dropout=c.dropout, expert_tp=layout.expert_tp)
        for index in range(first, first + counts[stage]))
    if stage == layout.pp - 1:
        activations += output_activation_nbytes(shape, c.microbatch, tp if c.vocab_parallel else 1, layout.cp)
    # FSDP's gathered parameters: the root unit (embedding, head) from its forward to the end of the backward,
    # and two layers in the backward (the one computing and the one prefetched); measured on CPU with
    # FSDPMemTracker, the root unit and no decoder layer gathered at the loss's peak (docs/memory.md). Where the
    # gradients are held the layers count at the peak too (a pipeline's backward runs beside later forwards).
    fsdp = c.sharding == "fsdp"
    root = root_parameters(shape, layout, stage, c.vocab_parallel) * precision.param_bytes if fsdp else 0.0
    layers = 2 * largest_layer * precision.param_bytes if fsdp else 0.0
    buffers, backward = (root + layers, 0.0) if c.gradients_held else (root, layers)
    return MemoryBreakdown(stage, *(round(x) for x in (*states, activations, buffers)), c.gradients_held,
                           round(backward))


def fits(breakdown: MemoryBreakdown, gpu_nbytes: int, reserved_fraction: float = 0.0) -> bool:
    """Whether the breakdown fits a GPU of `gpu_nbytes`, keeping `reserved_fraction` of it free (for
    the allocator's fragmentation, the communication library's buffers, the CUDA context)."""
    return breakdown.total_nbytes <= gpu_nbytes * (1.0 - reserved_fraction)
