"""What a proxy or training rank keeps around its steps: its header, per-step records and the
summary, for `proxy` (replay.py) and `train` (train.py). The backend's start and end, faults
and exit codes are the rank frame's every job shares (backends/rank_frame.py, inside the job
frame of commbench/job.py): whatever happens, the summary says what was measured."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np

from commbench.backends.rank_frame import run_on_backend
from commbench.backends.registry import capabilities_of
from commbench.environment import local_environment, software_versions
from commbench.errors import EXIT_OK, JobFault
from commbench.launchers import EMULATED_VAR
from commbench.proxies import buckets as B
from commbench.proxies.clocks import ComputeTimeout
from commbench.proxies.profile import load_profile
from commbench.proxies.steps import METRICS, STEP, ProxyResult, StepLog, summarize


class RankContext:
    """What a proxy or train body needs on one rank, and the record keeping around it."""

    def __init__(self, cfg, launch, backend, kind: str, argv: list[str]):
        self.cfg, self.launch, self.backend, self.kind, self.argv = cfg, launch, backend, kind, argv
        self.profile = load_profile(cfg.model)
        self.batch = cfg.batch or self.profile.default_batch
        self.buckets = B.assign(self.profile, cfg.bucket_mb, cfg.bucketing)
        self.choice = cfg.choice(launch.nnodes, launch.world_size // max(1, launch.nnodes), backend.device)
        self.rows: list[list[float]] = []
        self.log: StepLog | None = None
        self.compute = "-"
        self.monitor = None  # --monitor on rank 0: commbench.telemetry.Monitor
        self.channel = None  # the proxy's ThreadChannel or WorkChannel, closed by run_rank
        self.summarised = False  # the summary is written once (a Ctrl-C while a fault's is written)

    def start(self, compute: str, lines: list[str], extra: dict[str, Any] | None = None) -> None:
        """After setup, before the first step: the run header (every rank takes part)."""
        self.compute = compute
        environment = self.backend.gather_objects(local_environment(self.backend.device))
        profile, world = self.profile, self.backend.world_size
        grouped = (f"in {len(self.buckets)} bucket(s) ({self._bucket_text()})" if self.choice.setup.proxy_buckets else
                   f"in setup {self.choice.name}")
        what = (f"{self.kind} {profile.name}: {profile.parameters / 1e6:.1f} M parameters, "
                f"{profile.nbytes / 2**20:.1f} MiB of gradients {grouped}, batch {self.batch} per rank, "
                f"{world} rank(s), "
                f"backend {self.backend.name} ({self.backend.library} on {self.backend.device})")
        self.fixed = {"kind": self.kind, "model": profile.name, "backend": self.backend.name,
                      "library": self.backend.library, "device": self.backend.device, "world_size": world,
                      "nnodes": self.launch.nnodes, "batch": self.batch, "bucket_mb": self.cfg.bucket_mb,
                      "bucketing": self.cfg.bucketing, "buckets": len(self.buckets),
                      "gradient_bytes": profile.nbytes, "compute": compute, "warmup_steps": self.cfg.warmup_steps,
                      "setup": self.choice.name, "knobs": dict(self.choice.knobs),
                      **capabilities_of(self.backend).fields()}
        record = {"kind": self.kind, "model": profile.name, "command": " ".join(self.argv),
                  "config": self.cfg.header_fields(), "ranks": environment, "versions": software_versions(),
                  "buckets": B.describe(self.buckets), "summary_fields": self.fixed, **(extra or {})}
        replicas = self.cfg.layout.dp if getattr(self.cfg, "layout", None) else world  # a layout's dp ranks
        self.log = StepLog(self.cfg.json_path, self.backend.rank == 0,
                           self.batch * replicas * self.choice.get("accumulate"))
        if self.cfg.monitor:  # every rank: the ranks' GPUs are gathered
            from commbench.telemetry import run_monitor

            self.monitor = run_monitor(self.backend, self.backend.rank == 0)
        if self.monitor is not None:
            self.monitor.start()
            lines = [*lines, *([self.monitor.note] if self.monitor.note else [])]
        if os.environ.get(EMULATED_VAR):
            lines = [*lines, f"emulated cluster: {os.environ[EMULATED_VAR]}"]
        rows = ("each row, the median and the JSON: a step's slowest rank (what a synchronous job waits for; "
                "every rank's figures in the JSON, step.ranks_us)" if world > 1 else "one rank")
        self.log.header(record, [what, *lines, f"{self.cfg.warmup_steps} warm-up step(s), then {self.cfg.steps} "
                                               f"measured; {rows}"])
        if self.monitor is not None:
            self.monitor.mark()

    def _bucket_text(self) -> str:
        if self.cfg.bucketing != "ddp":
            return {"none": "one per tensor", "single": "one bucket"}[self.cfg.bucketing]
        return f"cap {self.cfg.bucket_mb:g} MiB" if self.cfg.bucket_mb else "DDP default: 25 MiB, first 1 MiB"

    def record(self, index: int, values: dict[str, float | None], lead_only: dict[str, Any] | None = None) -> None:
        """After each step, on every rank: the step's figures of every rank go to rank 0, which prints
        and writes the slowest rank's (the row, the summary and the JSON mean the same step). `lead_only`:
        rank 0's own figures, written as they are (its calls' start and end, calls_us)."""
        own = [np.nan if values.get(k) is None else values[k] for k in METRICS]
        self.rows.append(own)
        gathered = self.backend.gather(np.array(own, dtype=float)) if self.backend.world_size > 1 else None
        extra: dict[str, Any] = {}
        if gathered is not None:
            slowest = int(np.nanargmax(gathered[:, STEP])) if not np.isnan(gathered[:, STEP]).all() else 0
            values = {k: (None if np.isnan(v) else float(v)) for k, v in zip(METRICS, gathered[slowest])}
            extra = {"slowest_rank": slowest,
                     "ranks_us": [[None if np.isnan(v) else float(v) for v in row] for row in gathered]}
        if self.monitor is not None:  # this step's hardware averages, then a window for the next
            extra["telemetry"] = self.monitor.window()
            self.monitor.mark()
        if self.log:
            self.log.step(index + 1, index < self.cfg.warmup_steps, {**values, **extra, **(lead_only or {})})

    def finish(self, status: str = "ok", error: str | None = None) -> None:
        rows = np.array(self.rows, dtype=float).reshape(-1, len(METRICS))
        if status == "ok":  # every rank's steps; per step, the whole row of its slowest rank
            gathered = self.backend.gather(rows.ravel())
            if gathered is not None:
                ranks = gathered.reshape(self.backend.world_size, -1, len(METRICS))
                slowest = ranks[:, :, STEP].argmax(axis=0)
                rows = ranks[slowest, np.arange(ranks.shape[1])]
        if self.backend.rank != 0:
            return
        if self.log is None or self.summarised:  # failed before the first step (nothing to write), or written
            return
        self.summarised = True
        telemetry = None
        if self.monitor is not None:
            self.monitor.stop()
            telemetry = self.monitor.summary()
        self.log.summary(summary_of(self.fixed, rows, self.log.run_id, status, error, telemetry))


def summary_of(fixed: dict[str, Any], rows: np.ndarray, run_id: str, status: str, error: str | None,
               telemetry: dict[str, float] | None = None) -> ProxyResult:
    """The summary record: the run's fixed fields (RankContext.fixed), and the medians and p90s over the
    steps after warm-up of `rows` (steps x METRICS; per step, the slowest rank's where known)."""
    measured = rows[fixed["warmup_steps"]:]
    stats = summarize(measured)
    step = stats["step_us_p50"] or 0.0
    replicas = (fixed.get("layout") or {}).get("dp") or fixed["world_size"]  # a layout's samples: its dp ranks'
    return ProxyResult(**fixed, steps=len(measured), status=status, error=error, telemetry=telemetry, run_id=run_id,
                       samples_per_s=fixed["batch"] * replicas * (fixed.get("knobs") or {}).get(
                           "accumulate", 1) / (step * 1e-6) if step else None,
                       **{k: v for k, v in stats.items() if not k.startswith("step_us")},
                       step_us_p50=step, step_us_p90=stats["step_us_p90"] or 0.0)


def summary_from_records(records: list[dict[str, Any]], error: str) -> ProxyResult | None:
    """The summary a proxy or train file lacks because rank 0 died first (the spawner writes it, status
    failed): from the header's `summary_fields` and rank 0's step records."""
    header = records[0]
    if "summary_fields" not in header:
        return None
    rows = np.array([[np.nan if step.get(k) is None else step[k] for k in METRICS]
                     for step in records if step.get("record") == "step"], dtype=float).reshape(-1, len(METRICS))
    return summary_of(header["summary_fields"], rows, header.get("run_id", ""), "failed", error)


def run_rank(cfg, launch, argv: list[str], body: Callable[[RankContext], None], kind: str = "train") -> int:
    """Run `body` on this rank in the rank frame (backends/rank_frame.py); returns the exit code.
    After a fault the summary record still says what was measured, with the fault's status."""
    contexts: list[RankContext] = []
    switch_interval = sys.getswitchinterval()

    def run(backend) -> int:
        contexts.append(RankContext(cfg, launch, backend, kind, argv))
        try:
            body(contexts[0])
        except ComputeTimeout as exc:  # a fault of the run, not a peer's: said once when every rank has it
            raise JobFault(str(exc), agreed=exc.planned) from exc
        contexts[0].finish()
        return EXIT_OK

    def on_fault(status: str, error: str) -> None:
        if contexts:
            contexts[0].finish(status, error)

    def close() -> None:
        sys.setswitchinterval(switch_interval)
        if contexts and contexts[0].channel is not None:
            contexts[0].channel.close()

    return run_on_backend(cfg.backend, launch, run, on_fault, close)
