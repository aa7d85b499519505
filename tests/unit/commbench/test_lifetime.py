"""How a job's processes end together (commbench/lifetime.py): SIGTERM ends a job as Ctrl-C does, and a
process that asks dies with its parent, kill -9 too."""
import pytest
from conftest import clean_env


def test_sigterm_ends_a_job_as_ctrl_c_does_and_only_the_first_counts():
    """lifetime.sigterm_as_interrupt: the first SIGTERM is a KeyboardInterrupt (the spawner then stops its ranks
    as on Ctrl-C and exits 130, issue 48: it died at once with 143), a second one is ignored, and the handler
    before is back afterwards."""
    import os
    import signal
    import time

    from commbench.lifetime import sigterm_as_interrupt

    def signalled() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # the handler runs here, in the main thread

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_interrupt():
            signalled()
    with sigterm_as_interrupt():
        try:
            signalled()
        except KeyboardInterrupt:
            signalled()  # a second one, while the ranks stop: ignored
    assert signal.getsignal(signal.SIGTERM) == before


CHILD = """import subprocess, sys, time
subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2], str(__import__("os").getpid())])
time.sleep(60)
"""
GRANDCHILD = """import os, sys, time
from commbench.lifetime import die_with_parent
die_with_parent(parent_pid=int(sys.argv[2]))
with open(sys.argv[1], "w") as handle:
    handle.write(str(os.getpid()))
time.sleep(60)
"""


def test_a_child_that_asks_dies_with_its_parent(tmp_path):
    """lifetime.die_with_parent (PR_SET_PDEATHSIG): a grandchild started by a child that is then killed
    outright ends with it, as the shm plan's probe ends with its rank (issue 48: three probe processes ran on)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    child, grandchild, marker = tmp_path / "child.py", tmp_path / "grandchild.py", tmp_path / "pid"
    child.write_text(CHILD)
    grandchild.write_text(GRANDCHILD)
    parent = subprocess.Popen([sys.executable, str(child), str(grandchild), str(marker)], env=clean_env())
    pid = None
    try:
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            assert parent.poll() is None
            time.sleep(0.05)
        pid = int(marker.read_text())
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid)
    finally:
        parent.kill()
        parent.wait(timeout=10)
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_ending_a_session_ends_every_process_in_it_and_one_that_ignores_sigterm_too():
    """end_session (tune's sweeps past its --timeout, the benchmarks' mpirun): the process and what it started
    are gone, SIGKILL after the grace where SIGTERM is ignored."""
    import os
    import subprocess
    import time

    from commbench.lifetime import end_session

    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 300 & echo $!; wait"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    child = int(proc.stdout.readline())
    started = time.monotonic()
    end_session(proc, grace_s=0.5)
    assert proc.poll() is not None and time.monotonic() - started < 30
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
            if open(f"/proc/{child}/stat").read().split()[2] == "Z":  # ended, not yet reaped by init
                break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"pid {child} of the session still runs")
