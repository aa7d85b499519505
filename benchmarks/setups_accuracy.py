"""Training setups, replayed, trained and predicted, side by side (issue 23's targets; docs/setups.md).

For each model and setup, on 2 local CPU ranks (gloo) or, as root, on an emulated cluster (--emulate 2x1
--link RATE):
1. `commbench proxy MODEL --setup S --validate`: the replay of the setup with this machine's compute, then
   the real training of the same setup (DDP with its hook/bucket cap/no_sync, FSDP2 fully_shard), and the
   replay's step error against the training;
2. `commbench check` of both files against a fit of gloo's allreduce, all-gather and reduce-scatter measured
   on the same ranks (`commbench sweep` then `commbench fit`): the predicted step's error against each;
3. the ranking of the setups by step time, measured (training) and predicted, per model.

    python benchmarks/setups_accuracy.py --out runs/setups                 # 2 local ranks
    python benchmarks/setups_accuracy.py --emulate 2x1 --link 1gbit --out runs/setups-emu   # as root

Targets: replay vs training median |error| <= 5%, max <= 10%; predicted vs measured median |error| <= 5%;
identical rankings. Every run's JSON Lines are kept in --out; the tables are Markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETUPS = {  # the list: DDP (default and one bucket), accumulation 4, fp16 compression, FSDP x3
    "ddp": [], "ddp-one-bucket": ["--bucket-mb", "10000"], "ddp-accumulate-4": ["--accumulate", "4"],
    "ddp-fp16": ["--setup", "ddp-fp16"], "fsdp-full": ["--setup", "fsdp-full"],
    "fsdp-grad-op": ["--setup", "fsdp-grad-op"], "fsdp-hybrid": ["--setup", "fsdp-hybrid"],
}


def commbench(*args: str, timeout_s: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commbench", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def records(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def layout_args(args: argparse.Namespace) -> list[str]:
    return ["--emulate", args.emulate, "--link", args.link] if args.emulate else ["--nprocs", str(args.nprocs)]


def fit_here(args: argparse.Namespace) -> str:
    """A fit of gloo's three collectives on the ranks the runs use."""
    sweep, hw = os.path.join(args.out, "sweep.jsonl"), os.path.join(args.out, "hw.json")
    if not os.path.exists(hw):
        proc = commbench("sweep", *layout_args(args), "-c", "allreduce", "-c", "allgather", "-c", "reduce_scatter",
                         "--sizes", "64K-64M", "--factor", "4", "--json", sweep, "--force")
        if proc.returncode != 0:
            sys.exit(f"sweep failed: {proc.stderr.strip().splitlines()[-1:]}")
        proc = commbench("fit", sweep, "-o", hw, "--accept-poor-fit")
        if proc.returncode != 0:
            sys.exit(f"fit failed: {proc.stderr.strip().splitlines()[-1:]}")
    return hw


def run_one(model: str, batch: int, name: str, extra: list[str], hw: str, args: argparse.Namespace) -> dict:
    out = os.path.join(args.out, f"{model}-{name}.jsonl")
    row = {"model": model, "setup": name, "batch": batch}
    if not os.path.exists(out):
        started = time.monotonic()
        proc = commbench("proxy", model, *layout_args(args), "--batch", str(batch), "--steps", str(args.steps),
                         "--warmup-steps", str(args.warmup_steps), *extra, "--validate", "--json", out)
        row["took_s"] = time.monotonic() - started
        if proc.returncode != 0:
            return {**row, "note": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    train = out[:-6] + ".train.jsonl"
    proxy = next(r for r in records(out) if r["record"] == "proxy")
    trained = next((r for r in records(train) if r["record"] == "proxy"), None) if os.path.exists(train) else None
    row.update(replay_ms=proxy["step_us_p50"] / 1e3, train_ms=trained["step_us_p50"] / 1e3 if trained else None)
    if trained:
        row["replay_error"] = proxy["step_us_p50"] / trained["step_us_p50"] - 1
    proc = commbench("check", out, *( [train] if trained else []), "--hw", hw, "--force", "--json",
                     os.path.join(args.out, f"{model}-{name}.check.jsonl"))
    if proc.returncode == 0:
        rows = [r for r in records(os.path.join(args.out, f"{model}-{name}.check.jsonl")) if r["record"] == "check"]
        for r in rows:
            if r["what"] == "step":
                row["predicted_ms"] = r["predicted_us"] / 1e3
                row[f"{r['kind']}_predicted_error"] = r["error"]
    else:
        row["check_note"] = (proc.stderr.strip().splitlines() or ["check failed"])[-1]
    return row


def ranking(rows: list[dict], key: str) -> list[str]:
    return [r["setup"] for r in sorted((r for r in rows if r.get(key)), key=lambda r: r[key])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18:4,bert-base:1", help="MODEL:BATCH,... [default: %(default)s]")
    parser.add_argument("--setups", default=",".join(SETUPS), help="[default: %(default)s]")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--emulate", default=None, metavar="NODESxRANKS")
    parser.add_argument("--link", default="1gbit")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--out", default="runs/setups")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"# setups: replay vs training vs prediction; {args.emulate or f'{args.nprocs} local ranks'} gloo on CPU; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; load {os.getloadavg()[0]:.1f}", flush=True)
    hw = fit_here(args)
    print("| model | setup | replay (ms) | training (ms) | replay error | predicted (ms) | error vs replay | "
          "error vs training |\n|---|---|---|---|---|---|---|---|", flush=True)
    all_rows = []
    for item in args.models.split(","):
        model, batch = item.split(":")
        rows = [run_one(model, int(batch), name, SETUPS[name], hw, args) for name in args.setups.split(",")]
        for r in rows:
            cells = [f"{r[k]:.1f}" if isinstance(r.get(k), float) else "-" for k in ("replay_ms", "train_ms")]
            errors = [f"{r[k] * 100:+.1f}%" if isinstance(r.get(k), float) else "-"
                      for k in ("replay_error", "proxy_predicted_error", "train_predicted_error")]
            print(f"| {model} | {r['setup']} | {cells[0]} | {cells[1]} | {errors[0]} | "
                  f"{r.get('predicted_ms', float('nan')):.1f} | {errors[1]} | {errors[2]} |"
                  + (f" {r.get('note') or r.get('check_note')}" if r.get("note") or r.get("check_note") else ""),
                  flush=True)
        print(f"# {model}: ranking measured (training) {ranking(rows, 'train_ms')}, predicted "
              f"{ranking(rows, 'predicted_ms')}", flush=True)
        all_rows += rows
    for key in ("replay_error", "proxy_predicted_error", "train_predicted_error"):
        errors = [abs(r[key]) for r in all_rows if isinstance(r.get(key), float)]
        if errors:
            print(f"# {key}: median |error| {statistics.median(errors) * 100:.1f}%, max {max(errors) * 100:.1f}% "
                  f"over {len(errors)} runs", flush=True)
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(all_rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
