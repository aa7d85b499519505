"""shm's planner (commbench/backends/shm/plan.py): measured once, cached beside the library with the
machine's identity, measured again when that changes, overridden by $COMMBENCH_SHM_PLAN (a bad value
is one line, exit 2), and the values in the run's header. No timing is asserted: the measurement is
replaced by a stand-in that counts its calls, except in the sweep, which uses an override."""
import json

import pytest
from conftest import clean_env, commbench

from commbench.backends.shm import plan as shm_plan
from commbench.backends.shm.plan import Plan


@pytest.fixture
def library(tmp_path, monkeypatch):
    monkeypatch.delenv(shm_plan.PLAN_VAR, raising=False)
    monkeypatch.setattr(shm_plan, "load_per_core", lambda: 0.0)  # the machine's own load decides nothing here
    path = tmp_path / "build" / "libcb_shm.so"
    path.parent.mkdir()
    path.write_bytes(b"the library's bytes")
    return path


class Measure:
    """A stand-in for shm_probe's measurement: counts its calls, returns `plan`."""

    def __init__(self, plan: dict | None = None):
        self.calls, self.plan = 0, plan or {"block_bytes": 1024, "nt": "push", "nt_in_place": "none",
                                            "prefetch_bytes": 0}

    def __call__(self, library, timeout_s):
        assert 0 < timeout_s <= shm_plan.PROBE_TIMEOUT_S
        self.calls += 1
        return {"plan": self.plan, "stages": []}


def test_measured_once_then_read_from_the_cache(library):
    measure = Measure()
    first = shm_plan.choose(library, measure)
    again = shm_plan.choose(library, measure)
    assert measure.calls == 1
    assert first.plan == again.plan == Plan(1024, "push", "none", 0)
    assert first.source.startswith("measured") and again.source.startswith("cached")
    saved = json.loads((library.parent / shm_plan.PLAN_FILE).read_text())
    assert saved["identity"] == shm_plan.identity(library) and saved["plan"]["block_bytes"] == 1024


def test_a_new_identity_measures_again(library, monkeypatch):
    measure = Measure()
    shm_plan.choose(library, measure)
    library.write_bytes(b"a rebuilt library")  # the library's hash is part of the identity
    shm_plan.choose(library, measure)
    assert measure.calls == 2
    real = shm_plan.identity
    monkeypatch.setattr(shm_plan, "identity", lambda path: {**real(path), "cpu": "another CPU"})
    chosen = shm_plan.choose(library, measure)
    assert measure.calls == 3 and chosen.source.startswith("measured")
    monkeypatch.setattr(shm_plan, "identity", lambda path: {**real(path), "cores": 64})
    shm_plan.choose(library, measure)
    assert measure.calls == 4


def test_a_damaged_cache_is_measured_again_not_run(library):
    (library.parent / shm_plan.PLAN_FILE).write_text("__import__('os').system('false')")
    measure = Measure()
    assert shm_plan.choose(library, measure).source.startswith("measured") and measure.calls == 1
    saved = json.loads((library.parent / shm_plan.PLAN_FILE).read_text())
    saved["plan"]["block_bytes"] = 7  # out of range: not used
    (library.parent / shm_plan.PLAN_FILE).write_text(json.dumps(saved))
    assert shm_plan.choose(library, measure).plan.block_bytes == 1024 and measure.calls == 2


def test_the_override_wins(library, monkeypatch):
    measure = Measure()
    monkeypatch.setenv(shm_plan.PLAN_VAR, "block=2K,nt=none,nt_in_place=out,prefetch=4K")
    chosen = shm_plan.choose(library, measure)
    assert chosen.plan == Plan(2048, "none", "out", 4096) and measure.calls == 0  # every knob given: nothing measured
    assert shm_plan.PLAN_VAR in chosen.source
    monkeypatch.setenv(shm_plan.PLAN_VAR, "default")
    assert shm_plan.choose(library, measure).plan == Plan() and measure.calls == 0
    monkeypatch.setenv(shm_plan.PLAN_VAR, "nt=out")  # one knob: the rest measured (once) and cached
    partial = shm_plan.choose(library, measure)
    assert partial.plan == Plan(1024, "out", "none", 0) and measure.calls == 1 and "nt from" in partial.source


@pytest.mark.parametrize("text,says", [("block=7", "block 7"), ("block=1M", "block 1048576"),
                                       ("nt=sometimes", "nt 'sometimes'"), ("prefetch=100", "prefetch 100"),
                                       ("nt_in_place=all", "nt_in_place 'all'"),
                                       ("speed=11", "expected `default`"), ("block=big", "not a size"),
                                       ("block=1K-4K", "not a size"), ("block=1K,block=2K", "block given twice")])
def test_a_bad_override_is_one_valueerror(text, says):
    with pytest.raises(ValueError, match=says):
        shm_plan.override(text)


def test_a_failed_measurement_runs_the_built_in_values(library):
    def fails(path, timeout_s):
        raise RuntimeError("the probe failed: no second core")
    chosen = shm_plan.choose(library, fails)
    assert chosen.plan == Plan() and chosen.source.startswith("default: not measured (the probe failed")
    assert not (library.parent / shm_plan.PLAN_FILE).exists()  # measured again next time


def test_a_short_job_timeout_runs_the_cached_plan_or_the_built_in_one(library):
    measure = Measure()
    chosen = shm_plan.choose(library, measure, job_timeout_s=10)
    assert chosen.plan == Plan() and measure.calls == 0 and "not measured" in chosen.source
    shm_plan.choose(library, measure, job_timeout_s=300)
    assert shm_plan.choose(library, measure, job_timeout_s=10).plan == Plan(1024, "push", "none", 0)
    assert measure.calls == 1


