"""A parallel layout's training step predicted from the cost model: tensor, pipeline, context and expert
parallelism composed with a data-parallel setup (proxies/layouts/parallelism.py), on a model's transformer shape.

How a step is put together (docs/layouts.md, "Predicting a layout"):
1. Compute: each layer's FLOPs per token (proxies/transformer.py) times the tokens one rank holds of a
   micro-batch (b x s / cp), split over the TP ranks, at the achieved rate `tflops`; the backward is
   twice the forward plus what activation checkpointing recomputes.
2. Each layer's calls (proxies/layouts/calls.py) costed on its group's ranks (where the mesh places them:
   proxies/layouts/parallelism.py): TP and EP calls wait on the compute and are waited for; a CP ring step runs
   beside the attention it feeds, so only what outlasts that attention shows.
3. The pipeline: virtual stage j's forward and backward (compute plus what its calls expose) laid out in
   the schedule's order with a send between stages (proxies/layouts/pipeline.py): the bubble follows from it.
4. The data-parallel setup on the gradients a rank holds, over dp x cp ranks: the setups table's own plan
   (proxies/setups.py) of a profile cut to one rank's share of the busiest stage, overlapped with the last
   micro-batch's compute (all micro-batches' when there is no pipeline, as gradient accumulation runs them).
5. Memory per GPU (proxies/layouts/memory.py), with the activations held at once taken from the schedule's order.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import comb

from commbench.analysis.predict_trace import group_topology
from commbench.analysis.scaling import comm_us
from commbench.collectives import resolve_dtype
from commbench.costmodel import Hardware, call_us
from commbench.costmodel.compute import ComputeBlock
from commbench.proxies.comm_plan import simulate
from commbench.proxies.layouts import layer_ops as ops
from commbench.proxies.layouts import memory as M
from commbench.proxies.layouts import pipeline
from commbench.proxies.layouts.calls import EP_DISPATCH, LayerCall, boundary_nbytes, layer_calls
from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.layouts.stage_share import stage_profile
from commbench.proxies.profile import Profile
from commbench.proxies.setups import Compute, Placement, settle
from commbench.topology import Topology

RESERVED_FRACTION = 0.1  # of a GPU's memory kept free for the allocator, the CUDA context and NCCL's buffers


@dataclass(frozen=True)
class LayoutPrediction:
    layout: Parallelism
    step_us: float
    tokens_per_s: float  # all GPUs
    compute_us: float  # the busiest pipeline rank's compute per step
    bubble: float  # the share of the step the average pipeline rank idles
    comm_us: dict[str, float]  # per dimension: its calls' time per step on the busiest rank
    exposed_us: dict[str, float]  # per dimension: the part the step waited for
    memory: M.MemoryBreakdown
    fits: bool | None  # None: the hardware file gives no device memory
    mfu: float | None  # model FLOPs per second / (GPUs x the device's peak); None: the hardware gives no peak


@dataclass(frozen=True)
class Job:
    """What the layouts share: the model, the batch, the hardware and the compute rate."""
    shape: object  # proxies.transformer.TransformerShape
    profile: Profile
    hw: Hardware
    gpus_per_node: int
    microbatch: int  # sequences per micro-batch
    tflops: float  # achieved compute rate per GPU, 1e12 FLOP/s
    checkpointing: str = "selective"
    algorithm: str = "nccl"
    peak_tflops: float | None = None  # for MFU
    causal_halved: bool = True  # attention kernels skip the masked half of the scores (FlashAttention's causal)
    ep_dispatcher: str = "alltoall"  # calls.EP_DISPATCHERS: how MoE tokens reach their experts
    rate_source: str = "given"  # where `tflops` comes from: "given", or "peak:fp32" / "peak:bf16" (optimistic)
    compute: ComputeBlock | None = None  # operators' times on the device: costs each layer's operators (else tflops)
    compute_dtype: str = "bfloat16"  # the block's precision the operators are read in
    ranks_per_host: int | None = None  # ranks sharing a host's cores (a CPU block's core share); None: gpus_per_node


def predict_layout(job: Job, par: Parallelism) -> LayoutPrediction:
    """The step of `par` (checked by the caller: Parallelism.check)."""
    stages = par.pp * par.virtual_stages
    counts = M.stage_layers(job.shape.layers, stages)
    forward, backward = [], []
    per_dim: dict[int, dict[str, tuple[float, float]]] = {s: {} for s in range(par.pp)}
    for j in range(stages):
        first = sum(counts[:j])
        f, b, dims = _chunk_us(job, par, range(first, first + counts[j]), head=j == stages - 1)
        forward.append(f)
        backward.append(b)
        for dim, (total, exposed) in dims.items():
            before = per_dim[j % par.pp].get(dim, (0.0, 0.0))
            per_dim[j % par.pp][dim] = (before[0] + total, before[1] + exposed)
    hop = _p2p_us(job, par, "pp", boundary_nbytes(par, job.shape, job.microbatch)) if par.pp > 1 else 0.0
    piped = pipeline.run(par.pp_schedule, par.pp, par.microbatches, forward, backward, hop,
                         virtual_stages=par.virtual_stages)
    busiest = max(range(par.pp), key=lambda s: piped.busy_us[s])
    compute = sum((e - b) for _, b, e in piped.passes[busiest]) - sum(x for _, x in per_dim[busiest].values()) \
        * par.microbatches
    dp_total, dp_exposed = _data_parallel_us(job, par, busiest, forward, backward)
    step = piped.step_us + dp_exposed
    comm = {d: t * par.microbatches for d, (t, _) in per_dim[busiest].items()}
    exposed = {d: x * par.microbatches for d, (_, x) in per_dim[busiest].items()}
    if par.pp > 1:
        comm["pp"] = hop * par.microbatches * 2 * par.virtual_stages
        exposed["pp"] = piped.step_us - max(piped.busy_us)
    comm["dp"], exposed["dp"] = dp_total, dp_exposed
    tokens = par.microbatches * job.microbatch * job.shape.seq_len * par.dp
    memory = layout_memory(job, par)
    gpu_bytes = job.hw.device_memory_gb * 1e9 if job.hw.device_memory_gb else None
    model_flops = job.shape.training_flops_per_token() * tokens / (step * 1e-6) if step > 0 else 0.0
    peak = job.peak_tflops
    return LayoutPrediction(par, step, tokens / (step * 1e-6) if step > 0 else 0.0, compute, piped.bubble, comm,
                            exposed, memory, None if gpu_bytes is None else M.fits(memory, gpu_bytes,
                                                                                   RESERVED_FRACTION),
                            model_flops / (par.world * peak * 1e12) if peak else None)


def _chunk_us(job: Job, par: Parallelism, layers: range, head: bool) -> tuple[float, float, dict]:
    """One micro-batch through the layers `layers` of one virtual stage: (forward us, backward us, per dimension
    (calls' time, exposed time)), the calls' exposed time included in the forward and backward."""
    shape, rate = job.shape, job.tflops * 1e6  # FLOP per us
    local = job.microbatch * shape.seq_len / par.cp  # tokens of a micro-batch on one rank
    forward = backward = 0.0
    dims: dict[str, list[float]] = {}
    costs: dict[LayerCall, float] = {}
    for index in layers:
        f_us, b_us, attention = _layer_compute_us(job, par, index)
        beside = {"forward": [0.0, attention], "backward": [0.0, 2 * attention]}  # overlapping calls, their cover
        for call in layer_calls(par, shape, job.microbatch, job.checkpointing, moe=shape.is_moe_layer(index)):
            if call not in costs:
                costs[call] = _call_us(job, par, call)
            total = costs[call] * call.count
            entry = dims.setdefault(call.dim, [0.0, 0.0])
            entry[0] += total
            if call.overlaps:  # what outlasts the phase's attention shows, counted once per phase below
                beside[call.phase][0] += total
                continue
            entry[1] += total
            if call.phase == "forward":
                f_us += total
            else:
                b_us += total
        for phase, (total, cover) in beside.items():
            if total:
                shown = max(0.0, total - cover)
                dims["cp"][1] += shown
                f_us, b_us = (f_us + shown, b_us) if phase == "forward" else (f_us, b_us + shown)
        forward, backward = forward + f_us, backward + b_us
    if head and uses_block(job):
        times = ops.op_times(job.compute, ops.head_ops(shape, par, job.microbatch), job.compute_dtype, framework=False)
        root = job.compute.framework_us if _fsdp(par) else {}  # FSDP2's root unit: embedding, norm, head
        rest = job.compute.framework_us  # the real head and loss beyond their operators, where `compute` measured it
        share = job.compute.core_share(job.ranks_per_host or job.gpus_per_node)
        forward += share * (times.forward_us + root.get("fsdp_unit_forward", 0.0) + rest.get("head_forward", 0.0))
        backward += share * (times.backward_us + root.get("fsdp_unit_backward", 0.0) + rest.get("head_backward", 0.0))
    elif head:
        head_flops = shape.head_forward_flops() * local / par.tp
        forward, backward = forward + head_flops / rate, backward + 2 * head_flops / rate
    return forward, backward, {d: (t, x) for d, (t, x) in dims.items()}


def model_compute_us(profile: Profile, hw: Hardware, batch: int, block: ComputeBlock, dtype: str,
                     ranks_per_node: int) -> tuple[float, float]:
    """(forward us, backward us) of `batch` sequences through a transformer profile's whole model on one rank, no
    parallel dimension (data parallelism: what each replica computes), operator by operator from `block` read
    in `dtype`, a CPU block's cores shared by `ranks_per_node` ranks (the rate the Job takes is not read)."""
    job = Job(profile.transformer, profile, hw, ranks_per_node, batch, 1.0, "none", compute=block, compute_dtype=dtype)
    forward, backward, _ = _chunk_us(job, Parallelism(), range(job.shape.layers), head=True)
    return forward, backward


def uses_block(job: Job) -> bool:
    """Whether the job's compute comes from its compute block (operator by operator) rather than one rate."""
    return job.compute is not None and ops.unlisted(job.shape) is None


def _fsdp(par: Parallelism) -> bool:
    return settle(par.setup).setup.trains_as == "fsdp"


def _layer_compute_us(job: Job, par: Parallelism, index: int) -> tuple[float, float, float]:
    """(forward, backward with what checkpointing recomputes, the attention's forward) of layer `index` on one
    rank, per micro-batch: its operators from the compute block, else its FLOPs at the job's one rate."""
    shape = job.shape
    if uses_block(job):
        share = job.compute.core_share(job.ranks_per_host or job.gpus_per_node)
        t = ops.rank_layer_times(job.compute, ops.layer_ops(shape, par, job.microbatch, index), job.compute_dtype,
                                 par.tp > 1, _fsdp(par), share)
        recompute = {"none": 0.0, "selective": t.attention_forward_us, "full": t.forward_us}[job.checkpointing]
        return t.forward_us, t.backward_us + recompute, t.attention_forward_us
    rate = job.tflops * 1e6  # FLOP per us
    local = job.microbatch * shape.seq_len / par.cp  # tokens of a micro-batch on one rank
    flops = shape.layer_forward_flops(index, causal_halved=job.causal_halved) * local / par.tp
    attention = shape.attention_score_flops(causal_halved=job.causal_halved) * local / par.tp / rate
    recompute = {"none": 0.0, "selective": attention * rate, "full": flops}[job.checkpointing]
    return flops / rate, (2 * flops + recompute) / rate, attention


def _group_topology(job: Job, par: Parallelism, dim: str) -> Topology:
    nodes, per_node = par.nodes_spanned(dim, job.gpus_per_node)
    return Topology(nodes, per_node)


def _call_us(job: Job, par: Parallelism, call: LayerCall) -> float:
    """One call on its dimension's group: collectives by the cost model (as predict-scaling costs them), a ring
    step as one send to the neighbour, an all-to-all as each rank's sends to every peer at its link's rate."""
    if call.collective == "sendrecv":
        return _p2p_us(job, par, call.dim, call.nbytes)
    topo = _group_topology(job, par, call.dim)
    if call.collective == "alltoall" and call.label == EP_DISPATCH and job.ep_dispatcher == "deepep":
        return _deepep_us(job.hw, topo, call.nbytes, job.shape)
    if call.collective == "alltoall":
        return _alltoall_us(job.hw, topo, call.nbytes)
    itemsize = resolve_dtype(call.dtype).itemsize
    return call_us(job.hw, topo, call.collective, job.algorithm, call.nbytes, itemsize)[0]


def _p2p_us(job: Job, par: Parallelism, dim: str, nbytes: int) -> float:
    """A send to the group's next rank: across nodes when the group spans nodes (its ranks' neighbours then sit
    on other nodes), else inside one."""
    level = job.hw.inter if par.nodes_spanned(dim, job.gpus_per_node)[0] > 1 else job.hw.intra
    return job.hw.per_call_overhead_us + level.latency_us + nbytes / (level.bw_gbps * 1e3)


def _alltoall_us(hw: Hardware, topo: Topology, nbytes: int) -> float:
    """Each rank sends nbytes / n to each of the n - 1 others: those in its node over the node's links, the rest
    through the NICs, a rank's share of them (links_per_node over the group's ranks in a node, at most one)."""
    n = topo.world
    if n <= 1:
        return 0.0
    share = nbytes / n
    inside, outside = (topo.ranks_per_node - 1) * share, (n - topo.ranks_per_node) * share
    nics = min(1.0, (hw.inter.links_per_node or 1) / topo.ranks_per_node)
    over_nic = outside / (hw.inter.bw_gbps * 1e3 * nics) + (hw.inter.latency_us if outside else 0.0)
    return hw.per_call_overhead_us + max(inside / (hw.intra.bw_gbps * 1e3) + hw.intra.latency_us, over_nic)


def _deepep_us(hw: Hardware, topo: Topology, nbytes: int, shape) -> float:
    """DeepEP's dispatch (or combine) of a rank's `nbytes` (one copy a routed expert): a token crosses the NICs
    once to each other node holding any of its experts and NVLink once to each GPU holding any (DeepEP's
    README: "asymmetric-domain bandwidth forwarding", NVLink to RDMA), experts evenly placed, routing uniform
    (the forced-balance figures)."""
    n, nodes = topo.world, topo.nodes
    if n <= 1 or not shape.top_k:
        return 0.0
    copy = nbytes / shape.top_k

    def holds(experts: int) -> float:  # the chance that a token's top_k experts include one of `experts`
        return 1.0 - comb(shape.experts - experts, shape.top_k) / comb(shape.experts, shape.top_k)

    remote = (nodes - 1) * holds(shape.experts // nodes) * copy
    local = (n - 1) * holds(shape.experts // n) * copy  # its own node's GPUs, and what it forwards from others
    nics = min(1.0, (hw.inter.links_per_node or 1) / topo.ranks_per_node)
    over_nic = remote / (hw.inter.bw_gbps * 1e3 * nics) + hw.inter.latency_us if remote else 0.0
    return hw.per_call_overhead_us + max(local / (hw.intra.bw_gbps * 1e3) + hw.intra.latency_us, over_nic)


def _data_parallel_us(job: Job, par: Parallelism, stage: int, forward: list[float],
                      backward: list[float]) -> tuple[float, float]:
    """(the setup's calls' time, what of it the step waits for) on a rank of pipeline stage `stage`."""
    replicas = par.dp * par.cp
    if replicas == 1:
        return 0.0, 0.0
    share = _stage_profile(job, par, stage)
    chunks = [c * par.pp + stage for c in range(par.virtual_stages)]
    last = Compute(sum(forward[j] for j in chunks), sum(backward[j] for j in chunks))
    accumulate = par.microbatches if par.pp == 1 else 1  # a pipeline overlaps the last micro-batch only
    choice = settle(par.setup, {"accumulate": accumulate} if accumulate > 1 else {})
    nodes, per_node = _replica_layout(job, par)
    topo, groups = Topology(nodes, per_node), None
    if par.dp_shard:  # HSDP's sized shard group: planned as R "nodes" of S x cp, each group costed where it sits
        shard, replicate = par.hsdp_groups(0)
        plan = choice.plan(share, last, Placement(len(replicate), len(shard)))
        groups = {"world": topo, "node": group_topology(shard, job.gpus_per_node),
                  "cross": group_topology(replicate, job.gpus_per_node)}
    else:
        plan = choice.plan(share, last, Placement(nodes, per_node))
    costs: dict[tuple, float] = {}  # a step's units repeat a few sizes: each costed once (a search costs thousands)
    for c in plan.comms:
        key = (c.collective, c.nbytes, c.dtype, c.group)
        if key not in costs:
            costs[key] = comm_us(job.hw, topo, c, job.algorithm, groups)[0]
    times = [costs[(c.collective, c.nbytes, c.dtype, c.group)] for c in plan.comms]
    step = simulate(plan, times)
    return sum(times), max(0.0, step.step_us - plan.compute_us)


def _replica_layout(job: Job, par: Parallelism) -> tuple[int, int]:
    """Nodes and ranks per node of the ranks holding the same weights (dp x cp of one tp and pp position)."""
    members = sorted({r for c in par.group(0, "cp") for r in par.group(c, "dp")})
    nodes = len({r // job.gpus_per_node for r in members})
    return nodes, len(members) // nodes


def _stage_profile(job: Job, par: Parallelism, stage: int) -> Profile:
    """The profile cut to what one rank of pipeline stage `stage` holds (proxies/layouts/stage_share.py)."""
    return stage_profile(job.profile, job.shape.layers, par, stage)


def layout_memory(job: Job, par: Parallelism) -> M.MemoryBreakdown:
    """The fullest GPU's memory under `par` (proxies/layouts/memory.py), the activations held at once from the
    schedule."""
    held = tuple(pipeline.held_at_once(par.pp_schedule, par.pp, s, par.microbatches, par.virtual_stages)
                 / par.virtual_stages for s in range(par.pp))
    choice = settle(par.setup)
    within_node = choice.get("shard_group") == "node" if "shard_group" in choice.setup.knobs or choice.setup.fixed \
        else False
    degree = None  # the model states shard over every replica (dp x cp)
    if par.dp_shard:  # HSDP's sized shard group: dp_shard x cp ranks
        degree = par.dp_shard * par.cp
    elif within_node:  # HSDP: the replicas inside a node
        degree = _replica_layout(job, par)[1]
    sharding = choice.setup.memory_sharding
    choices = M.MemoryChoices(job.microbatch, held, sharding, job.checkpointing, shard_degree=degree,
                              gradients_held=not (sharding == "fsdp" and par.pp == 1 and par.microbatches == 1))
    return M.memory_per_gpu(job.shape, par, choices)


def rank_layouts(job: Job, layouts: list[Parallelism]) -> list[LayoutPrediction]:
    """Each layout's prediction, fastest first (those that do not fit the GPU's memory last)."""
    predictions = [predict_layout(job, par) for par in layouts]
    return sorted(predictions, key=lambda p: (p.fits is False, -p.tokens_per_s))
