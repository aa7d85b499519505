"""The kernels in cuda/ executed on the CPU: their own bodies, built by the system C++
compiler with cuda/host_shim.h (commbench/backends/cuda/host.py), against NumPy.

Every kernel the backends launch (reduce-copy, one-shot, two-shot reduce-scatter and
all-gather, schedule rounds with k inputs, scale, rank_barrier) for every dtype and op,
at counts that reach each path of cb::reduce_span (nothing, one element, a pack minus
one, exact packs, UNROLL x pack x threads boundaries, odd tails), at element offsets
that force the scalar path, on grids of one block, many blocks and more threads than
elements; every load and 16-byte store must stay inside the buffers a launch was given.
Then what backends/cuda/plan.py computes for every schedule, and the cuda backend itself through the
harness (CuPy stood in for, the kernels real), end to end on 8 virtual ranks.

The library is compiled once per session (cached by a hash of the sources); the tests
skip, saying so, only where no C++ compiler exists. Checks are in
commbench/backends/cuda/checks.py, which the GPU tests run on hardware too.
"""
import bisect
import os
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from test_sched_fake_gpu import Heap, _clear_kernel_caches, fake_cupy
from test_sched_fake_gpu import run as run_fake_sweep

from commbench import algorithms as A
from commbench.backends.cuda import checks as C
from commbench.backends.cuda import host as H
from commbench.backends.cuda import kernels as K
from commbench.collectives import DTYPES
from commbench.topology import Topology

OPS = K.OPS
DTYPE_OPS = [(d, o) for d in DTYPES for o in OPS]
GRIDS = ((1, 512), (1, 32), (5, 32), (None, 512))  # (blocks, threads); None: the grid the backends compute


@pytest.fixture(scope="session")
def host_kernels():
    try:
        H.find_compiler()
    except H.HostBuildError as exc:
        pytest.skip(str(exc))
    return H.HostKernels(H.build())  # a compile error fails here, it does not skip


@pytest.fixture(scope="session")
def host(host_kernels):
    return C.HostDevice(host_kernels)


@pytest.fixture(autouse=True)
def quiet_numpy():
    with np.errstate(all="ignore"):  # the references overflow to inf as the kernels do
        yield


# ---------------------------------------------------------------- kernel by kernel


@pytest.mark.parametrize("dtype,op", DTYPE_OPS)
def test_reduce_copy(host, dtype, op):
    failures = []
    for blocks, threads in GRIDS:
        failures += C.check_reduce_copy(host, dtype, op, C.path_counts(dtype, threads, blocks or 1), blocks=blocks,
                                        threads=threads)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("dtype,op", DTYPE_OPS)
def test_oneshot_and_twoshot(host, dtype, op):
    """Worlds 2, 3, 8; every rank aligned, or each at its own offset (the scalar path); the
    backends' grid, one block, and more blocks than a small count has packs."""
    failures = []
    for world in (2, 3, 8):
        skewed = [r % 3 for r in range(world)]
        for count in (0, 1, 31, 4099):
            for offsets in (None, skewed):
                failures += C.check_allreduce_kernels(host, dtype, world, count, op, offsets=offsets)
        failures += C.check_allreduce_kernels(host, dtype, world, 4099, op, blocks=1)
        failures += C.check_allreduce_kernels(host, dtype, world, 100, op, blocks=7, threads=32)
    failures += C.check_allreduce_kernels(host, dtype, 8, 40_001, op)  # several blocks per row
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("dtype,op", DTYPE_OPS)
def test_schedule_round_with_k_inputs(host, dtype, op):
    failures = []
    for k in (1, 2, 3, 8):
        for count in (0, 1, 33, 5000):
            failures += C.check_round_inputs(host, dtype, op, k, count, [0] * (k + 1))
            failures += C.check_round_inputs(host, dtype, op, k, count, [i % 3 for i in range(k + 1)])
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_scale_every_16_bit_value(host, dtype):
    """Every bit pattern (NaN, inf, subnormals, both zeros) through float and back, rounded once."""
    values = np.arange(1 << 16, dtype=np.uint16)
    values = values.view(np.float16) if dtype == "float16" else values
    failures = [f for factor in (1.0, 1 / 3, 0.125, 3.0, 1e-5) for f in C.check_scale(host, dtype, values, factor)]
    assert not failures, failures


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scale_wide_floats(host, dtype):
    values = (np.random.default_rng(0).standard_normal(10_001) * 1e3).astype(dtype)
    failures = [f for count in (0, 1, 513, 10_001) for f in C.check_scale(host, dtype, values[:count], 1 / 3)]
    assert not failures, failures


# ---------------------------------------------------------------- schedules end to end

