"""Every closed form of the algorithm table (an entry's `phases`) against the cost of its full
schedule: equal (to float rounding) when the world divides the count, an upper bound within one
element per part otherwise, on one node and several, with and without shared NICs, a reduction
bandwidth and a cache regime. The fast paths of predict-scaling are these closed forms."""
import pytest

from commbench import algorithms as A
from commbench.costmodel import Hardware, algorithm_us, load_hardware, phases_us, schedule_us
from commbench.topology import Link, Topology

TOPOLOGIES = [Topology(1, 2), Topology(1, 8), Topology(2, 4), Topology(3, 4), Topology(5, 2), Topology(4, 1),
              Topology(2, 1), Topology(8, 2)]
HARDWARE = {
    "shared-nics": load_hardware("dgx1-v100-4ib"),  # 4 NICs per node shared by its ranks, reduce_gbps, overhead
    "nic-per-rank": Hardware("nic-per-rank", 1, Link("nvlink", 100.0, 1.0), Link("ib", 10.0, 5.0)),
    "one-nic": Hardware("one-nic", 1, Link("nvlink", 100.0, 1.0), Link("ib", 25.0, 5.0, links_per_node=1),
                        reduce_gbps=50.0, per_call_overhead_us=3.0),
    "cache": Hardware("cache", 1, Link("shm", 6.0, 2.0, cache_bytes=1 << 20, cache_bw_gbps=30.0),
                      Link("tcp", 1.0, 50.0)),
}
WITH_PHASES = [(c, name) for c, entries in A.TABLE.items() for name, e in entries.items() if e.phases]


def _full_and_fast(collective, name, topo, hw, count):
    hw = hw
    entry = A.entry(collective, name)
    full = schedule_us(entry.schedule(topo, count), topo, hw, 4)
    return full, phases_us(entry.phases(topo, count), hw, 4)


def test_the_entries_with_closed_forms():
    assert WITH_PHASES == [("allreduce", "ring"), ("allreduce", "hier"), ("allgather", "ring"),
                           ("reduce_scatter", "ring")]


@pytest.mark.parametrize("collective,name", WITH_PHASES)
@pytest.mark.parametrize("topo", TOPOLOGIES, ids=str)
@pytest.mark.parametrize("hw_name", HARDWARE)
@pytest.mark.parametrize("per_rank", [1, 7, 1000, 250_000])
def test_closed_form_equals_the_schedule_when_the_world_divides_the_count(collective, name, topo, hw_name, per_rank):
    count = per_rank * topo.world
    full, fast = _full_and_fast(collective, name, topo, HARDWARE[hw_name], count)
    assert fast == pytest.approx(full, rel=1e-12)
    assert A.entry(collective, name).phases(topo, count).steps == A.entry(collective, name).schedule(topo, count).steps


@pytest.mark.parametrize("collective,name", WITH_PHASES)
@pytest.mark.parametrize("topo", [t for t in TOPOLOGIES if t.world > 2], ids=str)
@pytest.mark.parametrize("hw_name", HARDWARE)
@pytest.mark.parametrize("count", [1001, 25_000_001])
def test_closed_form_bounds_the_schedule_otherwise(collective, name, topo, hw_name, count):
    """Parts differ by one element; the closed form takes the largest everywhere."""
    full, fast = _full_and_fast(collective, name, topo, HARDWARE[hw_name], count)
    assert full <= fast * (1 + 1e-12)
    assert fast == pytest.approx(full, rel=2e-3 if count < 10_000 else 1e-6)


@pytest.mark.parametrize("collective,name", [(c, n) for c, entries in A.TABLE.items() for n in entries])
@pytest.mark.parametrize("topo", [Topology(1, 4), Topology(3, 2)], ids=str)
def test_algorithm_us_costs_every_entry(collective, name, topo):
    """By the closed form where there is one, else the full schedule: the same number (twoshot included)."""
    hw = HARDWARE["shared-nics"]
    count = 6000 * topo.world
    entry = A.entry(collective, name)
    assert algorithm_us(hw, topo, collective, name, count, 4) == \
        pytest.approx(schedule_us(entry.schedule(topo, count), topo, hw, 4), rel=1e-12)


def test_closed_forms_are_built_on_at_most_two_nodes():
    """What keeps 1,000 GPUs fast: the rounds of a closed form do not grow with the node count."""
    big = Topology(125, 8)
    for collective, name in WITH_PHASES:
        phases = A.entry(collective, name).phases(big, 1 << 20)
        assert phases.topology == Topology(2, 8) and all(len(rnd) <= 16 for rnd, _ in phases.rounds)
    assert A.ring_allreduce_phases(big, 1 << 20).steps == 2 * 999
    assert A.hier_allreduce_phases(big, 1 << 20).steps == 2 * 7 + 2 * 124


def test_channels_split_the_ring_over_the_nics():
    """The library ring (algorithms.LIBRARY): one ring per NIC, each with its share of every part."""
    one, four = A.ring_allreduce_phases(Topology(2, 4), 8000), A.ring_allreduce_phases(Topology(2, 4), 8000, 4)
    assert [len(rnd) for rnd, _ in four.rounds] == [4 * len(rnd) for rnd, _ in one.rounds]
    assert {t.count for rnd, _ in four.rounds for t in rnd} == {250}  # 8000 / 8 ranks / 4 channels
