"""`commbench profiles extract --from-trace` as users run it: a profile of a traced DDP job that
`profiles show --buckets` lays out as DDP did, and bad input in one line."""
import pytest
from conftest import DATA, commbench, notes_joined

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


def test_the_traced_compute_is_time_and_predictions_use_it(tmp_path):
    """Item 7 of issue 48: extract printed "GFLOP" at a fictitious 1 TFLOP/s, and predict-scaling was right
    only with an undocumented --tflops 1. Now the profile holds the traced time, and predict-scaling and
    proxy use it (saying so), a rate given for it refused in one line."""
    import json

    out = tmp_path / "mine.json"
    proc = commbench("profiles", "extract", "--from-trace", DDP0, "--batch", "32", "--name", "mine", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "GFLOP" not in proc.stdout and "ms backward per sample as traced on CPU of host vm" in proc.stdout
    traced = json.loads(out.read_text())["traced"]
    step_ms = 32 * (traced["forward_us"] + traced["backward_us"]) / 1e3
    scaling = commbench("predict-scaling", str(out), "--hw", "dgx-h100", "--gpus", "1", "--json", str(tmp_path / "s"))
    assert scaling.returncode == 0, scaling.stderr
    said = "\n".join(notes_joined(scaling.stdout))  # a long note is broken into lines of 120 characters
    assert "compute from the time traced on CPU of host vm" in said and f"{step_ms:.1f} ms/step" in said
    (one,) = [r for r in map(json.loads, (tmp_path / "s").read_text().splitlines()) if r.get("gpus") == 1]
    assert one["step_us"] == pytest.approx(step_ms * 1e3, rel=1e-6)
    proxy = commbench("proxy", str(out), "--backend", "sim", "--hw", "dgx-h100", "-N", "8")
    assert proxy.returncode == 0 and "compute traced on CPU of host vm" in proxy.stdout, proxy.stderr
    for args, said in ((["predict-scaling", "--hw", "dgx-h100", "--gpus", "1", "--tflops", "1"], "counts no FLOPs"),
                       (["proxy", "--backend", "sim", "--hw", "dgx-h100", "-N", "8", "--tflops", "1"],
                        "--tflops: mine is a traced profile (no FLOPs, no model to run)")):
        refused = commbench(args[0], str(out), *args[1:])
        assert refused.returncode == 2 and said in refused.stderr and len(refused.stderr.splitlines()) == 1, \
            refused.stderr
