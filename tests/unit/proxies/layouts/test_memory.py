"""Memory per GPU (proxies/layouts/memory.py): model states against ZeRO's published per-device figures,
activations against Korthikanti et al. 2022's per-layer formulas, and what each layout degree,
sharding choice and pipeline schedule divides or multiplies."""
import dataclasses

import pytest

from commbench.proxies.layouts.memory import (
    MEGATRON,
    ZERO,
    MemoryChoices,
    fits,
    layer_activation_nbytes,
    memory_per_gpu,
    model_state_nbytes,
    output_activation_nbytes,
    stage_layers,
)
from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.profile import load_profile
from commbench.proxies.transformer import TransformerShape

DEGREES = ("tp", "pp", "cp", "ep", "dp", "sequence_parallel", "expert_tp")


def _memory(shape, precision=ZERO, sequence_parallel=True, **given):
    """memory_per_gpu of a layout's degrees (a Parallelism, sequence parallel unless said) and the choices."""
    par = Parallelism(sequence_parallel=sequence_parallel, **{k: v for k, v in given.items() if k in DEGREES})
    return memory_per_gpu(shape, par, MemoryChoices(**{k: v for k, v in given.items() if k not in DEGREES}),
                          precision)


@pytest.mark.parametrize("sharding,published_gb", [("none", 120.0), ("zero1", 31.4), ("zero2", 16.6),
                                                     ("fsdp", 1.9)])
def test_zero_figure_1(sharding, published_gb):
    """ZeRO (Rajbhandari et al. 2020), Figure 1: per-device model states of a 7.5B-parameter model with
    mixed-precision Adam (K = 12) over Nd = 64 data-parallel ranks: baseline 120 GB, P_os 31.4 GB,
    P_os+g 16.6 GB, P_os+g+p 1.9 GB (GB = 1e9 bytes). Tolerance: half a unit of the printed last digit."""
    total = sum(model_state_nbytes(7.5e9, 64, sharding, ZERO)) / 1e9
    assert total == pytest.approx(published_gb, abs=0.05)


def test_megatron_keeps_fp32_gradients():
    """Megatron-LM's distributed optimizer with bf16 parameters and fp32 gradients: 18 bytes per
    parameter unsharded, 6 + 12/d with the optimizer state sharded."""
    assert sum(model_state_nbytes(1, 1, "none", MEGATRON)) == 18
    assert sum(model_state_nbytes(1, 8, "zero1", MEGATRON)) == pytest.approx(6 + 12 / 8)


# GPT-3 175B as Korthikanti et al. 2022 Table 3 trains it: 96 heads, hidden 12288, sequence 2048, TP 8
GPT3 = TransformerShape(layers=96, hidden=12288, heads=96, kv_heads=96, head_dim=128, ffn=4 * 12288, vocab=51200,
                        seq_len=2048, gated_mlp=False)


