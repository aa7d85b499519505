"""commbench's own shared-memory allreduce (--backend shm) against its peers and the memory bound, in one run.

2 ranks on this host, allreduce float32 sum, in place, the same sizes (bytes per rank)
for every tool, --rounds rounds with the order rotating from round to round so that
drift in the machine falls on all alike:

  shm    `commbench sweep --backend shm --placement in-place --json ...` (algorithm
         auto: oneshot up to 64 KiB on <= 8 ranks, ring above; adaptive iterations,
         results checked); its time_us and p50_us per size;
  torch  `commbench sweep --backend torch --torch-backend gloo --placement in-place`;
  p2p    `commbench sweep --backend p2p --algorithm ring --placement in-place` (the
         same ring schedule over torch isend/irecv);
  mpi    Open MPI through mpi4py, comm.Allreduce(MPI.IN_PLACE, ...) (mpi_allreduce.py
         under mpirun --bind-to none), on the shared-memory transport: by default
         "--mca pml ob1 --mca btl self,vader" (sm on Open MPI 5), see --mpi-args;
  bound  NumPy's copy and add bandwidth at 256 MiB float32, in 2 processes streaming at
         once (and on one core alone, for comparison), from which the memory bound of
         shm's ring follows (below).

time_us is what commbench reports and what the other scripts here report (method.py):
each rank's mean per call, then the maximum over ranks; p50_us (shm) is the median
over calls of each call's maximum over ranks. Every figure is the median over rounds;
busbw follows nccl-tests (algbw = bytes / time_us / 1e9, busbw = algbw * 2(n-1)/n,
= algbw at n = 2) and is computed here from the median time_us of every tool. Ratios
are of busbw (above 1: the first tool is faster), e.g. shm/torch = torch time / shm time.

The memory bound. copy_bw = S / t(np.copyto(dst, src)) and add_bw = S / t(np.add(a, b,
out=a)) with S = 256 MiB, median of --bound-reps calls each, measured in 2 processes
streaming at the same time (each call starts together; the slower process counts), as
shm's two ranks run; the single-core figures are printed beside them. In GB/s of array bytes
(1e9 B/s of the destination array, not of memory traffic: a copy reads S and writes S,
an add reads 2S and writes S). shm's ring with 2 ranks pulls: in its reduce-scatter
step each rank adds the peer's half of the buffer into its own (S/2 bytes at add_bw),
in its allgather step it copies the peer's other half (S/2 at copy_bw), both ranks at
once on their own cores. So t_bound = (S/2)/add_bw + (S/2)/copy_bw and
busbw_bound = S / t_bound (busbw factor 2(n-1)/n = 1 at n = 2), the harmonic mean of
add_bw and copy_bw. It assumes the barriers per call cost nothing. (With single-core
bandwidths the bound would assume each core keeps its own full bandwidth while the
other streams too, which this machine's two cores do not: both numbers are shown.)

Targets, each judged per size:

  T1  shm busbw >= 5x torch at every size 1 MiB-256 MiB;
  T2  shm busbw >= mpi at every size >= 64 KiB;
  T3  shm busbw >= 1.3x mpi at every size >= 16 MiB;
  T4  shm time_us at 1 KiB <= 8 us (p50_us shown beside it);
  T5  shm busbw at 256 MiB >= 70% of busbw_bound.

noise = (max - min) / median of a tool's time_us over rounds (for T5 the larger of
shm's and the bound's); for a ratio, the larger of the two tools' noises. Verdict:

  pass   the measured value meets the target with a margin larger than the noise
         (value >= target * (1 + noise); for T4 time <= 8 us / (1 + noise));
  FAIL   it misses the target by more than the noise;
  noisy  it lies within the noise of the target, either side: this run cannot decide.

With one round there is no noise estimate: the verdicts are then the plain
comparisons (noise shown as n/a). A tool that fails in a round is reported and the
other tools go on; its column holds the rounds that succeeded.

Run from the repository root (about 3 minutes with the defaults on a quiet 2-core
machine: 3 rounds of 4 sweeps of 10 sizes, up to 256 MiB); a quick check (~20 s):

    python benchmarks/shm_vs_peers.py --json out/shm_vs_peers.json
    python benchmarks/shm_vs_peers.py --sizes 1K,1M --rounds 1 --min-time 0.05
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import time

import method
import numpy as np
from peers_cpu import ToolFailure, _check_busbw, _run_logged, mpi_missing, run_mpi
from sweep_repeat import commbench_command, measured_results

from commbench.sizes import SizeError, format_size, parse_sizes

WORLD = 2
DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M,256M"
TOOLS = ("shm", "torch", "p2p", "mpi")
BOUND = "bound"
BOUND_NBYTES = 256 << 20
MiB, KiB = 1 << 20, 1 << 10
SWEEP_ARGS = {
    "shm": ["--backend", "shm"],  # --algorithm auto
    "torch": ["--backend", "torch", "--torch-backend", "gloo"],
    "p2p": ["--backend", "p2p", "--algorithm", "ring"],
}
SHM_1K_MAX_US = 8.0
BOUND_FRACTION = 0.70


# ---------------------------------------------------------------- the tools


def run_sweep(tool: str, sizes: list[int], args: argparse.Namespace, tag: str) -> tuple[dict[int, dict], str | None]:
    """One `commbench sweep` of `tool`: (nbytes -> its in-place result, error or None).

    A run that fails part-way keeps the sizes it measured before it failed."""
    json_path, log_path = (os.path.join(args.out_dir, f"{tool}_{tag}.{ext}") for ext in ("jsonl", "log"))
    if os.path.exists(json_path):
        os.remove(json_path)  # never read an earlier run's results as this one's
    command = [*commbench_command(), "sweep", *SWEEP_ARGS[tool], "--sizes", ",".join(map(str, sizes)),
               "--placement", "in-place", "--nprocs", str(WORLD), "--device", "cpu",
               "--min-time", str(args.min_time), "--json", json_path]
    error = None
    try:
        _run_logged(command, log_path, args.timeout)
    except ToolFailure as exc:
        error = str(exc)
    results = {}
    for record in measured_results(json_path):
        _check_busbw(record)
        results[record["nbytes"]] = {key: record.get(key) for key in ("time_us", "p50_us", "algorithm", "steps",
                                                                      "iters", "warmup", "wrong")}
    if error is None and len(results) < len(sizes):
        error = f"{len(sizes) - len(results)} of {len(sizes)} sizes missing from {json_path}"
    return results, error


def run_mpi_tool(sizes: list[int], args: argparse.Namespace, tag: str) -> tuple[dict[int, dict], str | None]:
    stale = os.path.join(args.out_dir, f"mpi_{tag}.jsonl")  # the path run_mpi writes
    if os.path.exists(stale):
        os.remove(stale)
    try:
        return {nbytes: {"time_us": time_us} for nbytes, time_us in run_mpi(sizes, args, tag).items()}, None
    except ToolFailure as exc:
        return {}, str(exc)


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


# ---------------------------------------------------------------- the memory bound


def _copy_add_times(nbytes: int, reps: int, barrier=None) -> tuple[list[float], list[float]]:
    """Per-call seconds of np.copyto and np.add(out=) on float32 arrays of `nbytes`; with a barrier,
    every call starts together with the other processes' (so they stream at the same time)."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: page faults are not bandwidth
    np.add(dst, src, out=dst)
    sync = barrier.wait if barrier is not None else (lambda: None)
    copy_s = _times(lambda: np.copyto(dst, src), reps, sync)
    add_s = _times(lambda: np.add(dst, src, out=dst), reps, sync)
    return copy_s, add_s


