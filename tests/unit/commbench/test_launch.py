"""commbench/launch.py: the stop margin inside the timeout, job tags and the spawn ids of local ranks, the
supervisor's grace, and the rendezvous port held for rank 0."""
import json
import os

import pytest
from conftest import clean_env, commbench

from commbench import launch
from commbench.launch import peer_wait_s, stop_margin_s
from commbench.launchers import LaunchError


def test_the_stop_margin_is_inside_the_timeout():
    # ranks give up waiting for a peer this long before --timeout, for the spawner to stop the rest
    assert [stop_margin_s(t) for t in (1, 6, 9, 300)] == [pytest.approx(1 / 3), 2, 3, 3]
    assert [peer_wait_s(t) for t in (1, 6, 300)] == [pytest.approx(2 / 3), 4, 297]


def test_a_spawners_job_tag_starts_its_ranks_spawn_id(tmp_path, monkeypatch):
    """Segments are named after the spawn id (cb_<id>_...): under COMMBENCH_JOB_TAG every one of a job's
    segments starts with the tag, which is how a test (or a user) tells its own segments from others'."""
    from commbench.launch import JOB_TAG_VAR, SPAWN_VAR, spawn_local

    (tmp_path / "show_spawn_id.py").write_text(
        "import os, pathlib\n"
        f"pathlib.Path({str(tmp_path)!r}, 'id' + os.environ['RANK']).write_text(os.environ[{SPAWN_VAR!r}])\n")
    monkeypatch.setenv(JOB_TAG_VAR, "tagX")
    assert spawn_local("show_spawn_id", 2, {"PYTHONPATH": str(tmp_path)}, timeout_s=60) == 0
    ids = {(tmp_path / f"id{rank}").read_text() for rank in (0, 1)}
    assert len(ids) == 1 and ids.pop().startswith("tagX")


def test_a_job_tag_names_files_so_it_is_letters_and_digits_and_each_job_is_its_own(monkeypatch):
    """Two jobs under one tag get ids of their own (a second shm job under the same tag once found the first's
    control segment: "File exists"); a tag that could leave /dev/shm is one line."""
    from commbench.launch import JOB_TAG_VAR, new_job_id

    monkeypatch.setenv(JOB_TAG_VAR, "tagA")
    first, second = new_job_id(), new_job_id()
    assert first != second and first.startswith("tagA") and second.startswith("tagA")
    monkeypatch.setenv(JOB_TAG_VAR, "x/../y")
    with pytest.raises(LaunchError, match="letters and digits"):
        new_job_id()
    proc = commbench("sweep", "--backend", "shm", "--sizes", "1K", env=clean_env(**{JOB_TAG_VAR: "x/../y"}))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "letters and digits" in proc.stderr


def test_a_failed_job_whose_other_rank_is_stopped_is_ended_without_the_grace(capsys):
    """A stopped rank (SIGSTOP, a debugger) cannot report: waiting the grace for it only pushed a job past its
    --timeout (the fault matrix's shm "stop rank 1" took 13.4 s of 12 in a loaded CI run)."""
    import signal
    import subprocess
    import sys
    import time

    from commbench.launch import supervise

    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    held = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        held.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        code = supervise([failing, held], grace_s=40.0, stop_s=5.0)
        assert time.monotonic() - started < 30.0  # not the 40 s grace: the stopped rank was ended at once
        assert code != 0 and held.poll() is not None
        assert "rank 1 was still running" in capsys.readouterr().err
    finally:
        for proc in (failing, held):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


RANK_HOLDS_PORT = """
import errno, json, os, socket, sys, time
from commbench.launch import STORE_FD_VAR
port, rank = int(os.environ["MASTER_PORT"]), int(os.environ["RANK"])
seen = {"rank": rank, "fd": os.environ.get(STORE_FD_VAR)}
if seen["fd"]:
    held = socket.socket(fileno=int(seen["fd"]))  # kept: a dropped socket object closes its descriptor
    seen["bound"] = held.getsockname()[1] == port
other = socket.socket()
try:
    other.bind(("127.0.0.1", port))
    seen["taken"] = False
except OSError as exc:
    seen["taken"] = exc.errno == errno.EADDRINUSE
folder = os.path.dirname(sys.argv[0])
with open(os.path.join(folder, f"rank{rank}.tmp"), "w") as out:
    json.dump(seen, out)
os.rename(os.path.join(folder, f"rank{rank}.tmp"), os.path.join(folder, f"rank{rank}.json"))
deadline = time.monotonic() + 60
while rank == 0 and not os.path.exists(os.path.join(folder, "rank1.json")) and time.monotonic() < deadline:
    time.sleep(0.01)  # rank 0 holds the port until rank 1 has tried it (a loaded host ran rank 0 to its end first)
"""


def test_a_spawned_jobs_store_port_is_held_for_rank_0_from_the_moment_it_is_chosen(tmp_path):
    """A port found free and let go before rank 0 bound it was taken by another process in a loaded CI run (the
    proxy fault matrix: "cannot listen on 127.0.0.1:43771 (Address already in use)"). The spawner binds it and
    hands the socket to rank 0: no other process can bind the port while the ranks start."""
    (tmp_path / "holds_port.py").write_text(RANK_HOLDS_PORT)
    code = launch.spawn_local("holds_port", 2, {"PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"},
                              timeout_s=60)
    assert code == 0
    rank0, rank1 = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    assert rank0["bound"] is True and rank0["taken"] is True
    assert rank1["fd"] is None and rank1["taken"] is True  # the port is held for the job, not only in rank 0
