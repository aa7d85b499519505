"""shm's native executor (commbench/backends/shm/shm_native.c): the same results as the Python executor,
bit for bit, for every schedule, dtype and op it runs; the fallback to Python where it cannot be
built; and $COMMBENCH_SHM_EXECUTOR's choices. Speed: benchmarks/shm_vs_peers.py (shm:shmpy)."""
import ctypes
import multiprocessing
import os

import numpy as np
import pytest
from conftest import clean_env, commbench, results_of

from commbench.backends.shm import native as shm_native

try:
    LIBRARY = shm_native.load()
except shm_native.NativeUnavailable as exc:  # no compiler here: the fallback tests still run
    LIBRARY, WHY = None, str(exc)
needs_native = pytest.mark.skipif(LIBRARY is None, reason="the native executor does not build here")

CASES = [  # (collective, algorithm, dtype, op, elements per rank)
    ("allreduce", "oneshot", "float32", "sum", 256),
    ("allreduce", "ring", "float32", "sum", 1000),
    ("allreduce", "tree", "float64", "sum", 777),
    ("allreduce", "rhd", "float32", "prod", 96),
    ("allreduce", "binomial", "float64", "max", 64),
    ("allreduce", "ring", "int8", "sum", 300),  # wraps, as NumPy's does
    ("allreduce", "oneshot", "uint8", "prod", 129),
    ("allreduce", "ring", "int32", "min", 512),
    ("allreduce", "oneshot", "int64", "prod", 40),
    ("allreduce", "ring", "float32", "avg", 4096),
    ("allreduce", "oneshot", "bfloat16", "sum", 64),  # the Python kernels under either executor
    ("reduce_scatter", "ring", "float32", "sum", 600),
    ("allreduce", "ring", "float32", "sum", 20000),  # past the (test's) LLC: pipelined into slices
    ("reduce_scatter", "ring", "float64", "sum", 9000),
    ("allgather", "ring", "float64", "sum", 300),
    ("broadcast", "chain", "int32", "sum", 100),
    ("reduce", "chain", "float32", "max", 100),
]


def _inputs(case_index: int, rank: int, dtype: str, count: int, call: int) -> np.ndarray:
    rng = np.random.default_rng([case_index, rank, call])
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, endpoint=True, dtype=dtype)
    values = rng.standard_normal(count) * 1e3
    if case_index == 4 and rank == 1:  # a NaN on one rank: max propagates it, as np.maximum does
        values[3] = np.nan
    return values


def _rank(rank: int, world: int, port: int, executor: str, folder: str) -> None:
    os.environ[shm_native.EXECUTOR_VAR] = executor
    from commbench import collectives as C
    from commbench.backends.shm.backend import ShmBackend
    from commbench.launchers import LaunchInfo
    from commbench.schedule import run
    from commbench.topology import Topology

    backend = ShmBackend(LaunchInfo.local(rank, world, port), Topology(1, world), "auto", 60)
    backend.runner.pipeline, backend.runner.llc_bytes = True, 64 << 10  # a small "cache": larger rings pipelined
    outputs = {"executor": np.array(backend.executor_name)}
    sliced, wrong = [], []
    for index, (collective, algorithm, dtype_name, op, count) in enumerate(CASES):
        backend.algorithm, dtype = algorithm, C.resolve_dtype(dtype_name)
        parts = collective in ("reduce_scatter", "allgather")  # in place, as the harness lays them out
        whole = backend.alloc(count * (world if parts else 1), dtype)
        backend.gather_objects(None)  # every rank's segment exists before a peer maps it
        part = backend.view(whole, rank * count, count) if parts else whole
        send, recv = (part, whole) if collective == "allgather" else (whole, part)
        call = backend.prepare(collective, send, recv, op, 0, True)
        sliced.append(backend.runner.pipeline_slices(backend._last, dtype.itemsize))
        for turn in range(3):  # three calls in a row: the epochs carry over from call to call
            backend.upload(send, _inputs(index, rank, dtype_name, backend.length(send), turn), rank)
            call()
            outputs[f"{index}_{turn}"] = backend.download(whole, 0, backend.length(whole), rank)
            if collective == "allreduce" and op != "avg" and dtype_name != "bfloat16":
                store = np.dtype(dtype.host)
                inputs = [_inputs(index, r, dtype_name, count, turn).astype(store) for r in range(world)]
                want = run(backend._last, inputs, op)[rank]  # the reference interpreter, same operand order
                if want.tobytes() != outputs[f"{index}_{turn}"].tobytes():
                    wrong.append(index)
        backend.barrier()
        backend.end_point()
    outputs["sliced"], outputs["wrong"] = np.array(sliced), np.array(wrong, dtype=np.int64)
    np.savez(os.path.join(folder, f"{executor}_{rank}.npz"), **outputs)
    backend.gather_objects(None)  # every rank is done before any tears its process group down
    backend.close()
    os._exit(0)  # as commbench's rank entry ends (job.py): torch's threads torn down at exit may abort


