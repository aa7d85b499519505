"""Backends: where collectives run. Each is imported only when asked for, so that
`--help` and the analysis commands need no torch, CuPy or GPU.

What a backend can do (runs commbench's schedules, needs a GPU, captures CUDA graphs,
runs every rank in one process), which options it accepts and what its header says are
facts of its class (backends/base.py): commands ask the class, they do not switch on
names.
"""
from __future__ import annotations

from typing import Any, Callable

from commbench.backends.base import Backend, BackendConfig
from commbench.backends.registry import BACKENDS, FACTORIES, UnknownBackend, load, names_where
from commbench.backends.registry import backend_class as _backend_class
from commbench.errors import BackendError, OutOfMemory


def backend_class(name: str) -> type[Backend]:
    try:
        return _backend_class(name)
    except UnknownBackend as exc:
        raise BackendError(str(exc)) from None


def create_backend(cfg: BackendConfig, launch: Any) -> Backend:
    """Build backend `cfg.backend` on this rank."""
    factory: Callable[[BackendConfig, Any], Backend] = (
        load(FACTORIES[cfg.backend]) if cfg.backend in FACTORIES else backend_class(cfg.backend).create)
    backend = factory(cfg, launch)
    if hasattr(backend, "use_tuning"):  # `auto` follows --tuning's table, or the one shipped for this backend
        from commbench.tuning import for_backend

        backend.use_tuning(for_backend(cfg.tuning, backend.name, backend.library))
    return backend


__all__ = ["BACKENDS", "Backend", "BackendConfig", "BackendError", "OutOfMemory", "backend_class",
           "create_backend", "names_where"]
