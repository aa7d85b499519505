"""Each dimension's calls per layer and micro-batch, and a step's totals, as closed forms of the shape."""
import pytest

from commbench.proxies.layouts.calls import boundary_nbytes, layer_calls, step_bytes
from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.transformer import TransformerShape


def Shape(experts=0, top_k=0, dense_layers=0, dtype_bytes=2):  # noqa: N802 (a shape, as tests read it)
    return TransformerShape(layers=8, hidden=64, heads=8, kv_heads=4, head_dim=8, ffn=128, vocab=100, seq_len=128,
                            experts=experts, top_k=top_k, expert_ffn=32 if experts else 0, dense_layers=dense_layers,
                            dtype_bytes=dtype_bytes)


def _by(calls):
    return {(c.dim, c.collective, c.phase): (c.count, c.nbytes) for c in calls}


def test_tensor_parallel_allreduces_twice_each_way():
    act = 2 * 128 * 64 * 2  # b s h bf16
    assert _by(layer_calls(Parallelism(tp=2, dp=2), Shape(), 2)) == {
        ("tp", "allreduce", "forward"): (2, act), ("tp", "allreduce", "backward"): (2, act)}
    # full checkpointing repeats the forward's calls in the backward
    assert _by(layer_calls(Parallelism(tp=2, dp=2), Shape(), 2, checkpointing="full"))[
        ("tp", "allreduce", "backward")] == (4, act)


def test_sequence_parallel_gathers_and_scatters_instead():
    act = 128 * 64 * 4
    calls = _by(layer_calls(Parallelism(tp=4, dp=1, sequence_parallel=True), Shape(dtype_bytes=4), 1))
    assert calls == {(("tp", c, p)): (2, act) for c in ("allgather", "reduce_scatter") for p in ("forward", "backward")}


def test_moe_layers_without_expert_tensor_parallelism_gather_for_attention_only():
    """etp1 with SP: Megatron-Core's dispatcher takes the [s/tp, b, h] tokens as they are (token_dispatcher.py), so an
    MoE layer gathers and scatters for its attention block only; dense layers, and experts split by TP, keep 2 + 2."""
    act = 128 * 64 * 4
    etp1 = Parallelism(tp=4, dp=2, ep=8, expert_tp=1, sequence_parallel=True)
    one = {(("tp", c, p)): (1, act) for c in ("allgather", "reduce_scatter") for p in ("forward", "backward")}
    two = {key: (2, act) for key in one}
    tp_of = lambda calls: {k: v for k, v in _by(calls).items() if k[0] == "tp"}  # noqa: E731
    shape = Shape(experts=8, top_k=2, dtype_bytes=4)
    assert tp_of(layer_calls(etp1, shape, 1, moe=True)) == one
    assert tp_of(layer_calls(etp1, shape, 1, moe=False)) == two
    assert tp_of(layer_calls(Parallelism(tp=4, dp=2, ep=2, sequence_parallel=True), shape, 1, moe=True)) == two
    full = tp_of(layer_calls(etp1, shape, 1, checkpointing="full", moe=True))
    assert full[("tp", "allgather", "backward")] == (2, act)
    # a step: 8 layers, 2 of them dense, on one stage and 2 micro-batches
    par = Parallelism(tp=4, dp=2, ep=8, expert_tp=1, sequence_parallel=True, microbatches=2)
    assert step_bytes(par, Shape(experts=8, top_k=2, dense_layers=2, dtype_bytes=4), 1)[("tp", "allgather")] == (
        (2 * 2 + 6 * 1) * 2 * 2, (2 * 2 + 6 * 1) * 2 * 2 * act)


