"""The sweep harness, written once for every backend and collective.

For each collective, size and placement: allocate, fill verifiable data, warm up,
time iterations back to back after a barrier, check a fresh run's output, gather
per-iteration times and error counts on rank 0, and write one Result, flushed.
Iteration counts are agreed across ranks (every rank must issue the same calls).
docs/metrics.md describes the method.
"""
from __future__ import annotations

import gc
import os
import sys
import time
import uuid
from dataclasses import asdict
from typing import Any

import numpy as np

from commbench import collectives as C
from commbench import point_timing as timing
from commbench.backends import Backend, BackendError
from commbench.backends.rank_frame import run_on_backend
from commbench.backends.registry import capabilities_of
from commbench.bench_point import RANK_AGG_TEXT, PointOutcome, collect, measure_point
from commbench.environment import local_environment, oversubscribed, software_versions
from commbench.errors import EXIT_OK, EXIT_WRONG, JobFault
from commbench.job import Job, error_line
from commbench.launchers import EMULATED_VAR, LaunchInfo
from commbench.results import (
    Result,
    ResultSink,
    SweepSummary,
    busbw_averages,
    point_result,
)
from commbench.sizes import format_size
from commbench.sweep_config import SweepConfig
from commbench.table import Progress, Table, nccl_tests_devices
from commbench.telemetry import run_monitor

# ---------------------------------------------------------------- the sweep


