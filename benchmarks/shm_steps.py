"""What one schedule step costs commbench's shm executor, apart from the bytes it moves.

2 ranks (local processes), shm backend. The same bytes moved in 1 round or in k rounds:
round r of k has rank 0 copy chunk r of rank 1's second half into its own second half,
and rank 1 copy chunk r of rank 0's first half into its own first half (the allgather
step of a 2-rank ring, cut into k rounds; no round writes what a peer reads in it, so no
staging). Each rank therefore copies S/2 bytes in k pulls and passes k + 1 barriers per
call, whatever k. The executor's own cost per step is then

    step_us = (t(k rounds) - t(1 round)) / (k - 1)

t measured per slot as commbench times (barrier, N back-to-back calls, each rank's mean,
max over ranks). The 1-round and k-round calls alternate in ABBA slots (method.py), each
pair giving one step_us; reported: the median and the IQR over pairs, per size and k.
Target (issue 13): step_us <= 0.5 us.

    python benchmarks/shm_steps.py --json out/shm_steps.json
    python benchmarks/shm_steps.py --sizes 1K --rounds-list 8 --pairs 4
"""
from __future__ import annotations

import argparse
import sys
import time

import method
import numpy as np
import paired
from local_ranks import RankFailure, run_local_ranks
from rank_control import TorchControl
from slots import Slot

from commbench.sizes import SizeError, format_size, parse_sizes

WORLD = 2
STEP_TARGET_US = 0.5


def halves_schedule(count: int, rounds: int):
    """The 2-rank allgather step (each rank copies the peer's half of the buffer) cut into `rounds` rounds."""
    from commbench.schedule import Schedule, Transfer, split

    half = count // 2
    first, second = split(half, rounds), split(count - half, rounds)
    steps = tuple((Transfer(0, 1, first[r], False), Transfer(1, 0, (half + second[r][0], half + second[r][1]), False))
                  for r in range(rounds))
    return Schedule(f"halves{rounds}", "allgather", WORLD, count, steps)


def _rank(rank: int, world: int, port: int, outbox, args: argparse.Namespace) -> None:
    from commbench import collectives as C
    from commbench.backends.shm.backend import ShmBackend
    from commbench.launchers import LaunchInfo
    from commbench.topology import Topology

    backend = ShmBackend(LaunchInfo.local(rank, world, port), Topology(1, world), "auto", args.timeout)
    control = TorchControl(rank, world)
    try:
        for nbytes in parse_sizes(args.sizes):
            buffer = backend.alloc(nbytes // 4, C.resolve_dtype("float32"))
            backend.fill(buffer, 1.0)
            control.barrier()
            slots = {}
            for k in sorted({1, *args.rounds}):
                slots[k] = Slot(backend.executor(halves_schedule(nbytes // 4, k), buffer, "sum"),
                                       backend.barrier)
                slots[k].calibrate(control, args.slot_time)
            for k in args.rounds:
                one, many = slots[1], slots[k]
                pairs = method.run_pairs(lambda one=one: one.run(control)["time_us"],
                                         lambda many=many: many.run(control)["time_us"], args.pairs)
                if rank == 0:
                    outbox.put({"nbytes": nbytes, "rounds": k, "pairs": pairs,
                                "step_us": [(tk - t1) / (k - 1) for t1, tk in pairs]})
            backend.end_point()
    finally:
        backend.close()
    if rank == 0:
        outbox.put(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1K,4K,64K", help="bytes per rank [default: %(default)s]")
    parser.add_argument("--rounds-list", default="2,4,8,16", help="k, the rounds the bytes are cut into")
    parser.add_argument("--json", dest="json_path", default=None)
    paired.add_pair_options(parser)
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
        args.rounds = sorted({int(k) for k in args.rounds_list.split(",")})
    except (SizeError, ValueError) as exc:
        method.fail(str(exc))
    if any(k < 2 for k in args.rounds) or any(n % 4 or n // 4 < 2 * max(args.rounds) for n in sizes):
        method.fail("k >= 2, and sizes multiples of 4 bytes with at least 2k float32 elements")
    print(f"# shm executor cost per step: {WORLD} ranks, S/2 copied per rank in 1 or k rounds, {args.pairs} ABBA "
          f"pairs of ~{args.slot_time:g} s slots; step_us = (t_k - t_1) / (k - 1) per pair, median [q1-q3]",
          flush=True)
    table = method.Table(["size", "k", "t_1 us", "t_k us", "step_us median [IQR]", "target", "verdict"],
                         widths={"step_us median [IQR]": 24})
    print(table.header(), flush=True)
    rows, started = [], time.perf_counter()
    try:
        for record in run_local_ranks(_rank, (args,), WORLD, args.timeout):
            steps = method.PairedRatio(tuple(record["step_us"]))  # a difference, summarised as ratios are
            # at most the target: the whole IQR <= target is a pass
            verdict = method.judge_at_least(method.PairedRatio(tuple(-s for s in steps.ratios)), -STEP_TARGET_US)
            row = {**record, "median_us": steps.median, "q1_us": steps.q1, "q3_us": steps.q3, "verdict": verdict}
            rows.append(row)
            print(table.row([format_size(record["nbytes"]), record["rounds"],
                             method.median([p[0] for p in record["pairs"]]),
                             method.median([p[1] for p in record["pairs"]]),
                             f"{steps.median:.3f} [{steps.q1:.3f}-{steps.q3:.3f}]", f"<= {STEP_TARGET_US}",
                             verdict]), flush=True)
    except RankFailure as exc:
        method.fail(str(exc), code=3)
    print(f"# {method.verdict_counts([r['verdict'] for r in rows])}; wall {time.perf_counter() - started:.0f} s")
    if args.json_path:
        method.write_json(args.json_path, "shm_steps", args, rows=rows, numpy=np.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
