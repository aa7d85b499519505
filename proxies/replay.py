"""Replay a model's DDP gradient traffic on the ranks of a job, with the compute emulated.

Every rank allocates one buffer per bucket on the chosen backend (torch gloo/NCCL, or
commbench's shm/p2p/hybrid schedules) and, each step, runs the timeline of timeline.py:
the forward and backward are emulated by waiting (their durations measured on the
real model here, or from FLOPs at --tflops, or zero), and each bucket's allreduce is
handed to a communication thread when its last gradient is ready, as DDP's Reducer
hands buckets to its process group. The thread runs the allreduces one after another
and times each; the step ends when the backward and the last allreduce are done, plus
the optimizer.

`run_rank` is the frame both `proxy` and `train` run in: backend, header, per-step
records, summary, and faults (a dead or hung rank, out of memory, Ctrl-C) ending in one
line with everything already measured kept.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import numpy as np

from commbench import collectives as C
from commbench.backends import BackendError, OutOfMemory, backend_class
from commbench.bench import EXIT_FAULT, EXIT_OK, EXIT_USAGE, error_line
from commbench.proxies import buckets as B
from commbench.proxies.profile import load_profile
from commbench.proxies.steps import ProxyResult, StepLog, summarize
from commbench.proxies.channels import ThreadChannel, WorkChannel
from commbench.proxies.timeline import CpuClock, SleepClock, flops_times_us, plan_step, run_step
from commbench.results import local_environment, software_versions

CONFIG_VAR = "COMMBENCH_PROXY_CONFIG"
ARGV_VAR = "COMMBENCH_ARGV"
_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


class RankContext:
    """What a proxy or train body needs on one rank, and the record keeping around it."""

    def __init__(self, cfg, launch, backend, kind: str, argv: list[str]):
        self.cfg, self.launch, self.backend, self.kind, self.argv = cfg, launch, backend, kind, argv
        self.profile = load_profile(cfg.model)
        self.batch = cfg.batch or self.profile.default_batch
        self.buckets = B.assign(self.profile, cfg.bucket_mb, cfg.bucketing)
        self.rows: list[list[float]] = []
        self.log: StepLog | None = None
        self.compute = "-"
        self.monitor = None  # --monitor on rank 0: commbench.telemetry.Monitor
        self.channel = None  # the proxy's ThreadChannel or WorkChannel, closed by run_rank

    def start(self, compute: str, lines: list[str], extra: dict[str, Any] | None = None) -> None:
        """After setup, before the first step: the run header (every rank takes part)."""
        self.compute = compute
        environment = self.backend.gather_objects(local_environment(self.backend.device))
        self.log = StepLog(self.cfg.json_path, self.backend.rank == 0, self.batch * self.backend.world_size)
        profile, world = self.profile, self.backend.world_size
        what = (f"{self.kind} {profile.name}: {profile.parameters / 1e6:.1f} M parameters, "
                f"{profile.nbytes / 2**20:.1f} MiB of gradients in {len(self.buckets)} bucket(s) "
                f"({self._bucket_text()}), batch {self.batch} per rank, {world} rank(s), "
                f"backend {self.backend.name} ({self.backend.library} on {self.backend.device})")
        record = {"kind": self.kind, "model": profile.name, "command": " ".join(self.argv),
                  "config": json.loads(self.cfg.to_json()), "ranks": environment, "versions": software_versions(),
                  "buckets": B.describe(self.buckets), **(extra or {})}
        if self.cfg.monitor:  # every rank: the ranks' GPUs are gathered
            from commbench.telemetry import run_monitor

            self.monitor = run_monitor(self.backend, self.backend.rank == 0)
        if self.monitor is not None:
            self.monitor.start()
            lines = [*lines, *([self.monitor.note] if self.monitor.note else [])]
        self.log.header(record, [what, *lines])
        if self.monitor is not None:
            self.monitor.mark()

    def _bucket_text(self) -> str:
        if self.cfg.bucketing != "ddp":
            return {"none": "one per tensor", "single": "one bucket"}[self.cfg.bucketing]
        return f"cap {self.cfg.bucket_mb:g} MiB" if self.cfg.bucket_mb else "DDP default: 25 MiB, first 1 MiB"

    def record(self, index: int, values: dict[str, float | None]) -> None:
        self.rows.append([np.nan if values[k] is None else values[k]
                          for k in ("compute_us", "comm_us", "exposed_comm_us", "step_us")])
        if self.monitor is not None:  # this step's hardware averages, then a window for the next
            values = {**values, "telemetry": self.monitor.window()}
            self.monitor.mark()
        if self.log:
            self.log.step(index + 1, index < self.cfg.warmup_steps, values)

    def finish(self, status: str = "ok", error: str | None = None) -> None:
        rows = np.array(self.rows, dtype=float).reshape(-1, 4)
        if status == "ok":  # every rank's steps; per step, the whole row of its slowest rank
            gathered = self.backend.gather(rows.ravel())
            if gathered is not None:
                ranks = gathered.reshape(self.backend.world_size, -1, 4)
                slowest = ranks[:, :, 3].argmax(axis=0)
                rows = ranks[slowest, np.arange(ranks.shape[1])]
        if self.backend.rank != 0:
            return
        if self.log is None:  # failed before the first step: nothing to summarise or write
            return
        telemetry = None
        if self.monitor is not None:
            self.monitor.stop()
            telemetry = self.monitor.summary()
        measured = rows[self.cfg.warmup_steps:]
        stats = summarize(measured)
        step = stats["step_us_p50"] or 0.0
        self.log.summary(ProxyResult(
            kind=self.kind, model=self.profile.name, backend=self.backend.name, library=self.backend.library,
            device=self.backend.device, world_size=self.backend.world_size, nnodes=self.launch.nnodes,
            batch=self.batch, bucket_mb=self.cfg.bucket_mb, bucketing=self.cfg.bucketing, buckets=len(self.buckets),
            gradient_bytes=self.profile.nbytes, compute=self.compute, steps=len(measured),
            warmup_steps=self.cfg.warmup_steps, samples_per_s=self.batch * self.backend.world_size / (step * 1e-6)
            if step else 0.0, status=status, error=error, telemetry=telemetry, run_id=self.log.run_id,
            **{k: v for k, v in stats.items() if not k.startswith("step_us")},
            step_us_p50=step, step_us_p90=stats["step_us_p90"] or 0.0))


def run_rank(cfg, launch, argv: list[str], body: Callable[[RankContext], None], kind: str = "train") -> int:
    """Run `body` on this rank inside the common frame; returns the exit code."""
    backend = ctx = None
    switch_interval = sys.getswitchinterval()
    try:
        backend = backend_class(cfg.backend).create(cfg.backend_config(launch.world_size), launch)
        ctx = RankContext(cfg, launch, backend, kind, argv)
        body(ctx)
        ctx.finish()
        return EXIT_OK
    except (MemoryError, OutOfMemory) as exc:
        return _fail(ctx, launch, f"out of memory: {error_line(exc)}", EXIT_USAGE, "failed")
    except (BackendError, ValueError) as exc:  # ValueError: ModelError, ProfileError (one line each)
        return _fail(ctx, launch, str(exc).splitlines()[0], EXIT_USAGE, "failed")
    except RuntimeError as exc:
        if any(marker in str(exc).lower() for marker in _OOM_MARKERS):
            return _fail(ctx, launch, f"out of memory: {error_line(exc)}", EXIT_USAGE, "failed")
        return _fail(ctx, launch, f"{error_line(exc)} (a peer rank may have died or hung; timeout "
                                  f"{cfg.timeout_s:g} s)", EXIT_FAULT, "failed")
    except KeyboardInterrupt:
        return _fail(ctx, launch, None, 130, "interrupted")
    finally:
        sys.setswitchinterval(switch_interval)
        if ctx is not None and ctx.channel is not None:
            ctx.channel.close()
        if backend is not None:
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - tearing down after a fault must not raise a second error
                pass


def _fail(ctx: RankContext | None, launch, message: str | None, code: int, status: str) -> int:
    if message:
        who = f"rank {launch.rank}: " if launch.world_size > 1 else ""
        print(f"commbench: {who}{message}", file=sys.stderr, flush=True)
    if ctx is not None:
        try:
            ctx.finish(status, message or status)
        except Exception:  # noqa: BLE001 - the summary is best effort after a fault
            pass
    return code


# ---------------------------------------------------------------- the proxy body


def compute_times(ctx: RankContext) -> tuple[float, float, float, str]:
    """(forward, backward, optimizer) microseconds per step and a label saying where they come from."""
    cfg, profile = ctx.cfg, ctx.profile
    if cfg.compute == "none":
        return 0.0, 0.0, 0.0, "none"
    if cfg.compute == "flops":
        forward, backward = flops_times_us(profile, ctx.batch, cfg.tflops)
        return forward, backward, 0.0, f"flops at {cfg.tflops:g} TFLOP/s"
    import torch

    from commbench.proxies.train import measure_compute

    device = torch.device("cuda", torch.cuda.current_device()) if ctx.backend.device == "cuda" else "cpu"
    measured, cpu_time = measure_compute(profile, ctx.batch, device, cfg.amp, ctx.launch.local_world_size,
                                         ready=ctx.backend.barrier)
    forward, backward, update = ctx.backend.agree_max(np.array(measured))  # the slowest rank sets the pace
    return float(forward), float(backward), float(update), "measured" + (" (CPU time)" if cpu_time else "")


def _replay_steps(ctx: RankContext) -> None:
    cfg, backend, profile = ctx.cfg, ctx.backend, ctx.profile
    forward, backward, update, label = compute_times(ctx)
    plan = plan_step(profile, ctx.buckets, forward, backward, update)
    buffers = []
    for bucket in ctx.buckets:
        dtype = C.resolve_dtype(bucket.dtype)
        buffers.append(backend.alloc(bucket.nbytes // dtype.itemsize, dtype))
        backend.fill(buffers[-1], 0.0)  # zeros stay zeros: no overflow, no denormals, whatever the steps
    backend.barrier()  # every rank's buffers exist before any rank prepares (shm maps its peers' segments)
    # A CPU's compute is replayed as CPU time (spinning: it competes with gloo for the cores, as
    # real compute does); a GPU's, or a multi-threaded CPU measurement, as wall time (sleeping).
    cpu_compute = backend.device == "cpu" and (label != "measured")
    clock = CpuClock() if cpu_compute else SleepClock()
    if backend.name == "torch":  # async launches, as DDP's Reducer; the library queues them
        ctx.channel = WorkChannel(buffers, clock, buffers[0].device if buffers else None)
    else:
        calls = [backend.prepare("allreduce", buffer, buffer, "sum", 0, True) for buffer in buffers]
        ctx.channel = ThreadChannel(calls, backend.synchronize, clock)
    sys.setswitchinterval(1e-4)  # the spinning main thread hands the GIL to the waiter thread within 0.1 ms
    ctx.start(label, [f"compute per step ({label}): forward {forward / 1e3:.2f} ms, backward {backward / 1e3:.2f} ms, "
                      f"optimizer {update / 1e3:.2f} ms; allreduces launched as gradients are ready, overlapping the backward"],
              {"compute_split_us": {"forward": forward, "backward": backward, "optimizer": update}})
    backend.barrier()
    for index in range(cfg.warmup_steps + cfg.steps):
        times = run_step(plan, clock, ctx.channel)
        ctx.record(index, {"compute_us": times.compute_us, "comm_us": times.comm_us,
                           "exposed_comm_us": times.exposed_comm_us, "step_us": times.step_us})


def exit_now(code: int) -> None:
    """End a spawned rank once its run is over (records written, backend closed): skip the
    interpreter's teardown, where torch's distributed and thread-pool destructors have aborted
    a finished rank here ("terminate called without an active exception") and turned a clean
    run into a SIGABRT."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_proxy(cfg, launch, argv: list[str]) -> int:
    return run_rank(cfg, launch, argv, _replay_steps, kind="proxy")


if __name__ == "__main__":  # a rank spawned by `commbench proxy`
    from commbench.launch import from_environment
    from commbench.proxies.config import ProxyConfig

    exit_now(run_proxy(ProxyConfig.from_json(os.environ[CONFIG_VAR]), from_environment(os.environ, "spawn"),
                       json.loads(os.environ.get(ARGV_VAR, "[]"))))
