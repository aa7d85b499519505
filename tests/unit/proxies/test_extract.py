"""extract.py on decoder-only transformers: FlopCounterMode's count on the meta device against the
shape's formula (proxies/transformer.py), mixture-of-experts layers included (their grouped matrix
product counted here, run in bfloat16 on meta), and the shape carried in the profile."""
import pytest

from commbench.proxies.transformer import TransformerShape

SMALL = ("hidden_size=64,intermediate_size=96,num_hidden_layers=3,num_attention_heads=4,num_key_value_heads=2,"
         "vocab_size=100")
SPECS = {
    "llama": "transformers:LlamaForCausalLM:" + SMALL,
    "mixtral": "transformers:MixtralForCausalLM:" + SMALL + ",num_local_experts=4,num_experts_per_tok=2",
    "deepseek": ("transformers:DeepseekV3ForCausalLM:hidden_size=64,intermediate_size=128,moe_intermediate_size=32,"
                 "num_hidden_layers=3,first_k_dense_replace=1,num_attention_heads=4,num_key_value_heads=4,"
                 "n_routed_experts=8,n_shared_experts=1,num_experts_per_tok=2,n_group=2,topk_group=1,q_lora_rank=32,"
                 "kv_lora_rank=16,qk_nope_head_dim=16,qk_rope_head_dim=8,v_head_dim=16,vocab_size=100"),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_counted_flops_are_the_formula(name):
    """Exact to float rounding (1e-9): both count matrix products only, the attention scores in full.
    Without the grouped product's formula the MoE profiles would lack every routed expert's FLOPs."""
    pytest.importorskip("transformers")
    from commbench.proxies.extract import extract

    profile = extract(SPECS[name], input_shape=(32,))
    shape = profile.transformer
    assert isinstance(shape, TransformerShape) and shape.seq_len == 32
    assert shape.parameters == profile.parameters
    assert profile.forward_flops == pytest.approx(32 * shape.forward_flops_per_token(), rel=1e-9)
    assert profile.backward_flops == pytest.approx(32 * shape.backward_flops_per_token(), rel=1e-9)
    assert sum(u.forward_flops for u in profile.units) == pytest.approx(profile.forward_flops, rel=1e-9)
    assert {t.dtype for t in profile.tensors} == {"float32"}  # counted in bfloat16, the parameters' own dtype kept
    assert ("bfloat16" in profile.source["flop_counter"]) == (name != "llama")
    if name != "llama":
        experts = shape.moe_layers * shape.top_k * 2 * shape.mlp_parameters(shape.expert_ffn) * 32
        assert experts > 0.1 * profile.forward_flops  # what the counter alone would have missed


def test_no_shape_for_what_is_not_a_decoder():
    pytest.importorskip("transformers")
    from commbench.proxies.extract import extract

    profile = extract("transformers:BertForMaskedLM:hidden_size=32,num_hidden_layers=1,num_attention_heads=2,"
                      "intermediate_size=64,vocab_size=100", input_shape=(16,))
    assert profile.transformer is None and "transformer" not in profile.to_dict()
