"""--backend cuda's Python side end to end without a GPU: a stand-in for CuPy whose device
memory is NumPy bytes at fake addresses and whose kernels are the NumPy mirrors of cuda/
(plan.emulate_round for schedule_round, blocks in reverse order). The real harness
fills and checks every result, so a wrong pointer, offset, table or launch order in
sched.py shows up as #wrong. As in CUDA, the current device is per thread, streams
and events belong to the device current when they were made, and a kernel launch or
event record on another device's stream fails. Streams run in issue order, so this
checks the logic, not the concurrency; the GPU tests in test_sched.py check the
rest on hardware."""
import bisect
import re
import sys
import threading
import types

import numpy as np
import pytest
from conftest import results_of

from commbench.backends import BackendConfig
from commbench.backends.cuda import kernels as K
from commbench.backends.cuda import plan as P
from commbench.bench import Sweep
from commbench.collectives import DTYPES
from commbench.errors import EXIT_OK
from commbench.launchers import LaunchInfo
from commbench.schedule import REDUCERS, split
from commbench.sweep_config import SweepConfig
from commbench.topology import Topology


class Heap:
    """Device memory of every fake GPU: NumPy byte arrays at 256-aligned fake addresses; the
    calling thread's current device; what was captured and loaded."""

    def __init__(self):
        self.bases, self.buffers, self.next = [], [], 1 << 30
        self.recording = None  # a list while a stream captures a graph
        self.graphs = []  # launches captured per graph
        self.loaded = []  # ("module" or a kernel name, device), as modules load and kernels are looked up
        self.local = threading.local()

    @property
    def device(self):
        return getattr(self.local, "device", 0)

    @device.setter
    def device(self, device):
        self.local.device = device

    def alloc(self, nbytes):
        base, self.next = self.next, self.next + (nbytes + 511) // 256 * 256 + 256
        self.bases.append(base)
        self.buffers.append(np.zeros(max(nbytes, 1), dtype=np.uint8))
        return base

    def view(self, address, count, dtype):
        i = bisect.bisect_right(self.bases, address) - 1
        offset, dtype = address - self.bases[i], np.dtype(dtype)
        assert offset + count * dtype.itemsize <= len(self.buffers[i]), "access past the end of an allocation"
        return self.buffers[i][offset:offset + count * dtype.itemsize].view(dtype)

    def run(self, work):
        if self.recording is not None:
            self.recording.append(work)
        else:
            work()


class FakeArray:
    def __init__(self, heap, ptr, size, dtype):
        self.heap, self.ptr, self.size, self.dtype = heap, ptr, size, np.dtype(dtype)
        self.data, self.itemsize = types.SimpleNamespace(ptr=ptr), self.dtype.itemsize

    def np(self):
        return self.heap.view(self.ptr, self.size, self.dtype)

    def __getitem__(self, item):
        start, stop, _ = item.indices(self.size)
        return FakeArray(self.heap, self.ptr + start * self.itemsize, max(0, stop - start), self.dtype)

    def set(self, values):
        self.np()[...] = values

    def fill(self, value):
        self.np()[...] = value

    def get(self):
        return self.np().copy()


class Memory:
    """What the emulators read: typed views by address, the element size for block spans."""

    def __init__(self, heap, dtype):
        self.heap, self.dtype, self.itemsize = heap, np.dtype(dtype), np.dtype(dtype).itemsize

    def view(self, address, count):
        return self.heap.view(int(address), count, self.dtype)


