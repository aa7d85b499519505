"""A parallel layout's compute measured on the rank (`proxy MODEL --layout SPEC --compute measured`).

`proxy --layout --tflops RATE` takes a layer's compute as its FLOPs at one rate. On a CPU a small model's
step is mostly a cost per operator, not per FLOP, and that cost does not divide as the FLOPs do: TP halves a
rank's FLOPs but not its operators (docs/layouts.md, "Replay and prediction against training"). So, as the
data-parallel proxy's `--compute measured` times the real model (proxies/train.py's measure_compute), this
times the real pieces of one rank of a layout, built by transformers from the profile's shape and cut as the
rank holds them, without any call:
- a decoder layer (LlamaDecoderLayer, SDPA, causal) of the rank's shard: heads, key/value heads and FFN
  divided by tp (Megatron-LM's local matrices; at least one key/value head), on `microbatch` sequences of
  seq_len / cp tokens;
- with CP, one attention block beyond the diagonal: the local queries against one other rank's keys and
  values (scores, softmax, values: the ring's step, proxies/layouts/train/ring.py), which the replay runs
  beside each ring step;
- on the first stage the embedding, on the last the final norm, the output layer (whole on each TP rank, as
  `train --layout` keeps it: proxies/layouts/train/parts.py) and the loss;
- the optimizer: SGD with momentum over the rank's parameters (its stage's layers, embedding and head),
  each divided by the data-parallel replicas when the setup shards the optimizer (ZeRO-1, ZeRO-2, FSDP).
Each piece's forward and backward are timed separately, the median of `repeats` after a warm-up, as CPU
time of this thread when torch runs one thread on a CPU (other processes cannot inflate it; the replay then
spins for it, competing with the communication for the core as real compute does), else wall time (after a
CUDA synchronize on a GPU). Not measured: MoE layers (refused), sequence parallelism's norms on 1/tp of the
tokens (measured on all of them), DTensor's or FSDP's own work around the operators.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.layouts.pieces import RankCompute, optimizer_shards
from commbench.proxies.layouts.stage_share import stage_layer_ranges

CPU_STEP_FLOP_LIMIT = 2e12  # a rank's step on this host's CPU beyond which measuring takes minutes: refused


def refusal(par: Parallelism, transformer, microbatch: int, on_cpu: bool) -> str | None:
    """Why this layout's compute cannot be measured here (one line), or None."""
    t = transformer
    if t.moe:
        return ("--layout --compute measured times dense Llama layers; this profile's MoE layers are not measured: "
                "give --tflops RATE")
    if t.q_lora_rank or t.attention_bias or not t.gated_mlp or t.v_head_dim not in (0, t.head_dim):
        return ("--layout --compute measured builds Llama layers, and this shape is not one (MLA, biases or an "
                "un-gated MLP): give --tflops RATE")
    tokens = microbatch * t.seq_len / par.cp
    layers = math.ceil(t.layers / par.pp)
    step = 3 * tokens * (layers * t.layer_forward_flops(0) / par.tp + t.head_forward_flops()) * par.microbatches
    if on_cpu and step > CPU_STEP_FLOP_LIMIT:
        return (f"--layout --compute measured would run {step / 1e12:.3g} TFLOP a step on each CPU rank here (over "
                f"{CPU_STEP_FLOP_LIMIT / 1e12:g}: minutes per measurement): give --tflops RATE")
    return None


def measure_rank_compute(par: Parallelism, transformer, microbatch: int, stage: int, device="cpu", *,
                         repeats: int = 5, ready: Callable[[], None] = lambda: None) -> tuple[RankCompute, bool]:
    """The pieces of pipeline rank `stage` timed here (see the module's docstring), and whether the times are
    this thread's CPU time. `ready` runs between building and timing (a barrier: every rank measures at once,
    sharing the host as in training)."""
    import torch

    cpu_time = getattr(device, "type", device) == "cpu" and torch.get_num_threads() == 1
    clock = time.thread_time if cpu_time else time.perf_counter
    pieces = RankPieces(par, transformer, microbatch, stage, device)
    ready()
    times = {"layer": _timed(pieces.layer, clock, device, repeats)}
    if par.cp > 1:
        times["block"] = _timed(pieces.block, clock, device, repeats)
    if pieces.first:
        times["embed"] = _timed(pieces.embed, clock, device, repeats)
    if pieces.last:
        times["head"] = _timed(pieces.head, clock, device, repeats)
    optimizer = _timed_update(pieces.optimizer(), clock, device, repeats)
    fields_us = {f"{name}_{phase}_us": us for name, pair in times.items() for phase, us in zip(("forward", "backward"),
                                                                                                pair)}
    return RankCompute(**fields_us, optimizer_us=optimizer), cpu_time


def measure_on_ranks(ctx, par: Parallelism, shape) -> tuple[RankCompute, bool]:
    """The `proxy --layout` rank's compute (proxies/layouts/replay.py), timed on its own pieces, every rank at
    once; each piece the slowest rank's (ranks without an embedding or a head measure none: 0)."""
    import numpy as np
    import torch

    backend = ctx.backend
    device = torch.device("cuda", torch.cuda.current_device()) if backend.device == "cuda" else "cpu"
    if backend.rank == 0:
        print(f"# measuring the compute of layout {par.name}'s pieces on each rank first (the replay's steps follow)",
              flush=True)
    mine, cpu_time = measure_rank_compute(par, shape, ctx.cfg.microbatch, par.coords(backend.rank)["pp"], device,
                                          ready=backend.barrier)
    return RankCompute.of(backend.agree_max(np.array(mine.values()))), cpu_time


