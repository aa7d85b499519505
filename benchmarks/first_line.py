"""How soon each command says something (issue 32 item 10: a first line within a second), paired with the
peer it used to wait for: a bare `import torch` in a new interpreter.

Per command, ABBA pairs of (the command's time to its first line of output, killed there; a fresh Python
importing torch); the ratio is command / torch import within each pair (below 1: the first line comes
before torch could have been imported), reported as median and spread with the command's own median.

    python benchmarks/first_line.py --pairs 4
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import method  # benchmarks/method.py: one-line errors

COMMANDS = {
    "sweep (torch)": ["sweep", "--sizes", "1K", "--nprocs", "2", "--backend", "torch"],
    "sweep (shm)": ["sweep", "--sizes", "1K", "--nprocs", "2", "--backend", "shm"],
    "proxy": ["proxy", "resnet50", "--nprocs", "2", "--steps", "1"],
    "train": ["train", "resnet18", "--nprocs", "2", "--steps", "1", "--batch", "1"],
    "nccl-tests": ["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "4K", "-g", "2"],
    "predict-scaling": ["predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8,64"],
}
PEER = [sys.executable, "-c", "import torch"]


def first_line_s(argv: list[str]) -> float:
    """Seconds from start to the first line on stdout or stderr; the process is killed there."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.stdout.readline()
    took = time.monotonic() - started
    proc.kill()
    proc.wait()
    return took


def peer_s() -> float:
    started = time.monotonic()
    subprocess.run(PEER, check=True)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args()
    if not 1 <= args.pairs <= 1000:
        method.fail(f"--pairs {args.pairs}: give 1 to 1000 pairs")
    print(f"# first line vs a fresh `import torch`, {args.pairs} ABBA pairs; load {os.getloadavg()[0]:.2f}")
    print(f"# {'command':<16} {'first line (s)':>14} {'import torch (s)':>16} {'ratio median':>12} {'range':>14}")
    for name, extra in COMMANDS.items():
        argv = [sys.executable, "-m", "commbench", *extra]
        ratios, own, peers = [], [], []
        for i in range(args.pairs):
            if i % 2 == 0:  # A B, then B A
                a = first_line_s(argv)
                b = peer_s()
            else:
                b = peer_s()
                a = first_line_s(argv)
            own.append(a)
            peers.append(b)
            ratios.append(a / b)
        print(f"  {name:<16} {statistics.median(own):>14.2f} {statistics.median(peers):>16.2f} "
              f"{statistics.median(ratios):>12.2f} {min(ratios):>6.2f}-{max(ratios):<6.2f}")
    print(f"# load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
