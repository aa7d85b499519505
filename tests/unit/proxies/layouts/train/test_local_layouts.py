"""Each parallel layout trained for real on 4 gloo ranks (proxies/layouts/train/local.py), and what torch issues.

One spawned 4-rank job trains a small Llama (transformers' LlamaForCausalLM) under every layout for four
steps and traces the last two. The calls of a steady step must equal the closed forms below, written in
the model's shape only: these are the closed forms of proxies/layouts/train/local.py's docstring and of
docs/layouts.md ("What torch issues"), which the layout plans are checked against. The losses check that
each layout trains the same model on the same data: TP, SP, CP and PP give the data-parallel loss.
"""
import dataclasses
import os
from collections import Counter

import pytest
from conftest import clean_env

from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.layouts.train.local import Trained, train_layouts
from commbench.proxies.layouts.train.model import check_trainable
from commbench.proxies.layouts.train.trace import totals
from commbench.proxies.profile import load_profile

F32 = 4
# the shipped llama-tiny profile's shape (odd FFN and vocabulary: 176, 1024), and its MoE twin: 4 experts, top 2,
TINY = load_profile("llama-tiny").transformer
DENSE = Trained.of(TINY, batch=4)
# experts narrower than the dense MLP (96, not 176): each closed form must take the expert's width where it is one
MOE = Trained.of(dataclasses.replace(TINY, experts=4, top_k=2, expert_ffn=96), batch=4)


