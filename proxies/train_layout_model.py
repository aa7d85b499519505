"""What `train --layout` trains: a layout's degrees on the ranks (`LayoutSpec`) and the small Llama it trains
(`ModelShape`, transformers' LlamaForCausalLM), with its synthetic tokens and loss. proxies/train_layout_build.py
lays the model out; proxies/train_layouts.py runs it and says what torch issues."""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved")
DIMENSIONS = ("pp", "dp", "cp", "tp")  # the mesh, outermost first: tp innermost (consecutive ranks)
DATA_PARALLEL = ("fsdp", "ddp")


@dataclass(frozen=True)
class LayoutSpec:
    """Degrees of a layout on `world` ranks; dp is what is left. EP borrows ep consecutive ranks of the
    flattened (dp, cp) ranks; pp > 1 runs `schedule` over `microbatches` with `virtual` stages per rank; the
    dp x cp replicas of each parameter are kept by `data_parallel`."""
    world: int = 4
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    microbatches: int = 4
    virtual: int = 1
    data_parallel: str = "fsdp"  # the replicas' wrapper: "fsdp" (FSDP2 fully_shard) or "ddp" (DistributedDataParallel)

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    def check(self, shape: ModelShape) -> None:
        """One ValueError for a layout that cannot run this shape."""
        if self.tp * self.pp * self.cp * self.dp != self.world:
            raise ValueError(f"tp {self.tp} x pp {self.pp} x cp {self.cp} does not divide {self.world} ranks")
        if shape.heads % self.tp or shape.kv_heads % self.tp:
            raise ValueError(f"tp {self.tp} does not divide {shape.heads} heads and {shape.kv_heads} kv heads")
        if shape.layers % (self.pp * self.virtual):
            raise ValueError(f"pp {self.pp} x {self.virtual} virtual stages does not divide {shape.layers} layers")
        if self.data_parallel not in DATA_PARALLEL or (self.data_parallel == "ddp" and self.ep > 1):
            raise ValueError(f"data parallelism {self.data_parallel!r} with ep {self.ep}: choose fsdp (any ep) or "
                             "ddp (ep 1)")
        if (self.dp * self.cp) % self.ep or (self.ep > 1 and shape.experts % self.ep):
            raise ValueError(f"ep {self.ep} does not divide dp x cp {self.dp * self.cp} and {shape.experts} experts")
        if self.schedule not in SCHEDULES or (self.virtual > 1) != (self.schedule == "interleaved" and self.pp > 1):
            raise ValueError(f"schedule {self.schedule!r} with {self.virtual} virtual stage(s)")
        if (self.pp > 1 and shape.batch % self.microbatches) or \
                shape.seq_len % (self.cp * (self.tp if self.sequence_parallel else 1)):
            raise ValueError(f"{self.microbatches} micro-batches or the sequence split does not fit {shape}")


@dataclass(frozen=True)
class ModelShape:
    """The small Llama that trains on 4 CPU ranks (`batch` sequences per data-parallel rank); experts > 0
    replaces every MLP by a top-k mixture of experts of `ffn` each."""
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    vocab: int = 1000
    seq_len: int = 64
    batch: int = 4
    experts: int = 0
    top_k: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def of(cls, transformer, batch: int) -> ModelShape:
        """A profile's TransformerShape (proxies/transformer.py) as trained here, or one ValueError for what
        this Llama cannot build (MLA, biases, shared experts, leading dense layers, un-gated MLPs, tied
        embeddings, a head size other than hidden / heads)."""
        t = transformer
        unsupported = [name for name in ("q_lora_rank", "shared_experts", "dense_layers", "attention_bias",
                                         "tied_embeddings") if getattr(t, name)]
        if not t.gated_mlp or t.head_dim * t.heads != t.hidden or t.v_head_dim not in (0, t.head_dim):
            unsupported.append("head sizes or MLP")
        if unsupported:
            raise ValueError(f"this shape does not train as a Llama here: {', '.join(unsupported)}")
        return cls(layers=t.layers, hidden=t.hidden, heads=t.heads, kv_heads=t.kv_heads,
                   ffn=t.expert_ffn if t.experts else t.ffn, vocab=t.vocab, seq_len=t.seq_len, batch=batch,
                   experts=t.experts, top_k=t.top_k if t.experts else 2)


def llama(shape: ModelShape, attention: str = "sdpa"):
    """transformers' LlamaForCausalLM of `shape` (fp32, no dropout, untied output layer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, intermediate_size=shape.ffn, vocab_size=shape.vocab,
                         max_position_embeddings=shape.seq_len, tie_word_embeddings=False)
    config._attn_implementation = attention
    return LlamaForCausalLM(config)


def tokens(shape: ModelShape, seed: int):
    """Tokens of one data-parallel rank's batch: inputs and next-token labels, (batch, seq_len) each."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randint(0, shape.vocab, (shape.batch, shape.seq_len + 1), generator=generator)
    return drawn[:, :-1].contiguous(), drawn[:, 1:].contiguous()


def loss(logits, labels):
    import torch
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
