"""Published data-parallel training tables against `commbench predict-scaling`.

Each table's 1-GPU throughput sets the compute time (so its 1-GPU row is the input, not a
prediction); the model then predicts the other rows from a hardware preset and the
model's profile. Nothing is tuned to these tables: the presets' figures come from their
own public sources (analysis/presets/README.md).

Tables (per-GPU throughput, images/s):
- PyTorch's DDP benchmark, pytorch/pytorch benchmarks/distributed/ddp/README.md: ResNet-50
  and ResNet-101, batch 32 per GPU, DGX-1 V100 machines with 4x 100 Gb/s InfiniBand each
  ("1M/8G" = 1 machine, 8 GPUs); the 1-GPU input is the "no ddp" row.
- NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md
  (commit 291f0d02, pytorch-21.03 container): ResNet-50 v1.5 (torchvision's resnet50
  layout), DGX-1 16GB (FP32 batch 112, AMP 256 per GPU) and DGX A100 80GB (TF32 and AMP,
  batch 256), 1 and 8 GPUs; batches from PyTorch/Classification/ConvNets/configs.yml.

    python benchmarks/model_published.py
"""
from __future__ import annotations

import statistics
import sys

# (source, model, preset, batch, gpus-per-node, {gpus: per-GPU images/s}; the first entry is the 1-GPU input)
TABLES = [
    ("PyTorch DDP benchmark", "resnet50", "dgx1-v100-4ib", 32, 8, {1: 329, 8: 307, 16: 306}),
    ("PyTorch DDP benchmark", "resnet101", "dgx1-v100-4ib", 32, 8, {1: 197, 8: 179, 16: 178}),
    ("NVIDIA DLE, DGX-1 FP32", "resnet50", "dgx1-v100", 112, 8, {1: 367, 8: 2855 / 8}),
    ("NVIDIA DLE, DGX-1 AMP", "resnet50", "dgx1-v100", 256, 8, {1: 1200, 8: 8322 / 8}),
    ("NVIDIA DLE, DGX A100 TF32", "resnet50", "dgx-a100", 256, 8, {1: 938, 8: 7248 / 8}),
    ("NVIDIA DLE, DGX A100 AMP", "resnet50", "dgx-a100", 256, 8, {1: 2470, 8: 16621 / 8}),
]


def main() -> int:
    from commbench.analysis.costmodel import load_hardware
    from commbench.analysis.predict_scaling import compute_us
    from commbench.analysis.scaling import predict_scaling
    from commbench.proxies.profile import load_profile

    print("| source | model | preset | batch/GPU | GPUs | published (img/s per GPU) | predicted | error | "
          "predicted exposed comm (ms) |\n|---|---|---|---|---|---|---|---|---|")
    errors = []
    for source, model, preset, batch, per_node, table in TABLES:
        profile, hw = load_profile(model), load_hardware(preset)
        one = table[1]
        forward, backward, _ = compute_us(profile, hw, batch, one, None, "fp32")
        counts = sorted(table)
        points = {p.gpus: p for p in predict_scaling(profile, hw, counts, per_node, batch, forward, backward)}
        for gpus in counts:
            p = points[gpus]
            predicted = p.samples_per_s / gpus
            error = predicted / table[gpus] - 1
            if gpus > 1:
                errors.append(abs(error))
            note = " (input)" if gpus == 1 else ""
            print(f"| {source} | {model} | {preset} | {batch} | {gpus} | {table[gpus]:.0f} | {predicted:.0f}{note} | "
                  f"{100 * error:+.1f}% | {p.exposed_comm_us / 1e3:.2f} |")
    print(f"\nmedian |error| over the predicted rows: {100 * statistics.median(errors):.1f}% "
          f"(max {100 * max(errors):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