class RankPieces:
    """transformers' Llama pieces of one rank's shard, with their inputs made beforehand; each piece is a
    forward that returns what the backward starts from."""

    def __init__(self, par: Parallelism, t, microbatch: int, stage: int, device):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(num_hidden_layers=1, hidden_size=t.hidden, num_attention_heads=t.heads // par.tp,
                             num_key_value_heads=max(1, t.kv_heads // par.tp), head_dim=t.head_dim,
                             intermediate_size=t.ffn // par.tp, vocab_size=t.vocab, max_position_embeddings=t.seq_len,
                             tie_word_embeddings=False)
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        # on a GPU the pieces run in the profile's training precision, as the replay's calls are sized (bf16 for
        # a 2-byte shape); a CPU runs fp32, as `train --layout` does. Not yet run on a GPU (no GPU was lent).
        on_gpu = getattr(torch.device(device), "type", "cpu") != "cpu"
        dtype = torch.bfloat16 if on_gpu and getattr(t, "dtype_bytes", 4) == 2 else torch.float32
        self.model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
        self.par, self.stage, self.device = par, stage, device
        self.first, self.last = stage == 0, stage == par.pp - 1
        self.layers_here = sum(len(chunk) for chunk in stage_layer_ranges(t.layers, par, stage))
        self.tokens = t.seq_len // par.cp
        self.heads, self.head_dim, self.vocab = t.heads // par.tp, t.head_dim, t.vocab
        self.hidden_states = torch.randn(microbatch, self.tokens, t.hidden, device=device, dtype=dtype,
                                         requires_grad=True)
        self.positions = torch.arange(self.tokens, device=device).unsqueeze(0)
        self.rotary = self.model.model.rotary_emb(self.hidden_states, self.positions)
        self.ids = torch.randint(0, t.vocab, (microbatch, self.tokens), device=device)
        self.query, self.key, self.value = (torch.randn(microbatch, self.heads, self.tokens, self.head_dim,
                                                        device=device, dtype=dtype, requires_grad=True)
                                            for _ in range(3))

    def layer(self):
        return self.model.model.layers[0](self.hidden_states, attention_mask=None, position_ids=self.positions,
                                          position_embeddings=self.rotary)

    def block(self):
        """The ring's step: the local queries' scores against one other block's keys, softmax, values."""
        import torch

        scores = self.query @ self.key.transpose(-1, -2) / math.sqrt(self.head_dim)
        return torch.softmax(scores, dim=-1) @ self.value

    def embed(self):
        return self.model.model.embed_tokens(self.ids)

    def head(self):
        import torch

        logits = self.model.lm_head(self.model.model.norm(self.hidden_states))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), self.ids.flatten())

    def optimizer(self):
        """SGD (momentum 0.9, as train --layout's) over the rank's parameters, each cut to its data-parallel
        shard when the setup shards parameters, with gradients."""
        import torch

        from commbench.proxies.setups import SETUPS

        shards = optimizer_shards(self.par, SETUPS.get(self.par.setup))
        m = self.model
        held = list(m.model.layers[0].parameters()) * self.layers_here
        held += (list(m.model.embed_tokens.parameters()) if self.first else []) + \
            (list(m.model.norm.parameters()) + list(m.lm_head.parameters()) if self.last else [])
        tensors = [torch.zeros(math.ceil(p.numel() / shards), device=self.device, requires_grad=True) for p in held]
        for tensor in tensors:
            tensor.grad = torch.zeros_like(tensor)
        return torch.optim.SGD(tensors, lr=1e-3, momentum=0.9), tensors


def _sync(device) -> None:
    if getattr(device, "type", device) == "cuda":
        import torch

        torch.cuda.synchronize()


def _timed(piece, clock, device, repeats: int) -> tuple[float, float]:
    """Median (forward, backward) microseconds of `piece` over `repeats` runs after one warm-up; the backward
    starts from a gradient of ones (a loss: from itself), made outside the times."""
    import torch

    rows = []
    for _ in range(repeats + 1):
        t0 = clock()
        out = piece()
        _sync(device)
        t1 = clock()
        gradient = None if out.dim() == 0 else torch.ones_like(out)
        _sync(device)
        t2 = clock()
        out.backward(gradient)
        _sync(device)
        rows.append(((t1 - t0) * 1e6, (clock() - t2) * 1e6))
    rows = rows[1:]
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)


def _timed_update(optimizer_and_tensors, clock, device, repeats: int) -> float:
    """Median microseconds of the optimizer's step and zero_grad (gradients set again before each)."""
    import torch

    optimizer, tensors = optimizer_and_tensors
    rows = []
    for _ in range(repeats + 1):
        for tensor in tensors:
            tensor.grad = torch.zeros_like(tensor)
        t0 = clock()
        optimizer.step()
        optimizer.zero_grad()
        _sync(device)
        rows.append((clock() - t0) * 1e6)
    return statistics.median(rows[1:])
