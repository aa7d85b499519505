"""commbench's shm allreduce against Open MPI and DeepSpeed's CPU shared-memory allreduce, paired,
with the memory bound measured beside it (issue 27).

2 ranks, allreduce float32 sum in place. Per size, one job of the paired ranks (paired.py,
under mpirun) runs the comparisons in ABBA pairs of short slots, every tool in the same two
processes:

  shm:mpi        commbench's shm backend (auto: the native executor where it builds) against
                 Open MPI's MPI_Allreduce(MPI_IN_PLACE) (shared-memory btl, as shm_vs_peers.py);
  shm:deepspeed  against deepspeed.comm.inference_all_reduce (DS_ACCELERATOR=cpu, LOCAL_SIZE=2;
                 DeepSpeed's C++ shared-memory op, built once here before the sizes run);
  shm:bound      at --bound-sizes (256 MiB): the memory bound of the 2-rank pull ring (paired.py:
                 both ranks copy and add private arrays of the size at once: 2.5 S per rank);
  shm:copybound  there too: the least traffic of any 2-rank allreduce (both ranks copy S at once,
                 the faster of NumPy's and a streaming copy: 2 S per rank), which shm's ring with
                 pushes moves; the 85% target is judged on this one, the stricter;
  shm:oop        shm in place against shm out of place (its own input and output buffers); the ratio is
                 out of place's time / in place's (issue 38: out of place no slower, <= 1.05, from
                 1 MiB); --no-oop leaves it out.

Each size is its own job, stopped after --size-timeout seconds (start-up included): where
DeepSpeed gives no result in that time, the size runs again without it, and the table says
"no result in N s" for DeepSpeed there. Where DeepSpeed or Open MPI is not installed, or
DeepSpeed's op does not build or run, the script says so and measures the rest (without Open
MPI the two ranks are local processes, as paired.py starts them: a machine with neither, a GPU
host say, still gets the bound and out-of-place rows).

Reported per size and comparison: ratio = B's time / A's time per pair (above 1: shm faster);
the median, the lower quartile (q1) and the range of the pair ratios; each tool's slot times.
Targets (issue 27), on the pair ratios:

  shm <= Open MPI, and <= DeepSpeed where it runs: median >= 1.0 and q1 >= 0.9 (met / MISSED);
  256 MiB: shm busbw >= 85% of the memory bound measured beside it: median of shm:copybound >= 0.85
  (shm:bound is reported beside it)
  (the issue asks for two runs at least an hour apart: run the script twice);
  out of place / in place <= 1.05 from 1 MiB (issue 38): oop:shm's median time ratio (met / MISSED).

    python benchmarks/deepspeed_peer.py --json out/deepspeed_peer.json          # ~3-5 min
    python benchmarks/deepspeed_peer.py --sizes 1K,1M --pairs 3 --bound-sizes ""   # ~1 min

Open MPI and mpi4py for the Open MPI column (benchmarks/README.md) and, for the DeepSpeed column,
`pip install -e '.[deepspeed]'` (its op is compiled with g++ on first use, ~30 s here).
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import time

import method
import paired

from commbench.sizes import SizeError, format_size, parse_sizes

WORLD = 2
DEFAULT_SIZES = "1K,4K,64K,1M,16M,256M"
MEDIAN_AT_LEAST, Q1_AT_LEAST, BOUND_FRACTION = 1.0, 0.9, 0.85
OOP_AT_MOST, OOP_FROM = 1.05, 1 << 20  # out of place / in place time, judged from 1 MiB (issue 38)
DS_SEGMENTS = "/dev/shm/deepspeed_allreduce_buffer_*"  # DeepSpeed's op leaves these behind


def deepspeed_missing() -> str | None:
    """Why the DeepSpeed column cannot run here (not installed, or its op does not build), or None."""
    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed not installed (pip install -e '.[deepspeed]')"
    code = ("from deepspeed.accelerator import get_accelerator\n"
            "get_accelerator().create_op_builder('ShareMemCommBuilder').load()\n")
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                              env={**os.environ, "DS_ACCELERATOR": "cpu"}, check=False)
    except subprocess.TimeoutExpired:
        return "DeepSpeed's shared-memory op did not build within 900 s"
    if done.returncode:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        return f"DeepSpeed's shared-memory op does not build or load here: {lines[-1][:200] if lines else '?'}"
    print(f"# DeepSpeed's shared-memory op built or found in {time.perf_counter() - started:.0f} s", flush=True)
    return None


def run_size(nbytes: int, compare: list[str], args: argparse.Namespace) -> tuple[dict | None, str | None]:
    """One size's job: (its record, None), or (None, why not) when it gave no result in time."""
    before = set(glob.glob(DS_SEGMENTS))
    job = argparse.Namespace(**{**vars(args), "timeout": args.size_timeout})
    bound = [nbytes] if nbytes in args.bound_list else []
    here = [c for c in compare if "bound" not in c or bound]
    if not here:
        return None, "nothing to compare at this size (no Open MPI or DeepSpeed, --no-oop, not a --bound-sizes size)"
    try:
        records = paired.run_job([nbytes], here, job, os.path.join(args.out_dir, f"{nbytes}.jsonl"), bound)
    except paired.JobTimeout as exc:
        return None, str(exc)
    finally:
        for path in set(glob.glob(DS_SEGMENTS)) - before:
            os.unlink(path)
    return (records[0] if records else None), None


