"""Where a run's ranks ran, from its header (docs/model.md, "Oversubscribed runs"): the busiest host's
device, ranks and cores (HostLoad), what a fit records of its hosts (`meta.measured_on`, their
last-level cache), and the refusal to predict more CPU ranks per host than a fit's host had cores."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from commbench.backends.registry import record_capabilities
from commbench.costmodel import Hardware
from commbench.environment import host_cores


# Where a run's ranks ran (docs/model.md, "Oversubscribed runs"). The model has no notion of cores:
# CPU ranks beyond a host's cores take turns on them, and a sweep of shm at 3-4 ranks on 2 cores
# ran 2.7-4.5x slower than a 2-rank fit predicts. So a fit records the host it was measured on
# (`meta.measured_on`), `predict` refuses CPU ranks per node beyond its cores, and `check` marks
# measured runs whose ranks outnumber their host's cores and leaves them out of its summary.
@dataclass(frozen=True)
class HostLoad:
    """What a run's header says of its busiest host: its device, the most ranks on one host, and
    that host's cores (None when the header does not say)."""
    device: str
    ranks_per_host: int
    cpus: int | None

    @property
    def oversubscribed(self) -> str | None:
        """"N ranks on C cores" when CPU ranks outnumber their host's cores, else None (GPU ranks,
        cores unknown, or enough of them)."""
        if self.device != "cpu" or not self.cpus or self.ranks_per_host <= self.cpus:
            return None
        return f"{self.ranks_per_host} ranks on {self.cpus} cores"


def host_load(header: dict | None) -> HostLoad | None:
    """A run header's busiest host (the most ranks per core), from the environment every rank gave
    (`ranks`: host, device, cpus, cpu_affinity; its cores are those its ranks could run on together,
    environment.host_cores); None when the header has no such list."""
    listed = (header or {}).get("ranks")
    ranks = [e for e in listed if isinstance(e, dict)] if isinstance(listed, list) else []
    if not ranks:
        return None
    per_host = Counter(str(e.get("host")) for e in ranks)
    cores = {host: usable for host, (usable, _) in host_cores(ranks).items()}  # the ranks' cores, not one rank's
    devices = {str(e.get("device") or header.get("device") or "cpu") for e in ranks}
    device = "cpu" if devices == {"cpu"} else sorted(devices - {"cpu"})[0]  # any GPU rank: a GPU run

    def load(host: str) -> float:
        cpus = cores[host]
        return per_host[host] / cpus if isinstance(cpus, int) and cpus > 0 else 0.0

    busiest = max(per_host, key=lambda h: (load(h), per_host[h]))
    cpus = cores[busiest]
    return HostLoad(device, per_host[busiest], cpus if isinstance(cpus, int) and cpus > 0 else None)


LOADED_PER_CORE = 1.5  # a host's load average beyond this many per core: other work shared the cores with the run


def busy_hosts(records: list[dict]) -> str | None:
    """"load average L on C cores" of the busiest host any run header among `records` names, where the load
    beyond its cores says other work shared them while the run was measured (LOADED_PER_CORE); else None."""
    worst = None
    for r in records:
        listed = r.get("ranks") if r.get("record") == "header" else None
        for e in listed if isinstance(listed, list) else []:
            load, cpus = (e.get("load_average"), e.get("cpus")) if isinstance(e, dict) else (None, None)
            if isinstance(load, (int, float)) and not isinstance(load, bool) and type(cpus) is int and cpus > 0 \
                    and load > LOADED_PER_CORE * cpus and (worst is None or load / cpus > worst[0] / worst[1]):
                worst = (float(load), cpus)
    return None if worst is None else f"load average {worst[0]:.1f} on {worst[1]} cores"


def run_loads(records: list[dict]) -> dict:
    """Each run id's HostLoad, from its header record (runs without one are absent)."""
    out = {}
    for r in records:
        if r.get("record") == "header" and isinstance(r.get("run_id"), str):
            load = host_load(r)
            if load is not None:
                out[r["run_id"]] = load
    return out


def measured_on(chosen: list[dict], records: list[dict]) -> dict | None:
    """`meta.measured_on` of a fit of `chosen` (whose headers are among `records`): the device its
    points ran on, the most ranks one host ran and the fewest cores of those hosts (null when no
    header says). None for simulated points (they ran on no host)."""
    if not all(record_capabilities(r).measured for r in chosen):
        return None
    loads = run_loads(records)
    devices, ranks, cpus = set(), [], []
    for r in chosen:
        load = loads.get(r.get("run_id"))
        if load is None:
            devices.add(str(r.get("device") or "unknown"))
            nodes = int(r.get("nnodes") or 1)
            ranks.append(int(r["world_size"]) // nodes if int(r["world_size"]) % nodes == 0 else int(r["world_size"]))
        else:
            devices.add(load.device)
            ranks.append(load.ranks_per_host)
            if load.cpus:
                cpus.append(load.cpus)
    device = "cpu" if devices == {"cpu"} else "+".join(sorted(devices))
    return {"device": device, "cpus": min(cpus) if cpus else None, "ranks_per_host": max(ranks)}


def oversubscription(hw: Hardware, ranks_per_node: int) -> str | None:
    """Why `hw` cannot predict `ranks_per_node` ranks on one node (one line), or None when it can: a fit
    measured on CPU ranks (`meta.measured_on`) says nothing of more ranks per host than that host had
    cores, unless its own points ran that many. Presets, GPU fits and fits from before measured_on
    (2026-11-23) are not refused. A damaged block is a HardwareError."""
    from commbench.costmodel import HardwareError

    where = hw.meta.get("measured_on")
    if where is None:
        return None
    cpus, ranks = (where.get("cpus"), where.get("ranks_per_host")) if isinstance(where, dict) else (None, None)
    if not isinstance(where, dict) or not isinstance(where.get("device"), str) \
            or not (cpus is None or isinstance(cpus, int) and cpus > 0) or not (isinstance(ranks, int) and ranks > 0):
        raise HardwareError(f"{hw.name}: meta.measured_on is not what `commbench fit` writes (device, cpus, "
                            f"ranks_per_host); fit again, or remove the block") from None
    if where["device"] != "cpu" or cpus is None or ranks_per_node <= max(cpus, ranks):
        return None
    return (f"{ranks_per_node} ranks per node: {hw.name} was fitted on CPU ranks of a host with {cpus} cores, and "
            f"the model has no notion of cores (oversubscribed ranks take turns on them: shm at 3-4 ranks on 2 "
            f"cores ran 2.7-4.5x slower than predicted, docs/model.md); predict at most {max(cpus, ranks)} ranks "
            f"per node, or fit a sweep measured at this many ranks")


def host_cache_bytes(chosen: list[dict], records: list[dict]) -> int | None:
    """The smallest last-level cache that the hosts of `chosen`'s runs report (their headers' `ranks`,
    `llc_bytes`), None when no header says or the points were simulated (they ran on no host)."""
    if not all(record_capabilities(r).measured for r in chosen):
        return None
    runs = {r.get("run_id") for r in chosen if isinstance(r.get("run_id"), str)}
    sizes = [e.get("llc_bytes") for h in records if h.get("record") == "header"
             and isinstance(h.get("run_id"), str) and h["run_id"] in runs
             for e in (h.get("ranks") if isinstance(h.get("ranks"), list) else []) if isinstance(e, dict)]
    sizes = [s for s in sizes if type(s) is int and s > 0]
    return min(sizes) if sizes else None
