"""What every command shares: the usage error (one line, exit 2) and an up-front check
that an output path can be written before any work starts."""
from __future__ import annotations

import os

import click

from commbench.job import EXIT_USAGE


class UsageFault(click.ClickException):
    exit_code = EXIT_USAGE


def check_writable(path: str | None) -> None:
    if not path:
        return
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise UsageFault(f"cannot create the directory of {path}: {exc.strerror}") from exc
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageFault(f"cannot write {path}: permission denied")


def find_job(launcher_option: str):
    """(launcher, LaunchInfo or None) of this process, or one line (exit 2) naming a broken variable."""
    from commbench import job
    from commbench.launch import LaunchError

    try:
        return job.find_job(launcher_option)
    except LaunchError as exc:
        raise UsageFault(str(exc)) from exc