class FakeKernel:
    def __init__(self, heap, name):
        self.heap, self.name = heap, name
        if name == "rank_barrier":
            self.kind = name
            return
        match = re.match(r"(\w+?)_(" + "|".join(DTYPES) + r")(?:_(sum|prod|max|min))?$", name)
        self.kind, self.dtype, self.op = match.group(1), DTYPES[match.group(2)], match.group(3)

    @property
    def kernel(self):
        """CuPy's RawKernel.kernel: the function loaded on the current device."""
        self.heap.loaded.append((self.name, self.heap.device))
        return self

    def __call__(self, grid, block, args, stream=None):
        if stream is not None:  # RawKernel launches on the current device: the stream must be its
            assert stream.device == self.heap.device, \
                f"{self.name} launched on GPU {self.heap.device} with a stream of GPU {stream.device}"
        self.heap.run(lambda: getattr(self, self.kind)(grid, *args))

    def schedule_round(self, grid, entries, n_entries, inputs):
        table = entries.np().view(P.ENTRY_DTYPE)
        assert len(table) == n_entries and P.ENTRY_DTYPE.itemsize == 32
        P.emulate_round(table, inputs.np(), Memory(self.heap, self.dtype.host), self.op, range(grid[0])[::-1])

    def _rows(self, ins, outs, world, count):
        memory = Memory(self.heap, self.dtype.host)
        return [memory.view(p, count) for p in ins.np()[:world]], [memory.view(p, count) for p in outs.np()]

    def oneshot_allreduce(self, grid, ins, outs, world, first_rank, count):
        sources, targets = self._rows(ins, outs, world, count)
        for out in targets[:grid[1]]:
            acc = sources[0].copy()
            for data in sources[1:]:
                REDUCERS[self.op](acc, data, out=acc)
            out[...] = acc

    def twoshot_reduce_scatter(self, grid, ins, outs, world, first_rank, count):
        sources, targets = self._rows(ins, outs, world, count)
        for y, out in enumerate(targets[:grid[1]]):
            start, stop = split(int(count), int(world))[first_rank + y]
            acc = sources[0][start:stop].copy()
            for data in sources[1:]:
                REDUCERS[self.op](acc, data[start:stop], out=acc)
            out[start:stop] = acc

    def twoshot_allgather(self, grid, ins, outs, world, first_rank, count):
        sources, targets = self._rows(ins, outs, world, count)
        for y, out in enumerate(targets[:grid[1]]):
            for p, (start, stop) in enumerate(split(int(count), int(world))):
                if p != first_rank + y:
                    out[start:stop] = sources[p][start:stop]

    def rank_barrier(self, grid, peer_flags, my_flags, my_epoch, rank, world, timeout_ns, error):
        """cuda/schedule_round.cu's barrier, run to completion: nothing once the error word is
        set; else signal every peer, then look for every peer's signal (a missing one is
        recorded, as the kernel does when it times out)."""
        view = lambda address, dtype=np.uint64: self.heap.view(int(address), 1, dtype)  # noqa: E731
        if view(error, np.int32)[0]:
            return  # an earlier barrier timed out: return at once, as the kernel does
        epoch = view(my_epoch)[0] + 1
        for _, flags in enumerate(peer_flags.np()[:world]):
            view(int(flags) + 8 * int(rank))[0] = epoch
        missing = [p for p in range(int(world)) if view(int(my_flags) + 8 * p)[0] < epoch]
        if missing:
            view(error, np.int32)[0] = missing[0] + 1
        view(my_epoch)[0] = epoch

    def scale(self, grid, pointer, count, factor):
        data = self.heap.view(int(pointer), int(count), self.dtype.host)
        data[...] = (data.astype(np.float64) * float(factor)).astype(data.dtype)


class CompileException(Exception):
    """cupy.cuda.compiler.CompileException: NVRTC's log as the message."""


