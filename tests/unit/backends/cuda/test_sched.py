"""--backend cuda: one clear line where there is no GPU (CI); on a GPU, every kernel against
CuPy's own arithmetic for every dtype and op, every schedule through the harness's check in
the three pointer modes. The speed targets (reduce-copy against a device copy, virtual-rank
busbw) are checked by benchmarks/gpu_bandwidth.py, not by timed tests.

The GPU tests skip themselves without a CUDA device; a session with a GPU runs
`python -m pytest -q tests/unit/backends/cuda/test_sched.py tests/unit/backends/cuda/test_nccl.py`, then
`python benchmarks/gpu_bandwidth.py`.
"""
import subprocess
import sys

import pytest
from conftest import commbench, gpu_count, results_of

from commbench.backends import BackendConfig
from commbench.bench import run_sweep
from commbench.cli import main
from commbench.errors import EXIT_USAGE
from commbench.launchers import LaunchInfo
from commbench.sweep_config import SweepConfig

GPUS = gpu_count("cuda")
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device and CuPy")
needs_2_gpus = pytest.mark.skipif(GPUS < 2, reason="needs two CUDA devices")
no_gpu = pytest.mark.skipif(GPUS > 0, reason="checks the message a machine without a GPU prints")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int8", "uint8", "int64")
OPS = ("sum", "prod", "max", "min")
QUICK = ["--iters", "3", "--warmup", "1"]


# ---------------------------------------------------------------- without a GPU


@no_gpu
@pytest.mark.parametrize("backend", ["cuda", "cupy"])
@pytest.mark.parametrize("extra", [[], ["--cuda-mode", "virtual"], ["-N", "4", "--graph"]])
def test_no_gpu_is_one_line_with_the_install_hint(capsys, backend, extra):
    if backend == "cupy" and "--cuda-mode" in extra:
        extra = []
    code = main(["sweep", "--backend", backend, *extra])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"--backend {backend}" in err and ("no CUDA device" in err or "CuPy" in err)
    assert "pip install 'commbench[gpu]'" in err and "Traceback" not in err


