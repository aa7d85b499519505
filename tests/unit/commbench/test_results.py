"""The record types of commbench.results: one path (ResultSink) for every record, each with its schema;
raw per-iteration times kept beside the percentiles; older files still read; docs/results.md lists them all."""
import csv
import dataclasses
import json
import re

import numpy as np
import pytest
from conftest import REPO, commbench

from commbench import collectives as C
from commbench import results as R
from commbench.results import (
    RAW_TIMES_ENCODING,
    CompareRecord,
    ProxyResult,
    Result,
    ResultSink,
    ScalingRecord,
    StepRecord,
    SweepSummary,
    ValidateRecord,
    append_record,
    pack_times,
    point_result,
    raw_times,
    read_records,
)

ROOT = REPO
F32 = C.resolve_dtype("float32")
RECORD_TYPES = (Result, SweepSummary, StepRecord, ProxyResult, ValidateRecord, ScalingRecord, CompareRecord)


def _point(per_iteration_us, collective="allreduce", **extra):
    plan = C.plan(collective, 4096, F32, 4, 1 if C.COLLECTIVES[collective].rooted else -1)
    time_us = float(np.mean(per_iteration_us)) if len(per_iteration_us) else None
    return point_result(plan, dtype="float32", op="sum", placement="in-place", nnodes=1, backend="sim",
                        library="ring", device="cpu", time_us=time_us, per_iteration_us=per_iteration_us, warmup=2,
                        rank_agg="max", wrong=0, **extra)


def _validate():
    return ValidateRecord(model="resnet50", world_size=2, batch=16, proxy_step_us=1100.0, train_step_us=1000.0,
                          error=0.1, train_json="p.train.jsonl", run_id="abc")


# ---------------------------------------------------------------- raw times


def test_few_times_stay_an_exact_list():
    times = [10.5, 11.25, 9.0 + 1e-9]
    assert pack_times(times) == times
    assert raw_times({"iteration_times_us": pack_times(times)}).tolist() == times


def test_many_times_are_packed_small_and_decode_in_order():
    rng = np.random.default_rng(0)
    times = np.concatenate([rng.normal(100, 1, 600), rng.normal(300, 5, 400)])  # bimodal
    packed = pack_times(times)
    assert packed["encoding"] == RAW_TIMES_ENCODING and packed["count"] == 1000
    assert len(json.dumps(packed)) < 6000  # ~4 bytes a time, where a JSON list takes ~18
    decoded = raw_times({"iteration_times_us": packed})
    np.testing.assert_allclose(decoded, times, rtol=1e-6)
    assert (decoded > 200).sum() == 400  # the second mode is still there after the run


def test_non_finite_times_are_packed_not_written_as_nan():
    packed = pack_times([1.0, float("nan")])
    json.dumps(packed, allow_nan=False)  # the sink writes strict JSON
    assert np.isnan(raw_times({"iteration_times_us": packed})[1])


def test_records_without_times_give_an_empty_array():
    assert pack_times(None) is None and pack_times([]) is None
    assert raw_times({"record": "result", "time_us": 5.0}).size == 0  # a schema-1 file from before
    with pytest.raises(ValueError, match="unknown encoding"):
        raw_times({"iteration_times_us": {"encoding": "float16-lz4", "count": 1, "data": ""}})


def test_point_result_percentiles_come_from_the_raw_times():
    times = np.arange(1.0, 201.0)
    r = _point(times, algorithm="ring", steps=6, run_id="x")
    p50, p90, p99 = np.percentile(times, [50, 90, 99])
    assert (r.p50_us, r.p90_us, r.p99_us, r.min_us, r.max_us) == (p50, p90, p99, 1.0, 200.0)
    assert r.iters == 200 and r.warmup == 2 and r.root is None and r.algorithm == "ring" and r.steps == 6
    assert r.algbw_gbps == pytest.approx(4096 / (r.time_us * 1e-6) / 1e9)
    np.testing.assert_allclose(raw_times(r), times)
    assert np.percentile(raw_times(r.to_dict()), 75) == pytest.approx(np.percentile(times, 75), rel=1e-6)


def test_point_result_not_timed_and_rooted():
    r = _point([], collective="broadcast")
    assert r.time_us is r.p50_us is r.iteration_times_us is r.algbw_gbps is None
    assert r.iters == 0 and r.root == 1


# ---------------------------------------------------------------- one record path


def test_every_record_type_has_its_name_and_schema():
    for cls in RECORD_TYPES:
        names = [f.name for f in dataclasses.fields(cls)]
        assert "schema" in names and "RECORD" not in names, cls
    assert _validate().to_dict()["record"] == "validate" and _validate().to_dict()["schema"] == R.SCHEMA_VERSION


