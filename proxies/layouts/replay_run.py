"""The `proxy --layout` body on one rank: the compute the replay emulates (a rate, the rank's own pieces
measured here, or a hardware file's compute block), the header that says what runs, then each step of
proxies/layouts/replay.py's LayoutReplay as a record. proxies/replay.py starts it on every rank."""
from __future__ import annotations

from dataclasses import asdict

from commbench.launch import peer_wait_s
from commbench.proxies.layouts.calls import layer_calls
from commbench.proxies.layouts.compute import measure_on_ranks
from commbench.proxies.layouts.pieces import RankCompute
from commbench.proxies.layouts.replay import LayoutReplay


def replay_layout_steps(ctx) -> None:
    """The `proxy --layout` body on one rank (proxies/context.py's RankContext): the header, then each step's
    record."""
    import torch

    cfg, backend = ctx.cfg, ctx.backend
    par = cfg.layout
    shape = ctx.profile.transformer
    torch.set_num_threads(1)  # the ranks share the host's cores, as train --layout's do
    rate = cfg.tflops * 1e6 if cfg.compute == "flops" and cfg.tflops else 0.0
    measured, cpu_time = measure_on_ranks(ctx, par, shape) if cfg.compute == "measured" else (None, False)
    if cfg.compute == "block":
        from commbench.costmodel.compute import compute_from_dict
        from commbench.proxies.layouts.pieces import from_block

        block = compute_from_dict(cfg.compute_block)
        measured = from_block(block, par, shape, cfg.microbatch, par.coords(backend.rank)["pp"],
                              block.meta.get("dtype", "float32"))
        cpu_time = block.cpu_time  # spun as it was measured: this thread's CPU time
    replay = LayoutReplay(par, shape, ctx.profile, backend.rank, cfg.microbatch, checkpointing=cfg.checkpointing,
                          rate=rate, limit_s=peer_wait_s(cfg.timeout_s), measured=measured, cpu_clock=cpu_time)
    backend.barrier()
    source = f"the compute block of {cfg.compute_block['device']}" if cfg.compute == "block" else "measured"
    label = f"flops at {cfg.tflops:g} TFLOP/s" if rate else \
        (source + (" (CPU time)" if cpu_time else "")) if measured else "none"
    per_step = "; ".join(f"{dim} {c.collective} x{c.count} {c.phase} of {c.nbytes:,d} B"
                         for dim in ("tp", "cp", "ep") for c in layer_calls(par, shape, cfg.microbatch,
                                                                            cfg.checkpointing, shape.moe)
                         if c.dim == dim)
    ctx.batch = cfg.microbatch * par.microbatches  # sequences per replica and step
    ctx.start(label, [f"layout {par.name} on {par.world} ranks: stage {replay.stage} of {par.pp} here, "
                      f"{par.microbatches} micro-batch(es) of {cfg.microbatch} sequence(s) of {shape.seq_len} tokens, "
                      f"{'no' if cfg.checkpointing == 'none' else cfg.checkpointing} activation checkpointing; "
                      "per layer and micro-batch: "
                      f"{per_step or 'no calls'}" + (f"; pipeline {par.pp_schedule}" + (
                          f" with {par.virtual_stages} virtual stages" if par.virtual_stages > 1 else "") +
                          f", sends of {replay.boundary_nbytes:,d} B" if par.pp > 1 else ""),
                      "compute emulated (" + label + _measured_text(measured) + "); step = compute + exposed + "
                      "other: exposed is the time the rank waited for its calls and its pipeline neighbours (comm = "
                      "exposed); " + _dp_text(replay)],
              {"layout": par.to_dict(), **({"layout_compute_us": asdict(measured)} if measured else {})})
    ctx.fixed["layout"] = par.to_dict()
    backend.barrier()
    for index in range(cfg.warmup_steps + cfg.steps):
        figures = replay.step()
        ctx.record(index, {"compute_us": figures.compute_us, "comm_us": figures.exposed_us,
                           "exposed_comm_us": figures.exposed_us, "step_us": figures.step_us,
                           "other_us": figures.other_us},
                   {"layout": par.name, "exposed_by_dim_us": dict(figures.by_dim_us)})


def _measured_text(measured: RankCompute | None) -> str:
    return f": {measured.text()} per micro-batch (optimizer: per step), each the slowest rank's" if measured else ""


def _dp_text(replay: LayoutReplay) -> str:
    par, plan = replay.par, replay.dp_plan
    if plan is None:
        return "no data-parallel replicas"
    by = ", ".join(f"{n} {c} ({b / 2**20:.2f} MiB)" for (c, g), (n, b) in plan.bytes_by().items() if g != "cross")
    return (f"data parallel: setup {par.setup} on dp x cp = {par.dp * par.cp} ranks, {by or 'no calls'} of this "
            "stage's share, overlapped with the rank's last forward and backward as the setup's plan issues them")
