"""Sharding units (proxies/units.py, extract.py, schema 2 profiles): every tensor in one unit, the units'
FLOPs adding up to the profile's, the modules torch's own FSDP wrap policy would wrap, forward order and
exact per-unit FLOPs on a toy model, and the LLM profiles against the 6*N*T rule."""
import pytest
from conftest import commbench

from commbench.proxies.catalog import CATALOG, build_named
from commbench.proxies.profile import load_profile, shipped

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.mark.parametrize("name", shipped())
def test_units_hold_every_tensor_once_and_add_up_to_the_profile(name):
    profile = load_profile(name)
    held = sorted(i for unit in profile.units for i in unit.tensors)
    assert held == list(range(len(profile.tensors)))
    assert sum(u.forward_flops for u in profile.units) == pytest.approx(profile.forward_flops, rel=1e-9)
    assert sum(u.backward_flops for u in profile.units) == pytest.approx(profile.backward_flops, rel=1e-9)
    assert all(u.forward_flops >= 0 and u.backward_flops >= 0 for u in profile.units)
    assert "" not in [u.name for u in profile.units[1:]]  # the root, when it is a unit, comes first
    assert profile.source["units"]


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_each_unit_is_a_module_of_the_model_holding_its_tensors(name):
    """A unit's name finds its module with get_submodule, and its tensors are that module's parameters
    (less those of units nested in it); the root's are the ones no unit's module holds."""
    with torch.device("meta"):
        module = build_named(name).module
    profile = load_profile(name)
    names = [u.name for u in profile.units if u.name]
    for unit in profile.units:
        if not unit.name:
            continue
        prefix = unit.name + "."
        own = {n for n, _ in module.get_submodule(unit.name).named_parameters(prefix=unit.name)
               if not any(n.startswith(other + ".") for other in names if other.startswith(prefix))}
        assert {profile.tensors[i].name for i in unit.tensors} == own, unit.name
    root = [u for u in profile.units if not u.name]
    for unit in root:
        assert not any(profile.tensors[i].name.startswith(n + ".") for i in unit.tensors for n in names)


def _fsdp_wrapped(module, classes):
    """The module paths torch's FSDP ModuleWrapPolicy wraps besides the root (its own policy run)."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    chosen = ModuleWrapPolicy(set(classes))._run_policy(module, set(), {})
    return [name for name, sub in module.named_modules() if sub in chosen and name]


def test_resnet18_units_are_what_fsdp_module_wrap_policy_wraps():
    tv = pytest.importorskip("torchvision")
    from torchvision.models.resnet import BasicBlock, Bottleneck

    module = tv.models.resnet18(weights=None)
    expected = _fsdp_wrapped(module, {BasicBlock, Bottleneck})
    assert [u.name for u in load_profile("resnet18").units] == ["", *expected]
    assert expected == [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]


def test_a_transformers_model_wraps_its_no_split_modules_as_fsdp_does():
    transformers = pytest.importorskip("transformers")
    from commbench.proxies.extract import extract

    spec = "transformers:GPT2LMHeadModel:n_layer=3,n_embd=64,n_head=2,n_positions=32"
    profile = extract(spec, (32,))
    with torch.device("meta"):
        module = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=3, n_embd=64, n_head=2, n_positions=32))
    assert module._no_split_modules == {"GPT2Block"} or list(module._no_split_modules) == ["GPT2Block"]
    expected = _fsdp_wrapped(module, {transformers.models.gpt2.modeling_gpt2.GPT2Block})
    assert [u.name for u in profile.units] == ["", *expected] == ["", "transformer.h.0", "transformer.h.1",
                                                                 "transformer.h.2"]
    assert "_no_split_modules" in profile.source["units"]


def test_vgg16_wraps_each_layer_with_parameters():
    assert [u.name for u in load_profile("vgg16").units] == [
        "features.0", "features.2", "features.5", "features.7", "features.10", "features.12", "features.14",
        "features.17", "features.19", "features.21", "features.24", "features.26", "features.28",
        "classifier.0", "classifier.3", "classifier.6"]


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(16))
        self.inner = nn.Linear(16, 16)

    def forward(self, x):
        return self.inner(x * self.scale)


class ReversedToy(nn.Module):
    """Registered in the reverse of the order its forward runs them: late, block, early."""

    def __init__(self):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(4))
        self.late = nn.Linear(16, 4)
        self.block = _Block()
        self.early = nn.Linear(8, 16)

    def forward(self, x):
        return self.late(self.block(self.early(x))) + self.offset


def reversed_toy():
    return ReversedToy()


def test_units_in_forward_order_with_exact_flops_and_nested_units():
    """A linear layer m -> n costs 2mn FLOPs per sample forward; its backward 2mn for the weight gradient
    and 2mn more for the input gradient, except the first layer's (its input needs none). A nested unit's
    FLOPs and parameters are its own, not its parent's."""
    from commbench.proxies.extract import extract

    profile = extract("test_units:reversed_toy", (8,), wrap=("Linear", "_Block"))
    rows = [(u.name, [profile.tensors[i].name for i in u.tensors], u.forward_flops, u.backward_flops)
            for u in profile.units]
    assert rows == [("", ["offset"], 0.0, 0.0),
                    ("early", ["early.weight", "early.bias"], 2 * 8 * 16, 2 * 8 * 16),
                    ("block", ["block.scale"], 0.0, 0.0),
                    ("block.inner", ["block.inner.weight", "block.inner.bias"], 2 * 16 * 16, 4 * 16 * 16),
                    ("late", ["late.weight", "late.bias"], 2 * 16 * 4, 4 * 16 * 4)]
    assert "Linear, _Block (named with --wrap)" in profile.source["units"]


