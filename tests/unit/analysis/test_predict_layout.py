"""A layout's predicted step: its parts are the compute, the calls and the pipeline that the modules below give,
put together exactly as analysis/predict_layout.py says."""
from dataclasses import replace

import pytest

from commbench.analysis.predict_layout import Job, predict_layout, rank_layouts
from commbench.analysis.scaling import comm_us
from commbench.costmodel import load_hardware
from commbench.proxies.comm_plan import Comm
from commbench.proxies.layouts import pipeline
from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.profile import load_profile
from commbench.topology import Topology


@pytest.fixture(scope="module")
def job():
    profile = load_profile("llama3.1-8b")
    return Job(profile.transformer, profile, load_hardware("dgx-h100"), 8, 1, 400.0, "selective", "nccl", 989.5)


def _compute_us(job, tokens_per_rank, tp=1):
    shape = job.shape
    forward = shape.forward_flops_per_token(causal_halved=job.causal_halved) * tokens_per_rank / tp
    recompute = shape.layers * shape.attention_score_flops(causal_halved=job.causal_halved) * tokens_per_rank / tp
    return (3 * forward + recompute) / (job.tflops * 1e6)


def test_causal_attention_counts_half_the_scores_in_time_not_in_mfu(job):
    par = Parallelism(dp=8, setup="ddp", microbatches=4)
    full, halved = (predict_layout(replace(job, causal_halved=c), par) for c in (False, True))
    scores = job.shape.layers * job.shape.attention_score_flops() * job.shape.seq_len
    # forward, backward (twice) and selective recompute (once) of half the scores, 4 micro-batches
    assert full.compute_us - halved.compute_us == pytest.approx(4 * 4 * scores / 2 / (job.tflops * 1e6), rel=1e-9)
    assert halved.mfu * halved.step_us == pytest.approx(full.mfu * full.step_us, rel=1e-9)  # same model FLOPs


def test_data_parallel_alone_is_compute_and_what_the_setup_exposes(job):
    par = Parallelism(dp=8, setup="ddp", microbatches=4)
    p = predict_layout(job, par)
    assert p.compute_us == pytest.approx(4 * _compute_us(job, job.shape.seq_len), rel=1e-9)
    assert p.step_us == pytest.approx(p.compute_us + p.exposed_us["dp"], rel=1e-9)
    assert set(p.comm_us) == {"dp"} and p.bubble == 0.0
    assert p.tokens_per_s == pytest.approx(4 * 8 * job.shape.seq_len / (p.step_us * 1e-6))


def test_tensor_parallel_calls_are_the_cost_models_allreduces(job):
    par = Parallelism(tp=2, dp=4, microbatches=2)
    p = predict_layout(job, par)
    nbytes = job.shape.seq_len * job.shape.hidden * 2
    one = comm_us(job.hw, Topology(1, 2), Comm("allreduce", nbytes, "bfloat16", "world", 0, 0, ""), "nccl")[0]
    assert p.comm_us["tp"] == pytest.approx(4 * job.shape.layers * 2 * one)
    assert p.exposed_us["tp"] == pytest.approx(p.comm_us["tp"])  # Megatron's TP calls wait on the compute
    assert p.compute_us == pytest.approx(2 * _compute_us(job, job.shape.seq_len, tp=2), rel=1e-9)


def test_the_pipeline_bubble_follows_from_the_schedule(job):
    par = Parallelism(pp=4, dp=2, microbatches=8)
    p = predict_layout(job, par)
    # (pp - 1) / (m + pp - 1) = 0.27 with even stages: the floor; the head (128k x 4096) makes the last stage longer
    assert 0.27 < p.bubble < 0.4
    interleaved = predict_layout(job, Parallelism(pp=4, dp=2, microbatches=8, pp_schedule="interleaved",
                                                  virtual_stages=2))
    assert interleaved.bubble < p.bubble and interleaved.step_us < p.step_us


def test_memory_follows_the_schedules_activations(job):
    one = predict_layout(job, Parallelism(pp=4, dp=2, microbatches=8))
    gpipe = predict_layout(job, Parallelism(pp=4, dp=2, microbatches=8, pp_schedule="gpipe"))
    assert gpipe.memory.activations_nbytes > 1.5 * one.memory.activations_nbytes  # 8 micro-batches held, not 4
    held = [pipeline.in_flight(pipeline.order(schedule, 4, 0, 8)) for schedule in ("gpipe", "1f1b")]
    assert held == [8, 4]


