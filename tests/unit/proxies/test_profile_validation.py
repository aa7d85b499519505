"""Bad profile files and absurd compute rates: one validation (proxies/profile.py) for every
command that reads a profile, one line naming the file and the field, exit 2, nothing started."""
import json
import os

import pytest
from conftest import commbench

from commbench.proxies import profile as profile_module
from commbench.proxies.profile import ProfileError, load_profile, profile_from_dict


@pytest.fixture(scope="module")
def good():
    return load_profile("tts_angular").to_dict()


def _with(good, **changes):
    return {**good, **changes}


def _tensor(good, index, position, value):
    tensors = [list(row) for row in good["tensors"]]
    tensors[index][position] = value
    return _with(good, tensors=tensors)


def _unit(good, index, position, value):
    units = [list(row) for row in good["units"]]
    units[index][position] = value
    return _with(good, units=units)


@pytest.mark.parametrize("change,message", [
    (lambda g: _with(g, backward_flops=1e400), r"'backward_flops' is inf; it must be a finite number"),
    (lambda g: _with(g, forward_flops=-1.0), r"'forward_flops' is -1.0"),
    (lambda g: _with(g, forward_flops=1e30), r"'forward_flops' is 1e\+30; it must be a finite number from 0 to 1e\+21"),
    (lambda g: _with(g, forward_flops=True), r"'forward_flops' must be a number, not True"),
    (lambda g: _with(g, forward_flops="9"), r"'forward_flops' must be a number, not '9'"),
    (lambda g: _with(g, default_batch=0), r"'default_batch' is 0; it must be an integer from 1"),
    (lambda g: _with(g, default_batch=2.5), r"'default_batch' is 2.5"),
    (lambda g: _with(g, default_batch=10**9), r"'default_batch' is 1000000000"),
    (lambda g: _with(g, input_shape=[3, "224"]), r"'input_shape' is '224'"),
    (lambda g: _with(g, input_shape=[1] * 9), r"'input_shape' has 9 dimensions; at most 8"),
    (lambda g: _with(g, input_shape=[3, 0]), r"'input_shape' is 0"),
    (lambda g: _with(g, schema=5), r"schema 5; this commbench reads schema 1, 2, 3 and 4"),
    (lambda g: _with(g, schema=True), r"schema True; this commbench reads schema 1, 2, 3 and 4"),
    (lambda g: _with(g, name="\x1b]0;owned\x07"), r"'name' holds control characters"),
    (lambda g: _with(g, name=""), r"'name' must be a non-empty string"),
    (lambda g: _with(g, sample_unit=["images"]), r"'sample_unit' must be a non-empty string"),
    (lambda g: _with(g, source=[1]), r"'source' must be an object"),
    (lambda g: _with(g, source={"note": {"nested": 1}}), r"'source.note' must hold text, finite numbers"),
    (lambda g: _with(g, source={"note": "a\x1b[2Jb"}), r"'source.note' holds control characters"),
    (lambda g: _with(g, tensors=[["w", [10**8, 10**8], "float32", 0.0, 0]], parameters=10**16),
     r"the tensors hold 1e\+16 parameters; a profile holds at most 1e\+14"),
    (lambda g: _tensor(g, 0, 1, [2.5, 3]), r"tensors\[0\] \(layers.0.lstm.weight_ih_l0\) shape' is 2.5"),
    (lambda g: _tensor(g, 0, 1, [-1]), r"shape' is -1"),
    (lambda g: _tensor(g, 0, 1, [1] * 9), r"shape' has 9 dimensions"),
    (lambda g: _tensor(g, 0, 3, float("nan")), r"ready_flops' is nan"),
    (lambda g: _tensor(g, 0, 3, g["backward_flops"] * 2), r"ready_flops .* is more than the backward's"),
    (lambda g: _tensor(g, 0, 4, True), r"ready_index' is True"),
    (lambda g: _tensor(g, 0, 0, "w\nx"), r"'tensors\[0\] name' holds control characters"),
    (lambda g: _with(g, parameters=True), r"'parameters' says True"),
    (lambda g: _with(g, units="layers"), r"'units' must be a list"),
    (lambda g: _with(g, units=[["layers.0"]]),
     r"units\[0\]: expected \[name, tensors, forward_flops, backward_flops\]"),
    (lambda g: _unit(g, 0, 1, [0, 1, 99]), r"units\[0\] \('layers.0'\): tensor index 99 is not one of the "
                                           r"profile's tensors \(0..14\)"),
    (lambda g: _unit(g, 0, 1, [0, 1.5]), r"tensor index 1.5 is not one of"),
    (lambda g: _unit(g, 1, 1, [5, 6, 7, 8, 9, 0]), r"tensors\[0\] \(layers.0.lstm.weight_ih_l0\) is in two units, "
                                                   r"'layers.0' and 'layers.1'"),
    (lambda g: _unit(g, 0, 1, [0, 0, 1, 2, 3, 4]), r"tensors\[0\] \(layers.0.lstm.weight_ih_l0\) is twice in unit"),
    (lambda g: _unit(g, 0, 1, [1, 2, 3, 4]), r"tensor layers.0.lstm.weight_ih_l0 in no unit; every tensor belongs"),
    (lambda g: _unit(g, 0, 1, []), r"tensor layers.0.lstm.weight_ih_l0 and 4 more in no unit"),
    (lambda g: _unit(g, 1, 0, "layers.0"), r"unit 'layers.0' is listed twice"),
    (lambda g: _unit(g, 0, 0, "layers\x1b[2J"), r"'units\[0\] name' holds control characters"),
    (lambda g: _unit(g, 0, 2, -1.0), r"'units\[0\] \('layers.0'\) forward_flops' is -1.0"),
    (lambda g: _unit(g, 2, 3, float("nan")), r"'units\[2\] \('layers.2'\) backward_flops' is nan"),
    (lambda g: _unit(g, 2, 3, 0.0), r"the units' backward_flops add up to .*, the profile's backward_flops is"),
])
def test_a_bad_field_is_one_line_naming_it(good, change, message):
    with pytest.raises(ProfileError, match=message) as caught:
        profile_from_dict(change(good), "p.json")
    assert str(caught.value).startswith("p.json: ") and "\n" not in str(caught.value)