class Sweep:
    """Runs a SweepConfig on one rank; rank 0 prints and writes the results."""

    def __init__(self, cfg: SweepConfig, launch: LaunchInfo, backend: Backend, argv: list[str] | None = None):
        self.cfg, self.launch, self.backend = cfg, launch, backend
        self.dtype = C.resolve_dtype(cfg.dtype)
        self.passes = [(C.resolve_dtype(dtype), op) for dtype, op in cfg.passes] or [(self.dtype, cfg.op)]
        self.lead = backend.rank == 0
        self.run_id = uuid.uuid4().hex[:12]
        self.sink = ResultSink(cfg.json_path, cfg.csv_path, cfg.append) if self.lead else None
        points = [size for _ in cfg.collectives for _ in self.passes for size in cfg.sizes
                  for _ in cfg.placements]  # in run order
        self.progress = Progress(len(points), enabled=None if self.lead else False, nbytes=points,
                                 calls_for=lambda call_us: timing.planned_calls(cfg, call_us))
        self.table = Table(list(cfg.placements), progress=self.progress,
                           show_algorithm=backend.runs_schedules and not cfg.nccl_tests_rows,
                           marks_in_rows=not cfg.nccl_tests_rows, json_kept=bool(cfg.json_path),
                           show_p99=cfg.show_p99, timestamps=cfg.timestamps, csv_kept=bool(cfg.csv_path),
                           keep_flag="-J FILE" if cfg.nccl_tests_binary else "--json FILE",
                           nccl_tests=bool(cfg.nccl_tests_binary))
        self.argv = argv or sys.argv
        self.results: list[Result] = []
        # schedule backends know the layout they run on
        self.nnodes = backend.topology.nodes if backend.runs_schedules else launch.nnodes
        self.monitor = run_monitor(backend, self.lead) if cfg.monitor else None
        self.memory: list[dict] | None = None  # --memory-report: every rank's, at the end

    def run(self) -> int:
        # What is alive now (torch, the backend) is left out of the collections after each point until the sweep
        # ends: one took 0.24 s with torch imported, 20 us after the freeze (docs/performance.md).
        gc.freeze()
        environment = self.backend.gather_objects(local_environment(self.backend.device,
                                                                        getattr(self.backend, "gpus", None)))
        if self.lead:
            self._header(environment)
        if self.monitor is not None:
            self.monitor.start()
        status, error = "ok", None
        try:
            for collective in self.cfg.collectives:
                self._collective(collective)
            memory = self.backend.gather_objects(timing.memory_report(self.backend)) if self.cfg.memory_report else None
            for line in timing.memory_lines(memory) if memory and self.lead else ():
                self.table.comment(line)
            self.memory = memory
        except (JobFault, BackendError) as exc:
            status, error = "failed", str(exc)
            raise
        except BaseException as exc:  # Ctrl-C, SIGTERM from the launcher, anything unexpected
            status, error = "interrupted", type(exc).__name__
            raise
        finally:
            gc.unfreeze()  # a library caller's later objects are its own again
            self.progress.close()
            if self.lead:
                wrong = sum(r.wrong or 0 for r in self.results)
                status = "wrong" if status == "ok" and wrong else status
                busbw, by_collective = busbw_averages([(r.collective, r.busbw_gbps) for r in self.results])
                self.sink.summary(SweepSummary(run_id=self.run_id, status=status, error=error, points=len(self.results),
                                               wrong=wrong, avg_busbw_gbps=busbw, stat=self.cfg.stat,
                                               avg_busbw_gbps_by_collective=by_collective,
                                               telemetry=self._telemetry_summary().get("telemetry"),
                                               memory=self.memory))
                self.sink.close()
        wrong_total = sum(r.wrong or 0 for r in self.results)
        return EXIT_WRONG if wrong_total else EXIT_OK

    def _telemetry_summary(self) -> dict[str, Any]:
        """Stop the monitor, print its one-line summary; the summary record's `telemetry` field."""
        if self.monitor is None:
            return {}
        self.monitor.stop()
        self.table.comment(self.monitor.summary_line())
        return {"telemetry": self.monitor.summary()}

    def _header(self, environment: list[dict]) -> None:
        cfg, launch, hosts = self.cfg, self.launch, sorted({e["host"] for e in environment})
        self.sink.header({"run_id": self.run_id, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "command": " ".join(self.argv), "config": cfg.header_fields(), "launch": asdict(launch),
                          "backend": self.backend.name, "library": self.backend.library, "device": self.backend.device,
                          "ranks": environment, "hosts": hosts, "versions": software_versions(),
                          **self.backend.header_fields()})
        world = self.backend.world_size
        if cfg.nccl_tests_binary:  # nccl-tests' own first lines, which scripts grep
            for line in [*cfg.nccl_tests_header, "", *nccl_tests_devices(environment, world), ""]:
                self.table.comment(line)
        where = f"{len(hosts)} host(s)" if not os.environ.get(EMULATED_VAR) else "one host's emulated nodes"
        self.table.comment(f"commbench sweep: backend {self.backend.name} ({self.backend.setup_text()}), "
                           f"{world} rank{'s' if world != 1 else ''} on {where}, launcher {launch.launcher}")
        if os.environ.get(EMULATED_VAR):
            self.table.comment(f"emulated cluster: {os.environ[EMULATED_VAR]}")
        crowded = oversubscribed(environment) if self.backend.device == "cpu" else None
        if crowded:
            self.table.comment(f"note: {crowded} (oversubscribed): ranks take turns on the cores and the times hold "
                               f"that contention; check and predict mark such runs")
        self.table.comment(f"{self._passes_text()}, {self._timing_text()}, check {'on' if cfg.check else 'off'}")
        if self.monitor is not None and self.monitor.note:
            self.table.comment(self.monitor.note)
        if cfg.backend.graph:
            self.table.comment("--graph: the timed calls of a point run as one CUDA graph; times are its mean per call")
        for line in timing.timing_notes(cfg):
            self.table.comment(line)
        for note in self.backend.header_notes(cfg.collectives, cfg.placements, cfg.backend.hw):
            self.table.comment(note)

    def _passes_text(self) -> str:
        """'dtype float32', or the passes of one job (nccl-tests' -d all -o all -N) in the order they run."""
        if len(self.passes) == 1:
            return f"dtype {self.dtype.name}"
        return f"{len(self.passes)} passes over the sizes (dtype op: " \
               f"{', '.join(f'{dtype.name} {op}' for dtype, op in self.passes)})"

    def _timing_text(self) -> str:
        cfg = self.cfg
        if not self.backend.timed:
            return "not timed"
        if self.backend.kind == "predicted":  # every iteration costs the same: the model has no noise
            return "time = the cost model's, per call"
        iters = (f"{cfg.iters} iteration{'s' if cfg.iters != 1 else ''}" if cfg.iters
                 else f"adaptive iterations ({cfg.min_time_s:g} s per point)")
        return f"{iters}, time = {cfg.stat} of the iterations, each iteration the {RANK_AGG_TEXT[cfg.rank_agg]}"

    def _collective(self, collective: str) -> None:
        cfg = self.cfg
        coll = C.COLLECTIVES[collective]
        if self.lead:
            self.table.header(collective)
        for dtype, op in self.passes:
            self.dtype = dtype
            self._pass(collective, op if coll.reduces else None)
        if self.lead:
            if not coll.inplace and cfg.placements == ("in-place",):
                self.table.comment(f"{collective} has no in-place form: nothing to measure with --placement in-place")
            self.table.footer(cfg.check)
            if cfg.nccl_tests_binary:
                self.table.comment(f"Collective test concluded: {cfg.nccl_tests_binary}")
                self.table.comment("")

    def _pass(self, collective: str, op: str | None) -> None:
        """One pass over the sizes with one dtype and op: a row per size."""
        cfg, world = self.cfg, self.backend.world_size
        pattern = C.make_pattern(self.dtype, op, world)
        seen: set[int] = set()
        for size in cfg.sizes:
            plan = C.plan(collective, size, self.dtype, world, cfg.root if C.COLLECTIVES[collective].rooted else -1,
                          cfg.split_weights)
            if plan.count == 0 or plan.nbytes in seen:
                self._skip(plan)
                continue
            seen.add(plan.nbytes)
            row = {}
            for placement in cfg.placements:
                row[placement] = self._point(plan, placement, pattern, op)
            if self.lead and any(row.values()):
                self.table.row(row, self.dtype.nccl_name)

    def _skip(self, plan: C.Plan) -> None:
        self.progress.done += len(self.cfg.placements)
        if self.lead and plan.count == 0:
            minimum = self.dtype.itemsize * (plan.world if C.COLLECTIVES[plan.collective].chunked else 1)
            self.table.comment(f"skipped {plan.requested_nbytes} B: {plan.collective} on {plan.world} ranks needs "
                               f"at least {minimum} B of {self.dtype.name}")

    def _point(self, plan: C.Plan, placement: str, pattern: C.Pattern, op: str | None) -> Result | None:
        coll = C.COLLECTIVES[plan.collective]
        label = f"{plan.collective} {format_size(plan.nbytes)} {placement}"
        if placement == "in-place" and not coll.inplace:
            self.progress.done += 1  # nothing runs: no time to learn the size's cost from
            return None
        self.progress.update(label)
        reason = self.backend.unsupported(plan.collective, self.dtype, op, placement)
        if reason:
            raise BackendError(reason)
        failed = True
        try:
            outcome = measure_point(self.backend, self.cfg, plan, placement, pattern, self.monitor)
            stats = collect(self.backend, outcome, self.cfg.rank_agg, self.cfg.stat, self.cfg.skip_iters)
            failed = False
        except JobFault:
            raise
        except RuntimeError as exc:  # torch raises RuntimeError when a peer dies or a collective times out
            raise JobFault(f"{label} failed: {error_line(exc)} (a peer rank may have died or hung)") from exc
        finally:
            gc.collect()  # drop this point's buffers before the next size allocates its own
            self.backend.end_point(failed)
        measured = self.lead and self.backend.timed and self.backend.kind == "measured"  # calls took the wall time
        counted = stats["per_iteration_us"] if measured else ()
        self.progress.advance(float(np.mean(counted)) if len(counted) else None,  # the mean: what the wall saw
                              outcome.warmup + outcome.times_us.size + (1 if self.cfg.check else 0))
        if not self.lead:
            return None
        return self._record(plan, placement, op, outcome, stats)

    def _record(self, plan: C.Plan, placement: str, op: str | None, outcome: PointOutcome,
                stats: dict[str, float]) -> Result:
        result = point_result(plan, dtype=self.dtype.name, op=op, placement=placement, nnodes=self.nnodes,
                              backend=self.backend.name, library=self.backend.library, device=self.backend.device,
                              time_us=stats["time_us"], per_iteration_us=stats["per_iteration_us"],
                              warmup=outcome.warmup, rank_agg=self.cfg.rank_agg,
                              wrong=int(stats["wrong"]) if self.cfg.check else None, run_id=self.run_id,
                              kind=self.backend.kind, telemetry=outcome.telemetry, stat=self.cfg.stat,
                              **timing.timing_fields(stats, outcome.timed_start, self.cfg.skip_iters),
                              **self.backend.describe(), **capabilities_of(self.backend).fields())
        self.sink.write(result)
        self.results.append(result)
        return result


