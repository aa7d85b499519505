"""What ends a run, on the ground floor: the documented exit codes, the errors a user can cause
that the job frame maps to them (job.run_rank), and the words by which a library says it ran out
of memory. Every floor reads these; none of them imports anything of commbench.

Exit codes (README.md, docs/launching.md): 0 ok, 1 wrong results, 2 bad input (or a model too
large for memory), 3 a rank failed (died, hung past the timeout, out of memory while measuring),
130 interrupted (128 + SIGINT, as a shell reports Ctrl-C).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_WRONG = 1  # a wrong answer: a collective's result differed from its expectation (also compare's regression,
#                and check's error above --max-error)
EXIT_USAGE = 2  # bad input: an option, a file, a request the backend cannot run, out of memory for a size
EXIT_FAULT = 3  # a rank died, hung past the timeout or never started; a results file could not be written
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: results already written are kept

# How torch, gloo and the C library word an allocation that failed, lower case: such a RuntimeError
# is out of memory (exit 2, the size is too large here), not a peer that died (exit 3).
OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def mentions_out_of_memory(message: str) -> bool:
    """Whether a library's error message says an allocation failed (OOM_MARKERS)."""
    text = message.lower()
    return any(marker in text for marker in OOM_MARKERS)


class BackendError(RuntimeError):
    """The backend cannot run here or cannot run this request; the message is one line for the user."""


class OutOfMemory(BackendError):
    """Allocating or filling buffers for one size ran out of memory."""


class JobFault(RuntimeError):
    """The run cannot go on (a peer died or hung, out of memory); one line for the user.

    `agreed` faults are known to every rank with the same message (which names the rank
    at fault), so only rank 0 prints them."""

    def __init__(self, message: str, agreed: bool = False):
        super().__init__(message)
        self.agreed = agreed
