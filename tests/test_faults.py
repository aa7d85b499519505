"""Faults end cleanly within the timeout and keep what was measured: dead rank, hung rank,
out of memory, Ctrl-C."""
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import clean_env, default_sigint, rank_pid, results_of, wait_for_results

LONG_SWEEP = ["sweep", "--sizes", "1K-64K", "--iters", "400", "--warmup", "2"]


def start(tmp_path, *args, timeout_s=6):
    return subprocess.Popen([sys.executable, "-m", "commbench", *LONG_SWEEP, "--json", str(tmp_path / "r.jsonl"),
                             "--timeout", str(timeout_s), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(), start_new_session=True, preexec_fn=default_sigint)


def finish(proc, limit_s):
    started = time.monotonic()
    out, err = proc.communicate(timeout=limit_s + 30)
    return out, err, time.monotonic() - started


def test_killed_rank_stops_the_run_and_keeps_results(tmp_path):
    proc = start(tmp_path)
    wait_for_results(tmp_path / "r.jsonl", 2, proc)
    os.kill(rank_pid(proc.pid, 1), signal.SIGKILL)
    _, err, took = finish(proc, 10)
    assert proc.returncode == 3
    assert took < 10
    assert "rank 1 was killed by SIGKILL" in err
    assert "Traceback" not in err
    results, records = results_of(tmp_path / "r.jsonl")
    assert len(results) >= 2 and all(r["wrong"] == 0 for r in results)
    assert records[-1]["record"] == "summary" and records[-1]["status"] == "failed"


def test_hung_rank_stops_within_the_timeout(tmp_path):
    proc = start(tmp_path, timeout_s=5)
    wait_for_results(tmp_path / "r.jsonl", 2, proc)
    os.kill(rank_pid(proc.pid, 1), signal.SIGSTOP)
    _, err, took = finish(proc, 20)
    assert proc.returncode == 3
    assert took < 5 + 8  # the timeout, then a short grace before the hung rank is stopped
    assert "Timed out" in err and "peer rank may have died or hung" in err
    assert "rank 1 was still running" in err
    assert "Traceback" not in err
    assert len(results_of(tmp_path / "r.jsonl")[0]) >= 2


def _torch_import_vm_bytes() -> int:
    """Peak virtual memory of a process that has imported torch and torch.distributed."""
    code = ("import torch, torch.distributed\n"
            "print(open('/proc/self/status').read().split('VmPeak:')[1].split()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.strip()) * 1024


def test_out_of_memory_names_the_size_and_keeps_results(tmp_path):
    prlimit = "/usr/bin/prlimit"
    if not os.path.exists(prlimit):
        pytest.skip("prlimit (util-linux) not installed")
    # Address space: room for torch (a CUDA build maps ~3 GiB at import), not for two 2 GiB buffers.
    limit = _torch_import_vm_bytes() + (3 << 29)
    proc = subprocess.run([prlimit, f"--as={limit}", sys.executable, "-m", "commbench", "sweep", "--sizes", "1K,2G",
                           "--iters", "1", "--warmup", "0", "--json", str(tmp_path / "r.jsonl")],
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 3
    assert "out of memory at 2 GiB (allreduce, out-of-place)" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    results, records = results_of(tmp_path / "r.jsonl")
    assert [r["nbytes"] for r in results] == [1024, 1024]
    assert records[-1]["status"] == "failed" and "out of memory" in records[-1]["error"]


def test_ctrl_c_ends_cleanly_and_keeps_results(tmp_path):
    proc = start(tmp_path, timeout_s=60)
    wait_for_results(tmp_path / "r.jsonl", 2, proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the whole foreground group
    _, err, took = finish(proc, 10)
    assert proc.returncode == 130 and took < 10
    assert "interrupted" in err and "Traceback" not in err
    results, records = results_of(tmp_path / "r.jsonl")
    assert len(results) >= 2 and records[-1]["status"] == "interrupted"


def test_validate_without_json_leaves_no_folder(tmp_path):
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([sys.executable, "-m", "commbench", "proxy", "tts_angular", "--nprocs", "2", "--batch", "1",
                           "--steps", "2", "--warmup-steps", "1", "--validate"], capture_output=True, text=True,
                          timeout=300, env=clean_env(TMPDIR=str(tmp_path / "tmp")))
    assert proc.returncode == 0, proc.stderr
    assert "proxy error" in proc.stdout
    assert not [name for name in os.listdir(tmp_path / "tmp") if name.startswith("commbench")]
