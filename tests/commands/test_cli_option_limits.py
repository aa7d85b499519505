"""Numbers on the command line that cannot be honoured end in one line and exit 2 before any
rank starts: non-finite values, values past what the libraries take, more local ranks than
the host carries, buffers larger than its memory, work that grows past reach."""
from __future__ import annotations

import pytest

from commbench import cli, job
from commbench.commands.helpers import options as O
from commbench.environment import usable_cpus

CROWDED = str(O.RANKS_PER_CORE * (usable_cpus() or 1) + 1)  # past the limit, below --oversubscribe's ceiling


@pytest.fixture(autouse=True)
def no_ranks(monkeypatch):
    """A case that passed validation would start ranks: fail loudly instead."""
    monkeypatch.setattr(job, "run", lambda *args, **kwargs: pytest.fail("validation let the run start"))


@pytest.mark.parametrize("args,needle", [
    (["sweep", "--sizes", "1K", "--timeout", "inf"], "--timeout inf: must be a finite number"),
    (["sweep", "--sizes", "1K", "--timeout", "1e30"], "--timeout 1e+30: must be at most 604800"),
    (["sweep", "--sizes", "1K", "--timeout", "1e-9"], "--timeout 1e-09: must be at least 1"),
    (["sweep", "--sizes", "1K", "--min-time", "inf"], "--min-time inf: must be a finite number"),
    (["sweep", "--sizes", "1K", "--min-time", "nan"], "--min-time nan: must be a finite number"),
    (["sweep", "--sizes", "99999999999999999999999"], "at most 4 TiB per rank"),
    (["sweep", "--sizes", "9" * 400], "at most 4 TiB per rank"),
    (["sweep", "--sizes", ""], "--sizes '': an empty value"),
    (["sweep", "--sizes", "1K", "--step", "1K"], "not to a single size"),
    (["sweep", "--backend", "sim", "-N", "100000", "--sizes", "1K"], "at most 1024"),
    (["sweep", "--nprocs", CROWDED, "--sizes", "1K"], "add --oversubscribe"),
    (["sweep", "--sizes", "1T"], "this host (or its memory group) allows"),
    (["proxy", "resnet18", "--timeout", "inf"], "--timeout inf: must be a finite number"),
    (["proxy", "resnet18", "--tflops", "nan"], "--tflops nan: must be a finite number"),
    (["proxy", "resnet18", "--nprocs", CROWDED, "--tflops", "1"], "add --oversubscribe"),
    (["proxy", "resnet18", "--backend", "shm", "--algorithm", "warp", "--tflops", "1"], "no algorithm 'warp'"),
    (["proxy", "resnet18", "--backend", "sim", "--hw", "dgx-a100", "--tflops", "100", "--nodes", "2",
      "--algorithm", "1e309"], "no algorithm '1e309'"),
    (["proxy", "resnet18", "--backend", "sim", "--hw", "dgx-a100", "--tflops", "100", "--nodes", "300",
      "--algorithm", "rhd"], "at most 256 GPUs"),
    (["train", "resnet18", "--nprocs", CROWDED], "add --oversubscribe"),
    # --oversubscribe lifts the limit to a ceiling, not away (issue 26: 100000 ranks forked without bound)
    (["sweep", "--nprocs", "100000", "--oversubscribe", "--sizes", "1K"], "per core, --oversubscribe or not"),
    (["proxy", "resnet18", "--nprocs", "100000", "--oversubscribe", "--tflops", "1"], "--oversubscribe or not"),
    (["nccl-tests", "--oversubscribe", "all_reduce_perf", "-g", "100000", "-b", "1K", "-e", "1K"],
     "--oversubscribe or not"),
    (["predict", "--hw", "dgx-a100", "--topology", "100000x100000", "--sizes", "1K"], "at most 1,024 ranks"),
])
def test_out_of_reach_numbers_are_one_line_exit_2(capsys, args, needle):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_oversubscribe_lets_the_ranks_start(monkeypatch):
    started = []
    monkeypatch.setattr(job, "run", lambda name, cfg, plan, argv: started.append(plan.world) or 0)
    assert cli.main(["sweep", "--nprocs", "9", "--sizes", "1K", "--oversubscribe"]) == 0
    assert started == [9]


