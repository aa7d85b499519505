"""`commbench replay` as users run it: the table of a trace, a replay on 2 local ranks that issues exactly
the trace's calls, a prediction with --hw, and bad input (one line, exit 2)."""
import gzip

import pytest
from conftest import DATA, commbench

from commbench import cli
from commbench.proxies.traces.files import read_traces
from commbench.results import read_records

TRACES = DATA / "traces"
DDP = [str(TRACES / f"ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]
FSDP = [str(TRACES / f"fsdp2_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]
DDP4 = [str(TRACES / f"ddp1bucket_4rank_gloo_rank{r}.json.gz") for r in range(4)]  # bucket_cap_mb=100: one bucket
ET = [str(TRACES / f"et_ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]  # execution traces


def test_table_only_lists_each_collective_and_size():
    proc = commbench("replay", *DDP, "--table-only")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert [r[0] for r in rows] == ["allreduce", "allreduce"]
    assert sum(int(r[5]) for r in rows) == 4  # 2 buckets x 2 traced steps
    assert "# replay" not in proc.stdout


@pytest.mark.parametrize("traces", [DDP, FSDP, DDP4, ET], ids=["ddp", "fsdp2", "ddp-one-bucket-4-ranks", "et"])
def test_replay_issues_exactly_the_traced_calls_in_order(tmp_path, traces):
    out = tmp_path / "r.jsonl"
    proc = commbench("replay", *traces, "--steps", "2", "--warmup-steps", "1", "--json", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "# median" in proc.stdout
    traced = read_traces(traces).ranks[0].steps
    records = read_records(str(out))
    steps = [r for r in records if r["record"] == "step"]
    (summary,) = [r for r in records if r["record"] == "proxy"]
    assert len(steps) == 3 and summary["status"] == "ok" and summary["world_size"] == len(traces)
    for step in steps:
        expected = [[c.collective, c.nbytes, c.dtype, list(c.group)] for c in traced[step["traced_step"]].calls]
        assert step["issued"] == expected
        assert len(step["calls_us"]) == len(expected)
        assert step["compute_us"] + step["exposed_comm_us"] + step["other_us"] == pytest.approx(step["step_us"])
    checked = commbench("check", str(out), "--hw", "ethernet-25g")  # check predicts the same trace's steps
    assert checked.returncode == 0, checked.stderr
    assert any(line.startswith("trace:") and " step " in line for line in checked.stdout.splitlines())


def test_hw_predicts_and_writes_a_predicted_record(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = commbench("replay", *DDP, "--hw", "dgx-h100", "-T", "2x1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "predicted on" in proc.stdout and "# median" in proc.stdout
    (summary,) = [r for r in read_records(str(out)) if r["record"] == "proxy"]
    assert summary["kind"] == "predicted" and summary["comm_us_p50"] > 0 and summary["steps"] == 2


@pytest.mark.parametrize("args, words", [
    (DDP[:1], "no trace of rank"),
    ([DDP[0], DDP[0]], "given twice"),  # issue 48, item 21: an NCCL log given twice replayed every call twice
    (["missing.json", DDP[1]], "missing.json"),
    ([*DDP, "--hw", "no-such-hw"], "no-such-hw"),
    ([*DDP, "--hw", "dgx-h100", "-T", "2x2"], "2"),
    # issue 48: inf made every step's compute 0 us, 1e300 as good as inf
    ([*DDP, "--hw", "dgx-h100", "--compute-scale", "inf"], "--compute-scale inf: must be a finite number"),
    ([*DDP, "--hw", "dgx-h100", "--compute-scale", "1e300"], "--compute-scale 1e+300: must be at most 1e+06"),
    ([*DDP, "--hw", "dgx-h100", "--compute-scale", "1e-300"], "--compute-scale 1e-300: must be at least 1e-06"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, words):
    """In process (cli.main, as `python -m commbench` runs it); the truncated trace's test runs the real command."""
    code = cli.main(["replay", *args])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err


def test_truncated_trace_is_one_line_and_exit_2(tmp_path):
    text = gzip.open(DDP[1], "rt").read()
    cut = tmp_path / "rank1.json"
    cut.write_text(text[: len(text) // 3])
    proc = commbench("replay", DDP[0], str(cut), "--table-only")
    assert proc.returncode == 2 and "truncated" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_nccl_log_replays_its_calls_on_two_ranks(tmp_path):
    lines = []
    for rank in (0, 1):
        lines.append(f"node0:10{rank}:15{rank} [{rank}] NCCL INFO ncclCommInitRank comm 0x555{rank} rank {rank} "
                     f"nranks 2 cudaDev {rank} nvmlDev {rank} busId {rank}b000 commId 0x1111 - Init COMPLETE")
    for op_count, (name, count, dtype) in enumerate([("AllReduce", 65536, 7), ("AllGather", 1000, 9),
                                                     ("Broadcast", 77, 6)]):
        for rank in (1, 0):
            lines.append(f"node0:10{rank}:15{rank} [{rank}] NCCL INFO {name}: opCount {op_count:x} sendbuff 0x7f{rank} "
                         f"recvbuff 0x7f{rank} count {count} datatype {dtype} op 0 root 0 comm 0x555{rank} "
                         f"[nranks=2] stream 0x1")
    log = tmp_path / "nccl.log"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "r.jsonl"
    proc = commbench("replay", str(log), "--compute", "none", "--steps", "1", "--warmup-steps", "0",
                     "--json", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr
    (step,) = [r for r in read_records(str(out)) if r["record"] == "step"]
    assert step["issued"] == [["allreduce", 65536 * 4, "float32", [0, 1]],
                              ["allgather", 1000 * 2 * 2, "bfloat16", [0, 1]], ["broadcast", 77 * 2, "float16", [0, 1]]]


def _param_trace(path, rank, world, group, nelems=64):
    """One rank's profiler trace of one record_param_comms allreduce on `group` (ProcessGroupNCCL's fields)."""
    import json

    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0,
               "dur": 500.0},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
              {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 100.0, "dur": 5.0,
               "args": {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": nelems,
                        "Out msg nelems": nelems, "Group size": len(group), "Process Group Name": "1",
                        "Process Group Ranks": str(list(group))}}]
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": world},
                                "traceEvents": events}))
    return str(path)


@pytest.mark.parametrize("case, words", [
    ("not-in-group", "r0.json: event 2 ('record_param_comms'): rank 0 issues a call on group [1, 2], which it is "
                     "not in"),
    ("buffers", "the trace's 2 rank(s), each holding a buffer of every call size it issues, need 8192.0 GiB"),
])
def test_a_trace_the_ranks_cannot_replay_is_refused_before_they_start(capsys, tmp_path, case, words):
    """Failed in every rank: an AttributeError (exit 3), an allocation of 4 TiB (a line per rank), issue 48,
    item 21. Now one line from the parent, exit 2, and no rank started."""
    if case == "not-in-group":
        paths = [_param_trace(tmp_path / f"r{r}.json", r, 4, (1, 2) if r < 3 else (3,)) for r in range(4)]
    else:
        paths = [_param_trace(tmp_path / f"r{r}.json", r, 2, (0, 1), nelems=1 << 40) for r in range(2)]
    code = cli.main(["replay", *paths, "--steps", "1", "--warmup-steps", "0"])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commbench: error: ") and words in lines[0], err
    assert "starting" not in err and "Traceback" not in err


def test_a_named_pipe_is_refused_at_once(tmp_path):
    """Was read until killed, waiting for a writer (issue 48, item 17)."""
    import os

    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    proc = commbench("replay", str(fifo), "--table-only", timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == f"commbench: error: {fifo}: not a regular file"
