"""The job frame: how ranks come to exist and how they end, for every command that runs
ranks (sweep, proxy, train).

A command validates its options into a frozen config and a `Plan`: spawn local ranks,
join the job a launcher started (torchrun, srun, mpirun), or run every rank in this
process (sim, cuda's virtual and peer modes, a predicted proxy). `run` carries the plan
out. A job is declared beside its work as a `Job` (its config class, its rank function and the
summary that closes a results file whose rank 0 died) and handed to `run`; the frame imports
none of them. Every rank runs its job's function inside `run_rank`, which maps exceptions to the
documented exit codes once for all jobs, and every rank commbench starts (itself, or through
torchrun on an emulated cluster) enters through `python -m commbench.job`, finding its job again
by the declaration's own `module:attr` reference (`Job.ref`). launch.py
holds the launchers' variables and the supervisor; emulate.py the emulated cluster, emulated_run.py
a job's run on it.

The exit codes, and the errors mapped to them, are floor 1's (commbench/errors.py).

How a rank ends on a signal: the first SIGINT or SIGTERM raises KeyboardInterrupt in its main
thread (`Stopped` for SIGTERM) and every later one is ignored, because a Ctrl-C reaches a rank
twice (the terminal signals the whole process group, and a spawner or launcher passes it on)
and a second one would cut the first one's summary short. A spawned rank also stops when its
spawner dies: a watchdog thread reads end-of-file on a pipe from it.
"""
from __future__ import annotations

import json
import os
import pkgutil
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from commbench.errors import (
    EXIT_FAULT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    BackendError,
    JobFault,
    OutOfMemory,
    OutputError,
    mentions_out_of_memory,
)
from commbench.files import escape_unencodable_output, shown
from commbench.launch import (
    EXIT_DIR_VAR,
    SPAWN_VAR,
    WATCHDOG_VAR,
    new_job_id,
    remove_segments,
    spawn_local,
    stop_margin_s,
)
from commbench.launchers import LaunchInfo, detect_launcher, from_environment
from commbench.lifetime import sigterm_as_interrupt

JOB_VAR = "COMMBENCH_JOB"  # a spawned rank's job: {"job": Job.ref, "config": JSON, "argv": [...]}
SUMMARY_RECORDS = ("summary", "proxy", "validate")  # a results file that ends in one of these is complete


class Stopped(KeyboardInterrupt):
    """SIGTERM reached this rank (its spawner or launcher stops it), or its spawner died: the rank
    ends as on Ctrl-C, its summary written."""


@dataclass
class _SignalsSeen:
    """The first stop signal this process got. Process-wide state, as signal handlers are: the
    handler sets it, and `run_rank` reads it to tell an interruption from the fault it causes (a
    peer that stopped on the same Ctrl-C closes its connections)."""
    first: int | None = None


_SIGNALS = _SignalsSeen()


@dataclass(frozen=True)
class Job:
    """A command's work on ranks, declared beside that work (the sweep in bench.py, the proxy's replay in
    proxies/replay.py, ...) and handed to `run`. A spawned rank imports the declaration again by `ref`,
    which names where it is declared, so the frame holds no table of jobs."""
    name: str  # what messages call it: sweep, proxy, train, replay
    ref: str  # "module:attribute" of this declaration, e.g. f"{__name__}:SWEEP_JOB"
    config: type  # its frozen config (backends.base.RanksConfig: from_json, to_json, timeout_s, json_path)
    rank: Callable[[Any, LaunchInfo, list[str]], int]  # (config, this rank, argv) -> exit code
    # (records, error) -> the summary record that ends a results file whose rank 0 died before writing its own
    summary: Callable[[list[dict[str, Any]], str], Any]


def declared_job(ref: str) -> Job:
    """The job a spawned rank was given: the declaration at `ref`, inside this package only (the
    environment names it; nothing outside commbench is imported by it)."""
    if ref.partition(".")[0] != __package__:
        raise ValueError(f"{ref!r} is not a job of {__package__}")
    found = pkgutil.resolve_name(ref)
    if not isinstance(found, Job) or found.ref != ref:
        raise ValueError(f"{ref!r} does not declare itself a job")
    return found


