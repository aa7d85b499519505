"""Tuning tables: what `auto` follows, and what a record says chose it (issue 36)."""
import json

import pytest

from commbench import algorithms, tuning
from commbench.topology import Topology

ROWS = [{"collective": "allreduce", "world": 8, "nodes": 1, "up_to_nbytes": 131071, "algorithm": "oneshot"},
        {"collective": "allreduce", "world": 8, "nodes": 1, "up_to_nbytes": None, "algorithm": "twoshot"},
        {"collective": "allreduce", "world": None, "nodes": None, "up_to_nbytes": 4096, "algorithm": "tree"},
        {"collective": "allreduce", "world": None, "nodes": None, "up_to_nbytes": 65536, "algorithm": "rhd"}]


def _table(rows=ROWS, **fields):
    data = {"format": tuning.FORMAT, "name": "t", "backend": "cuda", "library": "cuda-virtual", "rows": rows, **fields}
    return tuning.parse(json.dumps(data), "t.json")


def test_a_row_for_the_world_size_beats_a_wildcard_and_sizes_go_by_bound():
    table = _table()
    assert table.lookup("allreduce", 8, 1, 1024) == "oneshot"
    assert table.lookup("allreduce", 8, 1, 131071) == "oneshot" and table.lookup("allreduce", 8, 1, 131072) == "twoshot"
    assert table.lookup("allreduce", 4, 1, 4096) == "tree" and table.lookup("allreduce", 4, 1, 5000) == "rhd"
    assert table.lookup("allreduce", 4, 1, 1 << 30) == "rhd"  # above every bound: the last row
    assert table.lookup("allgather", 8, 1, 1024) is None


def test_auto_follows_the_table_and_says_so_else_the_rule():
    topo = Topology(1, 8)
    assert algorithms.chosen_by("allreduce", topo, 1 << 20, tuning=_table()) == ("twoshot", "t")
    assert algorithms.chosen_by("allreduce", topo, 1 << 20) == (algorithms.choose("allreduce", topo, 1 << 20), "rule")
    assert algorithms.chosen_by("allgather", topo, 1 << 20, tuning=_table())[1] == "rule"  # no row: the rule
    with pytest.raises(algorithms.AlgorithmError, match="no algorithm 'nonesuch'"):
        algorithms.chosen_by("allreduce", topo, 1, tuning=_table([{**ROWS[0], "algorithm": "nonesuch"}]))


@pytest.mark.parametrize("text,message", [
    ("{", "not JSON"), ('{"format": "x"}', "not a tuning file"),
    (json.dumps({"format": tuning.FORMAT, "backend": "shm"}), "needs backend, library and rows"),
    (json.dumps({"format": tuning.FORMAT, "backend": "shm", "library": "shm",
                 "rows": [{**ROWS[0], "world": -1}]}), "world must be a non-negative integer"),
])
def test_a_bad_file_is_one_line_naming_it(text, message):
    with pytest.raises(tuning.TuningError, match=message) as caught:
        tuning.parse(text, "bad.json")
    assert str(caught.value).startswith("bad.json: ") and "\n" not in str(caught.value)


def test_a_file_for_another_backend_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(_table().to_json())
    assert tuning.for_backend(str(path), "cuda", "cuda-virtual").rows == _table().rows  # the JSON round trip
    with pytest.raises(tuning.TuningError, match="measured on --backend cuda .* not --backend shm"):
        tuning.for_backend(str(path), "shm", "shm")


def test_the_shipped_tables_load_and_name_algorithms_there_are():
    cuda, shm = tuning.shipped("cuda", "cuda-virtual"), tuning.shipped("shm", "shm")
    assert cuda.lookup("allreduce", 8, 1, 1024) == "oneshot" and cuda.lookup("allreduce", 8, 1, 256 << 10) == "twoshot"
    assert shm.lookup("allreduce", 2, 1, 1024) == "ring" and shm.lookup("allreduce", 3, 1, 1024) is None
    for table in (cuda, shm):
        assert "issue 36" in table.source or "docs/algorithms.md" in table.source
        for row in table.rows:
            algorithms.entry(row.collective, row.algorithm)
    assert tuning.shipped("p2p", "gloo") is None


def test_rows_from_winners_merge_runs_of_one_winner():
    rows = tuning.rows_from_winners("allreduce", 4, 1, [(65536, "ring"), (1024, "oneshot"), (4096, "oneshot")])
    assert [(r.up_to_nbytes, r.algorithm) for r in rows] == [(4096, "oneshot"), (None, "ring")]


def test_winners_compare_within_each_round():
    """Round 2 ran on a machine twice as slow: per-round ratios still pick the same winner."""
    from commbench.commands.tune import winners

    rounds = [{"a": {1024: 10.0, 4096: 30.0}, "b": {1024: 12.0, 4096: 20.0}},
              {"a": {1024: 20.0, 4096: 60.0}, "b": {1024: 24.0, 4096: 40.0}}]
    won = winners(rounds)
    assert won[1024][0] == "a" and won[4096][0] == "b" and won[4096][1]["a"] == pytest.approx(1.5)


def test_a_tuning_file_nested_too_deep_is_one_line(tmp_path):
    """A hostile file (deeper than the JSON reader follows) is a TuningError, not a RecursionError."""
    from commbench import tuning

    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(tuning.TuningError, match="nested deeper"):
        tuning.load(str(path))
