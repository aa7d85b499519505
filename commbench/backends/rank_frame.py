"""One rank's frame around its backend, for every job that runs ranks (sweep, proxy, train):
build the backend, run the job's body on it inside the job frame (commbench/job.py: faults
become one line and their exit code), and close the backend whatever happened, after the
job's own teardown. Written once so that the jobs cannot drift apart in how a rank starts
and ends."""
from __future__ import annotations

from typing import Any, Callable

from commbench.backends import Backend, BackendConfig, create_backend
from commbench.job import run_rank


def run_on_backend(cfg: BackendConfig, launch: Any, body: Callable[[Backend], int],
                   on_fault: Callable[[str, str], None], close: Callable[[], None] | None = None) -> int:
    """Run `body(backend)` on this rank; returns its exit code, or the fault's. `on_fault(status,
    error)` writes what the job keeps after a fault (its summary); `close` releases the job's own
    resources before the backend closes. The job frame's timeout is the backend's (cfg.timeout_s)."""
    built: list[Backend] = []

    def run() -> int:
        built.append(create_backend(cfg, launch))
        return body(built[0])

    def close_all() -> None:
        try:
            if close is not None:
                close()
        finally:
            if built:
                built[0].close()

    return run_rank(launch, cfg.timeout_s, run, on_fault, close_all)
