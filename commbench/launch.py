"""Launch: join the job a launcher started (torchrun, SLURM srun, mpirun), or spawn local ranks.

Under a launcher every process runs the same `commbench ...` command; this module
reads who it is from the launcher's environment. Without one, the command spawns
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
from dataclasses import dataclass

from commbench.environment import memory_limit_bytes
from commbench.errors import EXIT_INTERRUPTED, EXIT_OK, telling_code

SPAWN_VAR = "COMMBENCH_SPAWN_ID"  # set in ranks that commbench spawned itself
EMULATED_VAR = "COMMBENCH_EMULATED"  # on an emulated cluster: its shape and links, said in the header
EXIT_DIR_VAR = "COMMBENCH_EXIT_DIR"  # where each rank of an emulated run leaves its exit code
JOB_TAG_VAR = "COMMBENCH_JOB_TAG"  # starts every job id, so the segments of jobs under a tag begin cb_<tag>
WATCHDOG_VAR = "COMMBENCH_WATCHDOG_FD"  # a spawned rank's end of a pipe that reads EOF when its spawner dies
SHM_DIR = "/dev/shm"  # where --backend shm keeps its segments, named cb_<job>_...
DEFAULT_PORT = 29500
POLL_S = 0.05  # how often the supervisor looks at its ranks
INTERRUPT_WAIT_S = 5.0  # after Ctrl-C: how long ranks get to write their summaries before they are stopped


class LaunchError(RuntimeError):
    """The launcher environment is incomplete or inconsistent (one line for the user)."""


@dataclass(frozen=True)
class LaunchInfo:
    launcher: str  # spawn, torchrun, slurm, mpi, or single
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int

    @classmethod
    def local(cls, rank: int, world_size: int, master_port: int, launcher: str = "single") -> LaunchInfo:
        """All ranks on this host, rendezvous on loopback (library use, benchmarks, tests)."""
        return cls(launcher, rank, world_size, rank, world_size, 0, 1, "127.0.0.1", master_port)


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    """A launcher's integer variable, or one line naming it: missing (without a default), not an
    integer, or below `minimum` (counts are at least 1, ranks and ids at least 0)."""
    if name not in env and default is not None:
        return default
    try:
        value = int(env[name])
    except KeyError:
        raise LaunchError(f"launcher variable {name} is missing") from None
    except ValueError:
        raise LaunchError(f"launcher variable {name}={env[name]!r} is not an integer") from None
    if value < minimum:
        raise LaunchError(f"launcher variable {name}={value} must be at least {minimum}")
    return value


def _below(value: int, name: str, limit: int, limit_name: str) -> int:
    if value >= limit:
        raise LaunchError(f"launcher variable {name}={value} must be below {limit_name}={limit}")
    return value


def _port(env: Mapping[str, str], default: int) -> int:
    if not env.get("MASTER_PORT"):
        return default
    port = _int(env, "MASTER_PORT")
    if not 1 <= port <= 65535:
        raise LaunchError(f"launcher variable MASTER_PORT={port} is not a TCP port (1-65535)")
    return port


def detect_launcher(env: Mapping[str, str]) -> str | None:
    """Which launcher started this process, or None when commbench runs on its own."""
    if SPAWN_VAR in env and "RANK" in env:
        return "spawn"
    if "TORCHELASTIC_RUN_ID" in env or ("RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env):
        return "torchrun"
    # srun sets SLURM_STEP_ID; a plain sbatch script (one task, not launched by srun) does not.
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        return "slurm"
    if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env or "PMIX_RANK" in env:
        return "mpi"
    return None


def from_environment(env: Mapping[str, str], launcher: str) -> LaunchInfo:
    """Read rank, world size and rendezvous address from a launcher's variables; a variable that is
    missing, not an integer or out of range is a LaunchError naming it (one line for the user)."""
    if launcher in ("torchrun", "spawn"):
        return _from_torchrun(env, launcher)
    if launcher == "slurm":
        return _from_slurm(env)
    if launcher == "mpi":
        return _from_mpi(env)
    raise LaunchError(f"unknown launcher {launcher!r}")


def _from_torchrun(env: Mapping[str, str], launcher: str) -> LaunchInfo:
    world = _int(env, "WORLD_SIZE", minimum=1)
    rank = _below(_int(env, "RANK"), "RANK", world, "WORLD_SIZE")
    local_world = _int(env, "LOCAL_WORLD_SIZE", world, minimum=1)
    if local_world > world:
        raise LaunchError(f"launcher variable LOCAL_WORLD_SIZE={local_world} is more than WORLD_SIZE={world}")
    local_rank = _below(_int(env, "LOCAL_RANK"), "LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE")
    node_var = "GROUP_RANK" if "GROUP_RANK" in env else "NODE_RANK"
    return LaunchInfo(launcher, rank, world, local_rank, local_world, _int(env, node_var, 0),
                      max(1, world // local_world), env.get("MASTER_ADDR") or "127.0.0.1", _port(env, DEFAULT_PORT))


def _from_slurm(env: Mapping[str, str]) -> LaunchInfo:
    world = _int(env, "SLURM_NTASKS", minimum=1)
    rank = _below(_int(env, "SLURM_PROCID"), "SLURM_PROCID", world, "SLURM_NTASKS")
    nodes_var = "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env else "SLURM_NNODES"
    nnodes = _int(env, nodes_var, 1, minimum=1)
    local_world = world // nnodes if world % nnodes == 0 else first_count(env.get("SLURM_STEP_TASKS_PER_NODE", "1"))
    master = env.get("MASTER_ADDR") or _first_host(env)
    job_id = _int(env, "SLURM_JOB_ID", 0)
    return LaunchInfo("slurm", rank, world, _int(env, "SLURM_LOCALID"), max(1, local_world),
                      _int(env, "SLURM_NODEID", 0), nnodes, master, _port(env, 10000 + job_id % 20000))


def _first_host(env: Mapping[str, str]) -> str:
    """The first host of the step's node list: where rank 0 serves the rendezvous."""
    name = next((n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(n)), None)
    if name is None:
        raise LaunchError("SLURM job without SLURM_STEP_NODELIST/SLURM_JOB_NODELIST: set MASTER_ADDR")
    try:
        hosts = expand_hostlist(env[name])
    except ValueError:
        hosts = []
    if not hosts or any(char in hosts[0] for char in "[],"):
        raise LaunchError(f"launcher variable {name}={env[name]!r} is not a SLURM host list (e.g. gpu[01-04],cpu7)")
    return hosts[0]


