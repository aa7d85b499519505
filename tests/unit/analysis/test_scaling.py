"""Scaling predictions: exact step values, linearity and acc_ratio, 1,000 GPUs, and the command's errors (what
one call costs: tests/unit/costmodel/test_call.py)."""
import json

import pytest
from conftest import commbench

from commbench.analysis.scaling import ScalingError, StepQuestion, layout, predict_scaling, predict_step
from commbench.costmodel import Hardware, load_hardware
from commbench.proxies.profile import Profile, TensorSpec, load_profile
from commbench.topology import Link, Topology

HW = Hardware("toy", 4, Link("nvlink", 100.0, 1.0), Link("ib", 10.0, 5.0, links_per_node=2),
              reduce_gbps=None, per_call_overhead_us=3.0)


def _toy_profile():
    tensors = (TensorSpec("w2", (250_000,), "float32", 100.0, 1), TensorSpec("w1", (250_000,), "float32", 50.0, 0))
    return Profile("toy", tensors, 100.0, 100.0, (1,), "samples", 1)


def test_predicted_step_exact_values():
    topo = Topology(1, 4)
    pred = predict_step(StepQuestion.ddp(_toy_profile(), 1, 1000.0, 1000.0, algorithm="ring", bucketing="none"),
                        topo, HW)
    comm = 6 + 1.5 * 1e6 / 1e5 + 3  # each 1 MB bucket
    assert pred.comm_us == pytest.approx([comm, comm])
    # w1 ready at 500 us into the backward (t=1500), w2 at the end (t=2000): the last allreduce ends 2000 + comm
    assert pred.times.step_us == pytest.approx(2000 + comm)
    assert pred.times.exposed_comm_us == pytest.approx(comm)


def test_linearity_and_speedup():
    q = StepQuestion.ddp(_toy_profile(), 1, 1000.0, 1000.0, algorithm="ring", bucketing="none")
    points = predict_scaling(q, HW, [1, 4, 8], 4)
    assert [p.gpus for p in points] == [1, 4, 8] and points[0].linearity == 1.0 and points[0].speedup == 1.0
    for p in points[1:]:
        assert p.linearity == pytest.approx(p.samples_per_s / (p.gpus * points[0].samples_per_s))
        assert p.speedup == pytest.approx(p.linearity * p.gpus) and p.linearity < 1
    assert points[2].nodes == 2 and points[2].gpus_per_node == 4


def test_layout_rejects_partial_nodes():
    assert layout(4, 8) == Topology(1, 4) and layout(16, 8) == Topology(2, 8)
    with pytest.raises(ScalingError, match="do not fill whole nodes"):
        layout(12, 8)


def test_a_thousand_gpus_predict():
    # the speed target (under a second) is checked by benchmarks/predict_speed.py, not here
    profile, hw = load_profile("bert-large"), load_hardware("dgx-a100")
    points = predict_scaling(StepQuestion.ddp(profile, 4, 1e4, 2e4, algorithm="hier"), hw, [1, 8, 64, 512, 1000], 8)
    assert points[-1].gpus == 1000 and points[-1].nodes == 125
    assert points[-1].linearity < points[1].linearity <= 1.0  # more nodes, more communication per step


def test_predict_scaling_command_writes_acc_ratio(tmp_path):
    out = tmp_path / "s.jsonl"
    proc = commbench("predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8,16,64", "--batch", "64",
                     "--tflops", "100", "--baseline", "nccl", "--candidate", "hier", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "nothing measured" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    base = {r["gpus"]: r for r in rows if r["algorithm"] == "nccl"}
    for r in (r for r in rows if r["algorithm"] == "hier"):
        assert r["acc_ratio"] == pytest.approx(r["samples_per_s"] / base[r["gpus"]]["samples_per_s"])


@pytest.mark.parametrize("args,message", [
    (["resnet50", "--hw", "dgx-a100", "--gpus", "12"], "do not fill whole nodes of 8"),
    (["resnet50", "--hw", "nope"], "no hardware file or preset 'nope'"),
    (["nosuch", "--hw", "dgx-a100"], "unknown model 'nosuch'"),
    (["resnet50", "--hw", "dgx-a100", "--throughput-1gpu", "0"], "--throughput-1gpu 0: must be positive"),
    (["resnet50", "--hw", "dgx-a100", "--baseline", "nccl"], "go together"),
    (["resnet50", "--hw", "dgx-a100", "--gpus", "a,b"], "expected a comma list"),
    (["resnet50", "--hw", "dgx-a100", "--algorithm", "magic"], "unknown allreduce algorithm 'magic'"),
])
def test_predict_scaling_bad_input(args, message):
    proc = commbench("predict-scaling", *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_report_draws_steps_scaling_and_acc_ratio(tmp_path):
    scaling, proxy = tmp_path / "s.jsonl", tmp_path / "p.jsonl"
    assert commbench("predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8,16,64", "--tflops", "100",
                     "--baseline", "nccl", "--candidate", "hier", "--json", str(scaling)).returncode == 0
    assert commbench("proxy", "resnet50", "--nodes", "2", "--gpus-per-node", "8", "--hw", "dgx-a100", "--tflops",
                     "100", "--json", str(proxy)).returncode == 0
    proc = commbench("report", str(scaling), str(proxy), "-o", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    for name in ("proxy_steps.png", "scaling.png", "acc_ratio.png"):
        assert (tmp_path / "r" / name).stat().st_size > 10_000
    index = (tmp_path / "r" / "index.md").read_text()
    assert "## Training steps" in index and "resnet50 predicted, 16 ranks" in index
    assert "| resnet50 | dgx-a100 | hier | 64 |" in index
