"""Reading packed per-iteration times (commbench/results/times.py) costs what a file may declare, not more
(issue 32): one file is read with one budget of values, each packed record is unpacked once, and a file that
declares more than the budget is one RecordError at the record past it, before that record is inflated."""
import base64
import json
import zlib

import numpy as np
import pytest

from commbench.results import (
    MAX_RAW_TIMES,
    MAX_RAW_TIMES_PER_FILE,
    RecordError,
    pack_times,
    raw_times,
    read_records,
)
from commbench.results import times as T

RESULT = {"record": "result", "kind": "measured", "collective": "allreduce", "backend": "shm", "library": "shm",
          "dtype": "float32", "op": "sum", "placement": "out-of-place", "world_size": 2, "nbytes": 1024,
          "time_us": 10.0}


def zeros(count):
    """What a hostile file declares: `count` float32 zeros, a few kilobytes once compressed."""
    data = base64.b64encode(zlib.compress(np.zeros(count, "<f4").tobytes(), 9)).decode()
    return {"encoding": T.RAW_TIMES_ENCODING, "count": count, "data": data}


@pytest.fixture
def inflations(monkeypatch):
    """How many packed records were inflated."""
    calls = []
    real = T.zlib.decompressobj

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(T.zlib, "decompressobj", counting)
    return calls


def test_a_file_declaring_more_than_its_budget_stops_before_inflating_it(tmp_path, inflations):
    """100 records of 10,000,000 compressed zeros (5 MB) made check spend 141 s and report 188 s; now the
    record that passes the file's budget is refused, uninflated, naming its line."""
    path = tmp_path / "zeros.jsonl"
    within = MAX_RAW_TIMES_PER_FILE // MAX_RAW_TIMES
    path.write_text("".join(json.dumps({**RESULT, "iteration_times_us": zeros(MAX_RAW_TIMES)}) + "\n"
                            for _ in range(within + 2)))
    with pytest.raises(RecordError) as error:
        read_records(str(path))
    assert str(error.value) == (
        f"{path}:{within + 1}: result record: iteration_times_us: the file's records declare more than "
        f"{MAX_RAW_TIMES_PER_FILE:,d} per-iteration times in all, more than commbench reads from one file (a sweep "
        f"keeps at most {MAX_RAW_TIMES:,d} a point): split the file, or keep fewer iterations")
    assert len(inflations) == within


def test_the_budget_is_per_file_read(tmp_path):
    """Each read starts afresh: a file holding more than half the budget is read twice."""
    path = tmp_path / "ok.jsonl"
    within = MAX_RAW_TIMES_PER_FILE // MAX_RAW_TIMES
    path.write_text("".join(
        json.dumps({**RESULT, "iteration_times_us": zeros(MAX_RAW_TIMES)}) + "\n" for _ in range(within)))
    for _ in range(2):
        assert len(read_records(str(path))) == within


def test_each_packed_record_is_inflated_once(tmp_path, inflations):
    """The check of a file unpacked every record, and a reader (report) unpacked it again."""
    times = np.linspace(1.0, 2.0, 1000)
    path = tmp_path / "r.jsonl"
    lines = [{**RESULT, "nbytes": 1024 << k, "iteration_times_us": pack_times(times)} for k in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    records = read_records(str(path))
    for record in records:
        np.testing.assert_allclose(raw_times(record), times, rtol=1e-6)
        np.testing.assert_allclose(raw_times({**record, "_file": "r"}), times, rtol=1e-6)  # a reader's copy
    assert len(inflations) == 3
    assert [json.loads(json.dumps(r)) for r in records] == lines  # written back as read


def test_a_damaged_record_is_still_refused_by_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    packed = {**zeros(10), "count": 11}
    path.write_text(json.dumps(RESULT) + "\n" + json.dumps({**RESULT, "iteration_times_us": packed}) + "\n")
    with pytest.raises(RecordError, match=r":2: result record: iteration_times_us: 10 values, the record says 11$"):
        read_records(str(path))


def test_every_packed_field_is_charged_to_the_files_budget(tmp_path, inflations):
    """A straggler report's per-rank times and the skipped leading iterations count against the same budget as
    iteration_times_us (20 records of 10,000,000 packed per-rank times took 8.6 s and 357 MB to report)."""
    path = tmp_path / "ranks.jsonl"
    within = MAX_RAW_TIMES_PER_FILE // MAX_RAW_TIMES
    path.write_text("".join(json.dumps({**RESULT, "rank_times_us": {"ranks": 2, "times_us": zeros(MAX_RAW_TIMES)}})
                            + "\n" for _ in range(within + 2)))
    with pytest.raises(RecordError, match=f"{path}:{within + 1}: result record: .*per-iteration times in all"):
        read_records(str(path))
    assert len(inflations) == within
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**RESULT, "skipped_times_us": {"encoding": "zzz", "count": 2, "data": ""}}) + "\n"
                   + json.dumps({**RESULT, "rank_times_us": {"ranks": 2, "times_us": ["a", "b"]}}) + "\n")
    with pytest.raises(RecordError, match="bad.jsonl:1: result record: "):
        read_records(str(bad))
    bad.write_text(json.dumps({**RESULT, "rank_times_us": {"ranks": 2, "times_us": ["a", "b"]}}) + "\n")
    with pytest.raises(RecordError, match="bad.jsonl:1: result record: times_us holds something other"):
        read_records(str(bad))
    bad.write_text(json.dumps({**RESULT, "timed_start": 1e20}) + "\n")
    with pytest.raises(RecordError, match="timed_start 1e.20 is not a time"):
        read_records(str(bad))


def test_packed_times_are_within_float32_rounding_and_docs_metrics_says_so_not_exact():
    """docs/metrics.md said the raw times recompute any figure exactly: past 64 iterations they are float32
    (issue 48, item 14). Up to 64 they are the float64 values; past, each within 2^-24 relative, not exact."""
    from pathlib import Path

    values = np.random.default_rng(7).uniform(1.0, 5000.0, 1000)
    assert list(pack_times(values[:64])) == list(values[:64])  # a plain list: exact
    record = {"iteration_times_us": pack_times(values)}
    relative = np.abs(np.asarray(raw_times(record), dtype=np.float64) / values - 1)
    assert 0 < relative.max() <= 2.0**-24
    assert abs(np.asarray(raw_times(record), dtype=np.float64).mean() / values.mean() - 1) < 2.0**-24
    metrics = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert "recomputed from them exactly:" not in metrics
    assert "exactly up to 64 iterations" in metrics and "within 2^-24" in metrics
