"""The job frame: how ranks come to exist and how they end, for every command that runs
ranks (sweep, proxy, train).

A command validates its options into a frozen config and a `Plan`: spawn local ranks,
join the job a launcher started (torchrun, srun, mpirun), or run every rank in this
process (sim, cuda's virtual and peer modes, a predicted proxy). `run` carries the plan
out. Every rank runs one job function (`JOBS`) inside `run_rank`, which maps exceptions
to the documented exit codes once for all jobs, and every spawned rank enters through
`python -m commbench.job`. launch.py holds the launchers' variables and the supervisor.

Exit codes: 0 ok, 1 wrong results, 2 bad input (or a model too large for memory),
3 a rank failed (died, hung past the timeout, out of memory while measuring), 130
interrupted.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from commbench.launch import SPAWN_VAR, LaunchInfo, detect_launcher, from_environment, spawn_local

EXIT_OK, EXIT_WRONG, EXIT_USAGE, EXIT_FAULT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
JOB_VAR = "COMMBENCH_JOB"  # a spawned rank's job: {"job": name, "config": JSON, "argv": [...]}

# job name -> (its config class, its rank function(cfg, launch, argv) -> exit code)
JOBS = {
    "sweep": ("commbench.bench:SweepConfig", "commbench.bench:run_sweep"),
    "proxy": ("commbench.proxies.config:ProxyConfig", "commbench.proxies.replay:run_proxy"),
    "train": ("commbench.proxies.config:ProxyConfig", "commbench.proxies.train:run_train"),
}
_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


class JobFault(RuntimeError):
    """The run cannot go on (a peer died or hung, out of memory); one line for the user.

    `agreed` faults are known to every rank with the same message (which names the rank
    at fault), so only rank 0 prints them."""

    def __init__(self, message: str, agreed: bool = False):
        super().__init__(message)
        self.agreed = agreed


@dataclass(frozen=True)
class Plan:
    mode: str  # spawn (local ranks), join (a launcher's job), local (every rank in this process)
    world: int
    launch: LaunchInfo | None = None  # when joining: who this process is
    nodes: int = 1
    ranks_per_node: int = 1
    note: str | None = None  # said once before running (e.g. why a proxy is predicted)

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
    launcher = launcher_of(launcher_option, env)
    if launcher in (None, "spawn") and SPAWN_VAR not in env:
        return launcher, None
    return launcher, from_environment(env, launcher or "spawn")


def launcher_of(launcher_option: str = "auto", env: Mapping[str, str] | None = None) -> str | None:
    """The launcher's name (`--launcher`, or what the environment shows), without reading its variables."""
    if launcher_option != "auto":
        return launcher_option
    return detect_launcher(os.environ if env is None else env)


def run(job: str, cfg: Any, plan: Plan, argv: list[str]) -> int:
    """Carry out a plan: spawn `plan.world` ranks of `job`, or run this process's rank(s)."""
    if plan.mode == "spawn":
        payload = json.dumps({"job": job, "config": cfg.to_json(), "argv": list(argv)})
        return spawn_local("commbench.job", plan.world, {JOB_VAR: payload})
    return _load(JOBS[job][1])(cfg, plan.launch or LaunchInfo.local(0, 1, 0), argv)


def end(code: int, plan: Plan) -> None:
    """Leave the command with `code`; a rank of a launcher's job skips the interpreter's teardown."""
    if plan.mode == "join":
        exit_now(code)
    sys.exit(code)


def run_rank(launch: LaunchInfo, timeout_s: float, body: Callable[[], int],
             on_fault: Callable[[str, str], None] | None = None, close: Callable[[], None] | None = None) -> int:
    """Run one rank's `body` (returns its exit code); every exception becomes one line on
    stderr and its documented exit code. `on_fault(status, error)` writes what the job keeps
    after a fault (its summary record); `close` releases the backend, always, quietly."""
    from commbench.backends.base import BackendError, OutOfMemory  # not at import: the CLI starts light

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
        return body()
    except (MemoryError, OutOfMemory) as exc:
        return fault(f"out of memory: {error_line(exc)}", EXIT_USAGE)
    except (BackendError, ValueError) as exc:  # ValueError: bad profiles and models, one line each
        return fault(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, EXIT_USAGE)
    except JobFault as exc:
        return fault(str(exc) if not exc.agreed or launch.rank == 0 else None, EXIT_FAULT, prefix=not exc.agreed)
    except RuntimeError as exc:  # torch: a peer died, a collective or the rendezvous timed out
        if any(marker in str(exc).lower() for marker in _OOM_MARKERS):
            return fault(f"out of memory: {error_line(exc)}", EXIT_USAGE)
        return fault(f"{error_line(exc)} (a peer rank may have died or hung, or never "
                     f"started; timeout {timeout_s:g} s)", EXIT_FAULT)
    except OSError as exc:  # a results file that cannot be written, a full disk
        return fault(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), EXIT_FAULT)
    except KeyboardInterrupt:
        return fault(None, EXIT_INTERRUPTED, "interrupted")
    finally:
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - tearing down after a fault must not raise a second error
                pass


def error_line(exc: BaseException) -> str:
    """The useful part of a library error: first line, without gloo's source location and boilerplate."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    line = re.sub(r"^\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", line)
    return line.split(". This is typically")[0].rstrip(".")


def fail(launch: LaunchInfo, message: str, prefix: bool = True) -> None:
    """One line on stderr, naming the rank when there are several."""
    who = f"rank {launch.rank}: " if prefix and launch.world_size > 1 else ""
    print(f"commbench: {who}{message}", file=sys.stderr, flush=True)


def exit_now(code: int) -> None:
    """End a rank once its run is over (records written, backend closed): skip the
    interpreter's teardown, where torch's distributed and thread-pool destructors have aborted
    a finished rank here ("terminate called without an active exception") and turned a clean
    run into a SIGABRT."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def main() -> None:
    """The rank entry of `python -m commbench.job` (launch.spawn_local starts it)."""
    payload = json.loads(os.environ[JOB_VAR])
    config_class, function = (_load(path) for path in JOBS[payload["job"]])
    exit_now(function(config_class.from_json(payload["config"]), from_environment(os.environ, "spawn"),
                      payload["argv"]))


if __name__ == "__main__":
    main()
