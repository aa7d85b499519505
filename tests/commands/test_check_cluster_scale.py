"""Results files of a real cluster's size (issue 48, "A results file of a real cluster's size exhausts the
host"): `check`, `fit` and `report --hw` cost a record's point by what it needs (a full schedule up to
FULL_SCHEDULE_MAX_RANKS ranks, the closed form beyond), not by a structure per rank or per pair of ranks; what
cannot be made cheap (records per file, ranks a record declares, points of one fit) is bounded, one line and
exit 2 past the bound. Before: one record of 32,768 ranks ran `check` past 120 s at 8.4 GB (4,096: 49 s, 3.9 GB)."""
import json

import pytest
from conftest import commbench as run_commbench

from commbench import algorithms as A
from commbench import cli
from commbench.analysis import fit as F
from commbench.analysis import fit_points as P
from commbench.costmodel import FULL_SCHEDULE_MAX_RANKS, load_hardware, schedule_us
from commbench.results import reader
from commbench.schedule import Phases, Schedule
from commbench.topology import Topology


def _point(world: int, nbytes: int = 1024, nnodes: int = 1, collective: str = "allreduce", algorithm: str = "ring",
           time_us: float = 100.0) -> dict:
    return {"record": "result", "kind": "measured", "collective": collective, "backend": "shm", "library": "shm",
            "algorithm": algorithm, "dtype": "float32", "op": "sum", "root": None, "placement": "in-place",
            "world_size": world, "nnodes": nnodes, "count": nbytes // 4, "nbytes": nbytes, "time_us": time_us,
            "busbw_gbps": 0.1, "wrong": 0}


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_a_record_of_32768_ranks_checks_in_seconds(tmp_path):
    """The issue's own file (one 1 KiB allreduce point of a 2-rank sweep, its world_size edited to 32,768), and a
    4,096-GPU sweep on 512 nodes: each in a subprocess whose timeout is far beyond what it takes (about 1 s)."""
    path = _write(tmp_path / "a.jsonl", [_point(32768), _point(4096, 1 << 20, nnodes=512)])
    done = run_commbench("check", path, "--hw", "dgx-h100", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "32768 ranks" in done.stdout and "4096 ranks on 512 nodes" in done.stdout


def test_fit_and_report_of_a_cluster_sweep_finish(tmp_path):
    sizes = [1 << k for k in range(10, 24, 2)]
    path = _write(tmp_path / "s.jsonl", [_point(32768, n, nnodes=4096, time_us=50.0 + n / 1e3) for n in sizes])
    done = run_commbench("fit", path, "-o", str(tmp_path / "hw.json"), "--accept-poor-fit", timeout=120)
    assert done.returncode == 0, done.stderr
    done = run_commbench("report", path, "--hw", "dgx-h100", "-o", str(tmp_path / "rep"), timeout=120)
    assert done.returncode == 0, done.stderr


def test_up_to_the_full_schedule_bound_a_point_is_costed_as_it_ran_and_past_it_by_its_closed_form():
    """Small worlds keep the very rounds that ran (existing predictions unchanged, to the last bit); past the
    bound the closed form, which costs the same when the world divides the count."""
    topo, form = P.schedule_for(_point(FULL_SCHEDULE_MAX_RANKS, 1 << 20, nnodes=32))
    assert isinstance(form, Schedule) and topo == Topology(32, 8)
    hw = load_hardware("dgx-h100")
    topo, form = P.schedule_for(_point(512, 1 << 20, nnodes=64))
    assert isinstance(form, Phases)
    full = A.ring_allreduce(topo, (1 << 20) // 4)
    assert F.predict_records([_point(512, 1 << 20, nnodes=64)], hw)[0] == \
        pytest.approx(schedule_us(full, topo, hw, 4), rel=1e-12)
    assert P.features(form, topo, 4) == pytest.approx(P.features(full, topo, 4), rel=1e-12)


def test_closed_forms_do_not_grow_with_the_ranks_of_a_node():
    """A ring's round on one node of 32,768 ranks is four transfers; hier's rounds grow with a node's ranks, not
    with their square (each of its node rings' first step only)."""
    one_node = A.ring_allreduce_phases(Topology(1, 32768), 1 << 20)
    assert all(len(rnd) <= 4 for rnd, _ in one_node.rounds) and one_node.steps == 2 * 32767
    hier = A.hier_allreduce_phases(Topology(4, 4096), 1 << 22)
    assert all(len(rnd) <= 2 * 4096 for rnd, _ in hier.rounds)


def test_an_algorithm_without_a_closed_form_past_the_bound_is_a_note(tmp_path, capsys):
    """A 4,096-rank broadcast (the chain, no closed form) is left out with its reason; the allreduce beside it is
    checked."""
    path = _write(tmp_path / "b.jsonl", [_point(4096, 4096, nnodes=512, collective="broadcast", algorithm="chain"),
                                         _point(4096, 4096, nnodes=512)])
    assert cli.main(["check", path, "--hw", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "4096 ranks on 512 nodes" in out and "no closed form" in out


@pytest.mark.parametrize("field,value", [("world_size", 1_000_000 * 2), ("nnodes", 2**21)])
def test_a_declared_world_past_the_bound_is_one_line(tmp_path, capsys, field, value):
    record = {**_point(2), field: value}
    path = _write(tmp_path / "w.jsonl", [record])
    assert cli.main(["check", path, "--hw", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{field} {value}" in err and f"{reader.MAX_RANKS:,d}" in err


def test_records_past_the_bound_of_a_file_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(reader, "MAX_RECORDS_PER_FILE", 3)
    path = _write(tmp_path / "many.jsonl", [_point(2)] * 5)
    for argv in (["check", path, "--hw", "dgx-h100"], ["fit", path, "-o", str(tmp_path / "hw.json")]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{path}:4: more than 3 records" in err


def test_a_fit_past_its_points_bound_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(F, "MAX_FIT_POINTS", 4)
    path = _write(tmp_path / "p.jsonl", [_point(2, 1 << k) for k in range(10, 16)])
    assert cli.main(["fit", path, "-o", str(tmp_path / "hw.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "6 points to fit, more than 4" in err
    assert not (tmp_path / "hw.json").exists()
