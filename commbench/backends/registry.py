"""The backends by name, each imported only when asked for (`--help` and the analysis
commands need no torch, CuPy or GPU), and what a result record says of the backend that
wrote it (RecordCapabilities), so that readers of records never branch on backend names.

This module is core data (floor 1 in docs/architecture.md): it names the backends' modules
and loads one only when its class is asked for."""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# name -> "module:class"
BACKENDS = {
    "torch": "commbench.backends.torch_dist:TorchBackend",
    "shm": "commbench.backends.shm.backend:ShmBackend",
    "p2p": "commbench.backends.p2p:P2PBackend",
    "sim": "commbench.backends.sim:SimBackend",
    "hybrid": "commbench.backends.hybrid:HybridBackend",
    "cupy": "commbench.backends.cuda.nccl:CupyBackend",
    "cuda": "commbench.backends.cuda.sched:CudaBackend",
}
# Where a backend is built by a factory rather than its class's `create` (cuda picks the
# class of its pointer mode: one process for every rank, or one per GPU over CUDA IPC).
FACTORIES = {"cuda": "commbench.backends.cuda.ipc:create_cuda_backend"}
MODEL = "model"  # the `backend` of records the cost model predicted (predict, proxy predictions): nothing ran
TIMINGS = ("measured", "simulated", "modelled")  # a record's `timing` (RecordCapabilities)


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


# ---------------------------------------------------------------- what a record says of its backend


@dataclass(frozen=True)
class RecordCapabilities:
    """What a result or proxy record carries of the backend that made it (its `schedule` and `timing`
    fields), so that fit, check and report ask the record instead of switching on backend names."""
    schedule: bool  # commbench's own schedule (its `algorithm`) ran or was costed; False: a library's collective
    timing: str  # measured (a clock timed it), simulated (it ran; the cost model timed it), modelled (nothing ran)

    @property
    def measured(self) -> bool:
        """Its times come from a clock on a host (not from the cost model)."""
        return self.timing == "measured"

    @property
    def ran(self) -> bool:
        """The call ran (measured or simulated), rather than only being costed."""
        return self.timing != "modelled"

    def fields(self) -> dict[str, Any]:
        """The record fields, as a writer passes them."""
        return {"schedule": self.schedule, "timing": self.timing}


PREDICTED = RecordCapabilities(schedule=True, timing="modelled")  # the cost model costing a commbench schedule


def capabilities_of(backend: Any) -> RecordCapabilities:
    """What a backend class (or instance) writes into its records, from its class's capabilities."""
    return RecordCapabilities(schedule=bool(backend.runs_schedules),
                              timing="simulated" if backend.uses_hw else "measured")


def record_capabilities(record: Mapping[str, Any]) -> RecordCapabilities:
    """A record's capabilities: its own `schedule` and `timing` fields, or, for a record written before
    records carried them, its backend's, looked up by the backend's name (the model's predictions by
    MODEL; a name this version does not know: a schedule, measured, as readers took it before)."""
    schedule, timing = record.get("schedule"), record.get("timing")
    if isinstance(schedule, bool) and timing in TIMINGS:
        return RecordCapabilities(schedule, timing)
    name = record.get("backend")
    if name == MODEL:
        return PREDICTED
    if name in BACKENDS:
        return capabilities_of(backend_class(name))
    return RecordCapabilities(schedule=True, timing="measured")