def _traced(good, **changes):
    """tts_angular as a traced profile (FLOPs 0, no units), its `traced` block changed."""
    count = len(good["tensors"])
    traced = {"device": "NVIDIA H100 80GB HBM3", "batch": 8, "forward_us": 100.0, "backward_us": 200.0,
              "ready_us": [200.0 * (count - i) / count for i in range(count)], **changes}
    tensors = [[name, shape, dtype, 0.0, ready] for name, shape, dtype, _, ready in good["tensors"]]
    return _with(good, forward_flops=0.0, backward_flops=0.0, tensors=tensors, units=[], traced=traced)


def test_a_traced_profile_loads_with_its_compute_as_time(good):
    profile = profile_from_dict(_traced(good), "p.json")
    assert profile.compute_work() == (100.0, 200.0) and profile.traced.times_us(4) == (400.0, 800.0)
    first = profile.ready_order()[0]
    assert profile.ready_share(first) == profile.traced.ready_us[first] / 200.0
    assert profile_from_dict(good, "p.json").traced is None  # a profile of FLOPs has none


@pytest.mark.parametrize("change,message", [
    (lambda g: _with(_traced(g), traced=[1]), r"'traced' must be an object"),
    (lambda g: _traced(g, forward_us=-1.0), r"'traced.forward_us' is -1.0"),
    (lambda g: _traced(g, backward_us=float("inf")), r"'traced.backward_us' is inf"),
    (lambda g: _traced(g, batch=0), r"'traced.batch' is 0"),
    (lambda g: _traced(g, device="gpu\x1b[2J"), r"'traced.device' holds control characters"),
    (lambda g: _traced(g, ready_us=[1.0]), r"'traced.ready_us' has 1 entries for 15 tensors"),
    (lambda g: _traced(g, ready_us=[500.0] * 15), r"'traced.ready_us\[0\] \(layers.0.lstm.weight_ih_l0\)' is 500.0; "
                                                   r"it must be a finite number from 0 to 200"),
    (lambda g: _with(_traced(g), traced={"device": "x"}), r"'traced.forward_us' must be a number, not None"),
])
def test_a_bad_traced_compute_is_one_line_naming_it(good, change, message):
    with pytest.raises(ProfileError, match=message) as caught:
        profile_from_dict(change(good), "p.json")
    assert str(caught.value).startswith("p.json: ") and "\n" not in str(caught.value)


def test_too_many_units(good, monkeypatch):
    monkeypatch.setattr(profile_module, "MAX_UNITS", 2)  # the real bound, 1,000,000, the same way
    with pytest.raises(ProfileError, match="p.json: 3 units; a profile holds at most 2"):
        profile_from_dict(good, "p.json")


def test_every_shipped_profile_passes(good):
    from commbench.proxies.profile import shipped

    assert len([load_profile(name) for name in shipped()]) == 27
    assert profile_from_dict(good, "x").name == "tts_angular"


@pytest.mark.parametrize("word", ["Infinity", "-Infinity", "NaN"])
def test_non_finite_json_constants_are_refused_as_read(tmp_path, good, word):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(good).replace(f'"backward_flops": {good["backward_flops"]}',
                                             f'"backward_flops": {word}'))
    with pytest.raises(ProfileError, match=f"holds {word}; numbers in a profile must be finite"):
        load_profile(str(path))


def test_what_is_not_a_profile_file(tmp_path, monkeypatch):
    with pytest.raises(ProfileError, match="not a regular file"):
        load_profile(str(tmp_path))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ProfileError, match="not a regular file"):  # and does not block waiting for a writer
        load_profile(str(fifo))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ProfileError, match="deep.json: not a profile"):
        load_profile(str(deep))
    digits = tmp_path / "digits.json"
    digits.write_text('{"forward_flops": ' + "9" * 5000 + "}")
    with pytest.raises(ProfileError, match="digits.json: not a profile"):
        load_profile(str(digits))
    big = tmp_path / "big.json"
    big.write_text(" " * 1001)
    monkeypatch.setattr(profile_module, "MAX_FILE_BYTES", 1000)  # the real bound, 256 MiB, the same way
    with pytest.raises(ProfileError, match="big.json: larger than 1,000 bytes: not a profile"):
        load_profile(str(big))


