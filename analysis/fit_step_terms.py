"""Step terms fitted from a machine's own proxy runs: what `commbench fit RUN.jsonl` writes as the hardware file's
`step_terms` block (commbench/step_terms.py; docs/model.md, "Step terms"), each term with source `fitted`.

A replay's step splits exactly into compute (as planned), exposed communication and other, the rest of its wall
time (proxies/steps.py). The model (analysis/scaling.py) says what the other holds: each call overlapped with the
compute takes the share s / (1 + s) of its time from it (`overlap_slowdown` s), and the framework spends
`per_bucket_us` on each call. So over the measured steps of multi-rank runs

    other_us = a * overlapped_us + b * calls + c,   overlapped_us = comm_us - exposed_comm_us,

fitted by non-negative least squares, gives s = a / (1 - a) and per_bucket_us = b; c takes what neither explains
(a rank descheduled by the host's other work), so it does not land in either term. `b` is fitted only where the
runs differ in their calls per step (two --bucket-mb), and `a` only where the overlapped time varies (else each is
confounded with c): a term the runs cannot pin keeps the file's value (or its class default), said so. `step_cv`
comes from 1-rank runs (no communication): the coefficient of variation of their steps, the median over runs.

Only replays count (a `proxy` summary of kind proxy): a prediction's other is the model's own, and a training run
records its step alone. A GPU replay sleeps for its compute, so no call can slow it: `overlap_slowdown` is fitted
from CPU replays only (a CPU replay spins on its thread's CPU time, which the library's threads take).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from commbench.step_terms import CEILINGS, StepTerms, Term, defaults

MIN_STEPS = 4  # measured multi-rank steps a fit of the other needs (three unknowns)
MIN_CV_STEPS = 10  # steps of a 1-rank run its CV is taken from
KEPT = "kept: the hardware file's own value, or its class default"  # what a term the runs do not pin keeps


class StepTermsFitError(ValueError):
    """Runs from which no step term can be fitted (one line saying why)."""


@dataclass(frozen=True)
class StepRow:
    """One measured step of a replay: its slowest rank's figures."""
    run: str  # run_id
    world_size: int
    device: str  # cpu or cuda
    other_us: float
    overlapped_us: float  # comm_us - exposed_comm_us: communication in flight beside the compute
    calls: int  # collective calls per step
    step_us: float


def step_rows(records: list[dict[str, Any]]) -> tuple[list[StepRow], list[str]]:
    """The measured steps of every replay in `records` (several runs, several files), and a note for each run
    left out and why."""
    runs: dict[str, dict[str, Any]] = {}
    for r in records:
        kind = r.get("record")
        if kind in ("header", "proxy", "step") and r.get("run_id"):
            run = runs.setdefault(r["run_id"], {"steps": []})
            if kind == "step":
                run["steps"].append(r)
            else:
                run[kind] = r
    rows, notes = [], []
    for run_id, run in runs.items():
        if not run["steps"]:
            continue
        header = run.get("header", {})
        fields = header.get("summary_fields") if isinstance(header.get("summary_fields"), dict) else {}
        info = {**header, **fields, **run.get("proxy", {})}  # the header's summary fields: a run cut short has them
        if info.get("kind") != "proxy":
            notes.append(f"run {run_id}: kind {info.get('kind') or 'unknown'}, not a replay: its steps have no "
                         f"measured split into compute, communication and other")
            continue
        if "world_size" not in info:
            notes.append(f"run {run_id}: no world size in its header or summary: left out")
            continue
        config = info.get("config") if isinstance(info.get("config"), dict) else {}
        device = info.get("device") or config.get("device") or "cpu"
        for step in run["steps"]:
            row = _row(run_id, step, int(info.get("world_size") or 1), device, info.get("buckets"))
            if row is not None:
                rows.append(row)
    return rows, notes


def _row(run_id: str, step: dict[str, Any], world: int, device: str, buckets: Any) -> StepRow | None:
    values = [step.get(k) for k in ("other_us", "comm_us", "exposed_comm_us", "step_us")]
    if step.get("warmup") or any(not isinstance(v, (int, float)) for v in values):
        return None
    other, comm, exposed, total = (float(v) for v in values)
    calls = len(step["calls_us"]) if isinstance(step.get("calls_us"), list) else buckets
    if not isinstance(calls, int):
        return None
    return StepRow(run_id, world, device, other, max(0.0, comm - exposed), calls, total)


def fit_step_terms(rows: list[StepRow], device: str, evidence: str,
                   start: StepTerms | None = None) -> tuple[StepTerms, list[str]]:
    """The step terms `rows` support, each `fitted` with `evidence` (where the runs came from) and the figures
    it rests on; a term they do not pin keeps its value in `start` (the hardware file's own block), else `device`'s
    class default. Notes: each term not fitted, and why. StepTermsFitError where no term could be fitted."""
    base = start or defaults(device)
    notes: list[str] = []
    terms = _other_terms(base, [r for r in rows if r.world_size > 1], evidence, notes)
    terms = _cv_term(terms, [r for r in rows if r.world_size == 1], evidence, notes)
    if all(getattr(terms, name).source != "fitted" for name in ("overlap_slowdown", "per_bucket_us", "step_cv")):
        raise StepTermsFitError("no step term could be fitted from these runs: " + "; ".join(notes))
    return terms, notes