def test_context_parallel_passes_kv_blocks_round_the_ring():
    kv = (128 // 4) * (4 // 2) * (8 + 8) * 2  # s/cp tokens, kv heads per TP rank, K and V head dims, bf16
    calls = layer_calls(Parallelism(tp=2, cp=4), Shape(), 1)
    ring = [c for c in calls if c.dim == "cp"]
    assert all(c.nbytes == kv and c.overlaps == "attention" for c in ring)
    assert sum(c.count for c in ring if c.phase == "forward") == 3
    assert sum(c.count for c in ring if c.phase == "backward") == 3 + 4  # K/V again, then dK/dV home: cp steps


def test_expert_parallel_all_to_alls_on_moe_layers_only():
    shape = Shape(experts=8, top_k=2, dense_layers=2)
    routed = 128 * 64 * 2 * 2  # b s h x top_k, bf16
    calls = [(c.phase, c.dtype, c.count, c.nbytes) for c in layer_calls(Parallelism(ep=4, dp=4), shape, 1, moe=True)]
    assert sorted(calls) == [("backward", "bfloat16", 2, routed), ("forward", "bfloat16", 2, routed),
                             ("forward", "int64", 1, 8 * 8)]  # the per-expert token counts first
    assert layer_calls(Parallelism(ep=4, dp=4), shape, 1, moe=False) == []
    totals = step_bytes(Parallelism(ep=4, dp=4, microbatches=3), shape, 1)
    assert totals[("ep", "alltoall")] == (5 * 6 * 3, (4 * routed + 64) * 6 * 3)  # 6 MoE layers, 3 micro-batches


@pytest.mark.parametrize("stage,sends", [(0, 4), (1, 8), (3, 4)])
def test_pipeline_stages_send_activations_on_and_gradients_back(stage, sends):
    par = Parallelism(pp=4, dp=1, microbatches=4)
    assert step_bytes(par, Shape(), 1, stage=stage)[("pp", "send")] == (sends, sends * boundary_nbytes(par, Shape(), 1))


def test_interleaved_chunks_send_at_every_virtual_boundary():
    par = Parallelism(pp=2, dp=1, microbatches=4, pp_schedule="interleaved", virtual_stages=2)
    # rank 0 holds virtual stages 0 and 2 of 4: stage 0 sends on only, stage 2 both ways
    assert step_bytes(par, Shape(), 1, stage=0)[("pp", "send")][0] == 4 + 8
    assert boundary_nbytes(Parallelism(tp=4, pp=2, sequence_parallel=True), Shape(), 2) == 2 * 128 * 64 * 2 // 4


def test_torch_reduces_each_column_linears_input_and_its_norms():
    """torch's TP (docs/layouts.md, "What torch issues"): 5 backward allreduces a layer (q, k, v, gate, up), and
    under SP the norms' weights and a gather entering and leaving the layers."""
    act = 2 * 128 * 64 * 2
    calls = step_bytes(Parallelism(tp=2, dp=2), Shape(), 2, style="torch")
    assert calls[("tp", "allreduce")] == (7 * 8, 7 * 8 * act)
    sp = step_bytes(Parallelism(tp=2, dp=2, sequence_parallel=True, microbatches=2), Shape(), 2, style="torch")
    assert sp[("tp", "allreduce")] == (2 * 8 * 2, 2 * 8 * 2 * 64 * 2)
    assert sp[("tp", "allgather")] == ((4 * 8 + 2) * 2, (4 * 8 + 2) * 2 * act)
    full = layer_calls(Parallelism(tp=2, dp=2), Shape(), 2, "full", style="torch")
    assert [(c.phase, c.count) for c in full] == [("forward", 2), ("backward", 5 + 2)]  # the recomputed forward's 2
    assert step_bytes(Parallelism(tp=2, dp=2, sequence_parallel=True), Shape(), 2)[("tp", "allreduce")] == \
        (1, 2 * 8 * 64 * 2)  # Megatron-LM: the norms in one call a step


def test_a_step_sums_layers_and_micro_batches():
    par = Parallelism(tp=2, pp=2, dp=2, microbatches=8)
    act = 128 * 64 * 2
    assert step_bytes(par, Shape(), 1)[("tp", "allreduce")] == (4 * 4 * 8, 4 * 4 * 8 * act)  # 4 layers a stage
