"""The launchers commbench joins: who this process is in a job that torchrun, SLURM's srun or mpirun started
(or that commbench spawned itself, launch.spawn_local), read from the launcher's environment, with every
variable checked (one line naming it when it is missing or out of range). Spawning and supervising local
ranks is commbench/launch.py."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

SPAWN_VAR = "COMMBENCH_SPAWN_ID"  # set in ranks that commbench spawned itself
EMULATED_VAR = "COMMBENCH_EMULATED"  # on an emulated cluster: its shape and links, said in the header
DEFAULT_PORT = 29500


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
