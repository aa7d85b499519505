"""shm out of place: the plan reads each rank's input where the schedule reads what a copy of it would
hold (schedule.input_reads), so no copy runs first. The results are the reference interpreter's, bit for
bit, with the output buffers holding garbage before the call, under both executors, and the inputs are
left as they were; where reading the input does not work (oneshot's hazard round) the copy runs."""
import os

import numpy as np
import pytest
from conftest import clean_shm, end_rank, spawn_ranks  # noqa: F401

from commbench import algorithms as A
from commbench.schedule import input_reads, pipelined
from commbench.topology import Topology

CASES = [("ring", "float32", "sum", 1000), ("ring", "int32", "max", 20000), ("rhd", "float64", "sum", 777),
         ("tree", "float32", "prod", 300), ("binomial", "int64", "sum", 64), ("oneshot", "float32", "sum", 256)]


def _inputs(index: int, rank: int, dtype: str, count: int) -> np.ndarray:
    rng = np.random.default_rng([index, rank])
    return rng.integers(-1000, 1000, count).astype(dtype) if "int" in dtype else rng.standard_normal(count) * 1e3


def _rank(rank: int, world: int, port: int, executor: str, queue) -> None:
    os.environ["COMMBENCH_SHM_EXECUTOR"] = executor
    from commbench import collectives as C
    from commbench.backends.shm.backend import ShmBackend
    from commbench.launchers import LaunchInfo
    from commbench.schedule import run

    backend = ShmBackend(LaunchInfo.local(rank, world, port), Topology(1, world), "auto", 60)
    backend.runner.pipeline, backend.runner.llc_bytes = True, 64 << 10  # the larger ring runs pipelined, as test_native
    report = []
    for index, (algorithm, dtype_name, op, count) in enumerate(CASES):
        backend.algorithm, dtype = algorithm, C.resolve_dtype(dtype_name)
        send, recv = backend.alloc(count, dtype), backend.alloc(count, dtype)
        backend.gather_objects(None)
        mine = _inputs(index, rank, dtype_name, count).astype(dtype.host)
        backend.upload(send, mine, rank)
        direct = backend.executor_reading(backend.schedule("allreduce", count, dtype.itemsize, 0), recv, send, op)
        call = backend.prepare("allreduce", send, recv, op, 0, False)
        for turn in range(2):
            backend.fill(recv, np.nan if dtype.is_float else -7)  # whatever a copy would overwrite
            backend.barrier()
            call()
            got = backend.download(recv, 0, count, rank)
            inputs = [_inputs(index, r, dtype_name, count).astype(dtype.host) for r in range(world)]
            want = run(backend._last, inputs, op)[rank]
            report.append((index, turn, direct is not None, want.tobytes() == got.tobytes(),
                           backend.download(send, 0, count, rank).tobytes() == mine.tobytes()))
        backend.barrier()
        backend.end_point()
    end_rank(backend, queue, rank, report)


@pytest.mark.parametrize("executor", ["native", "python"])
@pytest.mark.parametrize("world", [2, 3])
def test_out_of_place_reads_the_inputs_and_computes_the_collective(executor, world, clean_shm):  # noqa: F811
    from commbench.backends.shm import native as shm_native

    if executor == "native":
        try:
            shm_native.load()
        except shm_native.NativeUnavailable as exc:
            pytest.skip(f"the native executor does not build here: {exc}")
    reports = spawn_ranks(_rank, world, executor)
    for rank, report in reports.items():
        for index, turn, direct, right, input_kept in report:
            case = CASES[index]
            assert right, f"rank {rank}, {case}, call {turn}: not the interpreter's result"
            assert input_kept, f"rank {rank}, {case}: the input was written"
            assert direct == (case[0] != "oneshot"), f"{case}: reads its input directly: {direct}"


def test_which_schedules_can_read_their_input():
    two, three = Topology(1, 2), Topology(1, 3)
    ring = A.build("allreduce", "ring", two, 10, 40)
    reads = input_reads(ring)
    assert reads is not None and all(flags == (True, True) for flags in reads[0].values())  # both read inputs
    assert all(flags == (False, False) for flags in reads[1].values())  # the all-gather copies results
    assert input_reads(pipelined(A.build("allreduce", "ring", three, 30, 120), 3)) is not None
    assert input_reads(A.build("allreduce", "oneshot", three, 30, 120)) is None  # a hazard round
    assert input_reads(A.build("allreduce", "ring", Topology(1, 1), 30, 120)) is None  # nothing written: copy
