"""What ends a run, on the ground floor: the documented exit codes, the errors a user can cause
that the job frame maps to them (job.run_rank), and the words by which a library says it ran out
of memory. Every floor reads these; none of them imports anything of commbench.

Exit codes (README.md, docs/launching.md): 0 ok, 1 wrong results, 2 bad input (or a model too
large for memory, or an output file that cannot be written: a full disk), 3 a rank failed (died, hung
past the timeout, out of memory while measuring), 130 interrupted (128 + SIGINT, as a shell reports
Ctrl-C; SIGTERM alike, since it ends a job as Ctrl-C does: lifetime.sigterm_as_interrupt).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_WRONG = 1  # a wrong answer: a collective's result differed from its expectation (also compare's regression,
#                and check's error above --max-error)
EXIT_USAGE = 2  # bad input: an option, a file, a request the backend cannot run, out of memory for a size, an
#                output that cannot be written (OutputError: a full disk)
EXIT_FAULT = 3  # a rank died, hung past the timeout or never started
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: results already written are kept

def telling_code(codes: list[int]) -> int:
    """The job's code of its ranks' own (positive) failures: interrupted (130) first, then bad input (2), since
    a rank that stops on it (a results file it cannot write, out of memory at a size) ends its peers' calls,
    whose faults (3) follow from it; then a fault; then wrong results (1). EXIT_FAULT when there is none."""
    for code in (EXIT_INTERRUPTED, EXIT_USAGE, EXIT_FAULT):
        if code in codes:
            return code
    return max(codes) if codes else EXIT_FAULT


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


class OutputError(OSError):
    """An output file that cannot be opened or written (a full disk, no permission): one line,
    `cannot write PATH: reason`, and bad input (exit 2), as an output path refused before the run is. An
    OSError, so whatever handles those handles it. Raised by the results' writer (results/sink.py)."""

    def __init__(self, path: str, exc: OSError):
        super().__init__(exc.errno, exc.strerror or str(exc), path)

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


class JobFault(RuntimeError):
    """The run cannot go on (a peer died or hung, out of memory); one line for the user.

    `agreed` faults are known to every rank with the same message (which names the rank
    at fault), so only rank 0 prints them."""

    def __init__(self, message: str, agreed: bool = False):
        super().__init__(message)
        self.agreed = agreed
