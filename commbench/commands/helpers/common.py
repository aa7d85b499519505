"""What every command shares: the usage error (one line, exit 2) and the up-front check of its
output files: each opened for writing for real before any work starts, no file named twice, no
device (/dev/zero, /dev/full: a run's record closing would read one back without end) and no
user's file overwritten unless `--force` (or added to, for JSON Lines, with `--append`)."""
from __future__ import annotations

import math
import os
import stat
import textwrap
from collections.abc import Callable, Iterable

import click

from commbench.errors import EXIT_USAGE


class UsageFault(click.ClickException):
    exit_code = EXIT_USAGE


def output_options(append: bool) -> Callable:
    """The flags of a command that writes files: `--force` (overwrite a file that holds something)
    and, where the output is JSON Lines (`append` True), `--append` (add this run's records to it)."""
    def decorate(command: Callable) -> Callable:
        if append:
            command = click.option("--append", "append", is_flag=True,
                                   help="Add to an output file that already holds records (JSON Lines).")(command)
        return click.option("--force", "force", is_flag=True,
                            help="Overwrite an output file that already holds something (refused without).")(command)
    return decorate


def check_writable(path: str | None, option: str = "", force: bool = False, append: bool | None = None) -> None:
    """Open `path` for writing now, as the run will later: a file that cannot be created or written
    (a read-only or immutable file, /sys or /proc, a missing directory that cannot be made) is one
    line and exit 2 here, root or not, instead of a failure after the work. Nothing is truncated: an
    existing file is opened without O_TRUNC and left as it is; a file made only for this test is
    removed again. The file's directory is made, as the run would make it.

    Refused too: an empty name, anything but a regular file or a new path (a device, a FIFO, a
    directory; /dev/null, which swallows all, excepted), and a file that holds something unless
    `force` or `append` (None: the command has no --append). With `append`, a file that is not a
    commbench results file of the option's kind (`--csv`: this version's CSV header; else JSON Lines
    records) is refused: rows added under another header would damage it."""
    if path is None:
        return
    named = f"{option} {path}".strip() if path else f"{option} ''".strip()
    if not path.strip():
        raise UsageFault(f"{named}: an empty file name")
    if "\x00" in path:
        raise UsageFault(f"cannot write {path!r}: a file name cannot hold a NUL byte")
    _check_not_kernel(path, named)
    _check_existing(path, named, force, append)
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


def _check_existing(path: str, named: str, force: bool, append: bool | None) -> None:
    """Refuse an existing output that is not a regular file, or one that holds something (without leave)."""
    try:
        info = os.stat(path)
    except OSError:  # a new path (or one the open below will name the fault of)
        return
    if not stat.S_ISREG(info.st_mode):
        if os.path.realpath(path) == os.devnull:
            return
        raise UsageFault(f"{named}: not a regular file (a device, FIFO or directory); outputs are written to files")
    if info.st_size and not (force or append):
        leave = "--force to overwrite it" + (" or --append to add to it" if append is not None else "")
        raise UsageFault(f"{named}: the file exists and is not empty; give a new name, or add {leave}")
    if info.st_size and append and not force:
        from commbench.results import append_refusal

        foreign = append_refusal(path, csv_file=named.startswith("--csv "))
        if foreign:
            raise UsageFault(f"{named}: --append adds to a commbench results file, but {foreign}; give a new name, "
                             f"or --force instead of --append to overwrite it")


# the kernel's own file systems: their files look regular (/proc/self/mem) but a write is a request to the
# kernel, not data kept, and most refuse; an output there fails only after the run's work
KERNEL_FILESYSTEMS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs",
                                "bpf", "pstore", "efivarfs", "fusectl", "devpts", "binfmt_misc"})


def _check_not_kernel(path: str, named: str) -> None:
    """Refuse an output on one of the kernel's file systems (/proc, /sys, ...), naming it."""
    mount, kind = mount_of(os.path.realpath(path))
    if kind in KERNEL_FILESYSTEMS:
        raise UsageFault(f"{named}: {mount} is the kernel's {kind} file system, which holds no files to write; "
                         f"give a path on a disk")


def mount_of(path: str, mounts: str = "/proc/self/mounts") -> tuple[str, str]:
    """(mount point, file system type) that holds the absolute `path`: the longest mount point above it
    (the last one mounted there), or ("", "") when the mount table cannot be read."""
    best = ("", "")
    try:
        with open(mounts, encoding="utf-8", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].encode().decode("unicode_escape") if "\\" in fields[1] else fields[1]  # \040: a blank
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best


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