SCHEDULES = [(c, name) for c, table in A.TABLE.items() for name in table]


def _schedule(collective, name, count, world=8):
    topo = Topology(2, world // 2) if name == "hier" else Topology(1, world)
    return A.build(collective, name, topo, count, count * 4, root=world - 1)


@pytest.mark.parametrize("collective,name", SCHEDULES)
def test_every_schedule_on_8_virtual_ranks_equals_the_reference(host_kernels, collective, name):
    """plan.py's programs, tables and grids run by the kernels equal commbench.schedule.run,
    every dtype and op (avg: sum, then scale), one stream for all ranks; then one stream per
    rank and blocks in reverse, as peer and ipc modes run it."""
    schedule = _schedule(collective, name, 33_333)
    ops = ("sum", "prod", "max", "min", "avg") if collective not in ("allgather", "broadcast") else ("sum",)
    failures = []
    for dtype in DTYPES:
        for op in ops:
            if op != "avg" or DTYPES[dtype].is_float:
                failures += C.check_schedule(host_kernels, _schedule(collective, name, 4099), dtype, op)
    failures += C.check_schedule(host_kernels, schedule, "float32", "sum")
    failures += C.check_schedule(host_kernels, schedule, "bfloat16", "max", streams="per-rank", reverse=True)
    assert not failures, "\n".join(failures[:10])


def test_the_schedule_check_is_not_vacuous(host_kernels, monkeypatch):
    """A launch table that drops a block's worth of input makes the check fail."""
    from commbench.backends.cuda import plan as P

    pack = P.pack_round

    def short(tasks, address, itemsize, cfg):
        entries, inputs, grid = pack(tasks, address, itemsize, cfg)
        entries["count"][0] -= 1
        return entries, inputs, grid
    monkeypatch.setattr(P, "pack_round", short)
    assert C.check_schedule(host_kernels, _schedule("allreduce", "ring", 999), "float32", "sum")


# ---------------------------------------------------------------- the cuda backend through the harness


class HostHeap(Heap):
    """Device memory for test_sched_fake_gpu's stand-in CuPy, but at real host addresses (256-byte
    aligned NumPy buffers, kept sorted by address), so that the real kernels can run on it."""

    def alloc(self, nbytes):
        array = H.aligned(max(nbytes, 1), np.uint8)
        i = bisect.bisect(self.bases, array.ctypes.data)
        self.bases.insert(i, array.ctypes.data)
        self.buffers.insert(i, array)
        return array.ctypes.data


def _host_cupy(heap, kernels, gpus):
    """The fake CuPy of test_sched_fake_gpu, its RawModule handing out the host build's kernels."""
    cupy = fake_cupy(heap, gpus)

    class Kernel:
        def __init__(self, name):
            self.name, self.function = name, kernels.function(name)

        @property
        def kernel(self):
            heap.loaded.append((self.name, heap.device))
            return self

        def __call__(self, grid, block, args, stream=None):
            assert stream is None or stream.device == heap.device, f"{self.name}: a stream of another GPU"
            heap.run(lambda: self.function(grid, block, args))

    class RawModule:
        def __init__(self, code, options):
            pass

        @property
        def module(self):
            return self

        def get_function(self, name):
            return Kernel(name)
    cupy.RawModule = RawModule
    return cupy


@pytest.fixture
def host_gpus(host_kernels, monkeypatch):
    import torch.distributed  # noqa: F401 - imported with the real CuPy (torch probes cupyx on first import)

    _clear_kernel_caches()
    heap = HostHeap()
    monkeypatch.setitem(sys.modules, "cupy", _host_cupy(heap, host_kernels, gpus=4))
    yield heap
    _clear_kernel_caches()


@pytest.mark.parametrize("algorithm,dtype,op", [("auto", "float32", "sum"), ("ring", "bfloat16", "avg"),
                                                ("oneshot", "float16", "max"), ("twoshot", "int8", "prod"),
                                                ("rhd", "int64", "min"), ("tree", "uint8", "sum")])
def test_cuda_backend_on_8_virtual_ranks_passes_the_harness_check(host_gpus, tmp_path, algorithm, dtype, op):
    """--backend cuda itself (sched.py: buffers, tables, grids, arguments, staging, avg's
    scale) with the real kernels: the harness's verifiable data and its #wrong check."""
    results = run_fake_sweep(tmp_path, "virtual", 8, algorithm, dtype=dtype, op=op, sizes=(1000, 100_000))
    assert len(results) == 4 and {r["library"] for r in results} == {"cuda-virtual"}


def test_cuda_backend_peer_mode_every_collective(host_gpus, tmp_path):
    run_fake_sweep(tmp_path, "peer", 4, collectives=("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"),
        dtype="float16", op="sum", sizes=(1000, 40_000))


def test_the_gpu_tests_path_runs_here_on_a_numpy_cupy(host_kernels, monkeypatch):
    """checks.GpuDevice, what test_sched.py and `commbench selftest` run on a GPU
    (kernels.function and .reduce_copy included), driven by a CuPy that is NumPy with the
    host build behind RawModule: the GPU path's own Python runs in CI too."""
    cupy = types.ModuleType("cupy")
    cupy.__dict__.update({name: getattr(np, name) for name in dir(np) if not name.startswith("__")})

    class Device:
        def __init__(self, device=0):
            self.id = device

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class Kernel:
        def __init__(self, name):
            self.kernel, self._function = self, host_kernels.function(name)  # .kernel: loaded, as CuPy's

        def __call__(self, grid, block, args, stream=None):
            self._function(grid, block, args)

    class RawModule:
        module = property(lambda self: self)

        def __init__(self, code, options):
            pass

        def get_function(self, name):
            return Kernel(name)
    cupy.cuda, cupy.RawModule = types.SimpleNamespace(Device=Device), RawModule
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    _clear_kernel_caches()
    try:
        device = C.GpuDevice()
        failures = (C.check_reduce_copy(device, "float16", "sum", [1000, 4099])
                    + C.check_reduce_copy(device, "int8", "prod", [100], blocks=3, threads=32)
                    + C.check_allreduce_kernels(device, "bfloat16", 3, 1000, "max", small=True)
                    + C.check_round_inputs(device, "int64", "min", 3, 777, [0, 1, 2, 0]))
    finally:
        _clear_kernel_caches()
    assert not failures, failures


# ---------------------------------------------------------------- rank_barrier: a block's threads together


def _barrier_ranks(host_kernels, world):
    """One private copy of the library per rank (its own __shared__), flag arrays laid out as
    ipc.py lays them out: a slot per peer, the epoch, the error word."""
    ranks = [H.HostKernels(host_kernels.path, private=True) for _ in range(world)]
    flags = [H.aligned(world + 2, np.uint64) for _ in range(world)]
    for f in flags:
        f[...] = 0
    table = np.array([f.ctypes.data for f in flags], dtype=np.uint64)

    def launch(rank, timeout_s):
        base = flags[rank].ctypes.data  # the arguments ipc._barrier_launch passes
        args = (table, np.uint64(base), np.uint64(base + 8 * world), np.int32(rank), np.int32(world),
                np.uint64(int(timeout_s * 1e9)), np.uint64(base + 8 * (world + 1)))
        ranks[rank].function("rank_barrier")((1,), (max(32, -(-world // 32) * 32),), args)
    return flags, launch


def _error_word(flags, world):
    return int(flags[world:world + 2].view(np.int32)[2])


def test_rank_barrier_lets_every_rank_through_and_advances_the_epoch(host_kernels):
    world = 3
    flags, launch = _barrier_ranks(host_kernels, world)
    with ThreadPoolExecutor(world) as pool:
        for epoch in (1, 2, 3):
            list(pool.map(lambda r: launch(r, 30.0), range(world)))
            for f in flags:
                assert list(f[:world]) == [epoch] * world and f[world] == epoch and _error_word(f, world) == 0


def test_rank_barrier_gives_up_on_a_missing_rank_and_later_barriers_return_at_once(host_kernels):
    world = 3
    flags, launch = _barrier_ranks(host_kernels, world)
    with ThreadPoolExecutor(world) as pool:
        started = time.monotonic()
        list(pool.map(lambda r: launch(r, 0.3), range(world - 1)))  # rank 2 never arrives
        waited = time.monotonic() - started
    assert 0.3 <= waited < 20
    assert [_error_word(f, world) for f in flags[:2]] == [world, world]  # rank 2 missing, + 1
    epoch = int(flags[0][world])
    started = time.monotonic()
    launch(0, 30.0)
    assert time.monotonic() - started < 5 and int(flags[0][world]) == epoch  # returned before waiting


# ---------------------------------------------------------------- the launcher itself


def test_arguments_must_have_the_kernels_parameter_types(host_kernels):
    kernel = host_kernels.function("reduce_copy_float32_sum")
    data = H.aligned(16, np.float32)
    assert kernel.signature == "pppq"
    with pytest.raises(TypeError, match="argument 3 must be int64"):
        kernel((1,), (32,), (data, data, data, 16))  # a Python int: on a GPU, CuPy would pass other bytes
    with pytest.raises(TypeError, match="takes 4 arguments"):
        kernel((1,), (32,), (data, data))


def test_a_misaligned_address_or_a_stray_access_faults_in_one_line(host_kernels):
    """The checks behind every test above are live: a float pointer 2 bytes off (the GPU
    faults on it too), and a count larger than the buffers the launch was given."""
    kernel = host_kernels.function("reduce_copy_float32_sum")
    raw, a, out = H.aligned(80, np.uint8), H.aligned(64, np.float32), H.aligned(64, np.float32)
    a[...] = 1
    with pytest.raises(H.HostBuildError, match=r"^reduce_copy_float32_sum faulted on the host: misaligned address: "
                                               r"4 bytes at 0x[0-9a-f]+ \(block 0,0 thread 0\)$"):
        kernel((1,), (32,), (out, np.uint64(raw.ctypes.data + 2), a, np.int64(16)))
    with host_kernels.bounds([a[:32], out[:32]]), pytest.raises(H.HostBuildError, match="outside every allocation"):
        kernel((1,), (32,), (out, a, a, np.int64(64)))


def test_no_compiler_is_one_line(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-commbench")
    with pytest.raises(H.HostBuildError) as caught:
        H.build()
    message = str(caught.value)
    assert "\n" not in message and "no C++ compiler" in message and "no-such-compiler-commbench" in message


def test_a_compile_error_is_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo fake 1.0; exit 0; }\n"
                    "echo 'common.cuh:42:7: error: no member named uint5'; echo 'more'; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(H.HostBuildError, match=r"does not compile: common.cuh:42:7: error: no member named uint5$"):
        H.build(tmp_path / "cache")



def test_a_cache_folder_anyone_may_write_is_not_used(tmp_path):
    """A library another user could have planted in the cache is neither loaded nor built over (one line),
    as for the shm executor (backends/build_cache.py)."""
    target = tmp_path / "cache" / "host_build" / H._key(H.find_compiler(), H._units()) / H.LIBRARY
    target.parent.mkdir(parents=True)
    target.write_bytes(b"planted")
    target.parent.chmod(0o777)
    with pytest.raises(H.HostBuildError, match="anyone may write it"):
        H.build(tmp_path / "cache")

def test_the_cache_key_follows_the_sources(tmp_path, monkeypatch, host_kernels):
    """A second build is the cached library; a change to any kernel source is a new build."""
    started = time.monotonic()
    assert H.build() == host_kernels.path and time.monotonic() - started < 5
    copy = tmp_path / "cuda"
    copy.mkdir()
    for name in os.listdir(K.kernel_dir()):
        (copy / name).write_text((K.kernel_dir() / name).read_text())
    compiler, units = H.find_compiler(), H._units()
    before = H._key(compiler, units)
    (copy / "common.cuh").write_text((copy / "common.cuh").read_text() + "\n// changed\n")
    monkeypatch.setattr(K, "kernel_dir", lambda: copy)
    assert H._key(compiler, units) != before


def test_the_gpu_build_does_not_see_the_host_code(tmp_path):
    """Preprocessed as NVRTC gets it (kernels.source, no COMMBENCH_HOST_BUILD), no host
    line is left and the inline PTX is; with the macro, the reverse."""
    compiler = pytest.importorskip("shutil").which("g++") or pytest.skip("needs g++ to preprocess")
    for header in ("cuda_fp16.h", "cuda_bf16.h"):
        (tmp_path / header).write_text("")
    for file in K.KERNEL_FILES:
        (tmp_path / file).write_text(K.source(file))
        gpu = _preprocess(compiler, tmp_path / file, "-I", str(tmp_path))
        shim = str(K.kernel_dir() / H.SHIM)
        host = _preprocess(compiler, tmp_path / file, "-DCOMMBENCH_HOST_BUILD", "-include", shim)
        assert "cb_host" not in gpu and "host_shim" not in gpu
        if file == "schedule_round.cu":
            assert "ld.acquire.sys" in gpu and "ld.acquire.sys" not in host
            assert "using cb_host::load_acquire_sys" in host


def _preprocess(compiler, path, *flags):
    import subprocess

    out = subprocess.run([compiler, "-E", "-P", "-x", "c++", "-std=c++17", *flags, str(path)], capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout


def test_a_cache_folder_made_under_umask_000_is_still_usable(tmp_path):
    """Folders the build makes are never left writable by anyone, whatever the umask: under umask 000 the
    cache is still this user's own (before, the ownership check refused the folder it had just made)."""
    from commbench.backends.build_cache import build_folder, owned

    old = os.umask(0)
    try:
        target = tmp_path / "cache" / "kind" / "key" / "lib.so"
        assert build_folder(target) is None
    finally:
        os.umask(old)
    assert all(owned(folder) for folder in (target.parent, target.parent.parent, tmp_path / "cache"))