def test_sink_writes_every_record_and_the_csv_keeps_the_times(tmp_path):
    path, csv_path = tmp_path / "r.jsonl", tmp_path / "r.csv"
    times = np.linspace(5.0, 50.0, 100)
    with ResultSink(str(path), str(csv_path)) as sink:
        sink.header({"run_id": "abc"})
        sink.write(_point(times))
        sink.write(StepRecord("abc", 1, True, 1.0, 2.0, 0.5, 1.5, 10.0))
        sink.summary(SweepSummary("abc", "ok", None, 1, 0, 1.0))
    records = read_records(str(path))
    assert [r["record"] for r in records] == ["header", "result", "step", "summary"]
    assert all(r["schema"] == R.SCHEMA_VERSION for r in records)
    row = next(csv.DictReader(csv_path.open()))
    np.testing.assert_allclose(raw_times(row), times, rtol=1e-6)


def test_append_adds_a_record_after_the_others(tmp_path):
    path = tmp_path / "p.jsonl"
    with ResultSink(str(path)) as sink:
        sink.write(StepRecord("abc", 1, False, None, None, None, 1000.0, 16.0))
    append_record(str(path), _validate())
    records = read_records(str(path))
    assert [r["record"] for r in records] == ["step", "validate"]
    assert ValidateRecord.from_dict(records[1]) == _validate()


def _disk_full_after(monkeypatch, room: int):
    """The sink's writes from now on: `room` bytes more fit, then ENOSPC, part way through a line as a disk
    that fills does (a short write, then the error)."""
    import errno
    import os

    from commbench.results import sink as sink_module

    left = [room]

    def write_some(fd, data):
        if not left[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = os.write(fd, bytes(data[:left[0]]))
        left[0] -= written
        return written

    monkeypatch.setattr(sink_module, "_write_some", write_some)


@pytest.mark.parametrize("room", [0, 10, 700])
def test_a_full_disk_leaves_an_appended_file_as_it_was(tmp_path, monkeypatch, room):
    """--append onto the user's file, the disk full part way through the first line: the file is cut back
    to what it held (issue 48: a torn last line was left in it)."""
    path = tmp_path / "mine.jsonl"
    with ResultSink(str(path)) as sink:
        sink.header({"run_id": "old"})
        sink.write(_point([1.0, 2.0]))
    before = path.read_bytes()
    _disk_full_after(monkeypatch, room)
    sink = ResultSink(str(path), append=True)
    with pytest.raises(R.OutputError, match="No space left on device"):
        sink.header({"run_id": "new", "padding": "x" * 1000})
    sink.close()
    assert path.read_bytes() == before


def test_a_full_disk_keeps_every_whole_line_of_the_run_in_json_and_csv(tmp_path, monkeypatch):
    path, csv_path = tmp_path / "r.jsonl", tmp_path / "r.csv"
    sink = ResultSink(str(path), str(csv_path))
    sink.header({"run_id": "abc"})
    sink.write(_point([1.0, 2.0]))
    kept_json, kept_csv = path.read_bytes(), csv_path.read_bytes()
    _disk_full_after(monkeypatch, 100)  # the next JSON line (over 1 KB) fits in part only
    with pytest.raises(R.OutputError):
        sink.write(_point([3.0, 4.0]))
    assert path.read_bytes() == kept_json and path.read_bytes().endswith(b"\n")
    _disk_full_after(monkeypatch, 0)
    with pytest.raises(R.OutputError):
        sink.summary(SweepSummary("abc", "failed", "disk", 1, 0, 1.0))
    sink.close()
    assert [r["record"] for r in read_records(str(path))] == ["header", "result"]
    assert csv_path.read_bytes() == kept_csv


def test_a_failed_fsync_cuts_what_it_did_not_make_durable(tmp_path, monkeypatch):
    import errno

    from commbench.results import sink as sink_module

    path = tmp_path / "r.jsonl"
    sink = ResultSink(str(path))
    sink.header({"run_id": "abc"})
    kept = path.read_bytes()

    def full(_handle):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sink_module, "_fsync", full)
    with pytest.raises(R.OutputError):
        sink.write(_point([1.0]))
    sink.close()
    assert path.read_bytes() == kept


def test_a_lone_surrogate_in_a_csv_cell_is_written_escaped(tmp_path):
    csv_path = tmp_path / "r.csv"
    with ResultSink(None, str(csv_path)) as sink:
        sink.write(dataclasses.replace(_point([1.0]), backend="sh\ud800m"))
    assert "sh\\ud800m" in csv_path.read_text(encoding="utf-8")


def test_older_records_read_with_defaults_and_newer_fields_are_ignored():
    old = _point([1.0, 2.0]).to_dict()
    del old["iteration_times_us"], old["record"]
    old["a_field_from_the_future"] = 1
    r = Result.from_dict(old)
    assert r.iteration_times_us is None and raw_times(r).size == 0 and r.p50_us == 1.5


def test_proxy_result_is_the_same_class_from_steps():
    from commbench.proxies import steps

    assert steps.ProxyResult is ProxyResult and callable(steps.summarize) and steps.StepLog


