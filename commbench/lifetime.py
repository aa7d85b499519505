"""How the processes of a job end together, whatever ends them: SIGTERM to the process that runs a job ends
it as Ctrl-C does (`sigterm_as_interrupt`, job.run), and a process commbench starts beside a rank (the shm
plan's probe and its workers, an emulated node's torchrun) dies with the process that started it, kill -9
too (`die_with_parent`). What a killed run leaves for others to remove: launch.py (shared memory) and
emulated_run.py (an emulated cluster's reaper)."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While a job runs from this process (its spawner, or every rank in it): SIGTERM (from `timeout`, `kill`,
    a scheduler) ends it as Ctrl-C does, with exit code 130 and every rank's summary written, where Python's
    default would end this process at once (143) and leave the ranks to notice. The first SIGTERM raises
    KeyboardInterrupt; later ones, while the ranks stop, are ignored (as a rank ignores a second signal,
    job.handle_stop_signals). Outside the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def on_term(signum: int, _frame) -> None:
        if not seen:
            seen.append(signum)
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


PR_SET_PDEATHSIG = 1


def _prctl():
    """libc's prctl (Linux), looked up once, before any fork: a forked child only calls it; None elsewhere."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()


def die_with_parent(sig: int = signal.SIGKILL, parent_pid: int | None = None) -> None:
    """Have the kernel send `sig` to this process when its parent ends, however it ends (kill -9 too; Linux's
    PR_SET_PDEATHSIG, also in a child before exec). With `parent_pid`, the parent this process was started by:
    if it has gone already (before this call), `sig` now. Where the kernel has no such call, nothing."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def end_session(proc, grace_s: float = 10.0) -> None:
    """End a process started in its own session (`start_new_session=True`) and every process of that session:
    SIGTERM (a commbench job ends as on Ctrl-C, its ranks with it), then SIGKILL if it has not ended `grace_s`
    later. `proc` is a subprocess.Popen; its pipes, if any, are drained as it ends."""
    import subprocess

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.communicate(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
