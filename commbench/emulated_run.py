"""A job on an emulated cluster (emulate.py builds the cluster): how ranks run on its nodes, are
supervised, and what their exit code is.

Ranks run in their node's namespace under the real launcher: one torchrun agent per node
(`--nnodes N --node-rank I`, c10d rendezvous at node 0's address), each starting the job's
ranks, which use `cbnic` for gloo (GLOO_SOCKET_IFNAME) and find their node from torchrun, as on a
cluster. Ranks of one node share memory (hybrid, shm); ranks of different nodes only the link.

torchrun ends with 1 whatever failed, so every rank leaves its own exit code in a folder of the
run's (job.report_exit; `commbench-TAG-exits-*` in the temporary folder), from which the job's
code is made as a local spawn's is; `clean_dead_runs` removes the folders of runs that died with
their clusters. A run killed outright (kill -9) is cleaned up after by its reaper (start_reaper), a
process of its own that outlives it.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from commbench.emulate import (
    NIC,
    RDZV_PORT,
    Cluster,
    create,
    destroy,
    pids_inside,
    rate_text,
    signal_inside,
    stop_inside,
)
from commbench.emulate import clean as clean_clusters
from commbench.emulate import clusters as all_clusters
from commbench.errors import EXIT_FAULT, EXIT_INTERRUPTED, EXIT_OK, telling_code
from commbench.launch import (
    EXIT_DIR_VAR,
    INTERRUPT_WAIT_S,
    JOB_TAG_VAR,
    interrupt,
    rank_argv,
    stop_all,
    stop_margin_s,
    supervise,
)
from commbench.launchers import EMULATED_VAR
from commbench.lifetime import die_with_parent, sigterm_as_interrupt

_STDERR_PASS_VAR = "COMMBENCH_EMULATE_VERBOSE"  # set: the launchers' own log lines are shown too


# ------------------------------------------------------------------------------ the host's ceiling

def host_ceiling_bps(nbytes: int = 32 << 20) -> float:
    """What this host's kernel moves through a socket pair in one direction (bit/s): an upper bound
    of what its veth links carry, whatever rate they are given. Measured in well under a second."""
    left, right = socket.socketpair()
    chunk = bytearray(1 << 20)
    try:
        def drain() -> None:
            view, got = memoryview(bytearray(1 << 20)), 0
            while got < nbytes:
                n = right.recv_into(view)
                if not n:
                    return
                got += n

        reader = threading.Thread(target=drain, daemon=True)
        start = time.perf_counter()
        reader.start()
        for _ in range(nbytes // len(chunk)):
            left.sendall(chunk)
        reader.join(timeout=10)
        return nbytes * 8 / (time.perf_counter() - start)
    finally:
        left.close()
        right.close()


# TCP through the links holds 90% of their rate while NODES x RATE stays under about 1/8 of
# host_ceiling_bps() (a socket pair moves bytes ~6x faster than TCP over veth, tbf and a bridge,
# and the ranks need CPU too): measured 2026-11-23 on 2 cores, docs/emulation.md section 1.
CEILING_SHARE = 8


def cpu_bound_warning(cluster: Cluster, ceiling_bps: float) -> str | None:
    """A note when the links could carry more than this host can push: every node sends at the link
    rate at once (a ring), and every byte crosses two veths and the bridge."""
    offered = cluster.nodes * cluster.rate_bps
    if cluster.nodes > 1 and offered > ceiling_bps / CEILING_SHARE:
        return (f"{cluster.nodes} links of {rate_text(cluster.rate_bps)} could carry {rate_text(offered)} at once; "
                f"this host moves about {rate_text(ceiling_bps)} through a socket pair: above 1/{CEILING_SHARE} "
                f"of that, the run measures the host's CPU, not the links (docs/emulation.md)")
    return None


def node_env(cluster: Cluster, base: dict[str, str] | None = None) -> dict[str, str]:
    """What a node's launcher and ranks get: sockets on the node's link, not loopback; one thread
    per rank (ranks share this host's cores); the cluster's tag for shared memory it can remove."""
    env = dict(os.environ if base is None else base)
    env.update(GLOO_SOCKET_IFNAME=NIC, NCCL_SOCKET_IFNAME=NIC, TP_SOCKET_IFNAME=NIC, **{
        JOB_TAG_VAR: cluster.tag,
        EMULATED_VAR: f"{cluster.nodes} node(s) x {cluster.ranks_per_node} rank(s), each node's link "
                      f"{rate_text(cluster.rate_bps)} both ways (tc tbf, no added delay), one torchrun per node, "
                      f"cluster {cluster.tag} (docs/emulation.md)"})
    env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)  # this host's own launcher variables mean nothing inside the cluster
    return env


def torchrun_argv(cluster: Cluster, index: int, timeout_s: float, target: Sequence[str]) -> list[str]:
    """Node `index`'s launch: torchrun in the node's namespace, c10d rendezvous served by node 0."""
    join_s = max(10, int(timeout_s))
    return ["ip", "netns", "exec", cluster.node(index), *rank_argv("torch.distributed.run"),
            "--nnodes", str(cluster.nodes), "--nproc-per-node", str(cluster.ranks_per_node),
            "--local-addr", cluster.address(index),  # what the ranks are told to meet at (not the host name)
            "--rdzv-backend", "c10d",  # node ranks are the rendezvous' order, as on a cluster (no --node-rank)
            "--rdzv-endpoint", f"{cluster.address(0)}:{RDZV_PORT}", "--rdzv-id", cluster.tag,
            # node 0 serves the rendezvous: torchrun knows an address as its own only when the host name resolves to it
            "--rdzv-conf", f"join_timeout={join_s},read_timeout={join_s},is_host={int(index == 0)}",
            "--max-restarts", "0", "--monitor-interval", "0.1", *target]


# -------------------------------------------------------------------------------------- the launch

def launch(cluster: Cluster, target: Sequence[str], env: dict[str, str], timeout_s: float) -> int:
    """Run `target` (torchrun's program and its arguments) on every node; the job's exit code.
    Supervised as a local spawn is (launch.py): a failed node gets the others stopped after a
    grace period, Ctrl-C gives ranks time to write their summaries. Each launcher dies with this
    process (PR_SET_PDEATHSIG), and the launchers' own log lines and tracebacks are kept off the
    terminal (the ranks say what went wrong in one line); COMMBENCH_EMULATE_VERBOSE=1 shows them."""
    grace_s, stop_s = stop_margin_s(timeout_s) / 2, stop_margin_s(timeout_s) / 4
    procs: list[subprocess.Popen] = []
    filters: list[threading.Thread] = []
    verbose = bool(os.environ.get(_STDERR_PASS_VAR))
    wake = functools.partial(stop_inside, cluster.namespaces)
    failed = functools.partial(_a_rank_failed, env.get(EXIT_DIR_VAR))
    try:
        for index in range(cluster.nodes):  # every fork before any thread of this process starts
            procs.append(subprocess.Popen(torchrun_argv(cluster, index, timeout_s, target), env=env,
                                          stderr=None if verbose else subprocess.PIPE, preexec_fn=_die_with_parent))
        for proc in procs if not verbose else ():
            filters.append(threading.Thread(target=_filter_stderr, args=(proc.stderr,), daemon=True))
            filters[-1].start()
        # As a local spawn: a rank's failure starts the grace period (torchrun may take seconds to end), then the
        # ranks themselves are stopped (a stopped, hung rank too: torchrun would wait 30 s for it)
        code = supervise(procs, grace_s, stop_s, "node", wake, failed)
    except KeyboardInterrupt:
        interrupt(procs, stop_s, wake)
        print("commbench: interrupted; results already written are kept", file=sys.stderr)
        code = EXIT_INTERRUPTED
    finally:
        stop_all(procs)
        signal_inside(cluster.namespaces, signal.SIGKILL)  # a rank its torchrun left holds the stderr pipe open
        for thread in filters:
            thread.join(timeout=2.0)
    return code


_LAUNCHER_LINE = re.compile(r"^(?:[DIWEF]\d{4} \d\d:\d\d:\d\d|\[[DIWEF]\d{4} |\*{5,}|Setting OMP_NUM_THREADS|"
                            r"--- Logging error ---|Exception raised from |frame #\d+: |<omitting python frames>)")


def _filter_stderr(stream) -> None:
    """Pass the ranks' lines through; drop torchrun's own log lines, and its closing traceback
    (a ChildFailedError report, after the ranks have said what failed)."""
    in_traceback = False
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        if line.startswith("commbench:") or not (in_traceback or _LAUNCHER_LINE.match(line)):
            sys.stderr.write(line)
            sys.stderr.flush()
    stream.close()


def _die_with_parent() -> None:
    """In the launcher's process before exec: SIGTERM when commbench dies (torchrun then stops its ranks)."""
    die_with_parent(signal.SIGTERM)


def run_job(nodes: int, ranks_per_node: int, rate_bps: int, job_env: dict[str, str], timeout_s: float) -> int:
    """One run on a cluster of its own: remove what killed runs left, build, launch `python -P -m
    commbench.job` (the job in `job_env`) on every node, tear down whatever happens; the exit code.
    SIGTERM to this process ends the run as Ctrl-C does, so that the cluster is still removed; a reaper
    (start_reaper) removes it if this process is killed outright."""
    gone = clean_dead_runs()
    if gone:
        print(f"commbench: note: removed {len(gone)} emulated cluster(s) left by runs that died "
              f"({', '.join(c.tag for c in gone)})", file=sys.stderr)
    cluster, exits, reaper = None, None, start_reaper()
    try:
        with sigterm_as_interrupt():
            cluster = create(nodes, ranks_per_node, rate_bps)
            # one reading can catch a busy core
            note = cpu_bound_warning(cluster, max(host_ceiling_bps() for _ in range(3)))
            if note:
                print(f"commbench: warning: {note}", file=sys.stderr)
            exits = tempfile.mkdtemp(prefix=f"commbench-{cluster.tag}-exits-")
            env = dict(node_env(cluster), **job_env, **{EXIT_DIR_VAR: exits})
            ranks = ["--no-python", *rank_argv("commbench.job")]  # torchrun's own `-m` would put the cwd first
            return ranks_exit_code(launch(cluster, ranks, env, timeout_s), exits, nodes * ranks_per_node)
    finally:
        if cluster is not None:
            destroy(cluster)
        if exits:
            shutil.rmtree(exits, ignore_errors=True)
        if reaper is not None:
            stop_reaper(reaper)


def ranks_exit_code(launchers: int, folder: str, world: int) -> int:
    """The job's exit code from its ranks' own (job.report_exit), as a local spawn's is: torchrun ends
    with 1 whatever failed. A rank that left none died (killed, or out of memory): a fault, said once."""
    codes = _exit_codes(folder)
    missing = [rank for rank in range(world) if rank not in codes]
    positive = [code for code in codes.values() if code > 0]
    if launchers == EXIT_INTERRUPTED:
        return EXIT_INTERRUPTED
    if launchers == EXIT_OK and not positive:
        return EXIT_OK
    # 130 from a rank of a run not interrupted: stopped after another rank failed, as a local spawn's are
    faults = [code for code in positive if code != EXIT_INTERRUPTED]
    if missing:
        print(f"commbench: rank(s) {', '.join(map(str, missing))} ended without an exit code "
              f"(killed, or out of memory)", file=sys.stderr)
        return max([EXIT_FAULT, *faults])
    return telling_code(faults)


# ------------------------------------------------------------------------- the ranks' exit codes

def _a_rank_failed(folder: str | None) -> bool:
    """Whether a rank has left a non-zero exit code (job.report_exit) in `folder`."""
    try:
        return any(code != 0 for code in _exit_codes(folder).values()) if folder else False
    except OSError:
        return False


def _exit_codes(folder: str) -> dict[int, int]:
    """rank -> the exit code it left in `folder` (job.report_exit's files `rankN`); a file still being
    written, or not a rank's, is left out (looked at again by the next caller)."""
    codes = {}
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name), encoding="ascii") as handle:
                codes[int(name.removeprefix("rank"))] = int(handle.read())
        except (OSError, ValueError):
            continue
    return codes


