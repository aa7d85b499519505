"""Paired slots: several allreduce tools in the same 2 ranks, alternated per size (method.py's pairing).

The comparison scripts (shm_vs_peers.py, peers_cpu.py) run this once: every tool they
compare lives in the same two processes, and per size each comparison A:B runs
--pairs pairs of short slots in ABBA order (A B, B A, A B, ...). A slot is the tool's
own barrier, then N back-to-back calls each timed with time.perf_counter (the loop
commbench's harness times with, TorchBackend.time_iterations); its time_us is each
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
import time
from typing import Any, Callable

import method
import numpy as np

from commbench.sizes import SizeError, format_size, parse_sizes

WORLD = 2
TOOLS = ("shm", "shmpy", "piped", "oneshot", "ring", "p2p", "torch", "gloo", "mpi", "deepspeed", "bound", "bound4k")
HERE = os.path.dirname(os.path.abspath(__file__))
MIN_SLOT_ITERS = 3  # at 256 MiB a gloo call takes ~0.15 s: 3 calls keep a slot under a second


# ---------------------------------------------------------------- control plane of the ranks


class MpiControl:
    """Barrier and max-over-ranks through MPI (outside every timed loop)."""

    def __init__(self):
        from mpi4py import MPI

        self.mpi, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.world = self.comm.rank, self.comm.size

    def barrier(self) -> None:
        self.comm.Barrier()

    def max(self, value: float) -> float:
        return self.comm.allreduce(value, op=self.mpi.MAX)

    def max_each(self, values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        self.comm.Allreduce(values, out, op=self.mpi.MAX)
        return out

    def bcast(self, value: Any) -> Any:
        return self.comm.bcast(value, root=0)


class TorchControl:
    """The same through the gloo process group (local ranks without MPI)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def max(self, value: float) -> float:
        return float(self.max_each(np.array([value], dtype=np.float64))[0])

    def max_each(self, values: np.ndarray) -> np.ndarray:
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64).copy())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.numpy()


# ---------------------------------------------------------------- the tools, in a rank


class Slot:
    """One tool at one size: its call, its barrier, and the iteration count of its slots."""

    def __init__(self, call: Callable[[], Any], barrier: Callable[[], None],
                 release: Callable[[], None] = lambda: None):
        self.call, self.barrier, self.release = call, barrier, release
        self.warmup = self.iters = 0
        self.info: dict = {}

    def calibrate(self, control, slot_time_s: float) -> None:
        """Warm up and pick N by commbench's adaptive rule (max over ranks), slot budget `slot_time_s`."""
        first_us = control.max(_loop_us(self.call, 1)[0])
        extra = method.warmup_count(first_us, slot_time_s)
        estimate_us = control.max(float(np.median(_loop_us(self.call, extra))))
        self.warmup = 1 + extra
        self.iters = method.iteration_count(estimate_us, slot_time_s, min_iters=MIN_SLOT_ITERS)

    def run(self, control) -> dict:
        """One slot: barrier, N timed calls; time_us and p50_us as commbench computes them."""
        self.barrier()
        times_us = np.array(_loop_us(self.call, self.iters))
        per_call = control.max_each(times_us)
        return {"time_us": control.max(float(times_us.mean())), "p50_us": float(np.median(per_call))}


def _loop_us(call: Callable[[], Any], iters: int) -> list[float]:
    """The harness's timed loop (TorchBackend.time_iterations), in microseconds."""
    times = [0.0] * iters
    clock = time.perf_counter
    for i in range(iters):
        start = clock()
        call()
        times[i] = clock() - start
    return [t * 1e6 for t in times]


