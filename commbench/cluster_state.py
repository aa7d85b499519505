"""An emulated cluster as commbench records it (commbench/emulate.py builds and removes it): the `Cluster`
value (its namespaces' names, node addresses, its owner and whether the owner still runs) and its state
file under STATE_DIR, one per cluster, written before anything is created and read back checked field by
field (a damaged or crafted file names no cluster). Nothing here runs `ip` or needs root."""
from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import asdict, dataclass

from commbench.files import UnreadableFile, read_small

PREFIX = "cbemu-"
STATE_DIR = os.environ.get("COMMBENCH_EMULATE_STATE", "/run/commbench/emulate")
SUBNET = "198.18.0."  # node I is SUBNET + (I + 1), /24, in every cluster (each has its own switch)
MAX_NODES = 64
MIN_RATE_BPS, MAX_RATE_BPS = 1_000_000, 100_000_000_000


@dataclass(frozen=True)
class Cluster:
    tag: str
    nodes: int
    ranks_per_node: int
    rate_bps: int
    owner_pid: int | None = None  # None: kept until `commbench emulate down`
    owner_start: int | None = None  # the owner's start time (clock ticks since boot): pids are reused
    created: float = 0.0

    @property
    def switch(self) -> str:
        return f"{PREFIX}{self.tag}-sw"

    def node(self, index: int) -> str:
        return f"{PREFIX}{self.tag}-n{index}"

    @staticmethod
    def address(index: int) -> str:
        return f"{SUBNET}{index + 1}"

    @property
    def namespaces(self) -> list[str]:
        return [self.node(i) for i in range(self.nodes)] + [self.switch]

    @property
    def shape(self) -> str:
        return f"{self.nodes}x{self.ranks_per_node}"

    def alive(self) -> bool:
        """Kept on purpose (no owner), or its owner still runs."""
        if self.owner_pid is None:
            return True
        return self.owner_pid > 0 and start_time(self.owner_pid) == self.owner_start


def tag_of(ns: str) -> str | None:
    """The cluster tag of a namespace commbench makes (cbemu-TAG-sw, cbemu-TAG-nI), else None."""
    match = re.fullmatch(rf"{PREFIX}([0-9a-f]+)-(?:sw|n\d+)", ns)
    return match.group(1) if match else None


def state_files() -> list[tuple[str, Cluster | None]]:
    """Each state file under STATE_DIR, by name: its path and its cluster, None for a file that is damaged or
    is not its own cluster's (TAG.json holds cluster TAG only)."""
    try:
        names = sorted(name for name in os.listdir(STATE_DIR) if name.endswith(".json"))
    except OSError:
        return []
    out = []
    for name in names:
        cluster = read_state(os.path.join(STATE_DIR, name))
        out.append((os.path.join(STATE_DIR, name), cluster if cluster and name == f"{cluster.tag}.json" else None))
    return out


def remove_file(path: str) -> None:
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass


def state_path(tag: str) -> str:
    return os.path.join(STATE_DIR, f"{tag}.json")


def write_state(cluster: Cluster) -> None:
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    path = state_path(cluster.tag)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(asdict(cluster), handle)
    os.replace(path + ".tmp", path)


def read_state(path: str) -> Cluster | None:
    """A state file, parsed as JSON and checked field by field (a damaged one is skipped, not trusted)."""
    try:
        data = json.loads(read_small(path, 4096, "a cluster's state"))
        tag = data["tag"]
        if not (isinstance(tag, str) and re.fullmatch(r"[0-9a-f]{1,32}", tag)):
            return None
        ints = {key: data.get(key) for key in ("nodes", "ranks_per_node", "rate_bps", "owner_pid", "owner_start")}
        if any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in ints.values()):
            return None
        created = float(data.get("created") or 0.0)
        if not (0 <= (ints["nodes"] or 0) <= MAX_NODES and 0 <= (ints["ranks_per_node"] or 0) <= 1 << 16
                and 0 <= (ints["rate_bps"] or 0) <= MAX_RATE_BPS and math.isfinite(created)):
            return None
        return Cluster(tag, ints["nodes"] or 0, ints["ranks_per_node"] or 0, ints["rate_bps"] or 0,
                       ints["owner_pid"], ints["owner_start"], created)
    except (UnreadableFile, ValueError, KeyError, TypeError, AttributeError):
        return None


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None
