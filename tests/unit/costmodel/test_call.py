"""The cost of one call (costmodel/call.py): the fast allreduce costs against the full schedules, the
library ring's channels, `nccl` by NCCL's tuning model with its choice, `auto` as the rule chooses, the
all-gather and reduce-scatter rings, and the step's calls (analysis/scaling.comm_us) costed by it."""
import pytest

from commbench import algorithms
from commbench.costmodel import (
    ALLREDUCE_ALGORITHMS,
    FULL_SCHEDULE_MAX_RANKS,
    Hardware,
    call_form,
    call_us,
    call_variants_us,
    load_hardware,
    phases_us,
    schedule_us,
)
from commbench.costmodel import nccl_tuning as N
from commbench.topology import Link, Topology

HW = Hardware("toy", 4, Link("nvlink", 100.0, 1.0), Link("ib", 10.0, 5.0, links_per_node=2),
              reduce_gbps=None, per_call_overhead_us=3.0)
# A DGX A100 as the preset describes it: NVLink 300 GB/s a GPU, 8 NICs of 25 GB/s a node
DGX = Hardware("dgx", 8, Link("nvlink", 300.0, 0.6), Link("ib", 25.0, 2.7, links_per_node=8))
MIB = 1 << 20


def _allreduce_us(hw, topo, nbytes, algorithm):
    time_us, choice = call_us(hw, topo, "allreduce", algorithm, nbytes, 4)
    assert choice is None  # only `nccl` says what NCCL runs
    return time_us


@pytest.mark.parametrize("topo", [Topology(1, 8), Topology(2, 4), Topology(3, 4), Topology(5, 2), Topology(4, 1)])
@pytest.mark.parametrize("algorithm", ["ring", "hier"])
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 100_000_004])
def test_fast_costs_equal_the_full_schedule(topo, algorithm, nbytes):
    hw = load_hardware("dgx1-v100-4ib")
    schedule = algorithms.build("allreduce", algorithm, topo, nbytes // 4, nbytes)
    assert _allreduce_us(hw, topo, nbytes, algorithm) == pytest.approx(schedule_us(schedule, topo, hw, 4), rel=1e-6)


def test_ring_on_one_node_matches_the_closed_form():
    topo = Topology(1, 4)
    # 2(p-1) alpha + 2(p-1)/p S / bw + overhead: 6 * 1 + 1.5 * 4e6 / 1e5 + 3
    assert _allreduce_us(HW, topo, 4_000_000, "ring") == pytest.approx(6 + 60 + 3)


def test_the_library_ring_uses_every_nic_between_nodes():
    topo = Topology(2, 4)
    chunk = 8_000_000 / 8  # bytes per rank per step
    one = _allreduce_us(HW, topo, 8_000_000, "ring")
    two = _allreduce_us(HW, topo, 8_000_000, "nccl-ring")  # `nccl` before NCCL's tuning model
    # per step: the inter-node link is the bottleneck; one ring on one NIC vs 2 channels on 2 NICs
    assert one == pytest.approx(3 + 14 * (5 + chunk / 1e4))
    assert two == pytest.approx(3 + 14 * (5 + chunk / 2 / 1e4))
    assert _allreduce_us(HW, Topology(1, 8), 8_000_000, "nccl-ring") == _allreduce_us(HW, Topology(1, 8), 8_000_000,
                                                                                       "ring")


def test_call_us_costs_nccl_by_its_tuning_model():
    time_us, choice = call_us(DGX, Topology(2, 8), "allreduce", "nccl", 8 * MIB, 4)
    assert choice == N.allreduce(DGX, Topology(2, 8), 8 * MIB) and time_us == choice.time_us
    assert call_us(DGX, Topology(1, 1), "allreduce", "nccl", 8 * MIB, 4) == (0.0, None)
    assert call_us(DGX, Topology(2, 8), "allreduce", "nccl", 2, 4) == (0.0, None)  # no whole element


def test_auto_costs_what_the_rule_chooses():
    for topo, nbytes in ((Topology(1, 4), 4096), (Topology(2, 4), 8 * MIB), (Topology(1, 16), 1024)):
        chosen = algorithms.choose("allreduce", topo, nbytes)
        assert _allreduce_us(HW, topo, nbytes, "auto") == _allreduce_us(HW, topo, nbytes, chosen)


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter"])
def test_gathers_and_scatters_run_the_ring_the_library_on_every_nic(collective):
    topo = Topology(2, 4)
    ring = algorithms.entry(collective, "ring").phases
    plain, library = (phases_us(ring(topo, MIB // 4, channels), HW, 4) for channels in (1, 2))
    assert library < plain
    for algorithm in ("ring", "hier", "auto"):  # not the library's: the one ring, whatever the allreduce's name
        assert call_us(HW, topo, collective, algorithm, MIB, 4) == (plain, None)
    for algorithm in ("nccl", "nccl-ring"):  # the library's: one channel per NIC of a node
        assert call_us(HW, topo, collective, algorithm, MIB, 4) == (library, None)
    assert call_us(HW, Topology(1, 4), collective, "nccl", MIB, 4)[0] == call_us(HW, Topology(1, 4), collective,
                                                                               "ring", MIB, 4)[0]


def test_a_full_schedule_past_its_reach_is_refused():
    no_closed_form = next(name for name in ALLREDUCE_ALGORITHMS[2:]
                          if algorithms.entry("allreduce", name).phases is None)
    big = Topology(FULL_SCHEDULE_MAX_RANKS // 8 + 1, 8)
    with pytest.raises(ValueError, match="no closed form"):
        call_us(HW, big, "allreduce", no_closed_form, MIB, 4)
    assert call_us(HW, big, "allreduce", "ring", MIB, 4)[0] > 0  # a closed form goes on


def test_variants_cost_what_call_us_does_on_each():
    hws = [HW, Hardware("slow", 4, Link("nvlink", 50.0, 2.0), Link("ib", 5.0, 9.0, links_per_node=2),
                        per_call_overhead_us=1.0)]
    topo = Topology(2, 4)
    for collective, algorithm in (("allreduce", "ring"), ("allreduce", "oneshot"), ("allreduce", "nccl-ring"),
                                  ("allgather", "nccl")):
        got = call_variants_us(hws, topo, collective, algorithm, MIB, 4)
        assert got == pytest.approx([call_us(h, topo, collective, algorithm, MIB, 4)[0] for h in hws])
    assert call_variants_us(hws, Topology(1, 1), "allreduce", "ring", MIB, 4) == [0.0, 0.0]
    # `nccl` by its rounds: the library ring's (NCCL's model has no figures a fit varies)
    assert call_form(HW, topo, "allreduce", "nccl", MIB, 4) == call_form(HW, topo, "allreduce", "nccl-ring", MIB, 4)


def test_a_steps_calls_are_costed_on_their_groups():
    from commbench.analysis.scaling import comm_us
    from commbench.proxies.comm_plan import Comm

    topo = Topology(4, 8)
    hw = load_hardware("dgx-a100")
    for group, ranks in (("world", topo), ("node", Topology(1, 8)), ("cross", Topology(4, 1))):
        comm = Comm("allreduce", 8 * MIB, "float32", group, 0.0, 0.0, "b")
        assert comm_us(hw, topo, comm, "nccl") == call_us(hw, ranks, "allreduce", "nccl",
                                                          8 * MIB, 4)
