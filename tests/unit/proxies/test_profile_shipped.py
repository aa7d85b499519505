"""Shipped profiles against the packages their models come from, FLOP counts against
torchvision's published figures, and the profile file format's errors."""
import json

import pytest

from commbench.proxies.catalog import CATALOG
from commbench.proxies.profile import ProfileError, load_profile, shipped
from commbench.proxies.units import untie, wrap_policy


def test_every_catalog_model_ships_a_profile():
    assert set(CATALOG) <= set(shipped())


def test_resnet50_counts():
    profile = load_profile("resnet50")
    assert profile.parameters == 25_557_032 and len(profile.tensors) == 161
    assert profile.tensors[0].name == "conv1.weight" and profile.tensors[-1].name == "fc.bias"


def _package_of(name):
    return CATALOG[name].constructor.split(":")[0].split(".")[0]


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_profile_matches_the_model_definition(name):
    """Every parameter tensor, in registration order, with its shape: built on the meta device."""
    torch = pytest.importorskip("torch")
    pytest.importorskip(_package_of(name))
    from commbench.proxies.catalog import build_named

    profile = load_profile(name)
    with torch.device("meta"):
        module = build_named(name).module
    theirs = [(n, tuple(p.shape)) for n, p in module.named_parameters() if p.requires_grad]
    assert [(t.name, t.shape) for t in profile.tensors] == theirs
    assert profile.parameters == sum(p.numel() for p in module.parameters() if p.requires_grad)
    # the units are the wrapping policy's on this definition, none of them splitting tied parameters, which
    # FSDP2 refuses (bert-base's embeddings unit did: "shared with a parameter already managed by another group")
    units = [u.name for u in profile.units if u.name]
    assert sorted(units) == sorted(wrap_policy(module).names) and untie(module, units) == tuple(units)


# torchvision publishes each model's forward cost in GMACs (its weights' meta "_ops", named GFLOPS in
# its docs); torch's flop counter counts a multiply-add as 2 FLOPs.
@pytest.mark.parametrize("name,weights", [("resnet50", "ResNet50_Weights"), ("resnet18", "ResNet18_Weights"),
                                          ("vgg16", "VGG16_Weights"), ("alexnet", "AlexNet_Weights"),
                                          ("mobilenet_v2", "MobileNet_V2_Weights"),
                                          ("inception_v3", "Inception_V3_Weights")])
def test_forward_flops_match_torchvision_published_ops(name, weights):
    tv = pytest.importorskip("torchvision")
    published_gmacs = getattr(tv.models, weights).IMAGENET1K_V1.meta["_ops"]
    assert load_profile(name).forward_flops / 2e9 == pytest.approx(published_gmacs, rel=0.02)


def test_backward_is_about_twice_the_forward():
    """Input and weight gradients each cost about a forward (depthwise convolutions included)."""
    for name in ("resnet50", "mobilenet_v2", "bert-base", "vgg16"):
        profile = load_profile(name)
        assert 1.8 < profile.backward_flops / profile.forward_flops < 2.1, name


def test_ready_order_is_a_permutation_and_the_last_tensor_is_ready_first():
    profile = load_profile("resnet50")
    order = profile.ready_order()
    assert sorted(order) == list(range(len(profile.tensors)))
    assert profile.tensors[order[0]].name.startswith("fc.")  # the head's gradients come first
    assert profile.tensors[order[-1]].name == "conv1.weight"  # the stem's come last
    flops = [profile.tensors[i].ready_flops for i in order]
    assert flops == sorted(flops) and flops[-1] == pytest.approx(profile.backward_flops)


def _write(tmp_path, data):
    path = tmp_path / "p.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_profile_file_errors_name_the_problem(tmp_path):
    good = load_profile("resnet18").to_dict()
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(_write(tmp_path, "{nope"))
    broken = {k: v for k, v in good.items() if k not in ("forward_flops", "tensors")}
    with pytest.raises(ProfileError, match="missing field.*tensors.*forward_flops"):
        load_profile(_write(tmp_path, broken))
    bad_tensor = dict(good, tensors=[["w", [2, 2], "complex64", 1.0, 0]], parameters=4)
    with pytest.raises(ProfileError, match=r"tensors\[0\] \(w\): unknown dtype"):
        load_profile(_write(tmp_path, bad_tensor))
    with pytest.raises(ProfileError, match="'parameters' says"):
        load_profile(_write(tmp_path, dict(good, parameters=1)))
    with pytest.raises(ProfileError, match="ready_index must number"):
        load_profile(_write(tmp_path, dict(good, tensors=[["w", [2], "float32", 1.0, 5]], parameters=2)))
    with pytest.raises(ProfileError, match="unknown model 'nosuch'; known: .*resnet50"):
        load_profile("nosuch")


def test_a_schema_1_profile_still_loads_without_units(tmp_path):
    data = load_profile("resnet18").to_dict()
    old = {key: value for key, value in data.items() if key not in ("units", "unit_fields")}
    old["source"] = {key: value for key, value in old["source"].items() if key != "units"}
    profile = load_profile(_write(tmp_path, dict(old, schema=1)))
    assert profile.units == () and profile.tensors == load_profile("resnet18").tensors
    with pytest.raises(ProfileError, match="schema 5; this commbench reads schema 1, 2, 3 and 4"):
        load_profile(_write(tmp_path, dict(old, schema=5)))


def test_save_and_load_round_trip(tmp_path):
    profile = load_profile("bert-base")
    path = str(tmp_path / "b.json")
    profile.save(path)
    assert load_profile(path) == profile


def test_schema_3_carries_a_transformer_shape_and_schema_2_loads_without(tmp_path):
    tiny = load_profile("llama-tiny")
    assert tiny.transformer is not None and tiny.transformer.parameters == tiny.parameters
    path = str(tmp_path / "tiny.json")
    tiny.save(path)
    assert load_profile(path) == tiny
    data = tiny.to_dict()
    old = {key: value for key, value in data.items() if key != "transformer"}
    assert load_profile(_write(tmp_path, dict(old, schema=2))).transformer is None
    assert load_profile("llama-13b").transformer is None  # shipped as schema 2
    with pytest.raises(ProfileError, match=r"the transformer shape holds 315968 parameters, the tensors 2"):
        load_profile(_write(tmp_path, dict(data, tensors=[["w", [2], "float32", 1.0, 0]], parameters=2, units=[])))
    with pytest.raises(ProfileError, match=r"p.json: 'transformer' has unknown field 'colour'"):
        load_profile(_write(tmp_path, dict(data, transformer={**data["transformer"], "colour": 1})))
    with pytest.raises(ProfileError, match=r"transformer shape: layers must be an integer from 0"):
        load_profile(_write(tmp_path, dict(data, transformer={**data["transformer"], "layers": "4"})))
