"""How long `predict-scaling --layout` takes, in process (issue 34's target: under 2 s each): Llama 3.1 405B at
TP8 x PP16 x FSDP64 on 8,192 GPUs, and six layouts of Llama 3.1 70B ranked at 1,024 GPUs; and `--layout auto`'s
search of every layout of Llama 3.1 70B on 1,024 GPUs (issue 47's target: under 10 s). Prints the median of
five runs (the search: three), wall and CPU time, after one warm-up (imports and profile loading in neither).

    python benchmarks/layouts_speed.py
"""
from __future__ import annotations

import functools
import statistics
import time
from dataclasses import replace

from commbench.analysis.predict_layout import Job, rank_layouts
from commbench.costmodel import load_hardware
from commbench.proxies.layouts.parallelism import parse_layout
from commbench.proxies.profile import load_profile

CASES = {
    "llama3.1-405b, tp8sp,pp16,fsdp64 on 8,192 GPUs": ("llama3.1-405b", 8192, ["tp8sp,pp16,fsdp64"]),
    "llama3.1-70b, 6 layouts on 1,024 GPUs": ("llama3.1-70b", 1024, [
        "tp8,fsdp128", "tp8sp,fsdp128", "tp4sp,pp2,fsdp128", "tp8sp,pp4,dp32", "tp8sp,pp4,fsdp32",
        "tp8sp,cp2,fsdp64"]),
}
GLOBAL_BATCH = 2048  # sequences


def run(model: str, gpus: int, texts: list[str]) -> None:
    profile = load_profile(model)
    job = Job(profile.transformer, profile, load_hardware("dgx-h100"), 8, 1, 400.0, peak_tflops=989.5)
    layouts = []
    for text in texts:
        par = parse_layout(text, gpus=gpus)
        layouts.append(replace(par, microbatches=GLOBAL_BATCH // par.dp))
    rank_layouts(job, layouts)


def searched(model: str, gpus: int) -> None:
    from commbench.analysis.layout_search import SearchSpace, search

    profile = load_profile(model)
    job = Job(profile.transformer, profile, load_hardware("dgx-h100"), 8, 1, 400.0, peak_tflops=989.5)
    search(job, profile.transformer, SearchSpace(gpus, 8, gpus, 1))


def timed(label: str, call, repeats: int, target_s: float) -> None:
    call()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    verdict = "met" if statistics.median(wall) < target_s else "MISSED"
    print(f"{label}: median {statistics.median(wall):.3f} s wall ({min(wall):.3f}-{max(wall):.3f}), "
          f"{statistics.median(cpu):.3f} s CPU; target {target_s:g} s: {verdict}", flush=True)


def main() -> None:
    for label, (model, gpus, texts) in CASES.items():
        timed(label, functools.partial(run, model, gpus, texts), 5, 2.0)
    timed("llama3.1-70b, --layout auto on 1,024 GPUs", lambda: searched("llama3.1-70b", 1024), 3, 10.0)


if __name__ == "__main__":
    main()
