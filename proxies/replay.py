"""Replay a model's DDP gradient traffic on the ranks of a job, with the compute emulated.

Every rank allocates one buffer per bucket on the chosen backend (torch gloo/NCCL, or
commbench's shm/p2p/hybrid schedules) and, each step, runs the timeline of timeline.py:
the forward and backward are emulated by waiting (their durations measured on the
real model here, or from FLOPs at --tflops, or zero), and each bucket's allreduce is
handed to a communication thread when its last gradient is ready, as DDP's Reducer
hands buckets to its process group. The thread runs the allreduces one after another
and times each; the step ends when the backward and the last allreduce are done, plus
the optimizer. A step splits into the replayed compute, the exposed communication (the wait
after the backward while an allreduce is in flight) and other (the rest: see StepTimes).

`run_proxy` is the `proxy` job of commbench/job.py; its rank frame (backend, header,
per-step records, summary) is proxies/context.py, shared with `train`.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from commbench import collectives as C
from commbench.launch import peer_wait_s
from commbench.proxies.channels import ThreadChannel, WorkChannel
from commbench.proxies.context import RankContext, run_rank
from commbench.proxies.timeline import CpuClock, SleepClock, flops_times_us, plan_step, run_step

# ---------------------------------------------------------------- the proxy body


def compute_times(ctx: RankContext) -> tuple[float, float, float, float, str]:
    """(forward, backward, optimizer, DDP's own work) microseconds per step and a label saying where
    they come from."""
    cfg, profile = ctx.cfg, ctx.profile
    if cfg.compute == "none":
        return 0.0, 0.0, 0.0, 0.0, "none"
    if cfg.compute == "flops":
        forward, backward = flops_times_us(profile, ctx.batch, cfg.tflops)
        return forward, backward, 0.0, 0.0, f"flops at {cfg.tflops:g} TFLOP/s"
    import torch

    from commbench.proxies.train import measure_compute

    device = torch.device("cuda", torch.cuda.current_device()) if ctx.backend.device == "cuda" else "cpu"
    measured, cpu_time = measure_compute(profile, ctx.batch, device, cfg.amp, ctx.launch.local_world_size,
                                         ready=ctx.backend.barrier, trust_code=cfg.trust_profile_code,
                                         bucket_mb=cfg.bucket_mb, show_progress=ctx.backend.rank == 0)
    forward, backward, update, _ = ctx.backend.agree_max(np.array(measured))  # the slowest rank sets the pace
    # DDP's work is a difference of two noisy times, alike on every rank: the least any rank measured
    ddp = -float(ctx.backend.agree_max(np.array([-measured[3]]))[0])
    return (float(forward), float(backward), float(update), float(ddp),
            "measured" + (" (CPU time)" if cpu_time else ""))


def _replay_steps(ctx: RankContext) -> None:
    cfg, backend, profile = ctx.cfg, ctx.backend, ctx.profile
    forward, backward, update, ddp, label = compute_times(ctx)
    plan = plan_step(profile, ctx.buckets, forward, backward, update, ddp)
    buffers = []
    for bucket in ctx.buckets:
        dtype = C.resolve_dtype(bucket.dtype)
        buffers.append(backend.alloc(bucket.nbytes // dtype.itemsize, dtype))
        backend.fill(buffers[-1], 0.0)  # zeros stay zeros: no overflow, no denormals, whatever the steps
    backend.barrier()  # every rank's buffers exist before any rank prepares (shm maps its peers' segments)
    # This CPU's own compute, measured as CPU time, is replayed as CPU time (spinning: it competes
    # with gloo for the cores, as real compute does). A GPU's, a multi-threaded CPU measurement, or
    # --compute flops (a device of that rate: its compute leaves the host CPU free, as on the GPU
    # nodes an emulated cluster stands for) are replayed as wall time (sleeping).
    cpu_compute = backend.device == "cpu" and label.endswith("(CPU time)")
    limit_s = peer_wait_s(cfg.timeout_s)  # compute longer than peers wait for it ends the run (ComputeTimeout)
    clock = CpuClock(limit_s) if cpu_compute else SleepClock(limit_s)
    if backend.launches_async:  # as DDP's Reducer: the library queues the calls
        ctx.channel = WorkChannel(buffers, clock, buffers[0].device if buffers else None)
    else:
        calls = [backend.prepare("allreduce", buffer, buffer, "sum", 0, True) for buffer in buffers]
        ctx.channel = ThreadChannel(calls, backend.synchronize, clock)
    sys.setswitchinterval(1e-4)  # the spinning main thread hands the GIL to the waiter thread within 0.1 ms
    ddp_text = (f", DDP's own work {ddp / 1e3:.2f} ms (measured at 1 rank: half with the backward, half after the "
                f"last allreduce)") if label.startswith("measured") else ""  # flops and none have no DDP term
    ctx.start(label, [f"compute per step ({label}): forward {forward / 1e3:.2f} ms, backward {backward / 1e3:.2f} ms, "
                      f"optimizer {update / 1e3:.2f} ms{ddp_text}; allreduces launched as gradients are "
                      f"ready, overlapping the backward",
                      "step = compute + exposed + other: exposed is the wait after the backward while an allreduce "
                      "is in flight (at most comm); other is the rest (the compute's wall time past its "
                      + ("CPU time: descheduled, or sharing a core with the communication)" if cpu_compute else
                         "own: a late wake-up, a thread hand-off)")],
              {"compute_split_us": {"forward": forward, "backward": backward, "optimizer": update, "ddp": ddp}})
    backend.barrier()
    started = None
    for index in range(cfg.warmup_steps + cfg.steps):
        if index == cfg.warmup_steps:
            started = time.process_time(), time.thread_time()
        times = run_step(plan, clock, ctx.channel)
        ctx.record(index, {"compute_us": times.compute_us, "comm_us": times.comm_us,
                           "exposed_comm_us": times.exposed_comm_us, "step_us": times.step_us,
                           "other_us": times.other_us})
    if backend.device == "cpu" and started is not None:  # the rank's other threads: the communication's CPU
        comm_cpu_s = (time.process_time() - started[0]) - (time.thread_time() - started[1])
        allreduced = sum(b.nbytes for b in ctx.buckets) * cfg.steps
        ctx.fixed["comm_cpu_gbps"] = allreduced / comm_cpu_s / 1e9 if comm_cpu_s > 0 and allreduced else None


def run_proxy(cfg, launch, argv: list[str]) -> int:
    """The `proxy` job on this rank; returns the exit code."""
    return run_rank(cfg, launch, argv, _replay_steps, kind="proxy")
