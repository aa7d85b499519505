"""Experiment 3 of model_step_terms.py: DDP's cost per bucket at 1 rank (no traffic leaves it).

A model of LAYERS linear layers (4.2 MB of parameters) in DDP on a gloo group of this process alone, one
DDP wrapper per bucket cap (find_unused_parameters=True, so the cap sets the buckets from the first step;
without it this torch puts every parameter in one bucket until it rebuilds, which it does not at world
size 1), each step against the same wrapper's step under no_sync() (no bucket copies, no allreduce),
the arms interleaved forward and reverse over ROUNDS rounds. The extra time per step against the number of
buckets, least squares: slope = cost per bucket, intercept = the rest of DDP's own work.
"""
from __future__ import annotations

import os
import tempfile
import time

import method
import numpy as np
from training_steps import stamp, stats

LAYERS, WIDTH, BATCH = 64, 128, 32


def bucket_experiment(caps_mb: list[float], rounds: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = tempfile.NamedTemporaryFile(prefix="commbench-buckets-", delete=False)
    store.close()
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    try:
        arms = {cap: _arm(cap) for cap in caps_mb}
        extra: dict[float, list[tuple[float, float]]] = {cap: [] for cap in caps_mb}
        for index in range(rounds):
            for cap in (caps_mb if index % 2 == 0 else list(reversed(caps_mb))):
                extra[cap].append(_paired_extra_us(*arms[cap], steps))
    finally:
        dist.destroy_process_group()
        os.unlink(store.name)
    return _report(arms, extra)


def _arm(cap_mb: float):
    """(ddp model, input, buckets) for one cap, after two warm-up steps."""
    import torch
    import torch.nn as nn

    torch.manual_seed(1234)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb, find_unused_parameters=True)
    x = torch.randn(BATCH, WIDTH)
    for _ in range(2):
        ddp(x).sum().backward()
    sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))
    return ddp, x, len([s for s in sizes.split(",") if s.strip()])


def _paired_extra_us(ddp, x, _buckets: int, steps: int) -> tuple[float, float]:
    """The medians over `steps` of (DDP step - no_sync step), wall and main-thread CPU time, each pair in
    alternating order. The CPU time is what DDP's hooks and launches cost the thread that computes; other
    processes on a shared host lengthen the wall time, not it."""
    walls, cpus = [], []
    for index in range(steps):
        order = ("ddp", "local") if index % 2 == 0 else ("local", "ddp")
        times = {arm: _step_us(ddp, x, arm == "local") for arm in order}
        walls.append(times["ddp"][0] - times["local"][0])
        cpus.append(times["ddp"][1] - times["local"][1])
    return float(np.median(walls)), float(np.median(cpus))


def _step_us(ddp, x, local: bool) -> tuple[float, float]:
    import contextlib

    ddp.zero_grad(set_to_none=True)
    t0, c0 = time.perf_counter(), time.thread_time()
    with ddp.no_sync() if local else contextlib.nullcontext():
        ddp(x).sum().backward()
    return (time.perf_counter() - t0) * 1e6, (time.thread_time() - c0) * 1e6


def _report(arms: dict, extra: dict[float, list[tuple[float, float]]]) -> dict:
    table = method.Table(["cap (MB)", "buckets", "wall extra (us) [IQR]", "thread CPU extra (us) [IQR]"])
    print("\n## per-bucket: DDP's extra time per step at 1 rank against its buckets\n\n" + table.header())
    rows = []
    for cap, (_ddp, _x, buckets) in arms.items():
        wall, cpu = stats([w for w, _ in extra[cap]]), stats([c for _, c in extra[cap]])
        rows.append({"cap_mb": cap, "buckets": buckets, "extra_wall_us": [w for w, _ in extra[cap]],
                     "extra_cpu_us": [c for _, c in extra[cap]], "wall": wall, "cpu": cpu})
        print(table.row([f"{cap:g}", buckets, f"{wall['median']:.0f} [{wall['q1']:.0f}-{wall['q3']:.0f}]",
                         f"{cpu['median']:.0f} [{cpu['q1']:.0f}-{cpu['q3']:.0f}]"]))
    x = np.array([r["buckets"] for r in rows for _ in r["extra_wall_us"]], dtype=float)
    fits = {}
    for clock in ("wall", "cpu"):
        fits[clock] = fit = _line(x, np.array([v for r in rows for v in r[f"extra_{clock}_us"]], dtype=float))
        print(f"{clock}: per bucket {fit['slope_us']:.1f} us (95% CI {fit['slope_ci_us'][0]:.1f} to "
              f"{fit['slope_ci_us'][1]:.1f}), intercept {fit['intercept_us']:.0f} us, over {len(x)} round medians")
    return {"rows": rows, "fit": fits, "stamp": stamp(), "model": f"{LAYERS} x Linear({WIDTH}, {WIDTH}), batch {BATCH}"}


def _line(x: np.ndarray, y: np.ndarray) -> dict:
    """Least squares y = a + b x, with b's 95% interval (t quantile from scipy)."""
    from scipy import stats as S

    result = S.linregress(x, y)
    half = S.t.ppf(0.975, len(x) - 2) * result.stderr
    return {"slope_us": result.slope, "intercept_us": result.intercept,
            "slope_ci_us": (result.slope - half, result.slope + half), "r2": result.rvalue ** 2}