class Tools:
    """The backends and buffers of the tools one rank runs; `slot(tool, nbytes)` builds a Slot."""

    def __init__(self, control, tools: set[str], port: int, timeout_s: float):
        from commbench.launch import LaunchInfo

        self.control, self.tools = control, tools
        self.launch = LaunchInfo.local(control.rank, control.world, port)
        self.shm = None
        if tools & {"shm", "shmpy", "piped", "oneshot", "ring", "p2p", "torch", "gloo", "deepspeed"}:
            from commbench.backends.shm import ShmBackend
            from commbench.topology import Topology

            # ShmBackend is a TorchBackend: its gloo process group serves torch, gloo and p2p too.
            self.shm = ShmBackend(self.launch, Topology(1, control.world), "auto", timeout_s)

    def slot(self, tool: str, nbytes: int) -> Slot:
        count = nbytes // 4
        return getattr(self, f"_{tool}")(count)

    def _oneshot(self, count: int) -> Slot:
        return self._shm_algorithm(count, "oneshot")

    def _ring(self, count: int) -> Slot:
        return self._shm_algorithm(count, "ring")

    def _shm_algorithm(self, count: int, algorithm: str) -> Slot:
        self.shm.algorithm = algorithm
        try:
            return self._shm(count)
        finally:
            self.shm.algorithm = "auto"

    def _shmpy(self, count: int) -> Slot:
        native, self.shm._native = self.shm._native, None  # the executor is chosen per prepared call
        try:
            slot = self._shm(count)
        finally:
            self.shm._native = native
        slot.info["executor"] = "python"
        return slot

    def _piped(self, count: int) -> Slot:
        self.shm.pipeline = True  # large rings cut into LLC-sized slices (ShmBackend._pipeline_slices)
        try:
            slot = self._shm(count)
        finally:
            self.shm.pipeline = False
        slot.info["pipelined"] = True
        return slot

    def _shm(self, count: int) -> Slot:
        from commbench import collectives as C

        backend, dtype = self.shm, C.resolve_dtype("float32")
        buffer = backend.alloc(count, dtype)
        backend.fill(buffer, 1.0)
        self.control.barrier()  # every rank's segment exists before a peer maps it
        call = backend.prepare("allreduce", buffer, buffer, "sum", 0, True)
        slot = Slot(call, backend.barrier, backend.end_point)
        slot.info = {"algorithm": backend.describe()["algorithm"], "steps": backend.describe()["steps"],
                     "executor": "native" if backend._native is not None else "python"}
        return slot

    def shm_checked(self, nbytes: int, slot_time_s: float) -> dict:
        """commbench's own harness on shm at this size, result checked: what `commbench sweep` measures."""
        from commbench import bench
        from commbench import collectives as C

        backend, dtype = self.shm, C.resolve_dtype("float32")
        plan = C.plan("allreduce", nbytes, dtype, self.control.world)
        cfg = bench.SweepConfig(sizes=(plan.nbytes,), placements=("in-place",), min_time_s=slot_time_s,
                                backend="shm", device="cpu", check=True)
        outcome = bench.measure_point(backend, cfg, plan, "in-place", C.make_pattern(dtype, "sum", self.control.world))
        result = bench.collect(backend, outcome, "max")
        backend.end_point()
        return {"wrong": result["wrong"], "time_us": result["time_us"], "p50_us": result["p50_us"]} if result else {}

    def _p2p(self, count: int) -> Slot:
        import torch
        import torch.distributed as dist

        from commbench.backends.p2p import P2PBackend

        backend = P2PBackend.__new__(P2PBackend)  # a p2p executor on the shm backend's gloo group (no second init)
        backend.__dict__.update({key: getattr(self.shm, key) for key in
                                 ("device", "library", "rank", "world_size", "_torch_device", "control")})
        backend.topology, backend.algorithm = self.shm.topology, "ring"
        tensor = torch.ones(count, dtype=torch.float32)
        slot = Slot(backend.prepare("allreduce", tensor, tensor, "sum", 0, True), dist.barrier)
        slot.info = {"algorithm": "ring"}
        return slot

    def _torch(self, count: int) -> Slot:
        import torch
        import torch.distributed as dist

        from commbench.backends.torch_dist import TorchBackend

        tensor = torch.ones(count, dtype=torch.float32)
        return Slot(TorchBackend.prepare(self.shm, "allreduce", tensor, tensor, "sum", 0, True), dist.barrier)

    def _gloo(self, count: int) -> Slot:
        import torch
        import torch.distributed as dist

        tensor = torch.ones(count, dtype=torch.float32)
        return Slot(lambda: dist.all_reduce(tensor), dist.barrier)

    def _deepspeed(self, count: int) -> Slot:
        import torch
        import torch.distributed as dist

        comm = self._deepspeed_comm()
        tensor = torch.ones(count, dtype=torch.float32)
        return Slot(lambda: comm.inference_all_reduce(tensor), dist.barrier)

    def _deepspeed_comm(self):
        """deepspeed.comm on the ranks' gloo group, once; a RuntimeError where its shm op would not run."""
        if getattr(self, "_ds", None) is None:
            launch = self.launch
            os.environ.update({"DS_ACCELERATOR": "cpu", "LOCAL_SIZE": str(launch.local_world_size),
                               "RANK": str(launch.rank), "LOCAL_RANK": str(launch.local_rank),
                               "WORLD_SIZE": str(launch.world_size), "MASTER_ADDR": launch.master_addr,
                               "MASTER_PORT": str(launch.master_port)})  # the op names its segments by these
            import deepspeed
            import deepspeed.comm as comm
            import torch

            deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
            level = getattr(comm.comm.cdb, "shm_vector_kernel_level", 0)
            if not hasattr(getattr(torch.ops, "deepspeed", None), "inference_all_reduce_") or level < 1:
                raise RuntimeError(f"DeepSpeed's shared-memory allreduce does not run here (op loaded: "
                                   f"{comm.comm.cdb.shm_comm_op is not None}, vector kernel level {level}): "
                                   "inference_all_reduce would be gloo's all_reduce")
            self._ds = comm
        return self._ds

    def _mpi(self, count: int) -> Slot:
        mpi, comm = self.control.mpi, self.control.comm
        buffer = np.ones(count, dtype=np.float32)
        return Slot(lambda: comm.Allreduce(mpi.IN_PLACE, buffer, op=mpi.SUM), comm.Barrier)

    def _bound(self, count: int) -> Slot:
        return BoundSlot(count, self.control)

    def _bound4k(self, count: int) -> Slot:
        return BoundSlot(count, self.control, shared=True)

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()


