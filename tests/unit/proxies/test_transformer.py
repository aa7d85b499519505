"""A transformer's shape (proxies/transformer.py): parameter counts against the transformers models
built on the meta device and against published totals, FLOPs against Narayanan et al. 2021 eq. 3
and PaLM's 6N + 12LHQT, the shipped profiles' FLOPs against the formula, and the activation
sizes layouts move."""
import dataclasses

import pytest

from commbench.proxies.profile import load_profile, shipped
from commbench.proxies.transformer import TransformerShape, from_config, shape_from_dict

TINY = {"llama": ("LlamaForCausalLM", dict(hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2, vocab_size=100)),
        "mixtral": ("MixtralForCausalLM", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                               num_local_experts=4, num_experts_per_tok=2)),
        "deepseek": ("DeepseekV3ForCausalLM", dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                                   num_hidden_layers=3, first_k_dense_replace=1,
                                                   num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                                                   n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                                                   q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                                                   qk_rope_head_dim=8, v_head_dim=16, vocab_size=100)),
        "qwen2-tied": ("Qwen2ForCausalLM", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                                tie_word_embeddings=True))}


def _meta_model(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cls = getattr(transformers, TINY[name][0])
    config = cls.config_class(**TINY[name][1])
    with torch.device("meta"):
        return config, cls(config)


@pytest.mark.parametrize("name", sorted(TINY))
def test_parameter_counts_are_the_models(name):
    """Every kind adds up to what the transformers model registers (Qwen2: Q/K/V biases, a tied head)."""
    config, model = _meta_model(name)
    shape = from_config(config, seq_len=16)
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    counts = shape.parameter_counts()
    layer0 = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.layers.0."))
    assert sum(shape.layer_parameters(0).values()) == layer0
    assert counts["embedding"] == model.get_input_embeddings().weight.numel()
    if name == "deepseek":  # the first layer dense, the others MoE with a shared expert
        assert shape.layer_parameters(0)["experts"] == 0 and shape.layer_parameters(1)["experts"] == 8 * 3 * 64 * 32
        assert shape.layer_parameters(1)["shared_experts"] == 3 * 64 * 32


def test_published_totals():
    """Mixtral 8x7B: 47B parameters, 13B active (Jiang et al. 2024, sec. 2.1); DeepSeek-V3: 671B, 37B
    activated per token (arXiv 2412.19437, abstract): the shipped shapes round to them."""
    mixtral, deepseek = load_profile("mixtral-8x7b").transformer, load_profile("deepseek-v3").transformer
    assert round(mixtral.parameters / 1e9) == 47 and round(mixtral.active_parameters / 1e9) == 13
    assert round(deepseek.parameters / 1e9) == 671 and int(deepseek.active_parameters / 1e9) == 37
    assert round(load_profile("llama3.1-405b").transformer.parameters / 1e9) == 406  # 405.85 B in Meta's model


def _gpt(layers=24, hidden=2048, heads=16, seq=2048, vocab=51200, tied=False):
    return TransformerShape(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads,
                            ffn=4 * hidden, vocab=vocab, seq_len=seq, tied_embeddings=tied, gated_mlp=False)


@pytest.mark.parametrize("layers,hidden,heads,seq", [(24, 2048, 16, 2048), (96, 12288, 96, 2048), (4, 64, 4, 8192)])
def test_narayanan_eq3(layers, hidden, heads, seq):
    """Narayanan et al. 2021 eq. 3, FLOPs per iteration with full recomputation:
    96 B s l h^2 (1 + s/(6h) + V/(16 l h)); per token (B s = 1), and without recomputation 72 ... V/(12 l h)."""
    shape, vocab = _gpt(layers, hidden, heads, seq), 51200
    eq3 = 96 * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    assert shape.training_flops_per_token("full") == pytest.approx(eq3, rel=1e-12)
    no_recompute = 72 * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))
    assert shape.training_flops_per_token("none") == pytest.approx(no_recompute, rel=1e-12)


