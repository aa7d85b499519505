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

from commbench.commands.common import UsageFault

LONGEST_S = 7 * 24 * 3600.0  # a week: --timeout, --min-time beyond this is a typo, and torch overflows past ~1e8 s
SHORTEST_TIMEOUT_S = 1.0  # below this gloo's rendezvous cannot complete: the run could only time out
RANKS_PER_CORE = 4  # local ranks beyond this many per core starve each other (docs/launching.md)
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


POSITIVE = Range(0, None, low_open=True)
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


def check_local_ranks(ranks: int, oversubscribe: bool, what: str = "local ranks") -> None:
    """Refuse more local ranks than this host's cores and memory carry, unless told to
    (`--oversubscribe`): each rank is a Python process with torch and gloo."""
    if oversubscribe:
        return
    cores = os.cpu_count() or 1
    limit = RANKS_PER_CORE * cores
    if ranks > limit:
        raise UsageFault(f"{ranks} {what} on {cores} core(s): more than {RANKS_PER_CORE} per core starve each "
                         f"other; add --oversubscribe to run them anyway")
    memory = _memory_bytes()
    if memory and ranks * RANK_MEMORY_BYTES > memory:
        raise UsageFault(f"{ranks} {what} need about {ranks * RANK_MEMORY_BYTES / 2**30:.1f} GiB before any buffer; "
                         f"this host has {memory / 2**30:.1f} GiB (add --oversubscribe to try anyway)")


def check_memory(nbytes: int, what: str) -> None:
    """Refuse a run whose buffers cannot fit in this host's memory (one line, exit 2)."""
    memory = _memory_bytes()
    if memory and nbytes > memory:
        raise UsageFault(f"{what} need {nbytes / 2**30:.1f} GiB; this host has {memory / 2**30:.1f} GiB")


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no estimate, no refusal
        return None
