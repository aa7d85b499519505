"""Backends: where collectives run. Each is imported only when asked for, so that
`--help` and the analysis commands need no torch, CuPy or GPU."""
from __future__ import annotations

import importlib

from commbench.backends.base import Backend, BackendError, OutOfMemory

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
SCHEDULE_BACKENDS = ("shm", "p2p", "hybrid", "sim", "cuda")  # run commbench's own algorithms (--algorithm)
GPU_BACKENDS = ("cupy", "cuda")  # need CuPy and a CUDA device (commbench/backends/gpu.py says which is missing)


def backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["SCHEDULE_BACKENDS", "GPU_BACKENDS", "BACKENDS", "Backend", "BackendError", "OutOfMemory", "backend_class"]