def summarize(record: dict, ds_note: str | None) -> dict:
    row = {"nbytes": record["nbytes"], "deepspeed_note": ds_note,
           "shm_executor": record["tools"].get("shm", {}).get("executor"),
           "shm_algorithm": record["tools"].get("shm", {}).get("algorithm")}
    for tool in ("shm", "mpi", "deepspeed", "bound", "copybound", "oop"):
        times = paired.slot_times(record, tool)
        row[f"{tool}_times_us"] = times
        row[f"{tool}_time_us"] = method.median(times) if times else None
    row["shm_plan"] = record["tools"].get("shm", {}).get("plan")
    for key in ("shm:mpi", "shm:deepspeed", "shm:bound", "shm:copybound", "shm:oop"):
        row[key] = paired.comparison(record, key)
        row[f"{key} p50"] = paired.comparison(record, key, "p50_us")  # per-call medians: load spikes left out
    for tool in ("bound", "copybound"):
        if row[f"{tool}_time_us"]:
            row["shm_busbw_gbps"] = method.allreduce_bandwidths_gbps(row["nbytes"], row["shm_time_us"], WORLD)[1]
            row[f"{tool}_busbw_gbps"] = method.allreduce_bandwidths_gbps(row["nbytes"], row[f"{tool}_time_us"],
                                                                         WORLD)[1]
    return row


def verdict(ratio: method.PairedRatio, key: str) -> str:
    if not ratio.ratios:
        return "-"
    if key in ("shm:bound", "shm:copybound"):
        return "met" if ratio.median >= BOUND_FRACTION else "MISSED"
    if key == "shm:oop":  # out of place's time / in place's: above 1, out of place is slower
        return "met" if ratio.median <= OOP_AT_MOST else "MISSED"
    return "met" if ratio.median >= MEDIAN_AT_LEAST and ratio.q1 >= Q1_AT_LEAST else "MISSED"


def times_text(times: list[float]) -> str:
    return f"{min(times):.3g}-{max(times):.3g}" if times else "-"


def ratio_text(ratio: method.PairedRatio) -> str:
    if not ratio.ratios:
        return "-"
    return (f"{ratio.median:.2f} q1 {ratio.q1:.2f} [{min(ratio.ratios):.2f}-{max(ratio.ratios):.2f}] "
            f"{verdict(ratio, '')}")


def p50_text(ratio: method.PairedRatio) -> str:
    """The same pairs' ratio of p50_us (each slot's median call), median only: what the load spikes do not move."""
    return f"{ratio.median:.2f}" if ratio.ratios else "-"


def print_report(rows: list[dict], pairs: int) -> None:
    print(f"\n# {pairs} ABBA pairs per comparison; ratio = B time / A time (above 1: shm faster): median, q1 "
          "[range], verdict (median >= 1.0 and q1 >= 0.9); p50: the median of the same pairs' p50_us ratios; "
          "times: each tool's slot time_us, range")
    table = method.Table(["size", "shm time_us", "mpi time_us", "mpi/shm", "p50", "deepspeed time_us", "ds/shm",
                          "p50 "], widths={"mpi/shm": 34, "ds/shm": 34, "deepspeed time_us": 20})
    print(table.header())
    for row in rows:
        ds_ratio = row["deepspeed_note"] or ratio_text(row["shm:deepspeed"])
        print(table.row([format_size(row["nbytes"]), times_text(row["shm_times_us"]),
                         times_text(row["mpi_times_us"]), ratio_text(row["shm:mpi"]), p50_text(row["shm:mpi p50"]),
                         times_text(row["deepspeed_times_us"]), ds_ratio, p50_text(row["shm:deepspeed p50"])]))
    for row in rows:
        for key, what in (("shm:bound", "the pulled ring's traffic, not the target's"),
                          ("shm:copybound", "the least traffic, the target's")):
            ratio = row[key]
            if ratio.ratios:
                tool = key.split(":")[1]
                judged = f" -> {verdict(ratio, key)} (>= 0.85)" if key == "shm:copybound" else ""
                print(f"# memory bound at {format_size(row['nbytes'])}, {what}: {key} {ratio.median:.2f} q1 "
                      f"{ratio.q1:.2f} [{min(ratio.ratios):.2f}-{max(ratio.ratios):.2f}]{judged}; busbw shm "
                      f"{row['shm_busbw_gbps']:.2f} GB/s, {tool} {row[f'{tool}_busbw_gbps']:.2f} GB/s (slot medians)")
    for row in rows:
        ratio = row.get("shm:oop")
        if ratio is not None and ratio.ratios:
            judged = f" -> {verdict(ratio, 'shm:oop')} (<= {OOP_AT_MOST})" if row["nbytes"] >= OOP_FROM else ""
            print(f"# out of place at {format_size(row['nbytes'])}: time out of place / in place {ratio.median:.2f} "
                  f"q1 {ratio.q1:.2f} [{min(ratio.ratios):.2f}-{max(ratio.ratios):.2f}]{judged}")
    plans = {}  # one line per plan's values, with the first source it was seen under
    for row in rows:
        if row.get("shm_plan"):
            plans.setdefault(plan_text({**row["shm_plan"], "source": ""}), plan_text(row["shm_plan"]))
    if plans:
        print(f"# shm plan: {'; '.join(plans.values())}")