def check_directory(path: str, own_file: str, force: bool = False) -> None:
    """The same for an output directory (report -o): made if missing, a file can be created in it, and
    its `own_file` (report's index.md) is not overwritten unless `force`."""
    if not path.strip():
        raise UsageFault(f"-o {path!r}: an empty directory name")
    _check_not_kernel(path, f"-o {path}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageFault(f"-o {path}: not a directory (a file or device is there); -o names a directory to write in")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageFault(f"cannot create {path}: {exc.strerror or exc}") from exc
    try:
        _open_for_writing(os.path.join(path, f".commbench-probe-{os.getpid()}"))
    except OSError as exc:
        raise UsageFault(f"cannot write in {path}: {exc.strerror or exc}") from exc
    check_writable(os.path.join(path, own_file), "-o", force=force)


NOTE_WIDTH = 120  # the widest `#` note line a command prints: a terminal's or a review's width, not 450


def note_lines(line: str, width: int = NOTE_WIDTH) -> list[str]:
    """A `#` note line wider than `width` as several `#` lines, each at most `width` (a word wider than that stays
    whole): broken at spaces only, so every word and figure is kept in order; the lines after the first indented
    two past the first's text, so they read as one note, and each still a `#` line, so that a parser that skips
    comments skips them all. Any other line is returned as it is."""
    if len(line) <= width or not line.startswith("#"):
        return [line]
    text = line[1:].lstrip(" ")
    lead = line[:len(line) - len(text)]
    return textwrap.wrap(text, width=width, initial_indent=lead, subsequent_indent=lead + "  ",
                         break_long_words=False, break_on_hyphens=False)


def refuse_empty_values(command: click.Command) -> None:
    """The one rule for an empty value, on every parameter of `command` and of the commands under it: a
    value given as '' (or blanks) is one line and exit 2, for an option (`--hw ''`), an argument, or an
    item of a repeatable one, never taken as "not given" and the default run in its place. And the one
    rule for a number that is not finite: no option of commbench takes nan or inf (`--timeout nan`,
    `--compute-scale inf`: one line and exit 2, not a ValueError where it is used)."""
    for sub in getattr(command, "commands", {}).values():
        refuse_empty_values(sub)
    for param in command.params:
        param.callback = _refusing_empty(param, param.callback)


def _refusing_empty(param: click.Parameter, callback: Callable | None) -> Callable:
    given_by = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)

    def check(ctx: click.Context, parameter: click.Parameter, value):
        values = value if isinstance(value, (tuple, list)) else (value,)
        given = ctx.get_parameter_source(parameter.name) in given_by
        if given and any(isinstance(v, str) and not v.strip() for v in values):
            raise UsageFault(f"{_named(parameter, values)} '': an empty value")
        bad = next((v for v in values if isinstance(v, float) and not math.isfinite(v)), None)
        if given and bad is not None and isinstance(parameter, click.Option):
            raise UsageFault(f"{parameter.opts[0]} {bad:g}: must be a finite number")
        return callback(ctx, parameter, value) if callback else value
    return check


def _named(parameter: click.Parameter, values: tuple) -> str:
    """The option's flag; for arguments passed on (nccl-tests' flags), the flag before the empty one."""
    if isinstance(parameter, click.Option):
        return parameter.opts[0]
    at = next(i for i, v in enumerate(values) if isinstance(v, str) and not v.strip())
    return str(values[at - 1]) if at else f"argument {parameter.human_readable_name.rstrip('.')}"


def warn(message: str) -> None:
    """A warning on stderr, one line: input that was skipped as the docs say (a truncated last line)."""
    click.echo(f"commbench: warning: {message}", err=True)


def check_outputs(*outputs: tuple[str, str | None], inputs: Iterable[str] = (), force: bool = False,
                  append: bool | None = None, whole: Iterable[str] = ()) -> None:
    """`outputs`: (option, path) pairs, path None when not given. Refuse a file named by two options
    (their lines would interleave) or an output that is also an input (it would be overwritten before
    it is read), then check_writable each (`force`, `append`: the command's flags, append None where
    it has none; `whole`: options whose file --append cannot add to, such as a PNG). With both --force and
    --append, --append adds to the record files and --force overwrites the whole ones (a plot); without
    a whole file among the outputs, the two contradict each other."""
    whole = set(whole)
    if append and not any(path for option, path in outputs if option not in whole):
        named = " or ".join(option for option, _ in outputs if option not in whole) or "an output file"
        raise UsageFault(f"--append adds to an output file, and none is given: add {named} FILE")
    if force and append and not any(path for option, path in outputs if option in whole):
        raise UsageFault("--force and --append: choose one (overwrite, or add to the file)")
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
    for option, path in outputs:
        if option in whole:
            check_writable(path, option, force, None)
        else:
            check_writable(path, option, force and not append, append)


def find_job(launcher_option: str):
    """(launcher, LaunchInfo or None) of this process, or one line (exit 2) naming a broken variable."""
    from commbench import job
    from commbench.launchers import LaunchError

    try:
        return job.find_job(launcher_option)
    except LaunchError as exc:
        raise UsageFault(str(exc)) from exc


def write_records(json_path: str, records: list, append: bool) -> None:
    """`records` written as JSON Lines (an OutputError is one line, exit 2), and said."""
    from commbench.results import OutputError, ResultSink

    try:
        with ResultSink(json_path, append=append) as sink:
            sink.write_all(records)
    except OutputError as exc:
        raise UsageFault(str(exc)) from exc
    click.echo(f"# wrote {json_path}")
