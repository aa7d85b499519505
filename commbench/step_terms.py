"""The step terms a hardware file carries beside its links (docs/model.md, "Step terms"): what a training
step loses beyond its collectives, each a figure with where it came from.

- `overlap_slowdown` s: while a collective is in flight beside the compute, the compute runs at 1 / (1 + s) of
  its pace (a CPU rank with no spare core: the library's threads take its core; a GPU: NCCL's kernels take SMs
  and memory bandwidth);
- `step_cv`: the coefficient of variation of one rank's step (jitter); a synchronous step of N ranks waits for
  the expected slowest of N (analysis/stragglers.py);
- `per_bucket_us`: the framework's own time per bucket (hook, launch, wait) on the step's path.

Each term's `source` says where its value came from: `measured` (a benchmark on this class of device, named in
`evidence`), `fitted` (from a run of this machine) or `defaulted` (neither: a class default, said as such). A
file without the block gets its device class's defaults (`defaults`): the CPU figures measured by
benchmarks/model_step_terms.py on the project's 2-core VM, and for GPUs, which no session of this project has
measured, the figures written as defaulted.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from commbench.files import shown

SOURCES = ("measured", "fitted", "defaulted")
# The largest value each term may take: a file beyond it is damaged (the compute 10x slower while a call runs; a
# step's spread 100% of its median; a second of framework time per call).
CEILINGS = {"overlap_slowdown": 10.0, "step_cv": 1.0, "per_bucket_us": 1e6}


class StepTermsError(ValueError):
    """A step_terms block that is not what this module reads (one line; the loader names the file)."""


@dataclass(frozen=True)
class Term:
    value: float
    source: str  # one of SOURCES
    evidence: str  # what the value rests on: a benchmark and its date, a run, or why it is a default


@dataclass(frozen=True)
class StepTerms:
    overlap_slowdown: Term
    step_cv: Term
    per_bucket_us: Term

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return asdict(self)

    def summary(self) -> dict[str, dict[str, Any]]:
        """{name: {value, source}}: what a record keeps of them."""
        return {f.name: {"value": getattr(self, f.name).value, "source": getattr(self, f.name).source}
                for f in fields(self)}

    def said(self) -> str:
        """One line: each term, its value and source."""
        units = {"overlap_slowdown": lambda v: f"{v:.3g}", "step_cv": lambda v: f"{100 * v:.2f}%",
                 "per_bucket_us": lambda v: f"{v:.3g} us"}
        return "; ".join(f"{f.name} {units[f.name](getattr(self, f.name).value)} ({getattr(self, f.name).source}: "
                         f"{shown(getattr(self, f.name).evidence)})" for f in fields(self))  # as the file holds it


NO_GPU = "no GPU was available to this project's sessions: not measured, 0 until a GPU run measures it"
GPU_DEFAULTS = StepTerms(
    overlap_slowdown=Term(0.0, "defaulted", NO_GPU),
    step_cv=Term(0.0025, "defaulted", "PyTorch DDP benchmark README @ bf69c149, 1 GPU in DDP: p95 - p50 of sec/iter "
                                      "over 1.645, median of its 4 models (0.14-0.41%); a published figure, not a "
                                      "measurement of this machine"),
    per_bucket_us=Term(0.0, "defaulted", NO_GPU))
# Measured on the project's 2-core x86-64 VM (docs/model.md, "Step terms"), 2 CPU ranks with one core each.
CPU_DEFAULTS = StepTerms(
    overlap_slowdown=Term(0.486, "measured", "benchmarks/model_step_terms.py --experiments interference, 2026-11-27: "
                                             "GEMM compute alone vs beside a gloo allreduce loop on the same rank, 2 "
                                             "ranks on 2 cores, 16 ABBA pairs, ratio - 1 median 0.486 [IQR "
                                             "0.247-0.703], host load 10-12"),
    step_cv=Term(0.030, "measured", "benchmarks/model_terms.py --experiments stragglers, 2026-11-23: resnet18 batch 4, "
                                    "60 steps at 1 rank, CV 3.0% (load 0.8-2.6; under load 10, 2026-11-27, "
                                    "model_step_terms.py read 29-59%: the host's other jobs, not the CPU)"),
    per_bucket_us=Term(20.0, "measured", "benchmarks/model_step_terms.py --experiments buckets, 2026-11-27: DDP at 1 "
                                         "rank, 1-65 buckets, main-thread CPU time over no_sync(), least-squares slope "
                                         "20.0 us per bucket (95% CI 14.4-25.5)"))
DEFAULTS = {"cpu": CPU_DEFAULTS, "cuda": GPU_DEFAULTS}


def device_class(meta: dict[str, Any]) -> str:
    """"cpu" where a fit says its points ran on CPU ranks (meta.measured_on.device), else "cuda"."""
    measured_on = meta.get("measured_on") if isinstance(meta, dict) else None
    return "cpu" if isinstance(measured_on, dict) and measured_on.get("device") == "cpu" else "cuda"


def defaults(device: str) -> StepTerms:
    """The class defaults of `device` ("cpu"; anything else is a GPU's)."""
    return DEFAULTS["cpu" if device == "cpu" else "cuda"]


def step_terms_from_dict(data: Any, device: str) -> StepTerms:
    """A file's block: an object of terms, each {value, source, evidence}; a term it leaves out takes the class
    default of `device`. StepTermsError (one line) for anything else."""
    if not isinstance(data, dict):
        raise StepTermsError("step_terms must be a JSON object")
    names = [f.name for f in fields(StepTerms)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise StepTermsError(f"step_terms: unknown term {unknown[0]!r} (known: {', '.join(names)})")
    base = defaults(device)
    return StepTerms(**{name: _term(data[name], name) if name in data else getattr(base, name) for name in names})


def _term(data: Any, name: str) -> Term:
    where = f"step_terms.{name}"
    if not isinstance(data, dict):
        raise StepTermsError(f"{where} must be a JSON object with value, source and evidence")
    value, source, evidence = data.get("value"), data.get("source"), data.get("evidence", "")
    try:  # an integer too large for a float overflows here, as a damaged file may hold one
        number = None if isinstance(value, bool) or not isinstance(value, (int, float)) else float(value)
    except OverflowError:
        number = None
    if number is None or not math.isfinite(number) or not 0 <= number <= CEILINGS[name]:
        shown = f"{value!r}" if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
        raise StepTermsError(f"{where}.value must be a number from 0 to {CEILINGS[name]:g}, not {shown}")
    if source not in SOURCES:
        raise StepTermsError(f"{where}.source must be one of {', '.join(SOURCES)}, not {source!r}")
    if not isinstance(evidence, str):
        raise StepTermsError(f"{where}.evidence must be a string")
    return Term(number, source, evidence)
