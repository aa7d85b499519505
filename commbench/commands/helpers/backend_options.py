"""The options a backend reads, settled by the backend's own class before any rank starts,
once for every command that runs ranks (sweep, nccl-tests, proxy, train): an option the
backend does not take is one line and exit 2, and its `auto` choices are resolved here, so
every rank receives the same settled BackendConfig."""
from __future__ import annotations

from typing import Any

from commbench.backends import BackendConfig, BackendError, backend_class
from commbench.commands.helpers.common import UsageFault


def backend_class_of(name: str) -> Any:
    """The backend's class, or UsageFault naming the backends there are."""
    try:
        return backend_class(name)
    except BackendError as exc:
        raise UsageFault(str(exc)) from exc


def settle_backend(request: BackendConfig, launcher: str | None) -> tuple[Any, BackendConfig]:
    """(backend class, settled BackendConfig) for a job started by `launcher` (None: commbench on
    its own; "torchrun" on an emulated cluster), or UsageFault with the backend's one line."""
    cls = backend_class_of(request.backend)
    try:
        return cls, cls.settle(request, launcher)
    except BackendError as exc:
        raise UsageFault(str(exc)) from exc
