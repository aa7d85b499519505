"""proxies/traces/nccl_log.py on lines in the format NCCL prints them: the INFO prefix of src/debug.cc
(ncclDebugLog: "HOST:PID:TID [DEV] NCCL INFO "), the COLL line of src/enqueue.cc (ncclEnqueueCheck) and
the INIT line of src/init.cc ("... commId 0x.. - Init COMPLETE"), NVIDIA/nccl 2.20.5."""
import pytest

from commbench.proxies.traces.calls import TraceError
from commbench.proxies.traces.files import read_traces

PIDS = {0: 101, 1: 102, 2: 103, 3: 104}


def coll(rank, name, op_count, count, dtype, comm, nranks, op=0):
    return (f"node0:{PIDS[rank]}:{PIDS[rank] + 50} [{rank}] NCCL INFO {name}: opCount {op_count:x} sendbuff "
            f"0x7f00{rank}0000000 recvbuff 0x7f00{rank}0100000 count {count} datatype {dtype} op {op} root 0 "
            f"comm {comm} [nranks={nranks}] stream 0x5600000{rank}")


def init(rank, comm, comm_rank, nranks, comm_id, split=False):
    how = (f"ncclCommSplit comm {comm} rank {comm_rank} nranks {nranks} cudaDev {rank} nvmlDev {rank} busId "
           f"{rank}b000 parent 0xaaa{rank} color 1 key {rank}" if split else
           f"ncclCommInitRank comm {comm} rank {comm_rank} nranks {nranks} cudaDev {rank} nvmlDev {rank} busId "
           f"{rank}b000")
    return f"node0:{PIDS[rank]}:{PIDS[rank] + 60} [{rank}] NCCL INFO {how} commId {comm_id} - Init COMPLETE"


def four_rank_log():
    """4 ranks: a world communicator and two pair communicators ({0,1}, {2,3}), their lines interleaved
    as one log of the whole job shows them (torchrun's merged output)."""
    lines = ["node0:101:101 [0] NCCL INFO NCCL version 2.20.5+cuda12.4"]
    for r in range(4):
        lines.append(init(r, f"0x55500000{r}", r, 4, "0x1111"))
    for r in (2, 0, 3, 1):  # a pair's own commId; ranks join in any order
        lines.append(init(r, f"0x66600000{r}", r % 2, 2, "0x2222" if r < 2 else "0x3333", split=True))
    for step in range(2):
        for r in (0, 2, 1, 3):
            lines.append(coll(r, "AllReduce", step, 1 << 20, 9, f"0x66600000{r}", 2))  # bf16 pair allreduce
        for r in (3, 1, 0, 2):
            lines.append(coll(r, "AllGather", step, 4096, 7, f"0x55500000{r}", 4))  # per-rank send count
            lines.append(coll(r, "ReduceScatter", 2 * step + 1, 1024, 7, f"0x55500000{r}", 4, op=2))
    lines.append("node0:101:101 [0] NCCL INFO Send: opCount 9 sendbuff 0x1 recvbuff (nil) count 8 datatype 7 op 0 "
                 "root 1 comm 0x555000000 [nranks=4] stream 0x5")
    return lines


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_interleaved_communicators_give_each_rank_its_groups_and_bytes(tmp_path):
    job = read_traces([write(tmp_path, "nccl.log", four_rank_log())])
    assert job.world == 4 and job.groups() == [(0, 1), (2, 3), (0, 1, 2, 3)]
    (step,) = job.ranks[3].steps
    assert [(c.collective, c.nbytes, c.dtype, c.group) for c in step.calls[:3]] == [
        ("allreduce", 2 << 20, "bfloat16", (2, 3)), ("allgather", 4096 * 4 * 4, "float32", (0, 1, 2, 3)),
        ("reduce_scatter", 1024 * 4 * 4, "float32", (0, 1, 2, 3))]
    assert step.calls[2].op == "max" and len(step.calls) == 6
    assert any("1 Send" in n for n in job.notes) and any("no times" in n for n in job.notes)


def test_one_log_per_rank_reads_as_the_merged_log(tmp_path):
    lines = four_rank_log()
    paths = [write(tmp_path, f"rank{r}.log", [x for x in lines if f":{PIDS[r]}:" in x]) for r in range(4)]
    merged = read_traces([write(tmp_path, "all.log", lines)])
    assert read_traces(paths) == merged


def test_a_rank_missing_from_the_set_is_named(tmp_path):
    lines = [x for x in four_rank_log() if ":104:" not in x]  # rank 3's log not given
    with pytest.raises(TraceError, match="a job of 4 ranks, but no log lines of rank.* 3"):
        read_traces([write(tmp_path, "nccl.log", lines)])