@dataclass(frozen=True)
class Plan:
    mode: str  # spawn (local ranks), join (a launcher's job), local (every rank in this process),
    #            emulate (nodes x ranks_per_node ranks on an emulated cluster of this host, emulated_run.py)
    world: int
    launch: LaunchInfo | None = None  # when joining: who this process is
    nodes: int = 1
    ranks_per_node: int = 1
    note: str | None = None  # said once before running (e.g. why a proxy is predicted)
    link_bps: int = 0  # emulate: each node's link rate (bit/s)

    @property
    def lead(self) -> bool:
        """Rank 0 of a joined job, or this process when it spawns or runs every rank itself."""
        return self.launch is None or self.launch.rank == 0


def find_job(launcher_option: str = "auto",
             env: Mapping[str, str] | None = None) -> tuple[str | None, LaunchInfo | None]:
    """(launcher, this rank's LaunchInfo) when a launcher started this process (or commbench
    spawned it), (launcher or None, None) when it runs on its own. A broken launcher
    environment raises launch.LaunchError (one line for the user)."""
    env = os.environ if env is None else env
    if env is os.environ:
        new_job_id()  # a job tag that cannot name a file in /dev/shm: one line before anything starts
    launcher = launcher_of(launcher_option, env)
    if launcher in (None, "spawn") and SPAWN_VAR not in env:
        return launcher, None
    return launcher, from_environment(env, launcher or "spawn")


def launcher_of(launcher_option: str = "auto", env: Mapping[str, str] | None = None) -> str | None:
    """The launcher's name (`--launcher`, or what the environment shows), without reading its variables."""
    if launcher_option != "auto":
        return launcher_option
    return detect_launcher(os.environ if env is None else env)


def run(job: Job, cfg: Any, plan: Plan, argv: list[str]) -> int:
    """Carry out a plan: spawn `plan.world` ranks of `job`, or run this process's rank(s). SIGTERM to this
    process ends the job as Ctrl-C does: exit 130, summaries written (lifetime.sigterm_as_interrupt)."""
    if not isinstance(cfg, job.config):
        raise TypeError(f"the {job.name} job runs a {job.config.__name__}, not a {type(cfg).__name__}")
    if plan.mode == "join":
        handle_stop_signals()
        return job.rank(cfg, plan.launch or LaunchInfo.local(0, 1, 0), argv)
    with sigterm_as_interrupt():
        if plan.mode in ("spawn", "emulate"):
            return _spawn(job, cfg, plan, argv)
        return job.rank(cfg, plan.launch or LaunchInfo.local(0, 1, 0), argv)


def _spawn(job: Job, cfg: Any, plan: Plan, argv: list[str]) -> int:
    """Start the job's ranks on this host or on an emulated cluster, supervise them, and close the results
    file of a rank 0 that died before its summary; the job's exit code."""
    where = "on this host" if plan.mode == "spawn" else f"on an emulated cluster of {plan.nodes} node(s)"
    # the first line, at once: the ranks' start (torch's import, the rendezvous) takes seconds, more under load
    print(f"commbench: {job.name}: starting {plan.world} rank(s) {where}; their first line follows once they meet",
          file=sys.stderr, flush=True)
    payload = json.dumps({"job": job.ref, "config": cfg.to_json(), "argv": list(argv)})
    if plan.mode == "spawn":
        code = spawn_local(__name__, plan.world, {JOB_VAR: payload}, cfg.timeout_s)
    else:
        from commbench.emulate import EmulateError
        from commbench.emulated_run import run_job

        try:
            code = run_job(plan.nodes, plan.ranks_per_node, plan.link_bps, {JOB_VAR: payload}, cfg.timeout_s)
        except EmulateError as exc:
            print(f"commbench: error: {exc}", file=sys.stderr)
            return EXIT_FAULT
    if code != EXIT_OK and cfg.json_path:
        close_records(job, cfg.json_path)
    return code


