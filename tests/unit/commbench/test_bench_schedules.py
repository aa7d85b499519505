"""commbench's own algorithms through the harness: shm with real processes, sim in one
process, a broken schedule caught by #wrong, and /dev/shm left clean whatever happens."""
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from conftest import (
    clean_env,
    commbench,
    default_sigint,
    own_segments,
    rank_pid,
    results_of,
    shm_segments,
    wait_for_results,
)

from commbench import algorithms as A
from commbench.alltoall import pairwise_alltoall
from commbench.backends import BackendConfig
from commbench.backends.sim import SimBackend
from commbench.bench import Sweep
from commbench.errors import EXIT_WRONG
from commbench.launch import SHM_DIR
from commbench.launchers import LaunchInfo
from commbench.schedule import Schedule, Transfer
from commbench.sweep_config import SweepConfig
from commbench.topology import Topology

QUICK = ["--iters", "2", "--warmup", "1"]


@pytest.mark.parametrize("nprocs,args", [
    (2, ["-c", "allreduce", "-c", "allgather", "-c", "reduce_scatter", "-c", "broadcast", "-c", "reduce",
         "--sizes", "1K,100K,3M"]),
    (3, ["--algorithm", "ring", "--sizes", "1K,1000K", "--dtype", "bfloat16", "--op", "max"]),
    (3, ["--algorithm", "rhd", "--sizes", "4K,96K", "--dtype", "int32"]),
    (4, ["--algorithm", "hier", "--topology", "2x2", "--sizes", "1K,256K", "--op", "avg"]),
    (4, ["--algorithm", "tree", "--sizes", "1K,256K", "--dtype", "float16"]),
    (3, ["--algorithm", "oneshot", "--sizes", "1K,64K", "--op", "prod"]),
])
def test_shm_runs_pass_the_check(tmp_path, clean_shm, nprocs, args):
    proc = commbench("sweep", "--backend", "shm", "-N", str(nprocs), *QUICK, *args, "--json", str(tmp_path / "r.jsonl"))
    assert proc.returncode == 0, proc.stderr
    results, _ = results_of(tmp_path / "r.jsonl")
    assert results and all(r["wrong"] == 0 and r["steps"] > 0 and r["backend"] == "shm" for r in results)
    if "--algorithm" in args:
        assert {r["algorithm"] for r in results} == {args[args.index("--algorithm") + 1]}


@pytest.mark.parametrize("nprocs,algorithm,executor,topology", [
    (2, "pairwise", "native", "1x2"), (3, "pairwise", "python", "1x3"), (3, "bruck", "native", "1x3"),
    (2, "bruck", "python", "1x2"), (3, "hier", "native", "1x3"), (4, "hier", "python", "2x2"),
])
def test_shm_alltoall_passes_the_check(tmp_path, clean_shm, nprocs, algorithm, executor, topology):
    """Both executors run the all-to-all schedules (copies only; bruck and hier stage every round)."""
    proc = commbench("sweep", "--backend", "shm", "-N", str(nprocs), *QUICK, "-c", "alltoall", "--algorithm", algorithm,
                     "--topology", topology, "--sizes", "1K,300K", "--json", str(tmp_path / "r.jsonl"),
                     env=clean_env(COMMBENCH_SHM_EXECUTOR=executor))
    assert proc.returncode == 0, proc.stderr
    assert f"executor {executor}" in proc.stdout
    results, _ = results_of(tmp_path / "r.jsonl")
    assert len(results) == 2 and all(r["wrong"] == 0 and r["collective"] == "alltoall" and r["algorithm"] == algorithm
                                     and r["time_us"] > 0 for r in results)


