"""The CUDA kernels in cuda/: where the sources are, how they are compiled, what they are called.

The .cu files live in cuda/ at the top of a source checkout and ship inside the
package as commbench/cuda/ (setup.py `package_dir`), so `kernel_dir()` looks in both.
At run time each file is compiled once per process by NVRTC through CuPy's
`RawModule` (which also caches the binary on disk, ~/.cupy/kernel_cache, keyed by the
source text and options) and loaded on every GPU when the cuda backend starts; each
kernel is looked up when a call is prepared, never inside a timed or captured region.
A compile error, or an NVRTC CuPy cannot load, is one BackendError line. Local
headers (common.cuh) are pasted into the source before compiling, so a change to a
header changes the cache key too. Kernels are extern "C", named <kernel>_<dtype>_<op> (cuda/common.cuh).

`compile_check` compiles a file to PTX without a GPU (nvcc, or NVRTC through
cupy_backends when nvcc is absent): the test that every kernel compiles for every
architecture the local nvcc offers from sm_70 (MIN_ARCH) up uses it on a CPU-only machine.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

KERNEL_FILES = ("reduce_copy.cu", "allreduce.cu", "schedule_round.cu")
OPS = ("sum", "prod", "max", "min")  # avg runs as sum, then scale_<dtype>
MIN_ARCH = 70  # rank_barrier's ld.acquire.sys / st.release.sys need sm_70 (Volta) or newer
_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$', re.MULTILINE)
NVRTC_HINT = ("pip install 'cupy-cuda12x[ctk]' (CuPy >= 14; cupy-cuda13x[ctk] on CUDA 13) or install a CUDA toolkit "
              "(docs/gpu.md)")


def kernel_dir() -> Path:
    """The folder holding the .cu files: commbench/cuda (installed) or cuda/ (checkout)."""
    here = Path(__file__).resolve().parents[2]  # the commbench package
    for candidate in (here / "cuda", here.parent / "cuda"):
        if (candidate / KERNEL_FILES[0]).is_file():
            return candidate
    raise FileNotFoundError(f"commbench's CUDA kernels are missing (looked in {here / 'cuda'} and "
                            f"{here.parent / 'cuda'}); reinstall commbench")


def kernel_paths() -> list[Path]:
    return sorted(kernel_dir().glob("*.cu"))


def source(file: str) -> str:
    """The file's text with every local #include "x.cuh" pasted in (once each)."""
    folder, seen = kernel_dir(), set()

    def paste(match: re.Match) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return _INCLUDE.sub(paste, (folder / name).read_text()).replace("#pragma once", "")
    return _INCLUDE.sub(paste, (folder / file).read_text())


def kernel_name(kernel: str, dtype: str, op: str | None = None) -> str:
    """reduce_copy_float32_sum, scale_bfloat16, schedule_round_int8_max, ..."""
    if op == "avg":
        op = "sum"
    return f"{kernel}_{dtype}_{op}" if op else f"{kernel}_{dtype}"


def allreduce_kernel_name(kernel: str, phase: int, dtype: str, op: str) -> str:
    """The allreduce.cu kernel of one launch: one-shot's, or two-shot's reduce-scatter (phase 0) or all-gather."""
    if kernel == "oneshot":
        return kernel_name("oneshot_allreduce", dtype, op)
    if phase == 0:
        return kernel_name("twoshot_reduce_scatter", dtype, op)
    return kernel_name("twoshot_allgather", dtype)


def cuda_include_dir() -> str | None:
    """Where cuda_fp16.h lives: the pip CUDA headers, $CUDA_HOME or $CUDA_PATH, /usr/local/cuda."""
    try:
        from cuda import pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        if found:
            return str(found)
    except Exception:  # noqa: BLE001 - cuda-pathfinder is optional (it comes with CuPy 14)
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cuda_fp16.h").is_file():
            return str(Path(root) / "include")
    return None


def nvrtc_options() -> tuple[str, ...]:
    include = cuda_include_dir()
    return ("-std=c++17",) + ((f"-I{include}",) if include else ())


# ---------------------------------------------------------------- at run time (CuPy, a GPU)


@functools.cache
def module(file: str) -> Any:
    """The cupy.RawModule of one kernel file, created once per process (CuPy compiles it on
    first use on a device: see `load`)."""
    import cupy

    return cupy.RawModule(code=source(file), options=nvrtc_options())


@functools.cache
def load(file: str, device: int) -> Any:
    """The RawModule of `file`, compiled (first use: NVRTC, or CuPy's disk cache) and loaded on
    `device` now. The cuda backend loads every file when it starts, so a compile failure
    (or no NVRTC) is one BackendError line before any point, never a traceback mid-sweep."""
    import cupy

    with cupy.cuda.Device(device):
        try:
            raw = module(file)
            raw.module  # noqa: B018 - the property compiles (once) and loads on the current device
        except Exception as exc:  # noqa: BLE001 - CompileException, or NVRTC that cannot be loaded
            error = _compile_error(file, exc)
            if error is exc:
                raise
            raise error from exc
    return raw


