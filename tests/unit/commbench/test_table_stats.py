"""What the table shows when asked: the statistic of --stat with its own bandwidths, a mark on
noisy points, the average in fixed notation, a progress line with an ETA (and a plain one
where stderr is no terminal), and a closed pipe that ends nothing."""
from __future__ import annotations

import io
import subprocess
import sys
import time

import numpy as np
import pytest

from commbench import bench_point
from commbench import collectives as C
from commbench.eta import point_estimate_s
from commbench.results import Result, point_result, raw_times
from commbench.table import Progress, Table


def _result(p50_us: float, p99_us: float, time_us: float = 100.0) -> Result:
    algbw, busbw = C.bandwidths_gbps("allreduce", 1 << 20, 2, time_us)
    return Result(collective="allreduce", backend="torch", library="gloo", device="cpu", dtype="float32", op="sum",
                  root=None, placement="in-place", world_size=2, nnodes=1, requested_nbytes=1 << 20, nbytes=1 << 20,
                  count=1 << 18, warmup=1, iters=5, time_us=time_us, algbw_gbps=algbw, busbw_gbps=busbw,
                  p50_us=p50_us, p90_us=p99_us, p99_us=p99_us, min_us=p50_us / 2, max_us=p99_us, rank_agg="max",
                  wrong=0)


def _rows(result: Result) -> tuple[list[str], str]:
    out = io.StringIO()
    table = Table(["in-place"], stream=out)
    table.header("allreduce")
    table.row({"in-place": result}, "float")
    table.footer(checked=True)
    text = out.getvalue()
    return [line.split() for line in text.splitlines() if not line.startswith("#")][0], text


# two ranks x four iterations: rank 1 is slow in iterations 0 and 1, rank 0 in iterations 2 and 3
TIMES_US = np.array([[10.0, 10.0, 50.0, 70.0],
                     [40.0, 60.0, 10.0, 10.0]])


def _measured(stat: str, rank_agg: str = "max") -> Result:
    stats = bench_point.summarize(TIMES_US, rank_agg, stat)
    plan = C.plan("allreduce", 1 << 20, C.resolve_dtype("float32"), 2)
    return point_result(plan, dtype="float32", op="sum", placement="in-place", nnodes=1, backend="torch",
                        library="gloo", device="cpu", time_us=stats["time_us"],
                        per_iteration_us=stats["per_iteration_us"], rank_agg=rank_agg, wrong=0, stat=stat)


def test_one_sample_per_iteration_the_slowest_ranks_and_every_figure_is_a_statistic_of_them():
    """Each rank's mean, then the slowest (the old time) would be max(30, 30) = 30; the samples are
    the slowest rank's per iteration (40, 60, 50, 70): their mean is 55, their median 55, min 40."""
    mean, p50, fastest = (_measured(stat) for stat in ("mean", "p50", "min"))
    assert list(raw_times(mean)) == [40.0, 60.0, 50.0, 70.0]
    assert (mean.time_us, p50.time_us, fastest.time_us) == (55.0, 55.0, 40.0)
    assert mean.time_us == raw_times(mean).mean() == mean.mean_us and p50.time_us == p50.p50_us
    assert mean.min_us <= mean.p50_us <= mean.max_us and mean.min_us <= mean.time_us <= mean.max_us
    assert _measured("mean", "avg").time_us == TIMES_US.mean()  # --rank-agg avg: nccl-tests' figure, exactly


def test_the_record_holds_the_printed_statistic_and_its_bandwidths():
    for stat in ("mean", "p50", "min"):
        result = _measured(stat)
        row, text = _rows(result)
        assert result.stat == stat
        assert float(row[5]) == round(result.time_us, 1 if result.time_us >= 100 else 2)
        assert (result.algbw_gbps, result.busbw_gbps) == C.bandwidths_gbps("allreduce", 1 << 20, 2, result.time_us)
        assert float(row[7]) == round(result.busbw_gbps, 2)
        assert f"(busbw of the {stat} times)" in text


def test_a_noisy_point_is_marked_and_explained():
    quiet, text = _rows(_result(p50_us=90.0, p99_us=150.0))
    noisy, noisy_text = _rows(_result(p50_us=50.0, p99_us=400.0))
    assert quiet[-1] != "~" and "p99 >" not in text
    assert noisy[-1] == "~" and "# ~ : 1 row(s) with p99 > 2 x p50" in noisy_text


def test_the_average_bus_bandwidth_is_never_in_exponent_notation():
    out = io.StringIO()
    table = Table(["in-place"], stream=out)
    table.busbw_sum, table.busbw_points = 7.597e-05, 1
    table.footer(checked=False)
    assert "# Avg bus bandwidth    : 0.00007597 GB/s (busbw of the mean times)" in out.getvalue()


def test_progress_has_an_eta_and_logs_where_stderr_is_no_terminal():
    clock = iter([0.0, 0.0, 3.0, 40.0])
    log = io.StringIO()
    progress = Progress(4, stream=log, clock=lambda: next(clock))  # no terminal: a plain line every 5 s
    progress.update("first")
    progress.advance()
    progress.update("second")  # 3 s: too early for a line
    progress.update("third")  # 40 s: one line, ETA from 1 of 4 done in 40 s
    assert log.getvalue() == "commbench: 1/4 points, 40 s ETA 120s: third\n"


