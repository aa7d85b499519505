"""commbench against what users run on CPU, paired: allreduce float32 sum in place, 2 ranks.

Three tools in the same two processes (paired.py; under mpirun when Open MPI and mpi4py
are here), per size --pairs pairs of short slots in ABBA order (method.py):

  torch  commbench's torch backend: the call its harness prepares and times
         (TorchBackend.prepare: dist.all_reduce on gloo) in the harness's timed loop;
  gloo   a bare dist.all_reduce loop on the same process group;
  mpi    Open MPI through mpi4py, comm.Allreduce(MPI.IN_PLACE, buffer) (Open MPI's default
         transport: shared memory on one host, where gloo uses TCP on loopback;
         --mpi-args "--mca btl self,tcp" compares on the same transport).

Comparisons: torch:gloo (ratio = bare time / commbench time per pair: 1 when commbench
measures what a bare loop measures) and gloo:mpi (MPI's time / gloo's: below 1, MPI is
faster). Reported per size: the median ratio and the IQR of the pair ratios; per-pair
values in --json. Verdict on torch:gloo (commbench measures gloo within 5% at >= 64 KiB,
10% below): pass when the whole IQR lies within, FAIL when it lies outside, noisy when it
crosses the edge. Without MPI the mpi tool is skipped with one line, the ranks are local
processes. The harness's own cost per call, without gloo's noise: harness_overhead.py.

Slots last 0.2 s here (0.05 s in shm_vs_peers.py): a gloo call takes 0.4-8 ms on this
machine, heavy-tailed, so a short slot holds too few calls for its mean to settle.

Run from the repository root (about 2-3 minutes with the defaults on 2 cores):

    python benchmarks/peers_cpu.py --json out/peers_cpu.json
    python benchmarks/peers_cpu.py --sizes 1K,64K --pairs 2
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import method
import paired

from commbench.sizes import SizeError, format_size, parse_sizes

WORLD = 2
DEFAULT_SIZES = "1K,16K,64K,256K,1M,4M,16M,64M"
SMALL_LIMIT, LARGE_LIMIT, LARGE_FROM_NBYTES = 0.10, 0.05, 64 << 10


def summarize(record: dict) -> dict:
    nbytes = record["nbytes"]
    row: dict = {"nbytes": nbytes}
    for tool in ("torch", "gloo", "mpi"):
        row[f"{tool}_time_us"] = method.median(paired.slot_times(record, tool))
        row[f"{tool}_busbw_gbps"] = method.allreduce_bandwidths_gbps(nbytes, row[f"{tool}_time_us"], WORLD)[1]
    row["torch:gloo"] = paired.comparison(record, "torch:gloo")
    row["gloo:mpi"] = paired.comparison(record, "gloo:mpi")
    limit = LARGE_LIMIT if nbytes >= LARGE_FROM_NBYTES else SMALL_LIMIT
    row["limit"] = limit
    row["verdict"] = method.judge_within(row["torch:gloo"], 1 - limit, 1 + limit)
    return row


def print_report(rows: list[dict], pairs: int) -> None:
    print(f"\n# median time_us over every slot of the tool; paired ratios (B time / A time per pair, {pairs} ABBA "
          "pairs): median [q1-q3]")
    table = method.Table(["size", "commbench us", "bare gloo us", "mpi us", "gloo/commbench", "mpi/gloo",
                          "target", "verdict", "mpi busbw"], widths={"gloo/commbench": 20, "mpi/gloo": 22})
    print(table.header())
    for row in rows:
        print(table.row([format_size(row["nbytes"]), row["torch_time_us"], row["gloo_time_us"], row["mpi_time_us"],
                         row["torch:gloo"].text(), row["gloo:mpi"].text(), f"+-{100 * row['limit']:.0f}%",
                         row["verdict"], row["mpi_busbw_gbps"]]))
    print(f"# {len(rows)} sizes: {method.verdict_counts([r['verdict'] for r in rows])} (commbench within the target "
          "of a bare loop, judged on the IQR of the pair ratios)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes per rank [default: %(default)s]")
    parser.add_argument("--mpi-args", default="", metavar="ARGS", help="extra mpirun options, one quoted string")
    parser.add_argument("--out-dir", default="out/peers_cpu", help="the ranks' JSON lines [default: %(default)s]")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the summary and every pair here")
    paired.add_pair_options(parser, slot_time_s=0.2, pairs=10)  # gloo's calls are heavy-tailed: longer slots
    args = parser.parse_args(argv)
    args.check = False  # no shm here
    try:
        sizes = sorted(set(parse_sizes(args.sizes)))
    except SizeError as exc:
        method.fail(str(exc))
    if any(nbytes % 4 or nbytes < 4 for nbytes in sizes) or args.pairs < 1:
        method.fail("sizes must be positive multiples of 4 bytes, --pairs at least 1")
    compare = ["torch:gloo", "gloo:mpi"]
    missing = paired.mpi_missing()
    if missing:
        print(f"# Open MPI skipped: {missing} (see benchmarks/README.md)")
        compare.remove("gloo:mpi")
    print(f"# peers on CPU, paired: allreduce float32 sum in place, {WORLD} ranks, {', '.join(compare)}, "
          f"{args.pairs} ABBA pairs of ~{args.slot_time:g} s slots per size, {os.cpu_count()} CPUs", flush=True)
    started = time.perf_counter()
    records = paired.run_job(sizes, compare, args, os.path.join(args.out_dir, "pairs.jsonl"))
    rows = [summarize(record) for record in records]
    print_report(rows, args.pairs)
    wall_s = time.perf_counter() - started
    print(f"# wall time {wall_s:.0f} s")
    if args.json_path:
        method.write_json(args.json_path, "peers_cpu", args, comparisons=compare, mpi_skipped=missing,
                          wall_s=wall_s, rows=rows, records=records)
        print(f"# wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
