"""Terms that grow with the node count, each from its own published evidence (docs/model.md, "Terms
that grow with the node count"), for a hardware description that was written, not fitted: a fitted
file holds measured bandwidths and measured steps already, so none of these applies to it.

- NIC efficiency: what NCCL's allreduce delivers over one NIC of a line-rate class, as NCCL's own
  maintainers state the best a tuned system reaches with nccl-tests (busbw per NIC over line rate).
- Stragglers: a step of N ranks waits for the slowest; without a measured step-time distribution
  (`predict-scaling --jitter-from`) the default is a normal one with the coefficient of variation a
  published GPU step-time distribution shows (analysis/stragglers.py takes the expected maximum).
- Congestion: where a source says its fabric is blocking (a blocking factor b > 1), traffic between
  nodes gets 1/b of the NICs' rate. No corpus source says so; the term is 1 for all of them.
The per-hop latency across nodes is NCCL's own (commbench/costmodel/nccl_tuning.py), not a term of this module.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from commbench.costmodel import Hardware


@dataclass(frozen=True)
class Evidence:
    value: float
    source: str


# nccl-tests bus bandwidth per NIC over the NIC's line data rate, by line-rate class (Gb/s).
NIC_EFFICIENCY = {
    "100G": Evidence(12.2 / 12.5, "NVIDIA/nccl-tests issue #29 (sjeaugey, 2019-12-06): '12.2 GB/s (for a 100Gbps card) "
                                  "is as good as you can get'; DGX-1 with 4 such NICs '48 GB/s'"),
    "200G": Evidence(24.0 / 25.0, "NVIDIA/nccl issue #412 (sjeaugey, 2023-04-24): all_reduce_perf busbw at 8G 'you "
                                  "should get ... 24GB/s inter-node' over one 200G HDR NIC"),
    "400G": Evidence(47.0 / 50.0, "NVIDIA/nccl-tests issue #290 (AddyLaddy, 2025-03-03): 'For NDR @ 400Gbps you should "
                                  "see 46-48GB/s per NIC' (the middle, 47)"),
}
LINE_RATE_CLASS_GBPS = {12.5: "100G", 25.0: "200G", 50.0: "400G"}  # a NIC's bw_gbps (GB/s) -> its class

# A published GPU step-time distribution: PyTorch's DDP benchmark (pytorch/pytorch
# benchmarks/distributed/ddp/README.md @ bf69c149), the 1-GPU-in-DDP rows' p50 and p95 sec/iter:
# resnet50 0.100/0.100, resnet101 0.171/0.172, resnext50 0.147/0.148, resnext101 0.425/0.426. As a
# normal distribution (p95 - p50 = 1.645 sigma): CV 0%, 0.36%, 0.41%, 0.14%; their median 0.25%. The
# README prints 3 decimals, so each is known to about 0.3% of the step.
DEFAULT_STEP_CV = Evidence(0.0025, "PyTorch DDP benchmark README @ bf69c149, 1 GPU in DDP: p95 - p50 of sec/iter "
                                   "over 1.645, median of its 4 models (0.14-0.41%)")
DEFAULT_DRAWS = 2001  # quantiles of the normal that stand for the distribution
# The terms kept: those whose removal makes the published corpus's error worse (benchmarks/model_published.py,
# docs/model.md). predict-scaling and proxy --backend sim apply them to a hardware without a fit.
KEPT = ("nic", "stragglers")


def nic_efficiency(hw: Hardware) -> Evidence | None:
    """The evidence for `hw`'s NIC class (by its inter-node bw_gbps), None for a rate of no known class."""
    cls = LINE_RATE_CLASS_GBPS.get(round(hw.inter.bw_gbps, 3))
    return NIC_EFFICIENCY.get(cls) if cls else None


def delivered(hw: Hardware, nic: bool = True, blocking: float | None = None) -> Hardware:
    """`hw` with its NICs at what nccl-tests delivers for their class (`nic`; an unknown class keeps its line
    rate), divided by the fabric's blocking factor where one is given (congestion)."""
    evidence = nic_efficiency(hw) if nic else None
    factor = (evidence.value if evidence else 1.0) / (blocking or 1.0)
    if factor == 1.0:
        return hw
    return replace(hw, inter=replace(hw.inter, bw_gbps=hw.inter.bw_gbps * factor))


def default_step_ratios(cv: float = DEFAULT_STEP_CV.value, draws: int = DEFAULT_DRAWS) -> np.ndarray:
    """Step times over their median as `draws` evenly spaced quantiles of a normal of coefficient of
    variation `cv`: the distribution stragglers.expected_max takes when no run was measured."""
    probabilities = (np.arange(draws) + 0.5) / draws
    quantiles = np.array([NormalDist().inv_cdf(p) for p in probabilities])  # scipy.stats takes 0.7 s to import
    return 1.0 + cv * quantiles
