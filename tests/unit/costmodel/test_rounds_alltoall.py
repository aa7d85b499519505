"""The cost model on the all-to-all schedules: exact values against their textbook forms (rounds x
the slowest transfer of each round, per link level), one level and two, and `predict -c alltoall`."""
import json

import pytest

from commbench import algorithms as A
from commbench import costmodel as M
from commbench.topology import Link, Topology

NVLINK = Link("nvlink", bw_gbps=100.0, latency_us=2.0)
IB = Link("ib", bw_gbps=25.0, latency_us=5.0, links_per_node=1)


def _us(link, nbytes):
    return link.latency_us + nbytes / (link.bw_gbps * 1e3)


def _cost(name, topo, hw, count, itemsize=4):
    schedule = A.build("alltoall", name, topo, count, count * itemsize)
    full = M.schedule_us(schedule, topo, hw, itemsize)
    assert M.algorithm_us(hw, topo, "alltoall", name, count, itemsize) == pytest.approx(full)
    return full


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_pairwise_and_bruck_on_one_level(world):
    """pairwise: (n-1)(alpha + B/bw), one block B each way per round; bruck: sum over its
    ceil(log2 n) rounds of alpha + m_k B/bw, m_k = the places j < n with bit k set."""
    hw, topo, count = M.Hardware("one-level", world, NVLINK, NVLINK), Topology(1, world), 1000 * world
    block = 1000 * 4
    assert _cost("pairwise", topo, hw, count) == pytest.approx((world - 1) * _us(NVLINK, block))
    rounds = (world - 1).bit_length()
    moved = [sum(1 for j in range(1, world) if j >> k & 1) for k in range(rounds)]
    assert _cost("bruck", topo, hw, count) == pytest.approx(sum(_us(NVLINK, m * block) for m in moved))


def test_exact_values_two_nodes_one_nic():
    """2 nodes x 4 ranks, one NIC per node, 1 MiB float32 per rank (B = 32 KiB blocks):
    pairwise's round k crosses with min(k, 8-k) ranks of a node at once, 7 rounds in all, each
    bound by the NIC: 7 x 5 us + 16 B / 25 GB/s; hier: 3 node rounds of 2 blocks to one peer
    (2 us + 2 B / 100 GB/s), then 1 round where the 4 ranks of a node send 4 blocks each over
    the one NIC (5 us + 16 B / 25 GB/s)."""
    hw, topo, count = M.Hardware("two-level", 4, NVLINK, IB), Topology(2, 4), 262144
    block = count // 8 * 4
    assert _cost("pairwise", topo, hw, count) == pytest.approx(7 * 5.0 + 16 * block / 25e3)
    assert _cost("hier", topo, hw, count) == pytest.approx(3 * _us(NVLINK, 2 * block) + _us(IB, 16 * block))
    assert _cost("hier", topo, hw, count) < _cost("pairwise", topo, hw, count)  # 1 inter latency instead of 7
    nic_per_rank = M.Hardware("nic-per-rank", 4, NVLINK, Link("ib", 25.0, 5.0))
    assert _cost("hier", topo, nic_per_rank, count) == pytest.approx(3 * _us(NVLINK, 2 * block) + _us(IB, 4 * block))


def test_predict_costs_alltoall(tmp_path):
    from conftest import commbench

    M.Hardware("two-level", 4, NVLINK, IB).save(str(tmp_path / "hw.json"))
    proc = commbench("predict", "--hw", str(tmp_path / "hw.json"), "--topology", "2x4", "-c", "alltoall",
                     "--sizes", "1M", "--algorithm", "hier", "--json", str(tmp_path / "p.jsonl"))
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    (point,) = [r for r in records if r["record"] == "result"]
    block = (1 << 20) // 8
    assert point["algorithm"] == "hier" and point["steps"] == 4
    assert point["raw_time_us"] == pytest.approx(3 * _us(NVLINK, 2 * block) + _us(IB, 16 * block))  # the model's
