"""Every kernel in cuda/ compiles, without a GPU: nvcc -ptx (warnings are errors) for sm_70,
the minimum (rank_barrier's acquire/release PTX), sm_75 (CUDA 13's lowest) and sm_90, each where
the local nvcc targets it, and NVRTC (what CuPy compiles with at run time, for sm_80) where
CuPy's NVRTC bindings load. The PTX must export every kernel name the Python side launches.
The kernels hold no __CUDA_ARCH__ branch, so the targets between the lowest and sm_90 compile the
same source (sm_80 was dropped from the nvcc list for the suite's time: 9 compiles became 6)."""
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from commbench.backends.cuda import kernels as K
from commbench.backends.cuda.plan import ENTRY_DTYPE
from commbench.collectives import DTYPES

ARCHS = (str(K.MIN_ARCH), "75", "90")
FLOATS = ("float32", "float16", "bfloat16", "float64")


def _nvrtc_usable() -> bool:
    try:
        K._nvrtc_compile(K.kernel_dir() / "reduce_copy.cu", "80")
        return True
    except FileNotFoundError:
        return False


def _nvcc_archs() -> set[str]:
    out = subprocess.run(["nvcc", "--list-gpu-arch"], capture_output=True, text=True, timeout=60, check=False)
    return set(re.findall(r"compute_(\d+)", out.stdout))


@pytest.fixture(scope="module")
def nvcc_results():
    """Every (file, arch) the local nvcc targets, compiled two at a time (the suite runs on 2 cores)."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed (the NVRTC test still compiles every kernel)")
    targets = _nvcc_archs()
    jobs = [(path, arch) for path in K.kernel_paths() for arch in ARCHS if arch in targets]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda job: K.compile_check(job[0], job[1], "nvcc"), jobs))
    return {(path.name, arch): result for (path, arch), result in zip(jobs, results)}


def test_the_kernel_files_are_found():
    assert {p.name for p in K.kernel_paths()} == set(K.KERNEL_FILES)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("file", K.KERNEL_FILES)
def test_nvcc_compiles_every_kernel(nvcc_results, file, arch):
    if (file, arch) not in nvcc_results:
        pytest.skip(f"this nvcc does not target sm_{arch} (CUDA 13 dropped sm_70; CUDA 12 compiles it)")
    ok, log, ptx = nvcc_results[(file, arch)]
    assert ok, f"nvcc -arch=sm_{arch} {file}:\n{log}"
    assert f".target sm_{arch}" in ptx


def expected_kernels(file: str) -> set[str]:
    """The names commbench/backends launches from each file (kernels.kernel_name)."""
    name = K.kernel_name
    if file == "reduce_copy.cu":
        return {name("reduce_copy", d, o) for d in DTYPES for o in K.OPS} | {name("scale", d) for d in FLOATS}
    if file == "allreduce.cu":
        return ({name(k, d, o) for k in ("oneshot_allreduce", "twoshot_reduce_scatter") for d in DTYPES for o in K.OPS}
                | {name("twoshot_allgather", d) for d in DTYPES})
    return {name("schedule_round", d, o) for d in DTYPES for o in K.OPS} | {"rank_barrier"}


@pytest.mark.parametrize("file", K.KERNEL_FILES)
def test_ptx_exports_the_names_python_launches(nvcc_results, file):
    entries = set(re.findall(r"\.visible \.entry (\w+)\(", nvcc_results[(file, "90")][2]))
    assert entries == expected_kernels(file)


@pytest.mark.skipif(not _nvrtc_usable(), reason="CuPy's NVRTC bindings (cupy + nvidia-cuda-nvrtc) are not installed")
@pytest.mark.parametrize("file", K.KERNEL_FILES)
def test_nvrtc_compiles_what_cupy_would(file):
    ok, log, ptx = K.compile_check(K.kernel_dir() / file, "90", "nvrtc")
    assert ok, f"NVRTC {file}:\n{log}"
    assert set(re.findall(r"\.visible \.entry (\w+)\(", ptx)) == expected_kernels(file)


def test_a_compile_error_fails_the_check(tmp_path):
    """The check is not vacuous: a kernel with a type error does not compile."""
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void k(float* x) { x[0] = undefined_name; }\n')
    ok, log, _ = K.compile_check(broken, "90", "nvcc")
    assert not ok and "undefined_name" in log


def test_local_headers_are_pasted_into_the_runtime_source():
    """CuPy's disk cache keys on the source text: a header change must change it."""
    text = K.source("schedule_round.cu")
    assert '#include "common.cuh"' not in text and "reduce_span" in text and "#pragma once" not in text


def test_entry_table_layout_matches_the_kernel_struct():
    text = (K.kernel_dir() / "schedule_round.cu").read_text()
    body = re.search(r"struct RoundEntry \{(.*?)\};", text, re.S).group(1)
    fields = re.findall(r"^\s*(unsigned long long|long long|int) (\w+);", body, re.M)
    sizes = {"unsigned long long": 8, "long long": 8, "int": 4}
    assert [name for _, name in fields] == list(ENTRY_DTYPE.names)
    assert [sizes[c] for c, _ in fields] == [ENTRY_DTYPE.fields[n][0].itemsize for n in ENTRY_DTYPE.names]
    assert ENTRY_DTYPE.itemsize == 32


def test_kernels_are_found_in_an_installed_layout(tmp_path):
    """Installed, the .cu files sit in commbench/cuda/ beside the package's modules."""
    import importlib.util

    package = tmp_path / "commbench"
    installed = package / "backends" / "cuda" / "kernels.py"
    installed.parent.mkdir(parents=True)
    shutil.copy(K.__file__, installed)
    shutil.copytree(K.kernel_dir(), package / "cuda")
    spec = importlib.util.spec_from_file_location("installed_cuda_kernels", installed)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert Path(module.kernel_dir()) == package / "cuda"
