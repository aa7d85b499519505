"""--backend cuda's Python side end to end without a GPU: a stand-in for CuPy whose device
memory is NumPy bytes at fake addresses and whose kernels are the NumPy mirrors of cuda/
(cuda_plan.emulate_round for schedule_round, blocks in reverse order). The real harness
fills and checks every result, so a wrong pointer, offset, table or launch order in
cuda_sched.py shows up as #wrong. Streams run in issue order, so this checks the logic,
not the concurrency; the GPU tests in test_cuda_backend.py check the rest on hardware."""
import bisect
import re
import sys
import types

import numpy as np
import pytest

from commbench.backends import cuda_kernels as K
from commbench.backends import cuda_plan as P
from commbench.bench import EXIT_OK, Sweep, SweepConfig
from commbench.collectives import DTYPES
from commbench.launch import LaunchInfo
from commbench.schedule import REDUCERS, split
from commbench.topology import Topology
from conftest import results_of


class Heap:
    """Device memory of every fake GPU: NumPy byte arrays at 256-aligned fake addresses."""

    def __init__(self):
        self.bases, self.buffers, self.next = [], [], 1 << 30
        self.recording = None  # a list while a stream captures a graph

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

    def __call__(self, grid, block, args, stream=None):
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
        """cuda/schedule_round.cu's barrier, run to completion: signal every peer, then look for
        every peer's signal (a missing one is recorded, as the kernel does when it times out)."""
        view = lambda address, dtype=np.uint64: self.heap.view(int(address), 1, dtype)  # noqa: E731
        epoch = view(my_epoch)[0] + 1
        for p, flags in enumerate(peer_flags.np()[:world]):
            view(int(flags) + 8 * int(rank))[0] = epoch
        missing = [p for p in range(int(world)) if view(int(my_flags) + 8 * p)[0] < epoch]
        if missing:
            view(error, np.int32)[0] = missing[0] + 1
        view(my_epoch)[0] = epoch

    def scale(self, grid, pointer, count, factor):
        data = self.heap.view(int(pointer), int(count), self.dtype.host)
        data[...] = (data.astype(np.float64) * float(factor)).astype(data.dtype)


def fake_cupy(heap, gpus):
    class Device:
        def __init__(self, device=0):
            self.id = device

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def use(self):
            pass

        def synchronize(self):
            pass

    class Stream:
        ptr = 0x5EED

        def __init__(self, non_blocking=False):
            pass

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
            return types.SimpleNamespace(launch=lambda stream=None: [work() for work in recorded])

    class Event:
        def __init__(self, disable_timing=False):
            pass

        def record(self, stream=None):
            pass

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

    runtime = types.SimpleNamespace(getDeviceCount=lambda: gpus, memcpyAsync=memcpy_async, memset=memset,
                                    deviceCanAccessPeer=lambda a, b: True, deviceEnablePeerAccess=lambda peer: None,
                                    CUDARuntimeError=RuntimeError, ipcGetMemHandle=lambda ptr: ptr.to_bytes(64, "little"),
                                    ipcOpenMemHandle=lambda handle: int.from_bytes(handle, "little"),
                                    ipcCloseMemHandle=lambda ptr: None)
    memory = lambda nbytes: types.SimpleNamespace(ptr=heap.alloc(nbytes))  # noqa: E731 - cudaMalloc
    cuda = types.SimpleNamespace(Device=Device, Stream=Stream, Event=Event, runtime=runtime, Memory=memory,
                                 MemoryPointer=lambda mem, offset: types.SimpleNamespace(ptr=mem.ptr + offset),
                                 get_elapsed_time=lambda start, end: 0.01)
    module = types.SimpleNamespace(get_function=lambda name: FakeKernel(heap, name))
    ndarray = lambda shape, dtype, memptr: FakeArray(heap, memptr.ptr, shape[0], dtype)  # noqa: E731
    return types.SimpleNamespace(cuda=cuda, empty=empty, asarray=asarray, ndarray=ndarray,
                                 RawModule=lambda code, options: module)


@pytest.fixture
def fake_gpus(monkeypatch):
    import torch.distributed  # noqa: F401 - imported with the real CuPy (torch probes cupyx on first import)

    K.module.cache_clear()
    K.function.cache_clear()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(Heap(), gpus=4))
    yield
    K.module.cache_clear()  # never let a fake kernel outlive the test
    K.function.cache_clear()


def run(tmp_path, mode, world, algorithm="auto", collectives=("allreduce",), dtype="float32", op="sum",
        topology=None, graph=False, sizes=(1024, 100_000, 1 << 20)):
    from commbench.backends.cuda_sched import CudaBackend

    topo = Topology(*topology) if topology else Topology(1, world)
    cfg = SweepConfig(backend="cuda", collectives=collectives, sizes=sizes, dtype=dtype, op=op, iters=2, warmup=1,
                      algorithm=algorithm, nprocs=world, cuda_mode=mode, graph=graph, json_path=str(tmp_path / "r.jsonl"))
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


def test_graph_capture_replays_the_calls(fake_gpus, tmp_path):
    run(tmp_path, "virtual", 4, "oneshot", graph=True, sizes=(4096,))


def test_peer_mode_refuses_more_ranks_than_gpus(fake_gpus):
    from commbench.backends import BackendError
    from commbench.backends.cuda_sched import CudaBackend

    with pytest.raises(BackendError, match="8 ranks but 4 GPU"):
        CudaBackend(8, Topology(1, 8), mode="peer")


def test_ipc_mode_on_one_rank(fake_gpus, tmp_path, port):
    """One process of the ipc mode: unpooled allocations with handles, the flag arrays, a
    barrier before and after every round, the error word read back after synchronising."""
    from commbench.backends.cuda_ipc import IpcCudaBackend

    launch = LaunchInfo.local(0, 1, port)
    cfg = SweepConfig(backend="cuda", collectives=("allreduce", "reduce_scatter"), sizes=(4096,), iters=2, warmup=1,
                      algorithm="auto", nprocs=1, cuda_mode="ipc", json_path=str(tmp_path / "r.jsonl"))
    backend = IpcCudaBackend.create(cfg, launch)
    try:
        assert Sweep(cfg, launch, backend).run() == EXIT_OK
        results, _ = results_of(tmp_path / "r.jsonl")
        assert results and all(r["wrong"] == 0 and r["library"] == "cuda-ipc" for r in results)
        epoch = sys.modules["cupy"].ndarray((1,), np.uint64, types.SimpleNamespace(ptr=backend._flags_memory.ptr + 8))
        assert int(epoch.get()[0]) > 0  # the barrier ran and advanced its epoch on the device
        error = sys.modules["cupy"].ndarray((1,), np.int32, types.SimpleNamespace(ptr=backend._flags_memory.ptr + 16))
        error.fill(1)  # as the kernel records rank 0 missing after --timeout
        with pytest.raises(RuntimeError, match="waiting for rank 0"):
            backend.synchronize()
    finally:
        backend.close()
