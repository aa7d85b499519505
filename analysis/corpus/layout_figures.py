"""What a layouts corpus row's figures mean (analysis/corpus/layouts.py loads and checks the rows): the FLOPs a
token that the source's TFLOPs/GPU counts, by the formula the source names; the row's throughput as tokens a
second per GPU, from whichever figure it states; and a gradient profile of a corpus shape that ships none, for
the data-parallel part of a prediction. Arithmetic only: a row is read by its attributes."""
from __future__ import annotations

from commbench.proxies.profile import Profile, TensorSpec, UnitSpec
from commbench.proxies.transformer import TransformerShape


def source_flops_per_token(row, shape: TransformerShape) -> float:
    """The FLOPs a token that the source's TFLOPs/GPU counts:
    - megatron-eq3: Narayanan et al. 2021 eq. 3, 96 B s l h^2 (1 + s/6h + V/16lh) a step (full recomputation);
    - palm: model FLOPs, 6N + 12 L H Q T (the shape's count, proxies/transformer.py);
    - megatron-core: Megatron-LM's num_floating_point_operations (megatron/training/training.py @ 001b00c2,
      GQA branch): 6 x (the MLPs' and routed/shared experts' matrices, Q/K/V and output projections, the
      attention core causal-halved, q s, and the logits) a token; no recomputation."""
    s, layers, h, v = shape.seq_len, shape.layers, shape.hidden, shape.vocab
    if row.flops_formula == "megatron-eq3":
        return 96.0 * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    if row.flops_formula == "megatron-core":
        ffn = 3 if shape.gated_mlp else 2
        moe = shape.moe_layers
        mlp = h * ffn * (shape.ffn * (layers - moe) + shape.expert_ffn * (shape.top_k + shape.shared_experts) * moe)
        q, kv = shape.head_dim * shape.heads, shape.head_dim * shape.kv_heads
        attention = layers * (h * (q + 2 * kv) + q * s + q * h)
        return 6.0 * (mlp + attention + h * v)
    return shape.training_flops_per_token("none")


def published_tokens_per_s_per_gpu(row, shape: TransformerShape) -> float:
    """The row's throughput as tokens a second per GPU: stated, from the step time (global batch x sequence over
    the step and the GPUs), or its TFLOPs/GPU over the source's FLOPs a token."""
    if "tokens_per_s_per_gpu" in row.throughput:
        return row.throughput["tokens_per_s_per_gpu"]
    if "step_time_s" in row.throughput:
        return row.global_batch * row.seq_len / row.throughput["step_time_s"] / row.gpus
    return row.throughput["tflops_per_gpu"] * 1e12 / source_flops_per_token(row, shape)


def shape_profile(name: str, shape: TransformerShape) -> Profile:
    """A gradient profile of a shape without a shipped one (the data-parallel part of a prediction reads it): per
    layer one attention, one MLP and one routed-experts tensor, the embedding, final norm and head; gradients
    ready last layer first."""
    per_token = [shape.layer_forward_flops(i) * 2 for i in range(shape.layers)]
    seq = shape.seq_len
    tensors: list[TensorSpec] = []
    ready = shape.head_forward_flops() * 2 * seq
    tensors.append(TensorSpec("lm_head.weight", (shape.vocab, shape.hidden), "float32", ready, 0))
    tensors.append(TensorSpec("model.norm.weight", (shape.hidden,), "float32", ready, 1))
    for i in reversed(range(shape.layers)):
        ready += per_token[i] * seq
        params = shape.layer_parameters(i)  # routed experts apart: predict_layout splits them over the EP ranks
        for part, count in (("mlp.experts", params["experts"]),
                            ("mlp", params["mlp"] + params["shared_experts"] + params["router"]),
                            ("attn", params["attention"] + params["norms"])):
            if count:
                tensors.append(TensorSpec(f"model.layers.{i}.{part}.weight", (count,), "float32", ready, len(tensors)))
    tensors.append(TensorSpec("model.embed_tokens.weight", (shape.vocab, shape.hidden), "float32", ready, len(tensors)))
    ordered = tuple(reversed(tensors))  # registration order: embedding, layers 0.., norm, head
    units = tuple(UnitSpec(f"model.layers.{i}", tuple(j for j, t in enumerate(ordered)
                                                      if t.name.startswith(f"model.layers.{i}.")),
                           shape.layer_forward_flops(i) * seq, per_token[i] * seq) for i in range(shape.layers))
    forward = shape.forward_flops_per_token() * seq
    return Profile(name, ordered, forward, 2 * forward, (seq,), "sequences", 1, {"built_from": "shape"}, units, shape)
