"""What a run's header says about where it ran: this process's host, device and GPUs (model, memory,
bus id, compute capability), and the software versions (python, commbench and its commit, numpy,
torch, CuPy, CUDA runtime, NCCL as loaded, driver, platform).

Versions are spelled one way in every header, whichever backend ran: torch as its own version.py
says (2.11.0+cu130, read as text when torch is not imported), CuPy as its distribution says. The
CUDA runtime and NCCL are the libraries loaded in this process (CuPy's runtime and
cupy.cuda.nccl.get_version(), or torch's), not an environment variable. GPU details come only
from a library the run already imported (CuPy or torch): this module imports neither."""
from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
from collections import Counter
from importlib import metadata, util
from typing import Any


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git(folder: str, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", folder, *args], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _git_commit(package_dir: str | None = None) -> str | None:
    """The commit of commbench's own checkout: only when the git work tree's top is the folder that
    holds this package (an exported tree inside an unrelated repository has no commit of its own)."""
    here = package_dir or os.path.dirname(os.path.abspath(__file__))
    top = _git(here, "rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(os.path.dirname(here)):
        return None
    return _git(here, "rev-parse", "--short", "HEAD")


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


def local_environment(device_name: str, gpus: list[int] | None = None) -> dict[str, Any]:
    """What this process runs on; the harness gathers it from every rank. `cpus` is the host's cores,
    `cpu_affinity` those this rank may run on (host_cores counts a host's ranks together). On a GPU:
    `gpus`, the devices this rank drives (default: torch's current one), each described."""
    env = {"host": socket.gethostname(), "pid": os.getpid(), "device": device_name, "cpu": _cpu_model(),
           "cpus": os.cpu_count(), "cpu_affinity": affinity_text(cpu_affinity()),
           "llc_bytes": last_level_cache_bytes(), "load_average": load_average(), "env": communication_variables()}
    if device_name == "cuda":
        env["gpus"] = describe_gpus(gpus)
    return env


def load_average() -> float | None:
    """The host's 1-minute load average as the run starts (other work on its cores; None where the system has
    none): a fit says when its points were measured on a busy host."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def describe_gpus(gpus: list[int] | None = None) -> list[dict[str, Any]]:
    """Model, memory, PCI bus id and compute capability of each GPU, from CuPy or torch (whichever
    this process imported; CuPy first); [] when neither can say."""
    cupy, torch = sys.modules.get("cupy"), sys.modules.get("torch")
    try:
        if cupy is not None:
            return [_cupy_gpu(cupy, index) for index in (gpus if gpus is not None else [cupy.cuda.Device().id])]
        if torch is not None and torch.cuda.is_available():
            return [_torch_gpu(torch, index) for index in (gpus if gpus is not None else [torch.cuda.current_device()])]
    except Exception:  # noqa: BLE001 - a header field must never end a run
        return []
    return []


def _cupy_gpu(cupy: Any, index: int) -> dict[str, Any]:
    props, device = cupy.cuda.runtime.getDeviceProperties(index), cupy.cuda.Device(index)
    name = props["name"]
    return {"index": index, "model": name.decode() if isinstance(name, bytes) else str(name),
            "memory_bytes": int(props["totalGlobalMem"]), "bus_id": str(device.pci_bus_id),
            "compute_capability": f"{props['major']}.{props['minor']}"}


def _torch_gpu(torch: Any, index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    bus_id = (f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
              if isinstance(bus, int) else None)
    return {"index": index, "model": props.name, "memory_bytes": int(props.total_memory), "bus_id": bus_id,
            "compute_capability": f"{props.major}.{props.minor}"}


def torch_version() -> str | None:
    """torch's full version (2.11.0+cu130): torch.__version__ when imported, else the same string read
    as text from torch/version.py (never imported: the header must not pay torch's import)."""
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__version__", None):
        return str(torch.__version__)
    try:
        spec = util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(folder, "version.py"), encoding="utf-8") as handle:
                found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", handle.read(), re.MULTILINE)
        except OSError:
            continue
        if found:
            return found.group(1)
    return _version("torch")


def cupy_version() -> str | None:
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(getattr(cupy, "__version__", None), str):
        return cupy.__version__
    return _version("cupy-cuda12x") or _version("cupy-cuda13x") or _version("cupy")


def software_versions() -> dict[str, Any]:
    versions: dict[str, Any] = {"python": platform.python_version(), "commbench": _version("commbench"),
                                "numpy": _version("numpy"), "torch": torch_version(), "cupy": cupy_version(),
                                "commit": _git_commit(), "platform": platform.platform()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["cuda"] = torch.version.cuda
    versions.update(_loaded_gpu_libraries(sys.modules.get("cupy"), torch))
    return versions


def cuda_text(code: int) -> str:
    """CUDA's integer version (13000) as text (13.0)."""
    return f"{int(code) // 1000}.{int(code) % 1000 // 10}"


def nccl_text(code: int) -> str:
    """NCCL's integer version (22809, from 2.9 on: major*10000 + minor*100 + patch) as text (2.28.9)."""
    code = int(code)
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}" if code >= 20900 else \
        f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _loaded_gpu_libraries(cupy: Any, torch: Any) -> dict[str, Any]:
    """CUDA runtime, NCCL and driver as this process loaded them (CuPy's first, then torch's)."""
    found: dict[str, Any] = {}
    torch_gpu = torch is not None and torch.cuda.is_available()
    try:
        if cupy is not None:
            found["cuda_runtime"] = cuda_text(cupy.cuda.runtime.runtimeGetVersion())
            nccl = getattr(cupy.cuda, "nccl", None) or sys.modules.get("cupy.cuda.nccl")
            if nccl is not None and getattr(nccl, "available", True):
                found["nccl"] = nccl_text(nccl.get_version())
        if torch_gpu:
            found.setdefault("cuda_runtime", torch.version.cuda)
            nccl = torch.cuda.nccl.version()
            text = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
            if found.setdefault("nccl", text) != text:
                found["nccl_torch"] = text
    except Exception:  # noqa: BLE001 - a header field must never end a run
        pass
    if cupy is not None or torch_gpu:
        found["driver"] = _nvidia_driver()
    return found


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
    host has), else the host's count. What matters where this process's own children will run (ranks
    spawned here inherit it); a launched rank's own affinity says nothing of the host: mpirun binds
    each rank to one core (host_cores below counts a host's ranks together)."""
    affinity = cpu_affinity()
    return len(affinity) if affinity is not None else os.cpu_count()


def cpu_affinity() -> frozenset[int] | None:
    """The CPUs this process may run on, None where the system does not say."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


MAX_CPU_ID = 1 << 16  # a CPU number beyond any kernel's (NR_CPUS is at most 8192): a header saying more is damaged


def affinity_text(cpus: frozenset[int] | None) -> str | None:
    """CPUs as taskset -c lists them: '0-3,8,10-11' (None stays None)."""
    if cpus is None:
        return None
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_affinity(text: Any) -> list[tuple[int, int]] | None:
    """The CPU ranges (first, last) of an affinity_text, None when it is not one (a file's header is not
    trusted: ranges are counted, never expanded, and a CPU number past MAX_CPU_ID is refused)."""
    if not isinstance(text, str) or not text:
        return None
    ranges = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if not (first.isascii() and first.isdigit() and (not dash or last.isascii() and last.isdigit())):
            return None
        low, high = int(first), int(last or first)
        if not low <= high < MAX_CPU_ID:
            return None
        ranges.append((low, high))
    return ranges


def _cpus_in(ranges: list[tuple[int, int]]) -> int:
    """How many CPUs the union of `ranges` holds."""
    count, end = 0, -1
    for low, high in sorted(ranges):
        if high > end:
            count += high - max(low, end + 1) + 1
            end = high
    return count


def host_cores(ranks: list[dict]) -> dict[str, tuple[int | None, int | None]]:
    """Per host of a run header's `ranks` (the environment each rank gave): (the cores its ranks could run
    on together, the host's cores). The first is the union of the ranks' `cpu_affinity` when each of them
    gave one: a container or taskset may allow fewer than the host has, and a launcher that binds each
    rank to a core of its own (mpirun) gives the ranks as many cores as ranks. A header from before
    `cpu_affinity` gave only `cpus`, then each rank's own affinity: the fewest of those. None: not said."""
    by_host: dict[str, list[dict]] = {}
    for entry in ranks:
        by_host.setdefault(str(entry.get("host")), []).append(entry)
    out = {}
    for host, entries in by_host.items():
        counts = [e.get("cpus") for e in entries if type(e.get("cpus")) is int and e.get("cpus") > 0]
        texts = [e.get("cpu_affinity") for e in entries]
        parsed = [parse_affinity(t) for t in dict.fromkeys(t if isinstance(t, str) else None for t in texts)]
        if all(parsed):  # each distinct text once: a header's ranks mostly repeat a few
            usable = _cpus_in([r for ranges in parsed for r in ranges])
            out[host] = (min(usable, max(counts)) if counts else usable, max(counts) if counts else None)
        else:  # the host's own count is not in such a header
            out[host] = (min(counts) if counts else None, None)
    return out


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


def oversubscribed(environment: list[dict]) -> str | None:
    """'N ranks on a host of C cores' for a host whose ranks outnumber the cores they may run on together
    (host_cores: their affinities' union, not one rank's: mpirun binds each to its own core),
    or None. '... on C of the host's H cores' when their affinity allows fewer than the host has."""
    ranks = Counter(str(e.get("host")) for e in environment)
    cores = host_cores(environment)
    crowded = [(n, *cores[h]) for h, n in ranks.items() if cores[h][0] and cores[h][0] < n]
    if not crowded:
        return None
    n, usable, host = crowded[0]
    return f"{n} ranks on a host of {usable} cores" if host in (None, usable) else \
        f"{n} ranks on {usable} of the host's {host} cores, by their CPU affinity"
