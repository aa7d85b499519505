"""proxies/traces/torch_profiler.py and traces/files.py on real profiler traces (tests/data/traces/, captured with
benchmarks/capture_trace.py on 2 CPU ranks over gloo) and on record_param_comms events as ProcessGroupNCCL
writes them (torch/csrc/distributed/c10d/ParamCommsUtils.hpp's argument names)."""
import gzip
import json
import math

import pytest
from conftest import DATA

from commbench.proxies.traces import chrome_json as trace_json
from commbench.proxies.traces.calls import TraceError
from commbench.proxies.traces.files import read_traces, table_rows

TRACES = DATA / "traces"
DDP = [str(TRACES / f"ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]
FSDP = [str(TRACES / f"fsdp2_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]
DDP4 = [str(TRACES / f"ddp1bucket_4rank_gloo_rank{r}.json.gz") for r in range(4)]  # bucket_cap_mb=100
WIDTH_DDP, LAYERS_DDP = 512, 4  # the captured models: Linear(width, width) + ReLU, layers times
LAYER_FSDP_BYTES = (256 * 256 + 256) * 4


def test_ddp_trace_gives_every_gradient_byte_once_per_step_in_default_buckets():
    job = read_traces(DDP)
    assert job.world == 2 and [r.rank for r in job.ranks] == [0, 1]
    gradient_bytes = LAYERS_DDP * (WIDTH_DDP * WIDTH_DDP + WIDTH_DDP) * 4
    for rank in job.ranks:
        assert len(rank.steps) == 2
        for step in rank.steps:
            assert {c.collective for c in step.calls} == {"allreduce"}
            assert sum(c.nbytes for c in step.calls) == gradient_bytes
            assert step.calls[0].nbytes <= (1 << 20) + 4 * WIDTH_DDP  # DDP's first bucket: 1 MiB
            assert all(c.group == (0, 1) and c.dtype == "float32" and c.time_us > 0 for c in step.calls)
            assert 0 < step.compute_us < step.step_us and [c.issue_us for c in step.calls] == sorted(
                c.issue_us for c in step.calls)


def test_one_bucket_on_four_ranks_carries_every_gradient_in_one_allreduce():
    job = read_traces(DDP4)
    assert job.world == 4 and job.groups() == [(0, 1, 2, 3)]
    for rank in job.ranks:
        for step in rank.steps:
            (only,) = step.calls
            assert only.nbytes == LAYERS_DDP * (WIDTH_DDP * WIDTH_DDP + WIDTH_DDP) * 4


def test_ddp_trace_waits_for_its_last_bucket_before_the_optimizer():
    job = read_traces(DDP)
    for rank in job.ranks:
        for step in rank.steps:
            last = step.calls[-1]
            assert last.progress_us <= last.needed_us < step.compute_us  # the step waited for it
            assert last.exposed_us > 0


def test_fsdp2_trace_gathers_each_layer_and_scatters_each_gradient_once():
    job = read_traces(FSDP)
    for rank in job.ranks:
        for step in rank.steps:
            scatters = [c for c in step.calls if c.collective == "reduce_scatter"]
            gathers = [c for c in step.calls if c.collective == "allgather"]
            assert len(scatters) == 3 and len(gathers) >= 3
            assert {c.nbytes for c in step.calls} == {LAYER_FSDP_BYTES}
            assert step.calls[0].collective == "allgather" and not math.isinf(step.calls[0].needed_us)


def test_table_sums_calls_per_collective_and_size():
    job = read_traces(FSDP)
    rows = table_rows(job)
    calls = [c for s in job.ranks[0].steps for c in s.calls]
    assert sum(r.calls for r in rows) == len(calls)
    assert {r.collective for r in rows} == {"allgather", "reduce_scatter"}
    for row in rows:
        assert row.busbw_gbps > 0 and 0 < row.share < 1 and row.exposed_us >= 0 and row.overlapped_us >= 0


def test_small_chunks_read_the_same_calls(monkeypatch):
    whole = read_traces(DDP)
    monkeypatch.setattr(trace_json, "CHUNK_CHARS", 7)
    assert read_traces(DDP) == whole


def _plain(tmp_path, source, name, edit=None):
    text = gzip.open(source, "rt").read()
    path = tmp_path / name
    path.write_text(edit(text) if edit else text)
    return str(path)


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_truncated_trace_is_one_error(tmp_path, cut):
    bad = _plain(tmp_path, DDP[1], "rank1.json", lambda t: t[:int(len(t) * cut)])
    with pytest.raises(TraceError, match="truncated|ends"):
        read_traces([DDP[0], bad])


def test_unknown_schema_version_is_named(tmp_path):
    bad = _plain(tmp_path, DDP[0], "rank0.json", lambda t: t.replace('"schemaVersion": 1', '"schemaVersion": 9', 1))
    with pytest.raises(TraceError, match="schemaVersion 9"):
        read_traces([bad, DDP[1]])


def test_a_missing_or_doubled_rank_is_named(tmp_path):
    with pytest.raises(TraceError, match="no trace of rank.* 1"):
        read_traces(DDP[:1])
    with pytest.raises(TraceError, match="given twice"):
        read_traces([DDP[0], DDP[0]])
    copy = tmp_path / "copy.json.gz"
    copy.write_bytes(open(DDP[0], "rb").read())
    with pytest.raises(TraceError, match="second trace of rank 0"):
        read_traces([DDP[0], str(copy)])
    (tmp_path / "link.json.gz").symlink_to(DDP[0])  # one file by two names (issue 48, item 21)
    with pytest.raises(TraceError, match="link.json.gz: the same file as .*rank0.json.gz"):
        read_traces([DDP[0], str(tmp_path / "link.json.gz")])


def test_traces_of_different_jobs_disagree(tmp_path):
    with pytest.raises(TraceError, match="disagree|different numbers"):
        read_traces([DDP[0], FSDP[1]])


def _param_event(ts, name, nelems_in, nelems_out, ranks, pg, dtype="Float", dur=10.0):
    text = "[" + ", ".join(map(str, ranks)) + "]"
    if len(ranks) > 30:  # torch writes the first 29 and the last
        text = "[" + ", ".join(map(str, ranks[:29])) + ", ..., " + str(ranks[-1]) + "]"
    return {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {"Collective name": name, "dtype": dtype, "In msg nelems": nelems_in,
                     "Out msg nelems": nelems_out, "Group size": len(ranks), "Process Group Name": pg,
                     "Process Group Ranks": text, "Rank": 0}}


def _nccl_like_trace(path, rank, world=4):
    """A rank of a 2-D job: an allreduce on its pair {0,1} or {2,3}, and an all-gather on all ranks."""
    pair = [0, 1] if rank < 2 else [2, 3]
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0.0,
               "dur": 1000.0},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
              _param_event(100.0, "allreduce", 256, 256, pair, "1", "BFloat16"),
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 120.0, "dur": 300.0},
              _param_event(420.0, "_allgather_base", 64, 64 * world, list(range(world)), "0"),
              {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, "tid": 7,
               "ts": 105.0, "dur": 50.0},
              {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "pid": 0, "tid": 8,
               "ts": 430.0, "dur": 40.0}]
    trace = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
             "traceEvents": events}
    path.write_text(json.dumps(trace))
    return str(path)


