"""What the command lines of the commands that run ranks (sweep, proxy, train) share, as one frozen base
of their options values (commands/sweep_options.SweepOptions, commands/proxy_options.ProxyOptions): the
backend and its choices, the ranks and their layout, the output file and the telemetry, each field named
as click's destination with click's default. It mirrors the configs' own shared part
(backends.base.RanksConfig). Keyword-only: a subclass adds fields with or without defaults (proxy's
MODEL argument) in any order, and a value is built by name, as `from_click` does."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RanksOptions:
    # what runs the calls (settled by the backend's class: commands/helpers/backend_options.py)
    backend: str = "torch"
    algorithm: str = "auto"
    tuning: str | None = None
    torch_backend: str = "auto"
    device: str = "auto"
    hw: str | None = None
    # the ranks and their layout
    topology: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    nprocs: int | None = None
    oversubscribe: bool = False
    launcher: str = "auto"
    emulate: str | None = None
    link: str | None = None
    timeout_s: float = 300.0
    # the run's records and telemetry
    json_path: str | None = None
    force: bool = False
    monitor: bool = False
