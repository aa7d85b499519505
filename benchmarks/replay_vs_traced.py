"""The replay's step time against the traced run's own, on local CPU ranks over gloo.

Each pair captures a real job's trace (benchmarks/capture_trace.py: DDP with its default buckets, or
FSDP2 fully_shard per layer; torch.profiler on every step after the warm-up) and replays it with
`commbench replay` on as many ranks, at once after it (a replay needs its capture first, so the pairs
cannot alternate their order; each pair's ratio compares two runs a few seconds apart). Per pair: the
traced run's median step (per step, its slowest rank; wall time around the step, profiler included,
as the trace shows it) and the replay's median step; then the median of the ratios replay / traced
and their range.

    python benchmarks/replay_vs_traced.py --setup ddp --pairs 4
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def capture(folder: str, setup: str, nprocs: int, steps: int) -> float:
    """The traced run's median step, microseconds (per step, the slowest rank)."""
    command = [sys.executable, os.path.join(HERE, "capture_trace.py"), "--out", folder, "--setup", setup,
               "--nprocs", str(nprocs), "--steps", str(steps), "--width", "512", "--layers", "4"]
    for attempt in range(3):  # a loaded host can time out gloo's rendezvous: say so, and try again
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode == 0:
            break
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"# capture failed ({last[:160]}){'; again' if attempt < 2 else ''}", flush=True)
    else:
        raise SystemExit("the capture failed three times")
    with open(os.path.join(folder, "steps.json"), encoding="utf-8") as f:
        ranks = json.load(f)["steps_us"]
    return statistics.median(max(step) for step in zip(*ranks))


def replay(folder: str, nprocs: int, steps: int) -> float:
    out = os.path.join(folder, "replay.jsonl")
    traces = [os.path.join(folder, f"rank{r}.json") for r in range(nprocs)]
    subprocess.run([sys.executable, "-m", "commbench", "replay", *traces, "--steps", str(steps), "--warmup-steps",
                    "2", "--json", out, "--force"], check=True, capture_output=True)
    with open(out, encoding="utf-8") as f:
        summary = [json.loads(line) for line in f if '"record": "proxy"' in line][-1]
    return summary["step_us_p50"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", choices=("ddp", "fsdp2"), default="ddp")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8, help="Traced steps, and measured replay steps.")
    args = parser.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as folder:
        for pair in range(args.pairs):
            traced = capture(folder, args.setup, args.nprocs, args.steps)
            replayed = replay(folder, args.nprocs, args.steps)
            ratios.append(replayed / traced)
            print(f"pair {pair + 1}: traced {traced / 1e3:.2f} ms, replayed {replayed / 1e3:.2f} ms, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"{args.setup} on {args.nprocs} ranks: replay / traced median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f} to {max(ratios):.3f}, {len(ratios)} pairs)")


if __name__ == "__main__":
    main()
