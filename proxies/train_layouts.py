"""Parallel layouts trained for real on CPU ranks: the ground truth of the layout plans.

A layout runs a small transformers LlamaForCausalLM (`ModelShape`; an expert-parallel MoE in place of
every MLP for EP) on a 4-D mesh ("pp", "dp", "cp", "tp"), tp innermost; EP groups are ep consecutive
ranks of the flattened (dp, cp) ranks. `run_layout` trains it on an initialised gloo group and traces
each call of the last steps (proxies/train_layout_trace.py); `train_layouts` spawns the local ranks.

What torch 2.14.1 issues per optimizer step, per rank (tests/unit/proxies/test_train_layouts.py pins
each line on 4 gloo ranks). b sequences of s tokens per data-parallel rank, h hidden, L layers, f the
FFN, kv = kv_heads x head_dim, V vocabulary, E experts, k top-k, M micro-batches, fp32 (4 bytes);
bytes are nccl-tests' size (the larger per-rank buffer):

  dimension      collective            group  bytes                  calls per step
  TP             allreduce             tp     4bsh                   7L: 2 forward (o, down), 5 backward
                                                                     (q, k, v, gate, up: one each, not 2)
  TP + SP        allgather             tp     4bsh                   4L + 2 (2 forward + 2 backward per
                                                                     layer; entering backward, leaving forward)
                 reduce_scatter        tp     4bsh                   4L (2 forward + 2 backward per layer)
                 allreduce             tp     4h                     2L (the SequenceParallel norms' weights)
  PP             send, recv            pp     4(b/M)sh               M x (stages of this rank not last +
                                                                     stages not first), each
  CP (ring)      send, recv            cp     4 x 2b(s/cp)kv         L(3cp - 2): cp - 1 forward, cp - 1
                                                                     backward, cp gradients going home
  EP             alltoall (int64)      ep     8E                     L (per-expert counts, forward only)
                 alltoall              ep     4bskh sent or received 4L (dispatch, combine, their transposes)
  DP (FSDP2)     allgather             dp     a unit's bytes         2 per layer unit (with PP: M + 1), 1 root
                 reduce_scatter        dp     a unit's bytes         1 per unit, 1 per root

A unit's bytes are the decoder layer's parameters on this rank: (2h^2 + 2h kv + 3hf) / tp + 2h (norms
replicated over TP), or with EP 2h^2 + 2h kv + Eh + 2h on "dp" and (E / ep) 3hf on "edp" (the ranks
holding the same experts); the root is the embedding, the final norm and the output layer (on a
pipeline, the first stage's and the last stage's parts); with CP, FSDP shards over "dp_cp".
Where this differs from the textbook: TP's backward issues one allreduce per column-parallel linear
(each redistributes its own replicated input), not Megatron's one per block; FSDP2 under a pipeline
gathers a unit in each micro-batch's forward (reshard after forward) but once in the backward and
reduce-scatters once (torch.distributed.pipelining defers gradient sync to the last micro-batch).
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

from commbench.proxies.train_layout_trace import mesh_labels, trace_mode

SCHEDULES = ("gpipe", "1f1b", "interleaved")
DIMENSIONS = ("pp", "dp", "cp", "tp")  # the mesh, outermost first: tp innermost (consecutive ranks)


@dataclass(frozen=True)
class LayoutSpec:
    """Degrees of a layout on `world` ranks; dp is what is left. EP borrows ep consecutive ranks of the
    flattened (dp, cp) ranks; pp > 1 runs `schedule` over `microbatches` with `virtual` stages per rank."""
    world: int = 4
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    microbatches: int = 4
    virtual: int = 1

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


def spec_of(par, transformer, microbatch: int) -> tuple[LayoutSpec, ModelShape]:
    """A layout as `proxy --layout` spells it (proxies/parallelism.py's Parallelism) and a profile's shape, as
    trained here: each data-parallel rank runs `microbatch` x the pipeline's micro-batches sequences a step.
    One ValueError for what this trainer cannot run: the data-parallel part other than FSDP2 (fsdp-full)
    where there are replicas, the experts' own tensor parallelism (etp1), cp, ep or sequence parallelism
    beside a pipeline, micro-batches without a pipeline."""
    if par.pp > 1 and (par.cp > 1 or par.ep > 1 or par.sequence_parallel):
        raise ValueError("train --layout composes a pipeline with tp (no sp) and FSDP2 only: cp, ep or sequence "
                         "parallelism beside pp is not trained")
    from commbench.proxies.setups import SETUPS

    setup = SETUPS.get(par.setup)  # what the trainer runs: FSDP2 sharding over every replica, resharded after forward
    as_trained = setup is not None and setup.trains_as == "fsdp" and setup.reshard_after_forward and not setup.fixed
    if par.dp * par.cp > 1 and not as_trained:
        raise ValueError(f"train --layout shards the data-parallel part with FSDP2: spell it fsdp{par.dp} "
                         f"(or --setup fsdp-full), not setup {par.setup}")
    if par.expert_tp is not None:
        raise ValueError("train --layout draws expert parallelism from the dp x cp ranks only: etp1 is not trained")
    if par.pp == 1 and par.microbatches > 1:
        raise ValueError("train --layout runs micro-batches through a pipeline only: without pp give --microbatch "
                         "(sequences per step), not --microbatches")
    shape = ModelShape.of(transformer, batch=microbatch * par.microbatches)
    spec = LayoutSpec(world=par.world, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep,
                      sequence_parallel=par.sequence_parallel, schedule=par.pp_schedule,
                      microbatches=par.microbatches, virtual=par.virtual_stages if par.pp > 1 else 1)
    spec.check(shape)
    return spec, shape


@dataclass
class LayoutRun:
    """One rank's run: the calls of each traced step, the step times, the losses, its mesh coordinates."""
    rank: int
    coordinates: dict
    calls: list = field(default_factory=list)  # one list of trace.Call per traced step
    step_time_us: list = field(default_factory=list)
    losses: list = field(default_factory=list)


def llama(shape: ModelShape, attention: str = "sdpa"):
    """transformers' LlamaForCausalLM of `shape` (fp32, no dropout, untied output layer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, intermediate_size=shape.ffn, vocab_size=shape.vocab,
                         max_position_embeddings=shape.seq_len, tie_word_embeddings=False)
    config._attn_implementation = attention
    return LlamaForCausalLM(config)


def _batch(shape: ModelShape, seed: int):
    """Tokens of one data-parallel rank's batch: inputs and next-token labels, (batch, seq_len) each."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq_len + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _loss(logits, labels):
    import torch
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def _meshes(spec: LayoutSpec):
    """The 4-D mesh, the data-parallel mesh of the dense parameters, and (EP) the experts' (edp, ep) mesh."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mesh = init_device_mesh("cpu", (spec.pp, spec.dp, spec.cp, spec.tp), mesh_dim_names=DIMENSIONS)
    dense = mesh["dp", "cp"]._flatten("dp_cp") if spec.cp > 1 else mesh["dp"]
    experts = None
    if spec.ep > 1:
        ranks = torch.arange(spec.world).view(spec.pp, spec.dp * spec.cp // spec.ep, spec.ep, spec.tp)
        experts = DeviceMesh("cpu", ranks, mesh_dim_names=("pp", "edp", "ep", "tp"))
    return mesh, dense, experts


def _dense(spec: LayoutSpec, shape: ModelShape, mesh, dense, experts):
    """The model for TP, CP, EP or plain data parallelism, and its step: (forward + backward) -> loss."""
    import torch

    from commbench.proxies.train_layout_parts import shard_data_parallel, tensor_parallel

    attention = "sdpa"
    if spec.cp > 1:
        from transformers import AttentionInterface, AttentionMaskInterface

        from commbench.proxies.train_layout_ring import ring_attention
        attention = "commbench_ring"
        AttentionInterface.register(attention, ring_attention(mesh.get_group("cp")))
        AttentionMaskInterface.register(attention, lambda *args, **kwargs: None)
    model = llama(shape, attention)
    if spec.ep > 1:
        _moe(model, shape, experts)
    if spec.tp > 1:
        tensor_parallel(model, mesh["tp"], spec.sequence_parallel)
    shard_data_parallel(model, list(model.model.layers), dense)
    inputs, labels = _batch(shape, seed=mesh["dp"].get_local_rank())
    cp_rank, block = mesh["cp"].get_local_rank(), shape.seq_len // spec.cp
    positions = torch.arange(cp_rank * block, (cp_rank + 1) * block).unsqueeze(0)
    inputs, labels = inputs[:, positions[0]], labels[:, positions[0]]

    def step():
        loss = _loss(model(input_ids=inputs, position_ids=positions).logits, labels)
        loss.backward()
        return loss.item()
    return model, step


def _moe(model, shape: ModelShape, experts) -> None:
    """Every decoder layer's MLP replaced by an expert-parallel MoE, its experts FSDP2-sharded on "edp"
    (the ranks holding the same experts)."""
    from torch.distributed.fsdp import fully_shard

    from commbench.proxies.train_layout_moe import ExpertParallelMoE

    for index, layer in enumerate(model.model.layers):
        layer.mlp = ExpertParallelMoE(shape.hidden, shape.ffn, shape.experts, shape.top_k, experts.get_group("ep"),
                                      seed=100 * (index + 1))
        fully_shard(layer.mlp.experts_here, mesh=experts["edp"])


def _pipelined(spec: LayoutSpec, shape: ModelShape, mesh):
    """The pipeline stages of this rank and their step: the schedule over the micro-batches."""
    from commbench.proxies.train_layout_parts import pipeline_schedule, pipeline_stages, tensor_parallel

    model = llama(shape)
    if spec.tp > 1:  # the decoder layers' TP plan, then the stages cut from them (torchtitan's order)
        tensor_parallel(model, mesh["tp"], spec.sequence_parallel)
    stages = pipeline_stages(model, mesh, spec.virtual, shard=spec.dp > 1)
    schedule = pipeline_schedule(stages, spec.schedule, spec.microbatches, _loss)
    inputs, labels = _batch(shape, seed=mesh["dp"].get_local_rank())
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    modules = [s.submod for s in stages]

    def step():
        losses = []
        schedule.step(*([inputs] if first else []), **({"target": labels, "losses": losses} if last else {}))
        return sum(loss.item() for loss in losses) / len(losses) if losses else float("nan")
    return modules, step


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
        loss = self.forward_backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss


def build_layout(spec: LayoutSpec, shape: ModelShape) -> BuiltLayout:
    """The model of `shape` laid out as `spec` on this rank's initialised gloo process group (every rank
    calls it: the mesh's groups are made collectively), with its SGD optimizer."""
    import torch

    spec.check(shape)
    mesh, dense, experts = _meshes(spec)
    torch.manual_seed(0)  # the same initial weights on every rank
    if spec.pp > 1:
        modules, forward_backward = _pipelined(spec, shape, mesh)
    else:
        model, forward_backward = _dense(spec, shape, mesh, dense, experts)
        modules = [model]
    parameters = [p for module in modules for p in module.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=1e-3, momentum=0.9)
    extra = {"dp_cp": dense.get_group()} if spec.cp > 1 else {}
    if experts is not None:
        extra.update(edp=experts.get_group("edp"), ep=experts.get_group("ep"))
    coordinates = mesh.get_coordinate() and dict(zip(DIMENSIONS, mesh.get_coordinate()))
    return BuiltLayout(forward_backward, optimizer, mesh_labels(mesh, extra), coordinates)


def run_layout(spec: LayoutSpec, shape: ModelShape, steps: int = 4, traced: int = 2) -> LayoutRun:
    """Train `steps` optimizer steps (SGD) of a layout on this rank's initialised gloo process group and
    trace the last `traced`: every call each issues, by mesh dimension."""
    import torch.distributed as dist

    built = build_layout(spec, shape)
    run = LayoutRun(dist.get_rank(), built.coordinates)
    for index in range(steps):
        calls = []
        tracing = trace_mode(calls, built.labels) if index >= steps - traced else None
        start = time.perf_counter()
        with tracing if tracing is not None else contextlib.nullcontext():
            run.losses.append(built.step())
        run.step_time_us.append((time.perf_counter() - start) * 1e6)
        if tracing is not None:
            run.calls.append(calls)
    return run


def _rank(rank: int, world: int, port: int, specs: dict, shape_of: dict, steps: int, out) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name, spec in specs.items():
            try:
                out.put((name, rank, run_layout(spec, shape_of[name], steps)))
            except Exception as error:  # said to the parent, which stops waiting
                out.put((name, rank, f"{type(error).__name__}: {error}"))
                raise
            dist.barrier()
    finally:
        dist.destroy_process_group()


def train_layouts(specs: dict, shape_of: dict, world: int = 4, steps: int = 4, timeout_s: float = 300) -> dict:
    """Spawn `world` local gloo ranks that run each named layout in turn: name -> [LayoutRun per rank].
    A rank that fails, dies or sends nothing for `timeout_s` ends the job with one RuntimeError."""
    import queue

    import torch.multiprocessing as mp

    from commbench.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, specs, shape_of, steps, out)) for r in range(world)]
    for proc in procs:
        proc.start()
    results: dict = {name: [None] * world for name in specs}
    try:
        waited_s, left = 0.0, len(specs) * world
        while left:
            try:
                name, rank, run = out.get(timeout=1.0)
            except queue.Empty:
                waited_s += 1.0
                dead = [r for r, proc in enumerate(procs) if proc.exitcode not in (None, 0)]
                if dead or waited_s > timeout_s:
                    said = f"rank(s) {dead} died" if dead else f"no rank reported in {timeout_s:g} s"
                    raise RuntimeError(said) from None
                continue
            if isinstance(run, str):
                raise RuntimeError(f"rank {rank} failed in layout {name}: {run}")
            results[name][rank], waited_s, left = run, 0.0, left - 1
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.exitcode is None:
                proc.kill()
    return results
