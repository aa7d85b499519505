"""What `train --layout` trains: a small transformers LlamaForCausalLM of a profile's shape (`Trained`: the
TransformerShape that predictions read, and a batch) with its synthetic tokens and loss, and what a layout
(proxies/layouts/parallelism.py's Parallelism, the one value of a layout's degrees) must be to train it here
(`check_trainable`). proxies/layouts/train/build.py lays the model out; proxies/layouts/train/local.py runs it
and says what torch issues."""
from __future__ import annotations

from dataclasses import dataclass, replace

from commbench.proxies.profile import DTYPE_BYTES
from commbench.proxies.transformer import TransformerShape

DIMENSIONS = ("pp", "dp", "cp", "tp")  # the mesh, outermost first: tp innermost (consecutive ranks)


def replicas_wrapper(par) -> str:
    """What keeps a layout's dp x cp replicas of each parameter here: "fsdp" (FSDP2 fully_shard) or "ddp"
    (DistributedDataParallel), as the layout's setup trains (proxies/setups.py); "" for a setup not trained."""
    from commbench.proxies.setups import SETUPS

    return SETUPS[par.setup].trains_as if par.setup in SETUPS else ""


def check_trainable(par, trained: Trained, world: int | None = None) -> None:
    """One ValueError for a layout (proxies/layouts/parallelism.py's Parallelism) that cannot train `trained` on
    `world` ranks here: what `Parallelism.check` refuses, then what this Llama needs beyond it (whole key/value
    heads and as many layers on each TP rank and stage, DDP without experts, micro-batches and sequence split
    evenly)."""
    shape = trained.transformer
    par.check(gpus=world, shape=shape)
    if shape.heads % par.tp or shape.kv_heads % par.tp:
        raise ValueError(f"tp {par.tp} does not divide {shape.heads} heads and {shape.kv_heads} kv heads")
    if shape.layers % (par.pp * par.virtual_stages):
        raise ValueError(f"pp {par.pp} x {par.virtual_stages} virtual stages does not divide {shape.layers} layers")
    wrapper = replicas_wrapper(par)
    if wrapper not in ("fsdp", "ddp") or (wrapper == "ddp" and par.ep > 1):
        raise ValueError(f"data parallelism {par.setup!r} with ep {par.ep}: choose fsdp-full (any ep) or ddp (ep 1)")
    if par.pp > 1 and (par.virtual_stages > 1) != (par.pp_schedule == "interleaved"):
        raise ValueError(f"schedule {par.pp_schedule!r} with {par.virtual_stages} virtual stage(s)")
    if (par.pp > 1 and trained.batch % par.microbatches) or \
            shape.seq_len % (par.cp * (par.tp if par.sequence_parallel else 1)):
        raise ValueError(f"{par.microbatches} micro-batches of {trained.batch} sequences or the sequence split does "
                         f"not fit {shape.seq_len} tokens")


TRAINED_DTYPE_BYTES = DTYPE_BYTES["float32"]  # train --layout runs fp32: parameters, gradients, activations


@dataclass(frozen=True)
class Trained:
    """What `train --layout` trains: a profile's transformer shape (proxies/transformer.py's TransformerShape,
    the one shape predictions read too), at fp32's width, and `batch` sequences per data-parallel rank and
    step. Built by `of`, which refuses what this Llama cannot build."""
    transformer: TransformerShape
    batch: int

    @property
    def mlp_ffn(self) -> int:
        """Each MLP's intermediate size: an expert's in a mixture of experts, the dense MLP's otherwise."""
        t = self.transformer
        return t.expert_ffn if t.experts else t.ffn

    @classmethod
    def of(cls, transformer: TransformerShape, batch: int) -> Trained:
        """A profile's shape as trained here, or one ValueError for what this Llama cannot build (MLA, biases,
        shared experts, leading dense layers, un-gated MLPs, tied embeddings, a head size other than hidden /
        heads)."""
        t = transformer
        unsupported = [name for name in ("q_lora_rank", "shared_experts", "dense_layers", "attention_bias",
                                         "tied_embeddings") if getattr(t, name)]
        if not t.gated_mlp or t.head_dim * t.heads != t.hidden or t.v_head_dim not in (0, t.head_dim):
            unsupported.append("head sizes or MLP")
        if unsupported:
            raise ValueError(f"this shape does not train as a Llama here: {', '.join(unsupported)}")
        if type(batch) is not int or batch < 1:
            raise ValueError(f"train --layout needs at least one sequence per data-parallel rank, not {batch!r}")
        return cls(replace(t, dtype_bytes=TRAINED_DTYPE_BYTES), batch)


def llama(trained: Trained, attention: str = "sdpa"):
    """transformers' LlamaForCausalLM of `trained`'s shape (fp32, no dropout, untied output layer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = trained.transformer
    config = LlamaConfig(num_hidden_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, intermediate_size=trained.mlp_ffn, vocab_size=shape.vocab,
                         max_position_embeddings=shape.seq_len, tie_word_embeddings=False)
    config._attn_implementation = attention
    return LlamaForCausalLM(config)


def tokens(trained: Trained, seed: int):
    """Tokens of one data-parallel rank's batch: inputs and next-token labels, (batch, seq_len) each."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    shape = trained.transformer
    drawn = torch.randint(0, shape.vocab, (trained.batch, shape.seq_len + 1), generator=generator)
    return drawn[:, :-1].contiguous(), drawn[:, 1:].contiguous()


def loss(logits, labels):
    import torch
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
