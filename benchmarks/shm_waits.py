"""shm's executor and waits, before and after issue 13, paired; and shm against gloo with more ranks than cores.

Local ranks, one ShmBackend per rank, allreduce float32 sum in place (algorithm auto),
per size --pairs ABBA pairs of short slots (method.py) of:

  current  the shm backend as it is: a flat tuple of pre-built partials per call, no
           write-back barrier after a last hazard round, and waits that spin, then block
           on a futex (commbench/backends/shm.py);
  before   the executor and waits as they were before issue 13, kept here as the
           reference (LegacyShm: closures in nested loops, and waits that spin, then
           sched_yield, then sleep with back-off), on the same backend, buffers and counters;
  gloo     a bare dist.all_reduce on the ranks' gloo group.

Sections: 2 ranks, current:before (ratio = before's time / current's per pair; target: no
loss, i.e. not FAIL = the whole IQR below 1); --ranks ranks (4 by default: more than this
2-core machine's cores), current:before and current:gloo (ratio = gloo's time / shm's;
target >= 1: 4 ranks on 2 cores no slower than gloo on the same ranks).

    python benchmarks/shm_waits.py --json out/shm_waits.json
    python benchmarks/shm_waits.py --sizes 1K,1M --pairs 2
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

import method
import numpy as np
import paired
from local_ranks import RankFailure, run_local_ranks
from rank_control import TorchControl
from slots import Slot

from commbench.sizes import SizeError, format_size, parse_sizes

# The waits compared here are the Python executor's (before and after issue 13); the compiled executor
# (issue 27, benchmarks/deepspeed_peer.py) has its own. Set COMMBENCH_SHM_EXECUTOR=native to time it instead.
os.environ.setdefault("COMMBENCH_SHM_EXECUTOR", "python")

LINE = 8


class LegacyShm:
    """The shm executor and barrier before issue 13, driving a current ShmBackend's buffers and counters."""

    def __init__(self, backend):
        self.b = backend
        self.ctl = np.frombuffer(backend._ctl_seg.map, dtype=np.int64)

    def arrive(self) -> None:
        b = self.b
        ctl = self.ctl
        slot = b.members.index(b.rank)
        epoch = int(ctl[slot * LINE]) + 1  # a rank's epoch is its own counter (issue 27)
        ctl[slot * LINE] = epoch
        for peer in range(len(b.members)):
            if ctl[peer * LINE] < epoch:
                self.wait(peer, epoch)

    def wait(self, peer: int, epoch: int) -> None:
        ctl, slot = self.ctl, peer * LINE
        checks, started, pause, spin = 0, None, 1e-6, self.b._spin_budget  # the fixed spin of before
        while ctl[slot] < epoch:
            checks += 1
            if checks < spin:
                continue
            if started is None:
                started = time.monotonic()
            if checks % 64 == 0:
                self.b.waits._check_peer(peer, started, reaped_only=checks < 2 * spin)
            if checks < 2 * spin:
                os.sched_yield()
            else:
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)

    def executor(self, schedule, working, op: str) -> Callable[[], None]:
        from commbench.schedule import hazards

        plan = [(*self.round_plan(rnd, working, op), bool(hazards(rnd))) for rnd in schedule.rounds]
        arrive = self.arrive

        def call() -> None:
            arrive()
            for steps, staged, hazardous in plan:
                for step in steps:
                    step()
                arrive()
                for step in staged:
                    step()
                if hazardous:
                    arrive()
        return call

    def round_plan(self, rnd, working, op: str) -> tuple[list[Callable[[], Any]], list[Callable[[], Any]]]:
        from commbench.backends.shm.executor import reducer as _reducer
        from commbench.schedule import hazards

        b, mine = self.b, working.array
        incoming = [t for t in rnd if t.dst == b.rank]
        reduce = _reducer(op, mine.dtype)
        if b.rank not in hazards(rnd):
            return [_legacy_pull(reduce, mine[t.chunk[0]:t.chunk[1]],
                                 b._peer_array(t.src, working)[t.chunk[0]:t.chunk[1]], t.reduce)
                    for t in incoming], []
        lo, hi = min(t.chunk[0] for t in incoming), max(t.chunk[1] for t in incoming)
        stage = np.empty(hi - lo, dtype=mine.dtype)
        first = incoming[0]
        if first.reduce and first.chunk == (lo, hi):
            src = b._peer_array(first.src, working)[lo:hi]
            steps = [lambda s=src: reduce(mine[lo:hi], s, stage)]
            incoming = incoming[1:]
        else:
            steps = [lambda: np.copyto(stage, mine[lo:hi])]
        for t in incoming:
            steps.append(_legacy_pull(reduce, stage[t.chunk[0] - lo:t.chunk[1] - lo],
                                      b._peer_array(t.src, working)[t.chunk[0]:t.chunk[1]], t.reduce))
        return steps, [lambda: np.copyto(mine[lo:hi], stage)]