@pytest.fixture
def infinite(tmp_path, good):
    path = tmp_path / "inf.json"
    path.write_text(json.dumps(good).replace(f'"backward_flops": {good["backward_flops"]}',
                                             '"backward_flops": Infinity'))
    return str(path)


@pytest.mark.parametrize("args", [
    ["proxy", "{}", "--nprocs", "2", "--tflops", "10"], ["train", "{}", "--nprocs", "2"], ["profiles", "show", "{}"],
    ["profiles", "show", "{}", "--buckets"], ["predict-scaling", "{}", "--hw", "dgx-a100", "--tflops", "100"],
])
def test_every_command_that_reads_a_profile_refuses_it(infinite, args):
    proc = commbench(*[arg.format(infinite) for arg in args], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"commbench: error: {infinite}: holds Infinity; numbers in a profile must be finite"


@pytest.mark.parametrize("args,message", [
    (["proxy", "resnet50", "--nprocs", "2", "--tflops", "1e-12"],
     "--tflops 1e-12: one step of resnet50 (batch 32, 2.43e+10 FLOP per sample forward and backward) computes "
     "for 7.78e+11 s, longer than --timeout 300 s"),
    (["proxy", "resnet50", "--nprocs", "2", "--tflops", "0.01", "--batch", "64", "--timeout", "60"],
     "computes for 156 s, longer than --timeout 60 s"),
    (["proxy", "resnet50", "--nodes", "2", "--hw", "dgx-a100", "--tflops", "1e-300"],
     "computes for 7.78e+299 s, longer than a day"),
    (["predict-scaling", "resnet50", "--hw", "dgx-a100", "--tflops", "1e-300"],
     "--tflops 1e-300: must be at least 1e-09"),
    (["predict-scaling", "resnet50", "--hw", "dgx-a100", "--tflops", "1e-8"],
     "compute per step from the profile's FLOPs at 1e-08 TFLOP/s: 7.78e+07 s; it must be more than 0 s and at "
     "most a day"),
    (["predict-scaling", "resnet50", "--hw", "dgx-a100", "--throughput-1gpu", "1e-300"],
     "(3.2e+304 ms/step): 3.2e+301 s; it must be more than 0 s and at most a day"),
])
def test_absurd_compute_times_are_refused_up_front(tmp_path, args, message):
    out = tmp_path / "out.jsonl"
    proc = commbench(*args, "--json", str(out), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("throughput,tflops", [(float("inf"), None), (None, float("inf")), (1e-300, None)])
def test_predict_scaling_refuses_a_step_of_no_time_or_centuries(throughput, tflops):
    """An infinite rate made the step 0 s and every speed-up 0/0 (ZeroDivisionError); whatever the
    options let through, the prediction itself refuses it in one line."""
    from commbench.analysis.predict_scaling import Curves, compute_us, scaling_run
    from commbench.analysis.scaling import ScalingError, StepQuestion
    from commbench.costmodel import load_hardware
    from commbench.proxies.setups import settle

    profile, hw = load_profile("resnet50"), load_hardware("dgx-a100")
    forward, backward, label = compute_us(profile, hw, 32, throughput, tflops, "fp32")
    with pytest.raises(ScalingError, match=r"compute per step from .*; it must be more than 0 s and at most a day"):
        scaling_run(StepQuestion.ddp(profile, 32, forward, backward, compute_label=label), hw, [1, 8], 8,
                    Curves(((settle("ddp"), "ring"),)))


@pytest.mark.parametrize("spec,args,message", [
    ("transformers:BertForMaskedLM:num_hidden_layers=x", [], "bad override 'num_hidden_layers=x': a value is a number, "
                                                             "true or false"),
    ("transformers:BertForMaskedLM:num_hidden_layers=1e999", [], "bad override 'num_hidden_layers=1e999': a value must "
                                                                 "be a finite number"),
    ("timm:hf-hub:x/y", [], "timm:hf-hub:x/y: give a model timm registers by a plain name (no hub prefix, no path): "
                            "nothing is downloaded"),
    ("resnet18", ["--input-shape", "-1,2"], "--input-shape '-1,2': each dimension at least 1, at most 67,108,864 "
                                            "elements a sample"),
])
def test_extract_refuses_a_spec_it_cannot_build_in_one_line(tmp_path, capsys, spec, args, message):
    """Issue 26: a string override was a traceback, timm's hub prefix went to the network for 30 s, and a
    negative input shape was ignored."""
    from commbench.cli import main

    out = tmp_path / "p.json"
    assert main(["profiles", "extract", spec, "-o", str(out), *args]) == 2
    assert capsys.readouterr().err == f"commbench: error: {message}\n" and not out.exists()