def test_a_bad_override_is_one_line_exit_2():
    proc = commbench("sweep", "--backend", "shm", "-N", "2", "--sizes", "1K",
                     env=clean_env(COMMBENCH_SHM_PLAN="block=100"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith("block 100: expected a multiple of 64 bytes from 64 to 65536")
    assert "Traceback" not in proc.stderr


def test_the_header_carries_the_values(tmp_path, clean_shm):
    proc = commbench("sweep", "--backend", "shm", "-N", "2", "--sizes", "1K,64K", "--iters", "3", "--warmup", "1",
                     "--json", str(tmp_path / "r.jsonl"),
                     env=clean_env(COMMBENCH_SHM_PLAN="block=1K,nt=out,nt_in_place=none,prefetch=0",
                                   COMMBENCH_SHM_EXECUTOR="auto"))
    assert proc.returncode == 0, proc.stderr
    header = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    if "executor native" not in proc.stdout:
        pytest.skip("the native executor does not build here: no plan to carry")
    assert header["shm_plan"] == {"block_bytes": 1024, "nt": "out", "nt_in_place": "none", "prefetch_bytes": 0,
                                  "source": f"override ${shm_plan.PLAN_VAR}"}
    assert "# shm plan: block 1 KiB, nt out, nt in place none, prefetch 0 B (override $COMMBENCH_SHM_PLAN)" \
        in proc.stdout


def test_zero_is_zero_with_or_without_a_unit():
    assert shm_plan.override("prefetch=0") == shm_plan.override("prefetch=0K") == {"prefetch_bytes": 0}


def test_a_job_waits_for_another_jobs_measuring_only_within_its_budget(library, monkeypatch):
    import fcntl

    monkeypatch.setattr(shm_plan, "PROBE_TIMEOUT_S", 0.3)
    measure = Measure()
    with open(library.parent / "plan.lock", "a") as held:  # another job measuring (flock: per open file)
        fcntl.flock(held, fcntl.LOCK_EX)
        chosen = shm_plan.choose(library, measure, job_timeout_s=300)
    assert chosen.plan == Plan() and measure.calls == 0 and "another job was measuring" in chosen.source
    assert shm_plan.choose(library, measure, job_timeout_s=300).plan == Plan(1024, "push", "none", 0)


def test_a_probe_past_its_time_says_how_long_it_had(library):
    import subprocess

    def slow(path, timeout_s):
        raise subprocess.TimeoutExpired(["probe"], timeout_s)
    chosen = shm_plan.choose(library, slow, job_timeout_s=30)
    assert chosen.plan == Plan() and chosen.source == "default: not measured (the probe took over 10 s)"


def test_a_plan_measured_on_a_busy_machine_is_measured_again_when_it_is_quiet(library, monkeypatch):
    measure, load = Measure(), {"per_core": 4.0}
    monkeypatch.setattr(shm_plan, "load_per_core", lambda: load["per_core"])
    busy = shm_plan.choose(library, measure)
    assert "at load 4.0 per core" in busy.source and "measured again when quieter" in busy.source
    assert json.loads((library.parent / shm_plan.PLAN_FILE).read_text())["load_per_core"] == 4.0
    still = shm_plan.choose(library, measure)  # still busy: the cached plan, said to be a busy one
    assert measure.calls == 1 and still.source.startswith("cached") and "at load 4.0" in still.source
    load["per_core"] = 0.5
    short = shm_plan.choose(library, measure, job_timeout_s=5.0)  # no room to measure: the busy plan, not defaults
    assert measure.calls == 1 and short.plan == busy.plan
    quiet = shm_plan.choose(library, measure)
    assert measure.calls == 2 and quiet.source.startswith("measured") and "load" not in quiet.source
    load["per_core"] = 4.0  # a quiet plan stays, whatever the load later
    assert shm_plan.choose(library, measure).source.startswith("cached") and measure.calls == 2


def test_a_probe_cut_under_the_llc_says_so_measured_and_cached(library):
    """A probe its time limit cut below the LLC's size (probe.shaped_to_budget) measured cache-sized buffers: the
    plan's source says so, when measured and every time it is read from the cache."""
    class Cut(Measure):
        def __call__(self, library, timeout_s):
            return {**super().__call__(library, timeout_s), "nbytes_per_rank": 64 << 20, "llc_bytes": 300 << 20}

    first, again = shm_plan.choose(library, Cut()), shm_plan.choose(library, Cut())
    said = ", probed at 64 MiB per rank under the 300 MiB LLC (its time limit)"
    assert said in first.source and said in again.source and again.source.startswith("cached")
    assert shm_plan.cut_note({"nbytes_per_rank": 32 << 20, "llc_bytes": 32 << 20}) == ""
    assert shm_plan.cut_note({}) == ""


def test_the_probe_is_given_its_time_limit(library, monkeypatch):
    """plan.measure passes the probe the limit it is run under, which the probe sizes itself to."""
    seen = {}

    def run(argv, **kwargs):
        seen["argv"], seen["timeout"] = argv, kwargs["timeout"]
        return type("Done", (), {"returncode": 0, "stdout": json.dumps({"plan": Measure().plan}), "stderr": ""})()

    monkeypatch.setattr(shm_plan.subprocess, "run", run)
    assert shm_plan.measure(library, 20.0)["plan"]["nt"] == "push"
    assert seen["argv"][-2:] == [str(library), "20"] and seen["timeout"] == 20.0