@pytest.mark.parametrize("nprocs,args", [
    (4, ["--topology", "2x2", "--algorithm", "hier", "--sizes", "1K,1M", "--dtype", "bfloat16", "--op", "avg"]),
    (4, ["--topology", "2x2", "-c", "allreduce", "-c", "allgather", "-c", "reduce_scatter", "-c", "broadcast",
         "-c", "reduce", "--sizes", "1K,300K", "--op", "max"]),
    (3, ["--topology", "3x1", "--algorithm", "ring", "--sizes", "4K,1M", "--dtype", "int32"]),
    (4, ["--topology", "2x2", "-c", "alltoall", "--sizes", "1K,300K", "--dtype", "float16"]),
    (4, ["--topology", "2x2", "-c", "alltoall", "--algorithm", "bruck", "--sizes", "1K,300K"]),
])
def test_hybrid_shm_inside_nodes_send_recv_between(tmp_path, clean_shm, nprocs, args):
    proc = commbench("sweep", "--backend", "hybrid", "-N", str(nprocs), *QUICK, *args,
                     "--json", str(tmp_path / "r.jsonl"))
    assert proc.returncode == 0, proc.stderr
    results, _ = results_of(tmp_path / "r.jsonl")
    nodes = int(args[args.index("--topology") + 1].split("x")[0])
    assert results and all(r["wrong"] == 0 and r["backend"] == "hybrid" and r["nnodes"] == nodes for r in results)


