"""Backends: where collectives run. Each is imported only when asked for, so that
`--help` and the analysis commands need no torch, CuPy or GPU."""
from __future__ import annotations

import importlib

from commbench.backends.base import Backend, BackendError, OutOfMemory

# name -> "module:class"; later backends (shm, p2p, sim, cupy, cuda) register here.
BACKENDS = {
    "torch": "commbench.backends.torch_dist:TorchBackend",
    "shm": "commbench.backends.shm:ShmBackend",
    "p2p": "commbench.backends.p2p:P2PBackend",
    "sim": "commbench.backends.sim:SimBackend",
    "hybrid": "commbench.backends.hybrid:HybridBackend",
}
SCHEDULE_BACKENDS = ("shm", "p2p", "hybrid", "sim")  # run commbench's own algorithms (--algorithm)


def backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise BackendError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["SCHEDULE_BACKENDS", "BACKENDS", "Backend", "BackendError", "OutOfMemory", "backend_class"]
