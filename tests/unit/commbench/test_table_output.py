"""Table and progress formatting, result writing, and the README <-> CI contract."""
import io
import json

from conftest import REPO

from commbench.results import Result, ResultSink, read_records
from commbench.table import Progress, Table

ROOT = REPO


def _result(placement, time_us=100.0, wrong=0):
    return Result(collective="allreduce", backend="torch", library="gloo", device="cpu", dtype="float32", op="sum",
                  root=None, placement=placement, world_size=2, nnodes=1, requested_nbytes=1000, nbytes=1000,
                  count=250, warmup=1, iters=5, time_us=time_us, algbw_gbps=0.01, busbw_gbps=0.01, p50_us=1,
                  p90_us=1, p99_us=1, min_us=1, max_us=1, rank_agg="max", wrong=wrong)


def test_table_row_and_footer():
    out = io.StringIO()
    table = Table(["out-of-place", "in-place"], stream=out)
    table.header("allreduce")
    table.row({"out-of-place": _result("out-of-place"), "in-place": _result("in-place", 50.0, wrong=3)}, "float")
    table.footer(checked=True)
    text = out.getvalue()
    row = [line for line in text.splitlines() if not line.startswith("#")][0].split()
    assert row == ["1000", "250", "float", "sum", "-1", "100.0", "0.01", "0.01", "0", "50.00", "0.01", "0.01", "3"]
    assert "# Out of bounds values : 3 FAILED" in text
    assert "# Avg bus bandwidth    : 0.01 GB/s" in text


def test_progress_draws_only_on_a_terminal_and_clears_itself():
    stream = io.StringIO()
    progress = Progress(4, stream=stream, enabled=True)
    progress.update("allreduce 1 KiB")
    progress.advance()
    progress.update("allreduce 2 KiB")
    assert "[######..................] 1/4" in stream.getvalue()
    progress.clear()
    assert stream.getvalue().endswith("\r")
    quiet = io.StringIO()
    Progress(4, stream=quiet).update("x")  # StringIO is not a terminal
    assert quiet.getvalue() == ""


def test_sink_flushes_each_record(tmp_path):
    path = tmp_path / "r.jsonl"
    sink = ResultSink(str(path), str(tmp_path / "r.csv"))
    sink.header({"run_id": "x"})
    sink.result(_result("in-place"))
    lines = path.read_text().splitlines()  # readable before close: flushed
    assert [json.loads(line)["record"] for line in lines] == ["header", "result"]
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 2
    sink.close()
    with open(path, "a") as handle:
        handle.write('{"record": "res')  # a run killed mid-line
    assert len(read_records(str(path))) == 2


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(line for line in readme.splitlines() if "pytest" in line and line.startswith("python3 -m venv"))
    assert test_command in ci.splitlines()


def test_the_readme_puts_the_presets_where_they_are():
    """The README put presets/ under costmodel/ (issue 48, item 14): they are commbench/presets/."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`costmodel/` with `presets/`" not in readme and "`presets/` (the hardware presets" in readme
    assert (ROOT / "commbench" / "presets" / "dgx-a100.json").is_file()
    assert not (ROOT / "commbench" / "costmodel" / "presets").exists()