def _run(executor: str, world: int, folder: str) -> None:
    from commbench.launch import free_port

    context, port = multiprocessing.get_context("spawn"), free_port()
    procs = [context.Process(target=_rank, args=(rank, world, port, executor, folder)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=240)
    assert all(proc.exitcode == 0 for proc in procs), [proc.exitcode for proc in procs]


@needs_native
@pytest.mark.parametrize("world", [2, 3])
def test_native_and_python_executors_agree_bit_for_bit(tmp_path, clean_shm, world):  # noqa: F811
    _run("python", world, str(tmp_path))
    _run("native", world, str(tmp_path))
    for rank in range(world):
        python, native = np.load(tmp_path / f"python_{rank}.npz"), np.load(tmp_path / f"native_{rank}.npz")
        assert str(python["executor"]) == "python" and str(native["executor"]) == "native"
        assert (python["sliced"] > 1).sum() == 2, python["sliced"]  # the two large rings ran pipelined
        for name, got in (("python", python), ("native", native)):  # both as the interpreter, pushes and all
            assert not got["wrong"].size, f"{name}, rank {rank}: {[CASES[i] for i in got['wrong']]}"
        for key in python.files:
            if key in ("executor", "sliced", "wrong"):
                continue
            assert python[key].tobytes() == native[key].tobytes(), f"rank {rank}, case {CASES[int(key.split('_')[0])]}"
        moved = [k for k in python.files if k.endswith("_0")]
        assert len(moved) == len(CASES)


@needs_native
@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint8", "int32", "int64"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_native_kernels_match_numpy(dtype, op):
    """Each kernel on its own (no barrier in the plan), against NumPy's ufunc, with edge values."""
    rng = np.random.default_rng(7)
    count = 1031  # not a multiple of any vector width: the tails run too
    if np.dtype(dtype).kind == "f":
        a, b = rng.standard_normal(count).astype(dtype), rng.standard_normal(count).astype(dtype)
        a[:4], b[:4] = [np.nan, 1.0, np.inf, -np.inf], [2.0, np.nan, -np.inf, 3.0]
        a[4:8], b[4:8] = [-0.0, 0.0, -0.0, 0.0], [0.0, -0.0, -0.0, 0.0]  # equal: NumPy gives the second
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, count, endpoint=True, dtype=dtype)
        b = rng.integers(info.min, info.max, count, endpoint=True, dtype=dtype)
        a[:2], b[:2] = info.max, [info.max, info.min]  # sum and product wrap
    with np.errstate(all="ignore"):
        expected = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op](a, b)
    out, copied = np.empty_like(a), np.empty_like(a)
    executor = shm_native.NativeExecutor(LIBRARY, 0, 0, 0, 0, [], 1, 1)
    ops = executor.ops([("reduce", out, a, b), ("copy", copied, a)], op)
    assert executor.run(ctypes.addressof(ops), 2, 0, 0, executor.address) == -1
    assert out.tobytes() == expected.tobytes()
    assert copied.tobytes() == a.tobytes()


@needs_native
def test_large_copies_stream_and_stay_exact():
    """Copies from nt_bytes on use non-temporal stores: head, body and tail land exactly."""
    source = np.random.default_rng(1).integers(0, 255, (1 << 20) + 77, dtype=np.uint8)
    for shift in (0, 5):  # an unaligned start: the head before the first 32-byte line
        src, dst = source[shift:], np.zeros(len(source) - shift, dtype=np.uint8)
        executor = shm_native.NativeExecutor(LIBRARY, 0, 0, 0, 0, [], 1, 1)
        executor.context.nt_bytes = 4096
        ops = executor.ops([("copy", dst, src)], "sum", stream=True)
        executor.run(ctypes.addressof(ops), 1, 0, 0, executor.address)
        assert dst.tobytes() == src.tobytes()


