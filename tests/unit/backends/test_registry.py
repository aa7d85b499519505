"""commbench/backends/registry.py, over every backend it names: the class it loads, the capabilities it declares
(what commands ask instead of backend names), what its records say of it, and the settle rules those
capabilities drive, which refuse each option a backend lacks in one line naming the backends that take it."""
from __future__ import annotations

import pytest

from commbench.backends.base import Backend, BackendConfig, BackendError
from commbench.backends.registry import (
    BACKENDS,
    UnknownBackend,
    backend_class,
    capabilities_of,
    names_where,
    record_capabilities,
)
from commbench.sizes import parse_sizes

CAPABILITIES = ("runs_schedules", "needs_gpu", "captures_graphs", "has_cuda_modes", "uses_hw", "launches_async",
                "runs_rank_groups", "makes_ddp_calls", "one_host")


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_name_loads_a_backend_that_declares_its_capabilities(name):
    cls = backend_class(name)
    assert issubclass(cls, Backend)
    assert all(isinstance(getattr(cls, c), bool) for c in CAPABILITIES), name
    assert parse_sizes(cls.default_sizes, None, None), name  # its default sweep parses
    assert all(name in names_where(c) for c in CAPABILITIES if getattr(cls, c))


@pytest.mark.parametrize("name", list(BACKENDS))
def test_a_record_of_each_backend_says_what_its_class_says(name):
    cls = backend_class(name)
    said = capabilities_of(cls)
    assert said.schedule is cls.runs_schedules and said.measured is not cls.uses_hw
    assert record_capabilities({"backend": name}) == said  # an old record, by its backend's name


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_backend_refuses_the_options_its_capabilities_lack(name):
    cls = backend_class(name)
    asks = {"captures_graphs": {"graph": True}, "has_cuda_modes": {"cuda_mode": "ipc"}, "uses_hw": {"hw": "dgx-h100"},
            "runs_schedules": {"algorithm": "ring"}}
    for capability, option in asks.items():
        if getattr(cls, capability):
            continue
        with pytest.raises(BackendError) as refused:
            cls.settle(BackendConfig(backend=name, **option), None)
        assert "\n" not in str(refused.value), str(refused.value)


def test_an_unknown_name_is_one_line_naming_the_known():
    with pytest.raises(UnknownBackend, match="unknown backend 'mpi'; choose from torch, shm"):
        backend_class("mpi")