def test_palm_6n_plus_attention():
    """PaLM (Chowdhery et al. 2022, appendix B): 6N + 12 L H Q T per token, N the parameters (a tied
    embedding once; the norms take no products), H heads of size Q, T the sequence."""
    shape = _gpt(layers=8, hidden=512, heads=8, seq=1024, vocab=1000, tied=True)
    counts = shape.parameter_counts()
    matrices = shape.parameters - counts["norms"] - counts["final_norm"]
    palm = 6 * matrices + 12 * shape.layers * shape.heads * shape.head_dim * shape.seq_len
    assert shape.training_flops_per_token() == pytest.approx(palm, rel=1e-12)


def test_attention_grows_with_the_sequence_and_moe_counts_top_k():
    shape = load_profile("mixtral-8x7b").transformer
    longer = shape.forward_flops_per_token(seq_len=2 * shape.seq_len) - shape.forward_flops_per_token()
    assert longer == pytest.approx(shape.layers * shape.attention_score_flops())
    assert shape.attention_score_flops(causal_halved=True) == shape.attention_score_flops() / 2
    top1 = dataclasses.replace(shape, top_k=1)
    assert shape.forward_flops_per_token() - top1.forward_flops_per_token() == \
        shape.layers * 2 * shape.mlp_parameters(shape.expert_ffn)
    assert shape.backward_flops_per_token() == 2 * shape.forward_flops_per_token()


@pytest.mark.parametrize("name", [n for n in shipped() if load_profile(n).transformer is not None])
def test_shipped_flops_are_the_formula(name):
    """FlopCounterMode's count on the meta device (extract.py) against the shape's formula. Both count
    matrix products only, the attention scores in full (causal masking not halved), so they agree to
    float rounding: 1e-9 relative (the rotary embedding's products are elementwise, not counted)."""
    profile = load_profile(name)
    shape = profile.transformer
    assert profile.input_shape == (shape.seq_len,)
    assert profile.forward_flops == pytest.approx(shape.forward_flops_per_token() * shape.seq_len, rel=1e-9)
    assert profile.backward_flops == pytest.approx(shape.backward_flops_per_token() * shape.seq_len, rel=1e-9)


def test_activation_sizes():
    shape = load_profile("llama3.1-70b").transformer  # hidden 8192, 64 heads, 8 kv heads of 128, seq 8192
    assert shape.tp_activation_nbytes(2) == 2 * 8192 * 8192 * 2
    assert shape.tp_activation_nbytes(2, cp=4) == 2 * 2048 * 8192 * 2
    assert shape.pp_boundary_nbytes(1, tp=8, sequence_parallel=True) == 8192 * 8192 * 2 // 8
    assert shape.pp_boundary_nbytes(1, tp=8) == 8192 * 8192 * 2
    assert shape.cp_kv_block_nbytes(1, cp=4) == 2048 * 8 * (128 + 128) * 2
    moe = load_profile("deepseek-v3").transformer
    assert moe.ep_dispatch_nbytes(4096) == 4096 * 8 * 7168 * 2
    assert moe.cp_kv_block_nbytes(1, 2) == 2048 * 128 * (192 + 128) * 2  # MLA: keys 192 wide, values 128
    with pytest.raises(ValueError, match="does not divide the sequence"):
        shape.cp_kv_block_nbytes(1, 3)


def test_bad_shapes_are_one_line():
    good = load_profile("llama-tiny").transformer.to_dict()
    assert shape_from_dict(good) == load_profile("llama-tiny").transformer
    for change, message in ((dict(kv_heads=3), "3 key/value heads do not divide 4 heads"),
                            (dict(layers=2.5), "layers must be an integer from 0 to 2,147,483,648"),
                            (dict(layers=10**9), "1,000,000,000 layers; at most 100,000"),
                            (dict(hidden=2**40), "hidden must be an integer from 0"),
                            (dict(tied_embeddings=1), "tied_embeddings must be true or false"),
                            (dict(experts=4, top_k=5), "top_k 5 must be from 1 to the 4 experts"),
                            (dict(heads=0), "heads must be at least 1"),
                            (dict(colour=1), "unknown field 'colour'")):
        with pytest.raises(ValueError, match=message):
            shape_from_dict({**good, **change})
    with pytest.raises(ValueError, match="lacks hidden"):
        shape_from_dict({k: v for k, v in good.items() if k != "hidden"})


def test_from_config_refuses_what_is_not_a_decoder():
    class Vision:
        image_size = 224
    with pytest.raises(ValueError, match="Vision: not a decoder config"):
        from_config(Vision())
