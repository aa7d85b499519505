"""Numbers read from the command line: each within a stated range, finite, or one line and
exit 2; and how many local ranks this host takes before it is oversubscribed.

The ranges are what commbench can honour, not guesses at what is sensible: a timeout
beyond LONGEST_S cannot be handed to torch's rendezvous (OverflowError), a size beyond
sizes.MAX_BYTES cannot be allocated anywhere, and so on. They are written once here so
that every command refuses alike.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from commbench.commands.helpers.common import UsageFault
from commbench.environment import memory_limit_bytes, usable_cpus

LONGEST_S = 7 * 24 * 3600.0  # a week: --timeout, --min-time beyond this is a typo, and torch overflows past ~1e8 s
SHORTEST_TIMEOUT_S = 1.0  # below this gloo's rendezvous cannot complete: the run could only time out
RANKS_PER_CORE = 4  # local ranks beyond this many per core starve each other (docs/launching.md)
OVERSUBSCRIBED_RANKS_PER_CORE = 32  # the ceiling --oversubscribe lifts the limit to: each rank is a process
RANK_MEMORY_BYTES = 400 << 20  # what one local CPU rank costs before its buffers (python + torch + gloo), measured


@dataclass(frozen=True)
class Range:
    """A number's allowed range; `low_open`: the low end itself is refused (must be > low)."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    integer: bool = False

    def check(self, flag: str, value: float | int | None) -> None:
        if value is None:
            return
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageFault(f"{flag} {value:g}: must be a finite number")
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            bound = "greater than" if self.low_open else "at least"
            what = "positive" if self.low_open and self.low == 0 else f"{bound} {self.low:g}"
            raise UsageFault(f"{flag} {_show(value)}: must be {what}")
        if self.high is not None and value > self.high:
            raise UsageFault(f"{flag} {_show(value)}: must be at most {self.high:g}")


SECONDS = Range(0, LONGEST_S, low_open=True)
TIMEOUT = Range(SHORTEST_TIMEOUT_S, LONGEST_S)
COUNT = Range(1, 10**7, integer=True)
NONNEGATIVE_COUNT = Range(0, 10**7, integer=True)


def check(values: dict[str, tuple[Range, float | int | None]]) -> None:
    """Check several options at once: {flag: (range, value)}."""
    for flag, (allowed, value) in values.items():
        allowed.check(flag, value)


def _show(value: float | int) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_local_ranks(ranks: int, oversubscribe: bool, what: str = "local ranks", launched: bool = False) -> None:
    """Refuse more local ranks than this host's cores and memory carry, unless told to
    (`--oversubscribe`): each rank is a Python process with torch and gloo. Even then, not more
    than OVERSUBSCRIBED_RANKS_PER_CORE per core: `--nprocs 100000 --oversubscribe` would fork
    without bound (issue 26). `launched`: a launcher started the ranks and may have bound each to its own
    cores (srun's default, mpirun --bind-to core), so this rank's affinity says nothing of the node's: the
    host's cores count."""
    cores = (os.cpu_count() if launched else usable_cpus()) or 1
    if ranks > OVERSUBSCRIBED_RANKS_PER_CORE * cores:
        raise UsageFault(f"{ranks} {what} on {cores} core(s): at most {OVERSUBSCRIBED_RANKS_PER_CORE} per core, "
                         f"--oversubscribe or not (each rank is a process)")
    if oversubscribe:
        return
    if ranks > RANKS_PER_CORE * cores:
        raise UsageFault(f"{ranks} {what} on {cores} core(s): more than {RANKS_PER_CORE} per core starve each "
                         f"other; add --oversubscribe to run them anyway")
    memory = memory_limit_bytes()
    if memory and ranks * RANK_MEMORY_BYTES > memory:
        raise UsageFault(f"{ranks} {what} need about {ranks * RANK_MEMORY_BYTES / 2**30:.1f} GiB before any buffer; "
                         f"{_memory_text(memory)} (add --oversubscribe to try anyway)")


def check_memory(nbytes: int, what: str) -> None:
    """Refuse a run whose buffers cannot fit in this host's memory (one line, exit 2)."""
    memory = memory_limit_bytes()
    if memory and nbytes > memory:
        raise UsageFault(f"{what} need {nbytes / 2**30:.1f} GiB; {_memory_text(memory)}")


def _memory_text(memory: int) -> str:
    return f"this host (or its memory group) allows {memory / 2**30:.1f} GiB"
