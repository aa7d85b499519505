"""Stragglers: a synchronous data-parallel step waits for its slowest rank, so a step on N ranks
lasts the maximum of N ranks' own times, and that maximum grows with N even when every rank is
alike (docs/model.md, "Terms the model counts").

The distribution comes from measured steps (a proxy or training run's step records, warm-up left
out), as ratios to their median. If N ranks draw their steps independently from it, the expected
maximum of N draws from the measured (empirical) distribution is exact:

    E[max of N] = sum_i x_(i) ((i/n)^N - ((i-1)/n)^N)   over the n sorted ratios x_(1) <= ... <= x_(n)

The delay a step of N ranks adds over one rank's median is `median x (E[max of N] - 1)`. It cannot
exceed the largest step measured: n steps say nothing about a rarer, longer one, so the delay at
N >> n is a lower bound (said in the output).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commbench.results import read_records


class JitterError(ValueError):
    """Step records that cannot give a distribution (one line)."""


MIN_STEPS = 5


def step_ratios(records: Sequence[dict]) -> np.ndarray:
    """The measured steps of a 1-rank run (proxy or train) after warm-up, each over their median. On more
    ranks every step already waits for the slowest rank (its records hold the maximum, not one rank's
    own time), so those runs are refused."""
    runs = {r.get("run_id") for r in records if r.get("record") == "step"}
    if len(runs) > 1:
        raise JitterError(f"steps of {len(runs)} runs: give one run's records (their medians differ, pooled they "
                          f"would read as jitter)")
    worlds = {r.get("world_size") for r in records if r.get("record") == "proxy"}
    worlds |= {len(r["ranks"]) for r in records if r.get("record") == "header" and isinstance(r.get("ranks"), list)}
    if worlds - {1, None}:
        raise JitterError(f"a run of {max(w for w in worlds if w)} ranks: its steps already wait for the slowest "
                          f"rank; give a 1-rank run's steps (proxy or train -N 1)")
    times = [float(r["step_us"]) for r in records if r.get("record") == "step" and not r.get("warmup")
             and isinstance(r.get("step_us"), (int, float)) and r["step_us"] > 0 and np.isfinite(r["step_us"])]
    if len(times) < MIN_STEPS:
        raise JitterError(f"{len(times)} measured step time(s) in the records; a step-time distribution needs at "
                          f"least {MIN_STEPS} (run more --steps)")
    values = np.sort(np.array(times))
    return values / np.median(values)


def expected_max(ratios: np.ndarray, n: int) -> float:
    """E[max of n independent draws] from the empirical distribution of `ratios`."""
    x = np.sort(np.asarray(ratios, dtype=float))
    k = len(x)
    cdf = np.arange(1, k + 1) / k
    weights = cdf ** n - (cdf - 1 / k) ** n
    return float(np.dot(weights, x))


def load_ratios(path: str) -> np.ndarray:
    """step_ratios of a JSON Lines file (JitterError, one line, for a file without enough steps)."""
    try:
        records = read_records(path)
    except (OSError, ValueError) as exc:  # a RecordError names the file itself
        message = str(exc).splitlines()[0]
        raise JitterError(message if message.startswith(path) else f"{path}: {message}") from None
    try:
        return step_ratios(records)
    except JitterError as exc:
        raise JitterError(f"{path}: {exc}") from None