@no_gpu
def test_without_cupy_the_line_says_so(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy now raises ImportError
    code = main(["sweep", "--backend", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "needs CuPy, which is not installed: pip install 'commbench[gpu]'" in err


@no_gpu
def test_console_script_without_gpu_exits_2_without_traceback():
    proc = commbench("sweep", "--backend", "cuda", "-N", "4", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("commbench: error: --backend cuda")


@no_gpu
def test_library_path_without_gpu_is_a_usage_error(capsys):
    """A spawned rank (or a library user) reaches the backend itself: same one line, exit 2."""
    code = run_sweep(SweepConfig(backend=BackendConfig(backend="cuda", nprocs=2, cuda_mode="virtual")),
                     LaunchInfo.local(0, 1, 0))
    err = capsys.readouterr().err
    assert code == EXIT_USAGE and err.count("\n") == 1 and ("no CUDA device" in err or "CuPy" in err), err


def test_gpu_modules_import_without_cupy():
    code = ("import sys; sys.modules['cupy'] = None; sys.modules['pynvml'] = None\n"
            "import commbench.backends.cuda.sched, commbench.backends.cuda.ipc, commbench.backends.cuda.nccl\n"
            "import commbench.telemetry, commbench.backends.cuda.device\n"
            "from commbench.backends import backend_class; backend_class('cuda'); backend_class('cupy'); print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.parametrize("args,needle", [
    (["--graph"], "--graph captures CUDA work"),
    (["--backend", "shm", "--graph"], "--graph captures CUDA work"),
    (["--cuda-mode", "peer"], "--cuda-mode only applies to --backend cuda"),
    (["--backend", "sim", "--graph"], "--graph captures CUDA work"),
    (["--backend", "torch", "--cuda-mode", "ipc"], "--cuda-mode only applies to --backend cuda"),
])
def test_gpu_options_on_other_backends_are_usage_errors(capsys, args, needle):
    code = main(["sweep", *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_twoshot_is_an_algorithm_of_cuda_only(capsys):
    assert main(["sweep", "--backend", "shm", "--algorithm", "twoshot"]) == 2
    assert "no algorithm 'twoshot' for allreduce" in capsys.readouterr().err


# ---------------------------------------------------------------- on a GPU: kernels against CuPy


@needs_gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_copy_matches_cupy(dtype, op):
    """Aligned, all pointers one element off a 16-byte boundary, and each pointer off by a
    different amount (a[1:], b[2:], out[3:]: the scalar path); guard elements before and
    after the output range must be left alone. The check is checks.check_reduce_copy,
    which tests/unit/backends/cuda/test_host.py runs on the CPU build of the same kernels."""
    from commbench.backends.cuda.checks import GpuDevice, check_reduce_copy
    from commbench.collectives import DTYPES as ALL

    counts = [nbytes // ALL[dtype].itemsize for nbytes in (1 << 10, (1 << 20) + 48, 1 << 26)]
    failures = check_reduce_copy(GpuDevice(), dtype, op, counts)
    assert not failures, "\n".join(failures[:10])


@needs_gpu
def test_reduce_copy_1_gib():
    import cupy

    from commbench.backends.cuda.kernels import reduce_copy

    count = (1 << 30) // 4
    a, b = cupy.arange(count, dtype=cupy.float32), cupy.ones(count, dtype=cupy.float32)
    out = cupy.empty_like(a)
    reduce_copy(out, a, b, "float32", "sum")
    assert bool((out == a + b).all())


@needs_gpu
@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_oneshot_and_twoshot_kernels_match_cupy(dtype, world):
    """Virtual ranks on one GPU: every rank's buffer in one pointer table, one row per rank;
    one-shot into separate outputs, two-shot in place, guards around every output. Inputs
    are 1..3, so every dtype's sum and product over 8 ranks is exact
    (checks.check_allreduce_kernels, also run on the CPU build)."""
    from commbench.backends.cuda.checks import GpuDevice, check_allreduce_kernels

    device = GpuDevice()
    failures = [failure for count in (1000, (1 << 20) + 5) for op in ("sum", "max")
                for failure in check_allreduce_kernels(device, dtype, world, count, op, small=True)]
    assert not failures, "\n".join(failures[:10])


# ---------------------------------------------------------------- on a GPU: the backend through the harness


def _sweep_ok(tmp_path, *args, name="r", timeout=600):
    path = tmp_path / f"{name}.jsonl"
    proc = commbench("sweep", "--backend", "cuda", *QUICK, *args, "--json", str(path), timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    results, records = results_of(path)
    assert results and all(r["wrong"] == 0 and r["backend"] == "cuda" for r in results), proc.stdout
    return results, records


@needs_gpu
@pytest.mark.parametrize("algorithm", ["ring", "hier", "tree", "rhd", "oneshot", "binomial", "twoshot"])
def test_virtual_ranks_run_every_allreduce(tmp_path, algorithm):
    topology = ["--topology", "2x2"] if algorithm == "hier" else []
    results, _ = _sweep_ok(tmp_path, "--cuda-mode", "virtual", "-N", "4", "--algorithm", algorithm, *topology,
                           "--sizes", "1K,1000K,64M")
    assert {r["algorithm"] for r in results} == {algorithm} and {r["library"] for r in results} == {"cuda-virtual"}


@needs_gpu
@pytest.mark.parametrize("dtype,op", [(d, o) for d in DTYPES for o in ("sum", "prod", "max", "min")] +
                         [("float32", "avg"), ("bfloat16", "avg"), ("float16", "avg")])
def test_virtual_ranks_every_collective_dtype_and_op(tmp_path, dtype, op):
    _sweep_ok(tmp_path, "--cuda-mode", "virtual", "-N", "3",
              "-c", "allreduce,allgather,reduce_scatter,broadcast,reduce", "--sizes", "4K,3M",
              "--dtype", dtype, "--op", op)


@needs_gpu
def test_virtual_ranks_under_a_cuda_graph(tmp_path):
    """A graph replays the launches Python issues one by one eagerly: at 1 KiB (launch-bound)
    it must be faster per call, and never slower at 1 MiB; a per-call time that were the
    whole graph's, or included capture and upload, would fail this."""
    args = ["--cuda-mode", "virtual", "-N", "4", "--algorithm", "ring", "--sizes", "1K,1M"]
    graph, records = _sweep_ok(tmp_path, *args, "--graph", name="graph")
    eager, _ = _sweep_ok(tmp_path, *args, name="eager")
    eager_us = {(r["nbytes"], r["placement"]): r["time_us"] for r in eager}
    assert records[0]["config"]["graph"]
    for r in graph:
        bound = 1.0 if r["nbytes"] <= 1024 else 1.5
        assert r["iters"] == 3 and r["time_us"] < bound * eager_us[(r["nbytes"], r["placement"])], r


@needs_2_gpus
def test_peer_mode_across_gpus(tmp_path):
    results, _ = _sweep_ok(tmp_path, "--cuda-mode", "peer", "-N", "2", "-c", "all_reduce,allgather,reduce_scatter",
                           "--sizes", "1K,16M", "--dtype", "bfloat16")
    assert {r["library"] for r in results} == {"cuda-peer"}


@needs_2_gpus
@pytest.mark.parametrize("algorithm", ["ring", "oneshot", "twoshot"])
def test_ipc_mode_one_process_per_gpu(tmp_path, algorithm):
    results, _ = _sweep_ok(tmp_path, "--cuda-mode", "ipc", "-N", "2", "--algorithm", algorithm, "--sizes", "1K,16M")
    assert {r["library"] for r in results} == {"cuda-ipc"}


@needs_2_gpus
def test_ipc_mode_under_a_cuda_graph(tmp_path):
    _sweep_ok(tmp_path, "--cuda-mode", "ipc", "-N", "2", "--graph", "--sizes", "1K,1M")
