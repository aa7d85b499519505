"""`commbench predict`: the time shown is the calibrated estimate, inside its 80% interval, the cost model's raw
time beside it labelled raw; with a fit, the fit's own time, inside its jackknife+ interval."""
from conftest import commbench, notes_joined

from commbench.results import read_records


def test_every_predicted_time_lies_inside_its_interval_with_the_raw_time_beside_it(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = commbench("predict", "--hw", "dgx-h100", "-T", "4x8", "--sizes", "4K-1G", "-c", "allreduce,allgather",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in read_records(str(out)) if r["record"] == "result"]
    assert len(rows) > 10
    for r in rows:
        low, high = r["interval_us"]
        assert low <= r["time_us"] <= high, (r["collective"], r["nbytes"])
        assert r["estimate"] == "calibrated" and r["raw_time_us"] > 0
        line = next(x for x in proc.stdout.splitlines() if x.split()[:1] == [str(r["nbytes"])] and
                    x.split()[1] == str(r["count"]))
        assert "] corpus  raw " in line
    assert "the time shown is the calibrated estimate" in "\n".join(notes_joined(proc.stdout))
