"""The tools paired.py compares, each as a Slot in a rank: one allreduce call, its barrier, its timed loop.

A Slot is what one pair's half runs: the tool's barrier, then N back-to-back calls each timed with
time.perf_counter (the loop commbench's harness times with), N chosen by commbench's adaptive rule
for a slot budget. Tools builds the slot of each tool (commbench's shm, p2p and torch backends, a
bare gloo loop, Open MPI, DeepSpeed, the memory bound; paired.py's docstring describes each) on
one set of backends per rank; rank_control.py's MpiControl and TorchControl are the ranks' control
plane, outside every timed loop. paired.py pairs the slots; shm_waits.py and shm_steps.py build their own.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import method
import numpy as np

MIN_SLOT_ITERS = 3  # at 256 MiB a gloo call takes ~0.15 s: 3 calls keep a slot under a second


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
    """The harness's timed loop (DistGroup.time_iterations: backends/dist_group.py), in microseconds."""
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
        from commbench.launchers import LaunchInfo

        self.control, self.tools = control, tools
        self.launch = LaunchInfo.local(control.rank, control.world, port)
        self.shm = None
        if tools & {"shm", "shmpy", "piped", "oneshot", "ring", "oop", "oopcopy", "shm0", "oop0", "p2p", "torch",
                    "gloo", "deepspeed"}:
            from commbench.backends.shm.backend import ShmBackend
            from commbench.topology import Topology

            # ShmBackend owns the job's gloo process group (backends/dist_group.py): it serves torch, gloo and p2p too.
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
        native, self.shm.runner.native = self.shm.runner.native, None  # the executor is chosen per prepared call
        try:
            slot = self._shm(count)
        finally:
            self.shm.runner.native = native
        slot.info["executor"] = "python"
        return slot

    def _piped(self, count: int) -> Slot:
        self.shm.runner.pipeline = True  # large rings cut into LLC-sized slices (ShmExecutor.pipeline_slices)
        try:
            slot = self._shm(count)
        finally:
            self.shm.runner.pipeline = False
        slot.info["pipelined"] = True
        return slot

    def _oop(self, count: int) -> Slot:
        return self._shm(count, inplace=False)

    def _shm0(self, count: int, inplace: bool = True) -> Slot:
        """shm with the built-in values of the planner's knobs (shm_plan.Plan()), where `shm` runs the plan."""
        from commbench.backends.shm import native as shm_native
        from commbench.backends.shm.plan import Plan
        from commbench.backends.shm.waits import OVERSUBSCRIBED_SPIN_CHECKS

        backend, planned = self.shm, self.shm.runner.native
        built_in = shm_native.NativeExecutor(shm_native.load(), *backend.waits.native_layout(),
                                             OVERSUBSCRIBED_SPIN_CHECKS)
        built_in.tune(Plan().context_values())
        backend.runner.native = built_in  # the executor is chosen per prepared call
        try:
            slot = self._shm(count, inplace)
        finally:
            backend.runner.native = planned
        slot.info["plan"], slot.keep = "built-in", built_in
        return slot

    def _oop0(self, count: int) -> Slot:
        return self._shm0(count, inplace=False)

    def _oopcopy(self, count: int) -> Slot:
        self.shm.reads_inputs = False  # the input copied into the output first, as before 2026-11-26
        try:
            return self._shm(count, inplace=False)
        finally:
            del self.shm.reads_inputs  # the class's again

    def _shm(self, count: int, inplace: bool = True) -> Slot:
        from commbench import collectives as C

        backend, dtype = self.shm, C.resolve_dtype("float32")
        buffer = backend.alloc(count, dtype)
        out = buffer if inplace else backend.alloc(count, dtype)
        backend.fill(buffer, 1.0)
        self.control.barrier()  # every rank's segment exists before a peer maps it
        call = backend.prepare("allreduce", buffer, out, "sum", 0, inplace)
        slot = Slot(call, backend.barrier, backend.end_point)
        slot.info = {"algorithm": backend.describe()["algorithm"], "steps": backend.describe()["steps"],
                     "executor": "native" if backend.runner.native is not None else "python",
                     "plan": backend.header_fields().get("shm_plan")}  # shm0 and oop0 say "built-in" instead
        return slot

    def shm_checked(self, nbytes: int, slot_time_s: float) -> dict:
        """commbench's own harness on shm at this size, result checked: what `commbench sweep` measures."""
        from commbench import bench_point
        from commbench import collectives as C
        from commbench.backends import BackendConfig
        from commbench.sweep_config import SweepConfig

        backend, dtype = self.shm, C.resolve_dtype("float32")
        plan = C.plan("allreduce", nbytes, dtype, self.control.world)
        cfg = SweepConfig(sizes=(plan.nbytes,), placements=("in-place",), min_time_s=slot_time_s,
                          backend=BackendConfig(backend="shm", device="cpu"), check=True)
        pattern = C.make_pattern(dtype, "sum", self.control.world)
        outcome = bench_point.measure_point(backend, cfg, plan, "in-place", pattern)
        result = bench_point.collect(backend, outcome, "max")
        backend.end_point()
        return {"wrong": result["wrong"], "time_us": result["time_us"], "p50_us": result["p50_us"]} if result else {}

    def _p2p(self, count: int) -> Slot:
        import torch
        import torch.distributed as dist

        from commbench.backends.p2p import P2PBackend

        backend = P2PBackend.__new__(P2PBackend)  # a p2p executor on the shm backend's gloo group (no second init)
        backend.__dict__.update({key: getattr(self.shm, key) for key in
                                 ("device", "library", "rank", "world_size", "group", "control")})
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

    def _copybound(self, count: int) -> Slot:
        return CopyBoundSlot(count, self.control)

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()


