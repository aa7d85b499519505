"""The job frame (commbench/job.py): jobs are declared beside their work and handed to it; a spawned rank
finds its job again by the declaration's own reference, and nothing else."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from commbench import job
from commbench.bench import SWEEP_JOB
from commbench.proxies.replay import PROXY_JOB
from commbench.proxies.traces.replay import TRACE_REPLAY_JOB
from commbench.proxies.train import TRAIN_JOB

DECLARED = [SWEEP_JOB, PROXY_JOB, TRAIN_JOB, TRACE_REPLAY_JOB]


@pytest.mark.parametrize("declared", DECLARED, ids=lambda j: j.name)
def test_a_spawned_rank_finds_each_job_by_its_own_reference(declared):
    assert job.declared_job(declared.ref) is declared


def test_the_jobs_have_names_of_their_own():
    assert len({j.name for j in DECLARED}) == len(DECLARED)


@pytest.mark.parametrize("ref", ["os:system", "commbench.bench:run_sweep", "commbench.bench:SWEEP"])
def test_a_reference_that_is_not_a_declared_job_is_refused(ref):
    with pytest.raises((ValueError, AttributeError)):
        job.declared_job(ref)


@dataclass(frozen=True)
class _Config:
    timeout_s: float = 5.0
    json_path: str | None = None


def test_a_local_plan_runs_the_jobs_rank_function_here():
    seen = []
    local = job.Job("t", "tests:T", _Config, lambda cfg, launch, argv: seen.append((cfg, launch.world_size, argv))
                    or 7, lambda records, error: None)
    assert job.run(local, _Config(), job.Plan("local", 1), ["x"]) == 7
    assert seen == [(_Config(), 1, ["x"])]


def test_a_config_of_another_job_is_refused_before_anything_runs():
    with pytest.raises(TypeError, match="sweep job runs a SweepConfig"):
        job.run(SWEEP_JOB, _Config(), job.Plan("local", 1), [])


def test_closing_a_file_writes_the_jobs_own_summary(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps({"record": "header", "run_id": "r1"}) + "\n")
    summary = job.Job("t", "tests:T", _Config, lambda *a: 0,
                      lambda records, error: SWEEP_JOB.summary(records, error))
    job.close_records(summary, str(out))
    last = json.loads(out.read_text().splitlines()[-1])
    assert (last["record"], last["run_id"], last["status"], last["points"]) == ("summary", "r1", "failed", 0)


def test_a_rank_given_no_job_of_commbench_says_so_in_one_line():
    env = dict(os.environ, COMMBENCH_JOB=json.dumps({"job": "os:system", "config": {}, "argv": []}))
    proc = subprocess.run([sys.executable, "-P", "-m", "commbench.job"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["commbench: error: COMMBENCH_JOB: 'os:system' is not a job of commbench"]