def test_step_log_writes_step_records(tmp_path, capsys):
    from commbench.proxies.steps import StepLog

    path = tmp_path / "p.jsonl"
    log = StepLog(str(path), True, 32)
    log.header({"kind": "proxy"}, ["proxy x"])
    log.step(1, True, {"compute_us": 10.0, "comm_us": 5.0, "exposed_comm_us": 1.0, "step_us": 11.0})
    log.step(2, False, {"compute_us": None, "comm_us": None, "exposed_comm_us": None, "step_us": 0.0})
    steps = [r for r in read_records(str(path)) if r["record"] == "step"]
    assert [s["run_id"] for s in steps] == [log.run_id] * 2 and steps[0]["telemetry"] is None
    assert steps[0]["samples_per_s"] == pytest.approx(32 / 11e-6)
    assert steps[1]["samples_per_s"] is None  # no step time: null, never a NaN the JSON cannot hold


# ---------------------------------------------------------------- the commands' records


def test_predict_scaling_records_are_versioned_and_read_back(tmp_path):
    out = tmp_path / "s.jsonl"
    proc = commbench("predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8,16", "--tflops", "100",
                     "--baseline", "nccl", "--candidate", "hier", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    records = read_records(str(out))
    assert {r["record"] for r in records} == {"scaling"} and len(records) == 4
    assert {r["schema"] for r in records} == {R.SCHEMA_VERSION} and len({r["run_id"] for r in records}) == 1
    rows = [ScalingRecord.from_dict(r) for r in records]
    table = [line.split() for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert [(row[0], int(row[1])) for row in table] == [(r.algorithm, r.gpus) for r in rows]
    assert [row[-1] for row in table if row[0] == "hier"] == [f"{r.acc_ratio:.3f}" for r in rows if r.acc_ratio]


def test_compare_records_are_versioned(tmp_path):
    from commbench.analysis import compare as K

    base = [_point([10.0, 12.0]).to_dict()]
    new = [_point([20.0, 24.0]).to_dict()]
    out = tmp_path / "c.jsonl"
    K.write_jsonl(K.compare(base, new, "time"), str(out))
    [record] = read_records(str(out))
    assert record["record"] == "compare" and record["schema"] == R.SCHEMA_VERSION
    assert CompareRecord.from_dict(record).verdict == "regression" and record["ratio"] == pytest.approx(2.0)


def test_results_md_lists_every_record_type_and_field():
    doc = (ROOT / "docs" / "results.md").read_text()
    for cls in RECORD_TYPES:
        assert f"`{cls.RECORD}`" in doc, cls.RECORD
        missing = [f.name for f in dataclasses.fields(cls) if not re.search(rf"\b{f.name}\b", doc)]
        assert not missing, (cls.RECORD, missing)


def test_records_carry_their_backends_capabilities(tmp_path):
    """A sweep's and a prediction's results say whether commbench's schedule ran and how they were timed
    (schedule, timing), written from the backend class; a file from before says nothing, and readers look
    its backend up by name (registry.record_capabilities) to the same answer."""
    from commbench.analysis.predict import predict
    from commbench.backends.registry import (
        BACKENDS,
        MODEL,
        PREDICTED,
        RecordCapabilities,
        backend_class,
        capabilities_of,
        record_capabilities,
    )
    from commbench.costmodel import load_hardware
    from commbench.topology import Topology

    out = tmp_path / "sim.jsonl"
    proc = commbench("sweep", "--backend", "sim", "-N", "4", "--sizes", "1K", "-c", "allreduce", "--hw", "dgx-a100",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    swept = [r for r in read_records(str(out)) if r["record"] == "result"]
    assert swept and all((r["schedule"], r["timing"]) == (True, "simulated") for r in swept)
    sim = swept[0]
    hw = load_hardware("dgx-a100")
    (model,) = predict(hw, ["allreduce"], [1 << 20], C.resolve_dtype("float32"), Topology(1, 4))
    assert (model.schedule, model.timing) == (True, "modelled") and not record_capabilities(model.to_dict()).ran
    for name in BACKENDS:  # an older record: its backend's class says, as the backend writes it today
        assert record_capabilities({"backend": name}) == capabilities_of(backend_class(name))
    assert record_capabilities({"backend": "torch"}) == RecordCapabilities(schedule=False, timing="measured")
    assert record_capabilities({"backend": "sim"}) == RecordCapabilities(schedule=True, timing="simulated")
    assert record_capabilities({"backend": MODEL}) == PREDICTED
    assert record_capabilities({"backend": "torch", "schedule": True, "timing": "modelled"}) == PREDICTED
    old = {k: v for k, v in sim.items() if k not in ("schedule", "timing")}
    assert record_capabilities(old) == record_capabilities(sim) and Result.from_dict(old).timing is None
