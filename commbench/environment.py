"""What a run's header says about where it ran: this process's host and device, and the software
versions (python, commbench and its commit, numpy, torch, CUDA, NCCL, driver, CuPy, platform)."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Variables that change how a collective runs: NCCL's and gloo's tuning, torch's distributed
# switches, the fabric libraries NCCL and MPI load, and which devices and threads a rank sees.
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_GLOO_", "UCX_", "FI_", "OMPI_MCA_",
                "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS", "OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT",
                "COMMBENCH_EMULATED")


def communication_variables(environ: dict[str, str] | None = None) -> dict[str, str]:
    """This process's variables that shape its collectives (ENV_PREFIXES), sorted by name."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in sorted(environ) if name.startswith(ENV_PREFIXES)}


def local_environment(device_name: str) -> dict[str, Any]:
    """What this process runs on; the harness gathers it from every rank."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "device": device_name, "cpu": _cpu_model(),
            "cpus": usable_cpus(), "llc_bytes": last_level_cache_bytes(), "env": communication_variables()}


def software_versions() -> dict[str, Any]:
    versions: dict[str, Any] = {"python": platform.python_version(), "commbench": _version("commbench"),
                                "numpy": _version("numpy"), "torch": _version("torch"),
                                "cupy": _version("cupy-cuda12x") or _version("cupy-cuda13x") or _version("cupy"),
                                "commit": _git_commit(), "platform": platform.platform()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            nccl = torch.cuda.nccl.version()
            versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
            versions["driver"] = _nvidia_driver()
    return versions


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.splitlines()[0].strip() if out.stdout.strip() else None


def last_level_cache_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size of the CPU's last-level data cache (the highest level of index*/: Data or Unified), from
    sysfs; None where it does not say. `commbench fit` places a CPU sweep's cache boundary there when the
    data put it between the same two sizes (docs/model.md, Caches)."""
    best: tuple[int, int] | None = None
    try:
        entries = sorted(os.listdir(sysfs))
    except OSError:
        return None
    for entry in (e for e in entries if e.startswith("index")):
        try:
            with open(os.path.join(sysfs, entry, "type"), encoding="utf-8") as handle:
                kind = handle.read().strip()
            with open(os.path.join(sysfs, entry, "level"), encoding="utf-8") as handle:
                level = int(handle.read().strip())
            with open(os.path.join(sysfs, entry, "size"), encoding="utf-8") as handle:
                text = handle.read().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        digits, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1)
        whole = digits.isascii() and digits.isdigit() and int(digits) > 0
        if kind in ("Data", "Unified") and whole and (best is None or level > best[0]):
            best = (level, int(digits) * unit)
    return best[1] if best else None


def usable_cpus() -> int | None:
    """The cores this process may run on (its affinity: a container or taskset may allow fewer than the
    host has), else the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def memory_limit_bytes(cgroup_root: str = "/sys/fs/cgroup", proc_self: str = "/proc/self/cgroup") -> int | None:
    """The memory this process may use: the host's RAM, or its memory group's limit when lower (a
    container, a SLURM job: cgroup v2 memory.max, v1 memory.limit_in_bytes). Every check of memory
    reads this, so that a run refused or warned of is refused in a group as on the bare host."""
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no estimate
        host = None
    limits = [limit for limit in _cgroup_limits(cgroup_root, proc_self) if limit > 0]
    return min([*limits, *([host] if host else [])], default=None)


def _cgroup_limits(cgroup_root: str, proc_self: str) -> list[int]:
    """The memory limits of this process's groups (v2 memory.max, v1 memory.limit_in_bytes), each
    group from its own up to the root: a parent's limit holds for its children."""
    try:
        with open(proc_self, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    limits = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one unified hierarchy
            folder, name = cgroup_root, "memory.max"
        elif "memory" in controllers.split(","):
            folder, name = os.path.join(cgroup_root, "memory"), "memory.limit_in_bytes"
        else:
            continue
        parts = [part for part in path.split("/") if part and part != ".."]
        for depth in range(len(parts), -1, -1):
            limits += _read_limit(os.path.join(folder, *parts[:depth], name))
    return limits


def _read_limit(path: str) -> list[int]:
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return []
    return [int(text)] if text.isdigit() else []  # "max": no limit
