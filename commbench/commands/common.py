"""What every command shares: the usage error (one line, exit 2) and the up-front check of its
output files: each opened for writing for real before any work starts, and no file named twice."""
from __future__ import annotations

import os
from collections.abc import Iterable

import click

from commbench.job import EXIT_USAGE


class UsageFault(click.ClickException):
    exit_code = EXIT_USAGE


def check_writable(path: str | None) -> None:
    """Open `path` for writing now, as the run will later: a file that cannot be created or written
    (a read-only or immutable file, /sys or /proc, a missing directory that cannot be made) is one
    line and exit 2 here, root or not, instead of a failure after the work. Nothing is truncated: an
    existing file is opened without O_TRUNC and left as it is; a file made only for this test is
    removed again. The file's directory is made, as the run would make it."""
    if not path:
        return
    if "\x00" in path:
        raise UsageFault(f"cannot write {path!r}: a file name cannot hold a NUL byte")
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise UsageFault(f"cannot create the directory of {path}: {exc.strerror or exc}") from exc
    try:
        _open_for_writing(path)
    except OSError as exc:
        raise UsageFault(f"cannot write {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a NUL byte in the name
        raise UsageFault(f"cannot write {path!r}: {exc}") from exc


def _open_for_writing(path: str) -> None:
    """Open (or create) `path` write-only and close it again, truncating nothing; remove it if made here."""
    flags = os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # NONBLOCK: a FIFO without reader fails
    try:
        fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
    except FileExistsError:
        fd, created = os.open(path, flags), False
    os.close(fd)
    if created:
        os.unlink(path)


def check_directory(path: str) -> None:
    """The same for an output directory (report -o): made if missing, and a file can be created in it."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageFault(f"cannot create {path}: {exc.strerror or exc}") from exc
    try:
        _open_for_writing(os.path.join(path, f".commbench-probe-{os.getpid()}"))
    except OSError as exc:
        raise UsageFault(f"cannot write in {path}: {exc.strerror or exc}") from exc


def warn(message: str) -> None:
    """A warning on stderr, one line: input that was skipped as the docs say (a truncated last line)."""
    click.echo(f"commbench: warning: {message}", err=True)


def check_outputs(*outputs: tuple[str, str | None], inputs: Iterable[str] = ()) -> None:
    """`outputs`: (option, path) pairs, path None when not given. Refuse a file named by two options
    (their lines would interleave) or an output that is also an input (it would be overwritten before
    it is read), then check_writable each."""
    read = {os.path.realpath(p) for p in inputs}
    seen: dict[str, str] = {}
    for option, path in outputs:
        if not path:
            continue
        key = os.path.realpath(path)
        if key in read:
            raise UsageFault(f"{option} {path}: that is an input file, which writing would overwrite")
        if key in seen:
            raise UsageFault(f"{option} {path}: the same file as {seen[key]}; give each output a file of its own")
        seen[key] = option
    for _, path in outputs:
        check_writable(path)


def find_job(launcher_option: str):
    """(launcher, LaunchInfo or None) of this process, or one line (exit 2) naming a broken variable."""
    from commbench import job
    from commbench.launch import LaunchError

    try:
        return job.find_job(launcher_option)
    except LaunchError as exc:
        raise UsageFault(str(exc)) from exc