def _legacy_pull(reduce, dst, src, is_reduce: bool) -> Callable[[], Any]:
    return (lambda: reduce(dst, src, dst)) if is_reduce else (lambda: np.copyto(dst, src))


def _rank(rank: int, world: int, port: int, outbox, args: argparse.Namespace, compare: list[str]) -> None:
    import torch
    import torch.distributed as dist

    from commbench import collectives as C
    from commbench.backends.shm.backend import ShmBackend
    from commbench.launchers import LaunchInfo
    from commbench.topology import Topology

    backend = ShmBackend(LaunchInfo.local(rank, world, port), Topology(1, world), "auto", args.timeout)
    control, legacy = TorchControl(rank, world), LegacyShm(backend)
    try:
        for nbytes in parse_sizes(args.sizes):
            count = nbytes // 4
            buffer = backend.alloc(count, C.resolve_dtype("float32"))
            backend.fill(buffer, 1.0)
            control.barrier()
            schedule = backend.schedule("allreduce", count, 4, 0)
            tensor = torch.ones(count, dtype=torch.float32)
            slots = {"current": Slot(backend.prepare("allreduce", buffer, buffer, "sum", 0, True),
                                            backend.barrier),
                     "before": Slot(legacy.executor(schedule, buffer, "sum"), backend.barrier),
                     "gloo": Slot(lambda tensor=tensor: dist.all_reduce(tensor), dist.barrier)}
            for slot in slots.values():
                slot.calibrate(control, args.slot_time)
            record: dict = {"nbytes": nbytes, "world_size": world, "algorithm": f"{schedule.name}/{schedule.steps}",
                            "comparisons": {}}
            for key in compare:
                a, b = key.split(":")
                record["comparisons"][key] = [
                    {"a": a_done, "b": b_done, "ratio": b_done["time_us"] / a_done["time_us"]}
                    for a_done, b_done in method.run_pairs(lambda s=slots[a]: s.run(control),
                                                           lambda s=slots[b]: s.run(control), args.pairs)]
            if rank == 0:
                outbox.put(record)
            del slots
            backend.end_point()
    finally:
        backend.close()
    if rank == 0:
        outbox.put(None)


def run_section(world: int, compare: list[str], args: argparse.Namespace) -> list[dict]:
    print(f"\n# {world} ranks on {os.cpu_count()} CPUs: B time / A time per pair, median [q1-q3] over {args.pairs} "
          "ABBA pairs; shm time = median over the current shm's slots", flush=True)
    table = method.Table(["size", "algorithm", "shm us", *compare, *(f"{k} verdict" for k in compare)],
                         widths={k: 22 for k in compare})
    print(table.header(), flush=True)
    rows = []
    for record in run_local_ranks(_rank, (args, compare), world, args.timeout):
        row = {**record, "shm_time_us": method.median(paired.slot_times(record, "current"))}
        for key in compare:
            ratio = paired.comparison(record, key)
            row[key] = ratio.to_json()
            row[f"{key} verdict"] = method.judge_at_least(ratio, 1.0)
            row[f"{key} text"] = ratio.text()
        rows.append(row)
        print(table.row([format_size(record["nbytes"]), record["algorithm"], row["shm_time_us"],
                         *(row[f"{k} text"] for k in compare), *(row[f"{k} verdict"] for k in compare)]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1K,4K,64K,1M,16M", help="bytes per rank [default: %(default)s]")
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the second section [default: 4]")
    parser.add_argument("--json", dest="json_path", default=None)
    paired.add_pair_options(parser)
    args = parser.parse_args(argv)
    try:
        if any(n % 4 or n < 4 for n in parse_sizes(args.sizes)):
            raise SizeError("sizes must be positive multiples of 4 bytes")
    except SizeError as exc:
        method.fail(str(exc))
    started, sections = time.perf_counter(), {}
    print("# current = shm now; before = the executor and waits before issue 13; verdicts: pass = the whole IQR "
          ">= 1 (A faster), FAIL = the whole IQR < 1, noisy = no difference this run can see")
    try:
        sections["2"] = run_section(2, ["current:before"], args)
        sections[str(args.ranks)] = run_section(args.ranks, ["current:before", "current:gloo"], args)
    except RankFailure as exc:
        method.fail(str(exc), code=3)
    print(f"# wall {time.perf_counter() - started:.0f} s")
    if args.json_path:
        method.write_json(args.json_path, "shm_waits", args, sections=sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
