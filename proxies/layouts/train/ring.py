"""Ring attention over send/recv: the context-parallel (CP) attention that `train` runs on CPU ranks.

Why not torch's own: `torch.distributed.tensor.experimental.context_parallel` (torch 2.14.1) replaces
only the CUDA attention kernels (aten._scaled_dot_product_flash/efficient/cudnn_attention); on CPU
SDPA dispatches to aten._scaled_dot_product_flash_attention_for_cpu, and under context_parallel that
fails with "Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
strategy registered" (run on 2 gloo ranks, 2026-11-27). So this is the send/recv ring that Megatron-Core
runs through Transformer Engine's AttnFuncWithCPAndKVP2P (torch's _templated_ring_attention has the same
steps, but rotates keys and values by one all-gather by default and their gradients by all-to-all):

- rank r of a CP group of c ranks holds the r-th contiguous block of the sequence (no load balancing:
  under the causal mask rank c-1 computes c blocks and rank 0 one; TE and torch halve-and-mirror the
  blocks to even this out, which changes the compute, not the bytes);
- forward: c steps; at each of the first c - 1 the rank sends its current key/value block (keys and
  values concatenated: one buffer of 2 x b x s/c x kv_heads x head_dim elements) to rank r + 1 and
  receives the next from rank r - 1 while it attends to the block it holds, merging the partial results
  by their log-sum-exp (the online softmax);
- backward: the key/value blocks go round again (c - 1 exchanges) and their gradients travel with them
  (c exchanges, the last bringing each block's gradient home).
Keys and values travel at kv_heads (grouped-query attention repeats them only inside the block).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _exchange(tensor: torch.Tensor, group) -> tuple[torch.Tensor, list]:
    """Send `tensor` to the next rank of the ring, receive the previous rank's into a new buffer."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    received = torch.empty_like(tensor)
    ops = [dist.P2POp(dist.isend, tensor, dist.get_global_rank(group, (rank + 1) % size), group),
           dist.P2POp(dist.irecv, received, dist.get_global_rank(group, (rank - 1) % size), group)]
    return received, dist.batch_isend_irecv(ops)


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


def _scores(query, key_value, scale, causal):
    """Scores of the local queries against one key/value block, keys repeated to the query heads."""
    key, value = key_value.chunk(2)
    repeat = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    scores = query @ key.transpose(-1, -2) * scale
    if causal:
        length = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    return scores, key, value


class RingAttention(torch.autograd.Function):
    """Causal attention of (b, heads, s/c, d) queries against the whole sequence's keys and values."""

    @staticmethod
    def forward(ctx, query, key, value, group, scale):
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        key_value = torch.cat([key, value]).contiguous()
        out = torch.zeros_like(query)
        lse = torch.full(query.shape[:-1] + (1,), float("-inf"), dtype=query.dtype)
        for step in range(size):
            if step < size - 1:
                following, requests = _exchange(key_value, group)
            source = (rank - step) % size
            if source <= rank:  # blocks after this rank's are masked out entirely
                scores, _, block_value = _scores(query, key_value, scale, source == rank)
                block_lse = scores.logsumexp(-1, keepdim=True)
                merged = torch.logaddexp(lse, block_lse)
                out = out * (lse - merged).exp() + (scores - block_lse).exp() @ block_value * (block_lse - merged).exp()
                lse = merged
            if step < size - 1:
                _wait(requests)
                key_value = following
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.group, ctx.scale = group, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        key_value = torch.cat([key, value]).contiguous()
        grad_query, grad_key_value = torch.zeros_like(query), torch.zeros_like(key_value)
        delta = (grad_out * out).sum(-1, keepdim=True)
        for step in range(size):
            if step < size - 1:
                following, requests = _exchange(key_value, group)
            source = (rank - step) % size
            if source <= rank:
                scores, block_key, block_value = _scores(query, key_value, scale, source == rank)
                probs = (scores - lse).exp()
                grad_scores = probs * (grad_out @ block_value.transpose(-1, -2) - delta) * scale
                grad_query += grad_scores @ block_key
                repeat = query.shape[1] // key.shape[1]
                grad_key = (grad_scores.transpose(-1, -2) @ query).unflatten(1, (-1, repeat)).sum(2)
                grad_value = (probs.transpose(-1, -2) @ grad_out).unflatten(1, (-1, repeat)).sum(2)
                grad_key_value = grad_key_value + torch.cat([grad_key, grad_value])
            grad_key_value, gradient_requests = _exchange(grad_key_value.contiguous(), group)
            _wait(gradient_requests)
            if step < size - 1:
                _wait(requests)
                key_value = following
        grad_key, grad_value = grad_key_value.chunk(2)
        return grad_query, grad_key, grad_value, None, None


def ring_attention(group):
    """An attention function for transformers' AttentionInterface: (b, s/c, heads, d) out, no weights."""
    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = RingAttention.apply(query, key, value, group, scale)
        return out.transpose(1, 2).contiguous(), None
    return attention
