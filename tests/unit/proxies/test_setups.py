"""The setup table (proxies/setups.py) and the step it gives (proxies/comm_plan.py): each setup's calls and
bytes per step pinned exactly on small profiles, DDP's plan identical to the overlap timeline the proxy always
used, the timeline's arithmetic exact, and bad setups refused in one line."""
import math

import numpy as np
import pytest

from commbench.proxies import buckets as B
from commbench.proxies import comm_plan as P
from commbench.proxies import setups as S
from commbench.proxies import timeline as T
from commbench.proxies.profile import Profile, TensorSpec, load_profile, shipped

MB = 1 << 20


def _toy() -> Profile:
    """Two blocks and a head: forward a.0, a.1, head; backward head (ready at 20 of 100 FLOPs), a.1, a.0."""
    tensors = (TensorSpec("a.0.w", (MB // 4,), "float32", 100.0, 2),  # 1 MiB each
               TensorSpec("a.1.w", (MB // 4,), "float32", 60.0, 1),
               TensorSpec("head.w", (MB // 2,), "float32", 20.0, 0))  # 2 MiB
    return Profile("toy", tensors, 50.0, 100.0, (1,), "samples", 1)


def _calls(plan: P.CommPlan) -> list[tuple]:
    return [(c.collective, c.group, c.nbytes, c.dtype) for c in plan.comms]


@pytest.mark.parametrize("model", ["resnet50", "bert-base", "vgg16", "gpt2", "tts_angular"])
@pytest.mark.parametrize("bucket_mb", [None, 10.0, 1000.0])
def test_ddp_plan_gives_the_overlap_timeline_exactly(model, bucket_mb):
    profile = load_profile(model)
    buckets = B.assign(profile, bucket_mb)
    old = T.plan_step(profile, buckets, 1e4, 2e4, 3e3, 1.5e3)
    plan = S.settle("ddp", {"bucket_mb": bucket_mb}).plan(profile, S.Compute(1e4, 2e4, 3e3, 1.5e3), S.Placement(1, 2))
    assert [c.nbytes for c in plan.comms] == [b.nbytes for b in buckets]
    comm = [b.nbytes / 1e3 for b in buckets]
    for steal in (None, [c * 0.3 for c in comm]):
        a, b = T.overlap(old, comm, steal), P.simulate(plan, comm, steal)
        assert b.step_us == pytest.approx(a.step_us, rel=1e-12)
        assert b.exposed_comm_us == pytest.approx(a.exposed_comm_us, rel=1e-12, abs=1e-9)
        assert b.comm_us == pytest.approx(a.comm_us, rel=1e-12)
        assert b.other_us == pytest.approx(a.other_us, rel=1e-9, abs=1e-6)
    many = P.simulate_many(plan, np.array([comm, [2 * c for c in comm]]))
    assert many == pytest.approx([T.overlap(old, comm).step_us, T.overlap(old, [2 * c for c in comm]).step_us])


def test_each_setups_calls_and_bytes_per_step():
    toy, compute, layout = _toy(), S.Compute(50.0, 100.0), S.Placement(2, 2)
    f32 = "float32"

    def calls(name, **knobs):
        return _calls(S.settle(name, knobs).plan(toy, compute, layout))

    # DDP's default first bucket (1 MiB) takes the head's 2 MiB; the rest (2 MiB) is the next bucket
    assert calls("ddp") == [("allreduce", "world", 2 * MB, f32), ("allreduce", "world", 2 * MB, f32)]
    assert calls("ddp", bucket_mb=10) == [("allreduce", "world", 4 * MB, f32)]
    assert calls("ddp-fp16") == [("allreduce", "world", MB, "float16")] * 2
    assert calls("ddp-bf16", bucket_mb=10) == [("allreduce", "world", 2 * MB, "bfloat16")]
    assert calls("apex") == [("allreduce", "world", 4 * MB, f32)]  # 10M elements hold the whole toy
    assert calls("apex", message_size=MB // 4) == [("allreduce", "world", 2 * MB, f32), ("allreduce", "world", MB, f32),
                                                   ("allreduce", "world", MB, f32)]
    assert calls("zero1") == [("reduce_scatter", "world", 4 * MB, f32), ("allgather", "world", 4 * MB, f32)]
    assert calls("zero2", accumulate=3) == [("reduce_scatter", "world", 4 * MB, f32)] * 3 + [
        ("allgather", "world", 4 * MB, f32)]
    full = calls("fsdp-full")
    assert [c for c in full if c[0] == "allgather"] == [  # forward: root, a.0, a.1; backward: a.1, a.0 (root kept)
        ("allgather", "world", n, f32) for n in (2 * MB, MB, MB, MB, MB)]
    assert [c for c in full if c[0] == "reduce_scatter"] == [("reduce_scatter", "world", n, f32)
                                                              for n in (MB, MB, 2 * MB)]
    grad_op = calls("fsdp-grad-op")
    assert sum(1 for c in grad_op if c[0] == "allgather") == 3 and len(grad_op) == 6
    hybrid = S.settle("fsdp-hybrid").plan(toy, compute, layout).bytes_by()
    assert hybrid == {("allgather", "node"): (5, 6 * MB), ("reduce_scatter", "node"): (3, 4 * MB),
                      ("allreduce", "cross"): (3, 2 * MB)}  # each unit's shard (1/2 of it) across nodes


def test_accumulation_communicates_in_the_last_micro_step_only():
    toy = _toy()
    plan = S.settle("ddp", {"accumulate": 4}).plan(toy, S.Compute(50.0, 100.0, 10.0, 8.0), S.Placement(1, 2))
    assert plan.compute_us == pytest.approx(4 * 150 + 10 + 8)
    last_backward = [p for p in plan.phases if p.name == "backward"][-1]
    assert all(last_backward.start_us <= c.ready_us <= last_backward.end_us for c in plan.comms)
    assert last_backward.start_us == pytest.approx(3 * 150 + 50)


def test_horovod_fuses_what_is_ready_each_cycle():
    toy = _toy()  # backward 100 us: head ready at 20, a.1 at 60, a.0 at 100
    plan = S.settle("horovod", {"cycle_ms": 0.05}).plan(toy, S.Compute(50.0, 100.0), S.Placement(1, 2))
    # ticks every 50 us of the backward: the head at the first, a.1 at the second (the backward's end), a.0 at
    # the third, past the end: issued at the end (the timer's wait after the backward is not counted)
    assert [(c.ready_us, c.nbytes) for c in plan.comms] == [(50 + 50, 2 * MB), (50 + 100, MB), (50 + 100, MB)]
    capped = S.settle("horovod", {"cycle_ms": 1.0, "fusion_mb": 1.5}).plan(toy, S.Compute(50.0, 100.0),
                                                                           S.Placement(1, 2))
    assert [c.nbytes for c in capped.comms] == [2 * MB, 2 * MB]  # one cycle, buffers closed at >= 1.5 MiB


def test_fsdp_step_by_hand():
    """fsdp-grad-op on the toy, every call 10 us. CPU ranks: every FSDP2 call blocks where it is issued (what
    torch 2.14 does on gloo: tests/unit/proxies/test_setups_torch.py), so 3 all-gathers and 3 reduce-scatters are all
    exposed. A GPU prefetches the next unit's all-gather in the forward and runs the reduce-scatters beside the
    backward: the root's all-gather, one forward wait and the last reduce-scatter are exposed."""
    toy = _toy()
    plan = S.settle("fsdp-grad-op").plan(toy, S.Compute(50.0, 100.0), S.Placement(1, 2, "cpu"))
    times = P.simulate(plan, [10.0] * len(plan.comms))
    assert times.exposed_comm_us == pytest.approx(60.0)
    assert times.step_us == pytest.approx(150.0 + 60.0)
    gpu = S.settle("fsdp-grad-op").plan(toy, S.Compute(50.0, 100.0), S.Placement(1, 2, "cuda"))
    assert P.simulate(gpu, [10.0] * len(gpu.comms)).step_us == pytest.approx(170.0)


def test_simulate_many_is_simulate_row_by_row():
    rng = np.random.default_rng(3)
    profile = load_profile("bert-base")
    for name in S.SETUPS:
        plan = S.settle(name, {"accumulate": 2}).plan(profile, S.Compute(3e4, 6e4, 5e3, 2e3), S.Placement(2, 4, "cpu"))
        rows = rng.uniform(0, 5e4, size=(4, len(plan.comms)))
        assert P.simulate_many(plan, rows) == pytest.approx([P.simulate(plan, row).step_us for row in rows])
        assert P.simulate(plan, rows[0]).step_us >= plan.compute_us


@pytest.mark.parametrize("name,knobs,layout,message", [
    ("nope", {}, None, "unknown setup 'nope'"),
    ("fsdp-full", {"bucket_mb": 5}, None, "no knob --bucket-mb"),
    ("ddp", {"accumulate": 0}, None, "--accumulate 0"),
    ("ddp", {"accumulate": 2.5}, None, "whole number"),
    ("horovod", {"cycle_ms": math.inf}, None, "--cycle-ms"),
    ("fsdp-full", {"shard_group": "rack"}, None, "choose from world, node"),
    ("fsdp-full", {"shard_group": "node"}, S.Placement(3, 2), None),
])
def test_bad_setups_are_one_line(name, knobs, layout, message):
    if message is None:  # 3 nodes of 2 divide 6 ranks: accepted
        S.settle(name, knobs, layout)
        return
    with pytest.raises(S.SetupError, match=message.replace("(", r"\(")):
        S.settle(name, knobs, layout)


@pytest.mark.parametrize("model", shipped())
def test_every_setup_plans_every_shipped_profile(model):
    """Every setup plans every shipped profile, on one node and on two (hybrid's groups), moving each gradient
    byte at least once; FSDP's units hold every tensor once (tied parameters in one unit: units.untie)."""
    profile = load_profile(model)
    for name in S.SETUPS:
        for layout in (S.Placement(1, 2), S.Placement(2, 8)):
            plan = S.settle(name).plan(profile, S.Compute(1e4, 2e4, 1e3), layout)
            plan.check()
            moved = plan.bytes_by()
            reduced = sum(b for (c, _), (_, b) in moved.items() if c in ("allreduce", "reduce_scatter"))
            assert reduced >= profile.nbytes * (0.5 if name.endswith(("fp16", "bf16")) else 1.0) - 16
    held = sorted(i for u in profile.units for i in u.tensors)
    assert held == list(range(len(profile.tensors))) or not profile.units
