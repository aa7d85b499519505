"""commbench compare: matching two sweeps, ratios and verdicts, medians of repeats, exit codes."""
import json

import pytest

from commbench.analysis import compare as K
from commbench.cli import main
from commbench.results import Result, ResultSink, read_records


def result(nbytes=1 << 20, busbw=10.0, time_us=None, **fields):
    """A measured allreduce point; time follows from busbw unless given (None: not timed)."""
    if time_us is None and busbw is not None:
        time_us = nbytes / (busbw * 1e3)
    base = dict(collective="allreduce", backend="torch", library="gloo", device="cpu", dtype="float32", op="sum",
                root=None, placement="out-of-place", world_size=2, nnodes=1, requested_nbytes=nbytes, nbytes=nbytes,
                count=nbytes // 4, warmup=1, iters=5, time_us=time_us, algbw_gbps=busbw, busbw_gbps=busbw,
                p50_us=None, p90_us=None, p99_us=None, min_us=None, max_us=None, rank_agg="max", wrong=0)
    base.update(fields)
    return Result(**base)


def write(path, results, header=True):
    sink = ResultSink(str(path))
    if header:
        sink.header({"run_id": "abc", "command": "test"})
    for r in results:
        sink.result(r)
    sink.summary({"status": "ok", "points": len(results)})
    sink.close()
    return str(path)


