"""alltoall's `auto` rule on shm: two of commbench's all-to-all algorithms measured in pairs.

For each rank count, --pairs pairs of real `commbench sweep --backend shm -c alltoall` runs, one
per algorithm, in ABBA order (A B, B A, ...: method.py's pairing, so both see the machine at the
same times), each over all --sizes with the result check on. Per size and pair the ratio
p50_us(B) / p50_us(A) (p50_us: the median over calls of each call's slowest
rank, which a call stalled by another job on the machine moves less than the mean); printed as the median and
interquartile range over pairs, per-pair values in --json. A ratio above 1 means A was faster.

    python benchmarks/alltoall_auto.py --ranks 2,3,4 --compare pairwise:bruck --sizes 1K,16K,256K,4M
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def sweep(algorithm: str, ranks: int, sizes: str, iters: int, folder: str) -> dict[int, float]:
    """One sweep's p50_us per requested size (exit 1 on a failed or wrong run)."""
    path = os.path.join(folder, f"{algorithm}-{ranks}.jsonl")
    if os.path.exists(path):
        os.remove(path)
    proc = subprocess.run([sys.executable, "-m", "commbench", "sweep", "--backend", "shm", "-N", str(ranks),
                           "-c", "alltoall", "--algorithm", algorithm, "--sizes", sizes, "--iters", str(iters),
                           "--warmup", "5", "--json", path], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"alltoall_auto: {algorithm} on {ranks} ranks failed: {proc.stderr.strip()[-300:]}")
    with open(path) as f:
        results = [r for r in map(json.loads, f) if r.get("record") == "result"]
    if any(r["wrong"] for r in results):
        sys.exit(f"alltoall_auto: {algorithm} on {ranks} ranks gave wrong results")
    return {r["requested_nbytes"]: r["p50_us"] for r in results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,3,4")
    parser.add_argument("--compare", default="pairwise:bruck", help="A:B, two alltoall algorithms")
    parser.add_argument("--sizes", default="1K,16K,256K,4M")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args()
    first, second = args.compare.split(":")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for ranks in map(int, args.ranks.split(",")):
            ratios: dict[int, list[float]] = {}
            for pair in range(args.pairs):
                order = (first, second) if pair % 2 == 0 else (second, first)
                times = {name: sweep(name, ranks, args.sizes, args.iters, folder) for name in order}
                for size, time_us in times[first].items():
                    ratios.setdefault(size, []).append(times[second][size] / time_us)
            for size, values in sorted(ratios.items()):
                q1, median, q3 = np.percentile(values, [25, 50, 75])
                print(f"{ranks} ranks {size:>10} B  {second}/{first} {median:.2f} [{q1:.2f}-{q3:.2f}]", flush=True)
                rows.append({"ranks": ranks, "nbytes": size, "compare": args.compare, "median": median,
                             "q1": q1, "q3": q3, "pairs": values})
    if args.json:
        with open(args.json, "w") as f:
            f.write("".join(json.dumps(row) + "\n" for row in rows))


if __name__ == "__main__":
    main()
