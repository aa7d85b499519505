"""What each parallel dimension of a layout communicates, per transformer layer and micro-batch.

The calls are Megatron-LM's (Shoeybi et al. 2019, section 3, and Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", section 4.2.2, for sequence parallelism),
on the activations of one micro-batch: `b` sequences of `s / cp` tokens (context parallelism splits
the sequence), `h` wide, in the activations' dtype:

| dimension | forward, per layer | backward, per layer |
|---|---|---|
| tp | 2 allreduces of b s h (after attention, after the MLP) | 2 allreduces of b s h (the inputs' gradients) |
| tp with sp | 2 all-gathers + 2 reduce-scatters of b s h (MoE layer under etp1: 1 + 1) | the same (transposes) |
| cp | cp - 1 ring steps, each passing this rank's K and V blocks on | cp - 1 steps passing K, V and their gradients |
| ep (MoE layers) | 2 all-to-alls of b s k h (dispatch, combine) | 2 all-to-alls of b s k h |
| pp | one send of b s h per stage boundary and micro-batch (`boundary_nbytes`) | one send of its gradient |

Two styles (`style`): "megatron" is the table above, as Megatron-LM issues it with its fused QKV and
gate/up projections; "torch" is what torch's own tensor parallelism issues (docs/layouts.md, "What torch
issues", traced on gloo): one backward allreduce per column-parallel linear (q, k, v, gate, up: 5 a layer
for a gated MLP) instead of 2, and under SP two allreduces a layer of the norms' weight gradients (h) plus
an all-gather entering and one leaving the layers per micro-batch (embedding and output layer replicated);
Megatron-LM coalesces its norms' reduction into one call a step (finalize_model_grads). Both styles: a CP
ring passes the key/value gradients cp times (each block's gradient ends where the block lives), and an
EP layer's forward first exchanges the per-expert token counts (E int64), as torchtitan and Megatron-Core's
all-to-all dispatcher do.

An MoE layer whose experts have no tensor parallelism (`etp1`) issues only its attention block's TP calls
under SP: Megatron-Core's token dispatchers take the sequence-parallel tokens as they are ([S/TP, B, H]) and
gather only over the experts' own TP group, one rank under etp1 (NVIDIA/Megatron-LM
megatron/core/transformer/moe/token_dispatcher.py @ 0014f137); with the experts split by TP (the default)
the dispatcher gathers and scatters over TP instead, so the count stays the dense layer's. Without SP there
is nothing to follow: Megatron-Core refuses to train MoE layers under TP without SP (MoELayer.forward,
megatron/core/transformer/moe/moe_layer.py @ 00119989), and so does `Parallelism.check` for etp1 on a model
with experts. The "torch" style is `train`'s MoE (proxies/layouts/train/moe.py), whose experts are whole on
each rank: under SP it takes this TP rank's tokens as they are, etp1's path, whatever `expert_tp` says
(traced: tests/unit/proxies/layouts/train/test_local_layouts.py, "tp2 sp ep2 dp2").

Sizes are nccl-tests' (the larger per-rank buffer): an all-gather's output, a reduce-scatter's input, an
all-to-all's whole send buffer. Full activation checkpointing runs the forward again in the backward,
its calls included (`checkpointing="full"`); selective checkpointing recomputes the attention core only,
which communicates nothing. Context-parallel ring steps overlap the attention compute they feed
(`overlaps="attention"`); the rest wait on the compute and are waited for (exposed), as Megatron-LM runs
them without its optional TP overlap. The data-parallel dimension is the setups table's
(proxies/setups.py) on the gradients of a rank's shard of the model, over `dp x cp` ranks (context-parallel
ranks hold the same weights).

`shape` is a model's TransformerShape (proxies/transformer.py), whose methods give the bytes of each
activation (`tp_activation_nbytes`, `cp_kv_block_nbytes`, `ep_dispatch_nbytes`, `pp_boundary_nbytes`), in
its `dtype_bytes`.
"""
from __future__ import annotations

from dataclasses import dataclass

from commbench.proxies.layouts.parallelism import Parallelism

DTYPES = {4: "float32", 2: "bfloat16"}  # a shape's dtype_bytes -> the calls' dtype
CHECKPOINTING = ("none", "selective", "full")
STYLES = ("megatron", "torch")
EP_DISPATCHERS = ("alltoall", "deepep")  # Megatron's all-to-all token dispatcher; DeepEP's normal kernels
EP_DISPATCH = "ep dispatch and combine"  # the label of the MoE tokens' all-to-alls (a dispatcher may cost them its way)


