"""A schedule's rounds -> time (costmodel/rounds.py): exact values of schedule costs against closed forms,
and link sharing."""
import pytest

from commbench import algorithms as A
from commbench import costmodel as M
from commbench.schedule import Transfer
from commbench.topology import Link, Topology

NVLINK = Link("nvlink", bw_gbps=100.0, latency_us=2.0)
IB = Link("ib", bw_gbps=25.0, latency_us=5.0, links_per_node=1)
HW = M.Hardware("test", 8, NVLINK, IB)


# Textbook forms the schedules are pinned to (kept here: nothing in the package needs them).
def ring_allreduce_us(p, nbytes, link, reduce_gbps=None):
    """2(p-1) alpha + 2(p-1)/p S / bw (+ (p-1)/p S / gamma): the textbook ring on one level."""
    if p == 1:
        return 0.0
    t = 2 * (p - 1) * link.latency_us + 2 * (p - 1) / p * nbytes / (link.bw_gbps * 1e3)
    return t + ((p - 1) / p * nbytes / (reduce_gbps * 1e3) if reduce_gbps else 0.0)


def ring_allgather_us(p, nbytes, link):
    """(p-1) alpha + (p-1)/p S / bw, S = the output buffer."""
    return (p - 1) * link.latency_us + (p - 1) / p * nbytes / (link.bw_gbps * 1e3) if p > 1 else 0.0


def oneshot_allreduce_us(p, nbytes, link):
    """alpha + (p-1) S / bw: every rank receives every peer's whole buffer over its one link."""
    return link.latency_us + (p - 1) * nbytes / (link.bw_gbps * 1e3) if p > 1 else 0.0


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
def test_ring_allreduce_matches_the_closed_form(p):
    count = 1 << 20  # divisible by every p here: equal chunks, as the closed form assumes
    count -= count % p
    schedule = A.ring_allreduce(Topology(1, p), count)
    hw = M.Hardware("one-level", p, NVLINK, NVLINK)
    assert M.schedule_us(schedule, Topology(1, p), hw, 4) == pytest.approx(ring_allreduce_us(p, count * 4, NVLINK))


def test_exact_values():
    # 8 ranks, 1 MiB float32 (262144 elements): 14 rounds of 2 us + 14 x 32768 elements x 4 B / 100 GB/s
    schedule = A.ring_allreduce(Topology(1, 8), 262144)
    assert M.schedule_us(schedule, Topology(1, 8), HW, 4) == pytest.approx(14 * 2.0 + 14 * 131072 / 1e5)
    assert ring_allreduce_us(8, 1 << 20, NVLINK) == pytest.approx(28.0 + 1.75 * (1 << 20) / 1e5)
    assert ring_allgather_us(4, 4e6, NVLINK) == pytest.approx(3 * 2.0 + 0.75 * 4e6 / 1e5)
    with_reduce = M.Hardware("g", 8, NVLINK, NVLINK, reduce_gbps=50.0)
    extra = M.schedule_us(schedule, Topology(1, 8), with_reduce, 4) - M.schedule_us(schedule, Topology(1, 8), HW, 4)
    assert extra == pytest.approx(7 * 131072 / 5e4)  # (p-1)/p S / gamma
    assert ring_allreduce_us(8, 1 << 20, NVLINK, 50.0) - ring_allreduce_us(8, 1 << 20, NVLINK) == \
        pytest.approx(extra)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_oneshot_and_allgather_closed_forms(p):
    topo = Topology(1, p)
    hw = M.Hardware("one-level", p, NVLINK, NVLINK)
    assert M.schedule_us(A.oneshot_allreduce(topo, 1000), topo, hw, 4) == \
        pytest.approx(oneshot_allreduce_us(p, 4000, NVLINK))
    assert M.schedule_us(A.ring_allgather(topo, 1000 * p), topo, hw, 4) == \
        pytest.approx(ring_allgather_us(p, 4000 * p, NVLINK))


def test_nic_sharing_across_a_node():
    """8 ranks per node crossing to another node at once share the node's one NIC: 8x the time."""
    topo = Topology(2, 8)
    count = 1 << 16
    cross = A.hier_allreduce(topo, count)
    inter_rounds = [r for r in cross.rounds if any(topo.node_of(t.src) != topo.node_of(t.dst) for t in r)]
    one = M.round_us(inter_rounds[0], topo, HW, 4)
    eight_nics = M.round_us(inter_rounds[0], topo, M.Hardware("x", 8, NVLINK, Link("ib", 25.0, 5.0, 8)), 4)
    nbytes = inter_rounds[0][0].count * 4
    assert one == pytest.approx(5.0 + 8 * nbytes / 25e3)
    assert eight_nics == pytest.approx(5.0 + nbytes / 25e3)


def test_one_transfer_uses_one_nic():
    topo = Topology(2, 8)
    lone = ((Transfer(0, 8, (0, 1000), False),),)
    eight_nics = M.Hardware("x", 8, NVLINK, Link("ib", 25.0, 5.0, 8))
    assert M.round_us(lone[0], topo, eight_nics, 4) == pytest.approx(5.0 + 4000 / 25e3)


def test_hier_beats_ring_across_nodes_with_one_nic():
    topo = Topology(4, 8)
    count = 64 << 20
    assert M.schedule_us(A.hier_allreduce(topo, count), topo, HW, 4) < M.schedule_us(A.ring_allreduce(topo, count),
                                                                                        topo, HW, 4)
