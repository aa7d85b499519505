"""The parallel dimensions applied to a transformers Llama model: tensor (with or without sequence)
parallelism by `parallelize_module`, pipeline stages cut from the decoder layers by hand, and the
data-parallel wrapper (FSDP2 `fully_shard`) on what is left.

TP follows torchtitan's Llama plan (torchtitan/models/llama3/infra/parallelize.py, apply_tp) on the
decoder layers: q/k/v and gate/up ColwiseParallel, o and down RowwiseParallel. With sequence
parallelism the norms are SequenceParallel, attention and MLP inputs are gathered by
PrepareModuleInput (Shard(1) -> Replicate) and o/down reduce-scatter to Shard(1); the sequence is
split entering the first layer and gathered before the final norm (PrepareModuleInput too). The
embedding and the output layer stay replicated over TP (torchtitan shards them too: a choice of the
plan, left out here so that TP's calls are the layers' alone).
"""
from __future__ import annotations

import torch
from torch import nn


def tensor_parallel(model, mesh, sequence_parallel: bool) -> None:
    """Apply the TP plan on the "tp" mesh to every decoder layer of a LlamaForCausalLM."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    out = Shard(1) if sequence_parallel else Replicate()
    for layer in model.model.layers:
        plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=out)}
        # An expert-parallel MoE (beside ep) has no gate/up/down of its own: its experts are split over ep, not
        # tp. Its keys are left out rather than left to parallelize_module, which skips each with a UserWarning
        # per layer and rank (12 of them in `train mixtral-tiny --layout tp2,ep2,fsdp2 -N 4`, issue 48 item 12).
        if hasattr(layer.mlp, "gate_proj"):
            plan.update({"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                         "mlp.down_proj": RowwiseParallel(output_layouts=out)})
        if sequence_parallel:
            plan.update({
                "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
                if hasattr(layer.mlp, "gate_proj") else _moe_sequence_parallel()})
        parallelize_module(layer, mesh, plan)
    if sequence_parallel:
        parallelize_module(model.model.layers[0], mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True))
        parallelize_module(model.model.norm, mesh, PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True))


def _moe_sequence_parallel():
    """The expert-parallel MoE under sequence parallelism takes this TP rank's part of the sequence as it is,
    as Megatron-Core's token dispatchers do with experts that have no TP of their own (etp1: this MoE's
    experts are whole on each rank), routed as plain tensors (its router is not one of TP's DTensors: mixing
    them failed in aten.mm), its output this rank's part again; no TP call (proxies/layouts/calls.py)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput

    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True)


def shard_data_parallel(model: nn.Module, units, mesh) -> None:
    """FSDP2 on the data-parallel mesh: each unit (a decoder layer), then the root
    (reshard_after_forward=True, as `--setup fsdp-full`). DDP, the other wrapper, is one call
    (proxies/layouts/train/build.py)."""
    from torch.distributed.fsdp import fully_shard

    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)


class LlamaStage(nn.Module):
    """A pipeline stage of a LlamaForCausalLM: the embedding on the first, a contiguous run of decoder
    layers, the final norm and the output layer on the last; rotary embeddings are recomputed on each stage
    from this rank's token `positions` (1, tokens: its CP block of the sequence; they carry no parameters), so
    only hidden states cross a boundary (under sequence parallelism, this TP rank's part of them)."""

    def __init__(self, model, layer_ids: list[int], first: bool, last: bool, positions: torch.Tensor):
        super().__init__()
        self.embed_tokens = model.model.embed_tokens if first else None
        self.layers = nn.ModuleList([model.model.layers[i] for i in layer_ids])
        self.rotary_emb = model.model.rotary_emb
        self.norm = model.model.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.positions = positions

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(inputs) if self.embed_tokens is not None else inputs
        rotary = self.rotary_emb(hidden, self.positions)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=None, position_embeddings=rotary, position_ids=self.positions)
        return self.lm_head(self.norm(hidden)) if self.lm_head is not None else hidden


def pipeline_stages(model, mesh, virtual: int, positions: torch.Tensor, replicas, examples) -> list:
    """This rank's PipelineStages: pp x `virtual` stages of equal runs of layers, stage i on pipeline
    rank i mod pp (torch's looped placement for the interleaved schedule), each stage module given to
    `replicas(module, units)` (the data-parallel wrapper, proxies/layouts/train/build.py), which returns the
    module the stage runs. `examples(first, last)`: a micro-batch's input and output tensors of a stage, which
    fix the stage's shapes: torch's inference of them otherwise runs a forward and backward outside DDP's
    no_sync, whose gradient hooks a DDP stage then counts twice (the interleaved schedule fails on it)."""
    from torch.distributed.pipelining import PipelineStage

    pp, rank = mesh["pp"].size(), mesh["pp"].get_local_rank()
    count = pp * virtual
    per_stage = len(model.model.layers) // count
    stages = []
    for index in range(rank, count, pp):
        module = LlamaStage(model, list(range(index * per_stage, (index + 1) * per_stage)), index == 0,
                            index == count - 1, positions)
        inputs, outputs = examples(index == 0, index == count - 1)
        stages.append(PipelineStage(replicas(module, list(module.layers)), index, count, torch.device("cpu"),
                                    input_args=inputs, output_args=outputs, group=mesh.get_group("pp")))
    return stages


def pipeline_schedule(stages: list, name: str, microbatches: int, loss):
    """torch.distributed.pipelining's schedule by commbench's name (gpipe, 1f1b, interleaved)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    if name == "interleaved":
        return ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss)
    single = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    return single(stages[0], microbatches, loss_fn=loss)