def _from_mpi(env: Mapping[str, str]) -> LaunchInfo:
    if "OMPI_COMM_WORLD_RANK" in env:
        world = _int(env, "OMPI_COMM_WORLD_SIZE", minimum=1)
        rank = _below(_int(env, "OMPI_COMM_WORLD_RANK"), "OMPI_COMM_WORLD_RANK", world, "OMPI_COMM_WORLD_SIZE")
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1)
        local_rank = _below(_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), "OMPI_COMM_WORLD_LOCAL_RANK", local_world,
                            "OMPI_COMM_WORLD_LOCAL_SIZE")
    else:  # MPICH / Intel MPI (Hydra) or PMIx
        prefix = "PMI" if "PMI_RANK" in env else "PMIX"
        world = _int(env, f"{prefix}_SIZE", minimum=1)
        rank = _below(_int(env, f"{prefix}_RANK"), f"{prefix}_RANK", world, f"{prefix}_SIZE")
        local_rank = _int(env, "MPI_LOCALRANKID", _int(env, "PMI_LOCAL_RANK", 0))
        local_world = _int(env, "MPI_LOCALNRANKS", _int(env, "PMI_LOCAL_SIZE", world, minimum=1), minimum=1)
    master = env.get("MASTER_ADDR")
    if not master:
        if local_world != world:
            raise LaunchError("multi-node MPI job: export MASTER_ADDR=<host of rank 0> to every rank "
                              "(e.g. mpirun -x MASTER_ADDR=$(hostname) ...)")
        master = "127.0.0.1"
    return LaunchInfo("mpi", rank, world, local_rank, local_world, rank // local_world, max(1, world // local_world),
                      master, _port(env, DEFAULT_PORT))


def first_count(tasks_per_node: str) -> int:
    """SLURM's `2(x3),1` tasks-per-node format: the first node's count."""
    match = re.match(r"(\d+)", tasks_per_node)
    return int(match.group(1)) if match else 1


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand SLURM's compressed host list: `gpu[01-03,07],cpu5` -> gpu01 gpu02 gpu03 gpu07 cpu5."""
    hosts: list[str] = []
    part, depth = "", 0
    for char in hostlist + ",":
        if char == "," and depth == 0:
            hosts.extend(host for host in _expand_one(part.strip()) if host)
            part = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        part += char
    return hosts


def _expand_one(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    out = []
    for item in match.group(1).split(","):
        low, _, high = item.partition("-")
        values = [low] if not high else [str(v).zfill(len(low)) for v in range(int(low), int(high) + 1)]
        for value in values:
            out.extend(head + value + rest for rest in _expand_one(tail))
    return out


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
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nprocs),
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
                env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
                procs.append(subprocess.Popen(rank_argv(module), env=env, pass_fds=(watch_read,)))
        finally:
            os.close(watch_read)
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
    the job's exit code."""
    failed_at = None
    while True:
        # Every rank, every time: poll reaps a dead rank, whose zombie would still look alive to its peers.
        codes = [proc.poll() for proc in procs]
        if None not in codes:
            return _job_exit_code(procs, [], what)
        if failed_at is None and (any(code not in (None, 0) for code in codes) or failed()):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            stopped = _stop(procs, signal.SIGTERM, wait_s=stop_s, wake=wake)
            for rank in stopped:
                print(f"commbench: {what} {rank} was still running {grace_s:.2g} s after another {what} failed; "
                      f"stopped it", file=sys.stderr)
            return _job_exit_code(procs, stopped, what)
        time.sleep(POLL_S)


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
