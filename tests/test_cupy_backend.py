"""--backend cupy (NCCL through CuPy) on GPUs: every collective through the harness's check,
under a CUDA graph, and the same NCCL through torch within 5% at >= 1 MiB. Without a GPU
these skip; the no-GPU message is tested in test_cuda_backend.py (for both backends)."""
import pytest

from commbench.backends import BackendError
from commbench.backends.cupy_nccl import NCCL_DTYPES, NCCL_OPS
from commbench.backends.gpu import require_gpu
from commbench.collectives import DTYPES, OPS
from conftest import commbench, results_of


def gpu_count() -> int:
    try:
        return require_gpu("cupy")
    except BackendError:
        return 0


GPUS = gpu_count()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device and CuPy")
QUICK = ["--iters", "3", "--warmup", "1"]


def test_every_dtype_and_op_has_an_nccl_name():
    """No GPU needed: the tables cover what commbench sweeps, and name real cupy.cuda.nccl constants."""
    assert set(NCCL_DTYPES) == set(DTYPES) and set(NCCL_OPS) == set(OPS)
    nccl = pytest.importorskip("cupy.cuda.nccl", exc_type=ImportError)
    assert all(isinstance(getattr(nccl, name), int) for name in [*NCCL_DTYPES.values(), *NCCL_OPS.values()])


def _sweep(tmp_path, name, backend, *args, timeout=900):
    path = tmp_path / f"{name}.jsonl"
    proc = commbench("sweep", "--backend", backend, "-N", str(GPUS), *args, "--json", str(path), timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    results, records = results_of(path)
    assert results and all(r["wrong"] == 0 for r in results), proc.stdout
    return results, records


@needs_gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_collective_passes_the_check(tmp_path, dtype):
    collectives = "allreduce,allgather,reduce_scatter,broadcast,reduce,alltoall" + (",sendrecv" if GPUS > 1 else "")
    for op in ("sum", "prod", "max", "min", "avg"):
        results, records = _sweep(tmp_path, op, "cupy", *QUICK, "-c", collectives, "--sizes", "1K,1048592",
                                  "--dtype", dtype, "--op", op)
        assert records[0]["library"] == "nccl" and {r["device"] for r in results} == {"cuda"}


@needs_gpu
def test_graph_replay(tmp_path):
    results, _ = _sweep(tmp_path, "graph", "cupy", *QUICK, "--graph", "-c", "allreduce,allgather", "--sizes", "1K,16M")
    assert all(r["p50_us"] == pytest.approx(r["p99_us"]) for r in results)


@needs_gpu
def test_nccl_through_cupy_and_through_torch_agree_within_5_percent(tmp_path):
    """The issue's check: the same library on the same GPUs, two drivers; busbw at >= 1 MiB."""
    args = ["--sizes", "1M-256M", "--factor", "4", "--placement", "in-place", "--min-time", "1"]
    cupy_results, _ = _sweep(tmp_path, "cupy", "cupy", *args)
    torch_results, _ = _sweep(tmp_path, "torch", "torch", "--device", "cuda", *args)
    torch_by_size = {r["nbytes"]: r["busbw_gbps"] for r in torch_results}
    for r in cupy_results:
        ratio = r["busbw_gbps"] / torch_by_size[r["nbytes"]]
        print(f"{r['nbytes'] >> 20} MiB: cupy {r['busbw_gbps']:.1f} GB/s, torch {torch_by_size[r['nbytes']]:.1f} GB/s")
        assert 0.95 <= ratio <= 1.05, f"{r['nbytes']} B: cupy/torch busbw {ratio:.3f}"
