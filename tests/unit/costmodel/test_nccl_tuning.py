"""NCCL's tuning model (costmodel/nccl_tuning.py): the channels and bandwidth taken from commbench's
hardware, NCCL's choice of algorithm and protocol per size, times worked out by hand from NCCL
2.20.3's constants (src/graph/tuning.cc), and `nccl` in predict-scaling's output."""
import json

import pytest
from conftest import commbench

from commbench.analysis.scaling import StepQuestion, predict_step
from commbench.costmodel import Hardware
from commbench.costmodel import nccl_tuning as N
from commbench.proxies.profile import Profile, TensorSpec
from commbench.topology import Link, Topology

# A DGX A100 as the preset describes it: NVLink 300 GB/s a GPU, 8 NICs of 25 GB/s a node
DGX = Hardware("dgx", 8, Link("nvlink", 300.0, 0.6), Link("ib", 25.0, 2.7, links_per_node=8))
PCIE = Hardware("pcie-box", 8, Link("pcie", 24.0, 1.0), Link("ethernet", 3.125, 20.0, links_per_node=1))
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def test_channels_come_from_the_nics_and_nvlink():
    # between nodes: one channel per NIC at the NIC's 25 GB/s; 25 >= 25 GB/s, so the search doubles them
    two = N.system(DGX, Topology(2, 8))
    assert (two.graph_channels, two.channel_gbps, two.channels) == (16, 12.5, 32)
    # one node: 300 GB/s in channels of at most 40 GB/s (the search's top intra speed): 8 x 37.5, doubled
    one = N.system(DGX, Topology(1, 8))
    assert (one.graph_channels, one.channel_gbps) == (16, 18.75) and one.nvlink
    # a NIC per GPU at most: one GPU a node drives one NIC (25 GB/s, doubled to 2 x 12.5)
    assert (N.system(DGX, Topology(4, 1)).graph_channels, N.system(DGX, Topology(4, 1)).channel_gbps) == (2, 12.5)
    # below 25 GB/s a channel is not doubled
    slow = N.system(PCIE, Topology(2, 8))
    assert (slow.graph_channels, slow.channel_gbps, slow.nvlink) == (1, 3.125, False)


def test_tree_ll_time_by_hand():
    """2 nodes x 8 GPUs, 1 KiB: tree/LL by tuning.cc's numbers."""
    # bus bandwidth 16 channels x 12.5 = 200; tree: min(200 x 0.92, 16 x 23.6 (perChMaxTreeBws Ampere, 2 nodes));
    # LL: min(184 / 3.8, 39.0 (llMaxBws, Intel, 2 nodes)) = 39.0; algorithm bandwidth x 0.5
    bandwidth = 39.0 * 0.5
    # baseLat tree/LL 6.8 + 2 x ((8 - 1) x 0.6 (NVLink hwLat) + log2(2) x 5.0 (network hwLat))
    latency = 6.8 + 2 * (7 * 0.6 + 1 * 5.0)
    setup = N.system(DGX, Topology(2, 8))
    assert N.allreduce_table(setup)["tree", "LL"] == pytest.approx((latency, bandwidth))
    # treeCorrectionFactor[LL][log2(1024 / 64) = 4] = 0.9
    expected = latency + KIB / (1000 * bandwidth * 0.9)
    assert N.predicted_us(setup, "tree", "LL", KIB) == pytest.approx(expected)
    choice = N.allreduce(DGX, Topology(2, 8), KIB)
    assert (choice.algorithm, choice.protocol) == ("tree", "LL") and choice.time_us == pytest.approx(expected)


def test_ring_simple_time_by_hand():
    """2 nodes x 8 GPUs, 1 GiB: ring/Simple, with the ring's plateau factor."""
    # baseLat ring/Simple 8.4; 2(16-1) = 30 steps, 2 x 2 nodes = 4 of them between nodes at 14.0 (network
    # hwLat), 26 inside at max(3.4 (NVLink hwLat), 3 x 1.0 (Intel net overhead, x3 for Simple))
    latency = 8.4 + 26 * 3.4 + 4 * 14.0
    bandwidth = 200.0 * 16 / 30  # bus bandwidth to algorithm bandwidth: ranks / steps
    expected = 1.4 * latency + GIB / (1000 * bandwidth)  # plateau: 1 GiB / (32 channels x 16 ranks) >= 64 B
    choice = N.allreduce(DGX, Topology(2, 8), GIB)
    assert (choice.algorithm, choice.protocol, choice.channels) == ("ring", "Simple", 32)
    assert choice.time_us == pytest.approx(expected)


@pytest.mark.parametrize("topo", [Topology(2, 8), Topology(8, 8), Topology(125, 8)])
def test_small_sizes_pick_tree_ll_across_nodes(topo):
    for nbytes in (4, KIB, 16 * KIB):
        choice = N.allreduce(DGX, topo, nbytes)
        assert (choice.algorithm, choice.protocol) == ("tree", "LL"), nbytes


@pytest.mark.parametrize("topo", [Topology(1, 8), Topology(2, 8), Topology(8, 8)])
def test_large_sizes_pick_ring_simple(topo):
    assert N.allreduce(DGX, topo, GIB).label == "ring/Simple"