def close_records(job: Job, path: str) -> None:
    """After a failed spawn: if rank 0 died before the summary (killed, or stopped outright after a
    hang), end its results file with one, status failed, from the records it holds (a torn last line,
    cut by the kill, is dropped first)."""
    from commbench.files import drop_torn_line, open_regular
    from commbench.results import append_record, read_records

    try:  # a regular file only: a device given as the output (/dev/zero) would be read without end
        with open_regular(path, writable=True) as handle:
            drop_torn_line(handle)
        records = read_records(path)
    except (OSError, ValueError):  # ValueError: RecordError, or UnreadableFile (not a regular file)
        return
    runs = [i for i, r in enumerate(records) if r.get("record") == "header"]
    records = records[runs[-1]:] if runs else records  # --append: this run's records, not the ones before
    if not records or records[-1].get("record") in SUMMARY_RECORDS:
        return
    summary = job.summary(records, "rank 0 ended before it wrote the summary (see the messages of the run); "
                                   "written by the spawner from the records above")
    if summary is not None:
        try:
            append_record(path, summary)
        except OutputError:  # a full disk, which rank 0 has named: the file ends at its last whole record
            pass


def end(code: int, plan: Plan) -> None:
    """Leave the command with `code`. A rank of a launcher's job skips the interpreter's teardown
    here (torch's has aborted finished ranks, see exit_now); every other command returns through
    cli.main, which skips it too when commbench is the process (torch's teardown costs about a
    second) and returns when it is called in process (tests, library use)."""
    if plan.mode == "join":
        exit_now(code)
    sys.exit(code)


def run_rank(launch: LaunchInfo, timeout_s: float, body: Callable[[], int],
             on_fault: Callable[[str, str], None] | None = None, close: Callable[[], None] | None = None) -> int:
    """Run one rank's `body` (returns its exit code); every exception becomes one line on
    stderr and its documented exit code. `on_fault(status, error)` writes what the job keeps
    after a fault (its summary record); `close` releases the backend, always, quietly."""

    def fault(message: str | None, code: int, status: str = "failed", prefix: bool = True) -> int:
        if message:
            fail(launch, message, prefix)
        if on_fault is not None:
            try:
                on_fault(status, message or status)
            except Exception:  # noqa: BLE001 - the summary is best effort after a fault
                pass
        return code

    try:
        try:
            return body()
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - mapped below, or raised again
            return fault(*_outcome(exc, launch, timeout_s))
    except KeyboardInterrupt:  # the interruption arrived while a fault was being reported
        return fault(None, EXIT_INTERRUPTED, "interrupted")
    finally:
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - tearing down after a fault must not raise a second error
                pass


def _outcome(exc: BaseException, launch: LaunchInfo, timeout_s: float) -> tuple[str | None, int, str, bool]:
    """(message or None, exit code, summary status, whether the line names the rank) for an exception
    that ended a rank's body; an exception no user can cause is raised again (a bug: its traceback)."""
    if isinstance(exc, KeyboardInterrupt) or _SIGNALS.first is not None:  # and what the interruption caused
        return None, EXIT_INTERRUPTED, "interrupted", True
    if isinstance(exc, (MemoryError, OutOfMemory)):
        return f"out of memory: {error_line(exc)}", EXIT_USAGE, "failed", True
    if isinstance(exc, (BackendError, ValueError)):  # ValueError: bad profiles and models, one line each
        return (str(exc).splitlines()[0] if str(exc) else type(exc).__name__), EXIT_USAGE, "failed", True
    if isinstance(exc, JobFault):
        return (str(exc) if not exc.agreed or launch.rank == 0 else None), EXIT_FAULT, "failed", not exc.agreed
    if isinstance(exc, RuntimeError):  # torch: a peer died, a collective or the rendezvous timed out
        if mentions_out_of_memory(str(exc)):
            return f"out of memory: {error_line(exc)}", EXIT_USAGE, "failed", True
        return (f"{error_line(exc)} (a peer rank may have died or hung, or never started; "
                f"--timeout {timeout_s:g} s)"), EXIT_FAULT, "failed", True
    if isinstance(exc, OutputError):  # a results file that cannot be written (a full disk): the user's to fix
        return str(exc), EXIT_USAGE, "failed", True
    if isinstance(exc, OSError):
        return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), EXIT_FAULT, "failed", True
    raise exc


