"""What a layouts corpus row's figures mean (analysis/corpus/layout_figures.py), on the shipped corpus: tokens a
second from each stated figure, the sources' FLOP counts against what they print, the shapes' profiles."""
from __future__ import annotations

import pytest

from commbench.analysis.corpus import layout_figures as F
from commbench.analysis.corpus import layouts as L


def test_tflops_rows_turn_into_tokens_by_the_source_count():
    corpus = L.load_layout_corpus()
    for row in corpus.rows:
        if {"tokens_per_s_per_gpu", "step_time_s"} & set(row.throughput):
            continue
        shape = corpus.shape(row)
        tokens = F.published_tokens_per_s_per_gpu(row, shape)
        if row.flops_formula == "megatron-core":  # pinned against printed figures below
            continue
        if row.flops_formula == "palm":
            flops = shape.training_flops_per_token("none")
            assert tokens * flops == pytest.approx(row.throughput["tflops_per_gpu"] * 1e12)
        else:  # eq. 3 over a step's B s tokens: 96 l h^2 (1 + s/6h + V/16lh) a token, 4x the forward's 24 l h^2 ...
            forward = 24 * shape.layers * shape.hidden ** 2 + 4 * shape.layers * shape.seq_len * shape.hidden
            head = 6 * shape.hidden * shape.vocab  # the logits' forward and backward, not recomputed
            assert tokens * (4 * forward + head) == pytest.approx(row.throughput["tflops_per_gpu"] * 1e12)


def test_step_time_rows_turn_into_tokens_and_agree_with_their_tflops():
    corpus = L.load_layout_corpus()
    timed = [r for r in corpus.rows if "step_time_s" in r.throughput]
    assert timed
    for row in timed:
        tokens = F.published_tokens_per_s_per_gpu(row, corpus.shape(row))
        assert tokens * row.throughput["step_time_s"] * row.gpus == pytest.approx(row.global_batch * row.seq_len)
    # one model, one sequence: the source's FLOPs a token (TFLOPs over tokens) is one figure, to the printed digits
    per_token = [r.throughput["tflops_per_gpu"] / F.published_tokens_per_s_per_gpu(r, corpus.shape(r)) for r in timed]
    assert max(per_token) / min(per_token) < 1 + 2 * L.ROUNDING


def test_megatron_core_count_reproduces_the_printed_tflops():
    """Rows printing both a token rate (or step time) and TFLOPs/GPU: Megatron-LM's FLOP count of the row's
    shape turns one into the other to within 1% (the shapes, vocabularies and the count are what they print)."""
    corpus = L.load_layout_corpus()
    both = [r for r in corpus.rows if r.flops_formula == "megatron-core"
            and {"tokens_per_s_per_gpu", "step_time_s"} & set(r.throughput)]
    assert len(both) >= 10
    for row in both:
        shape = corpus.shape(row)
        counted = F.published_tokens_per_s_per_gpu(row, shape) * F.source_flops_per_token(row, shape) / 1e12
        assert counted == pytest.approx(row.throughput["tflops_per_gpu"], rel=0.01), row.label


def test_shape_profile_holds_the_shapes_parameters():
    corpus = L.load_layout_corpus()
    for name, shape in corpus.shapes.items():
        profile = F.shape_profile(name, shape)
        assert profile.parameters == shape.parameters
        assert sorted(t.ready_index for t in profile.tensors) == list(range(len(profile.tensors)))
        assert len(profile.units) == shape.layers