def test_one_node_stays_on_the_ring_and_moves_up_the_protocols():
    labels = [N.allreduce(DGX, Topology(1, 8), nbytes).label for nbytes in (KIB, MIB, 8 * MIB, GIB)]
    assert labels == ["ring/LL", "ring/LL", "ring/LL128", "ring/Simple"]


def test_at_scale_the_ring_latency_hands_large_buffers_to_the_tree():
    # 125 nodes: the ring's 2 x 999 steps cost milliseconds, the tree's log2(125) = 6 network hops do not
    assert N.allreduce(DGX, Topology(125, 8), 100 * MIB).label == "tree/LL128"
    assert N.allreduce(DGX, Topology(2, 8), 100 * MIB).label == "ring/LL128"


def test_ll128_only_over_nvlink():
    for nbytes in (KIB, MIB, 8 * MIB, 64 * MIB, GIB):
        assert N.allreduce(PCIE, Topology(2, 8), nbytes).protocol != "LL128"
    assert N.allreduce_table(N.system(PCIE, Topology(1, 8)))["ring", "LL128"][1] == 0


def test_small_calls_run_on_fewer_channels():
    # ring/LL on 8 ranks: a channel needs 512 threads x 8 x 8 ranks = 32 KiB, so 1 KiB runs on 1 channel
    assert N.allreduce(DGX, Topology(1, 8), KIB).channels == 1
    assert N.allreduce(DGX, Topology(1, 8), 64 * KIB).channels == 2
    assert N.allreduce(DGX, Topology(1, 8), GIB).channels == 32


def test_one_gpu_a_node_takes_nccls_discounts():
    setup = N.system(DGX, Topology(4, 1))  # 2 channels x 12.5 GB/s
    table = N.allreduce_table(setup)
    # ring/LL128 x 0.7 when a GPU sends and receives through its NIC; 4 ranks: algorithm bw = bus x 4 / 6
    assert table["ring", "LL128"][1] == pytest.approx(25.0 * 0.7 * 4 / 6)
    # tree: min(25 x 0.92, 2 x 17.8), x 0.85 for the plain tree one GPU a node gets, x 0.5
    assert table["tree", "Simple"][1] == pytest.approx(25.0 * 0.92 * 0.85 * 0.5)


def test_the_hardware_file_may_say_the_gpu_and_cpu():
    hopper_amd = Hardware("h", 8, DGX.intra, DGX.inter, meta={"nccl": {"arch": "hopper", "cpu": "amd"}})
    setup = N.system(hopper_amd, Topology(2, 8))
    assert (setup.arch, setup.cpu) == ("hopper", "amd")
    # AMD: 2 us of net overhead a ring step (x3 for Simple) and llMaxBws 22.5 on 2 nodes
    lat, bw = N.allreduce_table(setup)["ring", "LL"]
    assert lat == pytest.approx(6.6 + 26 * 2.0 + 4 * 2.7) and bw == pytest.approx(22.5 * 16 / 30)
    with pytest.raises(ValueError, match="nccl.arch must be one of volta, ampere, hopper"):
        N.system(Hardware("p", 8, DGX.intra, DGX.inter, meta={"nccl": {"arch": "pascal"}}), Topology(2, 8))


def _profile():
    tensors = (TensorSpec("big", (4 * MIB,), "float32", 100.0, 1), TensorSpec("small", (256,), "float32", 50.0, 0))
    return Profile("toy", tensors, 100.0, 100.0, (1,), "samples", 1)


def test_a_step_records_what_nccl_runs_per_bucket():
    q = StepQuestion.ddp(_profile(), 1, 1000.0, 1000.0, bucketing="none", algorithm="nccl")
    pred = predict_step(q, Topology(2, 8), DGX)
    assert [c.nbytes for c in pred.plan.comms] == [KIB, 16 * MIB]
    assert [c.label for c in pred.choices] == ["tree/LL", "ring/LL128"]
    assert pred.comm_us == [c.time_us for c in pred.choices]
    assert predict_step(q.at(algorithm="ring"), Topology(2, 8), DGX).choices is None


def test_predict_scaling_says_what_the_nccl_baseline_ran(tmp_path):
    out = tmp_path / "s.jsonl"
    proc = commbench("predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8,64", "--batch", "64",
                     "--tflops", "100", "--baseline", "nccl", "--candidate", "hier", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "# nccl: what NCCL 2.20.3's tuning model runs per bucket size" in proc.stdout
    assert any(line.startswith("#       64 GPUs: ") and "tree/" in line for line in proc.stdout.splitlines())
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        choices = row["nccl_choices"]
        if row["algorithm"] != "nccl":
            assert choices is None
            continue
        assert {c["algorithm"] for c in choices} <= {"ring", "tree"} and all(c["buckets"] >= 1 for c in choices)
        assert {c["protocol"] for c in choices} <= {"LL", "LL128", "Simple"}


def test_a_bad_nccl_entry_is_one_line(tmp_path):
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps({"name": "x", "ranks_per_node": 8, "nccl": {"cpu": "arm"},
                              "levels": {"intra": {"bw_gbps": 300, "latency_us": 0.6},
                                         "inter": {"bw_gbps": 25, "latency_us": 2.7, "links_per_node": 8}},
                              "device_tflops": {"fp32": 19.5}}))
    proc = commbench("predict-scaling", "resnet50", "--hw", str(hw), "--gpus", "16", "--batch", "64")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "nccl.cpu one of intel, amd" in proc.stderr
