"""An emulated cluster on one Linux host: nodes in network namespaces, joined by rate-limited links.

Layout of a cluster `TAG` of N nodes (docs/emulation.md):
- one network namespace per node, `cbemu-TAG-nI`, holding one interface, `cbnic`, with the
  address 198.18.0.(I+1)/24 (198.18.0.0/15 is reserved for network benchmarking, RFC 2544);
- one namespace for the switch, `cbemu-TAG-sw`, holding a bridge and one port `pI` per node;
  node I's `cbnic` and the switch's `pI` are the two ends of one veth pair (the node's cable);
- `tc tbf` at the link rate on both ends: on `cbnic` (what the node's NIC sends) and on `pI`
  (what the switch sends the node: what its NIC receives). There is no added delay: this kernel
  has no netem, so a link has a rate and veth's own (microsecond) latency.
Nothing is created in, or changed of, the host's own network namespace.

Each cluster has a state file under cluster_state.STATE_DIR, written before anything is created, that names
its owner: the commbench process of an `--emulate` run (the cluster goes when it ends), or none
for `commbench emulate up` (kept until `down`). `clean` removes every cluster whose owner has died,
and any `cbemu-` namespace that no state file accounts for, with the processes still inside,
and the shared-memory segments of its runs. How a job runs on a cluster: emulated_run.py.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence

from commbench import cluster_state
from commbench.cluster_state import (
    MAX_NODES,
    MAX_RATE_BPS,
    MIN_RATE_BPS,
    PREFIX,
    Cluster,
    remove_file,
    start_time,
    state_files,
    state_path,
    tag_of,
    write_state,
)
from commbench.launch import remove_segments

NIC = "cbnic"  # every node's interface, inside its own namespace
RDZV_PORT = 29400  # torchrun's c10d rendezvous, on node 0's address (inside the cluster only)
UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
TBF_LATENCY_MS = 100  # tbf's queue: what a link holds at its rate before it drops (TCP backs off then)
GSO_BYTES = 65536 + 1500  # a veth hands tbf segments of up to 64 KiB (GSO): the bucket must hold one
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


class EmulateError(RuntimeError):
    """The cluster cannot be built or used (one line for the user)."""


# ------------------------------------------------------------------------------------ parsing

def parse_shape(text: str) -> tuple[int, int]:
    """'NODESxRANKS' -> (nodes, ranks per node), or EmulateError."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text or "")
    if not match:
        raise EmulateError(f"--emulate {text!r}: expected NODESxRANKS, e.g. 2x2 (2 nodes of 2 ranks)")
    nodes, ranks = int(match.group(1)), int(match.group(2))
    if not 1 <= nodes <= MAX_NODES:
        raise EmulateError(f"--emulate {text}: 1 to {MAX_NODES} nodes")
    if ranks < 1:
        raise EmulateError(f"--emulate {text}: at least 1 rank per node")
    return nodes, ranks


def parse_rate(text: str) -> int:
    """A link rate in tc's units (100mbit, 1gbit, 2.5gbit; SI: 1gbit = 1e9 bit/s) -> bit/s."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text or "")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in UNITS:
        raise EmulateError(f"--link {text!r}: expected a rate such as 100mbit, 1gbit or 2.5gbit")
    rate = int(float(match.group(1)) * UNITS[unit])
    if not MIN_RATE_BPS <= rate <= MAX_RATE_BPS:
        raise EmulateError(f"--link {text}: between {rate_text(MIN_RATE_BPS)} and {rate_text(MAX_RATE_BPS)}")
    return rate


def rate_text(bps: float) -> str:
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bps >= UNITS[unit]:
            return f"{bps / UNITS[unit]:.4g}{unit}"
    return f"{bps:g}bit"


# ------------------------------------------------------------------------------ privileges

def require_privileges(what: str = "--emulate") -> None:
    """One line naming what is missing: the `ip` or `tc` command (iproute2), root's rights over
    network namespaces (CAP_NET_ADMIN for links, CAP_SYS_ADMIN for `ip netns`' mounts), or a
    writable STATE_DIR."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise EmulateError(f"{what} needs {' and '.join(missing)} (iproute2: apt-get install iproute2), "
                           f"not found on PATH")
    lacking = [name for bit, name in ((CAP_NET_ADMIN, "CAP_NET_ADMIN"), (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not _has_capability(bit)]
    if lacking:
        raise EmulateError(f"{what} needs root to create network namespaces ({' and '.join(lacking)} missing: "
                           f"run as root, e.g. sudo, or in a container with --cap-add NET_ADMIN --cap-add "
                           f"SYS_ADMIN)")
    state = cluster_state.STATE_DIR
    try:
        os.makedirs(state, mode=0o755, exist_ok=True)
    except OSError as exc:
        raise EmulateError(f"{what} keeps its clusters' state in {state}: {exc.strerror or exc}") from None
    if not os.access(state, os.W_OK):
        raise EmulateError(f"{what} keeps its clusters' state in {state}, which this user cannot write")


def _has_capability(bit: int) -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


# -------------------------------------------------------------------------- build and remove

def create(nodes: int, ranks_per_node: int, rate_bps: int, owned: bool = True) -> Cluster:
    """Build a cluster (its state file first, so that a crash half-way leaves nothing `clean` misses)."""
    require_privileges()
    me = os.getpid()
    cluster = Cluster(uuid.uuid4().hex[:8], nodes, ranks_per_node, rate_bps, me if owned else None,
                      start_time(me) if owned else None, round(time.time(), 3))
    try:
        write_state(cluster)
    except OSError as exc:
        raise EmulateError(f"cannot write the cluster's state in {cluster_state.STATE_DIR}: "
                           f"{exc.strerror or exc}") from None
    try:
        _ip("netns", "add", cluster.switch)
        _ip("-n", cluster.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", cluster.switch, "link", "set", "br0", "up")
        for i in range(nodes):
            ns, port = cluster.node(i), f"p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", NIC, "netns", ns, "type", "veth", "peer", "name", port, "netns", cluster.switch)
            _ip("-n", ns, "addr", "add", f"{cluster.address(i)}/24", "dev", NIC)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", NIC, "up")
            _ip("-n", cluster.switch, "link", "set", port, "master", "br0")
            _ip("-n", cluster.switch, "link", "set", port, "up")
            _shape(ns, NIC, rate_bps)  # the node's NIC sends
            _shape(cluster.switch, port, rate_bps)  # the switch sends to the node: its NIC receives
    except BaseException:
        destroy(cluster)
        raise
    return cluster


def tbf_burst_bytes(rate_bps: int) -> int:
    """The token bucket: one GSO segment at least (a veth passes up to 64 KiB at once; a smaller
    bucket never lets such a segment through), and 1 ms at the rate at higher rates, so that the
    timer's granularity does not hold the link below its rate (docs/emulation.md measures both)."""
    return max(GSO_BYTES, rate_bps // 8 // 1000)


def _shape(ns: str, dev: str, rate_bps: int) -> None:
    _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_bps}bit",
          "burst", str(tbf_burst_bytes(rate_bps)), "latency", f"{TBF_LATENCY_MS}ms"])


