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

`run_proxy` is the `proxy` job (PROXY_JOB, handed to commbench/job.py); its header, per-step records and summary
are proxies/context.py's, shared with `train`, inside the rank frame of every job
(backends/rank_frame.py).
"""
from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from commbench import collectives as C
from commbench.job import Job
from commbench.launch import peer_wait_s
from commbench.proxies.channels import ThreadChannel, WorkChannel
from commbench.proxies.clocks import CpuClock, SleepClock
from commbench.proxies.comm_plan import CommPlan, describe_calls, points
from commbench.proxies.config import ProxyConfig
from commbench.proxies.context import RankContext, run_rank, summary_from_records
from commbench.proxies.setup_steps import Compute, Placement
from commbench.proxies.timeline import StepTimes, busy_us, flops_times_us, plan_step, run_step, traced_words

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
    if cfg.compute == "trace":
        return (*profile.traced.times_us(ctx.batch), 0.0, 0.0, traced_words(profile))
    if cfg.compute == "block":
        return block_times(ctx)
    import torch

    from commbench.proxies import compute_cache
    from commbench.proxies.train import measure_compute

    device = torch.device("cuda", torch.cuda.current_device()) if ctx.backend.device == "cuda" else "cpu"
    name = compute_cache.key(profile, ctx.batch, ctx.backend.device, cfg.amp, ctx.choice,
                             ctx.launch.local_world_size, host=_host(device))
    cached = compute_cache.read(name) if ctx.backend.rank == 0 and not cfg.remeasure else None
    shared = ctx.backend.agree_max(np.array([*cached[0], float(cached[1])]) if cached else np.full(5, -1.0))
    if shared[0] >= 0:  # rank 0 holds this model's, batch's and setup's figures from an earlier run here
        when = f" {cached[2]}" if cached else ""
        print_once = ctx.backend.rank == 0
        if print_once:
            print(f"# {profile.name}'s compute as measured here before ({compute_cache.path_of(name)}{when}); "
                  f"--remeasure measures it again", flush=True)
        return (*(float(v) for v in shared[:4]),
                "measured, cached" + (" (CPU time)" if shared[4] > 0 else ""))
    repeats = max(2, min(5, cfg.steps))  # as many as the run asks for steps, 2 to 5 (issue 48: always 22 steps)
    measured, cpu_time = measure_compute(profile, ctx.batch, device, cfg.amp, ctx.launch.local_world_size,
                                         ready=ctx.backend.barrier, trust_code=cfg.trust_profile_code,
                                         bucket_mb=cfg.bucket_mb, choice=ctx.choice,
                                         show_progress=ctx.backend.rank == 0, repeats=repeats)
    forward, backward, update, _ = ctx.backend.agree_max(np.array(measured))  # the slowest rank sets the pace
    # DDP's work is a difference of two noisy times, alike on every rank: the least any rank measured
    ddp = -float(ctx.backend.agree_max(np.array([-measured[3]]))[0])
    if ctx.backend.rank == 0:
        compute_cache.write(name, (forward, backward, update, ddp), cpu_time)
    return (float(forward), float(backward), float(update), float(ddp),
            "measured" + (" (CPU time)" if cpu_time else ""))


def block_times(ctx: RankContext) -> tuple[float, float, float, float, str]:
    """--compute block on a data-parallel replay's ranks: one replica's whole model (every layer, the embedding, the
    head with its loss) and the optimizer's update, costed from the hardware file's compute block as the layout
    replay costs a rank's pieces (proxies/layouts/pieces.from_block, no parallel dimension but the setup's); spun
    as the block was timed (this thread's CPU time, or wall time). The setup's own work beyond FSDP2's units is not
    in a block: none is added."""
    from commbench.costmodel.compute import compute_from_dict
    from commbench.proxies.layouts.parallelism import Parallelism
    from commbench.proxies.layouts.pieces import from_block

    cfg, shape = ctx.cfg, ctx.profile.transformer
    block = compute_from_dict(cfg.compute_block)
    dtype = block.meta.get("dtype", "float32")
    rank = from_block(block, Parallelism(dp=ctx.backend.world_size, setup=ctx.choice.name), shape, ctx.batch, 0, dtype)
    forward = shape.layers * rank.layer_forward_us + rank.embed_forward_us + rank.head_forward_us
    backward = shape.layers * rank.layer_backward_us + rank.embed_backward_us + rank.head_backward_us
    # the update over the whole model: the setup's plan divides it by the ranks that shard it (setup_steps.Compute)
    update = from_block(block, Parallelism(setup=ctx.choice.name), shape, ctx.batch, 0, dtype).optimizer_us
    return forward, backward, update, 0.0, \
        f"the compute block of {cfg.compute_block['device']}" + (" (CPU time)" if block.cpu_time else "")


def _host(device) -> str:
    """The host and device a measurement holds for (compute_cache's key)."""
    import os
    import socket

    import torch

    gpu = torch.cuda.get_device_name(device) if getattr(device, "type", device) == "cuda" else ""
    return f"{socket.gethostname()}/{os.cpu_count()}/{gpu}"


def _replay_steps(ctx: RankContext) -> None:
    if not ctx.choice.setup.proxy_buckets or ctx.choice.get("accumulate") > 1:  # the plan holds the no_sync micro-steps
        return _replay_setup(ctx)
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
                           "other_us": times.other_us}, _calls_and_marks(times))
    if backend.device == "cpu" and started is not None:  # the rank's other threads: the communication's CPU
        comm_cpu_s = (time.process_time() - started[0]) - (time.thread_time() - started[1])
        allreduced = sum(b.nbytes for b in ctx.buckets) * cfg.steps
        ctx.fixed["comm_cpu_gbps"] = allreduced / comm_cpu_s / 1e9 if comm_cpu_s > 0 and allreduced else None


