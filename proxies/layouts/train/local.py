"""Parallel layouts trained for real on CPU ranks: the ground truth of the layout plans.

A layout runs a small transformers LlamaForCausalLM (`Trained`: a profile's TransformerShape and a batch;
an expert-parallel MoE in place of every MLP for EP) on a 4-D mesh ("pp", "dp", "cp", "tp"), tp innermost;
EP groups are ep consecutive ranks of the flattened (dp, cp) ranks (proxies/layouts/train/build.py builds it
on a rank). `run_layout` trains it on an initialised gloo group and traces each call of the last steps
(proxies/layouts/train/trace.py); `train_layouts` spawns the local ranks.

What torch 2.14.1 issues per optimizer step, per rank (tests/unit/proxies/layouts/train/test_local_layouts.py pins
each line on 4 gloo ranks). b sequences of s tokens per data-parallel rank, h hidden, L layers, f the
FFN, kv = kv_heads x head_dim, V vocabulary, E experts, k top-k, M micro-batches, fp32 (4 bytes);
bytes are nccl-tests' size (the larger per-rank buffer):

  dimension      collective            group  bytes                  calls per step
  TP             allreduce             tp     4bsh                   7L: 2 forward (o, down), 5 backward
                                                                     (q, k, v, gate, up: one each, not 2)
  TP + SP        allgather             tp     4bsh                   4L + 2 (2 forward + 2 backward per
                                                                     layer; entering backward, leaving forward)
                 reduce_scatter        tp     4bsh                   4L (2 forward + 2 backward per layer)
                 allreduce             tp     4h                     2L (the SequenceParallel norms' weights)
  PP             send, recv            pp     4(b/M)sh               M x (stages of this rank not last +
                                                                     stages not first), each
  CP (ring)      send, recv            cp     4 x 2b(s/cp)kv         L(3cp - 2): cp - 1 forward, cp - 1
                                                                     backward, cp gradients going home
  EP             alltoall (int64)      ep     8E                     L (per-expert counts, forward only)
                 alltoall              ep     4bskh sent or received 4L (dispatch, combine, their transposes)
  DP (FSDP2)     allgather             dp     a unit's bytes         2 per layer unit (with PP: M + 1), 1 root
                 reduce_scatter        dp     a unit's bytes         1 per unit, 1 per root
  DP (DDP)       allreduce             dp     the rank's parameters  1 per stage (one bucket here: under 1 MiB)
                 broadcast             dp     4 head_dim             1 without PP (the rotary buffers), 0 with

A unit's bytes are the decoder layer's parameters on this rank: (2h^2 + 2h kv + 3hf) / tp + 2h (norms
replicated over TP), or with EP 2h^2 + 2h kv + Eh + 2h on "dp" and (E / ep) 3hf on "edp" (the ranks
holding the same experts); the root is the embedding, the final norm and the output layer (on a
pipeline, the first stage's and the last stage's parts); with CP, FSDP shards over "dp_cp".
Where this differs from the textbook: TP's backward issues one allreduce per column-parallel linear
(each redistributes its own replicated input), not Megatron's one per block; FSDP2 under a pipeline
gathers a unit in each micro-batch's forward (reshard after forward) but once in the backward and
reduce-scatters once (torch.distributed.pipelining defers gradient sync to the last micro-batch), and DDP
under a pipeline allreduces once a step, for the same reason. Beside a pipeline, CP, EP and SP issue per
micro-batch what they issue per step without one, on the stage's layers (docs/layouts.md).
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

from commbench.proxies.layouts.train.build import build_layout
from commbench.proxies.layouts.train.model import Trained, check_trainable
from commbench.proxies.layouts.train.trace import trace_mode

__all__ = ["LayoutRun", "Trained", "build_layout", "run_layout", "train_layouts", "trained_shape"]


def trained_shape(par, transformer, microbatch: int) -> Trained:
    """The shape a layout (proxies/layouts/parallelism.py's Parallelism, as `--layout` spells it) trains of a profile's
    transformer here: each data-parallel rank runs `microbatch` x the pipeline's micro-batches sequences a step.
    One ValueError for what this trainer cannot run: where there are replicas, a data-parallel part other
    than DDP (`ddp`) or FSDP2 (`fsdp-full`), or DDP beside expert parallelism; the experts' own tensor
    parallelism (etp1); micro-batches without a pipeline."""
    from commbench.proxies.setups import SETUPS

    setup = SETUPS.get(par.setup)
    # FSDP2 sharding over every replica, resharded after forward (fsdp-full); DDP's own buckets, no comm hook (ddp)
    fsdp = setup is not None and setup.trains_as == "fsdp" and setup.reshard_after_forward and not setup.fixed
    ddp = setup is not None and setup.trains_as == "ddp" and not setup.comm_hook and "bucket_mb" in setup.knobs
    if par.dp * par.cp > 1 and not (fsdp or ddp):
        raise ValueError(f"train --layout keeps the data-parallel replicas with DDP or FSDP2: spell it ddp{par.dp} "
                         f"or fsdp{par.dp} (--setup ddp or fsdp-full), not setup {par.setup}")
    if par.dp * par.cp > 1 and par.ep > 1 and not fsdp:
        raise ValueError(f"train --layout shards the experts' replicas with FSDP2: beside ep spell the data-parallel "
                         f"part fsdp{par.dp}, not {par.setup}")
    if par.expert_tp is not None:
        raise ValueError("train --layout draws expert parallelism from the dp x cp ranks only: etp1 is not trained")
    if par.pp == 1 and par.microbatches > 1:
        raise ValueError("train --layout runs micro-batches through a pipeline only: without pp give --microbatch "
                         "(sequences per step), not --microbatches")
    trained = Trained.of(transformer, batch=microbatch * par.microbatches)
    check_trainable(par, trained)
    return trained


@dataclass
class LayoutRun:
    """One rank's run: the calls of each traced step, the step times, the losses, its mesh coordinates."""
    rank: int
    coordinates: dict
    calls: list = field(default_factory=list)  # one list of trace.Call per traced step
    step_time_us: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    peak: dict | None = None  # memory=True: the last step's peak bytes by kind (MemTracker's), "Total" among them


def run_layout(par, trained: Trained, steps: int = 4, traced: int = 2, memory: bool = False) -> LayoutRun:
    """Train `steps` optimizer steps (SGD) of a layout (a Parallelism) on this rank's initialised gloo process group and
    trace the last `traced`: every call each issues, by mesh dimension; with `memory`, no call traced, the last
    step's peak memory instead (torch's MemTracker: every tensor's storage by kind; not under a pipeline, whose
    stages call a module once per micro-batch, which MemTracker refuses)."""
    import torch.distributed as dist

    built = build_layout(par, trained)
    run = LayoutRun(dist.get_rank(), built.coordinates)
    for index in range(steps):
        calls = []
        last = index == steps - 1
        tracing = trace_mode(calls, built.labels) if index >= steps - traced and not memory else None
        tracker = _memory_tracker(built) if memory and last else None
        start = time.perf_counter()
        with next((m for m in (tracing, tracker) if m is not None), contextlib.nullcontext()):
            run.losses.append(built.step())
        run.step_time_us.append((time.perf_counter() - start) * 1e6)
        if tracing is not None:
            run.calls.append(calls)
        if tracker is not None:
            run.peak = peak_by_kind(tracker)
    return run


def peak_by_kind(tracker) -> dict[str, int]:
    """A MemTracker's peak on the CPU after its step, in bytes by kind ("PARAM", "ACT", ..., "Total")."""
    peak = tracker.get_tracker_snapshot("peak")
    return {str(k).rsplit(".", 1)[-1]: int(v) for k, v in next(v for k, v in peak.items() if str(k) == "cpu").items()}


def _memory_tracker(built):
    """A MemTracker of the step with the model's parameters and the optimizer's state counted from the start."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(built.optimizer)
    return tracker


def _rank(rank: int, world: int, port: int, out, *, layouts: dict, shape_of: dict, steps: int,
          memory: bool = False) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name, par in layouts.items():
            try:
                out.put((name, rank, run_layout(par, shape_of[name], steps, memory=memory)))
            except Exception as error:  # said to the parent, which stops waiting
                out.put((name, rank, f"{type(error).__name__}: {error}"))
                raise
            dist.barrier()
    finally:
        dist.destroy_process_group()


def train_layouts(layouts: dict, shape_of: dict, world: int = 4, steps: int = 4, timeout_s: float = 300,
                  memory: bool = False) -> dict:
    """Spawn `world` local gloo ranks that run each named layout (a Parallelism) in turn: name -> [LayoutRun per rank]
    (run_layout's `memory`: the last step's peak memory rather than its calls). A rank that fails, dies or sends
    nothing for `timeout_s` ends the job with one RuntimeError."""
    import queue

    import torch.multiprocessing as mp

    from commbench.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, out),
                         kwargs={"layouts": layouts, "shape_of": shape_of, "steps": steps, "memory": memory})
             for r in range(world)]
    for proc in procs:
        proc.start()
    results: dict = {name: [None] * world for name in layouts}
    try:
        waited_s, left = 0.0, len(layouts) * world
        while left:
            try:
                name, rank, run = out.get(timeout=1.0)
            except queue.Empty:
                waited_s += 1.0
                dead = [r for r, proc in enumerate(procs) if proc.exitcode not in (None, 0)]
                if dead or waited_s > timeout_s:
                    said = f"rank(s) {dead} died" if dead else f"no rank reported in {timeout_s:g} s"
                    raise RuntimeError(said) from None
                continue
            if isinstance(run, str):
                raise RuntimeError(f"rank {rank} failed in layout {name}: {run}")
            results[name][rank], waited_s, left = run, 0.0, left - 1
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.exitcode is None:
                proc.kill()
    return results