def test_record_param_comms_give_groups_sizes_and_kernel_times(tmp_path):
    paths = [_nccl_like_trace(tmp_path / f"r{r}.json", r) for r in range(4)]
    job = read_traces(paths)
    assert job.groups() == [(0, 1), (2, 3), (0, 1, 2, 3)]
    (step,) = job.ranks[2].steps
    reduce, gather = step.calls
    assert (reduce.collective, reduce.nbytes, reduce.dtype, reduce.group) == ("allreduce", 512, "bfloat16", (2, 3))
    assert (gather.collective, gather.nbytes, gather.group) == ("allgather", 64 * 4 * 4, (0, 1, 2, 3))
    assert reduce.time_us == 50.0 and gather.time_us == 40.0
    assert reduce.progress_us == pytest.approx(100.0) and gather.progress_us == pytest.approx(400.0)


def test_group_ranks_cut_short_by_torch_are_completed(tmp_path):
    from commbench.proxies.traces.torch_profiler import _ranks

    ranks = list(range(0, 128, 2))
    args = _param_event(0, "allreduce", 1, 1, ranks, "0")["args"]
    assert "..." in args["Process Group Ranks"]
    assert _ranks(args, "x") == tuple(ranks)


def test_damaged_traces_are_read_or_refused_in_one_line(tmp_path):
    """Random edits of a real trace's text: each is read, or refused with a TraceError, never another error."""
    import random

    text = gzip.open(DDP[1], "rt").read()
    rng = random.Random(7)
    for trial in range(40):
        chars = list(text)
        for _ in range(rng.randint(1, 5)):
            at = rng.randrange(len(chars))
            chars[at] = rng.choice(['"', "}", "]", ",", "x", "1", "-", " ", "[", "{"])
        path = tmp_path / f"rank1_{trial}.json"
        path.write_text("".join(chars))
        try:
            read_traces([DDP[0], str(path)])
        except TraceError as exc:
            assert str(exc) and "\n" not in str(exc)


@pytest.mark.parametrize("change,field", [
    ({"In msg nelems": -256}, "'In msg nelems' is -256"),
    ({"Out msg nelems": 1e30}, "'Out msg nelems' is 1e+30"),
    ({"In msg nelems": float("nan")}, "'In msg nelems' is nan"),
    ({"Group size": True}, "'Group size' is True"),
    ({"Process Group Ranks": "[0, 0]"}, "name a rank twice"),
    ({"Process Group Ranks": "[-1, 0]"}, "'Process Group Ranks' is -1"),
    ({"Process Group Ranks": "[0, " + "9" * 5000 + "]"}, "'Process Group Ranks' is '99999"),
    ({"dtype": {"a": 1}}, "a call of dtype {'a': 1}"),
])
def test_record_param_comms_fields_out_of_range_are_one_line_naming_the_event(tmp_path, change, field):
    """Was a negative size replayed by the ranks, a group [0, 0] accepted, or a traceback (issue 48)."""
    paths = [_nccl_like_trace(tmp_path / f"r{r}.json", r) for r in range(4)]
    data = json.loads((tmp_path / "r2.json").read_text())
    data["traceEvents"][2]["args"].update(change)
    (tmp_path / "r2.json").write_text(json.dumps(data))
    with pytest.raises(TraceError) as caught:
        read_traces(paths)
    said = str(caught.value)
    assert said.startswith(f"{paths[2]}: event 2 ('record_param_comms')") and field in said, said