def test_a_closed_pipe_ends_quietly(tmp_path):
    sweep = subprocess.Popen([sys.executable, "-m", "commbench", "sweep", "--sizes", "1K-256K", "--min-time", "0.02",
                              "--json", str(tmp_path / "r.jsonl")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sweep.stdout.readline()
    sweep.stdout.close()  # as `| head -1` does
    assert sweep.wait(timeout=120) == 0
    assert b"Traceback" not in sweep.stderr.read() and '"status": "ok"' in (tmp_path / "r.jsonl").read_text()


# ------------------------------------------------------- progress: ETA by bytes, a heartbeat (issue 32, item 10)


def test_the_eta_counts_the_bytes_still_to_come():
    """`--sizes 1K-1G` said "ETA 6s" at 34 s and finished at 121 s: the ETA counted points, and the last
    points hold most of the bytes. Four points done (1 and 4 KiB in 1 s, 256 KiB and 1 MiB in 2 s), two to
    come (64 MiB, 256 MiB): the growth from 4 KiB to 1 MiB at its time per byte. (Two sizes alone, 1 KiB in
    1 s and 1 MiB in 2 s, are no cost per byte since issue 48: under load noise alone differs 2-4x.)"""
    clock = iter([0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0])  # the start, then each point's begin and end
    sizes = [1 << 10, 4 << 10, 256 << 10, 1 << 20, 64 << 20, 256 << 20]
    progress = Progress(6, stream=io.StringIO(), enabled=False, clock=lambda: next(clock), nbytes=sizes)
    for _ in range(4):
        progress.update("point")
        progress.advance()
    per_byte = 1.0 / ((1 << 20) - (4 << 10))
    expected = (2.0 + per_byte * (sizes[4] - sizes[3])) + (2.0 + per_byte * (sizes[5] - sizes[3]))
    assert progress.eta(6.0).seconds == pytest.approx(expected) and not progress.eta(6.0).at_least
    assert progress.eta_s(6.0) > 100 * (6.0 / 4 * 2)  # what counting points said


def test_the_eta_keeps_a_size_already_timed_and_ignores_noise():
    # a size done before (an earlier collective): its own time
    assert point_estimate_s([(1024, 0.5), (1 << 20, 0.9), (1024, 0.7)], 1024) == pytest.approx(0.6)
    # 1 KiB and 2 KiB differ by noise only: no line through them predicts hours for 1 GiB
    assert point_estimate_s([(1024, 0.20), (2048, 0.21)], 1 << 30) == pytest.approx(0.21)
    # time that grows with size: the nearest size's time plus the extra bytes at the rate it grew
    grown = [(256 << 10, 1.0), (512 << 10, 1.0), (1 << 20, 1.0), (2 << 20, 2.0)]
    assert point_estimate_s(grown, 8 << 20) == pytest.approx(2.0 + 6.0 / 1.5)


def test_the_running_point_counts_what_is_left_of_it():
    clock = iter([0.0, 0.0, 2.0, 2.0])
    progress = Progress(3, stream=io.StringIO(), enabled=False, clock=lambda: next(clock), nbytes=[8, 8, 8])
    progress.update("a")
    progress.advance()  # 2 s a point
    progress.update("b")  # begins at 2 s
    assert progress.eta_s(3.0) == pytest.approx(1.0 + 2.0)  # 1 s left of b, then c
    assert progress.eta_s(9.0) == pytest.approx(2.0)  # b overran its estimate: c still to come


def test_a_long_point_is_not_silent(monkeypatch):
    """`--sizes 1K,1M,256M --iters 50` was silent for 54 s: one point's calls gave no line. The heartbeat logs
    while a point runs, at LOG_INTERVAL_S apart."""
    class Log(io.StringIO):
        def isatty(self):
            return False

    monkeypatch.setattr(Progress, "LOG_INTERVAL_S", 0.2)
    monkeypatch.setattr(Progress, "BEAT_S", 0.02)
    log = Log()
    progress = Progress(2, stream=log, nbytes=[1 << 28, 1 << 28])  # enabled None: a real run's, with its heartbeat
    progress.update("allreduce 256 MiB out-of-place")
    time.sleep(1.0)  # the point runs
    progress.close()
    lines = log.getvalue().splitlines()
    assert len(lines) >= 2 and all(": allreduce 256 MiB out-of-place" in line for line in lines), lines
    count = len(lines)
    time.sleep(0.3)
    assert len(log.getvalue().splitlines()) == count  # closed: the heartbeat stopped


def test_the_first_line_comes_before_the_ranks_start(monkeypatch, capsys):
    """Under load 8-24 s passed before the first line: the ranks import torch and meet first. The spawner
    says what it starts before it starts them."""
    from commbench import cli, job

    seen = []
    monkeypatch.setattr(job, "spawn_local", lambda *a, **k: seen.append(capsys.readouterr().err) or 0)
    assert cli.main(["sweep", "--sizes", "1K", "--nprocs", "2"]) == 0
    assert seen == ["commbench: sweep: starting 2 rank(s) on this host; their first line follows once they meet\n"]