def _calls_and_marks(times: StepTimes) -> dict[str, Any]:
    """Rank 0's own figures of a step: its calls and its compute's wall-time marks, [start, end] and [progress,
    wall] in microseconds from the step's start (one decimal: the file stays small, a 0.1 us step is below
    any clock's resolution here)."""
    return {"calls_us": [list(i) for i in times.comm_intervals],
            "compute_marks_us": [[round(x, 1), round(wall, 1)] for x, wall in times.compute_marks]}


def run_proxy(cfg, launch, argv: list[str]) -> int:
    """The `proxy` job on this rank; returns the exit code."""
    if cfg.layout:  # a parallel layout (proxy --layout)
        from commbench.proxies.layouts.replay_run import replay_layout_steps

        return run_rank(cfg, launch, argv, replay_layout_steps, kind="proxy")
    return run_rank(cfg, launch, argv, _replay_steps, kind="proxy")


PROXY_JOB = Job("proxy", f"{__name__}:PROXY_JOB", ProxyConfig, run_proxy, summary_from_records)


# ---------------------------------------------------------------- any setup (proxies/setups.py)


def run_plan(plan: CommPlan, clock, channel) -> StepTimes:
    """Execute one step of `plan`: compute emulated on `clock` up to each point, calls issued on `channel` where
    the plan issues them, and the compute waiting where the plan needs a call done. exposed: the time spent
    waiting (a call in flight each time: the channel returns once it is done)."""
    t0 = clock.now_us()
    marks = [(0.0, 0.0)]  # (compute progress, wall time): the timeline's compute as it ran
    clock.begin()
    exposed = 0.0
    launched = 0
    for x, issued, waited in points(plan):
        clock.compute_until(x)
        marks.append((x, clock.now_us() - t0))
        for i in issued:
            channel.launch(i)
            launched += 1
        if waited:
            before = clock.now_us()
            channel.wait_for(max(waited) + 1)  # calls finish in issue order
            exposed += clock.now_us() - before
            marks.append((x, clock.now_us() - t0))
            clock.rebase(x)
    before = clock.now_us()
    intervals = channel.wait_all()
    exposed += clock.now_us() - before
    step = clock.now_us() - t0
    return StepTimes(plan.compute_us, busy_us(intervals), exposed, step,
                     tuple((start - t0, end - t0) for start, end in intervals),
                     other_us=max(0.0, step - plan.compute_us - exposed), compute_marks=tuple(marks))