class BoundSlot(Slot):
    """The memory bound of a pulled 2-rank ring (2.5 S per rank): copy and add of private arrays, both ranks
    at once. shm's ring pushes (2 S per rank): CopyBoundSlot is its bound."""

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


class CopyBoundSlot(BoundSlot):
    """The least traffic of any 2-rank allreduce: each rank must read S bytes (every input element read
    once, by one of the two) and write S bytes (its result), so both ranks at once copy S between private
    arrays; slot time = the faster kernel's median, NumPy's copy (glibc's memcpy) or shm_native's copy
    with non-temporal stores, max over ranks."""

    def __init__(self, count: int, control):
        self.src, self.dst = _aligned(count), _aligned(count)
        self.src[...] = 1.0
        self.dst[...] = 0.0  # first touch: page faults are not bandwidth
        self.streaming = _streaming_copy(self.dst, self.src)
        Slot.__init__(self, lambda: None, control.barrier)
        self.control = control

    def run(self, control) -> dict:
        numpy_s, stream_s = [], []
        for _ in range(self.iters):
            numpy_s.append(self._timed(lambda: np.copyto(self.dst, self.src)))
            stream_s.append(self._timed(self.streaming))
        numpy_us = control.max(float(np.median(numpy_s)) * 1e6)
        stream_us = control.max(float(np.median(stream_s)) * 1e6)
        best = min(numpy_us, stream_us)
        return {"time_us": best, "p50_us": best, "numpy_copy_us": numpy_us, "stream_copy_us": stream_us}


def _aligned(count: int) -> np.ndarray:
    """float32 array of `count` elements starting on a 64-byte boundary (streaming stores need 32)."""
    raw = np.empty(count + 16, dtype=np.float32)
    skip = (-raw.ctypes.data % 64) // 4
    return raw[skip:skip + count]


def _streaming_copy(dst: np.ndarray, src: np.ndarray) -> Callable[[], Any]:
    """dst[...] = src through shm_native's copy with non-temporal stores (a one-step plan, no barrier)."""
    import ctypes
    import functools

    from commbench.backends.shm import native as shm_native

    library = shm_native.load()
    ops = (shm_native.Op * 1)()
    ops[0].kind, ops[0].dtype, ops[0].stream = shm_native.OP_COPY, shm_native.DTYPES[dst.dtype], 1
    ops[0].count, ops[0].out, ops[0].a = len(dst), dst.ctypes.data, src.ctypes.data
    context = shm_native.Context(nt_bytes=0)
    call = functools.partial(library.cb_shm_run, ctypes.addressof(ops), 1, 0, 0, ctypes.addressof(context))
    call.keep = (ops, context, dst, src)  # what the pointers point into lives as long as the call
    return call


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

