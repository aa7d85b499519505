"""--backend cupy's Python side end to end without a GPU: test_sched_fake_gpu's stand-in
for CuPy, plus a stand-in for cupy.cuda.nccl that reads and writes the fake device memory the
way NCCL does on one rank (ncclLaunchOneRank: a copy, or for avg on floats a multiply by
1/nRanks; the dtype and op are NCCL's enum values, so a wrong dtype or op constant, count or
pointer shows up as #wrong). The harness fills and checks every result, as the GPU test
test_nccl.py::test_every_collective_passes_the_check does on hardware, for the same
dtypes, ops, collectives and sizes (issue 36: floats failed there, ints passed)."""
import sys
import types

import numpy as np
import pytest
from conftest import results_of
from test_sched_fake_gpu import Heap, _clear_kernel_caches, fake_cupy

from commbench.backends import BackendConfig
from commbench.bench import Sweep
from commbench.collectives import DTYPES, OPS
from commbench.errors import EXIT_OK
from commbench.launch import free_port
from commbench.launchers import LaunchInfo
from commbench.sweep_config import SweepConfig

# NCCL's ncclDataType_t and ncclRedOp_t (nccl.h), as cupy.cuda.nccl exports them
NCCL_TYPES = {"NCCL_INT8": (0, "int8"), "NCCL_UINT8": (1, "uint8"), "NCCL_INT32": (2, "int32"),
              "NCCL_INT64": (4, "int64"), "NCCL_FLOAT16": (6, "float16"), "NCCL_FLOAT32": (7, "float32"),
              "NCCL_FLOAT64": (8, "float64"), "NCCL_BFLOAT16": (9, "bfloat16")}
NCCL_OPS = {"NCCL_SUM": 0, "NCCL_PROD": 1, "NCCL_MAX": 2, "NCCL_MIN": 3, "NCCL_AVG": 4}
STORE = {name: np.uint16 if name == "bfloat16" else np.dtype(name) for _, name in NCCL_TYPES.values()}


def fake_nccl(heap, calls):
    """cupy.cuda.nccl on one rank: every call is logged in `calls` as (name, dtype name, op)."""
    type_names = {code: name for code, name in NCCL_TYPES.values()}

    def one_rank(dst, src, count, datatype, op):
        """ncclLaunchOneRank: avg on a float type multiplies by 1/nRanks (= 1), anything else copies."""
        name = type_names[datatype]
        data = heap.view(src, count, STORE[name]).copy()
        if op == NCCL_OPS["NCCL_AVG"] and name in ("float16", "float32", "float64"):
            data = (data * data.dtype.type(1.0)).astype(data.dtype)
        heap.view(dst, count, STORE[name])[...] = data

    class NcclCommunicator:
        def __init__(self, world, unique_id, rank):
            assert world == 1 and rank == 0, "the fake runs one rank"
            self.pending = []  # group calls until groupEnd

        def _log(self, name, datatype, op=None):
            calls.append((name, type_names[datatype], op))

        def allReduce(self, s, r, count, datatype, op, stream):  # noqa: N802 - CuPy's name
            self._log("allReduce", datatype, op)
            heap.run(lambda: one_rank(r, s, count, datatype, op))

        def reduceScatter(self, s, r, count, datatype, op, stream):  # noqa: N802
            self._log("reduceScatter", datatype, op)
            heap.run(lambda: one_rank(r, s, count, datatype, op))

        def reduce(self, s, r, count, datatype, op, root, stream):
            self._log("reduce", datatype, op)
            heap.run(lambda: one_rank(r, s, count, datatype, op))

        def allGather(self, s, r, count, datatype, stream):  # noqa: N802
            self._log("allGather", datatype)
            heap.run(lambda: one_rank(r, s, count, datatype, None))

        def broadcast(self, s, r, count, datatype, root, stream):
            self._log("broadcast", datatype)
            heap.run(lambda: one_rank(r, s, count, datatype, None))

        def send(self, s, count, datatype, peer, stream):
            self._log("send", datatype)
            self.pending.append(("send", s, count, datatype))

        def recv(self, r, count, datatype, peer, stream):
            self._log("recv", datatype)
            self.pending.append(("recv", r, count, datatype))

        def flush(self):
            sends = [p for p in self.pending if p[0] == "send"]
            recvs = [p for p in self.pending if p[0] == "recv"]
            self.pending = []
            for (_, s, count, datatype), (_, r, rcount, _) in zip(sends, recvs):
                assert count == rcount, "a send and its receive disagree on the count"
                heap.run(lambda s=s, r=r, count=count, datatype=datatype: one_rank(r, s, count, datatype, None))

        def check_async_error(self):
            pass

        def abort(self):
            pass

        def destroy(self):
            pass

    communicators = []

    def make(world, unique_id, rank):
        communicators.append(NcclCommunicator(world, unique_id, rank))
        return communicators[-1]

    def group_end():
        for comm in communicators:
            comm.flush()

    constants = {name: code for name, (code, _) in NCCL_TYPES.items()} | NCCL_OPS
    return types.SimpleNamespace(available=True, get_unique_id=lambda: b"\0" * 128, NcclCommunicator=make,
                                 groupStart=lambda: None, groupEnd=group_end, get_version=lambda: 22809,
                                 **constants)


@pytest.fixture
def fake_nccl_gpu(monkeypatch):
    import torch.distributed  # noqa: F401 - imported with the real CuPy (torch probes cupyx on first import)

    _clear_kernel_caches()
    heap, calls = Heap(), []
    cupy = fake_cupy(heap, gpus=1)
    cupy.cuda.nccl = fake_nccl(heap, calls)
    cupy.cuda.get_current_stream = lambda: cupy.cuda.Stream()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cupy.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", cupy.cuda.nccl)
    yield calls
    _clear_kernel_caches()


COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall")


def _sweep(backend, tmp_path, dtype, op):
    path = tmp_path / f"{op}.jsonl"
    cfg = SweepConfig(backend=BackendConfig(backend="cupy", nprocs=1), collectives=COLLECTIVES,
                      sizes=(1024, 4112), dtype=dtype, op=op, iters=2, warmup=1, json_path=str(path))
    assert Sweep(cfg, LaunchInfo.local(0, 1, 0), backend).run() == EXIT_OK, op
    return results_of(path)[0]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_collective_passes_the_check_on_one_rank(fake_nccl_gpu, tmp_path, dtype):
    """The GPU test's sweep (-N 1, every op; 1K and 4112 B for its 1048592: the same odd tail, less
    to check) through the fake: every point checked, none wrong, every NCCL call of the dtype asked for."""
    from commbench.backends.cuda.nccl import CupyBackend

    backend = CupyBackend(LaunchInfo.local(0, 1, free_port()))
    try:
        outcomes = {op: _sweep(backend, tmp_path, dtype, op) for op in OPS}
    finally:
        backend.close()
    for op, results in outcomes.items():
        assert len(results) == 2 * (2 * len(COLLECTIVES) - 1), op  # alltoall has no in-place point
        assert all(r["wrong"] == 0 for r in results), [(r["collective"], r["placement"], r["wrong"]) for r in results]
    assert {dtype_name for _, dtype_name, _ in fake_nccl_gpu} == {dtype}
