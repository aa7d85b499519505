"""Faults end within the timeout, lose nothing and leave nothing behind.

The fault matrix: kill -9 of each rank, SIGSTOP of a rank (a hang), Ctrl-C, SIGTERM to the commbench
process alone, and the commbench process itself killed, on gloo, shm and proxy runs, and nccl-tests
mode's series of sweeps. For each: every process is gone within the timeout plus 3 s of slack (the
slack is for this shared 2-core machine: ranks wait for a peer for the timeout less the stop margin,
launch.peer_wait_s, and the margin covers the rest), the documented exit code, every point measured
before the fault still in the JSON Lines with the summary record last, no shared-memory segment,
temporary folder or process left. The faults of one backend run at once (about 20 s a backend on 2
cores): each run's fault comes when its own results appear, and the bound is checked from that moment.
"""
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from conftest import clean_env, default_sigint, results_of, said_lines, torch_import_vm_bytes

from commbench.launch import SHM_DIR, SPAWN_VAR
from commbench.results import read_records

psutil = pytest.importorskip("psutil")

# the runs' --timeout: it bounds their start too, six runs at once beside other tests (the suite's workers) on
# 2 cores: at 6 s a run's ranks timed out before their first records (exit 3, "no records")
TIMEOUT_S = 12.0
SLACK_S = 3.0  # over --timeout, for this shared 2-core machine: a loaded suite ran stop-rank faults 1.1-1.4 s past it
RUNS = {  # backend -> (command, records to wait for before the fault, pause after them)
    "gloo": (["sweep", "--sizes", "1K-64K", "--iters", "400", "--warmup", "2"], 2, 0.0),
    # the pause puts the fault inside shared-memory waits, not the gloo control plane between points
    "shm": (["sweep", "--backend", "shm", "--sizes", "1M-64M", "--iters", "400", "--warmup", "2"], 2, 0.3),
    "proxy": (["proxy", "resnet18", "--nprocs", "2", "--batch", "2", "--tflops", "0.2", "--steps", "1000"], 3, 0.0),
    # three cycles: a fault in the first must end the series, not only its sweep (issue 26)
    "nccl-tests": (["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "64K", "-f", "2", "-n", "400", "-w", "2", "-g",
                    "2", "-N", "3"], 2, 0.0),
}
FAULTS = {  # fault -> (rank it hits, exit code, summary status, what stderr says)
    "kill rank 0": (0, 3, {"failed"}, "rank 0 was killed by SIGKILL"),
    "kill rank 1": (1, 3, {"failed"}, "rank 1 was killed by SIGKILL"),
    "stop rank 0": (0, 3, {"interrupted", "failed"}, "rank 0 was still running"),
    "stop rank 1": (1, 3, {"failed"}, "rank 1 was still running"),
    "ctrl-c": (None, 130, {"interrupted"}, "commbench: interrupted; results already written are kept"),
    # SIGTERM to commbench alone (timeout, a scheduler): as Ctrl-C (issue 48: it died with 143)
    "sigterm commbench": (None, 130, {"interrupted"}, "commbench: interrupted; results already written are kept"),
    "kill commbench": (None, -9, {"interrupted"}, ""),
}
MATRIX = {"gloo": ("kill rank 0", "kill rank 1", "stop rank 0", "ctrl-c", "kill commbench", "sigterm commbench"),
          "shm": ("kill rank 0", "kill rank 1", "stop rank 1", "ctrl-c", "kill commbench", "sigterm commbench"),
          "proxy": ("kill rank 0", "kill rank 1", "stop rank 0", "ctrl-c", "kill commbench"),
          "nccl-tests": ("kill rank 1", "stop rank 1", "ctrl-c")}


@dataclass
class Outcome:
    backend: str
    fault: str
    code: int | None = None
    stderr: str = ""
    took_s: float = 0.0  # from the fault until every process of the run is gone
    before: list = field(default_factory=list)  # records in the file when the fault came
    after: list = field(default_factory=list)
    left: list = field(default_factory=list)  # processes, segments, temporary files left behind


def _records(path):
    return read_records(str(path)) if path.exists() else []


def _ranks(pid):
    """{rank: psutil.Process} of the ranks commbench process `pid` spawned, and their job id."""
    ranks, job = {}, None
    for child in psutil.Process(pid).children():
        try:
            env = child.environ()
        except psutil.Error:
            continue
        if "RANK" in env:
            ranks[int(env["RANK"])], job = child, env.get(SPAWN_VAR)
    return ranks, job


def _gone(proc):
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # reparented ranks are reaped by init, in its own time
    except psutil.NoSuchProcess:
        return True