class BoundSlot(Slot):
    """The memory bound of shm's 2-rank ring: copy and add of private arrays, both ranks at once."""

    def __init__(self, count: int, control, shared: bool = False):
        self.src, self.dst = (_shared_array(count), _shared_array(count)) if shared else \
            (np.ones(count, dtype=np.float32), np.empty(count, dtype=np.float32))
        self.src[...] = 1.0
        np.copyto(self.dst, self.src)  # first touch: page faults are not bandwidth
        np.add(self.dst, self.src, out=self.dst)
        super().__init__(lambda: None, control.barrier)
        self.control = control

    def calibrate(self, control, slot_time_s: float) -> None:
        self.warmup, self.iters = 1, MIN_SLOT_ITERS

    def run(self, control) -> dict:
        copy_s, add_s = [], []
        for _ in range(self.iters):
            copy_s.append(self._timed(lambda: np.copyto(self.dst, self.src)))
            add_s.append(self._timed(lambda: np.add(self.dst, self.src, out=self.dst)))
        copy_us, add_us = control.max(float(np.median(copy_s)) * 1e6), control.max(float(np.median(add_s)) * 1e6)
        return {"time_us": add_us / 2 + copy_us / 2, "p50_us": add_us / 2 + copy_us / 2,
                "copy_us": copy_us, "add_us": add_us}

    def _timed(self, call: Callable[[], Any]) -> float:
        self.control.barrier()  # every call starts together: the two ranks stream at the same time
        start = time.perf_counter()
        call()
        return time.perf_counter() - start


def _shared_array(count: int) -> np.ndarray:
    """float32 array in a /dev/shm file mapping (unlinked at once: nothing is left behind)."""
    import mmap

    path = f"/dev/shm/cb_bound_{os.getpid()}_{time.monotonic_ns()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.unlink(path)
        os.posix_fallocate(fd, 0, count * 4)
        return np.frombuffer(mmap.mmap(fd, count * 4), dtype=np.float32)
    finally:
        os.close(fd)


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
            here = [c for c in comparisons if not any(t.startswith("bound") for t in c) or nbytes in bound_sizes]
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
        import signal

        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
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
