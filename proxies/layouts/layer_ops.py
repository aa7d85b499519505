"""The operators one rank of a parallel layout runs per micro-batch, at the shapes the layout gives it, and their
time from a compute block (commbench/costmodel/compute.py).

One list serves both halves: `commbench compute` times exactly these shapes on the device, and
analysis/predict_layout.py costs them, so a layout measured is predicted from its own points. Per decoder layer
(a Llama-style layer: RMSNorm, Q/K/V and output projections, rotary, attention, a gated or plain MLP; MoE: the
router, the experts a rank holds at the tokens each gets, the shared experts), on T = microbatch x seq_len / cp
tokens, the matrices cut as Megatron-LM's tensor parallelism cuts them (heads, key/value heads and FFN over tp;
key/value heads copied where tp exceeds them):
- matrix products (M, N, K); the backward of each is two: dX (M, K, N) and dW (K, N, M);
- attention: the diagonal block causal, and under CP the ring's other blocks, (cp - 1) / 2 full blocks' work
  (the load-balanced split: half of each other block is masked);
- memory-bound operators as bytes streamed (norms and residual adds on T / tp tokens under sequence
  parallelism, rotary on Q and K, the MLP's activation), twice as much in the backward.
The head (last stage): the final norm, the output layer over vocab / tp and the loss on fp32 logits.
Not listed (costed at the block's `framework_us`, measured from a real layer against these pieces): views,
transposes, autograd's own bookkeeping. MLA (DeepSeek's latent attention) is not listed: `unlisted` says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from commbench.costmodel.compute import ComputeBlock, ComputeError
from commbench.proxies.layouts.parallelism import Parallelism


@dataclass(frozen=True)
class Matmul:
    m: int
    n: int
    k: int
    label: str
    count: float = 1.0


@dataclass(frozen=True)
class Attention:
    batch_heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool
    label: str
    count: float = 1.0


@dataclass(frozen=True)
class Streamed:
    nbytes: float  # read and written, forward
    label: str


def unlisted(shape) -> str | None:
    """Why a shape's layers are not listed here (and are costed by FLOPs at a rate instead), or None."""
    if shape.kv_lora_rank or shape.q_lora_rank:
        return "multi-head latent attention (MLA)"
    return None


def layer_ops(shape, par: Parallelism, microbatch: int, index: int) -> list:
    """Layer `index`'s forward operators on one rank (see the module's docstring)."""
    t = shape
    tokens = microbatch * t.seq_len // par.cp
    heads, kv = t.heads // par.tp, max(1, t.kv_heads // par.tp)
    norm_tokens = tokens // par.tp if par.sequence_parallel else tokens
    width = t.dtype_bytes
    ops: list = [Matmul(tokens, heads * t.head_dim, t.hidden, "q"),
                 Matmul(tokens, kv * (t.head_dim + t.value_head_dim), t.hidden, "kv"),
                 Matmul(tokens, t.hidden, heads * t.value_head_dim, "o")]
    local = t.seq_len // par.cp
    ops.append(Attention(microbatch * heads, local, local, t.head_dim, True, "attention"))
    if par.cp > 1:
        ops.append(Attention(microbatch * heads, local, local, t.head_dim, False, "attention (cp ring)",
                             (par.cp - 1) / 2))
    ops += _mlp_ops(t, par, tokens, index)
    ops += [Streamed(2 * 2 * norm_tokens * t.hidden * width, "norms"),
            Streamed(2 * 3 * norm_tokens * t.hidden * width, "residual adds"),
            Streamed(3 * tokens * (heads + kv) * t.head_dim * width, "rotary")]
    return ops


