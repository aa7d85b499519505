"""proxies/traces/extracted_profile.py: a profile from a real DDP trace (tests/data/traces/, 4 x Linear(512, 512)
on 2 gloo ranks) gives back the bucket layout DDP made for the model, and the traced compute."""
import pytest
from conftest import DATA

from commbench.proxies import buckets as B
from commbench.proxies.profile import load_profile
from commbench.proxies.traces.calls import TraceError
from commbench.proxies.traces.extracted_profile import profile_from_trace
from commbench.proxies.traces.files import read_traces

DDP = [str(DATA / "traces" / f"ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]
FSDP = str(DATA / "traces" / "fsdp2_2rank_gloo_rank0.json.gz")


def test_the_profile_gives_ddps_own_buckets(tmp_path):
    profile = profile_from_trace(DDP[0], batch=32)
    path = tmp_path / "p.json"
    profile.save(str(path))
    loaded = load_profile(str(path))  # a valid profile file
    traced = [c.nbytes for c in read_traces(DDP).ranks[0].steps[0].calls]
    assert [b.nbytes for b in B.assign(loaded, None, "ddp")] == traced
    assert loaded.parameters == 4 * (512 * 512 + 512) and len(loaded.tensors) == 8
    assert sorted(t.shape for t in loaded.tensors) == sorted([(512, 512)] * 4 + [(512,)] * 4)


def test_compute_is_the_traced_busy_time_per_sample_not_flops():
    """Item 7 of issue 48: the traced time is kept as time (it was FLOPs at a fictitious 1 TFLOP/s)."""
    one, many = profile_from_trace(DDP[0], batch=1), profile_from_trace(DDP[0], batch=32)
    assert one.forward_flops == one.backward_flops == 0 and all(t.ready_flops == 0 for t in one.tensors)
    traced = one.traced
    assert traced.device == "CPU of host vm" and traced.batch == 1 and many.traced.batch == 32
    assert many.traced.forward_us == pytest.approx(traced.forward_us / 32)
    assert 0 < traced.forward_us + traced.backward_us < one.source["step_us"]
    assert one.compute_work() == (traced.forward_us, traced.backward_us)
    ready = [traced.ready_us[i] for i in one.ready_order()]
    assert ready == sorted(ready) and ready[-1] <= traced.backward_us
    assert [one.ready_share(i) for i in one.ready_order()] == [r / traced.backward_us for r in ready]


def test_the_traced_compute_survives_a_profile_file(tmp_path):
    profile = profile_from_trace(DDP[0], batch=32)
    path = tmp_path / "p.json"
    profile.save(str(path))
    assert load_profile(str(path)) == profile


def test_an_fsdp_trace_is_refused_in_one_line():
    with pytest.raises(TraceError, match="sharded"):
        profile_from_trace(FSDP)


# ---------------------------------------------------------------- NCCL's events, and crafted traces (issue 48)

def _trace(tmp_path, edit, name="crafted.json"):
    """The real DDP trace of rank 0, as a dict passed to `edit` (which changes it in place), written to a file."""
    import gzip
    import json

    data = json.load(gzip.open(DDP[0], "rt"))
    edit(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def _with_param_comms(data):
    """Inside each c10d::allreduce_, the record_param_comms event ProcessGroupNCCL writes (its argument names:
    torch/csrc/distributed/c10d/ParamCommsUtils.hpp): what every NCCL (GPU) trace holds."""
    events = data["traceEvents"]
    for e in [e for e in events if e.get("name") == "c10d::allreduce_"]:
        count = e["args"]["Input Dims"][0][0][0]
        events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": e["pid"], "tid": e["tid"],
                       "ts": e["ts"] + 1.0, "dur": 5.0,
                       "args": {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": count,
                                "Out msg nelems": count, "Group size": 2, "Process Group Name": "0",
                                "Process Group Ranks": "[0, 1]", "Rank": 0}})


def test_a_trace_with_record_param_comms_extracts_as_without(tmp_path):
    """Was `KeyError: 'name'` on every NCCL trace (issue 48)."""
    plain = profile_from_trace(DDP[0], batch=32)
    nccl = profile_from_trace(_trace(tmp_path, _with_param_comms), batch=32)
    assert [(t.shape, t.dtype, t.ready_index) for t in nccl.tensors] == \
        [(t.shape, t.dtype, t.ready_index) for t in plain.tensors]
    assert nccl.parameters == 4 * (512 * 512 + 512)


def _grads(data):
    return [e for e in data["traceEvents"] if e.get("name") == "torch::autograd::AccumulateGrad"]


def _set(events, key, value, args=False):
    def edit(data):
        for e in events(data):
            (e["args"] if args else e)[key] = value
    return edit


def _drop_name(data):
    del _grads(data)[0]["name"]


GRADS = _grads
FIRST_GRAD = lambda data: _grads(data)[:1]  # noqa: E731
FIRST_OP = lambda data: [e for e in data["traceEvents"] if e.get("ph") == "X"][:1]  # noqa: E731


@pytest.mark.parametrize("edit,field", [
    (_drop_name, "'name' is missing"),
    (_set(FIRST_GRAD, "name", 7), "'name' is 7"),
    (_set(FIRST_GRAD, "Input Dims", [[-512, 4096]], args=True), "'Input Dims' is -512"),  # was -2,097,152 parameters
    (_set(FIRST_GRAD, "Input Dims", [[2 ** 45, 2 ** 45]], args=True), "'Input Dims' is 35184372088832"),
    (_set(FIRST_GRAD, "Input Dims", [[2 ** 21, 2 ** 21, 2 ** 21]], args=True), "elements; a tensor holds at most"),
    (_set(FIRST_GRAD, "Input Dims", [[512.5]], args=True), "'Input Dims' is 512.5"),
    (_set(FIRST_GRAD, "Input Dims", [["512"]], args=True), "'Input Dims' is '512'"),
    (_set(FIRST_GRAD, "Input Dims", {"0": [512]}, args=True), "'Input Dims' is {'0': [512]}; it must be a list"),
    (_set(FIRST_GRAD, "Input type", "float", args=True), "'Input type' is 'float'"),
    (_set(FIRST_GRAD, "args", [1, 2]), "'args' is [1, 2]"),
    (_set(FIRST_OP, "dur", -5.0), "'dur' is -5.0"),
    (_set(FIRST_OP, "ts", float("inf")), "'ts' is inf"),
    (_set(FIRST_OP, "ts", float("nan")), "'ts' is nan"),
    (_set(FIRST_OP, "tid", [1]), "'tid' is [1]"),
])
def test_a_crafted_event_is_one_line_naming_the_file_the_event_and_the_field(tmp_path, edit, field):
    path = _trace(tmp_path, edit)
    with pytest.raises(TraceError) as caught:
        profile_from_trace(path, batch=32)
    said = str(caught.value)
    assert said.startswith(f"{path}: event ") and field in said and "\n" not in said, said


def test_the_profile_is_checked_as_a_profile_file_is():
    """What the trace does not give (a name, the sample unit) is checked as `load_profile` checks a file."""
    with pytest.raises(TraceError, match="'name' holds control characters"):
        profile_from_trace(DDP[0], name="mine\x1b[2J")


def test_a_trace_without_the_backwards_events_is_one_line(tmp_path):
    def drop(data):
        data["traceEvents"] = [e for e in data["traceEvents"]
                               if not str(e.get("name", "")).startswith("autograd::engine::evaluate_function")]
    with pytest.raises(TraceError, match="no autograd::engine::evaluate_function events"):
        profile_from_trace(_trace(tmp_path, drop))


def test_json_nested_too_deep_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "a", "args": ' + "[" * 5000
                    + "]" * 5000 + "}]}")
    with pytest.raises(TraceError, match="nested too deep"):
        profile_from_trace(str(path))


def test_buckets_are_ready_where_the_traced_backward_made_them_ready():
    """The traced time shares the backward out (bucket readiness, setups), as FLOPs do for other profiles."""
    from commbench.proxies.timeline import plan_step

    profile = profile_from_trace(DDP[0], batch=32)
    layout = B.assign(profile, None, "ddp")
    traced = profile.traced
    for bucket in layout:
        assert bucket.ready_flops == 0 and bucket.ready_share == max(traced.ready_us[i] for i in bucket.tensors) / \
            traced.backward_us
    plan = plan_step(profile, layout, *traced.times_us(32))
    assert plan.bucket_ready_us == pytest.approx([32 * max(traced.ready_us[i] for i in b.tensors) for b in layout])
    assert 0 < plan.bucket_ready_us[0] < plan.bucket_ready_us[-1] <= plan.backward_us
