"""The exit codes and the errors mapped to them (commbench/errors.py): the named codes are the ones
the README and docs/launching.md document, and every error a user can cause ends a rank with its
documented code (job.run_rank's one mapping)."""
import re
from pathlib import Path

import pytest
from conftest import REPO

from commbench import errors
from commbench.errors import (
    EXIT_FAULT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_WRONG,
    BackendError,
    JobFault,
    OutOfMemory,
    OutputError,
    mentions_out_of_memory,
)
from commbench.job import _outcome
from commbench.launchers import LaunchInfo

ROOT = REPO
NAMED = {"ok": EXIT_OK, "wrong results": EXIT_WRONG, "bad input": EXIT_USAGE, "a rank failed": EXIT_FAULT,
         "a fault": EXIT_FAULT, "interrupted": EXIT_INTERRUPTED}


def documented(path: Path) -> dict[str, int]:
    """meaning -> code from a document's "Exit codes: 0 ok, 1 wrong results, ..." paragraph."""
    text = " ".join(path.read_text(encoding="utf-8").split("Exit codes:", 1)[1].split("\n\n")[0].split())
    return {meaning: int(code) for code, meaning in re.findall(r"(\d+) ([a-z][a-z ]*?)(?= \(|,|\.)", text)}


@pytest.mark.parametrize("doc", ["README.md", "docs/launching.md"])
def test_the_named_codes_are_the_documented_ones(doc):
    table = documented(ROOT / doc)
    assert len(table) == 5, table
    assert {meaning: NAMED[meaning] for meaning in table} == table


@pytest.mark.parametrize("exc,code", [
    (BackendError("no CUDA device"), EXIT_USAGE),
    (OutOfMemory("could not allocate 1024 bytes on cpu"), EXIT_USAGE),
    (MemoryError(), EXIT_USAGE),
    (ValueError("bad profile"), EXIT_USAGE),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), EXIT_USAGE),
    (JobFault("rank 1 died"), EXIT_FAULT),
    (RuntimeError("Connection closed by peer"), EXIT_FAULT),
    (OSError(5, "Input/output error", "/dev/shm/cb_x"), EXIT_FAULT),
    # a results file that cannot be written (a full disk) is the user's to fix, as an output refused up front
    (OutputError("out.jsonl", OSError(28, "No space left on device")), EXIT_USAGE),
    (KeyboardInterrupt(), EXIT_INTERRUPTED),
])
def test_every_error_maps_to_its_code(exc, code):
    message, got, status, _ = _outcome(exc, LaunchInfo.local(0, 2, 0), timeout_s=5.0)
    assert got == code
    assert status == ("interrupted" if code == EXIT_INTERRUPTED else "failed")
    assert (message is None) == (code == EXIT_INTERRUPTED) and "\n" not in (message or "")


def test_a_full_disk_is_the_line_every_command_says():
    message, code, _, _ = _outcome(OutputError("/mnt/x/a.jsonl", OSError(28, "No space left on device")),
                                   LaunchInfo.local(0, 2, 0), timeout_s=5.0)
    assert (message, code) == ("cannot write /mnt/x/a.jsonl: No space left on device", EXIT_USAGE)


def test_a_bug_is_not_mapped():
    with pytest.raises(TypeError):
        _outcome(TypeError("a bug: its traceback"), LaunchInfo.local(0, 1, 0), timeout_s=5.0)


def test_out_of_memory_is_read_from_every_librarys_wording():
    for text in ("CUDA out of memory", "std::bad_alloc: can't allocate memory", "Cannot allocate memory"):
        assert mentions_out_of_memory(text)
    assert not mentions_out_of_memory("Connection reset by peer")
    assert all(marker == marker.lower() for marker in errors.OOM_MARKERS)


@pytest.mark.parametrize("codes,code", [([2, 3], 2), ([3, 2], 2), ([3, 1], 3), ([1], 1), ([130, 3], 130),
                                        ([130, 2], 130), ([], 3), ([3, 3], 3)])
def test_the_jobs_code_puts_bad_input_before_the_faults_it_causes(codes, code):
    """Rank 0 stops on a results file it cannot write (2); its peer then fails on the closed connection (3):
    the job says 2, the cause (issue 48: a full disk ended a spawned run with 3, or 1 with a traceback)."""
    from commbench.errors import telling_code

    assert telling_code(codes) == code
