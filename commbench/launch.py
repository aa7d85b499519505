"""Launch: spawn local ranks, or run in the job a launcher started (torchrun, SLURM srun, mpirun).

Under a launcher every process runs the same `commbench ...` command and reads who it is
from the launcher's environment (commbench/launchers.py). Without one, the command spawns
`--nprocs` copies of itself on this host, passing the rendezvous through the same
variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
and supervises them: when a rank fails, the others are given a moment to report
and are then stopped, so a run never outlives its timeout. Ranks wait for a peer for the
timeout less a stop margin (`peer_wait_s`); the margin is the supervisor's, to stop them.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping

from commbench.environment import memory_limit_bytes
from commbench.errors import EXIT_INTERRUPTED, EXIT_OK, telling_code
from commbench.launchers import SPAWN_VAR, LaunchError

EXIT_DIR_VAR = "COMMBENCH_EXIT_DIR"  # where each rank of an emulated run leaves its exit code
JOB_TAG_VAR = "COMMBENCH_JOB_TAG"  # starts every job id, so the segments of jobs under a tag begin cb_<tag>
WATCHDOG_VAR = "COMMBENCH_WATCHDOG_FD"  # a spawned rank's end of a pipe that reads EOF when its spawner dies
STORE_FD_VAR = "COMMBENCH_STORE_FD"  # rank 0's socket for the rendezvous store, bound by its spawner
SHM_DIR = "/dev/shm"  # where --backend shm keeps its segments, named cb_<job>_...
POLL_S = 0.05  # how often the supervisor looks at its ranks
INTERRUPT_WAIT_S = 5.0  # after Ctrl-C: how long ranks get to write their summaries before they are stopped


# ---------------------------------------------------------------- local spawning


def segment_prefix(job: str) -> str:
    return f"cb_{job}_"


def new_job_id() -> str:
    """A job's id, unique on this host, after $COMMBENCH_JOB_TAG (letters and digits: it names files in /dev/shm)."""
    tag = os.environ.get(JOB_TAG_VAR, "")
    if not re.fullmatch(r"[A-Za-z0-9]{0,32}", tag):
        raise LaunchError(f"{JOB_TAG_VAR}={tag!r}: a job tag is at most 32 letters and digits (names in {SHM_DIR})")
    return tag + uuid.uuid4().hex[:12]