def test_more_ranks_than_cores_make_progress(tmp_path, clean_shm):
    proc = commbench("sweep", "--backend", "shm", "-N", "5", "--sizes", "1K,64K", *QUICK,
                     "--json", str(tmp_path / "r.jsonl"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert all(r["wrong"] == 0 for r in results_of(tmp_path / "r.jsonl")[0])


def test_sim_64_ranks_8x8(tmp_path):
    started = time.monotonic()
    proc = commbench("sweep", "--backend", "sim", "--nprocs", "64", "--topology", "8x8", "-c", "all_reduce",
                     "--json", str(tmp_path / "r.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 60
    results, records = results_of(tmp_path / "r.jsonl")
    assert records[0]["launch"]["launcher"] == "single" and len(results) == 2 * 11
    assert all(r["wrong"] == 0 and r["time_us"] is None and r["kind"] == "predicted" for r in results)
    assert {r["algorithm"] for r in results} == {"rhd", "hier"}  # auto: small -> rhd on 64 ranks, large -> hier
    assert "n/m" in proc.stdout


def _misrouted_ring(topo, count):
    """Ring allreduce whose first all-gather step sends each rank's chunk to the wrong offset."""
    ring = A.ring_allreduce(topo, count)
    n = topo.world
    rounds = list(ring.rounds)
    ag = rounds[n - 1]
    rounds[n - 1] = tuple(Transfer(t.src, t.dst, ag[(i + 1) % len(ag)].chunk, t.reduce) for i, t in enumerate(ag))
    return Schedule("broken", "allreduce", ring.world, ring.count, tuple(rounds))


def _alltoall_missing_its_last_round(topo, count):
    pairwise = pairwise_alltoall(topo, count)
    return replace(pairwise, name="broken", rounds=pairwise.rounds[:-1])


@pytest.mark.parametrize("world", [2, 3])
def test_sim_alltoall_passes_and_a_broken_one_fails_the_check(tmp_path, monkeypatch, world):
    for name in ("pairwise", "bruck", "hier"):
        cfg = SweepConfig(sizes=(1000, 65536), collectives=("alltoall",), json_path=str(tmp_path / f"{name}.jsonl"),
                          backend=BackendConfig(backend="sim", nprocs=world, algorithm=name))
        assert Sweep(cfg, LaunchInfo.local(0, 1, 0), SimBackend(world, Topology(1, world), name)).run() == 0
        results, _ = results_of(tmp_path / f"{name}.jsonl")
        assert len(results) == 2 and all(r["wrong"] == 0 and r["algorithm"] == name for r in results)
    broken = A.Algorithm("broken", "alltoall", _alltoall_missing_its_last_round)
    monkeypatch.setitem(A.TABLE["alltoall"], "broken", broken)
    cfg = SweepConfig(sizes=(1000,), collectives=("alltoall",), json_path=str(tmp_path / "broken.jsonl"),
                      backend=BackendConfig(backend="sim", nprocs=world, algorithm="broken"))
    assert Sweep(cfg, LaunchInfo.local(0, 1, 0), SimBackend(world, Topology(1, world), "broken")).run() == EXIT_WRONG
    assert all(r["wrong"] > 0 for r in results_of(tmp_path / "broken.jsonl")[0])


def test_broken_schedule_is_caught_by_the_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(A.TABLE["allreduce"], "broken", A.Algorithm("broken", "allreduce", _misrouted_ring))
    cfg = SweepConfig(sizes=(4096, 65536), backend=BackendConfig(backend="sim", nprocs=4, algorithm="broken"),
                      json_path=str(tmp_path / "r.jsonl"))
    code = Sweep(cfg, LaunchInfo.local(0, 1, 0), SimBackend(4, Topology(1, 4), "broken")).run()
    assert code == EXIT_WRONG
    results, records = results_of(tmp_path / "r.jsonl")
    assert all(r["wrong"] > 0 for r in results) and records[-1]["status"] == "wrong"
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--backend", "shm", "--algorithm", "tree", "-c", "allgather"], "no algorithm 'tree' for allgather"),
    (["--backend", "sim", "--algorithm", "spiral"], "no algorithm 'spiral' for allreduce"),
    (["--backend", "shm", "-c", "sendrecv"], "no algorithm for sendrecv"),
    (["--backend", "shm", "-c", "alltoall", "--algorithm", "ring"], "no algorithm 'ring' for alltoall"),
    (["--backend", "sim", "--nprocs", "8", "--topology", "3x3"], "--topology 3x3 is 9 ranks but --nprocs 8"),
    (["--backend", "shm", "--nprocs", "4", "--topology", "2by2"], "bad --topology"),
    (["--backend", "torch", "--algorithm", "ring"], "--algorithm/--topology"),
    (["--backend", "shm", "--device", "cuda"], "runs on the CPU"),
])
def test_bad_algorithm_or_topology_is_one_line(args, needle):
    proc = commbench("sweep", *args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr


def _start_shm(tmp_path):
    return subprocess.Popen([sys.executable, "-m", "commbench", "sweep", "--backend", "shm", "--sizes", "1K-256K",
                             "--iters", "20000", "--warmup", "10", "--json", str(tmp_path / "r.jsonl"),
                             "--timeout", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            start_new_session=True, preexec_fn=default_sigint)


def test_killed_rank_leaves_no_segments(tmp_path, clean_shm):
    proc = _start_shm(tmp_path)
    wait_for_results(tmp_path / "r.jsonl", 2, proc)
    assert shm_segments(f"cb_{clean_shm}"), "the job's segments carry the test's tag (else clean_shm sees nothing)"
    os.kill(rank_pid(proc.pid, 1), signal.SIGKILL)
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 3 and "rank 1" in err and "died" in err, err


def test_hung_shm_rank_stops_within_the_timeout(tmp_path, clean_shm):
    proc = subprocess.Popen([sys.executable, "-m", "commbench", "sweep", "--backend", "shm", "--sizes", "1K-256K",
                             "--iters", "20000", "--warmup", "10", "--json", str(tmp_path / "r.jsonl"),
                             "--timeout", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), start_new_session=True)
    wait_for_results(tmp_path / "r.jsonl", 2, proc)
    started = time.monotonic()
    os.kill(rank_pid(proc.pid, 1), signal.SIGSTOP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err  # a fault, not the exit code of the rank the supervisor stopped
    # the stop lands either inside shm's own spin wait or inside a gloo control-plane exchange between
    # measurements: both end in a timeout line ("timed out after 3 s ..." / gloo's "Timed out waiting 3000ms ...")
    # bound: the 3 s timeout, the supervisor's 3 s grace for the other ranks, at most 3 s to stop them, slack
    assert time.monotonic() - started < 3 + 3 + 3 + 5 and "timed out" in err.lower() and "Traceback" not in err


def test_interrupted_run_leaves_no_segments(tmp_path, clean_shm):
    proc = _start_shm(tmp_path)
    wait_for_results(tmp_path / "r.jsonl", 2, proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=40)
    assert proc.returncode == 130, err
    assert len(results_of(tmp_path / "r.jsonl")[0]) >= 2


def test_clean_shm_owns_only_the_segments_of_its_test():
    """Another run's segment that appears and stays during a test is not the test's leak; a segment under the
    test's own tag is."""
    import uuid

    made = [os.path.join(SHM_DIR, f"cb_{uuid.uuid4().hex[:12]}_0_0")]
    try:
        with own_segments():
            open(made[0], "wb").close()  # another commbench run, mid-way
        with pytest.raises(AssertionError, match="left shared-memory segments behind"):
            with own_segments() as tag:
                made.append(os.path.join(SHM_DIR, f"cb_{tag}_0_0"))
                open(made[-1], "wb").close()
    finally:
        for path in made:
            os.unlink(path)
