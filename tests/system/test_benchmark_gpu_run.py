"""benchmarks/gpu_run.sh's control flow on the CPU (DRY_RUN=1: each step's command is printed, not
run): a row per step, steps past the time budget skipped, and a complete report (summary.md,
log.txt, results.tgz) whether the run ends or is cut off (issue 36, item 7)."""
import signal
import subprocess
import tarfile
import time

from conftest import REPO

SCRIPT = str(REPO / "benchmarks" / "gpu_run.sh")
STEPS = ("env", "install", "float_check", "cuda_twoshot", "tune", "cuda_tuned", "harness", "cupy", "torch",
         "selftest", "proxy_validate", "test_nccl", "test_sched")


def _dry(report, budget, sleep_s, **popen):
    env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "BUDGET": str(budget), "DRY_SLEEP": str(sleep_s)}
    return subprocess.Popen(["bash", SCRIPT, str(report)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, **popen)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", SCRIPT], capture_output=True).returncode == 0


def test_every_step_gets_a_row_and_what_the_budget_leaves_out_is_skipped(tmp_path):
    proc = _dry(tmp_path, budget=12, sleep_s=1)
    assert proc.wait(timeout=120) == 0
    summary = (tmp_path / "summary.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in summary.splitlines()
            if line.startswith("| ") and not line.startswith("| step")}
    assert set(STEPS) <= set(rows), summary
    assert rows["env"] == "ok" and rows["test_sched"] == "SKIPPED (budget)", rows
    assert "Ended (done)" in summary and "DRY RUN" in summary
    with tarfile.open(tmp_path / "results.tgz") as packed:
        assert "logs/env.log" in packed.getnames()


def test_a_run_cut_off_still_leaves_its_report(tmp_path):
    proc = _dry(tmp_path, budget=300, sleep_s=2)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    summary = (tmp_path / "summary.md").read_text()
    assert "Ended (cut off)" in summary and "| env | ok |" in summary
    assert (tmp_path / "results.tgz").exists() and (tmp_path / "log.txt").exists()