def test_layouts_that_do_not_fit_rank_last(job):
    big = Parallelism(dp=64, setup="ddp", microbatches=1)  # 8B parameters unsharded: 16 bytes each
    small = Parallelism(tp=8, dp=8, setup="fsdp-full", microbatches=1)
    ranked = rank_layouts(job, [big, small])
    assert [p.layout for p in ranked] == [small, big] and ranked[1].fits is False and ranked[0].fits is True


def test_a_ranks_share_of_the_experts_is_their_element_count_over_ep_and_tp():
    """Stacked expert tensors (experts x ...) are split by their elements, not by rounding their first dimension:
    Mixtral's 8 experts over ep 8 x tp 8 leave a rank 1/64 of them."""
    from commbench.analysis.predict_layout import _stage_profile

    profile = load_profile("mixtral-8x7b")
    job = Job(profile.transformer, profile, load_hardware("dgx-h100"), 8, 1, 400.0)
    share = _stage_profile(job, Parallelism(tp=8, ep=8, dp=8), 0)
    experts = sum(t.numel for t in profile.tensors if "expert" in t.name)
    assert sum(t.numel for t in share.tensors) < profile.parameters / 8 + experts / 64 + 1e6


def test_context_parallel_steps_show_only_what_outlasts_the_phases_attention(job):
    """Overlapping calls of a phase are summed, then the phase's attention covers them once."""
    from commbench.analysis.predict_layout import _call_us, _chunk_us
    from commbench.proxies.layouts.calls import layer_calls

    par = Parallelism(tp=8, cp=16, dp=1)
    forward, backward, dims = _chunk_us(job, par, range(1), head=False)
    calls = layer_calls(par, job.shape, 1, job.checkpointing)
    rate, local = job.tflops * 1e6, job.shape.seq_len / par.cp
    attention = job.shape.attention_score_flops(causal_halved=job.causal_halved) * local / par.tp / rate
    ring = {phase: sum(_call_us(job, par, c) * c.count for c in calls if c.phase == phase if c.overlaps)
            for phase in ("forward", "backward")}
    shown = max(0, ring["forward"] - attention) + max(0, ring["backward"] - 2 * attention)
    assert dims["cp"][1] == pytest.approx(shown)


def test_hybrid_sharding_shards_inside_a_node_only(job):
    """fsdp-hybrid (HSDP) shards the model states over a node's replicas, fsdp-full over all of them."""
    full = predict_layout(job, Parallelism(tp=2, dp=32, setup="fsdp-full"))
    hybrid = predict_layout(job, Parallelism(tp=2, dp=32, setup="fsdp-hybrid"))
    assert hybrid.memory.optimizer_nbytes == pytest.approx(8 * full.memory.optimizer_nbytes, rel=0.01)  # 4 vs 32


def test_a_sized_hsdp_shard_group_shards_by_its_size_and_costs_its_groups_where_they_sit(job):
    """hsdpRxS: the model states shard over S ranks whatever the nodes; hsdp1xN is fsdp-full over N, hsdpNx1
    is node-sharded HSDP where TP fills the node (one replica a node)."""
    fsdp, hsdp = (predict_layout(job, Parallelism(tp=8, dp=32, setup=s)) for s in ("fsdp-full", "fsdp-hybrid"))
    one_x, x_one, sized = (predict_layout(job, Parallelism(tp=8, dp=32, setup="fsdp-hybrid", dp_shard=s))
                           for s in (32, 1, 4))
    assert (one_x.memory, one_x.step_us) == (fsdp.memory, fsdp.step_us)
    assert (x_one.memory, x_one.step_us) == (hsdp.memory, hsdp.step_us)
    assert sized.memory.optimizer_nbytes == pytest.approx(8 * fsdp.memory.optimizer_nbytes, rel=0.01)  # 4 vs 32
    assert fsdp.memory.total_nbytes < sized.memory.total_nbytes < hsdp.memory.total_nbytes
    # on nodes of 32 GPUs a node holds 4 replicas: hsdp8x4 is node-sharded HSDP there, call for call
    wide = replace(job, gpus_per_node=32)
    on_wide, node_wide = (predict_layout(wide, Parallelism(tp=8, dp=32, setup="fsdp-hybrid", dp_shard=s))
                          for s in (4, None))
    assert (on_wide.memory, on_wide.comm_us) == (node_wide.memory, node_wide.comm_us)
    # on nodes of 8 (TP fills each) the same 4-rank shard group spans 4 nodes: costed across them, not as a node's
    assert on_wide.comm_us["dp"] < sized.comm_us["dp"]