@functools.cache
def function(file: str, name: str, device: int) -> Any:
    """A kernel of `file`, loaded on `device` now, so that nothing compiles or loads inside a
    timed or captured region. CuPy's RawKernel launches on the device current at call time:
    call it inside `with cupy.cuda.Device(device)`, with a stream of that device."""
    import cupy

    raw = load(file, device)
    with cupy.cuda.Device(device):
        kernel = raw.get_function(name)
        kernel.kernel  # noqa: B018 - looks the function up in the module loaded on this device
    return kernel


def _compile_error(file: str, exc: BaseException) -> BaseException:
    """BackendError naming the first compiler error (CuPy's CompileException carries NVRTC's
    whole log and the source), or a missing NVRTC; any other error unchanged."""
    from commbench.backends.base import BackendError

    text = str(exc)
    if type(exc).__name__ == "CompileException":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        first = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "no log")
        return BackendError(f"cuda/{file} does not compile with NVRTC: {first}")
    if "nvrtc" in text.lower() and isinstance(exc, (OSError, RuntimeError, ImportError)):
        return BackendError(f"--backend cuda compiles its kernels with NVRTC, which CuPy cannot load "
                            f"({text.splitlines()[0]}): {NVRTC_HINT}")
    return exc


def reduce_copy(out: Any, a: Any, b: Any, dtype: str, op: str, stream: Any = None) -> None:
    """out = a op b on the current device (CuPy arrays of one dtype's storage, equal lengths):
    the kernel the GPU tests check against CuPy and time against a device-to-device copy."""
    import cupy
    import numpy as np

    from commbench.backends.cuda.plan import LaunchConfig

    cfg, count = LaunchConfig(), out.size
    packs = -(-count // cfg.pack_elements(out.itemsize))
    blocks = max(1, min(cfg.blocks_for(3 * count * out.itemsize), packs))
    kernel = function("reduce_copy.cu", kernel_name("reduce_copy", dtype, op), cupy.cuda.Device().id)
    kernel((blocks,), (cfg.threads,), (out, a, b, np.int64(count)), stream=stream)


# ---------------------------------------------------------------- without a GPU (tests)


def compile_check(path: Path, arch: str, compiler: str = "auto") -> tuple[bool, str, str]:
    """Compile one .cu file to PTX for sm_<arch>: (ok, compiler messages, PTX). compiler: nvcc,
    nvrtc, or auto (nvcc where it exists). FileNotFoundError when neither can run here."""
    if compiler == "nvcc" or (compiler == "auto" and shutil.which("nvcc")):
        return _nvcc_compile(path, arch)
    return _nvrtc_compile(path, arch)


def _nvcc_compile(path: Path, arch: str) -> tuple[bool, str, str]:
    with tempfile.TemporaryDirectory() as folder:
        ptx = Path(folder) / "out.ptx"
        out = subprocess.run(["nvcc", f"-arch=sm_{arch}", "-ptx", "-std=c++17", "-Werror", "all-warnings",
                              f"-I{path.parent}", str(path), "-o", str(ptx)],
                             capture_output=True, text=True, timeout=600, check=False)
        return out.returncode == 0, out.stdout + out.stderr, ptx.read_text() if ptx.exists() else ""


def _nvrtc_compile(path: Path, arch: str) -> tuple[bool, str, str]:
    """NVRTC, as RawModule compiles at run time, but without a GPU (cupy_backends' bindings)."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as exc:
        raise FileNotFoundError("neither nvcc nor CuPy's NVRTC is available") from exc
    try:
        program = nvrtc.createProgram(source(path.name), path.name, [], [])
    except Exception as exc:  # noqa: BLE001 - libnvrtc missing: nothing to compile with
        raise FileNotFoundError(f"NVRTC is not usable here: {exc}") from exc
    try:
        nvrtc.compileProgram(program, [f"-arch=compute_{arch}", *nvrtc_options()])
        return True, nvrtc.getProgramLog(program), nvrtc.getPTX(program).decode(errors="replace")
    except nvrtc.NVRTCError:
        return False, nvrtc.getProgramLog(program), ""
    finally:
        nvrtc.destroyProgram(program)


def require_arch(devices: list[int]) -> None:
    """The kernels need sm_70 or newer (rank_barrier's acquire/release loads and stores)."""
    import cupy

    from commbench.backends.base import BackendError

    for device in devices:
        arch = int(cupy.cuda.Device(device).compute_capability)
        if arch < MIN_ARCH:
            raise BackendError(f"--backend cuda needs a GPU of compute capability {MIN_ARCH / 10:.1f} or newer; "
                               f"GPU {device} is {arch / 10:.1f} (use --backend cupy or torch)")
