"""probe: the planner's measurement (plan.py), in a process of its own: `python -m
commbench.backends.shm.probe LIBRARY [LIMIT_S]` prints one JSON object, the chosen plan and the figures behind
it (with LIMIT_S, its rounds, then its size, are cut to what fits half of it: shaped_to_budget).

Two forked workers (the two ranks of a 2-rank ring on two cores) run the fused reduce-and-push of
shm_native.c on shared mappings (shmem pages, as the shm segments are), started together and timed
each, in the two forms the backend runs at the memory bound: in place (rank r reduces half r of its
buffer with the peer's half r and stores the result in both) and out of place (the inputs read from
the ranks' sources, the result stored in their outputs). A candidate's score in a round is the sum of
the two forms' times (max over the workers, median over repetitions); for the stores, which are chosen
for each form apart (nt out of place, nt_in_place in place), that form's time alone.

The knobs are decided one after another (block, then the stores, then the prefetch distance), each
over ROUNDS rounds in alternating order (ABBA); a candidate replaces the incumbent (the built-in
value, then each stage's choice) only where the median of its per-round ratios to the incumbent is at
least KEEP_UNLESS and their lower quartile at least 1: noise alone does not move the plan. A few
seconds on an idle 2-core VM.

The probe dies with the rank that started it, and its workers with the probe (lifetime.die_with_parent): a
rank killed while it measures leaves no probe running.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict, replace

import numpy as np

from commbench.backends.shm import native as shm_native
from commbench.backends.shm.plan import PARENT_VAR, Plan
from commbench.lifetime import die_with_parent

ROUNDS, REPS = 6, 2
KEEP_UNLESS = 1.03  # and the lower quartile of the ratios at least 1: most rounds agree
NT = ("both", "out", "push", "none")
STAGES = (("block_bytes", (512, 1024, 2048, 4096, 8192, 16384)), ("nt_in_place", NT), ("nt", NT),
          ("prefetch_bytes", (0, 1024, 4096)))
FORMS = {"nt_in_place": (0,), "nt": (1,)}  # the forms (0 in place, 1 out of place) a stage is scored on; else both
MIN_PROBE_BYTES = 16 << 20  # per rank: past the caches (at least the LLC, shm_native.llc_bytes)
# Every candidate runs in both forms, REPS timed and one warm-up, in each round. A probe at the LLC's size must
# also fit its time limit: on the 16-core Intel host of an H100 machine (a 300 MiB LLC as the VM reports it,
# shm ~50 ms a call at 256 MiB) it did not fit the 20 s a benchmark's job gave it, and every job ran the built-in
# values (docs/performance.md, "An Intel host"). So one call is timed first; what does not fit runs fewer rounds
# (MIN_ROUNDS at least), and only then on smaller buffers: the knobs are for data past the caches.
OPS_PER_ROUND = 2 * (REPS + 1) * sum(len(candidates) for _, candidates in STAGES)
MIN_ROUNDS = 2
PAIRED_SLOWDOWN, BUDGET_SHARE = 1.5, 0.5  # two ranks at once against one alone; the share of the limit it may use


def _shared(count: int) -> np.ndarray:
    """float32, 64-byte aligned, in a shared anonymous mapping (shmem: what the fork passes on)."""
    raw = np.frombuffer(mmap.mmap(-1, count * 4 + 64, flags=mmap.MAP_SHARED), dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    view = raw[skip:skip + count]
    view[...] = 1.0  # first touch: page faults are not bandwidth
    return view


def _op(rank: int, buffers: dict, out_of_place: bool) -> shm_native.Op:
    half = len(buffers["src"][0]) // 2
    part = slice(rank * half, (rank + 1) * half)
    mine, theirs = buffers["src"][rank][part], buffers["src"][1 - rank][part]
    out, out2 = (buffers["dst"][rank][part], buffers["dst"][1 - rank][part]) if out_of_place else (mine, theirs)
    return shm_native.Op(kind=shm_native.OP_REDUCE, dtype=0, reduction=0, stream=1, out=out.ctypes.data,
                         out2=out2.ctypes.data, a=mine.ctypes.data, b=theirs.ctypes.data, count=half)


def _worker(rank: int, library_path: str, plans: list[dict], buffers: dict, barrier, times, rounds: int,
            parent: int) -> None:
    die_with_parent(parent_pid=parent)  # the probe killed (its rank was): the workers go with it
    run = shm_native._load(library_path).cb_shm_run
    calls = []
    for values in plans:
        for out_of_place in (False, True):
            ops = (shm_native.Op * 1)(_op(rank, buffers, out_of_place))
            context = shm_native.Context(nt_bytes=0, **Plan(**values).context_values())
            calls.append((ops, context))
    slot = 0
    for rnd in range(rounds):
        order = range(len(plans)) if rnd % 2 == 0 else reversed(range(len(plans)))
        for index in order:
            for form in (0, 1):
                ops, context = calls[index * 2 + form]
                for rep in range(REPS + 1):  # one warm-up
                    barrier.wait()
                    start = time.perf_counter()
                    run(ctypes.addressof(ops), 1, 0, 0, ctypes.addressof(context))
                    elapsed = time.perf_counter() - start
                    if rep:
                        times[(((rnd * len(plans) + index) * 2 + form) * REPS + rep - 1) * 2 + rank] = elapsed
            slot += 1


def scores(library_path: str, plans: list[dict], buffers: dict, forms: tuple = (0, 1),
           rounds: int | None = None) -> np.ndarray:
    """rounds x plans: each round's score (the sum over `forms` of in place and out of place, seconds) per plan."""
    rounds = rounds or ROUNDS
    context = mp.get_context("fork")
    times = context.Array("d", rounds * len(plans) * 2 * REPS * 2, lock=False)
    barrier = context.Barrier(2, timeout=60)
    workers = [context.Process(target=_worker, args=(r, library_path, plans, buffers, barrier, times, rounds,
                                                     os.getpid()), daemon=True) for r in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(90)
    if any(worker.exitcode != 0 for worker in workers):
        for worker in workers:
            if worker.is_alive():
                worker.kill()
        raise RuntimeError(f"a probe worker failed (exit codes {[w.exitcode for w in workers]})")
    grid = np.array(times[:]).reshape(rounds, len(plans), 2, REPS, 2).max(axis=4)
    return np.median(grid, axis=3)[:, :, list(forms)].sum(axis=2)


def decide(incumbent: Plan, key: str, candidates: tuple, round_scores: np.ndarray) -> tuple[Plan, list[float]]:
    """The stage's choice: the candidate with the best median per-round ratio to the incumbent, where that
    ratio reaches KEEP_UNLESS and its lower quartile 1; else the incumbent. Also each candidate's median
    ratio (incumbent / it)."""
    at = candidates.index(getattr(incumbent, key))
    per_round = [round_scores[:, at] / round_scores[:, i] for i in range(len(candidates))]
    ratios = [float(np.median(r)) for r in per_round]
    best = max(range(len(candidates)), key=lambda i: ratios[i])
    agreed = ratios[best] >= KEEP_UNLESS and float(np.quantile(per_round[best], 0.25)) >= 1.0
    chosen = replace(incumbent, **{key: candidates[best]}) if agreed else incumbent
    return chosen, ratios


def shaped_to_budget(nbytes: int, one_call_s: float, budget_s: float) -> tuple[int, int]:
    """(rounds, bytes per rank) a probe can measure within `budget_s`, given one call of the built-in plan at
    `nbytes` took `one_call_s` alone: ROUNDS at `nbytes` where that fits, else fewer rounds (MIN_ROUNDS at least),
    else MIN_ROUNDS on buffers cut in proportion (whole MiB, MIN_PROBE_BYTES at least, never more than `nbytes`)."""
    allowed_s = BUDGET_SHARE * budget_s
    round_s = OPS_PER_ROUND * PAIRED_SLOWDOWN * one_call_s
    for rounds in range(ROUNDS, MIN_ROUNDS - 1, -1):
        if rounds * round_s <= allowed_s:
            return rounds, nbytes
    cut = int(nbytes * allowed_s / (MIN_ROUNDS * round_s)) >> 20 << 20
    return MIN_ROUNDS, min(nbytes, max(MIN_PROBE_BYTES, cut))


def _one_call_s(library_path: str, buffers: dict) -> float:
    """One in-place call of the built-in plan, rank 0's half, in this process (after one warm-up)."""
    run = shm_native._load(library_path).cb_shm_run
    ops = (shm_native.Op * 1)(_op(0, buffers, False))
    context = shm_native.Context(nt_bytes=0, **Plan().context_values())
    for _ in range(2):
        start = time.perf_counter()
        run(ctypes.addressof(ops), 1, 0, 0, ctypes.addressof(context))
    return time.perf_counter() - start


def probe(library_path: str, nbytes: int, budget_s: float | None = None) -> dict:
    count = nbytes // 4 // 32 * 32
    buffers = {"src": [_shared(count) for _ in range(2)], "dst": [_shared(count) for _ in range(2)]}
    sized, rounds = {}, ROUNDS
    if budget_s is not None:
        one_call_s = _one_call_s(library_path, buffers)
        rounds, nbytes = shaped_to_budget(count * 4, one_call_s, budget_s)
        count = nbytes // 4 // 32 * 32
        buffers = {key: [view[:count] for view in views] for key, views in buffers.items()}
        sized = {"budget_s": budget_s, "llc_bytes": shm_native.llc_bytes(), "one_call_ms": round(one_call_s * 1e3, 3)}
    plan, stages, started = Plan(), [], time.perf_counter()
    for key, candidates in STAGES:
        plans = [asdict(replace(plan, **{key: value})) for value in candidates]
        round_scores = scores(library_path, plans, buffers, FORMS.get(key, (0, 1)), rounds)
        plan, ratios = decide(plan, key, candidates, round_scores)
        stages.append({"knob": key, "candidates": list(candidates), "ratio_to_incumbent": [round(r, 3) for r in ratios],
                       "score_ms": [round(float(np.median(round_scores[:, i])) * 1e3, 3)
                                    for i in range(len(candidates))], "chosen": getattr(plan, key)})
    return {"plan": asdict(plan), "nbytes_per_rank": len(buffers["src"][0]) * 4, "rounds": rounds, "reps": REPS,
            "wall_s": round(time.perf_counter() - started, 2), "stages": stages, **sized}


def main(argv: list[str]) -> int:
    if os.environ.get(PARENT_VAR, "").isdigit():  # the rank that started it (plan.measure): gone, so is the probe
        die_with_parent(parent_pid=int(os.environ[PARENT_VAR]))
    library_path = argv[0]
    budget_s = float(argv[1]) if len(argv) > 1 else None  # the probe's time limit (plan.measure passes it)
    shm_native._load(library_path)  # loaded (and its layout checked) before the fork
    nbytes = max(MIN_PROBE_BYTES, shm_native.llc_bytes())
    print(json.dumps(probe(library_path, nbytes, budget_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