def test_a_range_names_its_bound():
    with pytest.raises(Exception, match=r"--x 0: must be positive"):
        O.Range(0, None, low_open=True).check("--x", 0)
    with pytest.raises(Exception, match=r"--x 11: must be at most 10"):
        O.Range(1, 10).check("--x", 11)
    O.Range(1, 10).check("--x", 10)  # the bound itself is allowed


def test_a_predicted_proxy_lays_ranks_on_the_hardwares_nodes(capsys):
    """32 GPUs of dgx-a100 are 4 nodes of 8, said in a note, not one 32-GPU node in silence."""
    assert cli.main(["proxy", "resnet18", "--backend", "sim", "-N", "32", "--hw", "dgx-a100", "--tflops", "100"]) == 0
    out = capsys.readouterr().out
    assert "predicting 4 x 8 ranks" in out and "on 4x8 (32 ranks)" in out
    assert cli.main(["proxy", "resnet18", "--backend", "sim", "-N", "12", "--hw", "dgx-a100", "--tflops", "1"]) == 2


def test_memory_checks_read_the_memory_group(monkeypatch):
    """In a memory group (a container, a SLURM job) smaller than the host, a run whose buffers fit the
    host but not the group is refused in one line (issue 26: in a 3 GB group `--sizes 1K-1G` on shm
    ranks was killed by SIGKILL, exit 3, no word of memory)."""
    monkeypatch.setattr(O, "memory_limit_bytes", lambda: 3 << 30)
    with pytest.raises(Exception, match=r"need 4\.0 GiB; this host \(or its memory group\) allows 3\.0 GiB"):
        O.check_memory(4 << 30, "2 rank(s) x 2 buffers of 1,073,741,824 B")
    O.check_memory(2 << 30, "2 rank(s) x 2 buffers of 536,870,912 B")


def _memory_group(limit_bytes: int):
    """A cgroup v1 or v2 memory group of `limit_bytes` (as root), or None; the caller removes it."""
    import os
    import uuid

    for folder, name in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes"), ("/sys/fs/cgroup", "memory.max")):
        path = os.path.join(folder, f"commbench-test-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(path)
        except OSError:
            continue
        try:
            with open(os.path.join(path, name), "w") as handle:
                handle.write(str(limit_bytes))
            return path
        except OSError:
            os.rmdir(path)
    return None


def test_a_run_too_large_for_its_memory_group_is_refused(tmp_path):
    """Started in a 1 GiB memory group (as a container or SLURM job would), shm ranks whose buffers
    fit the host but not the group: one line naming the group's limit, exit 2, no rank started."""
    import os
    import subprocess
    import sys

    from conftest import clean_env

    group = _memory_group(1 << 30)
    if group is None:
        pytest.skip("needs root and a writable memory cgroup")
    try:
        enter = f"echo $$ > {group}/cgroup.procs && exec \"$0\" \"$@\""
        proc = subprocess.run(["sh", "-c", enter, sys.executable, "-m", "commbench", "sweep", "--backend", "shm",
                               "--sizes", "1K-512M", "--timeout", "60", "--json", str(tmp_path / "r.jsonl")],
                              capture_output=True, text=True, timeout=300, env=clean_env())
    finally:
        os.rmdir(group)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "memory group) allows 1.0 GiB" in proc.stderr, proc.stderr


def test_a_rank_killed_by_sigkill_names_memory(capsys):
    """SIGKILL is what the kernel's OOM killer sends: the line says memory may be why."""
    from commbench import launch

    class Ended:
        def __init__(self, code):
            self.returncode = code

    assert launch._job_exit_code([Ended(0), Ended(-9)], []) == 3
    err = capsys.readouterr().err
    assert "rank 1 was killed by SIGKILL (by hand, or out of memory" in err and "GiB in all" in err


def test_a_launcher_that_binds_each_rank_to_one_core_is_not_refused(monkeypatch):
    """srun (one CPU per task) or mpirun --bind-to core: a rank's own affinity is one core, but the node's
    ranks are the launcher's placement, counted against the host's cores (the review of issue 26)."""
    monkeypatch.setattr("commbench.commands.helpers.options.usable_cpus", lambda: 1)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    O.check_local_ranks(8, False, launched=True)  # 8 ranks on a 64-core node, each bound to its core
    with pytest.raises(O.UsageFault, match="more than 4 per core"):
        O.check_local_ranks(8, False)  # commbench spawning 8 ranks where it may use one core
