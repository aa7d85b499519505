"""`commbench selftest`: run here as a user runs it (CPU checks pass, GPU checks skipped with
why), and each way it can end: a failed check (exit 1, the reason on its line), a check
that cannot run (skipped, exit 0), a usage error (one line, exit 2)."""
import json
import re
import subprocess

import pytest
from conftest import commbench, gpu_count

from commbench.backends.cuda import checks as C
from commbench.backends.cuda import host as H
from commbench.cli import main
from commbench.commands import selftest as S

GPUS = gpu_count("cuda")
CPU_CHECKS = ("host-kernels", "host-schedules", "sim", "shm", "gloo")
GPU_CHECKS = ("gpu-kernels", "nccl", "nvml", "peer-ipc")
LINE = re.compile(r"^(passed|failed|skipped)\s+([\w-]+)\s+(.+)$")


def _has_compiler() -> bool:
    try:
        H.find_compiler()
        return True
    except H.HostBuildError:
        return False


def _lines(out: str) -> dict[str, tuple[str, str]]:
    """check name -> (status, detail) from selftest's output."""
    return {m.group(2): (m.group(1), m.group(3)) for m in map(LINE.match, out.splitlines()) if m}


def test_selftest_as_it_runs_here():
    proc = commbench("selftest", timeout=600)
    lines = _lines(proc.stdout)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert list(lines) == [c.name for c in S.CHECKS]  # one line per check, in order
    for name in CPU_CHECKS:
        expected = "passed" if _has_compiler() or not name.startswith("host") else "skipped"
        assert lines[name][0] == expected, lines[name]
    assert "wrong" not in lines["host-kernels"][1] and "0 wrong" in lines["shm"][1]
    if GPUS == 0:
        assert all(lines[name][0] == "skipped" and lines[name][1].startswith("no GPU (") for name in GPU_CHECKS)
        assert "# the GPU checks need an NVIDIA GPU and pip install 'commbench[gpu]'" in proc.stdout
    else:
        assert all(lines[name][0] in ("passed", "skipped") for name in GPU_CHECKS), lines
    assert re.search(r"^# \d passed, 0 failed, \d skipped in [\d.]+ s$", proc.stdout, re.M)


def test_a_wrong_kernel_result_fails_the_check_and_the_run(capsys, monkeypatch):
    """The host kernels checked against a reference that is off by one: the check fails, names
    the first case, and the run exits 1."""
    if not _has_compiler():
        pytest.skip("no C++ compiler: the host build cannot run")
    reference = C.reference
    monkeypatch.setattr(C, "reference", lambda xp, dtype, op, a, b: reference(xp, dtype, op, a, b) + 3)
    code = main(["selftest", "--only", "host-kernels"])
    status, detail = _lines(capsys.readouterr().out)["host-kernels"]
    assert code == 1 and status == "failed"
    assert re.match(r"\d+ case\(s\) wrong, first: reduce_copy float32 sum count 1, a\[0:\] b\[0:\] out\[0:\]", detail)


def test_a_check_that_crashes_is_a_failed_line_and_the_others_still_run(capsys, monkeypatch):
    def crash(scratch, timeout_s):
        raise KeyError("busbw_gbps")

    def skip(scratch, timeout_s):
        raise S.Skipped("not here")
    monkeypatch.setattr(S, "CHECKS", (S.Check("a", crash), S.Check("b", skip), S.Check("c", lambda s, t: "fine")))
    assert main(["selftest"]) == 1
    out = capsys.readouterr().out
    assert _lines(out) == {"a": ("failed", "KeyError: 'busbw_gbps' (0.0 s)"), "b": ("skipped", "not here"),
                           "c": ("passed", "fine (0.0 s)")}
    assert "# 1 passed, 1 failed, 1 skipped in" in out


def test_without_a_compiler_the_host_checks_are_skipped_with_why(capsys, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-commbench")
    assert main(["selftest", "--only", "host-kernels,host-schedules"]) == 0
    lines = _lines(capsys.readouterr().out)
    assert {status for status, _ in lines.values()} == {"skipped"}
    assert lines["host-kernels"][1].startswith("no C++ compiler for the host build of cuda/ (looked for "
                                               "$CXX=no-such-compiler-commbench)")


@pytest.mark.skipif(GPUS > 0, reason="checks what a machine without a GPU prints")
def test_gpu_checks_say_why_they_are_skipped(capsys):
    assert main(["selftest", "--only", ",".join(GPU_CHECKS)]) == 0
    lines = _lines(capsys.readouterr().out)
    assert all(status == "skipped" and detail.startswith("no GPU (") for status, detail in lines.values()), lines


@pytest.mark.parametrize("args,needle", [(["--only", "host-kernels,nope"], "no check named 'nope'; choose from "),
                                         (["--timeout", "0"], "--timeout 0: must be at least 1")])
def test_usage_errors_are_one_line_exit_2(capsys, args, needle):
    assert main(["selftest", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_a_sweep_that_fails_or_finds_wrong_elements_is_the_reason(tmp_path, monkeypatch):
    """Exit codes and records decide; launcher variables never reach the sweep, so a selftest
    started by srun or torchrun spawns its own ranks."""
    from commbench.results import Result

    seen = {}

    def fake_run(command, env, **kwargs):
        seen["env"] = env
        path = command[command.index("--json") + 1]
        wrong = Result(collective="allreduce", backend="sim", library="schedule", device="cpu", dtype="float32",
                       op="sum", root=None, placement="in-place", world_size=8, nnodes=1, requested_nbytes=4096,
                       nbytes=4096, count=1024, warmup=0, iters=0, time_us=None, algbw_gbps=None, busbw_gbps=None,
                       p50_us=None, p90_us=None, p99_us=None, min_us=None, max_us=None, rank_agg="max",
                       wrong=5).to_dict()  # a whole record: the reader checks every field
        with open(path, "w") as f:
            f.write(json.dumps({"record": "header"}) + "\n" + json.dumps(wrong) + "\n")
        return subprocess.CompletedProcess(command, 1, "", "")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setattr(S.subprocess, "run", fake_run)
    with pytest.raises(S.Failed, match=r"^5 wrong element\(s\): first allreduce 4096 B in-place \(--backend sim\)$"):
        S.sweep(tmp_path, "x", ["--backend", "sim"], 30)
    assert "RANK" not in seen["env"] and "SLURM_PROCID" not in seen["env"] and "PATH" in seen["env"]


def test_a_sweep_that_exits_non_zero_names_its_last_line(tmp_path):
    with pytest.raises(S.Failed, match=r"^`commbench sweep --backend nope` exited 2: commbench: error: .*nope"):
        S.sweep(tmp_path, "bad", ["--backend", "nope"], 60)