def test_coll_lines_without_init_lines_read_when_every_call_is_on_the_world(tmp_path):
    lines = [coll(r, "AllReduce", 0, 256, 7, f"0x5550{r}", 2) for r in (0, 1)]
    job = read_traces([write(tmp_path, "nccl.log", lines)])
    assert job.world == 2 and job.ranks[1].steps[0].calls[0].nbytes == 1024
    sub = lines + [coll(0, "AllReduce", 1, 256, 7, "0x7770", 1)]
    with pytest.raises(TraceError, match="INIT"):
        read_traces([write(tmp_path, "sub.log", sub)])


def test_a_log_cut_short_on_one_rank_is_named(tmp_path):
    lines = four_rank_log()
    cut = [x for x in lines if not (":104:" in x and "opCount 1 " in x and "AllReduce" in x)]
    with pytest.raises(TraceError, match="disagree"):
        read_traces([write(tmp_path, "nccl.log", cut)])


def test_text_that_is_no_trace_is_named(tmp_path):
    with pytest.raises(TraceError, match="neither"):
        read_traces([write(tmp_path, "notes.txt", ["hello"])])


@pytest.mark.parametrize("line,field", [
    (coll(0, "AllReduce", 0, 10 ** 30, 7, "0x555000000", 4), "'count' is 1000000000000000000000000000000"),
    (coll(0, "AllReduce", 0, "9" * 5000, 7, "0x555000000", 4), "'count' is '99999999999999999999..."),
    (coll(0, "AllGather", 0, 2 ** 41, 7, "0x555000000", 4), "moves 8,796,093,022,208 elements"),
    (coll(0, "AllReduce", 0, 8, "9" * 5000, "0x555000000", 4), "'datatype' is '9999"),
    (init(0, "0x777000000", 0, 10 ** 12, "0x4444"), "'nranks' is 1000000000000"),
    (init(0, "0x777000000", 5, 4, "0x4444"), "rank 5 of a communicator of 4 rank(s)"),
])
def test_numbers_out_of_range_are_one_line_naming_the_line_and_the_field(tmp_path, line, field):
    """Was a MemoryError (nranks 10^12), a ValueError (thousands of digits) or a call of 10^30 elements sent to
    the ranks (issue 48)."""
    path = write(tmp_path, "nccl.log", [*four_rank_log(), line])
    with pytest.raises(TraceError) as caught:
        read_traces([path])
    said = str(caught.value)
    assert said.startswith(f"{path}:") and field in said and "\n" not in said, said


def test_a_log_given_twice_is_refused_not_read_twice(tmp_path):
    """Every call was replayed twice, silently (issue 48, item 21): the same file, a copy of it, a merged log
    beside a rank's own."""
    lines = four_rank_log()
    path = write(tmp_path, "nccl.log", lines)
    with pytest.raises(TraceError, match="nccl.log: given twice"):
        read_traces([path, path])
    copy = write(tmp_path, "copy.log", lines)
    with pytest.raises(TraceError, match=r"copy.log:\d+: process node0:\d+ has lines in .*nccl.log too"):
        read_traces([path, copy])
    rank3 = write(tmp_path, "rank3.log", [x for x in lines if ":104:" in x])
    with pytest.raises(TraceError, match="a log given twice"):
        read_traces([path, rank3])


def test_a_rank_holding_a_communicator_twice_is_refused(tmp_path):
    """Was a group [0, 0] (issue 48, item 21): two INIT lines of one process with one commId."""
    lines = [*four_rank_log(), init(0, "0x888000000", 0, 2, "0x9999"), init(0, "0x888000001", 1, 2, "0x9999")]
    lines += [coll(0, "AllReduce", 0, 8, 7, comm, 2) for comm in ("0x888000000", "0x888000001")]
    with pytest.raises(TraceError, match=r"nccl.log:\d+ \(an INIT line\): rank 0 holds communicator 0x9999 twice"):
        read_traces([write(tmp_path, "nccl.log", lines)])


def test_long_lines_cost_their_length_not_its_square(tmp_path):
    """A 60 KB line of name characters took 48 s (the prefix's host tried at every character) and one of INIT
    fields 1.5 s (issue 48, item 17); a line past MAX_LINE_CHARS is passed over unread. Each line is read as
    the good log's lines are."""
    import time

    from commbench.proxies.traces.nccl_log import MAX_LINE_CHARS

    hostile = ["a" * 60000, "node0:101:1 [0] NCCL INFO " + "comm 0x1 rank 1 nranks 1 " * 2400,
               "b" * (3 * MAX_LINE_CHARS) + " " + coll(0, "AllReduce", 9, 8, 7, "0x555000000", 4)]
    started = time.perf_counter()
    good = four_rank_log()
    job = read_traces([write(tmp_path, "nccl.log", [good[0], hostile[0], *good[1:], *hostile[1:]])])
    assert time.perf_counter() - started < 3.0
    assert job == read_traces([write(tmp_path, "good.log", good)])


def test_a_named_pipe_is_refused_at_once(tmp_path):
    """Was read forever, waiting for a writer (issue 48, item 17)."""
    import os

    fifo = tmp_path / "nccl.log"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="nccl.log: not a regular file"):
        read_traces([str(fifo)])