def run_fault(tmp_path, backend, fault):
    """Start a run, hit it with `fault` once its first records are written, and see how it ends."""
    args, wanted, pause = RUNS[backend]
    folder = tmp_path / f"{backend}-{fault.replace(' ', '-')}"
    (folder / "tmp").mkdir(parents=True)
    path = folder / "r.jsonl"
    outputs = (["-J", str(path), "-T", f"{TIMEOUT_S:g}"] if args[0] == "nccl-tests" else
               ["--json", str(path), "--timeout", f"{TIMEOUT_S:g}"])
    proc = subprocess.Popen([sys.executable, "-m", "commbench", *args, *outputs], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env=clean_env(TMPDIR=str(folder / "tmp")), start_new_session=True,
                            preexec_fn=default_sigint)
    outcome = Outcome(backend, fault)
    try:
        deadline = time.monotonic() + 150
        while len([r for r in _records(path) if r["record"] in ("result", "step")]) < wanted:
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{backend}, {fault}: no records before the fault (exit {proc.poll()}): "
                            f"{proc.stderr.read() if proc.poll() is not None else 'still starting'}")
            time.sleep(0.05)
        time.sleep(pause)
        ranks, job = _ranks(proc.pid)
        assert len(ranks) == 2, f"{backend}, {fault}: ranks {ranks}"
        outcome.before = _records(path)
        victim = FAULTS[fault][0]
        started = time.monotonic()
        if fault.startswith("kill rank"):
            ranks[victim].send_signal(signal.SIGKILL)
        elif fault.startswith("stop rank"):
            ranks[victim].send_signal(signal.SIGSTOP)
        elif fault == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole foreground group
        elif fault == "sigterm commbench":
            proc.send_signal(signal.SIGTERM)  # commbench alone: its ranks hear of it from commbench
        else:
            proc.send_signal(signal.SIGKILL)
        processes = [psutil.Process(proc.pid), *ranks.values()]
        while not all(_gone(p) for p in processes) and time.monotonic() - started < TIMEOUT_S + 30:
            time.sleep(0.02)
        outcome.took_s = time.monotonic() - started
        outcome.code = proc.wait(timeout=30)
        outcome.stderr = proc.stderr.read()
        outcome.after = _records(path)
        outcome.left = [f"pid {p.pid}" for p in processes if not _gone(p)]
        outcome.left += [name for name in os.listdir(SHM_DIR) if job and name.startswith(f"cb_{job}_")]
        outcome.left += [name for name in os.listdir(folder / "tmp") if name.startswith("commbench")]
        return outcome
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def check(outcome):
    """What went wrong with one run of the matrix, or nothing."""
    victim, code, statuses, said = FAULTS[outcome.fault]
    name, problems = f"{outcome.backend}, {outcome.fault}", []
    if outcome.took_s > TIMEOUT_S + SLACK_S:
        problems.append(f"took {outcome.took_s:.1f} s after the fault (--timeout {TIMEOUT_S:g} s)")
    if outcome.code != code:
        problems.append(f"exit code {outcome.code}, not {code}")
    if "Traceback" in outcome.stderr or len(said_lines(outcome.stderr)) > 2 or said not in outcome.stderr:
        problems.append("not the expected lines on stderr")
    if outcome.after[:len(outcome.before)] != outcome.before:
        problems.append("records written before the fault were lost")
    last = outcome.after[-1] if outcome.after else {}
    if last.get("record") not in ("summary", "proxy") or last.get("status") not in statuses:
        problems.append(f"last record {last.get('record')} {last.get('status')}, not a summary {statuses}")
    if outcome.left:
        problems.append(f"left behind: {outcome.left}")
    return [f"{name}: {problem} (stderr {outcome.stderr!r})" for problem in problems]


@pytest.mark.parametrize("backend", sorted(MATRIX))
def test_fault_matrix(tmp_path, backend):
    with ThreadPoolExecutor(len(MATRIX[backend])) as pool:
        outcomes = list(pool.map(lambda fault: run_fault(tmp_path, backend, fault), MATRIX[backend]))
    for outcome in outcomes:  # shown with -s: the measured fault-to-exit times docs/launching.md quotes
        print(f"{backend:6s} {outcome.fault:15s} exit {outcome.code:4d} in {outcome.took_s:5.2f} s")
    problems = [problem for outcome in outcomes for problem in check(outcome)]
    assert not problems, "\n".join(problems)


def test_validate_without_json_leaves_no_folder(tmp_path):
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([sys.executable, "-m", "commbench", "proxy", "tts_angular", "--nprocs", "2", "--batch", "1",
                           "--steps", "2", "--warmup-steps", "1", "--validate"], capture_output=True, text=True,
                          timeout=300, env=clean_env(TMPDIR=str(tmp_path / "tmp")))
    assert proc.returncode == 0, proc.stderr
    assert "proxy error" in proc.stdout
    assert not [name for name in os.listdir(tmp_path / "tmp") if name.startswith("commbench")]


