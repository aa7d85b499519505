"""Paired slots: several allreduce tools in the same 2 ranks, alternated per size (method.py's pairing).

The comparison scripts (shm_vs_peers.py, peers_cpu.py) run this once: every tool they
compare lives in the same two processes, and per size each comparison A:B runs
--pairs pairs of short slots in ABBA order (A B, B A, A B, ...). A slot is the tool's
own barrier, then N back-to-back calls each timed with time.perf_counter (the loop
commbench's harness times with, DistGroup.time_iterations); its time_us is each
rank's mean, then the maximum over ranks (commbench's time_us), and its p50_us the
median over calls of each call's maximum over ranks (commbench's p50_us). N is chosen
once per tool and size by commbench's adaptive rule (method.py) with --slot-time as the
budget, so the two slots of a pair last about as long each and run seconds apart.

Tools (allreduce, float32, sum, in place, one buffer per tool and size):

  shm    commbench's shared-memory backend (ShmBackend: algorithm auto) through the call
         the harness prepares (backend.prepare); once per size commbench's own
         bench.measure_point also runs it with the result check on (wrong counted);
  shmpy  the shm backend with its Python executor (COMMBENCH_SHM_EXECUTOR=python), where shm runs
         the native one (auto): what the compiled fast path gains, paired;
  piped  the shm backend with large rings cut into LLC-sized slices (schedule.pipelined; off by
         default): what the slicing gains or costs at the memory bound, paired;
  oneshot  the shm backend with --algorithm oneshot (auto picks it up to 64 KiB since 2026-11-23);
  ring   the shm backend with --algorithm ring;
  oop    the shm backend out of place (separate input and output), reading the inputs where
         a copy of them would be read (schedule.input_reads);
  oopcopy  the same with the input copied into the output first (reads_inputs off: the way
         before 2026-11-26): what reading the inputs gains, paired;
  shm0, oop0  shm in place and out of place with the built-in values of the planner's knobs
         (shm_plan.Plan(): 8 KiB blocks, both outputs streaming, no prefetch), where shm and oop run
         the plan chosen for this machine (backends/shm/plan.py): what the planner gains, paired;
  p2p    commbench's p2p backend (--algorithm ring over torch isend/irecv, gloo);
  torch  commbench's torch backend's prepared call (dist.all_reduce, gloo);
  gloo   a bare dist.all_reduce loop on the same process group;
  mpi    Open MPI through mpi4py, comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM);
  deepspeed  DeepSpeed's CPU shared-memory allreduce, deepspeed.comm.inference_all_reduce(tensor)
         (DS_ACCELERATOR=cpu, LOCAL_SIZE = the ranks, its C++ op built on first use), on the
         ranks' gloo group; a rank where the op would not run (not built, or a CPU without the
         ISA its float32 kernel needs) fails in one line instead of timing gloo under its name;
  bound  the memory bound of shm's 2-rank ring at this size: both ranks at once run
         np.copyto and np.add(out=) on private float32 arrays of the size, each call
         started together; slot time = median add / 2 + median copy / 2 (the ring adds
         S/2 and copies S/2 per rank), max over ranks. Only at --bound-sizes;
  bound4k  the same with the arrays in /dev/shm mappings, as shm's segments are (on a
         kernel with shmem_enabled = never: 4 KiB pages, where NumPy's private arrays
         get transparent huge pages): how much of the gap to `bound` is the page size.
  copybound  the least traffic of ANY 2-rank allreduce (each rank reads S and writes S: every
         input element read once, every result written once): both ranks at once copy S
         between private arrays, the faster of np.copyto and shm_native's streaming copy
         (non-temporal stores). `bound` is the pull ring's traffic (2.5 S per rank); shm's
         ring with pushes moves 2 S (this floor's traffic), so it can pass `bound`. Only at --bound-sizes.

Ranks come from mpirun (with mpi4py; the mpi tool needs it) or, without MPI, from
local processes (multiprocessing, control through torch.distributed). Run by the
comparison scripts; on its own (rank 0 prints one line per size and writes JSON lines):

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 \\
        python benchmarks/paired.py --sizes 1K,1M --compare shm:mpi,shm:gloo --json out/paired.jsonl
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from typing import Callable

import method
from rank_control import MpiControl, TorchControl
from slots import MIN_SLOT_ITERS, Tools

from commbench.sizes import SizeError, format_size, parse_sizes

WORLD = 2
TOOLS = ("shm", "shmpy", "piped", "oneshot", "ring", "oop", "oopcopy", "shm0", "oop0", "p2p", "torch", "gloo", "mpi",
         "deepspeed", "bound", "bound4k", "copybound")
HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- one rank


def rank_sizes(control, args: argparse.Namespace, port: int, emit: Callable[[dict], None]) -> None:
    """Every size: build each tool's slot, calibrate, run each comparison's pairs in ABBA order."""
    comparisons = [tuple(c.split(":")) for c in args.compare.split(",")]
    bound_sizes = set(parse_sizes(args.bound_sizes)) if args.bound_sizes else set()
    needed = {tool for pair in comparisons for tool in pair}
    tools = Tools(control, needed, port, args.timeout)
    try:
        for nbytes in parse_sizes(args.sizes):
            record: dict = {"nbytes": nbytes, "world_size": control.world, "tools": {}, "comparisons": {}}
            if "shm" in needed and args.check:
                record["shm_checked"] = tools.shm_checked(nbytes, args.slot_time)
            here = [c for c in comparisons if not any("bound" in t for t in c) or nbytes in bound_sizes]
            slots = {}
            for tool in sorted({t for pair in here for t in pair}, key=TOOLS.index):
                slots[tool] = tools.slot(tool, nbytes)
                slots[tool].calibrate(control, args.slot_time)
                record["tools"][tool] = {"warmup": slots[tool].warmup, "iters": slots[tool].iters, **slots[tool].info}
            for a, b in here:
                pairs = []
                for a_first in method.abba_orders(args.pairs):
                    first, second = (a, b) if a_first else (b, a)
                    done = {first: slots[first].run(control)}
                    done[second] = slots[second].run(control)
                    pairs.append({"a_first": a_first, "a": done[a], "b": done[b],
                                  "ratio": done[b]["time_us"] / done[a]["time_us"]})
                record["comparisons"][f"{a}:{b}"] = pairs
            for slot in slots.values():
                slot.release()
            del slots
            gc.collect()
            emit(record)
    finally:
        tools.close()


def _mpi_rank_main(args: argparse.Namespace) -> int:
    from commbench.launch import free_port

    control = MpiControl()
    port = control.bcast(free_port() if control.rank == 0 else None)
    sink = open(args.json_path, "w", encoding="utf-8") if control.rank == 0 else None

    def emit(record: dict) -> None:
        if sink:
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            print(progress_line(record), flush=True)

    try:
        rank_sizes(control, args, port, emit)
    finally:
        if sink:
            sink.close()
    return 0


def _local_rank(rank: int, world: int, port: int, outbox, args: argparse.Namespace) -> None:
    """A run_local_ranks target: the same sizes without MPI (no mpi tool)."""
    rank_sizes(TorchControl(rank, world), args, port, outbox.put if rank == 0 else (lambda record: None))
    if rank == 0:
        outbox.put(None)


def progress_line(record: dict) -> str:
    parts = [f"{key} {method.PairedRatio(tuple(p['ratio'] for p in pairs)).text()}"
             for key, pairs in record["comparisons"].items()]
    checked = record.get("shm_checked", {})
    wrong = f", shm wrong {checked['wrong']}" if checked else ""
    return f"# {format_size(record['nbytes'])}: time B/A per comparison A:B, median [IQR]: {'; '.join(parts)}{wrong}"


# ---------------------------------------------------------------- the driver side


def mpi_missing() -> str | None:
    """Why the mpi tool cannot run here, or None."""
    if shutil.which("mpirun") is None:
        return "mpirun not found"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py not installed"
    return None


def run_job(sizes: list[int], compare: list[str], args: argparse.Namespace, json_path: str,
            bound_sizes: list[int] = ()) -> list[dict]:
    """Run the paired ranks (under mpirun when MPI is here, else as local processes); the records per size."""
    options = ["--sizes", ",".join(map(str, sizes)), "--compare", ",".join(compare), "--pairs", str(args.pairs),
               "--slot-time", str(args.slot_time), "--timeout", str(args.timeout), "--json", json_path]
    if bound_sizes:
        options += ["--bound-sizes", ",".join(map(str, bound_sizes))]
    if not getattr(args, "check", True):
        options.append("--no-check")
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    if mpi_missing() is None:
        command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(WORLD),
                   "-x", "OMP_NUM_THREADS=1", *shlex.split(getattr(args, "mpi_args", "") or ""),
                   sys.executable, os.path.join(HERE, "paired.py"), *options]
        print(f"# {shlex.join(command)}", flush=True)
        code = _run_bounded(command, args.timeout * max(1, len(sizes)))
        if code:
            method.fail(f"the paired ranks failed (exit {code}); see the output above", code=3)
        with open(json_path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    from local_ranks import RankFailure, run_local_ranks

    rank_args = parse_args(options)
    records = []
    try:
        for record in run_local_ranks(_local_rank, (rank_args,), WORLD, args.timeout):
            print(progress_line(record), flush=True)
            records.append(record)
    except RankFailure as exc:
        method.fail(str(exc), code=3)
    with open(json_path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(record) + "\n" for record in records)
    return records


class JobTimeout(Exception):
    """The paired ranks gave no result within the time allowed (they were stopped)."""


def _run_bounded(command: list[str], timeout_s: float) -> int:
    """Run mpirun in its own session; past `timeout_s` stop it and every rank (JobTimeout)."""
    proc = subprocess.Popen(command, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        from commbench.lifetime import end_session

        end_session(proc, grace_s=5)
        raise JobTimeout(f"no result in {timeout_s:g} s") from None


def add_pair_options(parser: argparse.ArgumentParser, slot_time_s: float = 0.05,
                     pairs: int = method.DEFAULT_PAIRS) -> None:
    """The options every paired comparison script takes (a script whose tools are noisy per call, as
    gloo is here, asks for longer slots)."""
    parser.add_argument("--pairs", type=int, default=pairs,
                        help="ABBA pairs of slots per comparison and size [default: %(default)s]")
    parser.add_argument("--slot-time", type=float, default=slot_time_s, metavar="SECONDS",
                        help="time budget of one slot's timed calls (commbench's adaptive rule; at least "
                             f"{MIN_SLOT_ITERS} calls) [default: %(default)s]")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                        help="give up when a rank reports nothing for this long (per size) [default: 300]")


def comparison(record: dict, key: str, stat: str = "time_us") -> method.PairedRatio:
    """The pair ratios of comparison `key` ("a:b") in one size's record: b's stat / a's stat per pair."""
    pairs = record["comparisons"].get(key, [])
    return method.PairedRatio.of_times([(p["a"][stat], p["b"][stat]) for p in pairs])