# ---------------------------------------------------------------- one rank's entry point


def run_sweep(cfg: SweepConfig, launch: LaunchInfo, argv: list[str] | None = None) -> int:
    """Run the sweep on this rank (the `sweep` job, SWEEP_JOB); returns the exit code.
    Faults end in one line on stderr; the summary record is written by Sweep.run itself."""
    sweeps: list[Sweep] = []

    def body(backend: Backend) -> int:
        sweeps.append(Sweep(cfg, launch, backend, argv))
        return sweeps[0].run()

    def on_fault(status: str, error: str) -> None:
        """A fault before the sweep began (the rendezvous: a peer never came, Ctrl-C) still leaves a
        summary in --json saying so; once begun, Sweep.run writes its own."""
        if not sweeps and launch.rank == 0 and cfg.json_path:
            with ResultSink(cfg.json_path, append=cfg.append) as sink:
                sink.summary(SweepSummary(run_id=uuid.uuid4().hex[:12], status=status, error=error, points=0,
                                          wrong=0, avg_busbw_gbps=None))

    return run_on_backend(cfg.backend, launch, body, on_fault)


SWEEP_JOB = Job("sweep", f"{__name__}:SWEEP_JOB", SweepConfig, run_sweep, SweepSummary.failed_from)  # sweep, nccl-tests