def error_line(exc: BaseException) -> str:
    """The useful part of a library error: first line, without gloo's source location and boilerplate."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    line = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", line)
    return line.split(". This is typically")[0].rstrip(".")


def fail(launch: LaunchInfo, message: str, prefix: bool = True) -> None:
    """One line on stderr, naming the rank when there are several."""
    who = f"rank {launch.rank}: " if prefix and launch.world_size > 1 else ""
    print(f"commbench: {who}{shown(message)}", file=sys.stderr, flush=True)  # one line, whatever a file held


def exit_now(code: int) -> None:
    """End a rank once its run is over (records written, backend closed): skip the
    interpreter's teardown, where torch's distributed and thread-pool destructors have aborted
    a finished rank here ("terminate called without an active exception") and turned a clean
    run into a SIGABRT."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def handle_stop_signals() -> None:
    """In a rank's main thread: the first SIGINT raises KeyboardInterrupt, the first SIGTERM `Stopped`,
    and any later SIGINT or SIGTERM is ignored (see the module's docstring). A SIGINT ignored from the
    start (a job in the background) stays ignored."""
    def on_signal(signum: int, _frame: Any) -> None:
        if _SIGNALS.first is not None:
            return
        _SIGNALS.first = signum
        raise KeyboardInterrupt if signum == signal.SIGINT else Stopped()

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def watch_spawner(fd: int, stop_s: float) -> None:
    """A daemon thread that stops this rank when its spawner dies: the pipe's write end closes with
    the spawner, however it ends, and reading gives end-of-file. The rank then ends as on SIGTERM,
    summary written; if it has not ended within `stop_s` (stuck in a library call), the thread
    removes the job's shared memory, which the spawner would have, and ends the process."""
    def watch() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # the main thread ends as on SIGTERM
        time.sleep(stop_s)
        fail(from_environment(os.environ, "spawn"), f"the commbench process that started this rank died; "
             f"still running {stop_s:.2g} s later, stopped")
        remove_segments(os.environ.get(SPAWN_VAR, ""))
        exit_now(EXIT_INTERRUPTED)

    threading.Thread(target=watch, name="commbench-watchdog", daemon=True).start()


def main() -> None:
    """The rank entry of `python -m commbench.job` (launch.spawn_local starts it, with SIGINT blocked
    until the handler is in place: a Ctrl-C while the rank starts is held, not lost or a traceback)."""
    handle_stop_signals()
    escape_unencodable_output()
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        try:
            payload = json.loads(os.environ[JOB_VAR])
            job = declared_job(payload["job"])
        except (KeyError, TypeError, ValueError, ImportError, AttributeError) as exc:  # not a commbench spawner's
            fail(LaunchInfo.local(0, 1, 0), f"error: {JOB_VAR}: {exc}")
            exit_now(EXIT_USAGE)
        cfg = job.config.from_json(payload["config"])
        if WATCHDOG_VAR in os.environ:
            watch_spawner(int(os.environ[WATCHDOG_VAR]), stop_margin_s(cfg.timeout_s))
        code = job.rank(cfg, from_environment(os.environ, detect_launcher(os.environ) or "spawn"), payload["argv"])
    except KeyboardInterrupt:  # before the rank's frame started, or after it ended
        code = EXIT_INTERRUPTED
    report_exit(code)
    exit_now(code)


def report_exit(code: int) -> None:
    """Under a launcher that commbench started (emulated_run.py), leave this rank's exit code where the
    spawner reads it: torchrun only says whether a node's ranks all succeeded."""
    folder = os.environ.get(EXIT_DIR_VAR)
    if folder:
        try:
            with open(os.path.join(folder, f"rank{int(os.environ.get('RANK', '0'))}"), "w", encoding="ascii") as f:
                f.write(str(code))
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    # the rank runs in the module as the package imports it, not in this copy (__main__): the jobs' declarations
    # are of its Job, and its signal state is the one run_rank reads
    from commbench import job as frame

    frame.main()
