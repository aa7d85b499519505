"""What commbench runs: a profile file is data (the code its `source.spec` names is imported only
with --trust-profile-code), and nothing evaluates user input."""
import json
import os

import pytest
from conftest import clean_env, commbench

from commbench.proxies.catalog import ModelError, runs_foreign_code
from commbench.proxies.profile import load_profile
from commbench.proxies.train import model_for

SOURCES = [os.path.join(os.path.dirname(__file__), "..", folder) for folder in ("commbench", "proxies", "analysis")]


# ---------------------------------------------------------------- a profile's source.spec


MODULE = '''import os
open(os.path.join({folder!r}, "imported." + str(os.getpid())), "w").close()
INPUT = {{"shape": [8], "unit": "samples", "default_batch": 2}}


def build():
    import torch

    return torch.nn.Linear(8, 2)


def example_inputs(batch, device="cpu"):
    import torch

    return (torch.randn(batch, 8, device=device),)
'''


@pytest.fixture
def code_profile(tmp_path):
    """A profile whose source.spec names a module that leaves a file behind when imported."""
    (tmp_path / "sideeffect_model.py").write_text(MODULE.format(folder=str(tmp_path)))
    data = load_profile("tts_angular").to_dict()
    data["name"], data["source"] = "sideeffect", {"spec": "sideeffect_model:build", "package": "sideeffect_model"}
    path = tmp_path / "code.json"
    path.write_text(json.dumps(data))
    return path


def _imports(folder) -> int:
    return len([name for name in os.listdir(folder) if name.startswith("imported.")])


def test_a_profile_with_a_source_spec_imports_nothing(code_profile):
    folder = code_profile.parent
    env = clean_env(PYTHONPATH=str(folder))
    for args in (["train", str(code_profile), "--nprocs", "2"], ["proxy", str(code_profile), "--nprocs", "2"],
                 ["proxy", str(code_profile), "--compute", "measured", "--nodes", "2", "--hw", "dgx-a100"]):
        proc = commbench(*args, env=env, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "source.spec 'sideeffect_model:build'" in proc.stderr and "--trust-profile-code" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    for args in (["profiles", "show", str(code_profile)],
                 ["predict-scaling", str(code_profile), "--hw", "dgx-a100", "--gpus", "1,8", "--tflops", "100"]):
        proc = commbench(*args, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
    assert _imports(folder) == 0
    with pytest.raises(ModelError, match="--trust-profile-code"):
        model_for(load_profile(str(code_profile)))
    assert _imports(folder) == 0


def test_trust_profile_code_builds_it_in_every_rank(code_profile):
    folder = code_profile.parent
    proc = commbench("train", str(code_profile), "--trust-profile-code", "--nprocs", "2", "--batch", "2", "--steps",
                     "1", "--warmup-steps", "0", env=clean_env(PYTHONPATH=str(folder)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _imports(folder) == 2


@pytest.mark.parametrize("spec,foreign", [
    ("torchvision:resnet50", False), ("timm:convnext_tiny.fb_in22k", False),
    ("transformers:BertForMaskedLM:hidden_size=1024,num_hidden_layers=24", False),
    ("commbench.proxies.models.unet:build_bilinear", False), ("commbench.proxies.models.tts_angular:build", False),
    ("os:getcwd", True), ("this:__doc__", True), ("commbench.proxies.models.unet:UNet", True),
    ("timm:hf-hub:someone/model", True), ("timm:local-dir:/tmp/x", True), ("torchvision:../x", True),
    ("transformers:BertModel:attn_implementation=kernels-community/x", True), ("nocolon", True),
])
def test_which_specs_run_foreign_code(spec, foreign):
    assert runs_foreign_code(spec) is foreign


def test_no_eval_exec_pickle_or_shell_in_the_sources():
    """What reads user input never evaluates it: no eval/exec, no pickle.load, no shell=True."""
    banned = ("eval(", "exec(", "pickle.load", "shell=True", "yaml.load(")
    hits = []
    for root in SOURCES:
        for folder, _, files in os.walk(root):
            for name in (f for f in files if f.endswith(".py")):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    for number, line in enumerate(handle, 1):
                        code = line.split("#", 1)[0]
                        if any(word in code and f".{word}" not in code for word in banned):
                            hits.append(f"{name}:{number}: {line.strip()}")
    assert not hits, hits