def fake_cupy(heap, gpus, compile_log=None):
    """CuPy as far as commbench uses it; `compile_log`: every RawModule fails to compile with it."""
    class Device:
        compute_capability = "90"

        def __init__(self, device=None):
            self.id = heap.device if device is None else device
            self.pci_bus_id, self._previous = f"0000:{self.id + 0x10:02x}:00.0", []

        def __enter__(self):
            self._previous.append(heap.device)
            heap.device = self.id
            return self

        def __exit__(self, *exc):
            heap.device = self._previous.pop()
            return False

        def use(self):
            heap.device = self.id

        def synchronize(self):
            pass

    class Stream:
        ptr = 0x5EED

        def __init__(self, non_blocking=False):
            self.device, self.done = heap.device, True

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def synchronize(self):
            pass

        def wait_event(self, event):
            pass

        def begin_capture(self):
            heap.recording = []

        def end_capture(self):
            recorded, heap.recording = heap.recording, None
            heap.graphs.append(len(recorded))
            return Graph(recorded)

    class Graph:
        def __init__(self, recorded):
            self.recorded, self.uploaded = recorded, False

        def upload(self, stream=None):
            self.uploaded = True

        def launch(self, stream=None):
            assert self.uploaded, "a graph is uploaded before it is launched (and timed)"
            for work in self.recorded:
                work()

    class Event:
        def __init__(self, disable_timing=False):
            self.device, self.done = heap.device, True

        def record(self, stream=None):
            assert stream is None or stream.device == self.device, "an event records on a stream of its own GPU"

        def synchronize(self):
            pass

    def memcpy_async(dst, src, nbytes, kind, stream):
        heap.run(lambda: heap.view(dst, nbytes, np.uint8).__setitem__(Ellipsis, heap.view(src, nbytes, np.uint8)))

    def empty(count, dtype):
        dtype = np.dtype(dtype)
        return FakeArray(heap, heap.alloc(count * dtype.itemsize), count, dtype)

    def asarray(values):
        array = empty(values.size, values.dtype)
        array.set(values)
        return array

    def memset(pointer, value, nbytes):
        heap.view(pointer, nbytes, np.uint8)[...] = value

    class RawModule:
        def __init__(self, code, options):
            pass

        @property
        def module(self):
            if compile_log is not None:
                raise CompileException(compile_log)
            heap.loaded.append(("module", heap.device))
            return self

        def get_function(self, name):
            return FakeKernel(heap, name)

    runtime = types.SimpleNamespace(getDeviceCount=lambda: gpus, memcpyAsync=memcpy_async, memset=memset,
                                    deviceSynchronize=lambda: None,
                                    deviceCanAccessPeer=lambda a, b: True, deviceEnablePeerAccess=lambda peer: None,
                                    CUDARuntimeError=RuntimeError,
                                    ipcGetMemHandle=lambda ptr: ptr.to_bytes(64, "little"),
                                    ipcOpenMemHandle=lambda handle: int.from_bytes(handle, "little"),
                                    ipcCloseMemHandle=lambda ptr: None)
    memory = lambda nbytes: types.SimpleNamespace(ptr=heap.alloc(nbytes))  # noqa: E731 - cudaMalloc
    cuda = types.SimpleNamespace(Device=Device, Stream=Stream, Event=Event, runtime=runtime, Memory=memory,
                                 MemoryPointer=lambda mem, offset: types.SimpleNamespace(ptr=mem.ptr + offset),
                                 get_elapsed_time=lambda start, end: 0.01,
                                 compiler=types.SimpleNamespace(CompileException=CompileException))
    ndarray = lambda shape, dtype, memptr: FakeArray(heap, memptr.ptr, shape[0], dtype)  # noqa: E731
    return types.SimpleNamespace(cuda=cuda, empty=empty, asarray=asarray, ndarray=ndarray, RawModule=RawModule)


def _clear_kernel_caches():
    for cached in (K.module, K.load, K.function):
        cached.cache_clear()


@pytest.fixture
def fake_gpus(monkeypatch):
    import torch.distributed  # noqa: F401 - imported with the real CuPy (torch probes cupyx on first import)

    _clear_kernel_caches()
    heap = Heap()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(heap, gpus=4))
    yield heap
    _clear_kernel_caches()  # never let a fake kernel outlive the test


