"""Training setups from the command line, as users spell them on proxy, train, predict-scaling and check:
the replay of a sharded setup on 2 gloo ranks, the sim proxy, acc_ratio between setups, check on a setup's
replay, and bad setups refused in one line (exit 2)."""
import json

import pytest
from conftest import commbench

from commbench.proxies import setups as S
from commbench.proxies.profile import load_profile
from commbench.results import read_records

FAST = ["--batch", "1", "--steps", "2", "--warmup-steps", "1"]


def _records(path, kind):
    return [r for r in read_records(str(path)) if r["record"] == kind]


@pytest.mark.parametrize("setup", ["fsdp-grad-op", "ddp"])  # plain DDP's no_sync micro-steps too (issue 23)
def test_replay_of_a_setup_issues_the_plans_calls_and_records_its_setup(tmp_path, setup):
    out = tmp_path / "f.jsonl"
    proc = commbench("proxy", "resnet18", "--nprocs", "2", *FAST, "--tflops", "0.05", "--setup", setup,
                     "--accumulate", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"setup {setup}" in proc.stdout
    header, (summary,), steps = _records(out, "header")[0], _records(out, "proxy"), _records(out, "step")
    assert summary["setup"] == setup and summary["knobs"]["accumulate"] == 2
    plan = S.settle(setup, {"accumulate": 2}).plan(load_profile("resnet18"), S.Compute(1, 1),
                                                             S.Placement(1, 2, "cpu"))
    expected = [{"collective": c, "group": g, "calls": n, "nbytes": b} for (c, g), (n, b) in plan.bytes_by().items()]
    assert header["calls"]["by_collective"] == expected
    for step in steps:  # two micro-steps of emulated compute, each at the profile's FLOPs
        assert step["compute_us"] + step["exposed_comm_us"] + step["other_us"] == pytest.approx(step["step_us"])
    assert summary["compute_us_p50"] == pytest.approx(2 * (3.628 + 7.020) * 1e9 / 0.05e12 * 1e6, rel=2e-2)


def test_sim_proxy_and_predict_scaling_agree_and_compare_setups(tmp_path):
    sim = tmp_path / "sim.jsonl"
    proc = commbench("proxy", "gpt2", "--hw", "dgx-a100", "--nodes", "2", "--gpus-per-node", "8", "--tflops", "100",
                     "--setup", "fsdp-hybrid", "--json", str(sim))
    assert proc.returncode == 0, proc.stderr
    (summary,) = _records(sim, "proxy")
    assert summary["kind"] == "predicted" and summary["setup"] == "fsdp-hybrid"
    scaling = tmp_path / "s.jsonl"
    proc = commbench("predict-scaling", "gpt2", "--hw", "dgx-a100", "--gpus", "16", "--gpus-per-node", "8",
                     "--tflops", "100", "--baseline-setup", "ddp", "--candidate-setup", "fsdp-hybrid",
                     "--json", str(scaling))
    assert proc.returncode == 0, proc.stderr
    rows = {r["setup"]: r for r in _records(scaling, "scaling") if r["gpus"] == 16}
    assert rows["fsdp-hybrid"]["step_us"] == pytest.approx(summary["step_us_p50"], rel=1e-9)
    assert rows["fsdp-hybrid"]["acc_ratio"] == pytest.approx(
        rows["fsdp-hybrid"]["samples_per_s"] / rows["ddp"]["samples_per_s"])
    assert rows["fsdp-hybrid"]["baseline"] == "ddp" and rows["fsdp-hybrid"]["candidate"] == "fsdp-hybrid"


def test_accumulation_counts_every_micro_steps_samples(tmp_path):
    out = tmp_path / "a.jsonl"
    proc = commbench("predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8", "--tflops", "100",
                     "--accumulate", "4", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (row,) = _records(out, "scaling")
    assert row["samples_per_s"] == pytest.approx(32 * 4 * 8 / (row["step_us"] * 1e-6))
    assert row["knobs"]["accumulate"] == 4


@pytest.mark.parametrize("args,message", [
    (["proxy", "resnet18", "--setup", "zero3"], "unknown setup 'zero3'"),
    (["proxy", "resnet18", "--setup", "fsdp-full", "--bucket-mb", "5"], "no knob --bucket-mb"),
    (["proxy", "resnet18", "--setup", "ddp", "--prefetch", "1"], "no knob --prefetch"),
    (["proxy", "resnet18", "--accumulate", "0"], "--accumulate 0"),
    (["proxy", "resnet18", "--setup", "fsdp-full", "--backend", "shm"], "replay it on --backend torch"),
    (["proxy", "resnet18", "--setup", "fsdp-full", "--shard-group", "node", "--hw", "dgx-a100", "--nodes", "2",
      "--gpus-per-node", "3", "--tflops", "1", "--backend", "sim"], None),
    (["predict-scaling", "resnet18", "--hw", "dgx-a100", "--setup", "apex", "--fusion-mb", "3"], "no knob --fusion-mb"),
    (["predict-scaling", "resnet18", "--hw", "dgx-a100", "--baseline-setup", "ddp"], "go together"),
])
def test_bad_setups_end_in_one_line(args, message):
    proc = commbench(*args)
    if message is None:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_check_predicts_a_setups_replay_with_its_own_plan(tmp_path):
    """A replay record of fsdp-full is predicted as fsdp-full (its own plan, more calls than DDP's), with the
    compute split its header gives."""
    from commbench.analysis.check import check
    from commbench.analysis.scaling import StepQuestion, predict_step, split_compute
    from commbench.costmodel import load_hardware
    from commbench.topology import Topology

    sim = tmp_path / "sim.jsonl"
    assert commbench("proxy", "bert-base", "--hw", "dgx-a100", "--nodes", "2", "--gpus-per-node", "8", "--tflops",
                     "100", "--setup", "fsdp-full", "--json", str(sim)).returncode == 0
    records = read_records(str(sim))
    (header,) = [r for r in records if r["record"] == "header"]
    (summary,) = [r for r in records if r["record"] == "proxy"]
    replay = {**summary, "kind": "proxy", "backend": "torch"}  # the sim's record standing in for a replay
    hw = load_hardware("dgx-a100")
    rows, _ = check([header, replay], hw)
    step = next(r for r in rows if r.what == "step")
    topo = Topology(2, 8)
    q = StepQuestion(load_profile("bert-base"), 4, split_compute(header["compute_split_us"]), S.settle("fsdp-full"),
                     "ring")
    expected = predict_step(q, topo, hw).times.step_us
    assert "fsdp-full" in step.setup and step.predicted_us == pytest.approx(expected, rel=1e-9)
    as_ddp, _ = check([header, {**replay, "setup": "ddp", "knobs": None}], hw)
    assert next(r for r in as_ddp if r.what == "step").predicted_us < step.predicted_us
    json.dumps([r.to_json() for r in rows])
