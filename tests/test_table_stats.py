"""What the table shows when asked: the statistic of --stat with its own bandwidths, a mark on
noisy points, the average in fixed notation, a progress line with an ETA (and a plain one
where stderr is no terminal), and a closed pipe that ends nothing."""
from __future__ import annotations

import io
import subprocess
import sys

from commbench import collectives as C
from commbench.results import Result
from commbench.table import Progress, Table


def _result(p50_us: float, p99_us: float, time_us: float = 100.0) -> Result:
    algbw, busbw = C.bandwidths_gbps("allreduce", 1 << 20, 2, time_us)
    return Result(collective="allreduce", backend="torch", library="gloo", device="cpu", dtype="float32", op="sum",
                  root=None, placement="in-place", world_size=2, nnodes=1, requested_nbytes=1 << 20, nbytes=1 << 20,
                  count=1 << 18, warmup=1, iters=5, time_us=time_us, algbw_gbps=algbw, busbw_gbps=busbw,
                  p50_us=p50_us, p90_us=p99_us, p99_us=p99_us, min_us=p50_us / 2, max_us=p99_us, rank_agg="max",
                  wrong=0)


def _rows(stat: str, result: Result) -> tuple[list[str], str]:
    out = io.StringIO()
    table = Table(["in-place"], stream=out, stat=stat)
    table.header("allreduce")
    table.row({"in-place": result}, "float")
    table.footer(checked=True)
    text = out.getvalue()
    return [line.split() for line in text.splitlines() if not line.startswith("#")][0], text


def test_the_stat_chooses_the_time_and_its_bandwidths():
    result = _result(p50_us=40.0, p99_us=60.0)
    mean, _ = _rows("mean", result)
    p50, _ = _rows("p50", result)
    fastest, _ = _rows("min", result)
    assert [mean[5], p50[5], fastest[5]] == ["100.0", "40.00", "20.00"]
    busbw_p50 = C.bandwidths_gbps("allreduce", 1 << 20, 2, 40.0)[1]
    assert float(p50[7]) == round(busbw_p50, 2) and float(p50[7]) > float(mean[7])


def test_a_noisy_point_is_marked_and_explained():
    quiet, text = _rows("mean", _result(p50_us=90.0, p99_us=150.0))
    noisy, noisy_text = _rows("mean", _result(p50_us=50.0, p99_us=400.0))
    assert quiet[-1] != "~" and "p99 >" not in text
    assert noisy[-1] == "~" and "# ~ : 1 row(s) with p99 > 2 x p50" in noisy_text


def test_the_average_bus_bandwidth_is_never_in_exponent_notation():
    out = io.StringIO()
    table = Table(["in-place"], stream=out)
    table.busbw_sum, table.busbw_points = 7.597e-05, 1
    table.footer(checked=False)
    assert "# Avg bus bandwidth    : 0.00007597 GB/s" in out.getvalue()


def test_progress_has_an_eta_and_logs_where_stderr_is_no_terminal():
    clock = iter([0.0, 0.0, 10.0, 40.0])
    log = io.StringIO()
    progress = Progress(4, stream=log, clock=lambda: next(clock))  # no terminal: a plain line every 30 s
    progress.update("first")
    progress.advance()
    progress.update("second")  # 10 s: too early for a line
    progress.update("third")  # 40 s: one line, ETA from 1 of 4 done in 40 s
    assert log.getvalue() == "commbench: 1/4 points, 40 s ETA 120s: third\n"


def test_a_closed_pipe_ends_quietly(tmp_path):
    sweep = subprocess.Popen([sys.executable, "-m", "commbench", "sweep", "--sizes", "1K-256K", "--min-time", "0.02",
                              "--json", str(tmp_path / "r.jsonl")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sweep.stdout.readline()
    sweep.stdout.close()  # as `| head -1` does
    assert sweep.wait(timeout=120) == 0
    assert b"Traceback" not in sweep.stderr.read() and '"status": "ok"' in (tmp_path / "r.jsonl").read_text()
