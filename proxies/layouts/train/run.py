"""`commbench train MODEL --layout SPEC`: the real training of a parallel layout (proxies/layouts/train/build.py:
TP by parallelize_module, pipelining's schedules, ring attention, an expert-parallel MoE, FSDP2 or DDP on
the data-parallel ranks) as one rank of the `train` job, with the header, step records and summary of
`proxy --layout` (proxies/context.py), so that the two files compare step by step.

A step is one optimizer step: every micro-batch's forward and backward (the pipeline's schedule), the
data-parallel reduction, SGD. Its time is the wall time on this rank; the slowest rank's is the step's.
Compute and communication are not told apart in real training (null in the records, as `train`'s)."""
from __future__ import annotations

import gc
import time

from commbench.proxies.layouts.train.build import build_layout
from commbench.proxies.layouts.train.local import trained_shape
from commbench.proxies.layouts.train.model import replicas_wrapper


def train_layout_steps(ctx) -> None:
    """The `train --layout` body on one rank (context.run_rank): build the layout, then time each step."""
    import torch

    cfg, backend = ctx.cfg, ctx.backend
    par = cfg.layout
    trained = trained_shape(par, ctx.profile.transformer, cfg.microbatch)
    shape = trained.transformer
    torch.set_num_threads(1)  # CPU ranks sharing the host's cores, as the replay's
    built = build_layout(par, trained)
    ctx.batch = trained.batch  # sequences per replica and step
    pipeline = (f"; pipeline {par.pp_schedule}" + (f" with {par.virtual_stages} virtual stages"
                                                   if par.virtual_stages > 1 else "")) if par.pp > 1 else ""
    wrapper = {"fsdp": "FSDP2", "ddp": "DDP"}[replicas_wrapper(par)]
    data = f"{wrapper} on dp x cp = {par.dp * par.cp} ranks" if par.dp * par.cp > 1 else "no data-parallel replicas"
    try:
        ctx.start("real", [f"real training of layout {par.name} on {par.world} ranks: a transformers Llama of the "
                           f"profile's shape" + (f" with {shape.experts} experts (top {shape.top_k})"
                                                 if shape.experts else "") +
                           f", {par.microbatches} micro-batch(es) of {cfg.microbatch} sequence(s) of {shape.seq_len} "
                           f"tokens{pipeline}; {data}; SGD momentum 0.9, synthetic tokens, fp32"],
                  {"layout": par.to_dict()})
        ctx.fixed["layout"] = par.to_dict()
        backend.barrier()
        for index in range(cfg.warmup_steps + cfg.steps):
            started = time.perf_counter()
            built.step()
            ctx.record(index, {"compute_us": None, "comm_us": None, "exposed_comm_us": None,
                               "step_us": (time.perf_counter() - started) * 1e6}, {"layout": par.name})
    finally:  # FSDP's and the pipeline's state go before the process groups do
        built = None
        gc.collect()
