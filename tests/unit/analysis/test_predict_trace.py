"""analysis/predict_trace.py: a traced job's calls costed by the cost model, its steps by the trace's timeline."""
import pytest
from conftest import DATA

from commbench.analysis.predict_trace import call_us, group_topology, predict_trace
from commbench.costmodel import load_hardware
from commbench.proxies.traces.files import read_traces
from commbench.topology import Topology

DDP = [str(DATA / "traces" / f"ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]


def test_groups_are_laid_out_on_the_jobs_nodes():
    assert group_topology((0, 1, 2, 3), 2) == Topology(2, 2)
    assert group_topology((0, 2), 2) == Topology(2, 1)  # one rank per node
    assert group_topology((2, 3), 2) == Topology(1, 2)


def test_a_faster_network_predicts_less_communication():
    job = read_traces(DDP)
    slow, fast = load_hardware("ethernet-25g"), load_hardware("dgx-h100")
    p_slow = predict_trace(job, slow, Topology(2, 1))
    p_fast = predict_trace(job, fast, Topology(2, 1))
    assert len(p_slow.steps_us) == 2 and min(p_fast.comm_us) > 0
    assert p_fast.median(p_fast.comm_us) < p_slow.median(p_slow.comm_us)
    for k, step in enumerate(p_slow.steps_us):  # compute + exposed <= step: the timeline's arithmetic
        assert step >= p_slow.compute_us[k] + p_slow.exposed_us[k] - 1e-6
    assert call_us(fast, "allreduce", 1 << 20, "float32", (0,), 8) == 0.0  # a group of one moves nothing


def test_compute_scale_divides_the_traced_compute():
    job = read_traces(DDP)
    hw = load_hardware("dgx-h100")
    one, two = predict_trace(job, hw, Topology(1, 2)), predict_trace(job, hw, Topology(1, 2), compute_scale=2.0)
    assert two.compute_us == pytest.approx([c / 2 for c in one.compute_us])


def test_a_topology_of_other_size_is_refused():
    with pytest.raises(ValueError, match="trace has 2"):
        predict_trace(read_traces(DDP), load_hardware("dgx-h100"), Topology(2, 2))


def test_a_calls_cost_is_the_models_raw_time_not_the_calibrated_point():
    """predict centres the point it shows by the corpus calibration; a trace replay costs each call raw, as its
    header says (the cost model)."""
    from commbench.analysis.predict import predict_point
    from commbench.collectives import resolve_dtype

    hw, topo = load_hardware("dgx-a100"), Topology(1, 2)
    shown = predict_point(hw, "allreduce", 25 << 20, resolve_dtype("float32"), topo, "auto")
    assert shown.raw_time_us is not None and shown.raw_time_us != shown.time_us  # the preset is calibrated
    assert call_us(hw, "allreduce", 25 << 20, "float32", (0, 1), 2) == pytest.approx(shown.raw_time_us)
