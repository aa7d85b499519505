"""sweep's --skip-iters, --p99, --timestamps, --memory-report, --misalign and --blocking (nccl-tests
2.19's -K, -I, -S, -M, -u, -z; issue 39), run through the harness on gloo and on commbench's schedules."""
import json
import re

import pytest

from commbench import cli


def _sweep(tmp_path, capfd, *args):
    out = tmp_path / "t.jsonl"
    code = cli.main(["sweep", "--sizes", "1K", "--iters", "4", "--warmup", "1", *args, "--json", str(out)])
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return code, capfd.readouterr(), records


def test_every_timing_flag_on_gloo(tmp_path, capfd):
    code, printed, records = _sweep(tmp_path, capfd, "-c", "allreduce,gather", "--skip-iters", "2", "--p99",
                                    "--timestamps", "--memory-report", "--misalign", "8", "--blocking", "1")
    assert code == 0, printed.err
    results = [r for r in records if r["record"] == "result"]
    assert all(r["wrong"] == 0 and r["iters"] == 4 and r["skipped_iters"] == 2 for r in results)
    assert all(len(r["skipped_times_us"]) == 2 and r["rank_times_us"]["ranks"] == 2 for r in results)
    rows = [line for line in printed.out.splitlines() if line.startswith(" ")]
    columns = [len(row.rstrip(" ~").split()) for row in rows]  # a noisy row ends with ~
    assert rows and set(columns) == {5 + 2 * 5 + 1}  # 13 columns, p99 twice, the timestamp
    assert all(re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row) for row in rows)
    header = next(line for line in printed.out.splitlines() if "timestamp (UTC)" in line)
    end = header.index("timestamp (UTC)") + len("timestamp (UTC)")
    assert all(re.search(r"Z\s*~?$", row[:end + 2]) for row in rows)  # each row's time ends under its header
    assert "each call, a wait for it to finish and a barrier" in printed.out and "-K 2" in printed.out
    assert printed.out.count("# memory: rank ") == 2
    assert len(records[-1]["memory"]) == 2 and records[-1]["memory"][1]["host_peak_rss_bytes"] > 0


def test_misaligned_buffers_on_the_schedule_backends_are_checked(tmp_path, capfd):
    for backend in ("sim", "shm"):
        code, printed, records = _sweep(tmp_path, capfd, "--backend", backend, "-c", "allreduce,allgather",
                                        "--misalign", "4", "--blocking", "3", "--force")
        assert code == 0, printed.err
        assert all(r["wrong"] == 0 for r in records if r["record"] == "result")


@pytest.mark.parametrize("args,message", [
    (["--misalign", "2"], "--misalign 2: not a multiple of float32's 4 B"),
    (["--misalign", "-4"], "--misalign -4: must be at least 0"),
    (["--misalign", str(1 << 40)], "--misalign 1099511627776: must be at most 65536"),
    (["--skip-iters", "-1"], "--skip-iters -1: must be at least 0"),
    (["--blocking", "2"], "'2' is not one of '0', '1', '3'"),
    (["-c", "alltoallv", "--splits", "skewed:q"], "--splits skewed:q"),
    (["-c", "hypercube", "--nprocs", "3"], "power-of-two"),
])
def test_bad_values_are_one_line(args, message, tmp_path, capfd):
    code, printed, _ = _sweep(tmp_path, capfd, *args)
    assert code == 2 and message in printed.err and "Traceback" not in printed.err
