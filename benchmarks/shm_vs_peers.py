"""commbench's own shared-memory allreduce (--backend shm) against its peers and the memory bound, paired.

2 ranks on this host, allreduce float32 sum, in place. Every tool lives in the same two
processes (paired.py, under mpirun when Open MPI and mpi4py are here), and per size each
comparison runs --pairs pairs of short slots in ABBA order (method.py):

  shm:mpi    commbench's shm backend (algorithm auto) against Open MPI's
             MPI_Allreduce(MPI_IN_PLACE) through mpi4py (transport: --mpi-args, by
             default "--mca pml ob1 --mca btl self,vader": shared memory);
  shm:gloo   against a bare torch.distributed all_reduce (gloo);
  p2p:gloo   commbench's ring over torch send/recv against the same gloo loop;
  shm:bound  against the memory bound of a pulled 2-rank ring (at --bound-sizes, 256 MiB):
             both ranks at once copy (np.copyto) and add (np.add(out=)) private float32
             arrays of the size; t_bound = t_add/2 + t_copy/2, since each rank adds S/2 and
             copies S/2 (busbw factor 2(n-1)/n = 1 at n = 2). Issue 13's bound: shm's ring
             pushes since 2026-11-26 and moves less than this (deepspeed_peer.py judges the
             least-traffic bound, copybound);
  shm:bound4k, bound4k:bound  the same bound with the arrays in /dev/shm mappings, as
             shm's segments are (4 KiB pages where shmem_enabled = never, while NumPy's
             private arrays get transparent huge pages): how much of shm's gap to the
             bound is the page size, and how much the executor's own.

Each pair gives ratio = B's time_us / A's time_us (above 1: A faster; for shm:bound it
is the fraction of the bound shm reaches). Reported: the median ratio and the
interquartile range (IQR) of the pair ratios; the per-pair values are in --json. The shm
column's times are the median of all its slots; once per size commbench's harness also
runs shm with the result check on (#wrong, must be 0).

Targets, each judged per size on the IQR of the pair ratios (pass: the whole IQR meets
it; FAIL: the whole IQR misses it; noisy: the IQR straddles it):

  T1  shm/gloo >= 5x at 1 MiB-256 MiB (busbw; = gloo time / shm time);
  T2  shm >= mpi at every size (issue 13: at or below Open MPI's time, 1 KiB and up);
  T3  shm >= 1.3x mpi at >= 16 MiB;
  T4  shm time_us at 1 KiB <= 8 us (judged on the IQR of shm's slot times);
  T5  shm at the bound sizes >= 85% of the memory bound (issue 13, part 3).

Run from the repository root (about 2-3 minutes with the defaults on 2 cores):

    python benchmarks/shm_vs_peers.py --json out/shm_vs_peers.json
    python benchmarks/shm_vs_peers.py --sizes 1K,1M --pairs 2 --bound-sizes 1M     # ~15 s
"""
from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import time

import method
import paired

from commbench.sizes import SizeError, format_size, parse_sizes

WORLD = 2
DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M,256M"
COMPARISONS = ("shm:mpi", "shm:gloo", "p2p:gloo", "shm:bound", "shm:bound4k", "bound4k:bound")
MiB, KiB = 1 << 20, 1 << 10
SHM_1K_MAX_US = 8.0
BOUND_FRACTION = 0.85