def run(tmp_path, mode, world, algorithm="auto", collectives=("allreduce",), dtype="float32", op="sum",
        topology=None, graph=False, sizes=(1024, 100_000, 1 << 20)):
    from commbench.backends.cuda.sched import CudaBackend

    topo = Topology(*topology) if topology else Topology(1, world)
    cfg = SweepConfig(backend=BackendConfig(backend="cuda", algorithm=algorithm, nprocs=world, cuda_mode=mode,
                                            graph=graph),
                      collectives=collectives, sizes=sizes, dtype=dtype, op=op, iters=2, warmup=1,
                      json_path=str(tmp_path / "r.jsonl"))
    backend = CudaBackend(world, topo, algorithm, mode, graph)
    assert Sweep(cfg, LaunchInfo.local(0, 1, 0), backend).run() == EXIT_OK
    results, _ = results_of(tmp_path / "r.jsonl")
    assert results and all(r["wrong"] == 0 and r["library"] == f"cuda-{mode}" for r in results)
    return results


@pytest.mark.parametrize("mode", ["virtual", "peer"])
@pytest.mark.parametrize("algorithm", ["ring", "tree", "rhd", "oneshot", "binomial", "twoshot"])
def test_every_allreduce_algorithm_passes_the_check(fake_gpus, tmp_path, mode, algorithm):
    results = run(tmp_path, mode, 3 if mode == "virtual" else 4, algorithm)
    assert {r["algorithm"] for r in results} == {algorithm}


@pytest.mark.parametrize("dtype,op", [("float32", "avg"), ("float16", "max"), ("int8", "sum"), ("int64", "min")])
def test_every_collective_in_place_and_out_of_place(fake_gpus, tmp_path, dtype, op):
    run(tmp_path, "virtual", 4, collectives=("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"),
        dtype=dtype, op=op, sizes=(1000, 40_000))


def test_hier_across_two_emulated_nodes(fake_gpus, tmp_path):
    assert {r["steps"] for r in run(tmp_path, "peer", 4, "hier", topology=(2, 2))} == {4}  # 2(L-1) + 2(N-1)


def test_graph_captures_only_the_timed_calls_and_uploads_before_launch(fake_gpus, tmp_path):
    """Warm-up runs eagerly (one capture per point, not three); the graph holds the 2 timed
    calls' launches, and is uploaded before it is launched between the timing events."""
    run(tmp_path, "virtual", 4, "oneshot", graph=True, sizes=(4096,))
    # per call out of place: one oneshot launch reading the inputs and writing the outputs (issue 36: it
    # was 4 copies send -> recv and the in-place oneshot's two, into staging and written back); in place: 2
    assert fake_gpus.graphs == [2 * 1, 2 * 2]


@pytest.mark.parametrize("mode,graph", [("peer", False), ("virtual", True)])
def test_nothing_compiles_or_loads_inside_a_timed_call(fake_gpus, tmp_path, monkeypatch, mode, graph):
    """avg's scale kernel included: every kernel is loaded on every GPU before timing or capture."""
    from commbench.backends.cuda.sched import CudaBackend

    loads_while_timed = []
    timed = CudaBackend._time  # warm-up and timed calls, eager or captured

    def watched(self, call, iters, graph):
        before = len(fake_gpus.loaded)
        times = timed(self, call, iters, graph)
        loads_while_timed.append(fake_gpus.loaded[before:])
        return times
    monkeypatch.setattr(CudaBackend, "_time", watched)
    run(tmp_path, mode, 4, "ring", op="avg", graph=graph, sizes=(4096,))
    assert loads_while_timed and not any(loads_while_timed), loads_while_timed
    scaled_on = {device for name, device in fake_gpus.loaded if name == "scale_float32"}
    assert scaled_on == ({0, 1, 2, 3} if mode == "peer" else {0})


def test_a_kernel_that_does_not_compile_is_one_line(monkeypatch, tmp_path, capsys):
    import torch.distributed  # noqa: F401

    from commbench.bench import run_sweep
    from commbench.errors import EXIT_USAGE

    log = ('default_program(42): warning: unused\ndefault_program(97): error: identifier "undefined_name" is '
           'undefined\n\n1 error detected in the compilation of "default_program".')
    _clear_kernel_caches()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(Heap(), gpus=1, compile_log=log))
    try:
        code = run_sweep(SweepConfig(backend=BackendConfig(backend="cuda", nprocs=2, cuda_mode="virtual")),
                         LaunchInfo.local(0, 1, 0))
    finally:
        _clear_kernel_caches()
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and err.count("\n") == 1, err
    assert 'does not compile with NVRTC: default_program(97): error: identifier "undefined_name"' in err


