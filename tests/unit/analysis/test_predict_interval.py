"""`commbench predict` without a fit: the 80% interval from the published collectives corpus
(analysis/corpus/collectives.py), printed beside the time with its provenance and written in the JSON; a
fitted file keeps its jackknife+ interval, said as `fit`."""
import json
import math
from dataclasses import replace

import pytest
from conftest import commbench, notes_joined

from commbench import results as R
from commbench.analysis import calibration as Cal
from commbench.analysis import fit as F
from commbench.analysis.corpus import collectives as K
from commbench.analysis.predict import predict, row_us
from commbench.collectives import resolve_dtype
from commbench.costmodel import Hardware
from commbench.results import read_records
from commbench.topology import Link, Topology


def _rows(path) -> list[dict]:
    return [r for r in read_records(str(path)) if r["record"] == "result"]


def test_predict_with_a_preset_prints_and_writes_the_corpus_interval(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = commbench("predict", "--hw", "dgx-a100", "-T", "2x8", "--sizes", "1M,1G", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    offsets = K.shipped_bounds(row_us)
    results = _rows(out)
    assert len(results) == 2
    for r in results:
        assert r["interval_source"] == R.CORPUS_PROVENANCE
        # the interval is around the raw time; the time shown is the calibrated one, inside it, the raw beside it
        assert r["interval_us"] == pytest.approx(list(K.time_interval_us(r["raw_time_us"], offsets)), rel=1e-12)
        assert r["estimate"] == "calibrated"
        assert r["time_us"] == pytest.approx(r["raw_time_us"] * math.exp(K.shipped_centre(row_us)), rel=1e-12)
        assert r["interval_us"][0] <= r["time_us"] <= r["interval_us"][1]
        line = next(x for x in proc.stdout.splitlines() if x.split()[:1] == [str(r["nbytes"])])
        assert "] corpus  raw " in line  # the model's own time after the interval, labelled raw
    corpus = K.load_collectives()
    rows = corpus.calibrated_rows
    assert f"split-conformal on {len(rows)} published nccl-tests figures ({len({r.source for r in rows})} sources)" \
        in "\n".join(notes_joined(proc.stdout))
    assert len(rows) < len(corpus.rows)  # the beyond_nic rows calibrate nothing


def test_a_fitted_file_keeps_its_jackknife_interval_and_says_fit(tmp_path):
    hw = Hardware("fitted", 2, Link("intra", 20.0, 2.0), Link("inter", 5.0, 10.0), None, 5.0)
    fit = [hw.per_call_overhead_us, hw.intra.latency_us, hw.inter.latency_us, 1 / (hw.intra.bw_gbps * 1e3),
           1 / (hw.inter.bw_gbps * 1e3)]
    block = {"method": "test", "columns": list(F.COLUMNS[:5]), "fit": fit, "resamples": [fit] * 9,
             "relative_residuals": [0.0] * 9}
    exact = replace(hw, meta={"levels_fitted": {"intra": True, "inter": True}, "uncertainty": block})
    [point] = predict(exact, ["allreduce"], [1 << 20], resolve_dtype("float32"), Topology(2, 2), "ring")
    assert point.interval_source == R.FIT_PROVENANCE  # every resample the fit, no residual: the prediction
    assert point.interval_us == pytest.approx([point.time_us, point.time_us], rel=1e-12)
    path = tmp_path / "hw.json"
    exact.save(str(path))
    out = tmp_path / "p.jsonl"
    proc = commbench("predict", "--hw", str(path), "-T", "2x2", "--sizes", "1M", "-A", "ring", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    [record] = _rows(out)
    assert record["interval_source"] == "fit resamples"
    assert any(x.split()[:1] == [str(1 << 20)] and x.endswith("] fit") for x in proc.stdout.splitlines())
    assert "corpus after a row" not in proc.stdout


def test_a_level_the_fit_did_not_measure_gets_the_corpus_interval():
    hw = Hardware("one-node", 2, Link("intra", 20.0, 2.0), Link("inter", 5.0, 10.0), None, 5.0)
    fit = [5.0, 2.0, 10.0, 1 / 20e3, 1 / 5e3]
    block = {"method": "test", "columns": list(F.COLUMNS[:5]), "fit": fit, "resamples": [fit] * 9,
             "relative_residuals": [0.01] * 9}
    one_level = replace(hw, meta={"levels_fitted": {"intra": True, "inter": False}, "uncertainty": block})
    dtype = resolve_dtype("float32")
    [inside] = predict(one_level, ["allreduce"], [1 << 20], dtype, Topology(1, 2), "ring")
    [across] = predict(one_level, ["allreduce"], [1 << 20], dtype, Topology(2, 2), "ring")
    assert inside.interval_source == R.FIT_PROVENANCE and across.interval_source == R.CORPUS_PROVENANCE


def test_the_order_statistics_are_calibrations_rule_for_the_corpus_size():
    corpus = K.load_collectives()
    residuals = sorted(r for values in K.residuals(corpus, row_us).values() for r in values)
    assert len(residuals) == len(corpus.calibrated_rows) == 24
    # k_lo = floor(25 x 0.1) = 2, k_hi = ceil(25 x 0.9) = ceil(22.5) = 23 (analysis/calibration.py, exact fractions)
    assert Cal.order_indices(24) == (2, 23)
    assert K.shipped_bounds(row_us) == (residuals[1], residuals[22])
    low, high = K.time_interval_us(1000.0, (residuals[1], residuals[22]))
    assert (low, high) == (1000.0 * math.exp(residuals[1]), 1000.0 * math.exp(residuals[22]))


def test_the_corpus_loads_with_a_source_per_row():
    corpus = K.load_collectives()
    assert len(corpus.sources) >= 4 and len(corpus.rows) >= 20
    for row in corpus.rows:
        source = corpus.sources[row.source]
        assert source["address"] and source["who"] and "date" in source
        assert row.size_said and row.busbw_gbps > 0 and row.system in corpus.systems
    assert {row.nodes > 1 for row in corpus.rows} == {True, False}  # inside a node and across nodes
    assert {row.collective for row in corpus.rows} == {"allreduce", "allgather", "reduce_scatter"}
    # a row whose time is printed: its busbw is the one nccl-tests computes from it (collectives.py)
    timed = next(r for r in corpus.rows if r.time_us is not None)
    assert replace(timed, time_us=None).measured_us == pytest.approx(timed.time_us, rel=2e-3)


@pytest.mark.parametrize("damage, says", [
    (lambda d: d["rows"][0].pop("size_said"), "size_said"),
    (lambda d: d["rows"][0].update(source="nowhere"), "source"),
    (lambda d: d["systems"]["a3-mega"]["hardware"]["levels"]["inter"].update(bw_gbps=-1), "inter"),
    (lambda d: d.update(schema=1), "schema"),
])
def test_a_damaged_corpus_is_one_line(tmp_path, damage, says):
    with open(K.COLLECTIVES_PATH, encoding="utf-8") as handle:
        data = json.load(handle)
    damage(data)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(K.CollectiveCorpusError, match=says) as caught:
        K.load_collectives(str(path))
    assert "\n" not in str(caught.value)