def test_emulated_compute_honours_the_timeout(monkeypatch):
    from commbench.proxies import clocks as T

    for clock in (T.SleepClock(limit_s=0.5), T.CpuClock(limit_s=0.5)):
        clock.begin()
        clock.compute_until(1e3)  # 1 ms: within the limit
        for progress_us in (1e6, float("inf"), float("nan")):  # --tflops 1e-12, a profile with infinite FLOPs
            with pytest.raises(T.ComputeTimeout) as refused:
                clock.compute_until(progress_us)
            assert refused.value.planned  # every rank has the same plan: said once
    starved = T.CpuClock(limit_s=0.2)
    monkeypatch.setattr(T.time, "thread_time", lambda: 0.0)  # this thread never gets the core
    starved.begin()
    started = time.monotonic()
    with pytest.raises(T.ComputeTimeout) as stopped:
        starved.compute_until(1e5)
    assert not stopped.value.planned and 0.2 <= time.monotonic() - started < 2


def test_the_wall_limit_holds_per_stretch_of_compute(monkeypatch):
    """A loaded host (this thread gets half a core) stretches a step's compute past the limit in wall
    time, while no stretch between two calls (what a peer waits for) comes near it: the step runs
    (issue 26: `proxy resnet18 --timeout 10` failed at load 4 with "still running after 7 s")."""
    from commbench.proxies import clocks as T

    monkeypatch.setattr(T.time, "thread_time", lambda: time.perf_counter() / 2)  # half a core, whatever the load
    clock = T.CpuClock(limit_s=0.5)
    clock.begin()
    for stretch in range(1, 9):  # 8 stretches of 0.05 s CPU time, 0.1 s of wall time each: 0.8 s in all
        clock.compute_until(stretch * 5e4)


@pytest.mark.parametrize("clock_class", ["SleepClock", "CpuClock"])
def test_a_failed_call_ends_the_compute_that_overlaps_it(clock_class):
    """A bucket's allreduce fails (a dead peer) while the backward is still computing: the compute
    raises that error, rather than running the stretch out while commbench stops the rank as hung
    (issue 26: the killed proxy rank left rank 0's summary `interrupted`, not `failed`)."""
    from commbench.proxies import clocks as T
    from commbench.proxies.channels import ThreadChannel

    def dead_peer():
        raise ConnectionError("Connection closed by peer")

    clock = getattr(T, clock_class)(limit_s=60)
    channel = ThreadChannel([dead_peer], lambda: None, clock)
    try:
        clock.begin()
        channel.launch(0)
        with pytest.raises(ConnectionError, match="closed by peer"):
            clock.compute_until(5e6)  # 5 s of compute left: run out to the end, it would not raise
    finally:
        channel.close()


def test_out_of_memory_names_the_size_and_keeps_results(tmp_path):
    prlimit = "/usr/bin/prlimit"
    if not os.path.exists(prlimit):
        pytest.skip("prlimit (util-linux) not installed")
    # Address space: room for torch (a CUDA build maps ~3 GiB at import), not for two 2 GiB buffers.
    limit = torch_import_vm_bytes() + (3 << 29)
    proc = subprocess.run([prlimit, f"--as={limit}", sys.executable, "-m", "commbench", "sweep", "--sizes", "1K,2G",
                           "--iters", "1", "--warmup", "0", "--json", str(tmp_path / "r.jsonl")],
                          capture_output=True, text=True, timeout=120, env=clean_env())
    assert proc.returncode == 3
    assert "out of memory at 2 GiB (allreduce, out-of-place)" in proc.stderr
    assert len(said_lines(proc.stderr)) == 1 and "Traceback" not in proc.stderr
    results, records = results_of(tmp_path / "r.jsonl")
    assert [r["nbytes"] for r in results] == [1024, 1024]
    assert records[-1]["status"] == "failed" and "out of memory" in records[-1]["error"]


def test_a_sweep_whose_peer_never_comes_still_writes_its_summary(tmp_path, port):
    """Rank 0 of a 2-rank torchrun job alone: the rendezvous gives up within --timeout, one line,
    exit 3, and --json holds a summary saying so (nothing measured, nothing lost)."""
    env = clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port))
    proc = subprocess.run([sys.executable, "-m", "commbench", "sweep", "--sizes", "1K", "--timeout", "3", "--json",
                           str(tmp_path / "r.jsonl")], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1, proc.stderr
    summary = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[-1])
    assert summary["record"] == "summary" and summary["status"] == "failed" and summary["points"] == 0