def test_an_old_gpu_is_refused_in_one_line(fake_gpus, monkeypatch):
    from commbench.backends import BackendError
    from commbench.backends.cuda.sched import CudaBackend

    monkeypatch.setattr(sys.modules["cupy"].cuda.Device, "compute_capability", "60")
    with pytest.raises(BackendError, match="compute capability 7.0 or newer; GPU 0 is 6.0"):
        CudaBackend(2, Topology(1, 2), mode="virtual")


def test_peer_mode_refuses_more_ranks_than_gpus(fake_gpus):
    from commbench.backends import BackendError
    from commbench.backends.cuda.sched import CudaBackend

    with pytest.raises(BackendError, match="8 ranks but 4 GPU"):
        CudaBackend(8, Topology(1, 8), mode="peer")


def test_two_ranks_on_one_gpu_are_refused_but_one_gpu_per_rank_is_not(fake_gpus):
    """3 ranks on a host with 2 visible GPUs: rank 2 would share GPU 0 with rank 0. With a
    launcher that shows each rank its own single GPU (different bus ids), all is well."""
    from commbench.backends import BackendError
    from commbench.backends.cuda.device import rank_gpu

    bus = lambda gpu: f"0000:{gpu + 0x10:02x}:00.0"  # noqa: E731 - the fake's PCI bus ids
    shared = lambda place: [("node1", bus(0)), ("node1", bus(1)), place]  # noqa: E731
    with pytest.raises(BackendError, match=r"ranks 0 and 2 would share GPU 0000:10:00.0 on node1"):
        rank_gpu("cupy", 2, 2, lambda place: shared(("node1", place[1])))
    bound = lambda place: [("node1", "0000:a0:00.0"), ("node1", "0000:b0:00.0"), ("node1", place[1])]  # noqa: E731
    assert rank_gpu("cupy", 2, 1, bound) == 0
    assert rank_gpu("cupy", 0, 1, lambda place: [place, ("node2", place[1])]) == 0  # same bus id, other host


def _ipc_launch(port, local_rank=0):
    """One rank of the ipc mode; `local_rank` picks its GPU (the fake has 4)."""
    return LaunchInfo("single", 0, 1, local_rank, 1, 0, 1, "127.0.0.1", port)


def test_ipc_mode_on_one_rank(fake_gpus, tmp_path, port):
    """One process of the ipc mode on GPU 1, driven from a thread whose current device is 0:
    unpooled allocations with handles, the flag arrays, a barrier before and after every
    round on the rank's own GPU, the error word read back after synchronising."""
    from concurrent.futures import ThreadPoolExecutor

    from commbench.backends.cuda.ipc import IpcCudaBackend

    launch = _ipc_launch(port, local_rank=1)
    cfg = SweepConfig(backend=BackendConfig(backend="cuda", algorithm="auto", nprocs=1, cuda_mode="ipc", graph=True),
                      collectives=("allreduce", "reduce_scatter"), sizes=(4096,), iters=2, warmup=1,
                      json_path=str(tmp_path / "r.jsonl"))
    backend = IpcCudaBackend.create(cfg.backend, launch)
    try:
        with ThreadPoolExecutor(1) as thread:
            assert thread.submit(lambda: Sweep(cfg, launch, backend).run()).result() == EXIT_OK
        results, _ = results_of(tmp_path / "r.jsonl")
        assert results and all(r["wrong"] == 0 and r["library"] == "cuda-ipc" for r in results)
        cupy = sys.modules["cupy"]
        epoch = cupy.ndarray((1,), np.uint64, types.SimpleNamespace(ptr=backend._flags_memory.ptr + 8))
        reached = int(epoch.get()[0])
        assert reached > 0  # the barrier ran and advanced its epoch on the device
        error = cupy.ndarray((1,), np.int32, types.SimpleNamespace(ptr=backend._flags_memory.ptr + 16))
        error.fill(1)  # as the kernel records rank 0 missing after --timeout
        with pytest.raises(RuntimeError, match="waiting for rank 0"):
            backend.synchronize()
        backend.round_barrier()
        assert int(epoch.get()[0]) == reached  # once the error is set, a barrier returns at once
    finally:
        backend.close()


