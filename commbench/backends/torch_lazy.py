"""torch, imported when a rank first uses it rather than when a command looks up a backend's
class: the parent process of a local run settles the backend's options (device, library) and
prints its first line before any rank starts, and importing torch there took 1.4 s on an idle
2-core VM (more under load) for nothing but `torch.cuda.is_available()` on a machine with no GPU."""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any

# Device nodes without which no GPU is visible to a Linux process (NVIDIA, ROCm, WSL's GPU).
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


class LazyModule:
    """Stands for a module in `namespace` (a module's globals) under `alias`; the first attribute
    read imports the module and puts it in its place, so later reads cost what a global does."""

    def __init__(self, name: str, namespace: dict[str, Any], alias: str):
        self._name, self._namespace, self._alias = name, namespace, alias

    def __getattr__(self, attr: str) -> Any:
        module = self.load()
        return getattr(module, attr)

    def load(self) -> ModuleType:
        module = importlib.import_module(self._name)
        self._namespace[self._alias] = module
        return module


def gpu_device_nodes(paths: tuple[str, ...] = GPU_DEVICE_NODES) -> bool:
    """False where no GPU can be visible to this process (Linux without any GPU device node);
    True where one may be (a node exists, or another system, where only torch can tell)."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(path) for path in paths)


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch where no GPU device node exists."""
    if not gpu_device_nodes():
        return False
    import torch

    return bool(torch.cuda.is_available())


def local_gpu_count() -> int:
    """The GPUs torch sees on this host (0 without CUDA), without importing torch where none can be."""
    if not cuda_available():
        return 0
    import torch

    return int(torch.cuda.device_count())