def _layout(world: int = 4, setup: str = "fsdp-full", **degrees) -> Parallelism:
    """A layout on `world` ranks, dp what the others leave; 4 micro-batches through a pipeline."""
    rest = degrees.get("tp", 1) * degrees.get("pp", 1) * degrees.get("cp", 1)
    micro = {"microbatches": 4} if degrees.get("pp", 1) > 1 else {}
    return Parallelism(dp=max(1, world // rest), setup=setup, **{**micro, **degrees})


STEPS = 4  # the last two traced: DDP rebuilds its buckets in the second step's forward (a broadcast of their order)
LAYOUTS = {
    "dp4": (_layout(), DENSE),
    "tp2 dp2": (_layout(tp=2), DENSE),
    "tp2 sp dp2": (_layout(tp=2, sequence_parallel=True), DENSE),
    "pp2 dp2 1f1b": (_layout(pp=2, pp_schedule="1f1b"), DENSE),
    "pp2 dp2 gpipe": (_layout(pp=2, pp_schedule="gpipe"), DENSE),
    "pp2 dp2 interleaved": (_layout(pp=2, pp_schedule="interleaved", virtual_stages=2), DENSE),
    "cp2 dp2": (_layout(cp=2), DENSE),
    "ep2 dp4": (_layout(ep=2), MOE),
    # DDP as the data-parallel part, beside TP and under a pipeline
    "tp2 ddp2": (_layout(tp=2, setup="ddp"), DENSE),
    "pp2 ddp2 1f1b": (_layout(pp=2, setup="ddp"), DENSE),
    # CP and EP beside a pipeline (dp 1: FSDP2 shards over the cp group; ep = dp: the ep group is the dp group)
    "pp2 cp2": (_layout(pp=2, cp=2), DENSE),
    "pp2 ep2 dp2": (_layout(pp=2, ep=2), MOE),
    # EP beside TP with sequence parallelism: the MoE's tokens gathered over TP as the dense MLP's (issue 48: its
    # router's plain weights met TP's DTensor input, aten.mm "got mixed torch.Tensor and DTensor")
    "tp2 sp ep2 dp2": (_layout(tp=2, sequence_parallel=True, ep=2), MOE),
    # SP beside a pipeline (dp 1): the hidden states crossing a stage boundary are this TP rank's part
    "pp2 tp2 sp": (_layout(pp=2, tp=2, sequence_parallel=True), DENSE),
}


@pytest.fixture(scope="module")
def runs():
    old = {k: os.environ.pop(k) for k in list(os.environ) if k not in clean_env()}
    try:
        return train_layouts({n: spec for n, (spec, _) in LAYOUTS.items()},
                             {n: shape for n, (_, shape) in LAYOUTS.items()}, world=4, steps=STEPS, timeout_s=400)
    finally:
        os.environ.update(old)


def _layer_elements(shape, tp=1, moe=False):
    """A decoder layer's parameters on one rank: attention and MLP split over TP, norms replicated."""
    kv = shape.kv_heads * shape.head_dim
    attention = 2 * shape.hidden * shape.hidden + 2 * shape.hidden * kv
    mlp = shape.experts * shape.hidden if moe else 3 * shape.hidden * shape.ffn  # MoE: the router only
    return (attention + mlp) // tp + 2 * shape.hidden


def _fsdp(layer_nbytes, units, roots, group, microbatches=0):
    """FSDP2 (reshard after forward) per step: each unit gathered in the forward and again in the backward
    (with micro-batches: in each micro-batch's forward, once in the backward), reduce-scattered once; each
    root gathered once (kept from forward to backward) and reduce-scattered once."""
    gathers = microbatches + 1 if microbatches else 2
    calls = Counter({("allgather", layer_nbytes, group): gathers * units,
                     ("reduce_scatter", layer_nbytes, group): units})
    for root in roots:
        calls.update({("allgather", root, group): 1, ("reduce_scatter", root, group): 1})
    return calls


def _root(shape, first=True, last=True):
    """The embedding (first stage) and the final norm with the output layer (last stage), in bytes."""
    embedding, head = shape.vocab * shape.hidden, shape.hidden + shape.vocab * shape.hidden
    return F32 * ((embedding if first else 0) + (head if last else 0))


def _ddp(parameter_nbytes, forwards, group="dp"):
    """DDP (its default buckets) per step: the rank's whole gradient in one allreduce (under 1 MiB here:
    DDP's first bucket), and without a pipeline the rotary embedding's buffers (inv_freq and its original:
    head_dim fp32 values) broadcast in the forward; a pipeline runs every forward under no_sync, after which
    DDP broadcasts no buffers."""
    calls = Counter({("allreduce", parameter_nbytes, group): 1})
    if forwards:
        calls[("broadcast", forwards, group)] = 1
    return calls


def _beside_a_pipeline(name, rank):
    """The layouts whose data-parallel part is DDP, or whose pipeline has CP or EP beside it: each dimension's
    calls per micro-batch on this rank's stage, times the micro-batches (rank = pp x 2 + the other index)."""
    spec, trained = LAYOUTS[name]
    shape, batch = trained.transformer, trained.batch
    stage, micro = (rank // (spec.world // spec.pp), spec.microbatches) if spec.pp > 1 else (0, 1)
    rows, length = batch // micro, shape.seq_len // spec.cp
    layers = shape.layers // spec.pp
    first, last = stage == 0, stage == spec.pp - 1
    elements = layers * _layer_elements(shape, spec.tp, bool(shape.experts)) + _root(shape, first, last) // F32
    activation = rows * length * shape.hidden * F32
    if spec.setup == "ddp":
        calls = _ddp(F32 * elements, 0 if spec.pp > 1 else F32 * shape.head_dim)
    elif spec.dp * spec.cp == 1:  # one replica: no wrapper
        calls = Counter()
    else:  # dense FSDP2 units on the replicas' group, labelled by its ranks; experts on 1-rank "edp" groups: no calls
        group = "cp" if spec.cp > 1 else "ep"
        root = _root(shape, first, last)
        calls = _fsdp(F32 * _layer_elements(shape, moe=bool(shape.experts)), layers, [root], group, micro)
    if spec.sequence_parallel:  # per micro-batch, as without a pipeline; one of the two edge gathers per stage.
        # The norms' weight gradients (Partial over TP) are reduced by DTensor inside the optimizer's step, which
        # the trace does not see (without a pipeline FSDP2 reduces them, in the trace)
        calls.update({("allgather", activation, "tp"): micro * (4 * layers + 1),
                      ("reduce_scatter", activation, "tp"): micro * 4 * layers})
    elif spec.tp > 1:
        calls[("allreduce", activation, "tp")] = micro * 7 * layers
    if spec.pp > 1:  # one stage per rank: activations on (not the last), gradients back (not the first)
        sends = micro * ((not last) + (not first))
        between = activation // (spec.tp if spec.sequence_parallel else 1)
        calls.update({("send", between, "pp"): sends, ("recv", between, "pp"): sends})
    if spec.cp > 1:  # the ring of each attention, per micro-batch: keys and values of this rank's block
        block = 2 * rows * length * shape.kv_heads * shape.head_dim * F32
        steps = micro * layers * (3 * spec.cp - 2)
        calls.update({("send", block, "cp"): steps, ("recv", block, "cp"): steps})
    if spec.ep > 1:
        calls[("alltoall", shape.experts * 8, "ep")] = micro * layers  # the per-expert counts, int64
    return calls


def _expected(name, rank):
    spec, trained = LAYOUTS[name]
    shape, batch = trained.transformer, trained.batch
    if spec.setup == "ddp" or (spec.pp > 1 and (spec.cp * spec.ep > 1 or spec.sequence_parallel)):
        return _beside_a_pipeline(name, rank)
    activation = batch * shape.seq_len * shape.hidden * F32
    layers = shape.layers
    if name == "dp4":
        return _fsdp(F32 * _layer_elements(shape), layers, [_root(shape)], "dp")
    if spec.ep > 1 and spec.tp > 1:  # beside TP with SP: the MoE takes its TP rank's tokens as they are
        router_and_norms = shape.experts * shape.hidden + 2 * shape.hidden  # replicated over TP
        attention = _layer_elements(shape, tp=2) - (3 * shape.hidden * shape.ffn // 2 + 2 * shape.hidden)
        calls = _fsdp(F32 * (attention + router_and_norms), layers, [_root(shape)], "ep")  # the dp group is ep's
        calls.update({("allgather", activation, "tp"): 2 * layers + 2, ("reduce_scatter", activation, "tp"): 2 * layers,
                      ("allreduce", F32 * shape.hidden, "tp"): 2 * layers,
                      ("alltoall", shape.experts * 8, "ep"): layers})
        return calls
    if name.startswith("tp2"):
        calls = _fsdp(F32 * _layer_elements(shape, tp=2), layers, [_root(shape)], "dp")
        if spec.sequence_parallel:  # 2 gathers and 2 reduce-scatters per layer each way, entering and leaving
            calls.update({("allgather", activation, "tp"): 4 * layers + 2,
                          ("reduce_scatter", activation, "tp"): 4 * layers,
                          ("allreduce", F32 * shape.hidden, "tp"): 2 * layers})  # the SequenceParallel norms' weights
        else:  # forward: o and down; backward: q, k, v, gate and up each reduce their input's gradient
            calls[("allreduce", activation, "tp")] = 7 * layers
        return calls
    if name.startswith("pp2"):
        stages = spec.pp * spec.virtual_stages
        mine = range(rank // 2, stages, spec.pp)  # rank = pp x 2 + dp
        roots = [r for r in (_root(shape, i == 0, i == stages - 1) for i in mine) if r]
        calls = _fsdp(F32 * _layer_elements(shape), layers // spec.pp, roots, "dp", spec.microbatches)
        micro = activation // spec.microbatches
        sends = spec.microbatches * sum((i < stages - 1) + (i > 0) for i in mine)  # activations on, gradients back
        calls.update({("send", micro, "pp"): sends, ("recv", micro, "pp"): sends})
        return calls
    if name.startswith("cp2"):
        calls = _fsdp(F32 * _layer_elements(shape), layers, [_root(shape)], "dp_cp")
        block = 2 * batch * shape.seq_len // spec.cp * shape.kv_heads * shape.head_dim * F32  # keys and values
        steps = (spec.cp - 1) + (spec.cp - 1) + spec.cp  # forward ring, backward ring, gradients home
        calls.update({("send", block, "cp"): steps * layers, ("recv", block, "cp"): steps * layers})
        return calls
    calls = _fsdp(F32 * _layer_elements(shape, moe=True), layers, [_root(shape)], "dp")
    calls.update(_fsdp(F32 * shape.experts // spec.ep * 3 * shape.hidden * shape.expert_ffn, layers, [], "edp"))
    calls[("alltoall", shape.experts * 8, "ep")] = layers  # the per-expert counts, int64
    return calls


def _observed(calls, name):
    """Calls by (collective, bytes, group); an EP token all-to-all by the bytes this rank sends or receives
    that do not depend on the routing (checked separately)."""
    counted = Counter()
    for call in calls:
        if call.collective == "alltoall" and call.dtype == "float32":
            continue
        counted[(call.collective, call.nbytes, call.group)] += 1
    return counted


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_steady_step_issues_the_closed_forms(runs, name):
    for rank, run in enumerate(runs[name]):
        first, second = ([c for c in step if not (c.collective == "alltoall" and c.dtype == "float32")]
                         for step in run.calls)
        assert [c.key for c in first] == [c.key for c in second]  # steady: both steps alike, in order
        assert _observed(run.calls[-1], name) == _expected(name, rank), (name, rank)
        assert {c.dtype for c in run.calls[-1]} <= {"float32", "int64"}


def test_expert_parallel_all_to_all_moves_every_token_copy(runs):
    """Per MoE layer: dispatch and combine in the forward, their transposes in the backward. Each sends
    (dispatch, backward of the combine) or receives (combine, backward of the dispatch) the T x k copies
    of hidden states, T tokens of this rank; what crosses the other way depends on the routing, and over
    an EP group what is sent is what is received."""
    spec, trained = LAYOUTS["ep2 dp4"]
    shape, batch = trained.transformer, trained.batch
    copies = batch * shape.seq_len * shape.top_k * shape.hidden * F32
    routed = set()
    for group in ((0, 1), (2, 3)):  # the EP groups: consecutive ranks
        tokens = [[c for c in runs["ep2 dp4"][r].calls[-1] if c.collective == "alltoall" and c.dtype == "float32"]
                  for r in group]
        for calls in tokens:  # forward: (dispatch, combine) per layer; backward: their transposes, layers reversed
            assert len(calls) == 4 * shape.layers and {c.group for c in calls} == {"ep"}
            assert {c.send_nbytes for c in calls[0::2]} == {copies} == {c.recv_nbytes for c in calls[1::2]}
            assert all(c.nbytes == max(c.send_nbytes, c.recv_nbytes) for c in calls)
            routed.update(c.recv_nbytes for c in calls[0::2])
        for index in range(4 * shape.layers):
            sent = sum(calls[index].send_nbytes for calls in tokens)
            assert sent == sum(calls[index].recv_nbytes for calls in tokens)
    assert routed != {copies}  # not vacuous: the router's splits are uneven


@pytest.mark.parametrize("name", ["tp2 dp2", "tp2 sp dp2", "pp2 dp2 1f1b", "pp2 dp2 gpipe", "pp2 dp2 interleaved",
                                  "tp2 ddp2", "pp2 ddp2 1f1b", "pp2 tp2 sp"])
def test_a_layout_trains_the_data_parallel_model(runs, name):
    """Same weights, same data per data-parallel rank: the first step's loss equals the data-parallel run's (TP
    and SP on both TP ranks; PP on the last stage, the mean over its micro-batches). Later steps differ: the
    gradients are averaged over 2 data-parallel ranks here, over 4 there. Every layout's loss goes down."""
    reference = {run.coordinates["dp"]: run.losses[0] for run in runs["dp4"]}
    last_stages = [run for run in runs[name] if run.losses[0] == run.losses[0]]  # a first stage has no loss
    assert len(last_stages) == (2 if name.startswith("pp") else 4)
    for run in last_stages:
        assert run.losses[0] == pytest.approx(reference[run.coordinates["dp"]], abs=2e-5), run.rank
        assert run.losses[-1] < run.losses[0]


@pytest.mark.parametrize("name", ["cp2 dp2", "pp2 cp2"])
def test_ring_attention_gives_the_whole_sequence_loss(runs, name):
    """CP: the two halves of a sequence, each attending through the ring, average to the full loss; beside a
    pipeline too (the last stage's two CP ranks, each the mean over its micro-batches)."""
    reference = {run.coordinates["dp"]: run.losses[0] for run in runs["dp4"]}
    by_dp = {}
    for run in runs[name]:
        if run.losses[0] == run.losses[0]:  # a first pipeline stage has no loss
            by_dp.setdefault(run.coordinates["dp"], []).append(run.losses[0])
    assert by_dp
    for dp, halves in by_dp.items():
        assert len(halves) == 2 and sum(halves) / 2 == pytest.approx(reference[dp], abs=2e-5)


@pytest.mark.parametrize("name", ["pp2 ep2 dp2", "tp2 sp ep2 dp2"])
def test_expert_parallelism_beside_a_pipeline_or_tp_trains_the_same_mixture(runs, name):
    """EP under a pipeline, or beside TP with SP (each TP rank routing its part of the sequence), routes and
    computes as without one: the first loss (a pipeline's last stage's) equals the EP run's on the same
    data-parallel rank (same router and experts: an EP rank's experts follow its place in the group)."""
    reference = {run.coordinates["dp"]: run.losses[0] for run in runs["ep2 dp4"]}
    last_stages = [run for run in runs[name] if run.losses[0] == run.losses[0]]
    assert len(last_stages) == (2 if name.startswith("pp") else 4)
    for run in last_stages:
        assert run.losses[0] == pytest.approx(reference[run.coordinates["dp"]], abs=2e-5), run.rank
        assert run.losses[-1] < run.losses[0]


def test_totals_sum_a_steps_calls_by_group(runs):
    """The form the layout plans' step totals take: (group, collective) -> (calls, bytes)."""
    _, trained = LAYOUTS["cp2 dp2"]
    shape, batch = trained.transformer, trained.batch
    calls = runs["cp2 dp2"][0].calls[-1]
    summed = totals(calls)
    assert sum(count for count, _ in summed.values()) == len(calls)
    block = 2 * batch * shape.seq_len // 2 * shape.kv_heads * shape.head_dim * F32
    assert summed[("cp", "send")] == (4 * shape.layers, 4 * shape.layers * block)


def test_step_times_are_recorded(runs):
    assert all(len(run.step_time_us) == STEPS and min(run.step_time_us) > 0 for name in runs for run in runs[name])


@pytest.mark.parametrize("par, world, says", [
    (_layout(tp=3), 4, "= 3 GPUs, not 4"),
    (_layout(tp=4, world=8), 8, "does not divide 4 heads and 2 kv heads"),
    (_layout(pp=4, virtual_stages=2, pp_schedule="interleaved"), 4, "8 pipeline stages for the model's 4 layers"),
    (_layout(ep=3, world=6, tp=2), 6, "ep = 3 does not divide the model's 4 experts"),
    (_layout(pp=2, virtual_stages=2), 4, "--virtual-stages 2 needs --pp-schedule interleaved"),
    (_layout(pp=2, world=2, microbatches=3), 2, "3 micro-batches of 4 sequences or the sequence split"),
    (_layout(tp=2, setup="zero1"), 4, "data parallelism 'zero1'"),
])
def test_a_layout_that_cannot_run_is_refused(par, world, says):
    with pytest.raises(ValueError, match=says):
        check_trainable(par, MOE, world)


def test_a_shape_this_llama_cannot_build_is_refused():
    assert DENSE.transformer.ffn == 176 and DENSE.transformer.vocab == 1024  # the profile's, at fp32's width
    assert DENSE.transformer.dtype_bytes == F32 and TINY.dtype_bytes == 2
    with pytest.raises(ValueError, match="q_lora_rank, shared_experts, dense_layers"):
        Trained.of(load_profile("deepseek-v3").transformer, batch=1)
    with pytest.raises(ValueError, match="at least one sequence"):
        Trained.of(TINY, batch=0)


def test_a_rank_that_fails_ends_the_job_in_one_error():
    """The layout is checked on the rank: its ValueError comes back as the job's one RuntimeError, at once."""
    old = {k: os.environ.pop(k) for k in list(os.environ) if k not in clean_env()}
    try:
        with pytest.raises(RuntimeError, match="rank 0 failed in layout bad: LayoutError: .* = 2 GPUs, not 1"):
            train_layouts({"bad": _layout(world=1, tp=2)}, {"bad": DENSE}, world=1, steps=1, timeout_s=60)
    finally:
        os.environ.update(old)


def _planned(name: str, rank: int):
    """proxies/layouts/calls.step_bytes in torch's style for this layout and the rank's pipeline stage."""
    from commbench.proxies.layouts.calls import step_bytes

    spec, trained = LAYOUTS[name]
    shape, batch = trained.transformer, trained.batch
    micro = spec.microbatches if spec.pp > 1 else 1
    return step_bytes(spec, shape, batch // micro, stage=spec.coords(rank)["pp"], style="torch")


@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "dp4"])
def test_the_layout_plan_issues_what_torch_issues(runs, name):
    """The plan's calls and bytes per step on each rank (tp, cp, ep and pp groups; the data-parallel setup is
    the setups table's, tested in test_setups_torch.py) equal what torch issued: an EP token all-to-all's
    bytes depend on the routing, so EP compares calls only."""
    for rank, run in enumerate(runs[name]):
        traced = totals(run.calls[-1])
        planned = _planned(name, rank)
        assert planned, name
        for (dim, collective), (calls, nbytes) in planned.items():
            if name == "pp2 tp2 sp" and (dim, collective) == ("tp", "allreduce"):
                continue  # SP norms' gradients: DTensor reduces them inside the optimizer's step, unseen
            got = traced.get((dim, "send" if collective == "sendrecv" else collective))
            assert got is not None, (name, rank, dim, collective, sorted(traced))
            assert (got[0] if dim == "ep" else got) == (calls if dim == "ep" else (calls, nbytes)), \
                (name, rank, dim, collective, got, (calls, nbytes))
        dims = {dim for dim, _ in planned}
        assert {g for g, _ in traced if g in ("tp", "cp", "ep", "pp")} == dims, (name, rank)
