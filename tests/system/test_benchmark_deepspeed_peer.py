"""benchmarks/deepspeed_peer.py's own behaviour (its figures are in docs/performance.md): bad input
is one line and exit 2, and a size's job that gives no result in time is stopped, ranks and all."""
import os
import subprocess
import sys
import time

from conftest import REPO

BENCHMARKS = str(REPO / "benchmarks")


def test_bad_sizes_are_one_line_exit_2():
    proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "deepspeed_peer.py"), "--sizes", "1K,3x"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("deepspeed_peer.py: error: bad size") and "Traceback" not in proc.stderr


def test_a_job_past_its_time_is_stopped_with_its_children(tmp_path):
    """What deepspeed_peer.py does where DeepSpeed hangs: the job (mpirun and its ranks, here a shell
    and its sleeping child) is stopped, and the caller gets JobTimeout to report, not a hang."""
    marker = tmp_path / "child.pid"
    code = (f"import sys; sys.path.insert(0, {BENCHMARKS!r}); import paired\n"
            f"try:\n    paired._run_bounded(['sh', '-c', 'sleep 60 & echo $! > {marker}; wait'], 1.0)\n"
            "except paired.JobTimeout as exc:\n    print('stopped:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)  # < the sleep
    assert proc.returncode == 0, proc.stderr
    assert "stopped: no result in 1 s" in proc.stdout
    child = int(marker.read_text())
    from commbench.backends.shm_waits import alive as _alive

    for _ in range(200):  # the killed child may take a moment to end (a zombie counts as ended: a container's
        if not _alive(child):  # PID 1 may never reap it)
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the job's child {child} still runs")
