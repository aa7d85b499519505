"""A mixture-of-experts feed-forward whose experts are split over an expert-parallel (EP) group.

transformers' Mixtral and Qwen-MoE blocks hold every expert on every rank and route inside one
process, so their routing cannot be split over ranks; this layer follows torchtitan's
(torchtitan/distributed/expert_parallel.py, ExpertParallel's token dispatch and combine) and
Megatron-Core's all-to-all token dispatcher instead:

1. the router (a linear layer, softmax over the experts, top-k, the k weights renormalised as Mixtral
   does) picks k experts per token; the token copies are sorted by expert;
2. one all-to-all of the per-expert counts (E int64 values) tells each rank how many copies it will
   receive for its experts (split sizes travel before the tokens, as in torchtitan);
3. dispatch: one all-to-all of the T x k token copies (T tokens of `hidden` values) with those splits;
4. each rank runs its E / ep experts (SwiGLU, as Llama's MLP) on the copies it received;
5. combine: one all-to-all back with the splits reversed; the copies return to their tokens and are
   summed with the router's weights.
The backward issues the dispatch's and the combine's transposes: two all-to-alls, splits reversed.
No token is dropped (no capacity factor) and no load-balancing loss is added: the bytes a rank sends
are T x k x hidden x 4 whatever the routing; what it receives depends on the routing.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class LocalExperts(nn.Module):
    """This rank's experts: SwiGLU weights stacked on a first dimension of E / ep."""

    def __init__(self, count: int, hidden: int, ffn: int):
        super().__init__()
        self.gate = nn.Parameter(torch.randn(count, hidden, ffn) * hidden ** -0.5)
        self.up = nn.Parameter(torch.randn(count, hidden, ffn) * hidden ** -0.5)
        self.down = nn.Parameter(torch.randn(count, ffn, hidden) * ffn ** -0.5)

    def forward(self, tokens: torch.Tensor, counts: list[int], experts: list[int]) -> torch.Tensor:
        """`tokens` in segments of `counts` rows, segment i for local expert experts[i]."""
        outputs = []
        for segment, expert in zip(tokens.split(counts), experts):
            hidden = nn.functional.silu(segment @ self.gate[expert]) * (segment @ self.up[expert])
            outputs.append(hidden @ self.down[expert])
        return torch.cat(outputs) if outputs else tokens[:0]


class ExpertParallelMoE(nn.Module):
    """Router replicated, experts split over `group` (ep consecutive ranks): rank j holds experts
    j x E/ep .. (j + 1) x E/ep - 1."""

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, group, seed: int = 100):
        super().__init__()
        self.group, self.experts, self.top_k = group, experts, top_k
        self.ep = dist.get_world_size(group)
        self.local = experts // self.ep
        self.router = nn.Linear(hidden, experts, bias=False)  # from the RNG every rank shares: the same weights
        with torch.random.fork_rng(devices=[]):  # this rank's experts differ from the other EP ranks'
            torch.manual_seed(seed + dist.get_rank(group))
            self.experts_here = LocalExperts(self.local, hidden, ffn)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        tokens = hidden_states.reshape(-1, shape[-1])
        weights, chosen = self.router(tokens).softmax(-1).topk(self.top_k, -1)
        weights = weights / weights.sum(-1, keepdim=True)
        order = chosen.flatten().argsort(stable=True)
        counts = torch.bincount(chosen.flatten(), minlength=self.experts)
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=self.group)
        send_splits = counts.view(self.ep, self.local).sum(1).tolist()
        receive_splits = received_counts.view(self.ep, self.local).sum(1).tolist()
        copies = tokens[order // self.top_k]
        received = exchange(copies, receive_splits, send_splits, self.group)
        # received: from each source rank in turn, its copies for each local expert in turn
        segments = received_counts.tolist()
        out = self.experts_here(received, segments, [i % self.local for i in range(len(segments))])
        returned = exchange(out, send_splits, receive_splits, self.group)
        unsorted = torch.zeros_like(returned).index_copy(0, order, returned)
        combined = (unsorted.view(-1, self.top_k, shape[-1]) * weights.unsqueeze(-1)).sum(1)
        return combined.view(shape)


def exchange(tensor: torch.Tensor, output_splits: list[int], input_splits: list[int], group) -> torch.Tensor:
    """The all-to-all with autograd (its backward the reverse exchange) that torch recommends, functional
    collectives' all_to_all_single_autograd (torch.distributed.nn.functional's warned it is deprecated, 8 times a
    train, mid-table); torch without it (before 2.4) the older one."""
    try:
        from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
    except ImportError:
        from torch.distributed.nn.functional import all_to_all_single

        out = tensor.new_empty(sum(output_splits), *tensor.shape[1:])
        return all_to_all_single(out, tensor, output_splits, input_splits, group=group)
    return wait_tensor(all_to_all_single_autograd(tensor, output_splits, input_splits, group))
