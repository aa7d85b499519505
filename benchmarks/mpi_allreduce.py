"""Open MPI's allreduce through mpi4py, timed as the other benchmarks here time theirs.

Each rank holds a float32 NumPy buffer per size and calls
comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM): warm-up calls sized by
method.py's rule (commbench's adaptive rule), comm.Barrier(), then N back-to-back
calls each timed with time.perf_counter; time_us = each rank's mean, then the
maximum over ranks. Rank 0 prints a table and, with --json, writes one JSON line
per size. peers_cpu.py runs it next to commbench; on its own:

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 \\
        python benchmarks/mpi_allreduce.py --sizes 1K-64M --json out/mpi.jsonl

Needs Open MPI and mpi4py (see benchmarks/README.md):
    apt-get update && apt-get install -y openmpi-bin libopenmpi-dev
    pip install mpi4py
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import method
import numpy as np
from mpi4py import MPI

from commbench.sizes import SizeError, format_size, parse_sizes


def calibrate(comm: MPI.Comm, buffer: np.ndarray, min_time_s: float) -> tuple[int, int]:
    """(warmup, iters) by method.py's rule, agreed across ranks; the calls made here are the warm-up."""
    start = time.perf_counter()
    comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
    first_us = comm.allreduce((time.perf_counter() - start) * 1e6, op=MPI.MAX)
    probes = method.warmup_count(first_us, min_time_s)
    probe_us = []
    for _ in range(probes):
        start = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        probe_us.append((time.perf_counter() - start) * 1e6)
    estimate_us = comm.allreduce(float(np.median(probe_us)), op=MPI.MAX)
    return 1 + probes, method.iteration_count(estimate_us, min_time_s)


def allreduce_us(comm: MPI.Comm, buffer: np.ndarray, iters: int) -> float | None:
    """Barrier, `iters` timed calls; this rank's mean per call, maximum over ranks on rank 0 (None elsewhere)."""
    comm.Barrier()
    times_s = [0.0] * iters
    for i in range(iters):
        start = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        times_s[i] = time.perf_counter() - start
    return comm.reduce(sum(times_s) / iters * 1e6, op=MPI.MAX, root=0)


HEADERS = ["size", "bytes", "iters", "warmup", "time_us", "algbw_gbps", "busbw_gbps"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=method.DEFAULT_SIZES, help="bytes per rank, as commbench --sizes "
                                                                       "[default: %(default)s]")
    parser.add_argument("--min-time", type=float, default=method.DEFAULT_MIN_TIME_S, metavar="SECONDS",
                        help="time budget of the timed iterations per size [default: 0.2]")
    parser.add_argument("--json", dest="json_path", default=None, help="rank 0 writes one JSON line per size here")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        sizes = parse_sizes(args.sizes)
        if min(sizes) < 4:
            raise SizeError("sizes must be at least 4 bytes (one float32 element)")
    except SizeError as exc:
        if comm.rank == 0:
            method.fail(str(exc))
        return 2
    lead, world = comm.rank == 0, comm.size
    table = method.Table(HEADERS)
    sink = open(args.json_path, "w", encoding="utf-8") if lead and args.json_path else None
    if lead:
        print(f"# mpi4py {MPI.Get_library_version().splitlines()[0].strip()}, {world} ranks", flush=True)
        print(table.header(), flush=True)
    for nbytes in sizes:
        buffer = np.ones(nbytes // 4, dtype=np.float32)
        warmup, iters = calibrate(comm, buffer, args.min_time)
        time_us = allreduce_us(comm, buffer, iters)
        if lead:
            used = buffer.nbytes
            algbw, busbw = method.allreduce_bandwidths_gbps(used, time_us, world)
            print(table.row([format_size(used), used, iters, warmup, time_us, algbw, busbw]), flush=True)
            if sink:
                sink.write(json.dumps({"nbytes": used, "iters": iters, "warmup": warmup, "time_us": time_us,
                                       "world_size": world}) + "\n")
                sink.flush()
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
