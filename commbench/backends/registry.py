"""The backends by name, each imported only when asked for (`--help` and the analysis
commands need no torch, CuPy or GPU)."""
from __future__ import annotations

import importlib
from typing import Any

# name -> "module:class"
BACKENDS = {
    "torch": "commbench.backends.torch_dist:TorchBackend",
    "shm": "commbench.backends.shm:ShmBackend",
    "p2p": "commbench.backends.p2p:P2PBackend",
    "sim": "commbench.backends.sim:SimBackend",
    "hybrid": "commbench.backends.hybrid:HybridBackend",
    "cupy": "commbench.backends.cupy_nccl:CupyBackend",
    "cuda": "commbench.backends.cuda_sched:CudaBackend",
}
# Where a backend is built by a factory rather than its class's `create` (cuda picks the
# class of its pointer mode: one process for every rank, or one per GPU over CUDA IPC).
FACTORIES = {"cuda": "commbench.backends.cuda_ipc:create_cuda_backend"}


class UnknownBackend(ValueError):
    pass


def load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def backend_class(name: str) -> Any:
    if name not in BACKENDS:
        raise UnknownBackend(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    return load(BACKENDS[name])


def names_where(capability: str) -> list[str]:
    """The backends whose class has `capability` set (for messages that say which backends to use)."""
    return [name for name in BACKENDS if getattr(backend_class(name), capability, False)]
