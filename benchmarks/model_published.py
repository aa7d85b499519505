"""Published data-parallel training tables against `commbench predict-scaling`.

Each table's 1-GPU throughput sets the compute time (so its 1-GPU row is the input, not a
prediction); the model then predicts the other rows from a hardware preset and the
model's profile. Nothing is tuned to these tables: the presets' figures come from their
own public sources (analysis/presets/README.md).

Two inputs, side by side (docs/model.md, "Terms the model counts"):
- `no ddp`: the 1-GPU run without DDP (what the model took before 2026-11-23);
- `1 GPU DDP`: the 1-GPU run with DDP, where the table gives one: it holds DDP's own work
  per step (copying gradients into and out of buckets, hooks, launches), measured by the
  table itself at 1 GPU, where no traffic leaves the GPU. That is the per-step term
  measured at 1 rank that the model adds to its timeline (on this host the proxy measures it).

Tables (per-GPU throughput, images/s):
- PyTorch's DDP benchmark, pytorch/pytorch benchmarks/distributed/ddp/README.md: ResNet-50,
  ResNet-101, ResNeXt-50 32x4d and ResNeXt-101 32x8d, batch 32 per GPU, DGX-1 V100
  machines with 4x 100 Gb/s InfiniBand each ("1M/8G" = 1 machine, 8 GPUs; p50 rows);
  `no ddp` and `1M/1G` are its two 1-GPU rows.
- NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md
  (commit 291f0d02, pytorch-21.03 container): ResNet-50 v1.5 (torchvision's resnet50
  layout), DGX-1 16GB (FP32 batch 112, AMP 256 per GPU) and DGX A100 80GB (TF32 and AMP,
  batch 256), 1 and 8 GPUs; batches from PyTorch/Classification/ConvNets/configs.yml. These
  tables have no 1-GPU DDP row: both inputs are the 1-GPU row.

    python benchmarks/model_published.py [--out DIR]   # DIR keeps the ResNeXt profiles it extracts
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

# (source, model, preset, batch, gpus-per-node, no-ddp 1-GPU, 1-GPU DDP or None, {gpus: per-GPU images/s})
TABLES = [
    ("PyTorch DDP benchmark", "resnet50", "dgx1-v100-4ib", 32, 8, 329, 319, {2: 310, 4: 310, 8: 307, 16: 306}),
    ("PyTorch DDP benchmark", "resnet101", "dgx1-v100-4ib", 32, 8, 197, 187, {2: 182, 4: 182, 8: 179, 16: 178}),
    ("PyTorch DDP benchmark", "resnext50_32x4d", "dgx1-v100-4ib", 32, 8, 220, 217,
     {2: 209, 4: 208, 8: 204, 16: 203}),
    ("PyTorch DDP benchmark", "resnext101_32x8d", "dgx1-v100-4ib", 32, 8, 77, 75, {2: 73, 4: 72, 8: 71, 16: 71}),
    ("NVIDIA DLE, DGX-1 FP32", "resnet50", "dgx1-v100", 112, 8, 367, None, {8: 2855 / 8}),
    ("NVIDIA DLE, DGX-1 AMP", "resnet50", "dgx1-v100", 256, 8, 1200, None, {8: 8322 / 8}),
    ("NVIDIA DLE, DGX A100 TF32", "resnet50", "dgx-a100", 256, 8, 938, None, {8: 7248 / 8}),
    ("NVIDIA DLE, DGX A100 AMP", "resnet50", "dgx-a100", 256, 8, 2470, None, {8: 16621 / 8}),
]
EXTRACTED = {"resnext50_32x4d", "resnext101_32x8d"}  # torchvision models without a shipped profile


def profile_of(model: str, out: str):
    from commbench.proxies.profile import load_profile

    if model not in EXTRACTED:
        return load_profile(model)
    path = os.path.join(out, f"{model}.json")
    if not os.path.exists(path):
        os.makedirs(out, exist_ok=True)
        subprocess.run([sys.executable, "-m", "commbench", "profiles", "extract", f"torchvision:{model}", "-o", path],
                       check=True, stdout=subprocess.DEVNULL)
    return load_profile(path)


def predicted_rates(profile, hw, batch: int, per_node: int, one_gpu: float, counts: list[int]) -> dict:
    """{gpus: (per-GPU images/s, exposed comm us)} with the compute of a 1-GPU run at `one_gpu` images/s."""
    from commbench.analysis.predict_scaling import compute_us
    from commbench.analysis.scaling import predict_scaling

    forward, backward, _ = compute_us(profile, hw, batch, one_gpu, None, "fp32")
    return {p.gpus: (p.samples_per_s / p.gpus, p.exposed_comm_us)
            for p in predict_scaling(profile, hw, counts, per_node, batch, forward, backward)}


def main() -> int:
    from commbench.analysis.costmodel import load_hardware

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/published", help="where extracted profiles are kept")
    args = parser.parse_args()
    print("| source | model | preset | batch/GPU | GPUs | published (img/s per GPU) | predicted from no ddp | error | "
          "predicted from 1 GPU DDP | error | exposed comm (ms) |\n|---|---|---|---|---|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {"no ddp": [], "1 GPU DDP": []}
    for source, model, preset, batch, per_node, no_ddp, ddp1, table in TABLES:
        profile, hw = profile_of(model, args.out), load_hardware(preset)
        counts = sorted(table)
        before = predicted_rates(profile, hw, batch, per_node, no_ddp, counts)
        after = predicted_rates(profile, hw, batch, per_node, ddp1 or no_ddp, counts)
        for gpus in counts:
            published = table[gpus]
            cells = []
            for name, rates in (("no ddp", before), ("1 GPU DDP", after)):
                error = rates[gpus][0] / published - 1
                errors[name].append(error)
                cells += [f"{rates[gpus][0]:.0f}", f"{100 * error:+.1f}%"]
            print(f"| {source} | {model} | {preset} | {batch} | {gpus} | {published:.0f} | {' | '.join(cells)} | "
                  f"{after[gpus][1] / 1e3:.2f} |")
    for name, values in errors.items():
        absolute = [abs(e) for e in values]
        print(f"\nfrom {name}: median |error| {100 * statistics.median(absolute):.1f}%, "
              f"max {100 * max(absolute):.1f}%, "
              f"{sum(e > 0 for e in values)} of {len(values)} rows optimistic (predicted faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
