"""A decoder-only transformer's shape: what parallel layouts need of a model beyond its tensor list.

`TransformerShape` holds the hyper-parameters of a published configuration (layers, hidden size,
query and key/value heads, FFN size, vocabulary, sequence length; mixture-of-experts: routed and
shared experts, top-k, the leading dense layers; multi-head latent attention's ranks) and derives:
- parameter counts per layer kind (`parameter_counts`, `layer_parameters`);
- FLOPs per token of the forward per layer, the attention scores growing with the sequence, and of
  a training step (backward = 2 x forward, plus what recomputation repeats);
- the activation tensors a layout's collectives move (TP/SP, EP dispatch and combine, CP ring
  steps, the PP boundary), in bytes.

FLOP convention (docs/layouts.md "Shapes and memory"): a multiply-add is 2 FLOPs and only matrix
products count, as torch.utils.flop_counter counts them. Per token and layer the forward takes
2 x (the layer's matrix parameters; routed experts: only the top_k chosen) plus the attention scores
2 * heads * seq * (qk_head_dim + v_head_dim) (Q K^T and scores x V); the head takes 2 * hidden *
vocab. Causal masking is NOT halved: this is the count of Narayanan et al. 2021 ("Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. 3: per layer and token
24h^2 + 4sh forward for h-wide GPT layers) and of PaLM (Chowdhery et al. 2022, appendix B: 6N +
12 L H Q T per token for training), and what FlopCounterMode counts for scaled_dot_product_attention;
`causal_halved=True` halves the score term, as kernels that skip masked blocks do.

`from_config` reads a transformers config object (Llama, Mistral, Mixtral, DeepSeek-V3) by its
attributes; nothing here imports torch or transformers.
"""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

MAX_DIM = 2**31  # any one hyper-parameter: generous beyond any published model, and finite
MAX_LAYERS = 100_000