@needs_native
@pytest.mark.parametrize("shift,tail", [(0, 0), (1, 5), (1, 3), (3, 1), (7, 2000)])
def test_a_fused_reduce_and_push_lands_exactly(shift, tail):
    """reduce then push of its result, fused into one op (out2), streaming: every block, the last one
    shorter than the head to the first 32-byte line included, lands in both outputs and nowhere else."""
    count = 2048 * 33 + tail  # 33 blocks of 8 KiB, then `tail` elements
    rng = np.random.default_rng(shift)
    a, b = (rng.standard_normal(count + 16).astype(np.float32) for _ in range(2))
    out, out2 = np.full(count + 16, -1.0, dtype=np.float32), np.full(count + 16, -2.0, dtype=np.float32)
    ours, theirs = out[shift:shift + count], out2[shift:shift + count]
    want = a[shift:shift + count] + b[shift:shift + count]
    executor = shm_native.NativeExecutor(LIBRARY, 0, 0, 0, 0, [], 1, 1)
    executor.context.nt_bytes = 0
    ops = executor.ops([("reduce", ours, a[shift:shift + count], b[shift:shift + count]), ("push", theirs, ours)],
                       "sum", stream=True)
    assert ops[0].out2 and ops[1].kind == shm_native.OP_SKIP  # fused
    assert executor.run(ctypes.addressof(ops), 2, 0, 0, executor.address) == -1
    assert ours.tobytes() == want.tobytes() and theirs.tobytes() == want.tobytes()
    assert (out[:shift] == -1).all() and (out[shift + count:] == -1).all()  # nothing written outside the chunk
    assert (out2[:shift] == -2).all() and (out2[shift + count:] == -2).all()


def test_without_a_compiler_auto_falls_back_to_python_with_a_note(tmp_path, clean_shm):  # noqa: F811
    env = clean_env(CC="/nonexistent", COMMBENCH_CACHE_DIR=str(tmp_path / "cache"))
    proc = commbench("sweep", "--backend", "shm", "-N", "2", "--sizes", "1K,64K", "--iters", "5", "--warmup", "1",
                     "--json", str(tmp_path / "r.jsonl"), env=env)
    assert proc.returncode == 0, proc.stderr
    assert "executor python" in proc.stdout
    assert "native fast path is unavailable here: no C compiler" in proc.stdout
    results, _ = results_of(tmp_path / "r.jsonl")
    assert results and all(r["wrong"] == 0 for r in results)


def test_native_requested_without_a_compiler_is_one_line(tmp_path, clean_shm):  # noqa: F811
    env = clean_env(CC="/nonexistent", COMMBENCH_CACHE_DIR=str(tmp_path / "cache"), COMMBENCH_SHM_EXECUTOR="native")
    proc = commbench("sweep", "--backend", "shm", "-N", "2", "--sizes", "1K", "--iters", "2", env=env)
    assert proc.returncode != 0
    assert "COMMBENCH_SHM_EXECUTOR=native: no C compiler" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bad_executor_value_is_one_line_exit_2():
    proc = commbench("sweep", "--backend", "shm", "-N", "2", "--sizes", "1K",
                     env=clean_env(COMMBENCH_SHM_EXECUTOR="fast"))
    assert proc.returncode == 2
    assert "COMMBENCH_SHM_EXECUTOR='fast': expected one of auto, native, python" in proc.stderr
    assert "Traceback" not in proc.stderr


@needs_native
def test_native_sweep_checks_and_says_so(tmp_path, clean_shm):  # noqa: F811
    proc = commbench("sweep", "--backend", "shm", "-N", "3", "--sizes", "1K,256K", "-c", "allreduce",
                     "-c", "reduce_scatter", "--op", "max", "--iters", "5", "--warmup", "1",
                     "--json", str(tmp_path / "r.jsonl"), env=clean_env(COMMBENCH_SHM_EXECUTOR="native"))
    assert proc.returncode == 0, proc.stderr
    assert "executor native" in proc.stdout
    results, _ = results_of(tmp_path / "r.jsonl")
    assert len(results) == 8 and all(r["wrong"] == 0 for r in results)  # 2 collectives x 2 sizes x 2 placements


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reduce_scatter"])
@pytest.mark.parametrize("world", [2, 3, 5])
def test_pipelined_ring_still_computes_the_collective(collective, world):
    from commbench import algorithms
    from commbench.schedule import pipelined, verify
    from commbench.topology import Topology

    for count, slices in ((1000, 4), (4097, 7), (10, 3)):  # 10 elements in 3x5 slices: empty slices too
        ring = algorithms.build(collective, "ring", Topology(1, world), count, count * 4)
        wave = pipelined(ring, slices)
        verify(wave)
        assert wave.steps == ring.steps + slices - 1