def mpi_shared_memory_args() -> tuple[str, str]:
    """(mpirun options that force Open MPI's shared-memory transport, how they were chosen)."""
    try:
        listing = subprocess.run(["ompi_info"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"ompi_info failed ({exc}); Open MPI's default transport"
    for component in ("vader", "sm"):  # vader: Open MPI 2-4; sm: Open MPI 5
        if re.search(rf"MCA btl: {component}\b", listing):
            return f"--mca pml ob1 --mca btl self,{component}", f"btl {component} found by ompi_info"
    return "", "no shared-memory btl listed by ompi_info; Open MPI's default transport"


# ---------------------------------------------------------------- summary


def summarize(record: dict) -> dict:
    """One size: each comparison's paired ratio, and each tool's median slot time."""
    row: dict = {"nbytes": record["nbytes"], "shm_algorithm": record["tools"].get("shm", {}).get("algorithm"),
                 "shm_wrong": record.get("shm_checked", {}).get("wrong")}
    for tool in ("shm", "p2p", "gloo", "mpi", "bound", "bound4k"):
        times = paired.slot_times(record, tool)
        row[f"{tool}_time_us"] = method.median(times)
        row[f"{tool}_p50_us"] = method.median(paired.slot_times(record, tool, "p50_us"))
        row[f"{tool}_busbw_gbps"] = method.allreduce_bandwidths_gbps(record["nbytes"], row[f"{tool}_time_us"],
                                                                      WORLD)[1] if times else math.nan
        if tool == "shm":
            row["shm_slot_times_us"] = times
    for key in COMPARISONS:
        row[key] = paired.comparison(record, key)
    return row


def verdicts(rows: list[dict]) -> list[dict]:
    out = []

    def add(target: str, row: dict, ratio: method.PairedRatio, needed: float, verdict: str) -> None:
        out.append({"target": target, "nbytes": row["nbytes"], "median": ratio.median, "q1": ratio.q1,
                    "q3": ratio.q3, "needed": needed, "verdict": verdict, "pairs": list(ratio.ratios)})

    for row in rows:
        nbytes = row["nbytes"]
        if MiB <= nbytes <= 256 * MiB:
            add("T1 shm/gloo", row, row["shm:gloo"], 5.0, method.judge_at_least(row["shm:gloo"], 5.0))
        add("T2 shm/mpi", row, row["shm:mpi"], 1.0, method.judge_at_least(row["shm:mpi"], 1.0))
        if nbytes >= 16 * MiB:
            add("T3 shm/mpi", row, row["shm:mpi"], 1.3, method.judge_at_least(row["shm:mpi"], 1.3))
        if nbytes == KiB and row["shm_slot_times_us"]:
            # time <= limit, judged as limit / time >= 1 on every slot
            limit = method.PairedRatio(tuple(SHM_1K_MAX_US / t for t in row["shm_slot_times_us"]))
            add("T4 8us/shm time", row, limit, 1.0, method.judge_at_least(limit, 1.0))
        if row["shm:bound"].ratios:
            add("T5 shm/bound", row, row["shm:bound"], BOUND_FRACTION,
                method.judge_at_least(row["shm:bound"], BOUND_FRACTION))
    return sorted(out, key=lambda check: (check["target"], check["nbytes"]))


# ---------------------------------------------------------------- report


def print_report(rows: list[dict], checks: list[dict], pairs: int) -> None:
    print("\n# time per allreduce (us): median over every slot of the tool (time_us = each rank's mean, max over "
          "ranks); shm p50_us = median over calls of each call's max over ranks")
    table = method.Table(["size", "shm algorithm", "shm time_us", "shm p50_us", "mpi time_us", "gloo time_us",
                          "p2p time_us", "shm busbw", "mpi busbw", "#wrong"], widths={"shm algorithm": 13})
    print(table.header())
    for row in rows:
        print(table.row([format_size(row["nbytes"]), str(row["shm_algorithm"]), row["shm_time_us"],
                         row["shm_p50_us"], row["mpi_time_us"], row["gloo_time_us"], row["p2p_time_us"],
                         row["shm_busbw_gbps"], row["mpi_busbw_gbps"], str(row["shm_wrong"])]))
    print(f"\n# paired ratios, B time / A time per pair ({pairs} ABBA pairs per size): median [q1-q3]; above 1: "
          "A is faster (shm:bound: the fraction of the memory bound shm reaches)")
    table = method.Table(["size", *COMPARISONS], widths={k: 20 for k in COMPARISONS})
    print(table.header())
    for row in rows:
        print(table.row([format_size(row["nbytes"]), *(row[k].text() for k in COMPARISONS)]))
    print("\n# targets, judged on the IQR of the pair ratios (pass: all of it meets the target; FAIL: none of it; "
          "noisy: it straddles the target)")
    table = method.Table(["target", "size", "median", "q1", "q3", "needed", "verdict"], widths={"target": 16})
    print(table.header())
    for check in checks:
        print(table.row([check["target"], format_size(check["nbytes"]), check["median"], check["q1"], check["q3"],
                         f">= {check['needed']:g}", check["verdict"]]))
    print(f"# {len(checks)} checks: {method.verdict_counts([c['verdict'] for c in checks])}")
    bound = [row for row in rows if row["shm:bound"].ratios]
    for row in bound:
        print(f"# memory bound at {format_size(row['nbytes'])}: t_bound = t_add/2 + t_copy/2 = "
              f"{row['bound_time_us']:.0f} us (median over slots; busbw_bound {row['bound_busbw_gbps']:.2f} GB/s); "
              f"shm {row['shm_time_us']:.0f} us")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help="bytes per rank, as commbench --sizes; multiples of 4 [default: %(default)s]")
    parser.add_argument("--bound-sizes", default="256M", help="sizes of the shm:bound comparison [default: 256M]")
    parser.add_argument("--compare", default=",".join(COMPARISONS),
                        help=f"which of {', '.join(COMPARISONS)} to run [default: all]")
    parser.add_argument("--mpi-args", default=None, metavar="ARGS",
                        help='mpirun options, one quoted string [default: "--mca pml ob1 --mca btl self,vader" '
                             '(or self,sm), Open MPI\'s shared-memory transport, as ompi_info lists it]')
    parser.add_argument("--out-dir", default="out/shm_vs_peers", help="the ranks' JSON lines [default: %(default)s]")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the summary and every pair here")
    paired.add_pair_options(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sizes = sorted(set(parse_sizes(args.sizes)))
        bound_sizes = sorted(set(parse_sizes(args.bound_sizes))) if args.bound_sizes else []
    except SizeError as exc:
        method.fail(str(exc))
    if any(nbytes % 4 or nbytes < 4 for nbytes in sizes):
        method.fail("sizes must be positive multiples of 4 bytes (float32 elements)")
    if args.pairs < 1:
        method.fail("--pairs must be at least 1")
    compare = [c.strip() for c in args.compare.split(",") if c.strip()]
    if not compare or any(c not in COMPARISONS for c in compare):
        method.fail(f"--compare: a comma list of {', '.join(COMPARISONS)}")
    missing = paired.mpi_missing()
    if missing:
        print(f"# Open MPI skipped: {missing} (see the install commands in benchmarks/README.md)")
        compare = [c for c in compare if "mpi" not in c]
    transport = "given with --mpi-args"
    if args.mpi_args is None:
        args.mpi_args, transport = mpi_shared_memory_args() if not missing else ("", "")
    print(f"# shm vs peers, paired: allreduce float32 sum in place, {WORLD} ranks, {', '.join(compare)}; "
          f"{args.pairs} ABBA pairs of ~{args.slot_time:g} s slots per size; {os.cpu_count()} CPUs; "
          f"Open MPI transport: {args.mpi_args or 'default'} ({transport or 'n/a'})", flush=True)
    started = time.perf_counter()
    records = paired.run_job(sizes, compare, args, os.path.join(args.out_dir, "pairs.jsonl"),
                             [n for n in bound_sizes if n in sizes])
    rows = [summarize(record) for record in records]
    checks = verdicts(rows)
    print_report(rows, checks, args.pairs)
    wall_s = time.perf_counter() - started
    print(f"# wall time {wall_s:.0f} s")
    if args.json_path:
        method.write_json(args.json_path, "shm_vs_peers", args, world_size=WORLD, comparisons=compare,
                          mpi_skipped=missing, mpi_transport=transport, cpus=os.cpu_count(), wall_s=wall_s,
                          method="paired slots, ABBA; ratio = B time_us / A time_us per pair; median and IQR of "
                                 "the pair ratios; verdicts on the IQR (method.py)",
                          rows=rows, verdicts=checks, records=records)
        print(f"# wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
