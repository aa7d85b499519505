"""A fit that does not describe its data is refused (nothing written), or kept only when asked,
marked poor, and said to be poor wherever it is used."""
from __future__ import annotations

import json
import random

import pytest

from commbench import cli
from commbench.backends import BackendConfig
from commbench.bench import run_sweep
from commbench.launchers import LaunchInfo
from commbench.sweep_config import SweepConfig


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """A sim sweep timed by a preset, read as if measured (a fit describes it exactly), and the
    same points with times drawn at random (nothing describes them)."""
    tmp_path = tmp_path_factory.mktemp("fit-quality")
    sim = tmp_path / "sim.jsonl"
    cfg = SweepConfig(backend=BackendConfig(backend="sim", nprocs=4, hw="dgx-a100", algorithm="ring"),
                      sizes=tuple(1 << k for k in range(10, 26)),
                      placements=("in-place",), iters=2, warmup=0, json_path=str(sim))
    assert run_sweep(cfg, LaunchInfo.local(0, 1, 0), ["test"]) == 0
    lines = [{**r, "kind": "measured"} if r["record"] == "result" else r
             for r in map(json.loads, sim.read_text().splitlines())]
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in lines))
    rng = random.Random(3)  # times scattered over four decades whatever the size: nothing fits that
    shuffled = iter([10 ** rng.uniform(0, 4) for _ in lines])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({**r, "time_us": next(shuffled)} if r["record"] == "result" else r) + "\n"
                           for r in lines))
    return good, bad


def test_a_good_fit_is_written(sweeps, tmp_path, capsys):
    good, _ = sweeps
    assert cli.main(["fit", str(good), "-o", str(tmp_path / "hw.json")]) == 0
    assert "poor_fit" not in json.loads((tmp_path / "hw.json").read_text())["meta"]


def test_a_poor_fit_is_refused_and_nothing_is_written(sweeps, tmp_path, capsys):
    _, bad = sweeps
    assert cli.main(["fit", str(bad), "-o", str(tmp_path / "hw.json")]) == 2
    err = capsys.readouterr().err
    assert "does not describe its data" in err and err.count("\n") == 1
    assert not (tmp_path / "hw.json").exists()


def test_a_kept_poor_fit_is_marked_and_every_use_says_so(sweeps, tmp_path, capsys):
    _, bad = sweeps
    hw = tmp_path / "hw.json"
    assert cli.main(["fit", str(bad), "-o", str(hw), "--accept-poor-fit"]) == 0
    assert json.loads(hw.read_text())["meta"]["poor_fit"]
    capsys.readouterr()
    assert cli.main(["predict", "--hw", str(hw), "--topology", "1x4", "--sizes", "1K"]) == 0
    assert "is a poor fit" in capsys.readouterr().err


def test_points_read_many_times_cost_one_refit_each(sweeps, tmp_path, monkeypatch):
    """Issue 26: a fit of 2,000 duplicated points took 9.3 s, 20,000 more than a minute: the jackknife
    refitted once per point. Copies leave the same points behind, so one refit serves them all (and the
    figures and intervals are the same as from one copy of each)."""
    from commbench.analysis import fit as F

    good, _ = sweeps
    lines = good.read_text().splitlines()
    results = [line for line in lines if '"record": "result"' in line]
    copies = tmp_path / "copies.jsonl"
    copies.write_text("\n".join([lines[0], *results * 25]) + "\n")
    calls = []
    refit = F._refit
    monkeypatch.setattr(F, "_refit", lambda *args: calls.append(1) or refit(*args))
    assert cli.main(["fit", str(copies), "-o", str(tmp_path / "hw.json")]) == 0
    assert len(calls) == len(results)  # not 25 times as many