def run(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def by_size(comparison):
    return {p.get("nbytes"): p for p in comparison.points}


def test_matches_points_by_key_and_computes_ratio(tmp_path):
    in_place = result(1024, 10.0, placement="in-place")
    base = write(tmp_path / "b.jsonl", [result(1024, 10.0), result(2048, 20.0), in_place])
    new = write(tmp_path / "n.jsonl", [result(2048, 25.0), result(1024, 9.0), in_place])
    c = K.compare(K.load(base), K.load(new), names=(base, new))
    assert len(c.points) == 3 and not c.only_base and not c.only_new
    out_of_place = {p.get("nbytes"): p for p in c.points if p.get("placement") == "out-of-place"}
    assert out_of_place[1024].ratio == pytest.approx(0.9)
    assert out_of_place[1024].change_pct == pytest.approx(-10.0)
    assert out_of_place[1024].verdict == "regression"
    assert out_of_place[2048].ratio == pytest.approx(1.25) and out_of_place[2048].verdict == "improvement"
    in_place = [p for p in c.points if p.get("placement") == "in-place"]
    assert in_place[0].verdict == "same" and in_place[0].change_pct == 0
    assert [p.verdict for p in c.regressions] == ["regression"] and len(c.improvements) == 1
    assert c.worst.get("nbytes") == 1024 and c.worst.get("placement") == "out-of-place"


@pytest.mark.parametrize("field,other", [("algorithm", "ring"), ("world_size", 4), ("dtype", "float16"),
                                         ("library", "nccl"), ("op", "max"), ("backend", "shm")])
def test_points_of_another_setup_do_not_match(field, other):
    base = [result(1024, 10.0).to_dict()]
    new = [result(1024, 10.0).to_dict(), {**result(1024, 1.0).to_dict(), field: other}]
    c = K.compare(base, new)
    assert len(c.points) == 1 and c.points[0].verdict == "same"
    assert len(c.only_new) == 1 and c.only_new[0].get(field) == other


@pytest.mark.parametrize("new_busbw,threshold,expected", [
    (9.6, 5, "same"), (9.4, 5, "regression"), (10.4, 5, "same"), (10.6, 5, "improvement"),
    (9.5, 5, "same"), (10.5, 5, "same"),  # exactly at the threshold: not beyond it
    (9.4, 10, "same"), (8.9, 10, "regression"), (11.1, 10, "improvement"), (9.99, 0.05, "regression"),
])
def test_threshold_both_ways(new_busbw, threshold, expected):
    c = K.compare([result(busbw=10.0).to_dict()], [result(busbw=new_busbw).to_dict()], "busbw", threshold)
    assert c.points[0].verdict == expected


def test_time_metric_lower_is_better():
    base = [result(1024, busbw=10.0, time_us=100.0).to_dict(), result(2048, busbw=10.0, time_us=100.0).to_dict()]
    new = [result(1024, busbw=10.0, time_us=120.0).to_dict(), result(2048, busbw=10.0, time_us=80.0).to_dict()]
    c = K.compare(base, new, "time", 5)
    points = by_size(c)
    assert points[1024].change_pct == pytest.approx(20.0) and points[1024].verdict == "regression"
    assert points[2048].change_pct == pytest.approx(-20.0) and points[2048].verdict == "improvement"
    assert c.worst.get("nbytes") == 1024
    # the same change in busbw is the other way round
    c = K.compare([result(busbw=100.0).to_dict()], [result(busbw=120.0).to_dict()], "busbw", 5)
    assert c.points[0].verdict == "improvement"


def test_repeated_runs_count_with_their_median():
    base = [result(busbw=v).to_dict() for v in (10.0, 1.0, 10.2)]  # one outlier run: median 10
    new = [result(busbw=v).to_dict() for v in (9.0, 9.2, 30.0, 9.1)]  # even count: the lower middle, 9.1
    c = K.compare(base, new)
    point = c.points[0]
    assert (point.base, point.new) == (10.0, 9.1)
    assert (point.base_runs, point.new_runs) == (3, 4)
    assert point.verdict == "regression"


def test_median_of_an_even_count_is_the_same_run_for_time_and_busbw():
    """Of two middle runs, the slower one: its busbw is the median busbw (as `commbench report` has it)."""
    runs = [result(busbw=b, time_us=t).to_dict() for b, t in ((10.0, 100.0), (8.0, 125.0), (5.0, 200.0),
                                                               (20.0, 50.0))]
    time_point = K.compare(runs, runs, "time").points[0]
    busbw_point = K.compare(runs, runs, "busbw").points[0]
    assert (time_point.base, busbw_point.base) == (125.0, 8.0)


def test_points_in_one_file_only_are_listed():
    base = [result(1024).to_dict(), result(4096).to_dict()]
    new = [result(1024).to_dict(), result(8192).to_dict()]
    c = K.compare(base, new)
    assert [p.get("nbytes") for p in c.only_base] == [4096] and c.only_base[0].verdict == "only in base"
    assert [p.get("nbytes") for p in c.only_new] == [8192] and c.only_new[0].verdict == "only in new"
    assert [p.verdict for p in c.rows()] == ["same", "only in base", "only in new"]


def test_records_without_the_metric_are_skipped_and_counted():
    untimed = result(2048, busbw=None, time_us=None).to_dict()  # sim without --hw
    c = K.compare([result(1024).to_dict(), untimed], [result(1024).to_dict(), untimed, untimed])
    assert len(c.points) == 1
    assert (c.skipped_base, c.skipped_new, c.unvalued) == (1, 2, 1)
    assert "skipped 1 base and 2 new records" in K.summary_line(c)


def test_only_result_records_count():
    header = {"record": "header", "busbw_gbps": 1.0}
    summary = {"record": "summary", "avg_busbw_gbps": 3.0}
    c = K.compare([header, result().to_dict(), summary], [result(busbw=12.0).to_dict(), "junk", 7])
    assert len(c.points) == 1 and c.points[0].verdict == "improvement"


# ---------------------------------------------------------------- the command


def test_cli_no_regression_exits_0_and_prints_a_table(tmp_path, capsys):
    base = write(tmp_path / "b.jsonl", [result(1024, 10.0), result(2048, 20.0)])
    new = write(tmp_path / "n.jsonl", [result(1024, 10.2), result(2048, 25.0), result(4096, 30.0)])
    code, out, err = run(capsys, "compare", base, new)
    assert code == 0, err
    assert err == ""
    assert "(GB/s)" in out and "(%)" in out and "(B)" in out and "torch/gloo, float32 sum, 2 ranks" in out
    lines = out.splitlines()
    row = next(line for line in lines if line.split()[0] == "2048")
    assert row.split()[1:] == ["allreduce", "out-of-place", "20.00", "25.00", "+25.0", "0.0", "improvement"]
    assert any("only in new" in line and line.split()[0] == "4096" for line in lines)
    assert lines[-1].startswith("# compared 2 points (busbw_gbps, threshold 5%): 0 regressions, 1 improvements, "
                                "0 within noise, worst +2.0% (allreduce 1024 B out-of-place)")


def test_cli_regression_exits_1_and_writes_json(tmp_path, capsys):
    base = write(tmp_path / "b.jsonl", [result(1024, 10.0), result(2048, 10.0)])
    new = write(tmp_path / "n.jsonl", [result(1024, 8.0), result(2048, 10.0)])
    out_path = tmp_path / "sub" / "cmp.jsonl"
    code, out, _ = run(capsys, "compare", base, new, "--json", out_path)
    assert code == 1
    assert "1 regressions" in out and "worst -20.0%" in out
    records = read_records(str(out_path))
    assert [r["record"] for r in records] == ["compare", "compare"]
    first = records[0]
    assert first["nbytes"] == 1024 and first["verdict"] == "regression" and first["metric"] == "busbw_gbps"
    assert first["ratio"] == pytest.approx(0.8) and first["change_pct"] == pytest.approx(-20.0)
    assert (first["base"], first["new"], first["base_runs"], first["threshold_pct"]) == (10.0, 8.0, 1, 5.0)
    assert all(json.loads(line) for line in out_path.read_text().splitlines())



def test_append_adds_to_the_records_while_force_redraws_the_plot(tmp_path, capsys):
    """A second comparison into the same files: --append adds its records, and the plot, which cannot be
    appended to, is refused unless --force redraws it; --force with --append is refused where there is
    nothing whole to overwrite."""
    pytest.importorskip("matplotlib")
    base = write(tmp_path / "b.jsonl", [result(1024, 10.0)])
    new = write(tmp_path / "n.jsonl", [result(1024, 10.1)])
    out, plot = tmp_path / "c.jsonl", tmp_path / "c.png"
    assert run(capsys, "compare", base, new, "--json", out, "--plot", plot)[0] == 0
    code, _, err = run(capsys, "compare", base, new, "--json", out, "--append", "--plot", plot)
    assert code == 2 and "--plot" in err and "--force" in err
    first = plot.stat().st_mtime_ns
    assert run(capsys, "compare", base, new, "--json", out, "--append", "--plot", plot, "--force")[0] == 0
    assert [r["record"] for r in read_records(str(out))] == ["compare", "compare"]
    assert plot.stat().st_mtime_ns >= first and plot.stat().st_size > 0
    code, _, err = run(capsys, "compare", base, new, "--json", out, "--append", "--force")
    assert code == 2 and "choose one" in err


def test_an_infinite_change_is_written_null(tmp_path, capsys):
    """A base time of ~0 makes the change infinite: the record holds null (JSON has no infinity), no traceback."""
    base = write(tmp_path / "b.jsonl", [result(1024, 10.0, time_us=1e-320)])
    new = write(tmp_path / "n.jsonl", [result(1024, 10.0, time_us=5.0)])
    out = tmp_path / "c.jsonl"
    code, _, err = run(capsys, "compare", base, new, "--metric", "time", "--json", out)
    assert code in (0, 1) and "Traceback" not in err, err
    assert "Infinity" not in out.read_text() and any(v is None for r in read_records(str(out)) for v in r.values())

def test_cli_threshold_and_metric_flags(tmp_path, capsys):
    base = write(tmp_path / "b.jsonl", [result(1024, busbw=10.0, time_us=100.0)])
    new = write(tmp_path / "n.jsonl", [result(1024, busbw=10.0, time_us=108.0)])
    assert run(capsys, "compare", base, new)[0] == 0  # busbw unchanged
    code, out, _ = run(capsys, "compare", base, new, "--metric", "time")
    assert code == 1 and "(us)" in out and "+8.0" in out
    assert run(capsys, "compare", base, new, "--metric", "time", "--threshold", "10")[0] == 0


def test_cli_untimed_records_only_is_exit_2(tmp_path, capsys):
    untimed = [result(1024, busbw=None, time_us=None)]
    base = write(tmp_path / "b.jsonl", untimed)
    new = write(tmp_path / "n.jsonl", untimed)
    code, out, err = run(capsys, "compare", base, new)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"commbench: error: no point in common has busbw_gbps in both {base} and "
                                        f"{new} (null: not timed, e.g. --backend sim without --hw)"]