def plan_text(fields: dict) -> str:
    """A record's shm plan (backends/shm/plan.py's fields) as the run's header says it."""
    from commbench.backends.shm.plan import Plan

    values = {key: value for key, value in fields.items() if key != "source"}
    return f"{Plan(**values).text()} ({fields.get('source', '?')})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="bytes per rank [default: %(default)s]")
    parser.add_argument("--bound-sizes", default="256M", help="sizes with the memory bound beside [default: 256M]")
    parser.add_argument("--size-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="stop a size's job after this long, start-up included [default: %(default)s]")
    parser.add_argument("--no-deepspeed", action="store_true", help="leave DeepSpeed out")
    parser.add_argument("--no-oop", action="store_true", help="leave out shm out of place against in place")
    parser.add_argument("--mpi-args", default=None, metavar="ARGS", help="mpirun options [default: Open MPI's "
                        "shared-memory btl, as shm_vs_peers.py picks it]")
    parser.add_argument("--out-dir", default="out/deepspeed_peer", help="the ranks' JSON lines [default: %(default)s]")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the summary and every pair here")
    paired.add_pair_options(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from shm_vs_peers import mpi_shared_memory_args

    args = parse_args(argv)
    try:
        sizes = sorted(set(parse_sizes(args.sizes)))
        args.bound_list = sorted(set(parse_sizes(args.bound_sizes))) if args.bound_sizes else []
    except SizeError as exc:
        method.fail(str(exc))
    if any(nbytes % 4 or nbytes < 4 for nbytes in sizes) or args.pairs < 1 or args.size_timeout <= 0:
        method.fail("sizes must be positive multiples of 4 bytes, --pairs >= 1, --size-timeout > 0")
    mpi_missing = paired.mpi_missing()
    if mpi_missing:
        print(f"# Open MPI left out: {mpi_missing} (benchmarks/README.md); the ranks are local processes", flush=True)
    ds_missing = "left out (--no-deepspeed)" if args.no_deepspeed else deepspeed_missing()
    if args.mpi_args is None:
        args.mpi_args = "" if mpi_missing else mpi_shared_memory_args()[0]
    args.check = False
    compare = [*([] if mpi_missing else ["shm:mpi"]), *([] if ds_missing else ["shm:deepspeed"]), "shm:bound",
               "shm:copybound", *([] if args.no_oop else ["shm:oop"])]
    load = os.getloadavg()
    peers = " and ".join(name for name, missing in (("Open MPI", mpi_missing), ("DeepSpeed", ds_missing))
                         if not missing) or "the memory bound"
    print(f"# shm vs {peers}, paired: allreduce float32 sum in place, {WORLD} ranks, {args.pairs} "
          f"ABBA pairs of ~{args.slot_time:g} s slots; {os.cpu_count()} CPUs, load average {load[0]:.2f} "
          f"{load[1]:.2f} {load[2]:.2f}; DeepSpeed: {ds_missing or 'yes'}", flush=True)
    started, rows = time.perf_counter(), []
    for nbytes in sizes:
        record, why = run_size(nbytes, compare, args)
        ds_note = ds_missing and "not run"
        if record is None and "shm:deepspeed" in compare:
            ds_note = f"no result in {args.size_timeout:g} s"
            print(f"# {format_size(nbytes)}: {ds_note} with DeepSpeed; again without it", flush=True)
            record, why = run_size(nbytes, [c for c in compare if c != "shm:deepspeed"], args)
        if record is None:
            print(f"# {format_size(nbytes)}: {why}; skipped", flush=True)
            continue
        rows.append(summarize(record, ds_note))
    print_report(rows, args.pairs)
    load = os.getloadavg()
    wall_s = time.perf_counter() - started
    print(f"# wall time {wall_s:.0f} s; load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json_path:
        method.write_json(args.json_path, "deepspeed_peer", args, world_size=WORLD, deepspeed=ds_missing or "yes",
                          wall_s=wall_s, rows=rows)
        print(f"# wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