def remove_segments(job: str, tagged: bool = False) -> int:
    """Unlink the segments of job `job` (a killed rank leaves them), or, `tagged`, of every job under tag `job`."""
    removed, prefix = 0, f"cb_{job}" if tagged else segment_prefix(job)
    for name in (n for n in (os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else ()) if n.startswith(prefix)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
            removed += 1
    return removed


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def loopback_socket(port: int = 0, reuse: bool = True) -> socket.socket:
    """A TCP socket bound to 127.0.0.1:port (0: a free port), not yet listening: the rendezvous store's server
    takes it over. `reuse`: SO_REUSEADDR, as torch's own store server sets it (a port in TIME_WAIT binds again);
    without it no other socket can bind the port while this one holds it, SO_REUSEADDR or not. Raises OSError
    where the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def stop_margin_s(timeout_s: float) -> float:
    """The part of --timeout kept for stopping a job after a rank gives up: a third of it, at most 3 s.
    The supervisor spends half of the margin waiting for the other ranks to report (`grace_s`), a
    quarter for a signalled rank to end, and leaves the last quarter for the ranks' own exit."""
    return min(3.0, timeout_s / 3)


def peer_wait_s(timeout_s: float) -> float:
    """How long a rank waits for its peers (the rendezvous, a collective, emulated compute) before it
    gives up: the timeout less the stop margin, so that the whole job ends within the timeout."""
    return timeout_s - stop_margin_s(timeout_s)


def rank_argv(module: str) -> list[str]:
    """How a rank (or a node's launcher) starts: `python -P -m module`. -P keeps the working directory
    off the import path, where `-m` would put it first: a `uuid.py` in the directory the user runs
    commbench from must not run in every rank (issue 26). Before Python 3.11 (no -P), the same by hand."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module]
    return [sys.executable, "-c", f"import runpy, sys; del sys.path[0]; "
                                  f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"]


def spawn_local(module: str, nprocs: int, extra_env: Mapping[str, str], timeout_s: float = 300.0) -> int:
    """Run `python -P -m <module>` as `nprocs` local ranks; return the job's exit code.

    Ranks share this terminal (stdout/stderr are inherited, so rank 0's table and
    progress bar show directly). If a rank fails, the rest get half of the stop margin to
    report their own error (they see the dead peer), then are terminated. Each rank holds the
    read end of a pipe whose write end only this process holds: when this process dies, however
    it dies, the ranks read end-of-file and stop (job.py's watchdog).
    """
    job = new_job_id()
    grace_s, stop_s = stop_margin_s(timeout_s) / 2, stop_margin_s(timeout_s) / 4
    watch_read, watch_write = os.pipe()
    # The store's port stays bound from here to rank 0's store: a port found free and let go (free_port) was taken
    # by another process before rank 0 bound it in a loaded CI run ("Address already in use", exit 3).
    store = loopback_socket(reuse=False)  # a port the kernel gave is in no TIME_WAIT
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.getsockname()[1]), WORLD_SIZE=str(nprocs),
                LOCAL_WORLD_SIZE=str(nprocs), GROUP_RANK="0", **{SPAWN_VAR: job, WATCHDOG_VAR: str(watch_read)},
                **extra_env)
    # As torchrun does for several local ranks: one intra-op thread each, or ranks fight over cores.
    base.setdefault("OMP_NUM_THREADS", "1")
    procs: list[subprocess.Popen] = []
    try:
        # Ranks start with Ctrl-C held (the mask is inherited): it reaches a rank once its handler is in place.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for rank in range(nprocs):
                env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), **({STORE_FD_VAR: str(store.fileno())}
                                                                           if rank == 0 else {}))
                fds = (watch_read, store.fileno()) if rank == 0 else (watch_read,)
                procs.append(subprocess.Popen(rank_argv(module), env=env, pass_fds=fds))
        finally:
            os.close(watch_read)
            store.close()  # rank 0 holds its own copy
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return supervise(procs, grace_s, stop_s)
    except KeyboardInterrupt:
        interrupt(procs, stop_s)
        print("commbench: interrupted; results already written are kept", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        stop_all(procs)  # none is left, unless this process itself is failing
        os.close(watch_write)
        remove_segments(job)  # a rank killed outright cannot clean up after itself


def supervise(procs: list[subprocess.Popen], grace_s: float, stop_s: float, what: str = "rank",
              wake: Callable[[], None] = lambda: None, failed: Callable[[], bool] = lambda: False) -> int:
    """Wait for the ranks (or a node's launchers); when one fails (or `failed()`: a launcher's rank
    said so), give the rest `grace_s` to report, then stop them (`wake`: their ranks too, see _stop);
    the job's exit code. The grace is not waited for where every process still there is stopped (SIGSTOP, a
    debugger, Ctrl-Z): none of them can report, and the wait would only push the job past its --timeout."""
    failed_at = None
    while True:
        # Every rank, every time: poll reaps a dead rank, whose zombie would still look alive to its peers.
        codes = [proc.poll() for proc in procs]
        if None not in codes:
            return _job_exit_code(procs, [], what)
        if failed_at is None and (any(code not in (None, 0) for code in codes) or failed()):
            failed_at = time.monotonic()
        waited = time.monotonic() - failed_at if failed_at is not None else 0.0
        if failed_at is not None and (waited > grace_s or all(
                _stopped(proc.pid) for proc, code in zip(procs, codes) if code is None)):
            stopped = _stop(procs, signal.SIGTERM, wait_s=stop_s, wake=wake)
            for rank in stopped:
                print(f"commbench: {what} {rank} was still running {waited:.1f} s after another {what} failed; "
                      f"stopped it", file=sys.stderr)
            return _job_exit_code(procs, stopped, what)
        time.sleep(POLL_S)


def _stopped(pid: int) -> bool:
    """Whether a process is stopped by a signal or traced (/proc/PID/stat's state T or t); False if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def interrupt(procs: list[subprocess.Popen], stop_s: float, wake: Callable[[], None] = lambda: None) -> None:
    """Ctrl-C: a terminal signals the whole process group, so the ranks have their SIGINT already;
    this one reaches ranks that had none (a SIGINT sent to this process only), and a rank acts on
    the first it gets only. Ranks then have INTERRUPT_WAIT_S to write their summaries."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
    try:
        for proc in procs:
            if proc.poll() is None:
                _signal(proc, signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        while time.monotonic() < deadline and any(proc.poll() is None for proc in procs):
            time.sleep(POLL_S)
        _stop(procs, signal.SIGTERM, wait_s=stop_s, wake=wake)
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Kill whatever is still running of `procs`, at once."""
    _stop(procs, signal.SIGKILL, wait_s=0.0)


def _stop(procs: list[subprocess.Popen], sig: int, wait_s: float, wake: Callable[[], None] = lambda: None) -> list[int]:
    """Signal the ranks still running (waking stopped ones), kill those that outlive `wait_s`. `wake`
    stops the processes these started (a launcher's ranks) alike: a rank is not left to its launcher,
    which may wait long for it (a stopped rank) or take long to end itself."""
    running = [rank for rank, proc in enumerate(procs) if proc.poll() is None]
    for rank in running:
        _signal(procs[rank], sig)
        _signal(procs[rank], signal.SIGCONT)  # a stopped (hung) process must run to handle it
    if running:
        wake()
    deadline = time.monotonic() + wait_s
    for rank in running:
        try:
            procs[rank].wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            procs[rank].kill()
            procs[rank].wait()
    return running


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def _why_killed(signum: int) -> str:
    """SIGKILL from nobody in particular is most often the kernel's: out of memory (a container's or a
    SLURM job's memory group has its own limit, below the host's RAM)."""
    if signum != signal.SIGKILL:
        return ""
    limit = memory_limit_bytes()
    allowed = "" if limit is None else f"; this host or its memory group allows {limit / 2**30:.1f} GiB in all"
    return f" (by hand, or out of memory: the kernel's OOM killer sends SIGKILL{allowed})"


def _job_exit_code(procs: list[subprocess.Popen], stopped: list[int], what: str = "rank") -> int:
    """The most telling exit code (telling_code): bad input (2) or a fault (3) beats wrong results (1)."""
    codes = [p.returncode for p in procs]
    for rank, code in enumerate(codes):
        if code is not None and code < 0 and rank not in stopped:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            print(f"commbench: {what} {rank} was killed by {name}{_why_killed(-code)}", file=sys.stderr)
    if all(c == 0 for c in codes):
        return EXIT_OK
    positive = [c for rank, c in enumerate(codes) if c and c > 0 and rank not in stopped]  # ours don't count
    return telling_code(positive)
