"""`commbench nccl-tests` prints nccl-tests' own lines around its table (issue 48, item 11): the header block
(`# nThread ... validation: 1 graph: 0`, `# Using devices` and a line a rank), the average as a bare number,
and `# Collective test concluded: NAME_perf`, which scripts grep; and it bounds its sizes (item 17)."""
from __future__ import annotations

import io
import re
import time
import types

from commbench import cli
from commbench.commands.nccltests import translate
from commbench.results import point_result
from commbench.table import Table


def test_the_header_block_and_the_concluding_line_are_nccl_tests(capsys):
    assert cli.main(["nccl-tests", "-B", "sim", "all_gather_perf", "-b", "8", "-e", "64", "-f", "2", "-g", "2",
                     "-z", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "# nThread 1 nGpus 2 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 " \
           "validation: 1 graph: 0" in lines
    assert "# Blocking Enabled: wait for completion and barrier after each collective" in lines
    devices = lines.index("# Using devices")
    rank_line = re.compile(r"#  Rank +(\d+) Group +0 Pid +\d+ on +\S+ device ")
    ranks = [rank_line.match(line) for line in lines[devices + 1:devices + 3]]
    assert [int(match.group(1)) for match in ranks if match] == [0, 1], lines[devices:devices + 3]
    assert lines[-3:] == ["#", "# Collective test concluded: all_gather_perf", "#"], lines[-6:]


def test_the_header_says_the_step_and_the_checks_as_given():
    assert translate("all_reduce_perf", ["-b", "1K", "-e", "4K", "-i", "1024", "-c", "0", "-n", "3",
                                         "-w", "0x2"]).header == [
        "nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 1024(bytes) warmup iters: 2 iters: 3 agg iters: 1 "
        "validation: 0 graph: 0"]
    assert "Parallel Init Enabled" in translate("all_reduce_perf", ["-p", "1"]).header[-1]


def noisy_table(**options) -> str:
    out = io.StringIO()
    table = Table(["out-of-place"], stream=out, **options)
    plan = types.SimpleNamespace(collective="allreduce", nbytes=1 << 20, count=1 << 18, root=-1, world=2,
                                 requested_nbytes=1 << 20)
    table.row({"out-of-place": point_result(plan, dtype="float32", op="sum", placement="out-of-place", nnodes=1,
                                            backend="torch", library="gloo", device="cpu", time_us=1000.0,
                                            per_iteration_us=[1000.0] * 9 + [9000.0], warmup=1, rank_agg="max",
                                            wrong=0, run_id="x", kind="measured", timestamp=time.time())}, "float")
    table.footer(checked=True)
    return out.getvalue()


def test_the_average_is_a_bare_number_in_nccl_tests_mode():
    """`awk '/Avg bus bandwidth/ {print $NF}'` read "times)" from commbench's footer."""
    line = next(x for x in noisy_table(nccl_tests=True).splitlines() if "Avg bus bandwidth" in x)
    assert re.fullmatch(r"# Avg bus bandwidth    : [0-9.e+-]+", line), line
    assert "GB/s (busbw of the mean times)" in noisy_table()


def test_the_noisy_rows_hint_fits_the_outputs_given():
    """It said "add --json FILE" with --csv given (whose rows keep the spread), and in nccl-tests mode (-J)."""
    assert "(p50_us, p99_us and iteration_times_us in the CSV)" in noisy_table(json_kept=False, csv_kept=True)
    assert "in the JSON and the CSV)" in noisy_table(json_kept=True, csv_kept=True)
    nccl_tests = noisy_table(json_kept=False, keep_flag="-J FILE", marks_in_rows=False, nccl_tests=True)
    assert "(add -J FILE to keep p50_us" in nccl_tests and "--json" not in nccl_tests


def test_steps_of_a_factor_read_as_one_are_bounded(capsys):
    """`-f 1.0000001` is -f 1 (strtol), steps of -i's 1 MiB: 1,024 sizes from 1K to 1G, killed at 180 s."""
    started = time.monotonic()
    assert cli.main(["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1G", "-f", "1.0000001"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "1,024 sizes" in err and "-f 1.0000001 is 1" in err, err
    assert time.monotonic() - started < 10
    assert cli.main(["sweep", "--sizes", "1K-1G", "--step", "1M"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "1,024 sizes" in err and "at most 1,000" in err, err