@pytest.mark.parametrize("case,needle", [
    ("missing", "no such file"),
    ("empty", "holds no result records"),
    ("header_only", "holds no result records"),
    ("disjoint", "have no point in common"),
    ("threshold0", "--threshold 0: must be a positive percentage"),
    ("threshold_negative", "--threshold -5"),
    ("metric", "'power'"),
    ("directory", "directory"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, needle):
    base = write(tmp_path / "b.jsonl", [result(1024)])
    new = write(tmp_path / "n.jsonl", [result(1024)])
    extra = []
    if case == "missing":
        new = tmp_path / "nope.jsonl"
    elif case == "empty":
        (tmp_path / "e.jsonl").write_text("")
        new = tmp_path / "e.jsonl"
    elif case == "header_only":
        new = write(tmp_path / "h.jsonl", [])
    elif case == "disjoint":
        new = write(tmp_path / "d.jsonl", [result(4096)])
    elif case == "threshold0":
        extra = ["--threshold", "0"]
    elif case == "threshold_negative":
        extra = ["--threshold", "-5"]
    elif case == "metric":
        extra = ["--metric", "power"]
    elif case == "directory":
        new = tmp_path
    code, out, err = run(capsys, "compare", base, new, *extra)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("commbench: error: ") and needle in lines[0]
    assert out == "" and "Traceback" not in err


def test_table_order_and_columns_for_fields_that_vary():
    points = [result(2048, algorithm="ring", placement="in-place"), result(1024, algorithm="oneshot"),
              result(2048, algorithm="ring"), result(1024, algorithm="oneshot", placement="in-place")]
    records = [r.to_dict() for r in points]
    c = K.compare(records, records)
    lines = K.format_table(c)
    assert lines[0].split() == ["#", "size", "collective", "placement", "algorithm", "base", "new", "change",
                                "noise", "verdict"]
    assert [line.split()[:4] for line in lines[2:]] == [
        ["1024", "allreduce", "out-of-place", "oneshot"], ["2048", "allreduce", "out-of-place", "ring"],
        ["1024", "allreduce", "in-place", "oneshot"], ["2048", "allreduce", "in-place", "ring"]]
    assert K.describe_setup(c) == "torch/gloo, float32 sum, 2 ranks"


def test_wrong_results_fail_and_nodes_are_part_of_the_key(tmp_path):
    import json as _json

    from commbench.cli import main

    def record(busbw, wrong=0, nnodes=1):
        return {"record": "result", "collective": "allreduce", "backend": "torch", "library": "gloo",
                "algorithm": None, "dtype": "float32", "op": "sum", "placement": "in-place", "world_size": 2,
                "nnodes": nnodes, "nbytes": 1024, "busbw_gbps": busbw, "time_us": 10.0, "wrong": wrong}

    base, new = tmp_path / "b.jsonl", tmp_path / "n.jsonl"
    base.write_text(_json.dumps(record(1.0)) + "\n" + _json.dumps(record(1.0, nnodes=2)) + "\n")
    new.write_text(_json.dumps(record(2.0, wrong=256)) + "\n" + _json.dumps(record(1.0, nnodes=2)) + "\n")
    assert main(["compare", str(base), str(new)]) == 1  # faster but wrong: not an improvement
    new.write_text(_json.dumps(record(1.0, nnodes=2)) + "\n")
    assert main(["compare", str(base), str(new)]) == 0  # the 2-node point matched only its 2-node base


def test_a_change_inside_the_measured_noise_is_not_a_regression():
    """Two runs of one setup on a machine whose speed wanders: a single run's own spread (p90 far
    above p50), or repeated runs that disagree, make a large change 'within noise'; exit 0."""
    steady = dict(p50_us=100.0, p90_us=102.0)
    wandering = dict(p50_us=100.0, p90_us=250.0)  # iterations 2.5x apart: 150% noise
    single = K.compare([result(busbw=10.0).to_dict() | wandering], [result(busbw=6.0).to_dict() | steady])
    assert single.points[0].verdict == "within noise" and single.points[0].noise_pct == pytest.approx(150.0)
    assert not single.regressions
    firm = K.compare([result(busbw=10.0).to_dict() | steady], [result(busbw=6.0).to_dict() | steady])
    assert firm.points[0].verdict == "regression"
    repeated = K.compare([result(busbw=v).to_dict() for v in (10.0, 6.0, 14.0)], [result(busbw=8.0).to_dict()])
    assert repeated.points[0].verdict == "within noise"


def test_runs_of_two_statistics_are_not_compared(tmp_path, capsys):
    """A p50 sweep against a mean one would read the spread between the two statistics as a change
    (issue 25): refused in one line."""
    base = write(tmp_path / "b.jsonl", [result(1024, 10.0)])
    new = write(tmp_path / "n.jsonl", [result(1024, 12.0, stat="p50")])
    code, _, err = run(capsys, "compare", base, new)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "holds mean times and" in err and "p50 times (sweep --stat)" in err
    same = write(tmp_path / "s.jsonl", [result(1024, 12.0, stat="p50")])
    assert K.compare(K.load(new), K.load(same), names=(new, same)).points
