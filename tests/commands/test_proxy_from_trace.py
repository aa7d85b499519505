"""`commbench profiles extract --from-trace` as users run it: a profile of a traced DDP job that
`profiles show --buckets` lays out as DDP did, and bad input in one line."""
from conftest import DATA, commbench

DDP0 = str(DATA / "traces" / "ddp_2rank_gloo_rank0.json.gz")


def test_extract_from_trace_then_show_buckets(tmp_path):
    out = tmp_path / "mine.json"
    proc = commbench("profiles", "extract", "--from-trace", DDP0, "--batch", "32", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    shown = commbench("profiles", "show", str(out), "--buckets")
    assert shown.returncode == 0, shown.stderr
    assert "2 bucket(s), 4,202,496 bytes" in shown.stdout


def test_extract_from_a_file_that_is_no_trace_is_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2")
    proc = commbench("profiles", "extract", "--from-trace", str(bad), "-o", str(tmp_path / "o.json"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.json").exists()


def _edited(tmp_path, edit):
    import gzip
    import json

    data = json.load(gzip.open(DDP0, "rt"))
    edit(data["traceEvents"])
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    return str(path)


def _nccl_events(events):
    """The record_param_comms event ProcessGroupNCCL writes inside each c10d op (every GPU trace has them)."""
    for e in [e for e in events if e.get("name") == "c10d::allreduce_"]:
        n = e["args"]["Input Dims"][0][0][0]
        events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": e["pid"], "tid": e["tid"],
                       "ts": e["ts"] + 1.0, "dur": 5.0, "args": {
                           "Collective name": "allreduce", "dtype": "Float", "In msg nelems": n, "Out msg nelems": n,
                           "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}})


def test_extract_from_a_trace_with_record_param_comms(tmp_path):
    """Was `KeyError: 'name'` and a traceback (issue 48)."""
    out = tmp_path / "mine.json"
    proc = commbench("profiles", "extract", "--from-trace", _edited(tmp_path, _nccl_events), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "1,050,624 parameters in 8 tensors" in proc.stdout


def test_extract_refuses_a_negative_gradient_shape_in_one_line(tmp_path):
    """Was a profile of -2,097,152 parameters, written (issue 48)."""
    def negative(events):
        next(e for e in events if e.get("name") == "torch::autograd::AccumulateGrad")["args"]["Input Dims"] = \
            [[-512, 4096]]
    path, out = _edited(tmp_path, negative), tmp_path / "o.json"
    proc = commbench("profiles", "extract", "--from-trace", path, "-o", str(out))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{path}: event " in proc.stderr and "torch::autograd::AccumulateGrad" in proc.stderr
    assert "'Input Dims' is -512" in proc.stderr and not out.exists()