def _replay_setup(ctx: RankContext) -> None:
    """The proxy of any setup but plain DDP without accumulation: its plan (proxies/setups.py) executed with
    torch.distributed calls on the groups it names (world, a node's ranks, one rank per node), or commbench's
    schedules (allreduces only)."""
    cfg, backend, profile = ctx.cfg, ctx.backend, ctx.profile
    forward, backward, update, own, label = compute_times(ctx)
    layout = Placement(ctx.launch.nnodes, backend.world_size // ctx.launch.nnodes, backend.device)
    plan = ctx.choice.plan(profile, Compute(forward, backward, update, own), layout)
    issue = _torch_calls(plan, backend, layout) if backend.launches_async else None
    backend.barrier()
    cpu_compute = backend.device == "cpu" and label.endswith("(CPU time)")
    limit_s = peer_wait_s(cfg.timeout_s)
    clock = CpuClock(limit_s) if cpu_compute else SleepClock(limit_s)
    if issue is not None:
        ctx.channel = WorkChannel([], clock, None, issue)
    else:
        calls = [backend.prepare(c.collective, *_buffers(backend, c, layout), "sum", 0, c.collective == "allreduce")
                 for c in plan.comms]
        ctx.channel = ThreadChannel(calls, backend.synchronize, clock)
    sys.setswitchinterval(1e-4)
    by = ", ".join(f"{n} {c}{'' if g == 'world' else ' (' + g + ')'} ({b / 2**20:.1f} MiB)"
                   for (c, g), (n, b) in plan.bytes_by().items())
    ctx.start(label, [f"setup {ctx.choice.name} ({', '.join(f'{k} {v}' for k, v in ctx.choice.knobs if v is not None)}"
                      f"): per step {by or 'no calls'}; compute per micro-step ({label}): forward {forward / 1e3:.2f} "
                      f"ms, backward {backward / 1e3:.2f} ms, optimizer {update / 1e3:.2f} ms, the setup's own work "
                      f"{own / 1e3:.2f} ms" + (" (measured at 1 rank)" if label.startswith("measured") else ""),
                      "step = compute + exposed + other: exposed is the time the compute waited for a call in flight; "
                      "other is the rest"], {"compute_split_us": {"forward": forward, "backward": backward,
                                                                  "optimizer": update, "ddp": own},
                                              "calls": describe_calls(plan),
                                              "phases": [[p.name, p.unit, p.micro_step, p.start_us, p.end_us]
                                                         for p in plan.phases]})
    backend.barrier()
    for index in range(cfg.warmup_steps + cfg.steps):
        times = run_plan(plan, clock, ctx.channel)
        ctx.record(index, {"compute_us": times.compute_us, "comm_us": times.comm_us,
                           "exposed_comm_us": times.exposed_comm_us, "step_us": times.step_us,
                           "other_us": times.other_us}, _calls_and_marks(times))


def _torch_calls(plan: CommPlan, backend, layout: Placement) -> list:
    """torch.distributed's async call per call of the plan, on its group (gloo or NCCL), buffers shared between
    calls of one shape (they run in issue order; their data stays zeros)."""
    import torch.distributed as dist

    from commbench.backends.torch_calls import issue

    groups = _groups(layout)
    shapes: dict[tuple, tuple] = {}
    out = []
    for comm in plan.comms:
        key = (comm.collective, comm.nbytes, comm.dtype, comm.group)
        if key not in shapes:
            shapes[key] = _buffers(backend, comm, layout)
        send, recv = shapes[key]
        group = groups[comm.group]
        out.append(lambda c=comm.collective, s=send, r=recv, g=group: issue(dist, c, s, r, g))
    return out


def _groups(layout: Placement) -> dict:
    """world, this rank's node and this rank's cross-node group: every rank makes every group, in one order."""
    import torch.distributed as dist

    rank, per = dist.get_rank(), layout.ranks_per_node
    groups = {"world": None}
    if layout.nodes > 1 and per > 1:
        for node in range(layout.nodes):
            group = dist.new_group(list(range(node * per, (node + 1) * per)))
            if rank // per == node:
                groups["node"] = group
        for local in range(per):
            group = dist.new_group([local + node * per for node in range(layout.nodes)])
            if rank % per == local:
                groups["cross"] = group
    else:  # one node (node = world) or one rank per node (cross = world)
        groups["node"] = groups["cross"] = None
    return groups


def _buffers(backend, comm, layout: Placement) -> tuple:
    """(send, recv) of a call: an allreduce in place, an all-gather from its shard, a reduce-scatter to it."""
    dtype = C.resolve_dtype(comm.dtype)
    size = {"world": layout.world, "node": layout.ranks_per_node, "cross": layout.nodes}[comm.group]
    count = comm.nbytes // dtype.itemsize // size * size
    full = backend.alloc(count, dtype)
    backend.fill(full, 0.0)
    if comm.collective == "allreduce":
        return full, full
    shard = backend.alloc(count // size, dtype)
    backend.fill(shard, 0.0)
    return (shard, full) if comm.collective == "allgather" else (full, shard)