def _concurrent_worker(nbytes: int, reps: int, barrier, outbox) -> None:
    outbox.put(_copy_add_times(nbytes, reps, barrier))


def numpy_bandwidths(nbytes: int, reps: int) -> dict:
    """Copy and add bandwidth of float32 arrays of `nbytes`, in GB/s of array bytes (median of reps):
    on one core alone, and in WORLD processes streaming at the same time (the slowest of them),
    which is how shm's ranks run. The bound uses the concurrent figures."""
    copy_s, add_s = _copy_add_times(nbytes, reps)
    context = multiprocessing.get_context("fork")
    barrier, outbox = context.Barrier(WORLD), context.Queue()
    procs = [context.Process(target=_concurrent_worker, args=(nbytes, reps, barrier, outbox)) for _ in range(WORLD)]
    for proc in procs:
        proc.start()
    results = [outbox.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    single_copy, single_add = nbytes / method.median(copy_s) / 1e9, nbytes / method.median(add_s) / 1e9
    copy_gbps = min(nbytes / method.median(c) / 1e9 for c, _ in results)
    add_gbps = min(nbytes / method.median(a) / 1e9 for _, a in results)
    return {"nbytes": nbytes, "copy_s": [c for c, _ in results], "add_s": [a for _, a in results],
            "single_copy_gbps": single_copy, "single_add_gbps": single_add,
            "single_busbw_bound_gbps": ring_bound(nbytes, single_copy, single_add)["busbw_bound_gbps"],
            "copy_gbps": copy_gbps, "add_gbps": add_gbps, **ring_bound(nbytes, copy_gbps, add_gbps)}


def ring_bound(nbytes: int, copy_gbps: float, add_gbps: float) -> dict:
    """shm's ring at 2 ranks: add S/2 then copy S/2 per rank, both ranks at once."""
    half = nbytes / 2
    t_bound_s = half / (add_gbps * 1e9) + half / (copy_gbps * 1e9)
    _, busbw = method.allreduce_bandwidths_gbps(nbytes, t_bound_s * 1e6, WORLD)
    return {"t_bound_us": t_bound_s * 1e6, "busbw_bound_gbps": busbw}


def _times(call, reps: int, sync=lambda: None) -> list[float]:
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------- rounds


def measure(sizes: list[int], tools: list[str], args: argparse.Namespace) -> dict:
    """Every round's results: {"tools": {tool: [{nbytes: result} per round]}, "bound": [...], ...}."""
    items = [*tools, BOUND]
    raw: dict = {"tools": {tool: [] for tool in tools}, "bound": [], "orders": [], "failures": []}
    for index in range(args.rounds):
        order = items[index % len(items):] + items[:index % len(items)]
        raw["orders"].append(order)
        tag = f"round{index + 1}"
        for item in order:
            start = time.perf_counter()
            if item == BOUND:
                raw["bound"].append(numpy_bandwidths(BOUND_NBYTES, args.bound_reps))
                error = None
            else:
                results, error = (run_mpi_tool(sizes, args, tag) if item == "mpi"
                                  else run_sweep(item, sizes, args, tag))
                raw["tools"][item].append(results)
            if error:
                raw["failures"].append({"tool": item, "round": index + 1, "error": error})
                print(f"# {item}, round {index + 1}: failed: {error}", flush=True)
            else:
                print(f"# {item}, round {index + 1}: {time.perf_counter() - start:.1f} s", flush=True)
        print(f"# round {index + 1} of {args.rounds} done ({', '.join(order)})", flush=True)
    return raw


def noise(values: list[float]) -> float:
    """(max - min) / median over rounds; NaN with fewer than 2 rounds."""
    return (max(values) - min(values)) / method.median(values) if len(values) >= 2 else math.nan


def summarize(sizes: list[int], raw: dict) -> list[dict]:
    rows = []
    for nbytes in sizes:
        row: dict = {"nbytes": nbytes}
        for tool in TOOLS:
            rounds = [r[nbytes] for r in raw["tools"].get(tool, []) if nbytes in r]
            values = [r["time_us"] for r in rounds]
            time_us = method.median(values)
            row[f"{tool}_rounds_us"] = values
            row[f"{tool}_time_us"] = time_us
            row[f"{tool}_busbw_gbps"] = method.allreduce_bandwidths_gbps(nbytes, time_us, WORLD)[1] if values \
                else math.nan
            row[f"{tool}_noise"] = noise(values)
            if tool == "shm":
                p50 = [r["p50_us"] for r in rounds if r.get("p50_us") is not None]
                row.update(shm_p50_rounds_us=p50, shm_p50_us=method.median(p50), shm_p50_noise=noise(p50),
                           shm_algorithm="/".join(sorted({str(r.get("algorithm")) for r in rounds})) or "n/a")
        for a, b in (("shm", "torch"), ("shm", "mpi"), ("p2p", "torch")):
            row[f"ratio_{a}_{b}"] = row[f"{a}_busbw_gbps"] / row[f"{b}_busbw_gbps"]
            row[f"ratio_{a}_{b}_noise"] = _max_noise(row[f"{a}_noise"], row[f"{b}_noise"])
        rows.append(row)
    return rows


def summarize_bound(raw: dict) -> dict:
    rounds = raw["bound"]
    if not rounds:
        return {}
    # The bound from the median bandwidths (so the printed derivation adds up); its noise from each round's bound.
    bound = {key: method.median([r[key] for r in rounds]) for key in ("copy_gbps", "add_gbps")}
    bound.update(ring_bound(BOUND_NBYTES, bound["copy_gbps"], bound["add_gbps"]))
    bound.update(nbytes=BOUND_NBYTES, rounds=rounds, **{f"{key}_noise": noise([r[key] for r in rounds])
                                                         for key in ("copy_gbps", "add_gbps", "busbw_bound_gbps")})
    return bound


def _max_noise(*values: float) -> float:
    known = [v for v in values if not math.isnan(v)]
    return max(known) if known else math.nan


# ---------------------------------------------------------------- verdicts


def judge_at_least(value: float, target: float, spread: float) -> str:
    """pass: value >= target by more than the noise; FAIL: below it by more than the noise; else noisy."""
    if math.isnan(value):
        return "n/a"
    slack = 1 + (0.0 if math.isnan(spread) else spread)
    if value >= target * slack:
        return "pass"
    if value < target / slack:
        return "FAIL"
    return "noisy"


def verdicts(rows: list[dict], bound: dict) -> list[dict]:
    out = []

    def add(target: str, row: dict, measured: float, needed: float, spread: float, verdict: str, unit: str) -> None:
        out.append({"target": target, "nbytes": row["nbytes"], "measured": measured, "needed": needed,
                    "unit": unit, "noise": spread, "verdict": verdict})

    for row in rows:
        nbytes = row["nbytes"]
        if MiB <= nbytes <= 256 * MiB:
            value, spread = row["ratio_shm_torch"], row["ratio_shm_torch_noise"]
            add("T1 shm/torch busbw", row, value, 5.0, spread, judge_at_least(value, 5.0, spread), "x")
        if nbytes >= 64 * KiB:
            value, spread = row["ratio_shm_mpi"], row["ratio_shm_mpi_noise"]
            add("T2 shm/mpi busbw", row, value, 1.0, spread, judge_at_least(value, 1.0, spread), "x")
        if nbytes >= 16 * MiB:
            value, spread = row["ratio_shm_mpi"], row["ratio_shm_mpi_noise"]
            add("T3 shm/mpi busbw", row, value, 1.3, spread, judge_at_least(value, 1.3, spread), "x")
        if nbytes == KiB:
            value, spread = row["shm_time_us"], row["shm_noise"]
            # time <= limit is limit / time >= 1
            add("T4 shm time_us", row, value, SHM_1K_MAX_US, spread,
                judge_at_least(SHM_1K_MAX_US / value, 1.0, spread), "us")
        if nbytes == BOUND_NBYTES and bound:
            value = row["shm_busbw_gbps"] / bound["busbw_bound_gbps"]
            spread = _max_noise(row["shm_noise"], bound["busbw_bound_gbps_noise"])
            add("T5 shm/bound busbw", row, value, BOUND_FRACTION, spread,
                judge_at_least(value, BOUND_FRACTION, spread), "x")
    return sorted(out, key=lambda check: (check["target"], check["nbytes"]))


# ---------------------------------------------------------------- report


def print_report(rows: list[dict], bound: dict, checks: list[dict], raw: dict, args: argparse.Namespace) -> None:
    print("\n# time per allreduce (us), median over rounds; time_us = each rank's mean, max over ranks; "
          "shm p50_us = median over calls of each call's max over ranks")
    table = method.Table(["size", "bytes", "shm algorithm", "shm time_us", "shm p50_us",
                          *(f"{t} time_us" for t in TOOLS[1:])], widths={"bytes": 10})
    print(table.header())
    for row in rows:
        print(table.row([format_size(row["nbytes"]), row["nbytes"], row["shm_algorithm"], row["shm_time_us"],
                         row["shm_p50_us"], *(row[f"{t}_time_us"] for t in TOOLS[1:])]))

    print(f"\n# bus bandwidth (GB/s, nccl-tests: bytes / time_us / 1e9 * 2(n-1)/n, n = {WORLD}) from the median "
          f"time_us; ratios of busbw (above 1: the first tool is faster)")
    table = method.Table(["size", *(f"{t} busbw" for t in TOOLS), "shm/torch", "shm/mpi", "p2p/torch"])
    print(table.header())
    for row in rows:
        print(table.row([format_size(row["nbytes"]), *(row[f"{t}_busbw_gbps"] for t in TOOLS),
                         *(method.ratio_text(row[f"ratio_{k}"]) for k in ("shm_torch", "shm_mpi", "p2p_torch"))]))

    print(f"\n# round-to-round noise of time_us, (max - min) / median over {args.rounds} round(s), % "
          f"(n/a: fewer than 2 rounds); the rounds' values are in --json")
    table = method.Table(["size", "shm %", "shm p50 %", *(f"{t} %" for t in TOOLS[1:])])
    print(table.header())
    for row in rows:
        print(table.row([format_size(row["nbytes"]), _percent(row["shm_noise"]), _percent(row["shm_p50_noise"]),
                         *(_percent(row[f"{t}_noise"]) for t in TOOLS[1:])]))

    if bound:
        print_bound(bound, rows)
    print_verdicts(checks)
    if raw["failures"]:
        print(f"# {len(raw['failures'])} failed run(s): " + "; ".join(
            f"{f['tool']} round {f['round']}: {f['error']}" for f in raw["failures"]))
    missing = [t for t, per_round in raw["tools"].items() if not any(per_round)]
    if missing:
        print(f"# no results at all from: {', '.join(missing)}")


def print_bound(bound: dict, rows: list[dict]) -> None:
    size = format_size(BOUND_NBYTES)
    copy_bw, add_bw, t_us, busbw = bound["copy_gbps"], bound["add_gbps"], bound["t_bound_us"], bound["busbw_bound_gbps"]
    reps = len(bound["rounds"][0]["copy_s"][0])
    print(f"\n# memory bound of shm's ring, S = {size}, n = {WORLD}, copy/add measured in {WORLD} processes at once "
          f"(median of {reps} calls per round, median over {len(bound['rounds'])} round(s)):")
    print(f"#   copy_bw = S / t(np.copyto(dst, src))   = {copy_bw:.2f} GB/s   "
          f"(noise {_percent(bound['copy_gbps_noise'], '%')})")
    print(f"#   add_bw  = S / t(np.add(a, b, out=a))   = {add_bw:.2f} GB/s   "
          f"(noise {_percent(bound['add_gbps_noise'], '%')})")
    print("#   (GB/s of array bytes, 1e9 B/s of the destination array; memory traffic is 2S for a copy, 3S for an add)")
    print("#   ring, 2 ranks, both at once on their own cores: reduce-scatter step: each rank adds the peer's half")
    print("#   into its own half (S/2 at add_bw); allgather step: it copies the peer's other half (S/2 at copy_bw):")
    print(f"#   t_bound = (S/2)/add_bw + (S/2)/copy_bw = {BOUND_NBYTES / 2 / 1e9:.4f} GB / {add_bw:.2f} GB/s + "
          f"{BOUND_NBYTES / 2 / 1e9:.4f} GB / {copy_bw:.2f} GB/s = {t_us:.0f} us")
    single = method.median([r["single_busbw_bound_gbps"] for r in bound["rounds"]])
    print(f"#   (one core alone: copy {method.median([r['single_copy_gbps'] for r in bound['rounds']]):.2f} GB/s, "
          f"add {method.median([r['single_add_gbps'] for r in bound['rounds']]):.2f} GB/s, which would give "
          f"busbw_bound {single:.2f} GB/s)")
    print(f"#   busbw_bound = S / t_bound * 2(n-1)/n = {BOUND_NBYTES / 1e9:.4f} GB / {t_us:.0f} us * 1 = "
          f"{busbw:.2f} GB/s"
          f" (= 2 / (1/add_bw + 1/copy_bw), from the median bandwidths; noise of the rounds' bounds "
          f"{_percent(bound['busbw_bound_gbps_noise'], '%')})")
    print("#   assumes each core keeps its single-core bandwidth while the other streams too, and free barriers")
    at = next((r for r in rows if r["nbytes"] == BOUND_NBYTES), None)
    if at is None or math.isnan(at["shm_busbw_gbps"]):
        print(f"#   shm at {size}: not measured in this run (add {size} to --sizes)")
    else:
        print(f"#   shm at {size}: busbw {at['shm_busbw_gbps']:.2f} GB/s = "
              f"{100 * at['shm_busbw_gbps'] / busbw:.1f}% of busbw_bound (target >= {100 * BOUND_FRACTION:.0f}%)")


def print_verdicts(checks: list[dict]) -> None:
    print("\n# targets (pass: met by more than the noise; FAIL: missed by more than the noise; noisy: within it)")
    table = method.Table(["target", "size", "measured", "needed", "noise %", "verdict"],
                         widths={"target": len("T5 shm/bound busbw"), "measured": 11})
    print(table.header())
    for check in checks:
        unit, needed = check["unit"], check["needed"]
        need_text = f"<= {needed:g} us" if unit == "us" else f">= {needed:g}x"
        measured = check["measured"]
        shown = "n/a" if math.isnan(measured) else f"{measured:.2f} us" if unit == "us" else f"{measured:.3f}x"
        print(table.row([check["target"], format_size(check["nbytes"]), shown, need_text,
                         _percent(check["noise"]), check["verdict"]]))
    for name, in_range in (("T1", "1 MiB-256 MiB"), ("T2", ">= 64 KiB"), ("T3", ">= 16 MiB"), ("T4", "1 KiB"),
                           ("T5", "256 MiB")):
        if not any(c["target"].startswith(name) for c in checks):
            print(f"# {name}: no size in {in_range} was measured: not judged")
    names = [c["verdict"] for c in checks]
    print(f"# {len(checks)} checks: " + ", ".join(f"{names.count(v)} {v}" for v in ("pass", "FAIL", "noisy", "n/a")))
    if "noisy" in names:
        print("# noisy: the value lies within the round-to-round noise of the target; this run cannot decide")


def _percent(value: float, unit: str = "") -> str:
    return "n/a" if value is None or math.isnan(value) else f"{100 * value:.1f}{unit}"


def _no_nan(value):
    """NaN (a tool that did not run, a noise from one round) as JSON null, at any depth."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {str(k): _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help="bytes per rank, as commbench --sizes; multiples of 4 [default: %(default)s]")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each tool; odd makes each median one measured value [default: 3]")
    parser.add_argument("--min-time", type=float, default=method.DEFAULT_MIN_TIME_S, metavar="SECONDS",
                        help="time budget of the timed iterations per size, for every tool [default: 0.2]")
    parser.add_argument("--bound-reps", type=int, default=5,
                        help="timed NumPy copies and adds per round for the memory bound [default: 5]")
    parser.add_argument("--mpi-args", default=None, metavar="ARGS",
                        help='mpirun options, one quoted string [default: "--mca pml ob1 --mca btl self,vader" '
                             '(or self,sm), Open MPI\'s shared-memory transport, as ompi_info lists it]')
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help="which of shm,torch,p2p,mpi to run [default: all]")
    parser.add_argument("--out-dir", default="out/shm_vs_peers", help="logs and per-run results [default: %(default)s]")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="give up on one tool's run after this long [default: 600]")
    parser.add_argument("--json", dest="json_path", default=None, help="also write everything (every round) here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sizes = sorted(set(parse_sizes(args.sizes)))
    except SizeError as exc:
        method.fail(str(exc))
    if any(nbytes % 4 or nbytes < 4 for nbytes in sizes):
        method.fail("sizes must be positive multiples of 4 bytes (float32 elements)")
    if args.rounds < 1 or args.bound_reps < 1:
        method.fail("--rounds and --bound-reps must be at least 1")
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if not tools or any(t not in TOOLS for t in tools):
        method.fail(f"--tools: a comma list of {', '.join(TOOLS)}")
    os.makedirs(args.out_dir, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # every tool's ranks, as torchrun and commbench set it
    missing = mpi_missing() if "mpi" in tools else None
    if missing:
        print(f"# Open MPI skipped: {missing} (see the install commands in benchmarks/README.md)")
        tools.remove("mpi")
    transport = "given with --mpi-args"
    if args.mpi_args is None:
        args.mpi_args, transport = mpi_shared_memory_args() if "mpi" in tools else ("", "")
    print(f"# shm vs peers: allreduce float32 sum in place, {WORLD} ranks, {', '.join(tools)} + the memory bound, "
          f"{args.rounds} round(s) in rotating order, --min-time {args.min_time:g}, "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, {os.cpu_count()} CPUs, logs in {args.out_dir}/",
          flush=True)
    if "mpi" in tools:
        print(f"# mpirun --bind-to none {args.mpi_args} ({transport})", flush=True)
    started = time.perf_counter()
    raw = measure(sizes, tools, args)
    rows = summarize(sizes, raw)
    bound = summarize_bound(raw)
    checks = verdicts(rows, bound)
    print_report(rows, bound, checks, raw, args)
    wall_s = time.perf_counter() - started
    print(f"# wall time {wall_s:.0f} s")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as handle:
            json.dump(_no_nan({
                "benchmark": "shm_vs_peers", "command": " ".join(sys.argv), "world_size": WORLD,
                "config": vars(args), "tools": tools, "mpi_skipped": missing, "mpi_transport": transport,
                "cpus": os.cpu_count(), "wall_s": wall_s,
                "definitions": {
                    "time_us": "each rank's mean per call, then the maximum over ranks; median over rounds",
                    "busbw_gbps": "nbytes / time_us / 1e3 * 2(n-1)/n (nccl-tests), from the median time_us",
                    "ratio_a_b": "busbw of a / busbw of b",
                    "noise": "(max - min) / median over rounds; for a ratio the larger of the two tools'",
                    "copy_gbps, add_gbps": "256 MiB / median time of np.copyto(dst, src) resp. np.add(a, b, out=a), "
                                           "1e9 bytes of the destination array per second, one core",
                    "busbw_bound_gbps": "S / ((S/2)/add_bw + (S/2)/copy_bw) at S = 256 MiB, n = 2",
                    "verdict": "pass: value >= target * (1 + noise); FAIL: value < target / (1 + noise); "
                               "else noisy (T4 on 8 us / time_us >= 1)",
                },
                "orders": raw["orders"], "failures": raw["failures"],
                "rounds": {tool: [{str(k): v for k, v in r.items()} for r in per_round]
                           for tool, per_round in raw["tools"].items()},
                "bound": bound, "rows": rows, "verdicts": checks}), handle, indent=1)
        print(f"# wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