def clean_dead_runs() -> list[Cluster]:
    """Remove what runs that died left: their clusters (emulate.clean) and their ranks' exit-code
    folders; the clusters removed."""
    gone = clean_clusters()
    folders = _exit_folders()  # before the clusters: a run writes its cluster's state before its folder
    live = {cluster.tag for cluster in all_clusters() if cluster.alive()}
    for name, tag in folders:
        if tag not in live:
            shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)
    return gone


def _exit_folders() -> list[tuple[str, str]]:
    """(name, tag) of this user's exit-code folders (run_job's) in the temporary folder."""
    folder, found = tempfile.gettempdir(), []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        match = re.fullmatch(r"commbench-([0-9a-f]+)-exits-[A-Za-z0-9_]+", name)
        try:
            info = os.lstat(os.path.join(folder, name))
        except OSError:
            continue
        if match and stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():  # not another user's, no link
            found.append((name, match.group(1)))
    return found


# --------------------------------------------------------------------- the reaper of a killed run

def start_reaper() -> int | None:
    """A process in a session of its own (a Ctrl-C or a hang-up of this terminal does not reach it) that
    removes this run's cluster when this process dies, however it dies (kill -9 too): it reads a pipe whose
    write end only this process holds, so it reads end-of-file once this process is gone, and then removes
    what runs that died left (clean_dead_runs), this one's cluster with them. The write end's descriptor,
    to be closed after the run's own teardown; None where no reaper can start (the next run cleans up)."""
    read_end, write_end = os.pipe()  # neither inherited by the launchers (close_fds)
    try:
        subprocess.Popen([*rank_argv(__name__), "reap", str(os.getpid())], stdin=read_end,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
    return write_end


def stop_reaper(write_end: int) -> None:
    """After the run's own teardown: tell the reaper that it has nothing to do (REAPER_DONE, then the end)."""
    try:
        os.write(write_end, REAPER_DONE)
    except OSError:
        pass
    os.close(write_end)


REAPER_DONE = b"done"


def reap(owner: int) -> None:
    """The reaper's body (start_reaper): read its pipe to the end. Without REAPER_DONE first, the run it
    watches died: once it is gone (its exit closes the pipe before it has quite ended) and its launchers,
    stopped with it (PR_SET_PDEATHSIG), have stopped their ranks, which write their summaries (at most
    INTERRUPT_WAIT_S), remove what it left."""
    said = b""
    try:
        while True:
            chunk = os.read(0, 64)
            if not chunk:
                break
            said = (said + chunk)[-len(REAPER_DONE):]
    except OSError:
        pass
    if said == REAPER_DONE:
        return
    deadline = time.monotonic() + INTERRUPT_WAIT_S
    while time.monotonic() < deadline and any(c.alive() or pids_inside(c.namespaces) for c in all_clusters()
                                              if c.owner_pid == owner):
        time.sleep(0.1)
    clean_dead_runs()


if __name__ == "__main__":  # the reaper of a run (start_reaper): `python -P -m commbench.emulated_run reap PID`
    if len(sys.argv) == 3 and sys.argv[1] == "reap" and sys.argv[2].isdigit():
        reap(int(sys.argv[2]))