def _routed_copies(experts, top_k, holders, draws=20000, seed=7):
    """Monte Carlo: the mean number of holder groups (nodes or GPUs, `holders` of them, experts evenly placed)
    that a token's top_k distinct experts, drawn uniformly, touch."""
    import numpy as np

    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((draws, experts)), axis=1)[:, :top_k] // (experts // holders)
    return float(np.mean([len(set(row)) for row in picks]))


@pytest.mark.parametrize("nodes, per_node", [(4, 8), (2, 8), (1, 8)])
def test_deepep_sends_a_token_once_a_node_over_the_nics_and_once_a_gpu_over_nvlink(nodes, per_node):
    from commbench.analysis.predict_layout import _alltoall_us, _deepep_us
    from commbench.topology import Link

    shape = replace(load_profile("llama3.1-8b").transformer, experts=128, top_k=8, expert_ffn=1536)
    hw = load_hardware("dgx-h100")
    slow, fast = Link("slow", bw_gbps=1.0, latency_us=0.0), Link("fast", bw_gbps=1e9, latency_us=0.0)
    nbytes = 8 * 1_000_000  # top_k copies of a 1 MB token block
    topo = Topology(nodes, per_node)
    n = nodes * per_node
    # NICs alone slow (one a GPU): the time is the remote copies, once per other node holding an expert
    nic_bound = replace(hw, intra=fast, inter=replace(slow, links_per_node=per_node), per_call_overhead_us=0.0)
    expected_remote = (nodes - 1) / nodes * _routed_copies(128, 8, nodes)  # touched nodes other than its own
    assert _deepep_us(nic_bound, topo, nbytes, shape) == pytest.approx(expected_remote * 1_000_000 / 1e3, rel=0.03,
                                                                        abs=1e-3)
    # NVLink alone slow: one copy a touched GPU other than its own (and what it forwards, the same by symmetry)
    nvlink_bound = replace(hw, intra=slow, inter=replace(fast, links_per_node=per_node), per_call_overhead_us=0.0)
    expected_local = (n - 1) / n * _routed_copies(128, 8, n)
    assert _deepep_us(nvlink_bound, topo, nbytes, shape) == pytest.approx(expected_local * 1_000_000 / 1e3, rel=0.03)
    # never more than the all-to-all of one copy a routed expert
    assert _deepep_us(hw, topo, nbytes, shape) <= _alltoall_us(hw, topo, nbytes)


def test_the_real_heads_excess_that_compute_measured_is_in_the_prediction():
    """framework_us head_forward / head_backward (commbench compute times the real head and loss): the last stage's
    head costs them beside its operators, once a micro-batch, as the layout replay's pieces do."""
    from commbench.analysis.predict_layout import model_compute_us
    from commbench.costmodel.compute import AttentionPoint, ComputeBlock, MatmulPoint

    block = ComputeBlock("cpu (test)", (MatmulPoint(64, 64, 64, "float32", 10.0),),
                         (AttentionPoint(4, 64, 64, 16, True, "float32", 5.0, 12.0),), 10.0, 1.0,
                         {"forward": 100.0, "backward": 150.0}, meta={"dtype": "float32"})
    profile, hw = load_profile("llama-tiny"), load_hardware("dgx-a100")
    plain = model_compute_us(profile, hw, 2, block, "float32", 1)
    more = model_compute_us(profile, hw, 2, replace(block, framework_us={**block.framework_us, "head_forward": 30.0,
                                                                          "head_backward": 45.0}), "float32", 1)
    assert (more[0] - plain[0], more[1] - plain[1]) == pytest.approx((30.0, 45.0))
