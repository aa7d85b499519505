"""torch imported on a rank's first use, not when a command settles a backend's options."""
from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from commbench.backends import torch_lazy
from commbench.backends.torch_lazy import LazyModule, gpu_device_nodes


def test_lazy_module_imports_on_first_read_and_takes_its_place():
    namespace: dict = {}
    namespace["json_mod"] = LazyModule("json", namespace, "json_mod")
    assert isinstance(namespace["json_mod"], LazyModule)
    assert namespace["json_mod"].dumps([1]) == "[1]"
    assert namespace["json_mod"] is json  # later reads are the module itself


def test_lazy_module_of_a_missing_module_raises_on_use_not_on_creation():
    namespace: dict = {}
    lazy = LazyModule("commbench_no_such_module", namespace, "mod")
    with pytest.raises(ModuleNotFoundError):
        lazy.anything  # noqa: B018


def test_gpu_device_nodes_reads_the_paths_given(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert not gpu_device_nodes((str(tmp_path / "nvidiactl"),))
    (tmp_path / "nvidiactl").touch()
    assert gpu_device_nodes((str(tmp_path / "missing"), str(tmp_path / "nvidiactl")))
    monkeypatch.setattr(sys, "platform", "darwin")
    assert gpu_device_nodes((str(tmp_path / "missing"),))  # elsewhere only torch can tell


def test_cuda_available_asks_torch_only_where_a_device_node_exists(monkeypatch):
    asked = []
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: asked.append(1) or True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(torch_lazy, "gpu_device_nodes", lambda: False)
    assert torch_lazy.cuda_available() is False and not asked
    monkeypatch.setattr(torch_lazy, "gpu_device_nodes", lambda: True)
    assert torch_lazy.cuda_available() is True and asked


# The parent of a local run: options settled and the first line printed, ranks' start replaced.
PARENT = """
import json, sys
import commbench.job as job
seen = {}
def fake_spawn(*args, **kwargs):
    seen["torch_before_ranks"] = "torch" in sys.modules
    return 0
job.spawn_local = fake_spawn
from commbench.cli import main
code = main(["sweep", "--sizes", "1K", "--nprocs", "2", "--backend", sys.argv[1]])
print(json.dumps({"code": code, **seen}))
"""


@pytest.mark.skipif(gpu_device_nodes(), reason="a GPU device node exists: the parent asks torch for the device")
@pytest.mark.parametrize("backend", ["torch", "shm", "p2p"])
def test_a_local_sweeps_parent_never_imports_torch_without_a_gpu(backend):
    out = subprocess.run([sys.executable, "-c", PARENT, backend], capture_output=True, text=True, timeout=120)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {"code": 0, "torch_before_ranks": False}, out.stderr
