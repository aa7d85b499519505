"""Proxy vs real DDP training, side by side: for each model, `commbench proxy MODEL --validate`
replays the model's gradient traffic with the compute measured on this machine, then trains
the real model with the same batch, ranks, buckets and backend, and reports the proxy's
step-time error. Target (issue): within 15% for resnet18 and resnet50 at 2 CPU ranks.

    python benchmarks/proxy_validate.py                      # the default model list, 2 ranks
    python benchmarks/proxy_validate.py --models resnet18,resnet50 --steps 20 --out runs/validate

Batches are chosen so that a CPU step takes about a second or a few; change them with
MODEL:BATCH (e.g. resnet50:16). Prints a Markdown table; every run's JSON Lines are kept in --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

DEFAULT = ("resnet18:4,resnet50:4,alexnet:8,mobilenet_v2:8,vgg16:1,inception_v3:2,vovnet39a:2,"
           "vit_small_patch16_224:4,resnet101:2,tts_angular:64,speech_transformer:2,bert-base:1,gpt2:1")


def run(model: str, batch: int, args: argparse.Namespace) -> dict:
    out = os.path.join(args.out, f"{model}.jsonl")
    cmd = [sys.executable, "-m", "commbench", "proxy", model, "--nprocs", str(args.nprocs), "--batch", str(batch),
           "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps), "--validate", "--json", out,
           "--force"]  # a rerun into the same folder replaces the last one
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.monotonic() - started
    if proc.returncode != 0:
        return {"model": model, "batch": batch, "error": None, "note": proc.stderr.strip().splitlines()[-1:],
                "took_s": took}
    with open(out, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    check = next((r for r in records if r["record"] == "validate"), None)
    proxy = next((r for r in records if r["record"] == "proxy"), None)
    if check is None or proxy is None:
        return {"model": model, "batch": batch, "error": None, "note": ["no validate record written"], "took_s": took}
    return {"model": model, "batch": batch, "proxy_ms": check["proxy_step_us"] / 1e3,
            "train_ms": check["train_step_us"] / 1e3, "error": check["error"],
            "exposed_ms": (proxy["exposed_comm_us_p50"] or 0) / 1e3, "comm_ms": (proxy["comm_us_p50"] or 0) / 1e3,
            "gradient_mib": proxy["gradient_bytes"] / 2**20, "took_s": took}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT, help="MODEL:BATCH,... [default: %(default)s]")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--out", default="runs/proxy-validate")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"# proxy vs real DDP training, {args.nprocs} ranks, torch gloo on CPU, medians of {args.steps} steps "
          f"after {args.warmup_steps}; {time.strftime('%Y-%m-%d')}", flush=True)
    print("| model | batch/rank | gradients (MiB) | proxy step (ms) | training step (ms) | proxy error | "
          "proxy comm (ms) | exposed (ms) |\n|---|---|---|---|---|---|---|---|", flush=True)
    for item in args.models.split(","):
        model, _, batch = item.partition(":")
        row = run(model, int(batch or 1), args)
        if row["error"] is None:
            print(f"| {model} | {row['batch']} | - | - | - | failed: {' '.join(row['note'])} | - | - |", flush=True)
            continue
        print(f"| {model} | {row['batch']} | {row['gradient_mib']:.1f} | {row['proxy_ms']:.1f} | "
              f"{row['train_ms']:.1f} | "
              f"{100 * row['error']:+.1f}% | {row['comm_ms']:.1f} | {row['exposed_ms']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