def _mlp_ops(t, par: Parallelism, tokens: int, index: int) -> list:
    matrices = 3 if t.gated_mlp else 2
    if not t.is_moe_layer(index):
        ffn = t.ffn // par.tp
        return [*_expert(tokens, ffn, t.hidden, matrices, "mlp", 1.0),
                Streamed(3 * tokens * ffn * t.dtype_bytes, "activation")]
    expert_tp = par.tp if par.expert_tp is None else par.expert_tp
    ffn = t.expert_ffn // expert_tp
    held = t.experts // par.ep
    per_expert = max(1, tokens * par.ep * t.top_k // t.experts)  # uniform routing over the EP group's tokens
    ops = [Matmul(tokens, t.experts, t.hidden, "router"), *_expert(per_expert, ffn, t.hidden, matrices, "experts",
                                                                  held)]
    if t.shared_experts:
        ops += _expert(tokens, ffn, t.hidden, matrices, "shared experts", t.shared_experts)
    ops.append(Streamed(3 * tokens * t.top_k * ffn * t.dtype_bytes, "activation"))
    return ops


def _expert(tokens: int, ffn: int, hidden: int, matrices: int, label: str, count: float) -> list:
    up = [Matmul(tokens, ffn, hidden, f"{label} up", count)] * (matrices - 1)
    return [*up, Matmul(tokens, hidden, ffn, f"{label} down", count)]


def head_ops(shape, par: Parallelism, microbatch: int) -> list:
    """The last stage's final norm, output layer (vocab / tp) and loss, forward."""
    tokens = microbatch * shape.seq_len // par.cp
    vocab = shape.vocab // par.tp
    return [Streamed(2 * tokens * shape.hidden * shape.dtype_bytes, "final norm"),
            Matmul(tokens, vocab, shape.hidden, "output layer"),
            Streamed(3 * tokens * vocab * 4, "loss (fp32 logits)")]


def matmuls(ops: list) -> list[Matmul]:
    """Every product a forward's `ops` and its backward run (dX, dW), the shapes `commbench compute` times."""
    out = []
    for op in ops:
        if isinstance(op, Matmul):
            out += [op, Matmul(op.m, op.k, op.n, op.label + " dX", op.count),
                    Matmul(op.k, op.n, op.m, op.label + " dW", op.count)]
    return out


@dataclass(frozen=True)
class OpTimes:
    forward_us: float
    backward_us: float
    attention_forward_us: float  # what selective checkpointing recomputes, and what a CP step runs beside


def op_times(block: ComputeBlock, ops: list, dtype: str, framework: bool = True) -> OpTimes:
    """`ops`' forward and backward on the block's device (ComputeError naming what the block lacks); with
    `framework`, a decoder layer's measured framework time is added."""
    forward = backward = attention = 0.0
    overhead = block.op_us or 0.0
    for op in ops:
        if isinstance(op, Matmul):
            f = block.matmul_us(op.m, op.n, op.k, dtype)
            b = block.matmul_us(op.m, op.k, op.n, dtype) + block.matmul_us(op.k, op.n, op.m, dtype)
            forward, backward = forward + op.count * f, backward + op.count * b
        elif isinstance(op, Attention):
            f, b = block.attention_us(op.batch_heads, op.seq_q, op.seq_kv, op.head_dim, op.causal, dtype)
            forward, backward, attention = forward + op.count * f, backward + op.count * b, attention + op.count * f
        else:
            streamed = block.memory_us(op.nbytes) + overhead
            forward, backward = forward + streamed, backward + 2 * streamed
    if framework:
        forward += block.framework_us.get("forward", 0.0)
        backward += block.framework_us.get("backward", 0.0)
    return OpTimes(forward, backward, attention)


def rank_layer_times(block: ComputeBlock, ops: list, dtype: str, tp: bool, fsdp: bool, share: float = 1.0) -> OpTimes:
    """A decoder layer's `ops` on one rank with what its wrappers add as measured on this device (DTensor's
    under `tp`, FSDP2's per unit under `fsdp`), times `share` (ranks sharing a CPU's cores: core_share)."""
    t = op_times(block, ops, dtype)
    forward, backward = t.forward_us, t.backward_us
    for key, applies in (("tp_layer", tp), ("fsdp_unit", fsdp)):
        if applies:
            forward += block.framework_us.get(f"{key}_forward", 0.0)
            backward += block.framework_us.get(f"{key}_backward", 0.0)
    return OpTimes(share * forward, share * backward, share * t.attention_forward_us)


def missing(block: ComputeBlock, dtype: str) -> list[str]:
    """The operator classes a layout's prediction needs that the block lacks (empty: it has them all)."""
    needs = [("matmul", f"{dtype} matrix products"), ("attention", f"{dtype} attention")]
    out = [what for klass, what in needs if not block.has(klass, dtype)]
    if not block.memory_gbps:
        out.append("memory_gbps")
    return out


def model_dtype(shape) -> str:
    """The precision a shape's operators run in: bfloat16 for 16-bit weights, else float32."""
    return "bfloat16" if shape.dtype_bytes == 2 else "float32"


def reading(block: ComputeBlock, shape) -> tuple[str, list[str]]:
    """(the precision to read `block` in for `shape`'s layers, what the block lacks for them): the model's own
    (model_dtype) where the block has its products, else the one it was measured in; the lacks empty where the
    block costs every operator (else a prediction falls back to one rate)."""
    wanted = model_dtype(shape)
    dtype = wanted if block.has("matmul", wanted) else block.meta.get("dtype", wanted)
    why = unlisted(shape)
    return dtype, missing(block, dtype) + ([f"the layers of {why}"] if why else [])


__all__ = ["Attention", "ComputeError", "Matmul", "OpTimes", "Streamed", "head_ops", "layer_ops", "matmuls",
           "missing", "model_dtype", "op_times", "rank_layer_times", "reading", "unlisted"]