@pytest.mark.parametrize("tp,sp,checkpointing,formula", [
    (1, False, "none", lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    (8, False, "none", lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (8, True, "none", lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h)),
    (8, False, "selective", lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
    (8, True, "selective", lambda s, b, h, a, t: s * b * h * 34 / t),
    (1, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
])
def test_korthikanti_table_2(tp, sp, checkpointing, formula):
    """Activation bytes per layer, Korthikanti et al. 2022 Table 2 (GPT layers with dropout: 16-bit
    activations, 1-byte masks): the general accounting reduces to each row exactly for a GPT layer."""
    got = layer_activation_nbytes(GPT3, 0, microbatch=2, tp=tp, sequence_parallel=sp, checkpointing=checkpointing,
                                  dropout=True)
    assert got == pytest.approx(formula(2048, 2, 12288, 96, tp), rel=1e-12)


def test_without_dropout_and_with_gqa_the_layer_keeps_less():
    no_dropout = layer_activation_nbytes(GPT3, 0, 1, checkpointing="selective", sequence_parallel=False)
    assert no_dropout == 2048 * 12288 * 32  # 34 sbh less the two 1-byte masks
    gqa = dataclasses.replace(GPT3, kv_heads=8)
    assert layer_activation_nbytes(gqa, 0, 1, checkpointing="selective", sequence_parallel=False) == \
        no_dropout - 2 * 2048 * 2 * (96 - 8) * 128  # K and V for 8 heads, not 96


def test_stage_layers_give_the_remainder_to_middle_stages():
    """Llama 3 405B on 16 stages: 126 layers, one fewer on the first and last (Dubey et al. 2024, 3.3.2)."""
    assert stage_layers(126, 16) == [7] + [8] * 14 + [7]
    assert stage_layers(10, 4) == [2, 3, 3, 2] and stage_layers(5, 1) == [5]
    with pytest.raises(ValueError, match="pipeline degree 9: from 1 to the 8 layers"):
        stage_layers(8, 9)


@pytest.fixture(scope="module")
def llama70b():
    return load_profile("llama3.1-70b").transformer


def test_sharding_divides_what_it_shards(llama70b):
    plain = _memory(llama70b, tp=8, dp=32)
    zero1 = _memory(llama70b, tp=8, dp=32, sharding="zero1")
    zero2 = _memory(llama70b, tp=8, dp=32, sharding="zero2")
    fsdp = _memory(llama70b, tp=8, dp=32, sharding="fsdp")
    assert zero1.optimizer_nbytes == pytest.approx(plain.optimizer_nbytes / 32, rel=1e-6)
    assert zero1.gradients_nbytes == plain.gradients_nbytes
    assert zero2.gradients_nbytes == pytest.approx(plain.gradients_nbytes / 32, rel=1e-6)
    assert fsdp.parameters_nbytes == pytest.approx(plain.parameters_nbytes / 32, rel=1e-6)
    assert fsdp.buffers_nbytes > 0 == plain.buffers_nbytes
    assert plain.activations_nbytes == fsdp.activations_nbytes
    # TP 8 holds an eighth of every matrix; the norms are replicated
    assert plain.parameters_nbytes == pytest.approx(2 * llama70b.parameters / 8, rel=1e-3)


def test_one_f_one_b_holds_pp_microbatches_on_the_first_stage(llama70b):
    """1F1B: stage k holds pp - k micro-batches; the first stage pp of its layers' activations."""
    one = _memory(llama70b, tp=8, pp=4, dp=8, in_flight=1, checkpointing="selective")
    full = _memory(llama70b, tp=8, pp=4, dp=8, checkpointing="selective")
    per_layer = layer_activation_nbytes(llama70b, 0, 1, tp=8, checkpointing="selective")
    assert full.stage == 0 and full.activations_nbytes == pytest.approx(4 * 20 * per_layer, rel=1e-9)
    assert one.stage == 3  # with one micro-batch in flight the last stage's head decides
    assert one.activations_nbytes == pytest.approx(20 * per_layer + output_activation_nbytes(llama70b, 1, 8),
                                                   rel=1e-9)


def test_checkpointing_and_cp_shrink_activations(llama70b):
    sizes = [_memory(llama70b, tp=8, dp=32, checkpointing=c).activations_nbytes
             for c in ("none", "selective", "full")]
    assert sizes[0] > sizes[1] > sizes[2]
    cp2 = _memory(llama70b, tp=8, cp=2, dp=16, checkpointing="selective")
    assert cp2.activations_nbytes == pytest.approx(sizes[1] / 2, rel=1e-9)


def test_experts_divide_by_ep():
    shape = load_profile("mixtral-8x7b").transformer
    one = _memory(shape, ep=1, dp=8)
    eight = _memory(shape, ep=8, dp=8)
    experts = shape.parameter_counts()["experts"]
    assert one.parameters_nbytes - eight.parameters_nbytes == pytest.approx(2 * experts * 7 / 8, rel=1e-9)
    with pytest.raises(ValueError, match="ep 16 must divide dp x cp = 8"):
        _memory(shape, ep=16, dp=8)
    with pytest.raises(ValueError, match="tp 3 does not divide the 32 heads"):
        _memory(shape, tp=3)


def test_fits():
    breakdown = _memory(load_profile("llama-tiny").transformer, dp=4)
    assert fits(breakdown, breakdown.total_nbytes) and not fits(breakdown, breakdown.total_nbytes - 1)
    assert not fits(breakdown, breakdown.total_nbytes, reserved_fraction=0.1)
    big = _memory(load_profile("llama3.1-405b").transformer, dp=8)
    assert not fits(big, 80 * 2**30)  # 405B without model parallelism: 16 bytes a parameter, 6.5 TB


def test_in_flight_per_stage_from_a_schedule(llama70b):
    """A schedule's own counts per stage (proxies/layouts/pipeline.py's in_flight of its order; interleaved:
    chunks of 1/v of the stage's layers), here GPipe's: every stage holds all 8 micro-batches."""
    per_layer = layer_activation_nbytes(llama70b, 0, 1, tp=8, checkpointing="selective")
    gpipe = _memory(llama70b, tp=8, pp=4, dp=8, in_flight=(8, 8, 8, 8), checkpointing="selective")
    assert gpipe.stage == 3  # the same activations everywhere; the head's output layer on top
    assert gpipe.activations_nbytes == pytest.approx(8 * 20 * per_layer + output_activation_nbytes(llama70b, 1, 8),
                                                     rel=1e-9)
    with pytest.raises(ValueError, match="in_flight gives 2 stages' counts for pp 4"):
        _memory(llama70b, tp=8, pp=4, dp=8, in_flight=(1, 2))


def test_the_loss_holds_fourteen_bytes_a_logit_at_bf16_beside_the_heads_input():
    """The last stage's output at its loss's peak: the bf16 logits (2 bytes), the fp32 log-softmax output, its
    gradient and the logits' gradient (4 each): 14 bytes a logit, split by tp and cp; was Korthikanti's 4."""
    shape = load_profile("llama3.1-8b").transformer
    head_input = 4 * shape.seq_len * shape.hidden / 8
    assert output_activation_nbytes(shape, 1, tp=8) == pytest.approx(head_input + 14 * shape.seq_len * shape.vocab / 8)
    wide = dataclasses.replace(shape, dtype_bytes=4)  # a float32 run: 16 bytes a logit, activations twice
    assert output_activation_nbytes(wide, 1) == pytest.approx(8 * shape.seq_len * shape.hidden
                                                              + 16 * shape.seq_len * shape.vocab)
    assert layer_activation_nbytes(wide, 0, 1) == pytest.approx(2 * layer_activation_nbytes(shape, 0, 1))


def test_gradients_freed_through_the_forward_make_the_peak_the_larger_phase():
    """Without gradients through the forward (FSDP2, one micro-batch, set_to_none), the peak is the larger of
    the loss's (every activation, no gradient) and the backward's end (every gradient, no activation)."""
    shape = load_profile("llama3.1-8b").transformer
    held = _memory(shape, dp=8, sharding="zero2")
    freed = _memory(shape, dp=8, sharding="zero2", gradients_held=False)
    assert held.total_nbytes == held.model_states_nbytes + held.activations_nbytes
    assert freed.total_nbytes == held.total_nbytes - min(held.gradients_nbytes, held.activations_nbytes)


def test_fsdp_keeps_its_root_unit_gathered_beside_two_layers():
    """FSDP2's root unit (embedding on the first stage, head on the last) stays gathered from its forward to the
    end of the backward, beside the two layers the backward gathers: both in the buffers."""
    shape = load_profile("llama3.1-8b").transformer
    one_stage = _memory(shape, dp=8, sharding="fsdp")
    layer = sum(shape.layer_parameters(0).values())
    root = 2 * shape.vocab * shape.hidden + shape.hidden  # untied embedding and head, the final norm
    assert one_stage.buffers_nbytes == pytest.approx(2 * (2 * layer + root), rel=1e-9)


def test_fsdp_gathers_its_layers_in_the_backward_beside_the_gradients_not_at_the_loss():
    """Measured with MemTracker on 4 gloo ranks (docs/memory.md): at the loss's peak FSDP2 holds the root unit and
    no decoder layer; the two layers the backward gathers sit beside the gradients, after the activations went."""
    shape = load_profile("llama3.1-8b").transformer
    freed = _memory(shape, dp=8, sharding="fsdp", gradients_held=False)
    layer = sum(shape.layer_parameters(0).values())
    root = 2 * shape.vocab * shape.hidden + shape.hidden
    assert freed.buffers_nbytes == pytest.approx(2 * root, rel=1e-9)
    assert freed.backward_buffers_nbytes == pytest.approx(2 * 2 * layer, rel=1e-9)
    assert freed.total_nbytes == freed.parameters_nbytes + freed.optimizer_nbytes + freed.buffers_nbytes + max(
        freed.activations_nbytes, freed.gradients_nbytes + freed.backward_buffers_nbytes)


def test_a_head_tensor_parallelism_leaves_whole_is_whole_on_every_tp_rank():
    """`train --layout`'s TP plan covers the decoder layers: the embedding, the head and the loss's logits are whole
    on each TP rank (vocab_parallel False), where Megatron-LM's vocab-parallel layers split them by tp."""
    shape = load_profile("llama3.1-8b").transformer
    split, whole = (_memory(shape, tp=8, dp=4, vocab_parallel=v) for v in (True, False))
    vh = shape.vocab * shape.hidden
    assert whole.parameters_nbytes - split.parameters_nbytes == pytest.approx(2 * 2 * vh * (1 - 1 / 8), rel=1e-9)
    s, w = shape.seq_len, shape.dtype_bytes
    logits = (w + 12) * s * shape.vocab + 2 * w * s * shape.hidden
    assert whole.activations_nbytes - split.activations_nbytes == pytest.approx(logits * (1 - 1 / 8), rel=1e-9)
