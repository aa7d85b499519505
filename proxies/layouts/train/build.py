"""A layout built on this rank: the Llama of proxies/layouts/train/model.py laid out as a layout (proxies/
layouts/parallelism.py's Parallelism) on the 4-D mesh ("pp", "dp", "cp", "tp"), tp innermost, with its step and its
SGD optimizer.

Each dimension is torch's own where torch has one that runs on CPU (proxies/layouts/train/parts.py): TP by
`parallelize_module`, PP by `torch.distributed.pipelining`'s stages and schedules, the data-parallel replicas
by FSDP2 `fully_shard` or by `DistributedDataParallel`; CP is ring attention over send/recv
(proxies/layouts/train/ring.py) and EP an MoE layer over all-to-all (proxies/layouts/train/moe.py). The
replicas of a parameter are the dp x cp ranks of its tp and pp position (CP ranks hold the same weights
and see other tokens of the same sequences); EP borrows ep consecutive ranks of them.

The order of the wrappers is torchtitan's (torchtitan/models/llama3/infra/parallelize.py): experts, then
TP on the decoder layers, then the pipeline's stages cut from them, then the data-parallel wrapper on each
stage (FSDP2 on each decoder layer, then the stage; DDP around the stage). DDP on a slice of the mesh is
torch's DDP + TP path: DistributedDataParallel's `device_mesh` argument turns the DTensor parameters into
local ones (torch.distributed.tensor.parallel.ddp._pre_dp_module_transform), and
torch.distributed.pipelining runs a DDP stage under `no_sync` but for the last micro-batch's backward.
"""
from __future__ import annotations

from dataclasses import dataclass

from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.layouts.train.model import (
    DIMENSIONS,
    Trained,
    check_trainable,
    llama,
    loss,
    replicas_wrapper,
    tokens,
)
from commbench.proxies.layouts.train.trace import mesh_labels


def _meshes(par: Parallelism):
    """The 4-D mesh, the data-parallel mesh of the dense parameters, and (EP) the experts' (edp, ep) mesh."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mesh = init_device_mesh("cpu", (par.pp, par.dp, par.cp, par.tp), mesh_dim_names=DIMENSIONS)
    dense = mesh["dp", "cp"]._flatten("dp_cp") if par.cp > 1 else mesh["dp"]
    experts = None
    if par.ep > 1:
        ranks = torch.arange(par.world).view(par.pp, par.dp * par.cp // par.ep, par.ep, par.tp)
        experts = DeviceMesh("cpu", ranks, mesh_dim_names=("pp", "edp", "ep", "tp"))
    return mesh, dense, experts


def _model(par: Parallelism, trained: Trained, mesh, experts):
    """The whole model on this rank: ring attention over "cp" (CP), the experts' MoE (EP), the TP plan."""
    from commbench.proxies.layouts.train.parts import tensor_parallel

    attention = "sdpa"
    if par.cp > 1:
        from transformers import AttentionInterface, AttentionMaskInterface

        from commbench.proxies.layouts.train.ring import ring_attention
        attention = "commbench_ring"
        AttentionInterface.register(attention, ring_attention(mesh.get_group("cp")))
        AttentionMaskInterface.register(attention, lambda *args, **kwargs: None)
    model = llama(trained, attention)
    if par.ep > 1:
        _moe(model, trained, experts)
    if par.tp > 1:
        tensor_parallel(model, mesh["tp"], par.sequence_parallel)
    return model


def _moe(model, trained: Trained, experts) -> None:
    """Every decoder layer's MLP replaced by an expert-parallel MoE, its experts FSDP2-sharded on "edp"
    (the ranks holding the same experts)."""
    from torch.distributed.fsdp import fully_shard

    from commbench.proxies.layouts.train.moe import ExpertParallelMoE

    shape = trained.transformer
    for index, layer in enumerate(model.model.layers):
        layer.mlp = ExpertParallelMoE(shape.hidden, trained.mlp_ffn, shape.experts, shape.top_k,
                                      experts.get_group("ep"), seed=100 * (index + 1))
        fully_shard(layer.mlp.experts_here, mesh=experts["edp"])


def _replicas(par: Parallelism, dense):
    """The data-parallel wrapper of a module whose units are its decoder layers -> the module to run: FSDP2 on
    each unit and then the module (reshard after forward, `--setup fsdp-full`), or DDP around it (DDP's default
    buckets, `--setup ddp`); the module itself where the parameters have one replica."""
    from commbench.proxies.layouts.train.parts import shard_data_parallel

    def wrap(module, units):
        if par.dp * par.cp == 1:
            return module
        if replicas_wrapper(par) == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(module, device_mesh=dense)
        shard_data_parallel(module, units, dense)
        return module
    return wrap