@pytest.mark.parametrize("name,layers,hidden,vocab,parameters", [
    ("gpt2-xl", 48, 1600, 50257, 1_557_611_200), ("llama-1b", 22, 2048, 32000, 1_100_048_384),
    ("llama-7b", 32, 4096, 32000, 6_738_415_616), ("llama-13b", 40, 5120, 32000, 13_015_864_320)])
def test_llm_flops_are_6_n_t_plus_attention(name, layers, hidden, vocab, parameters):
    """Forward and backward per sequence of T tokens: 6*N*T for the N weights that multiply (every layer's
    matrices and the vocab x hidden head), plus attention's two T x T products, 4*T*T*hidden per layer
    forward and twice that backward, counted in full (Kaplan et al. 2020, Table 1, with the full T x T
    count of torch's flop counter). Exact: the counter counts only these products."""
    profile = load_profile(name)
    tokens = profile.input_shape[0]
    assert profile.parameters == parameters and len(profile.units) == layers + 1
    matrices = sum(profile.tensors[i].numel for u in profile.units if u.name for i in u.tensors
                   if len(profile.tensors[i].shape) == 2) + vocab * hidden
    rule = 6 * matrices * tokens + 12 * layers * tokens * tokens * hidden
    assert profile.forward_flops + profile.backward_flops == pytest.approx(rule, rel=1e-12)
    assert {u.backward_flops / u.forward_flops for u in profile.units} == {2.0}


def test_profiles_show_units(tmp_path):
    proc = commbench("profiles", "show", "llama-7b", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "# sharding units: 33, the largest (root) with 1000.0 MiB" in proc.stdout
    proc = commbench("profiles", "show", "resnet18", "--units", timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("# wrapping: every residual block (ResNet")
    assert lines[3].split()[:2] == ["(root)", "5"] and lines[-1].split()[:2] == ["layer4.1", "6"]
    proc = commbench("profiles", "extract", "resnet18", "--wrap", "Nope", "-o", str(tmp_path / "x.json"), timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith(
        "commbench: error: --wrap Nope: ResNet has no module of class Nope; its classes with parameters: ")
    assert len(proc.stderr.strip().splitlines()) == 1
