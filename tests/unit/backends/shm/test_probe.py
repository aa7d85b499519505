"""The planner's measurement (commbench/backends/shm/probe.py): its rule keeps the incumbent unless a
candidate wins in most rounds, and a real probe gives a valid plan with its figures (no timing asserted)."""
import numpy as np
import pytest

from commbench.backends.shm import native as shm_native
from commbench.backends.shm import plan as shm_plan
from commbench.backends.shm import probe as shm_probe
from commbench.backends.shm.plan import Plan

try:
    LIBRARY = shm_native.load_built()[1]
except shm_native.NativeUnavailable:
    LIBRARY = None


def test_a_clear_win_in_every_round_moves_the_plan():
    scores = np.array([[10.0, 5.0, 9.0]] * 6)  # rounds x candidates (512, 1024, 8192): 1024 twice as fast
    chosen, ratios = shm_probe.decide(Plan(), "block_bytes", (512, 1024, 8192), scores)
    assert chosen == Plan(block_bytes=1024) and ratios == pytest.approx([0.9, 1.8, 1.0])


def test_noise_or_one_lucky_round_keeps_the_incumbent():
    small = np.array([[10.0, 9.9], [10.0, 10.1], [10.0, 9.95], [10.0, 10.05]])  # within KEEP_UNLESS
    assert shm_probe.decide(Plan(), "nt", ("both", "none"), small)[0] == Plan()
    lucky = np.array([[10.0, 3.0], [10.0, 11.0], [10.0, 11.0], [10.0, 3.0], [10.0, 11.0], [10.0, 3.0]])
    assert shm_probe.decide(Plan(), "nt", ("both", "none"), lucky)[0] == Plan()  # median ok, q1 below 1


@pytest.mark.skipif(LIBRARY is None, reason="the native executor does not build here")
def test_a_real_probe_gives_a_valid_plan_and_its_figures(monkeypatch):
    monkeypatch.setattr(shm_probe, "MIN_PROBE_BYTES", 1 << 20)
    monkeypatch.setattr(shm_native, "llc_bytes", lambda: 1 << 20)  # small: this checks the shape, not the speed
    monkeypatch.setattr(shm_probe, "ROUNDS", 2)
    result = shm_probe.probe(str(LIBRARY), 1 << 20)
    plan = shm_plan.checked(result["plan"])
    assert [stage["knob"] for stage in result["stages"]] == ["block_bytes", "nt_in_place", "nt", "prefetch_bytes"]
    for stage in result["stages"]:
        assert len(stage["score_ms"]) == len(stage["candidates"]) and all(s > 0 for s in stage["score_ms"])
        assert stage["chosen"] in stage["candidates"]
    assert (plan.block_bytes, plan.nt_in_place, plan.nt, plan.prefetch_bytes) == \
        tuple(s["chosen"] for s in result["stages"])


def test_a_probe_over_its_time_limit_runs_fewer_rounds_then_on_smaller_buffers():
    """A probe at the LLC's size that would not fit its limit (the H100 machine's Intel host: a 300 MiB LLC, and
    every job got the built-in values) first runs fewer rounds at that size, down to MIN_ROUNDS; only then on
    smaller buffers, never below MIN_PROBE_BYTES nor above what it was given."""
    per_call, llc = 0.040, 300 << 20  # one call at 300 MiB alone
    round_s = shm_probe.OPS_PER_ROUND * shm_probe.PAIRED_SLOWDOWN * per_call
    limit = lambda seconds: seconds / shm_probe.BUDGET_SHARE  # noqa: E731 - the limit whose share is `seconds`
    assert shm_probe.shaped_to_budget(llc, per_call, limit(shm_probe.ROUNDS * round_s)) == (shm_probe.ROUNDS, llc)
    assert shm_probe.shaped_to_budget(llc, per_call, limit(3.5 * round_s)) == (3, llc)
    rounds, cut = shm_probe.shaped_to_budget(llc, per_call, limit(1.0 * round_s))
    assert rounds == shm_probe.MIN_ROUNDS and shm_probe.MIN_PROBE_BYTES < cut < llc and cut % (1 << 20) == 0
    assert cut / llc * shm_probe.MIN_ROUNDS * round_s <= 1.0 * round_s  # its estimate fits
    assert shm_probe.shaped_to_budget(llc, per_call, 0.1) == (shm_probe.MIN_ROUNDS, shm_probe.MIN_PROBE_BYTES)
    assert shm_probe.shaped_to_budget(4 << 20, 1.0, 1.0) == (shm_probe.MIN_ROUNDS, 4 << 20)  # never more


@pytest.mark.skipif(LIBRARY is None, reason="the native executor does not build here")
def test_a_probe_given_a_limit_times_one_call_and_says_its_size(monkeypatch):
    monkeypatch.setattr(shm_probe, "MIN_PROBE_BYTES", 1 << 20)
    monkeypatch.setattr(shm_probe, "ROUNDS", 2)
    monkeypatch.setattr(shm_probe, "shaped_to_budget", lambda nbytes, one_call_s, budget_s: (2, 1 << 20))
    result = shm_probe.probe(str(LIBRARY), 4 << 20, budget_s=30.0)
    assert result["nbytes_per_rank"] == 1 << 20 and result["rounds"] == 2
    assert result["budget_s"] == 30.0 and result["one_call_ms"] > 0
    assert result["llc_bytes"] == shm_native.llc_bytes()
    shm_plan.checked(result["plan"])


RANK = """import sys
from pathlib import Path
from commbench.backends.shm import plan
plan.measure(Path(sys.argv[1]), 60.0)
"""


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc)."""
    import os

    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if name.isdigit() and int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(name))
    return found


@pytest.mark.skipif(LIBRARY is None, reason="the native executor does not build here")
def test_the_probe_and_its_workers_die_with_the_rank_that_started_it(tmp_path):
    """kill -9 of the rank measuring the plan (plan.measure): the probe and its two workers end with it at once
    (issue 48: three probe processes ran on for seconds, to the end of the probe)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import clean_env

    script = tmp_path / "rank.py"
    script.write_text(RANK)
    rank = subprocess.Popen([sys.executable, str(script), str(LIBRARY)], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(seen) < 3 and time.monotonic() < deadline and rank.poll() is None:
            probes = _children(rank.pid)
            seen = probes + [worker for probe in probes for worker in _children(probe)]
            time.sleep(0.01)
        assert len(seen) == 3, f"the probe's workers never ran ({seen}; rank {rank.poll()})"
        rank.kill()
        rank.wait(timeout=10)
        deadline = time.monotonic() + 2.0  # a SIGKILL from the kernel: at once, even on a loaded machine
        while time.monotonic() < deadline and [pid for pid in seen if _alive(pid)]:
            time.sleep(0.02)
        assert not [pid for pid in seen if _alive(pid)]
    finally:
        rank.kill()
        rank.wait(timeout=10)
        for pid in seen:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