def _rank_tokens(par: Parallelism, trained: Trained, mesh):
    """This rank's inputs, labels and positions: its data-parallel rank's batch, its CP block of the sequence."""
    import torch

    inputs, labels = tokens(trained, seed=mesh["dp"].get_local_rank())
    block = trained.transformer.seq_len // par.cp
    positions = torch.arange(mesh["cp"].get_local_rank() * block, (mesh["cp"].get_local_rank() + 1) * block)
    return inputs[:, positions], labels[:, positions], positions.unsqueeze(0)


def _dense(par: Parallelism, trained: Trained, mesh, dense, experts):
    """The model without a pipeline, and its step: (forward + backward) -> loss."""
    model = _model(par, trained, mesh, experts)
    run = _replicas(par, dense)(model, list(model.model.layers))
    inputs, labels, positions = _rank_tokens(par, trained, mesh)

    def step():
        value = loss(run(input_ids=inputs, position_ids=positions).logits, labels)
        value.backward()
        return value.item()
    return [run], step


def _stage_examples(par: Parallelism, trained: Trained):
    """A stage's micro-batch input and output (first, last) -> (tensor, tensor): tokens in, logits out, hidden
    states between; this rank's CP block of the sequence, and under SP this TP rank's part of it."""
    import torch

    shape = trained.transformer
    rows, length = trained.batch // par.microbatches, shape.seq_len // par.cp
    between = torch.empty(rows, length // (par.tp if par.sequence_parallel else 1), shape.hidden,
                          requires_grad=True)  # a gradient goes back: the stage receives and sends one

    def examples(first: bool, last: bool):
        return (torch.zeros(rows, length, dtype=torch.long) if first else between,
                torch.empty(rows, length, shape.vocab, requires_grad=True) if last else between)
    return examples


def _pipelined(par: Parallelism, trained: Trained, mesh, dense, experts):
    """The pipeline stages of this rank and their step: the schedule over the micro-batches."""
    from commbench.proxies.layouts.train.parts import pipeline_schedule, pipeline_stages

    model = _model(par, trained, mesh, experts)
    inputs, labels, positions = _rank_tokens(par, trained, mesh)
    stages = pipeline_stages(model, mesh, par.virtual_stages, positions, _replicas(par, dense),
                             _stage_examples(par, trained))
    schedule = pipeline_schedule(stages, par.pp_schedule, par.microbatches, loss)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)

    def step():
        losses = []
        schedule.step(*([inputs] if first else []), **({"target": labels, "losses": losses} if last else {}))
        return sum(value.item() for value in losses) / len(losses) if losses else float("nan")
    return [s.submod for s in stages], step


@dataclass
class BuiltLayout:
    """A layout built on this rank: its step (forward and backward of every micro-batch, then SGD) and the
    mesh's labels of each process group (for the trace)."""
    forward_backward: object
    optimizer: object
    labels: dict
    coordinates: dict | None

    def step(self) -> float:
        """One optimizer step; its loss (nan on a pipeline stage that is not the last)."""
        value = self.forward_backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return value


def build_layout(par: Parallelism, trained: Trained) -> BuiltLayout:
    """The model of `trained` laid out as `par` on this rank's initialised gloo process group (every rank
    calls it: the mesh's groups are made collectively), with its SGD optimizer."""
    import torch
    import torch.distributed as dist

    check_trainable(par, trained, dist.get_world_size())
    mesh, dense, experts = _meshes(par)
    torch.manual_seed(0)  # the same initial weights on every rank
    modules, forward_backward = (_pipelined if par.pp > 1 else _dense)(par, trained, mesh, dense, experts)
    # taken before the first forward: DDP over TP parameters swaps the module's own for DTensors in each forward
    parameters = [p for module in modules for p in module.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=1e-3, momentum=0.9)
    # groups by their ranks: with dp 1 the dp_cp group is the cp group (labelled cp), with ep = dp x cp the ep
    # group is the data-parallel one (labelled ep)
    extra = {"dp_cp": dense.get_group()} if par.cp > 1 and par.dp > 1 else {}
    if experts is not None:
        extra.update(edp=experts.get_group("edp"), ep=experts.get_group("ep"))
    coordinates = mesh.get_coordinate() and dict(zip(DIMENSIONS, mesh.get_coordinate()))
    return BuiltLayout(forward_backward, optimizer, mesh_labels(mesh, extra), coordinates)