def slot_times(record: dict, tool: str, stat: str = "time_us") -> list[float]:
    """Every slot's figure of `tool` at this size, over all comparisons it took part in."""
    out = []
    for key, pairs in record["comparisons"].items():
        a, b = key.split(":")
        out += [p["a"][stat] for p in pairs if a == tool] + [p["b"][stat] for p in pairs if b == tool]
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1K,1M", help="bytes per rank, multiples of 4 [default: %(default)s]")
    parser.add_argument("--compare", default="shm:mpi", help=f"comma list of A:B, tools from {', '.join(TOOLS)}")
    parser.add_argument("--bound-sizes", default="", help="sizes at which comparisons with bound run")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip the checked commbench harness run of shm per size")
    parser.add_argument("--json", dest="json_path", default="out/paired.jsonl", help="rank 0 writes JSON lines here")
    add_pair_options(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
    except SizeError as exc:
        method.fail(str(exc))
    if any(n % 4 or n < 4 for n in sizes):
        method.fail("sizes must be positive multiples of 4 bytes (float32 elements)")
    for key in args.compare.split(","):
        if len(key.split(":")) != 2 or any(t not in TOOLS for t in key.split(":")):
            method.fail(f"--compare: A:B pairs of {', '.join(TOOLS)} (got {key!r})")
    if "OMPI_COMM_WORLD_RANK" in os.environ or "PMI_RANK" in os.environ:
        return _mpi_rank_main(args)
    method.fail("run under mpirun (see --help), or through shm_vs_peers.py / peers_cpu.py")
    return 2


if __name__ == "__main__":
    sys.exit(main())