@dataclass(frozen=True)
class LayerCall:
    dim: str  # tp, cp, ep
    collective: str  # allreduce, allgather, reduce_scatter, alltoall, sendrecv
    nbytes: int  # per rank, nccl-tests' size
    dtype: str
    phase: str  # forward, backward
    count: int  # calls of this kind per layer and micro-batch
    overlaps: str  # "" (exposed) or the compute it runs beside ("attention")
    label: str


@dataclass(frozen=True)
class CallContext:
    """What every dimension's calls of one layer and micro-batch are sized by."""
    par: Parallelism
    shape: object  # proxies.transformer.TransformerShape
    microbatch: int
    dtype: str  # the activations'
    act: int  # b s h bytes of this CP rank's tokens
    replays: int  # 2 under full checkpointing: the backward runs the forward's calls again
    moe: bool  # a layer with experts
    style: str


def _tp_calls(c: CallContext) -> list[LayerCall]:
    par, shape, calls = c.par, c.shape, []
    if par.sequence_parallel:
        # etp1 (torch: always, its experts whole): the attention's only
        blocks = 1 if c.moe and (par.expert_tp == 1 or c.style == "torch") else 2
        for phase, times in (("forward", 1), ("backward", c.replays)):
            calls.append(LayerCall("tp", "allgather", c.act, c.dtype, phase, blocks * times, "", "tp all-gather (sp)"))
            calls.append(LayerCall("tp", "reduce_scatter", c.act, c.dtype, phase, blocks * times, "",
                                   "tp reduce-scatter (sp)"))
        if c.style == "torch":  # SequenceParallel norms: their weights' gradients are partial on each rank
            calls.append(LayerCall("tp", "allreduce", shape.hidden * shape.dtype_bytes, c.dtype, "backward", 2, "",
                                   "tp norm weights (sp)"))
        return calls
    column = 3 + (2 if shape.gated_mlp else 1) if c.style == "torch" else 2  # torch: q, k, v, gate, up
    return [LayerCall("tp", "allreduce", c.act, c.dtype, "forward", 2, "", "tp allreduce"),
            LayerCall("tp", "allreduce", c.act, c.dtype, "backward", column + 2 * (c.replays - 1), "",
                      "tp allreduce (recomputed forward's included)")]


def _cp_calls(c: CallContext) -> list[LayerCall]:
    par, shape = c.par, c.shape
    kv = shape.cp_kv_block_nbytes(c.microbatch, par.cp) * _kv_heads_per_rank(par, shape) // shape.kv_heads
    return [LayerCall("cp", "sendrecv", kv, c.dtype, "forward", par.cp - 1, "attention", "cp ring K/V"),
            LayerCall("cp", "sendrecv", kv, c.dtype, "backward", (par.cp - 1) * c.replays, "attention",
                      "cp ring K/V (again)"),
            LayerCall("cp", "sendrecv", kv, c.dtype, "backward", par.cp, "attention", "cp ring dK/dV (home included)")]


def _ep_calls(c: CallContext) -> list[LayerCall]:
    par, shape = c.par, c.shape
    if not c.moe:  # a dense layer of a model with experts: its tokens stay on the rank
        return []
    local = c.microbatch * shape.seq_len // par.cp // (par.tp if par.sequence_parallel else 1)
    routed = shape.ep_dispatch_nbytes(local)
    calls = [LayerCall("ep", "alltoall", 8 * shape.experts, "int64", "forward", 1, "", "ep token counts")]
    if c.replays > 1:
        calls.append(LayerCall("ep", "alltoall", 8 * shape.experts, "int64", "backward", 1, "",
                               "ep token counts (recomputed forward)"))
    return calls + [LayerCall("ep", "alltoall", routed, c.dtype, "forward", 2, "", EP_DISPATCH),
                    LayerCall("ep", "alltoall", routed, c.dtype, "backward", 2 * c.replays, "", EP_DISPATCH)]


# The dimensions that communicate inside a layer, in the order a layer issues them: a new dimension is an entry
# (its degree's name on Parallelism, its calls). pp's sends sit between layers (boundary_nbytes); dp is the
# setups table's (proxies/setups.py).
LAYER_DIMENSIONS = {"tp": _tp_calls, "cp": _cp_calls, "ep": _ep_calls}