def test_pipelining_a_schedule_that_changes_its_chunks_is_caught():
    """rhd halves its chunks from step to step: a slice's next step is not its own, and verify says so."""
    from commbench import algorithms
    from commbench.schedule import ScheduleError, pipelined, verify
    from commbench.topology import Topology

    with pytest.raises(ScheduleError):
        verify(pipelined(algorithms.build("allreduce", "rhd", Topology(1, 4), 1000, 4000), 3))


@needs_native
def test_the_spin_grows_after_short_blocked_waits_and_shrinks_after_long_ones():
    """A blocked wait that would have fit in the spin budget doubles the spin; a longer one halves it."""
    executor = shm_native.NativeExecutor(LIBRARY, 0, 0, 0, 0, [], 20000, 50)  # budget 2 ms, floor 5 us
    context = executor.context
    context.spin_ns = 5_000
    executor.blocked(50e-6)  # 55 us in all: a 10 us spin would not have caught it, a 2 ms one would
    assert context.spin_ns == 10_000
    for _ in range(20):
        executor.blocked(50e-6)
    assert context.spin_ns == context.spin_budget_ns == 2_000_000
    executor.blocked(5e-3)  # the peer was away for longer than any spin: give the core up sooner
    assert context.spin_ns == 1_000_000
    for _ in range(20):
        executor.blocked(5e-3)
    assert context.spin_ns == context.spin_floor_ns == 5_000


@needs_native
def test_a_cache_folder_anyone_may_write_is_not_used(tmp_path):
    """A library another user could have planted is neither loaded nor built there (one line instead)."""
    cache = tmp_path / "cache"
    built = shm_native.build(cache)
    assert shm_native.build(cache) == built  # this user's own build is reused
    built.parent.chmod(0o777)
    with pytest.raises(shm_native.NativeUnavailable, match="anyone may write it"):
        shm_native.build(cache)


@needs_native
@pytest.mark.parametrize("block,nt,nt_in_place,prefetch", [
    (64, "none", "both", 0), (512, "out", "push", 64), (1024, "push", "out", 4096), (65536, "both", "none", 1 << 20),
    (4096, "none", "none", 1024)])
def test_every_planned_knob_lands_exactly(block, nt, nt_in_place, prefetch):
    """The planner's knobs (block, which outputs stream, prefetch) change how the fused op runs, never what it
    writes: both outputs exact, nothing outside the chunk, in place and out of place."""
    from commbench.backends.shm.plan import Plan

    count, shift = 2048 * 40 + 3, 3
    rng = np.random.default_rng(block)
    a, b = (rng.standard_normal(count + 16).astype(np.float32) for _ in range(2))
    want = a[shift:shift + count] + b[shift:shift + count]
    for in_place in (True, False):
        out = a.copy() if in_place else np.full(count + 16, -1.0, dtype=np.float32)
        out2 = np.full(count + 16, -2.0, dtype=np.float32)
        source = out if in_place else a
        executor = shm_native.NativeExecutor(LIBRARY, 0, 0, 0, 0, [], 1, 1)
        executor.context.nt_bytes = 0
        executor.tune(Plan(block, nt, nt_in_place, prefetch).context_values())
        ops = executor.ops([("reduce", out[shift:shift + count], source[shift:shift + count], b[shift:shift + count]),
                            ("push", out2[shift:shift + count], out[shift:shift + count])], "sum", stream=True)
        assert ops[0].out2 and executor.run(ctypes.addressof(ops), 2, 0, 0, executor.address) == -1
        assert out[shift:shift + count].tobytes() == want.tobytes() == out2[shift:shift + count].tobytes()
        assert (out2[:shift] == -2).all() and (out2[shift + count:] == -2).all()
        if not in_place:
            assert (out[:shift] == -1).all() and (out[shift + count:] == -1).all()
