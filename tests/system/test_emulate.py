"""The emulated cluster (commbench/emulate.py; a job on it, emulated_run.py): options refused in one
line, the refusal without privileges, and, as root with iproute2, a cluster's setup and teardown, a
checked sweep across two nodes launched by torchrun, and cleanup after a failed rank, SIGTERM and a killed commbench
(its reaper, and clean or down after a run whose reaper died too).

Every cluster a test builds lives in namespaces named cbemu-<tag>-*, addresses 198.18.0.0/24
inside them only; each test removes what it made."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import clean_env, commbench, results_of

from commbench import cluster_state as S
from commbench import emulate as E
from commbench import emulated_run as R
from commbench.results import read_records

ROOT_REASON = None
if os.geteuid() != 0:
    ROOT_REASON = "needs root (network namespaces)"
elif shutil.which("ip") is None or shutil.which("tc") is None:
    ROOT_REASON = "needs iproute2's ip and tc"
needs_root = pytest.mark.skipif(ROOT_REASON is not None, reason=ROOT_REASON or "")


def host_links() -> str:
    """The host namespace's interfaces and qdiscs: an emulated cluster must not change them."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    return "\n".join(sorted(links.splitlines())) + qdiscs


def in_node(cluster, index, code, timeout=20):
    return subprocess.run(["ip", "netns", "exec", cluster.node(index), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("text,expected", [("2x2", (2, 2)), ("4X1", (4, 1)), (" 1x8 ", (1, 8))])
def test_shape_parses(text, expected):
    assert E.parse_shape(text) == expected


@pytest.mark.parametrize("text", ["", "2", "2x", "x2", "0x1", "2x0", "65x1", "2x2x2", "-1x2", "2*2"])
def test_bad_shape_is_refused(text):
    with pytest.raises(E.EmulateError, match="--emulate"):
        E.parse_shape(text)


@pytest.mark.parametrize("text,bps", [("1gbit", 10**9), ("100mbit", 10**8), ("2.5gbit", 25 * 10**8),
                                      ("500Kbit", None), ("1000000bit", 10**6)])
def test_rate_parses_in_tc_units(text, bps):
    if bps is None:  # below the 1 mbit floor
        with pytest.raises(E.EmulateError, match="between"):
            E.parse_rate(text)
    else:
        assert E.parse_rate(text) == bps


@pytest.mark.parametrize("text", ["1g", "fast", "1 gbps", "", "-1gbit", "1e9bit", "200gbit"])
def test_bad_rate_is_refused(text):
    with pytest.raises(E.EmulateError, match="--link"):
        E.parse_rate(text)


def test_burst_holds_one_gso_segment_and_a_millisecond():
    assert E.tbf_burst_bytes(10**8) == E.GSO_BYTES  # 100 Mbit/s: 12.5 kB per ms, less than a segment
    assert E.tbf_burst_bytes(10**10) == 10**10 // 8 // 1000


def test_cpu_bound_warning_compares_links_with_the_host():
    cluster = E.Cluster("t", 4, 1, 10**9)
    assert R.cpu_bound_warning(cluster, ceiling_bps=100e9) is None
    assert "CPU" in R.cpu_bound_warning(cluster, ceiling_bps=4e9)
    assert R.cpu_bound_warning(E.Cluster("t", 1, 2, 10**9), ceiling_bps=1e6) is None  # one node: no link used


def test_damaged_state_file_is_skipped_not_trusted(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "STATE_DIR", str(tmp_path))
    monkeypatch.setattr(E, "namespaces", lambda: [])
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text(json.dumps({"tag": "../etc", "nodes": 2}))
    (tmp_path / "c.json").write_text(json.dumps({"tag": "abc", "nodes": "2"}))
    good = json.dumps({"tag": "d00d", "nodes": 2, "ranks_per_node": 1, "rate_bps": 10**9, "owner_pid": None})
    (tmp_path / "d00d.json").write_text(good)
    (tmp_path / "e.json").write_text(good)  # a copy under another name: not the cluster's own file
    assert [c.tag for c in E.clusters()] == ["d00d"]


def test_clean_removes_exit_folders_of_runs_that_died_only(tmp_path, monkeypatch):
    """A SIGKILLed `--emulate` parent leaves its ranks' exit-code folder: `clean` removes it, and
    leaves a live cluster's, another name's, and the state file that is not its cluster's own."""
    monkeypatch.setattr(S, "STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(E, "namespaces", lambda: [])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "state").mkdir()
    (tmp_path / "tmp").mkdir()
    kept = E.Cluster("c0ffee", 2, 1, 10**9, owner_pid=None)
    S.write_state(kept)
    (tmp_path / "state" / "zzz.json").write_text(json.dumps(dict(
        kept.__dict__, owner_pid=1, owner_start=-1)))  # the kept cluster's tag, a dead owner: not its file
    for name in ("commbench-dead01-exits-x1y2", "commbench-c0ffee-exits-abc", "commbench-other"):
        (tmp_path / "tmp" / name).mkdir()
    (tmp_path / "tmp" / "commbench-dead01-exits-x1y2" / "rank0").write_text("3")
    assert R.clean_dead_runs() == []
    assert sorted(os.listdir(tmp_path / "tmp")) == ["commbench-c0ffee-exits-abc", "commbench-other"]
    assert os.listdir(tmp_path / "state") == ["c0ffee.json"]
    assert [c.tag for c in E.clusters()] == ["c0ffee"]


# ------------------------------------------------------------------------------- options

@pytest.mark.parametrize("args,message", [
    (["sweep", "--link", "1gbit"], "give --emulate"),
    (["sweep", "--emulate", "2"], "expected NODESxRANKS"),
    (["sweep", "--emulate", "2x1", "--link", "fast"], "--link 'fast'"),
    (["sweep", "--emulate", "2x1", "--nprocs", "4"], "drop --nprocs"),
    (["sweep", "--emulate", "2x1", "--topology", "2x1"], "drop --topology"),
    (["sweep", "--emulate", "2x1", "--backend", "sim"], "nothing to run on an emulated cluster"),
    (["proxy", "resnet18", "--emulate", "2x1", "--nodes", "2"], "drop --nodes"),
    (["proxy", "resnet18", "--emulate", "2x1", "--backend", "sim", "--tflops", "1"],
     "nothing to run on an emulated cluster"),
    (["proxy", "resnet18", "--emulate", "2x1", "--hw", "dgx-a100"], "drop --hw"),
    (["proxy", "resnet18", "--emulate", "2x1", "--local"], "drop --local"),
    (["sweep", "--emulate", "2x2", "--backend", "shm"], "needs every rank on one host"),
    (["proxy", "resnet18", "--emulate", "2x1", "--backend", "shm"], "needs every rank on one host"),
])
def test_conflicting_options_are_one_line(args, message):
    if ROOT_REASON and ("nothing to run" in message or "one host" in message):
        pytest.skip(ROOT_REASON)  # the privilege check comes first
    out = commbench(*args, timeout=60)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_missing_tools_are_named(tmp_path):
    out = commbench("sweep", "--emulate", "2x1", timeout=60, env=clean_env(PATH=str(tmp_path)))
    assert out.returncode == 2
    assert "needs ip and tc" in out.stderr and len(out.stderr.strip().splitlines()) == 1


@needs_root
def test_without_privileges_one_line_and_exit_2():
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs setpriv to drop root")
    out = subprocess.run([setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", "--inh-caps=-all",
                          sys.executable, "-m", "commbench", "sweep", "--emulate", "2x1"],
                         capture_output=True, text=True, timeout=60, env=clean_env())
    if "Permission denied" in out.stderr and "commbench" not in out.stderr:
        pytest.skip("this checkout is not readable by an unprivileged user")
    assert out.returncode == 2, out.stderr
    assert "needs root to create network namespaces" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------- as root

@pytest.fixture
def cluster():
    made = E.create(2, 1, 100 * 10**6)
    yield made
    E.destroy(made)


@needs_root
def test_cluster_is_built_rate_limited_and_removed(cluster):
    before = host_links()
    assert set(cluster.namespaces) <= set(E.namespaces())
    for i in range(2):
        addrs = subprocess.run(["ip", "-n", cluster.node(i), "-o", "-4", "addr", "show", "dev", E.NIC],
                               capture_output=True, text=True).stdout
        assert f"{cluster.address(i)}/24" in addrs
        for ns, dev in ((cluster.node(i), E.NIC), (cluster.switch, f"p{i}")):  # both directions of the link
            qdisc = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True)
            assert "tbf" in qdisc.stdout and "rate 100Mbit" in qdisc.stdout, qdisc.stdout
    # node 1 reaches node 0 across the switch, over its own link (not loopback)
    server = subprocess.Popen(["ip", "netns", "exec", cluster.node(0), sys.executable, "-c",
                               "import socket; s = socket.create_server(('198.18.0.1', 29999)); s.settimeout(15); "
                               "c, a = s.accept(); c.sendall(a[0].encode()); c.close()"])
    try:
        client = in_node(cluster, 1, "import socket, time\n"
                                     "for _ in range(100):\n"
                                     "    try:\n"
                                     "        c = socket.create_connection(('198.18.0.1', 29999), timeout=5); break\n"
                                     "    except ConnectionRefusedError: time.sleep(0.05)\n"
                                     "print(c.recv(64).decode())")
        assert client.stdout.strip() == "198.18.0.2", client.stderr
    finally:
        server.wait(timeout=20)
    assert [c.tag for c in E.clusters() if c.tag == cluster.tag] == [cluster.tag]
    E.destroy(cluster)
    assert not [ns for ns in E.namespaces() if cluster.tag in ns]
    assert not os.path.exists(os.path.join(S.STATE_DIR, f"{cluster.tag}.json"))
    assert host_links() == before


@needs_root
def test_a_dead_owners_cluster_is_cleaned():
    made = E.create(1, 1, 10**9)
    dead = E.Cluster(made.tag, 1, 1, 10**9, owner_pid=made.owner_pid, owner_start=-1)  # as if its pid were reused
    S.write_state(dead)
    sleeper = subprocess.Popen(["ip", "netns", "exec", made.node(0), "sleep", "60"])
    try:
        assert made.tag in [c.tag for c in E.clean()]
        assert sleeper.wait(timeout=10) != 0  # what ran inside was stopped
        assert not [ns for ns in E.namespaces() if made.tag in ns]
    finally:
        sleeper.kill()
        E.destroy(made)


@needs_root
def test_a_state_file_not_its_clusters_own_removes_nothing():
    """A stale or crafted state file names a kept cluster's tag with a dead owner: `clean` leaves the
    cluster (it is not that owner's) and removes the file."""
    kept = E.create(1, 1, 10**9, owned=False)
    crafted = os.path.join(S.STATE_DIR, "zzzz-stale.json")
    try:
        with open(crafted, "w", encoding="utf-8") as handle:
            json.dump(dict(kept.__dict__, owner_pid=1, owner_start=-1), handle)
        assert kept.tag not in [c.tag for c in E.clean()]
        assert kept.node(0) in E.namespaces() and os.path.exists(os.path.join(S.STATE_DIR, f"{kept.tag}.json"))
        assert not os.path.exists(crafted)
    finally:
        if os.path.exists(crafted):
            os.unlink(crafted)
        E.destroy(kept)
    assert _gone(kept.tag)


@needs_root
def test_an_orphan_namespace_is_removed():
    """cbemu-TAG-n5 alone (no state file, no n0): `clean` removes it, and says so once."""
    import uuid

    tag = uuid.uuid4().hex[:8]
    subprocess.run(["ip", "netns", "add", f"{E.PREFIX}{tag}-n5"], check=True)
    try:
        assert tag in [c.tag for c in E.clean()]
        assert not [ns for ns in E.namespaces() if tag in ns]
        assert tag not in [c.tag for c in E.clean()]  # not "removed" a second time
    finally:
        subprocess.run(["ip", "netns", "del", f"{E.PREFIX}{tag}-n5"], capture_output=True)


def _sweep_args(tmp_path, *extra):
    return ["sweep", "--emulate", "2x1", "--link", "1gbit", "--sizes", "1K-256K", "-f", "16", "--min-time", "0.05",
            "--timeout", "60", "--json", str(tmp_path / "out.jsonl"), *extra]


@needs_root
def test_a_checked_sweep_across_two_nodes_takes_its_nodes_from_torchrun(tmp_path):
    """hybrid hier on 2x2: shared memory inside each node, gloo across the link between them."""
    out = commbench("sweep", "--emulate", "2x2", "--link", "2gbit", "--backend", "hybrid", "--algorithm", "hier",
                    "--sizes", "64K", "--min-time", "0.05", "--timeout", "60", "--json", str(tmp_path / "h.jsonl"),
                    timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    results, records = results_of(tmp_path / "h.jsonl")
    header = records[0]
    assert header["launch"]["launcher"] == "torchrun"  # the real launcher, one agent per node
    assert header["launch"]["nnodes"] == 2 and header["launch"]["local_world_size"] == 2
    assert "COMMBENCH_EMULATED" in header["ranks"][0]["env"]
    assert {r["env"]["GLOO_SOCKET_IFNAME"] for r in header["ranks"]} == {E.NIC}  # gloo on the node's link
    assert results and all(r["wrong"] == 0 and r["algorithm"].startswith("hier") for r in results)  # checked
    assert "# emulated cluster: 2 node(s) x 2 rank(s)" in out.stdout
    assert "Traceback" not in out.stderr
    assert not [c for c in E.clusters() if c.owner_pid is not None and not c.alive()]  # nothing left behind


@needs_root
def test_nodes_import_nothing_from_the_working_directory(tmp_path):
    """Neither a node's torchrun nor its ranks run a `uuid.py` found where the user runs commbench."""
    from test_security import plant_modules

    work, marker = tmp_path / "work", tmp_path / "ran"
    work.mkdir()
    plant_modules(work, marker)
    proc = subprocess.run([sys.executable, "-P", "-m", "commbench", *_sweep_args(tmp_path, "--sizes", "1K-2K")],
                          cwd=work, capture_output=True, text=True, timeout=150, env=clean_env())
    assert not marker.exists(), marker.read_text()
    assert proc.returncode == 0, proc.stderr[-2000:]


def _run_until_measuring(tmp_path, *extra):
    """A long emulated sweep started in the background; returns once its first point is written."""
    path = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "commbench", *_sweep_args(tmp_path, "--sizes", "1K-64M", "-f", "2",
                                                                          "--min-time", "1", *extra)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=clean_env())
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and '"record": "result"' in path.read_text():
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read()
    tags = [c.tag for c in E.clusters() if c.owner_pid == proc.pid]
    assert len(tags) == 1
    return proc, tags[0], path


def _gone(tag):
    return not [ns for ns in E.namespaces() if tag in ns] and not os.path.exists(
        os.path.join(S.STATE_DIR, f"{tag}.json")) and not [n for n in os.listdir("/dev/shm") if n.startswith(
            f"cb_{tag}_")] and not [n for n in os.listdir(tempfile.gettempdir())
                                    if n.startswith(f"commbench-{tag}-exits-")]


@needs_root
def test_sigterm_ends_the_run_and_removes_the_cluster(tmp_path):
    proc, tag, path = _run_until_measuring(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert _gone(tag)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[-1]["record"] == "summary" and records[-1]["status"] != "ok"  # measured points kept, closed


def _rank_pids(cluster, node):
    """The ranks in a node, not their torchrun (whose command line names the job too)."""
    def cmdline(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()

    return [pid for pid in E._pids(cluster.node(node))
            if b"commbench.job" in cmdline(pid) and b"torch.distributed.run" not in cmdline(pid)]


@needs_root
def test_a_stopped_rank_is_stopped_as_a_local_one_is(tmp_path):
    """SIGSTOP of a rank (a hang): the other gives up after the peer wait, and the hung rank is then
    continued and stopped by commbench itself, so that it can write its summary and exit code; torchrun
    (which would wait 30 s for it) is not waited for (issue 26: `--timeout 10` ended after 13.6 s,
    the stopped rank killed without an exit code)."""
    proc, tag, path = _run_until_measuring(tmp_path, "--timeout", "10")
    cluster = next(c for c in E.clusters() if c.tag == tag)
    os.kill(_rank_pids(cluster, 1)[0], signal.SIGSTOP)
    started = time.monotonic()
    _, err = proc.communicate(timeout=90)
    took_s = time.monotonic() - started
    assert proc.returncode == 3, err
    # Woken, the hung rank usually writes its exit code before the stop window (0.75 s) ends; in 2 of 10 runs
    # on 2026-11-26 it did not and was killed (docs/launching.md): which of the two happens is timing, not
    # asserted here. Either way the run ends as a fault, in time, cleanly.
    assert "Traceback" not in err
    assert took_s < 10 + 5, took_s  # loose: the bound itself is docs/launching.md's measured table
    assert _gone(tag)
    assert read_records(str(path))[-1]["status"] == "failed"


@needs_root
def test_a_failed_rank_ends_the_run_and_removes_the_cluster(tmp_path):
    proc, tag, _ = _run_until_measuring(tmp_path)
    cluster = next(c for c in E.clusters() if c.tag == tag)
    workers = _rank_pids(cluster, 1)
    assert workers
    os.kill(workers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 3, err  # a fault, as with local ranks: torchrun's own exit (1) is not passed on
    assert "ended without an exit code" in err
    assert "Traceback" not in err
    assert _gone(tag)


@needs_root
def test_a_killed_commbench_leaves_nothing_its_reaper_removes_it(tmp_path):
    """kill -9 of the commbench process: its reaper removes the cluster (namespaces, state, exit codes) once
    the ranks, stopped by their torchrun, have written their summaries (issue 48: the three namespaces were
    left until a later run or `emulate clean`)."""
    proc, tag, path = _run_until_measuring(tmp_path)
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not _gone(tag):
        time.sleep(0.2)
    if not _gone(tag):
        R.clean_dead_runs()  # this test's leftovers go whatever it finds
        pytest.fail(f"cluster {tag} was left by the killed run")
    def reaper_running():
        return [line for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
                .splitlines() if f"commbench.emulated_run reap {proc.pid}" in line]

    deadline = time.monotonic() + 30  # the reaper removes the cluster, then exits (on a busy host, a while later)
    while reaper_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not reaper_running()  # the reaper itself gone
    assert read_records(str(path))[-1]["record"] == "summary"


@needs_root
def test_a_killed_run_without_its_reaper_is_cleaned_by_the_next_clean_or_down():
    """What a run whose reaper died too left (its owner dead): `emulate clean` removes it, and so does
    `emulate down` without a tag (issue 48: it said to name a cluster)."""
    for command in (("emulate", "clean"), ("emulate", "down")):
        made = E.create(1, 1, 10**9)
        S.write_state(E.Cluster(made.tag, 1, 1, 10**9, owner_pid=made.owner_pid, owner_start=-1))  # pid reused
        try:
            out = commbench(*command, timeout=60)
            assert out.returncode == 0 and made.tag in out.stdout, out.stdout + out.stderr
            assert _gone(made.tag)
        finally:
            E.destroy(made)


@needs_root
def test_proxy_runs_across_emulated_nodes(tmp_path):
    out = commbench("proxy", "tts_angular", "--emulate", "2x1", "--link", "1gbit", "--batch", "1", "--compute", "flops",
                    "--tflops", "0.05", "--steps", "2", "--warmup-steps", "1", "--timeout", "60", "--json",
                    str(tmp_path / "p.jsonl"), timeout=150)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "# emulated cluster: 2 node(s) x 1 rank(s)" in out.stdout
    summary = [r for r in read_records(str(tmp_path / "p.jsonl")) if r["record"] == "proxy"][-1]
    assert summary["status"] == "ok" and summary["world_size"] == 2 and summary["nnodes"] == 2