def layer_calls(par: Parallelism, shape, microbatch: int, checkpointing: str = "none",
                moe: bool = False, style: str = "megatron") -> list[LayerCall]:
    """The calls one transformer layer issues for one micro-batch (`moe`: a layer with experts)."""
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"activation checkpointing {checkpointing!r}: choose from {', '.join(CHECKPOINTING)}")
    if style not in STYLES:
        raise ValueError(f"calls' style {style!r}: choose from {', '.join(STYLES)}")
    context = CallContext(par, shape, microbatch, dtype=DTYPES.get(shape.dtype_bytes, "float16"),
                          act=shape.tp_activation_nbytes(microbatch, par.cp),
                          replays=2 if checkpointing == "full" else 1, moe=moe, style=style)
    return [call for dim, calls_of in LAYER_DIMENSIONS.items() if getattr(par, dim) > 1 for call in calls_of(context)]


def _kv_heads_per_rank(par: Parallelism, shape) -> int:
    """Key/value heads a tensor-parallel rank holds (whole heads, or one copy when tp exceeds them)."""
    return max(1, shape.kv_heads // par.tp)


def boundary_nbytes(par: Parallelism, shape, microbatch: int) -> int:
    """Bytes a pipeline stage sends its neighbour per micro-batch: the activation (forward) or its gradient
    (backward), b s h, split over the TP ranks under sequence parallelism."""
    return shape.pp_boundary_nbytes(microbatch, par.tp, par.cp, par.sequence_parallel)


def step_bytes(par: Parallelism, shape, microbatch: int, checkpointing: str = "none",
               stage: int = 0, style: str = "megatron") -> dict[tuple[str, str], tuple[int, int]]:
    """(dimension, collective) -> (calls, bytes) on one rank of pipeline stage `stage` per step, summed over its
    layers and micro-batches, its pipeline sends included (each model chunk sends its activations on unless it
    is the last virtual stage, its gradients back unless it is the first): what a trace of the step is compared
    with."""
    layers = shape.layers // par.pp
    moe = shape.moe_layers // par.pp
    out: dict[tuple[str, str], tuple[int, int]] = {}

    def add(key: tuple[str, str], calls: int, nbytes: int) -> None:
        before = out.get(key, (0, 0))
        out[key] = (before[0] + calls, before[1] + calls * nbytes)

    for kind, count in (("dense", layers - moe), ("moe", moe)):
        for call in layer_calls(par, shape, microbatch, checkpointing, moe=kind == "moe", style=style):
            add((call.dim, call.collective), call.count * count * par.microbatches, call.nbytes)
    for key, calls, nbytes in outside_layer_calls(par, shape, microbatch, stage, style):
        add(key, calls, nbytes)
    stages = par.pp * par.virtual_stages
    for chunk in range(par.virtual_stages if par.pp > 1 else 0):
        j = chunk * par.pp + stage
        sends = (j < stages - 1) + (j > 0)
        if sends:
            add(("pp", "send"), sends * par.microbatches, boundary_nbytes(par, shape, microbatch))
    return out


def outside_layer_calls(par: Parallelism, shape, microbatch: int, stage: int = 0,
                        style: str = "megatron") -> list[tuple[tuple[str, str], int, int]]:
    """The calls a step of pipeline stage `stage` issues outside its layers, as ((dimension, collective), calls,
    bytes each): sequence parallelism's (below); none otherwise."""
    if par.tp > 1 and par.sequence_parallel:
        return _sp_step_calls(par, shape, microbatch, stage, shape.layers // par.pp, style)
    return []


def _sp_step_calls(par: Parallelism, shape, microbatch: int, stage: int, layers: int, style: str) -> list:
    """Sequence parallelism's calls outside the layers, per step: torch gathers the sequence entering the
    layers (the embedding's output, in the backward) and leaving them (into the replicated output layer) each
    micro-batch, on the first and the last stage; Megatron-LM reduces its norms' weight gradients in one call."""
    if style == "megatron":
        return [(("tp", "allreduce"), 1, 2 * layers * shape.hidden * shape.dtype_bytes)]
    act = shape.tp_activation_nbytes(microbatch, par.cp)
    ends = (stage == 0) + (stage == par.pp - 1)
    return [(("tp", "allgather"), ends * par.microbatches, act)] if ends else []