@pytest.mark.parametrize("info,field", [
    ({"rank": 0, "world_size": float("inf")}, "'world_size' is inf"),
    ({"rank": 0, "world_size": 10 ** 12}, "'world_size' is 1000000000000"),
    ({"rank": -1, "world_size": 4}, "'rank' is -1"),
    ({"rank": 4, "world_size": 4}, "rank 4 of a job of 4 rank(s)"),
])
def test_distributed_info_out_of_range_is_one_line(tmp_path, info, field):
    path = _nccl_like_trace(tmp_path / "r0.json", 0)
    data = json.loads((tmp_path / "r0.json").read_text())
    data["distributedInfo"].update(info)
    (tmp_path / "r0.json").write_text(json.dumps(data))
    with pytest.raises(TraceError, match=f"^{path}: distributedInfo: .*") as caught:
        read_traces([path])
    assert field in str(caught.value)


def test_a_rank_issuing_on_a_group_it_is_not_in_is_named(tmp_path):
    """Failed in the ranks with an AttributeError, exit 3 (issue 48, item 21)."""
    paths = [_nccl_like_trace(tmp_path / f"r{r}.json", r) for r in range(4)]
    data = json.loads((tmp_path / "r0.json").read_text())
    data["traceEvents"][2]["args"].update({"Process Group Ranks": "[2, 3]"})
    (tmp_path / "r0.json").write_text(json.dumps(data))
    with pytest.raises(TraceError, match=r"r0.json: event 2 \('record_param_comms'\): rank 0 issues a call on group "
                                         r"\[2, 3\], which it is not in"):
        read_traces(paths)


def _many_steps(path, rank, steps):
    events = []
    for k in range(steps):
        t = 200.0 * k
        events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1, "ts": t,
                    "dur": 150.0},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 40.0},
                   _param_event(t + 40.0, "allreduce", 64, 64, [0, 1], "0"),
                   {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 7,
                    "ts": t + 55.0, "dur": 30.0}]
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2},
                                "traceEvents": events}))
    return str(path)


def test_each_step_is_built_from_its_own_calls_only(tmp_path, monkeypatch):
    """Every step was given every call's issue span: steps x calls (4,000 steps 7.6 s, issue 48, item 17)."""
    from commbench.proxies.traces import torch_profiler as trace_torch

    given = []
    real = trace_torch.build_step
    monkeypatch.setattr(trace_torch, "build_step", lambda *a: given.append(len(a[4])) or real(*a))
    job = read_traces([_many_steps(tmp_path / f"r{r}.json", r, 50) for r in (0, 1)])
    assert len(job.ranks[0].steps) == 50 and all(len(s.calls) == 1 for s in job.ranks[0].steps)
    assert given == [1] * 100


def test_events_past_the_bound_are_one_line(tmp_path, monkeypatch):
    from commbench.proxies.traces import calls as trace_calls

    paths = [_many_steps(tmp_path / f"r{r}.json", r, 5) for r in (0, 1)]
    monkeypatch.setattr(trace_calls, "MAX_EVENTS", 19)
    with pytest.raises(TraceError, match="r0.json: more than 19 events"):
        read_traces(paths)


def test_a_long_value_is_decoded_a_few_times_not_once_per_chunk(tmp_path, monkeypatch):
    """A 60 MB value was decoded again after every 1 MiB chunk: 118 s (issue 48, item 17); it takes a doubling
    window, a few decodes in all. The events after it are read as before."""
    calls = []
    decoder = json.JSONDecoder

    class Counting(decoder):
        def raw_decode(self, text, index=0):
            calls.append(len(text) - index)
            return super().raw_decode(text, index)

    data = json.loads(open(_nccl_like_trace(tmp_path / "r.json", 0)).read())
    data = {"deviceProperties": [1.5] * 200_000, **data}
    (tmp_path / "r.json").write_text(json.dumps(data))
    monkeypatch.setattr(trace_json, "CHUNK_CHARS", 1000)
    monkeypatch.setattr(trace_json.json, "JSONDecoder", Counting)
    with open(tmp_path / "r.json") as handle:
        read = list(trace_json.read_chrome_trace(handle, "r.json"))
    assert read[0] == ("deviceProperties", data["deviceProperties"]) and len(read) == 3 + len(data["traceEvents"])
    assert sum(calls) < 8 * len(json.dumps(data))