def test_ipc_flags_are_zeroed_before_peers_may_signal_and_freed_after_they_unmap(fake_gpus, port, monkeypatch):
    """The memset has landed (device synchronised) before the control barrier that lets peers
    signal; at the end of a point, peers' handles are closed and every rank met before this
    rank's own allocations are dropped."""
    from commbench.backends.control import GroupControl
    from commbench.backends.cuda.ipc import IpcCudaBackend
    from commbench.collectives import DTYPES

    events, made = [], {}
    runtime = sys.modules["cupy"].cuda.runtime
    memset, barrier = runtime.memset, GroupControl.barrier
    monkeypatch.setattr(runtime, "memset", lambda *a: (events.append("memset"), memset(*a)))
    monkeypatch.setattr(runtime, "deviceSynchronize", lambda: events.append("synchronize"))
    monkeypatch.setattr(runtime, "ipcCloseMemHandle", lambda pointer: events.append(("close", pointer)))
    monkeypatch.setattr(GroupControl, "barrier", lambda self: (
        events.append(("barrier", len(made["backend"]._exported)) if made else "barrier"), barrier(self)))
    made["backend"] = backend = IpcCudaBackend(_ipc_launch(port), Topology(1, 1))
    try:
        assert events == ["memset", "synchronize", "barrier"]
        events.clear()
        buffer = backend.alloc(1000, DTYPES["float32"])
        del buffer  # the harness drops its buffers before the point ends: this rank still holds the memory
        backend._opened.append(0xABC)  # a peer's mapping
        backend.end_point()
        assert events == [("close", 0xABC), ("barrier", 1)] and backend._exported == []
    finally:
        backend.close()


def test_ipc_failed_point_closes_nothing_and_meets_no_one(fake_gpus, port, monkeypatch):
    """After a failed point, kernels still queued may address the peers' memory and a dead peer
    would never arrive: no handle is closed, no rank met, nothing freed, there or at close()."""
    from commbench.backends.control import GroupControl
    from commbench.backends.cuda.ipc import IpcCudaBackend
    from commbench.collectives import DTYPES

    backend = IpcCudaBackend(_ipc_launch(port), Topology(1, 1))
    events = []
    monkeypatch.setattr(sys.modules["cupy"].cuda.runtime, "ipcCloseMemHandle", lambda p: events.append(("close", p)))
    monkeypatch.setattr(GroupControl, "barrier", lambda self: events.append("barrier"))
    buffer = backend.alloc(1000, DTYPES["float32"])
    del buffer
    backend._opened.append(0xABC)
    backend.end_point(failed=True)
    backend.close()
    assert events == [] and len(backend._exported) == 1 and backend._opened == [0xABC]


@pytest.mark.parametrize("mode,world,topology", [("virtual", 3, None), ("peer", 4, (2, 2))])
@pytest.mark.parametrize("algorithm", ["pairwise", "bruck", "hier"])
def test_every_alltoall_algorithm_passes_the_check(fake_gpus, tmp_path, mode, world, topology, algorithm):
    """alltoall's block layout (copies in and out of a scratch buffer around the rounds) on the kernels."""
    results = run(tmp_path, mode, world, algorithm, collectives=("alltoall",), topology=topology,
                  sizes=(1000, 40_000))
    assert {r["algorithm"] for r in results} == {algorithm} and {r["collective"] for r in results} == {"alltoall"}