def _other_terms(base: StepTerms, rows: list[StepRow], evidence: str, notes: list[str]) -> StepTerms:
    """overlap_slowdown and per_bucket_us from the multi-rank steps' other time (the module's regression)."""
    if len(rows) < MIN_STEPS:
        notes.append(f"overlap_slowdown and per_bucket_us: {len(rows)} measured step(s) of multi-rank replays, "
                     f"at least {MIN_STEPS} needed")
        return base
    cpu = [r for r in rows if r.device == "cpu"]
    overlapped = np.array([r.overlapped_us for r in rows])
    calls = np.array([float(r.calls) for r in rows])
    fit_overlap = len(cpu) == len(rows) and np.ptp(overlapped) > 1e-3 * max(overlapped.max(), 1.0)
    fit_calls = len(set(calls)) > 1
    columns = {"overlapped": overlapped, "calls": calls, "rest": np.ones(len(rows))}
    used = [name for name, keep in (("overlapped", fit_overlap), ("calls", fit_calls), ("rest", True)) if keep]
    coefficients = _nnls(np.column_stack([columns[n] for n in used]), np.array([r.other_us for r in rows]))
    fitted = dict(zip(used, coefficients))
    runs = len({r.run for r in rows})
    worlds = sorted({r.world_size for r in rows})
    ranks = f"{worlds[0]}" if len(worlds) == 1 else f"{worlds[0]}-{worlds[-1]}"
    said = (f"{evidence}: {len(rows)} measured steps of {runs} replay(s) at {ranks} ranks, other = a x overlapped "
            f"comm + b x calls + c, non-negative least squares: a {fitted.get('overlapped', 0):.4g}, b "
            f"{fitted.get('calls', 0):.4g} us, c {fitted['rest']:.4g} us")
    out = base
    if not fit_overlap:
        why = "a GPU replay sleeps for its compute" if len(cpu) < len(rows) else "the overlapped time never varies"
        notes.append(f"overlap_slowdown not fitted ({why}): {KEPT}")
    elif fitted["overlapped"] >= CEILINGS["overlap_slowdown"] / (1 + CEILINGS["overlap_slowdown"]):
        notes.append(f"overlap_slowdown not fitted: a = {fitted['overlapped']:.3g}, beyond the term's ceiling "
                     f"{CEILINGS['overlap_slowdown']:g}: {KEPT}")
    else:
        a = fitted["overlapped"]
        out = replace(out, overlap_slowdown=Term(a / (1 - a), "fitted", f"{said}; s = a / (1 - a)"))
    if not fit_calls:
        notes.append(f"per_bucket_us not fitted (every step made {int(calls[0])} calls: give runs with different "
                     f"--bucket-mb): {KEPT}")
    elif fitted["calls"] > CEILINGS["per_bucket_us"]:
        notes.append(f"per_bucket_us not fitted: b = {fitted['calls']:.3g} us, beyond its ceiling: {KEPT}")
    else:
        out = replace(out, per_bucket_us=Term(fitted["calls"], "fitted", f"{said}; per_bucket_us = b"))
    return out


def _nnls(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares, each column scaled to unit size first (us and counts differ by orders)."""
    from scipy.optimize import nnls

    scale = np.maximum(np.abs(design).max(axis=0), 1e-12)
    solution, _ = nnls(design / scale, y)
    return solution / scale


def _cv_term(terms: StepTerms, rows: list[StepRow], evidence: str, notes: list[str]) -> StepTerms:
    """step_cv from the 1-rank replays: each run's steps' coefficient of variation, the median over runs."""
    by_run: dict[str, list[float]] = {}
    for r in rows:
        by_run.setdefault(r.run, []).append(r.step_us)
    cvs = [float(np.std(v, ddof=1) / np.mean(v)) for v in by_run.values() if len(v) >= MIN_CV_STEPS and np.mean(v) > 0]
    if not cvs:
        notes.append(f"step_cv not fitted (no 1-rank replay of {MIN_CV_STEPS} or more measured steps): {KEPT}")
        return terms
    cv = float(np.median(cvs))
    if cv > CEILINGS["step_cv"]:
        notes.append(f"step_cv not fitted: {cv:.3g}, beyond its ceiling: {KEPT}")
        return terms
    return replace(terms, step_cv=Term(cv, "fitted", f"{evidence}: the steps' CV of {len(cvs)} 1-rank replay(s), "
                                                     f"median {100 * cv:.2f}%"))
