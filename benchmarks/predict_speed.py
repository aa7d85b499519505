"""How long `commbench predict-scaling` takes up to 1,000 GPUs (target: under a second).

Times the whole command as a user runs it (a fresh interpreter: start-up, imports, the
profile and preset loaded, every GPU count predicted for the baseline and the candidate)
--runs times, and beside it the prediction alone inside this process (the same call the
command makes, imports already paid), so the share that is interpreter start-up shows.
The speed target lives here rather than in a timed test, because test machines are noisy.

    python benchmarks/predict_speed.py
    python benchmarks/predict_speed.py --model resnet50 --runs 3
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

GPUS = [1, 8, 16, 32, 64, 128, 256, 512, 1000]
TARGET_S = 1.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-large", help="a shipped profile (default bert-large: 56 buckets)")
    parser.add_argument("--hw", default="dgx-a100", help="hardware preset")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each (default 5)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    from commbench.analysis.scaling import StepQuestion, predict_scaling
    from commbench.costmodel import load_hardware
    from commbench.proxies.profile import load_profile

    command = [sys.executable, "-m", "commbench", "predict-scaling", args.model, "--hw", args.hw,
               "--gpus", ",".join(map(str, GPUS)), "--batch", str(args.batch), "--tflops", "150",
               "--baseline", "nccl", "--candidate", "hier"]
    profile, hw = load_profile(args.model), load_hardware(args.hw)
    whole, inner = [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        whole.append(time.perf_counter() - start)
        start = time.perf_counter()
        for algorithm in ("nccl", "hier"):  # baseline and candidate, as the command does
            question = StepQuestion.ddp(profile, args.batch, 1e4, 2e4, algorithm=algorithm)
            points = predict_scaling(question, hw, GPUS[1:], 8)
        inner.append(time.perf_counter() - start)
        assert points[-1].gpus == 1000
    print(f"{args.model} on {args.hw}, GPU counts {','.join(map(str, GPUS))}, baseline nccl + candidate hier, "
          f"{args.runs} runs")
    print("| what | median (s) | min (s) | max (s) | target | verdict |\n|---|---|---|---|---|---|")
    for name, times in (("whole command (fresh interpreter)", whole), ("prediction alone (in process)", inner)):
        median = statistics.median(times)
        verdict = "pass" if median < TARGET_S else "FAIL"
        print(f"| {name} | {median:.3f} | {min(times):.3f} | {max(times):.3f} | < {TARGET_S:g} s | {verdict} |")
    print(f"prediction alone / whole command: {statistics.median(inner) / statistics.median(whole):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
