"""Transformer-XL language models of the sizes NVIDIA's DeepLearningExamples trains on WikiText-103, for
their gradient profiles (`commbench profiles extract commbench.proxies.models.transformer_xl:build`, and
`...transformer_xl_large:build`);
commbench builds them here because transformers no longer ships TransfoXL.

Architecture: Dai et al., "Transformer-XL", ACL 2019 (relative positional attention with learned global
biases u and v, section 3.3; segment memory), with Baevski and Auli's adaptive input embedding and Grave et
al.'s adaptive softmax, output weights and projections tied to the input ones. Sizes: NVIDIA's
PyTorch/LanguageModeling/Transformer-XL/pytorch/wt103_base.yaml @ 6b82d3ac (16 layers, d_model 512, 8 heads
of 64, d_inner 2048, tgt_len 192, div_val 1) and wt103_large.yaml @ 1d4211fe (18 layers, d_model 1024, 16
heads of 64, d_inner 4096, tgt_len 384, div_val 4; n_token 267735, cutoffs 19997, 39997, 199997,
tie_projs [false, true, true, true] from its manual_config). Per layer, as the paper describes it: one
projection of the input to queries, keys and values, one of the relative positions to keys (no bias),
the output projection, a layer norm, then the position-wise feed-forward (two linear layers with biases)
and its layer norm; u and v are shared by all layers. The segment memory adds compute, not parameters,
and is left out: a profile needs the gradients (names, shapes, order) and the FLOPs of a step. Upstream
leaves the first cluster's output projection untied (tie_projs[0] false); here every projection is tied,
one 1024 x 1024 matrix fewer in the large model (1M of its 280M parameters).

This is commbench's own code; only the structure and the sizes carry over.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

N_TOKEN = 267735
CUTOFFS = (19997, 39997, 199997)
BASE = {"n_layer": 16, "d_model": 512, "n_head": 8, "d_head": 64, "d_inner": 2048, "div_val": 1, "tgt_len": 192}
LARGE = {"n_layer": 18, "d_model": 1024, "n_head": 16, "d_head": 64, "d_inner": 4096, "div_val": 4, "tgt_len": 384}


class AdaptiveEmbedding(nn.Module):
    """Clusters of the vocabulary, cluster i embedded in d_model / div_val^i dimensions and projected to
    d_model (one table, no projection, when div_val is 1)."""

    def __init__(self, d_model: int, div_val: int):
        super().__init__()
        self.edges = (0, *CUTOFFS, N_TOKEN) if div_val > 1 else (0, N_TOKEN)
        widths = [d_model // div_val ** i for i in range(len(self.edges) - 1)]
        self.tables = nn.ModuleList(nn.Embedding(hi - lo, w) for lo, hi, w in zip(self.edges, self.edges[1:], widths))
        self.projections = nn.ParameterList(nn.Parameter(torch.randn(d_model, w) * 0.01) for w in widths
                                            if div_val > 1)
        self.scale = d_model ** 0.5

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = None
        for i, (lo, hi) in enumerate(zip(self.edges, self.edges[1:])):
            inside = (tokens >= lo) & (tokens < hi)
            rows = self.tables[i]((tokens - lo).clamp(0, hi - lo - 1))
            rows = F.linear(rows, self.projections[i]) if len(self.projections) else rows
            part = rows * inside[..., None]
            out = part if out is None else out + part
        return out * self.scale


class RelativeLayer(nn.Module):
    def __init__(self, d_model: int, n_head: int, d_head: int, d_inner: int):
        super().__init__()
        self.n_head, self.d_head = n_head, d_head
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)
        self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, d_inner), nn.ReLU(), nn.Linear(d_inner, d_model))
        self.ff_norm = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, val = self.qkv_net(x).view(b, t, 3, self.n_head, self.d_head).unbind(2)
        r = self.r_net(pos).view(t, self.n_head, self.d_head)
        content = torch.einsum("bihd,bjhd->bhij", q + u, k)
        position = torch.einsum("bihd,jhd->bhij", q + v, r)  # the paper's relative shift only reorders this
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = ((content + position) / self.d_head ** 0.5).masked_fill(causal, float("-inf")).softmax(-1)
        attended = torch.einsum("bhij,bjhd->bihd", weights, val).reshape(b, t, -1)
        x = self.layer_norm(x + self.o_net(attended))
        return self.ff_norm(x + self.ff(x))


class TransformerXL(nn.Module):
    """forward(tokens [B, T]) -> the adaptive softmax's log-probability of each next token, summed."""

    def __init__(self, n_layer: int, d_model: int, n_head: int, d_head: int, d_inner: int, div_val: int,
                 tgt_len: int):
        super().__init__()
        self.tgt_len = tgt_len
        self.word_emb = AdaptiveEmbedding(d_model, div_val)
        self.r_w_bias = nn.Parameter(torch.zeros(n_head, d_head))  # u
        self.r_r_bias = nn.Parameter(torch.zeros(n_head, d_head))  # v
        self.layers = nn.ModuleList(RelativeLayer(d_model, n_head, d_head, d_inner) for _ in range(n_layer))
        clusters = len(self.word_emb.edges) - 2
        self.cluster_weight = nn.Parameter(torch.zeros(clusters, d_model)) if clusters else None
        self.cluster_bias = nn.Parameter(torch.zeros(clusters)) if clusters else None
        self.out_bias = nn.ParameterList(nn.Parameter(torch.zeros(hi - lo)) for lo, hi in
                                         zip(self.word_emb.edges, self.word_emb.edges[1:]))
        inverse = 1.0 / 10000 ** (torch.arange(0, d_model, 2.0) / d_model)
        self.register_buffer("inverse_frequency", inverse)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.size(1)
        angles = torch.arange(t - 1, -1, -1.0, device=tokens.device)[:, None] * self.inverse_frequency[None]
        pos = torch.cat([angles.sin(), angles.cos()], dim=-1)
        x = self.word_emb(tokens)
        for layer in self.layers:
            x = layer(x, pos, self.r_w_bias, self.r_r_bias)
        return self._log_likelihood(x, tokens.roll(-1, dims=1))

    def _log_likelihood(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The adaptive softmax with tied weights: the head over the first cluster and one logit per tail
        cluster, then each tail cluster's own softmax (computed for all positions)."""
        emb, total = self.word_emb, x.new_zeros(())
        heads = []
        for i in range(len(emb.edges) - 1):
            hidden = F.linear(x, emb.projections[i].t()) if len(emb.projections) else x
            heads.append(F.linear(hidden, emb.tables[i].weight, self.out_bias[i]))
        head = heads[0] if self.cluster_weight is None else torch.cat(
            [heads[0], F.linear(x, self.cluster_weight, self.cluster_bias)], dim=-1)
        log_head = head.log_softmax(-1)
        total = total + log_head[..., 0].sum()
        for i, tail in enumerate(heads[1:], start=1):
            total = total + (tail.log_softmax(-1)[..., 0] + log_head[..., -i]).sum()
        return -total


def example_inputs(batch: int, device="cpu", size: dict = BASE) -> tuple[torch.Tensor]:
    """A batch of token ids of one segment (tgt_len tokens)."""
    return (torch.randint(0, N_TOKEN, (batch, size["tgt_len"]), device=device),)


def build() -> TransformerXL:
    """The base model of wt103_base.yaml."""
    return TransformerXL(**BASE)
