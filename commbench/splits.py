"""alltoallv's per-peer counts: which share of its buffer each rank sends each peer.

`--splits uniform` is nccl-tests' alltoallv (src/alltoallv.cu: size/n elements to every peer).
`skewed[:ALPHA[:SEED]]` is what a mixture-of-experts layer's token routing looks like: a few
experts (ranks) are popular, the rest get little, and each sender's mix differs a little. Peer d's
popularity is 1/(1 + its place)^ALPHA in a seeded shuffle of the ranks, and each sender scales it by
its own seeded gamma(8) noise (mean 1, spread 35%). A FILE holds the weights itself: a JSON list of
n rows of n non-negative numbers (row s: what rank s sends each peer, in any unit; rows are
normalised). The weights become whole element counts per size in collectives.apportion.
"""
from __future__ import annotations

import math

import numpy as np

from commbench.files import parse_json, read_small

MAX_FILE_BYTES = 16 << 20  # a 1,024-rank matrix in JSON is ~10 MiB
GAMMA_SHAPE = 8.0


class SplitsError(ValueError):
    """A --splits value that cannot be read, in one line."""


def weights(spec: str, world: int) -> tuple[tuple[float, ...], ...]:
    """The world x world weights `spec` names; () for uniform (every peer alike, exactly)."""
    text = spec.strip()
    if text == "uniform":
        return ()
    if text == "skewed" or text.startswith("skewed:"):
        return _skewed(text, world)
    return _from_file(text, world)


def _skewed(text: str, world: int) -> tuple[tuple[float, ...], ...]:
    parts = text.split(":")[1:]
    if len(parts) > 2:
        raise SplitsError(f"--splits {text}: skewed takes at most ALPHA and SEED (skewed:1.2:7)")
    try:
        alpha = float(parts[0]) if parts and parts[0] else 1.0
        seed = int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise SplitsError(f"--splits {text}: ALPHA is a number and SEED an integer (skewed:1.2:7)") from None
    if not (math.isfinite(alpha) and 0 <= alpha <= 16) or seed < 0:
        raise SplitsError(f"--splits {text}: ALPHA from 0 (uniform popularity) to 16, SEED not negative")
    rng = np.random.default_rng(seed)
    popularity = 1.0 / (1.0 + rng.permutation(world)) ** alpha
    noise = rng.gamma(GAMMA_SHAPE, 1.0 / GAMMA_SHAPE, size=(world, world))
    return tuple(tuple(float(x) for x in row) for row in popularity[None, :] * noise)


def _from_file(path: str, world: int) -> tuple[tuple[float, ...], ...]:
    """A JSON matrix, read as data only (a regular file, bounded in size, parsed as JSON)."""
    try:
        rows = parse_json(read_small(path, MAX_FILE_BYTES, "--splits"))
    except (OSError, ValueError) as exc:
        raise SplitsError(f"--splits {path}: not uniform, skewed[:ALPHA[:SEED]] or a readable JSON matrix "
                          f"({getattr(exc, 'strerror', None) or exc})") from None
    good = isinstance(rows, list) and len(rows) == world and all(
        isinstance(row, list) and len(row) == world and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in row)
        for row in rows)
    if not good:
        raise SplitsError(f"--splits {path}: needs {world} rows of {world} non-negative numbers (one row per "
                          f"sending rank), for the {world} ranks of this run")
    if any(sum(row) == 0 for row in rows):
        raise SplitsError(f"--splits {path}: a row of zeros: every rank sends something (its whole buffer)")
    # shares, not sizes: each row over its largest, so a row of huge numbers cannot sum past a float
    return tuple(tuple(float(x) / max(row) for x in row) for row in rows)