@dataclass(frozen=True)
class TransformerShape:
    layers: int
    hidden: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int  # query/key head size (MLA: nope + rope part)
    ffn: int  # the dense MLP's intermediate size
    vocab: int
    seq_len: int  # tokens per sequence
    tied_embeddings: bool = False
    gated_mlp: bool = True  # SwiGLU (gate, up, down) as Llama; False: two matrices, as GPT
    attention_bias: bool = False  # biases on Q, K, V (Qwen2); none on the output projection
    v_head_dim: int = 0  # value head size; 0: head_dim
    experts: int = 0  # routed experts per MoE layer; 0: a dense model
    top_k: int = 0  # routed experts per token
    expert_ffn: int = 0  # each routed (and shared) expert's intermediate size
    shared_experts: int = 0  # experts every token passes through (DeepSeek)
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model (DeepSeek-V3: 3)
    q_lora_rank: int = 0  # multi-head latent attention (DeepSeek-V2/V3); 0: plain Q/K/V projections
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0  # the part of head_dim carrying rotary position (MLA)
    dtype_bytes: int = 2  # activations and parameters as trained (bf16)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and type(value) is not bool:
                raise ValueError(f"transformer shape: {f.name} must be true or false, not {value!r}")
            if f.type == "int" and (type(value) is not int or not 0 <= value <= MAX_DIM):
                raise ValueError(f"transformer shape: {f.name} must be an integer from 0 to {MAX_DIM:,d}, "
                                 f"not {value!r}")
        if self.layers > MAX_LAYERS:  # what is built from a shape loops over its layers: keep it finite
            raise ValueError(f"transformer shape: {self.layers:,d} layers; at most {MAX_LAYERS:,d}")
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "seq_len", "dtype_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"transformer shape: {name} must be at least 1")
        if self.heads % self.kv_heads:
            raise ValueError(f"transformer shape: {self.kv_heads} key/value heads do not divide {self.heads} heads")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"transformer shape: top_k {self.top_k} must be from 1 to the {self.experts} experts")
        if self.dense_layers > self.layers:
            raise ValueError(f"transformer shape: {self.dense_layers} dense layers of {self.layers}")

    # ------------------------------------------------------------ structure

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    def is_moe_layer(self, index: int) -> bool:
        return self.moe and index >= self.dense_layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ------------------------------------------------------------ parameters

    def attention_parameters(self) -> int:
        """One layer's attention matrices (and Q/K/V biases), its norms excluded."""
        h, hd, vd = self.hidden, self.head_dim, self.value_head_dim
        if self.kv_lora_rank:  # MLA: down-projections, then up-projections per head
            q = (h * self.q_lora_rank + self.q_lora_rank * self.heads * hd if self.q_lora_rank
                 else h * self.heads * hd)
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + \
                self.kv_lora_rank * self.heads * (hd - self.qk_rope_head_dim + vd)
            return q + kv + self.heads * vd * h
        bias = (self.heads + self.kv_heads) * hd + self.kv_heads * vd if self.attention_bias else 0
        return h * (self.heads * hd + self.kv_heads * (hd + vd)) + self.heads * vd * h + bias

    def mlp_parameters(self, intermediate: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * intermediate

    def layer_norm_parameters(self) -> int:
        """One layer's RMSNorm weights: before attention and MLP, and MLA's two latent norms."""
        return 2 * self.hidden + (self.q_lora_rank + self.kv_lora_rank if self.kv_lora_rank else 0)

    def layer_parameters(self, index: int) -> dict[str, int]:
        """Layer `index`'s parameters by kind: attention, mlp (dense), router, experts (routed, all of
        them), shared_experts, norms."""
        out = {"attention": self.attention_parameters(), "mlp": 0, "router": 0, "experts": 0,
               "shared_experts": 0, "norms": self.layer_norm_parameters()}
        if self.is_moe_layer(index):
            out.update(router=self.hidden * self.experts,
                       experts=self.experts * self.mlp_parameters(self.expert_ffn),
                       shared_experts=self.shared_experts * self.mlp_parameters(self.expert_ffn))
        else:
            out["mlp"] = self.mlp_parameters(self.ffn)
        return out

    def parameter_counts(self) -> dict[str, int]:
        """The whole model's parameters by kind (embedding, the layers' kinds, final norm, head)."""
        counts = {"embedding": self.vocab * self.hidden}
        for index in range(self.layers):
            for kind, n in self.layer_parameters(index).items():
                counts[kind] = counts.get(kind, 0) + n
        counts["final_norm"] = self.hidden
        counts["head"] = 0 if self.tied_embeddings else self.vocab * self.hidden
        return counts

    @property
    def parameters(self) -> int:
        return sum(self.parameter_counts().values())

    @property
    def active_parameters(self) -> int:
        """Parameters a token passes through: the routed experts' top_k of `experts`."""
        counts = self.parameter_counts()
        routed = counts["experts"] * self.top_k // self.experts if self.moe else 0
        return sum(counts.values()) - counts["experts"] + routed

    # ------------------------------------------------------------ FLOPs

    def attention_score_flops(self, seq_len: int | None = None, causal_halved: bool = False) -> float:
        """Forward FLOPs per token of Q K^T and scores x V in one layer: they grow with the sequence."""
        seq = self.seq_len if seq_len is None else seq_len
        flops = 2.0 * self.heads * seq * (self.head_dim + self.value_head_dim)
        return flops / 2 if causal_halved else flops

    def layer_forward_flops(self, index: int, seq_len: int | None = None, causal_halved: bool = False) -> float:
        """Forward FLOPs per token of layer `index`: its matrices (MoE: router, top_k routed experts
        and the shared ones) and the attention scores."""
        p = self.layer_parameters(index)
        matrices = p["attention"] + p["mlp"] + p["router"] + p["shared_experts"]
        if p["experts"]:
            matrices += self.top_k * self.mlp_parameters(self.expert_ffn)
        if self.attention_bias:  # a bias is an addition, not a multiply-add
            matrices -= (self.heads + self.kv_heads) * self.head_dim + self.kv_heads * self.value_head_dim
        return 2.0 * matrices + self.attention_score_flops(seq_len, causal_halved)

    def head_forward_flops(self) -> float:
        return 2.0 * self.hidden * self.vocab

    def forward_flops_per_token(self, seq_len: int | None = None, causal_halved: bool = False) -> float:
        return sum(self.layer_forward_flops(i, seq_len, causal_halved) for i in range(self.layers)) + \
            self.head_forward_flops()

    def backward_flops_per_token(self, seq_len: int | None = None, causal_halved: bool = False) -> float:
        """The gradients of inputs and of weights each cost a forward's products: 2 x forward."""
        return 2.0 * self.forward_flops_per_token(seq_len, causal_halved)

    def recompute_flops_per_token(self, checkpointing: str, seq_len: int | None = None,
                                  causal_halved: bool = False) -> float:
        """What the backward repeats of the forward: none; selective (Korthikanti et al. 2022 sec. 5:
        the attention core, Q K^T and scores x V); full (every layer's forward, not the head)."""
        if checkpointing == "none":
            return 0.0
        if checkpointing == "selective":
            return self.layers * self.attention_score_flops(seq_len, causal_halved)
        if checkpointing == "full":
            return self.forward_flops_per_token(seq_len, causal_halved) - self.head_forward_flops()
        raise ValueError(f"checkpointing {checkpointing!r}: none, selective or full")

    def training_flops_per_token(self, checkpointing: str = "none", seq_len: int | None = None,
                                 causal_halved: bool = False) -> float:
        return 3.0 * self.forward_flops_per_token(seq_len, causal_halved) + \
            self.recompute_flops_per_token(checkpointing, seq_len, causal_halved)

    # ------------------------------------------------------------ what collectives move

    def tp_activation_nbytes(self, microbatch: int, cp: int = 1) -> int:
        """b x s x h: what a TP allreduce moves per call (with SP, the all-gather's output and the
        reduce-scatter's input; each rank holds 1/tp of it); s is this CP rank's share."""
        return microbatch * self._local_seq(cp) * self.hidden * self.dtype_bytes

    def pp_boundary_nbytes(self, microbatch: int, tp: int = 1, cp: int = 1, sequence_parallel: bool = False) -> int:
        """The activation one stage sends the next per micro-batch (and its gradient back): b x s x h,
        split by tp when sequence parallelism leaves it split."""
        return self.tp_activation_nbytes(microbatch, cp) // (tp if sequence_parallel else 1)

    def ep_dispatch_nbytes(self, tokens: int) -> int:
        """tokens x top_k x hidden: what one rank's all-to-all dispatch sends for `tokens` of its own
        tokens (the combine returns as much)."""
        return tokens * self.top_k * self.hidden * self.dtype_bytes

    def cp_kv_block_nbytes(self, microbatch: int, cp: int) -> int:
        """One ring-attention step's key and value block: b x s/cp x kv_heads x (qk + v head dims)
        (MLA's keys and values after their up-projection)."""
        return microbatch * self._local_seq(cp) * self.kv_heads * (self.head_dim + self.value_head_dim) * \
            self.dtype_bytes

    def _local_seq(self, cp: int) -> int:
        if cp < 1 or self.seq_len % cp:
            raise ValueError(f"context parallel degree {cp} does not divide the sequence of {self.seq_len}")
        return self.seq_len // cp


def shape_from_dict(data: Any) -> TransformerShape:
    """A shape from a profile's `transformer` object; a ValueError names the first bad field."""
    if not isinstance(data, dict):
        raise ValueError("'transformer' must be an object")
    known = {f.name for f in fields(TransformerShape)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"'transformer' has unknown field {unknown[0]!r}")
    missing = [f.name for f in fields(TransformerShape) if f.name not in data and f.default is MISSING]
    if missing:
        raise ValueError(f"'transformer' lacks {', '.join(missing)}")
    return TransformerShape(**data)


def _first(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


_QKV_BIAS = {"qwen2": True}  # configs with no attention_bias field whose model puts biases on Q, K and V


def from_config(config: Any, seq_len: int | None = None, dtype_bytes: int = 2) -> TransformerShape:
    """A shape from a transformers config (LlamaConfig, MistralConfig, Qwen2Config, MixtralConfig,
    DeepseekV3Config, read by attribute name); `seq_len` defaults to max_position_embeddings."""
    layers, hidden = _first(config, "num_hidden_layers"), _first(config, "hidden_size")
    heads = _first(config, "num_attention_heads")
    if None in (layers, hidden, heads):
        raise ValueError(f"{type(config).__name__}: not a decoder config (num_hidden_layers, hidden_size, "
                         f"num_attention_heads)")
    kv_lora = _first(config, "kv_lora_rank", default=0)
    config_type = getattr(config, "model_type", "")
    head_dim = _first(config, "qk_head_dim", default=0) if kv_lora else 0
    head_dim = head_dim or _first(config, "head_dim", default=0) or hidden // heads
    experts = _first(config, "num_local_experts", "n_routed_experts", "num_experts", default=0)
    moe_ffn = _first(config, "moe_intermediate_size", default=0)
    return TransformerShape(
        layers=layers, hidden=hidden, heads=heads, kv_heads=_first(config, "num_key_value_heads", default=heads),
        head_dim=head_dim, ffn=_first(config, "intermediate_size"), vocab=_first(config, "vocab_size"),
        seq_len=seq_len or _first(config, "max_position_embeddings"),
        tied_embeddings=bool(_first(config, "tie_word_embeddings", default=False)),
        attention_bias=bool(_first(config, "attention_bias", default=_QKV_BIAS.get(config_type))) and not kv_lora,
        v_head_dim=_first(config, "v_head_dim", default=0) if kv_lora else 0,
        experts=experts, top_k=_first(config, "num_experts_per_tok", default=0) if experts else 0,
        expert_ffn=(moe_ffn or _first(config, "intermediate_size")) if experts else 0,
        shared_experts=_first(config, "n_shared_experts", default=0) if experts else 0,
        dense_layers=_first(config, "first_k_dense_replace", default=0) if experts else 0,
        q_lora_rank=_first(config, "q_lora_rank", default=0) if kv_lora else 0,
        kv_lora_rank=kv_lora, qk_rope_head_dim=_first(config, "qk_rope_head_dim", default=0) if kv_lora else 0,
        dtype_bytes=dtype_bytes)
