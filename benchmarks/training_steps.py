"""The models, trainers and step clocks the DDP-term benchmarks share (model_terms.py, training_phases.py).

Both time the same small CPU models at the same batches, a step whole or phase by phase as
Trainer.phase_times_us does (wall and thread CPU time), and summarise samples the same way
(median, IQR, p90, CV), each result stamped with the time and the load average it ran under.
"""
from __future__ import annotations

import math
import os
import time

import method
import numpy as np

BATCHES = {"resnet18": 4, "resnet50": 4, "alexnet": 8, "vgg16": 1}


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def stamp() -> dict:
    return {"utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "loadavg": load_average()}


def trainer_for(name: str, batch: int, seed: int = 1234):
    import torch

    from commbench.proxies.profile import load_profile
    from commbench.proxies.train import Trainer

    torch.manual_seed(seed)
    return Trainer(load_profile(name), batch, "cpu")


def grad_bytes(trainer) -> int:
    return sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad)


def stats(values: list[float]) -> dict:
    """median, IQR, p90, CV (stdev/mean) of a sample."""
    q1, mid, q3 = method.quartiles(values)
    arr = np.asarray(values, dtype=float)
    return {"n": len(values), "median": mid, "q1": q1, "q3": q3, "p90": float(np.percentile(arr, 90)) if len(arr) else
            math.nan, "mean": float(arr.mean()) if len(arr) else math.nan,
            "cv": float(arr.std(ddof=1) / arr.mean()) if len(arr) > 1 and arr.mean() else math.nan}


def iqr_text(s: dict, scale: float = 1.0, digits: int = 1) -> str:
    return f"{s['median'] * scale:.{digits}f} [{s['q1'] * scale:.{digits}f}-{s['q3'] * scale:.{digits}f}]"


def timed_step(trainer) -> tuple[float, float]:
    """One full step as `commbench train` times it: (wall us, thread CPU us)."""
    w0, c0 = time.perf_counter(), time.thread_time()
    trainer.step()
    return (time.perf_counter() - w0) * 1e6, (time.thread_time() - c0) * 1e6


def phased_step(trainer) -> dict:
    """One step timed phase by phase as Trainer.phase_times_us does, both clocks."""
    marks = [(time.perf_counter(), time.thread_time())]
    loss = trainer.forward()
    marks.append((time.perf_counter(), time.thread_time()))
    trainer.backward(loss)
    marks.append((time.perf_counter(), time.thread_time()))
    trainer.update()
    marks.append((time.perf_counter(), time.thread_time()))
    names = ["forward", "backward", "optimizer"]
    out = {}
    for i, name in enumerate(names):
        out[f"{name}_wall_us"] = (marks[i + 1][0] - marks[i][0]) * 1e6
        out[f"{name}_cpu_us"] = (marks[i + 1][1] - marks[i][1]) * 1e6
    out["sum_wall_us"] = (marks[-1][0] - marks[0][0]) * 1e6
    out["sum_cpu_us"] = (marks[-1][1] - marks[0][1]) * 1e6
    return out