def destroy(cluster: Cluster) -> None:
    """Stop whatever still runs inside the cluster, remove its namespaces (their links go with them),
    its runs' shared memory and its state file. Safe to call on a half-built or half-removed cluster."""
    present = [ns for ns in namespaces() if tag_of(ns) == cluster.tag]  # an orphan node too (cbemu-TAG-n5 alone)
    _kill_inside(present)
    for ns in present:
        _run(["ip", "netns", "del", ns], check=False)
    remove_segments(cluster.tag, tagged=True)
    try:
        os.unlink(state_path(cluster.tag))
    except FileNotFoundError:
        pass


def stop_inside(names: Sequence[str]) -> list[int]:
    """SIGTERM to every process in these namespaces, then SIGCONT: a stopped (hung) process must run to
    handle it; their pids."""
    pids = signal_inside(names, signal.SIGTERM)
    signal_inside(names, signal.SIGCONT)
    return pids


def _kill_inside(names: Sequence[str]) -> None:
    """Stop every process in these (existing) namespaces, and SIGKILL what is left a second later."""
    pids = stop_inside(names)
    deadline = time.monotonic() + 1.0
    while pids and time.monotonic() < deadline and any(_exists(pid) for pid in pids):
        time.sleep(0.05)
    signal_inside(names, signal.SIGKILL)


def signal_inside(names: Sequence[str], sig: int) -> list[int]:
    """Send `sig` to every process in these namespaces; their pids."""
    pids = pids_inside(names)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def pids_inside(names: Sequence[str]) -> list[int]:
    """The processes in these namespaces (but this one)."""
    return [pid for ns in names for pid in _pids(ns)]


def _pids(ns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(pid) for pid in out.split() if pid.isdigit() and int(pid) != os.getpid()]


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ----------------------------------------------------------------------------- find and clean

def namespaces() -> list[str]:
    """Every cbemu- network namespace on this host."""
    if shutil.which("ip") is None:
        return []
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def clusters() -> list[Cluster]:
    """Every cluster a state file describes, and one, owned by nobody, for each tag of cbemu-
    namespaces without a state file (the state is written before any namespace is made, so only a
    state file removed by hand leaves such namespaces; `clean` then removes them)."""
    listed = namespaces()  # before the state files: a cluster's state is written before its namespaces, so
    found: dict[str, Cluster] = {}  # any namespace seen here has a state file by the time they are read
    for _, cluster in state_files():
        if cluster is not None:
            found[cluster.tag] = cluster
    for ns in listed:
        tag = tag_of(ns)
        if tag is not None and tag not in found:  # nobody owns it: -1 is no process
            count = sum(1 for other in listed if other.startswith(f"{PREFIX}{tag}-n"))
            found[tag] = Cluster(tag, count, 0, 0, owner_pid=-1, owner_start=None)
    return list(found.values())


def find(tag: str) -> Cluster:
    for cluster in clusters():
        if cluster.tag == tag:
            return cluster
    raise EmulateError(f"no emulated cluster {tag!r} (`commbench emulate status` lists them)")


def clean() -> list[Cluster]:
    """Remove every cluster whose owner is gone, and a state file that is not its cluster's own (a stale
    or crafted copy: it never names a cluster to remove); the clusters removed. A run's own leftovers
    go with emulated_run.clean_dead_runs."""
    found = clusters()
    gone = [cluster for cluster in found if not cluster.alive()]
    for cluster in gone:
        destroy(cluster)
    for path, cluster in state_files():  # read again: a cluster made meanwhile has a well-formed file of its own
        if cluster is None:
            remove_file(path)
    return gone


# ------------------------------------------------------------------------------- commands run

def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise EmulateError(f"`{' '.join(argv)}` failed: {detail[-1] if detail else f'exit {result.returncode}'}")
    return result


def _ip(*args: str) -> None:
    _run(["ip", *args])
