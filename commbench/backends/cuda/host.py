"""The kernels in cuda/ built for the CPU and run there: their own code, no GPU.

No GPU runs in CI, so the kernel bodies (index arithmetic, 16-byte pack paths and their
scalar fallbacks, tails, UNROLL bounds, paired fp16/bf16 lanes, op templates) are run
on the CPU instead: every .cu file is compiled by the system C++ compiler with
`-DCOMMBENCH_HOST_BUILD -include cuda/host_shim.h` (the shim supplies what the kernels
take from CUDA; the GPU build never sees it) into one shared library, loaded with
ctypes. A launch runs every (block, thread) of its grid (cuda/host_shim.h says how).

- `build()`: compile once into a cache folder keyed by a hash of the sources, the
  compiler and the flags ($COMMBENCH_CACHE_DIR, else $XDG_CACHE_HOME/commbench, else
  ~/.cache/commbench); no compiler is one HostBuildError line.
- `HostKernels`: the library's kernels, looked up by the names the backends launch and
  called as CuPy's RawKernel is, `kernel(grid, block, args)`, with NumPy arrays (their
  data pointers), NumPy scalars of exactly the kernel's parameter types, or addresses.
- `run_programs`: the launch steps plan computes for a schedule (the tables, grids
  and arguments the cuda backend passes), executed by these kernels on NumPy buffers.

Used by tests/unit/backends/cuda/test_host.py and `commbench selftest`; the checks against NumPy (and,
on a GPU, against CuPy) are in checks.py.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from commbench.backends.build_cache import build_folder, cache_root, cached
from commbench.backends.build_cache import find_compiler as find_compiler_of
from commbench.backends.cuda import kernels as K
from commbench.backends.cuda import plan as P
from commbench.collectives import DTYPES, DType

SHIM = "host_shim.h"
FLAGS = ("-std=c++17", "-O1", "-fPIC", "-pthread", "-fwrapv", "-fno-strict-aliasing", "-Wall", "-Wno-unknown-pragmas",
         "-DCOMMBENCH_HOST_BUILD")
LIBRARY = "libcommbench_kernels_host.so"
THREADED = frozenset({"rank_barrier"})  # kernels whose block's threads must run together (__syncthreads)
FLOATS = ("float32", "float16", "bfloat16", "float64")
COMPILER_HINT = "install one (apt-get install g++, or set $CXX)"


class HostBuildError(RuntimeError):
    """The host build cannot be made or a launch faulted; the message is one line."""


def kernel_names(file: str) -> list[str]:
    """Every kernel of `file` that commbench/backends launches (kernels.kernel_name)."""
    name, dtypes = K.kernel_name, list(DTYPES)
    if file == "reduce_copy.cu":
        return [name("reduce_copy", d, o) for d in dtypes for o in K.OPS] + [name("scale", d) for d in FLOATS]
    if file == "allreduce.cu":
        return ([name(k, d, o) for k in ("oneshot_allreduce", "twoshot_reduce_scatter") for d in dtypes for o in K.OPS]
                + [name("twoshot_allgather", d) for d in dtypes])
    if file == "schedule_round.cu":
        return [name("schedule_round", d, o) for d in dtypes for o in K.OPS] + ["rank_barrier"]
    raise ValueError(f"no kernel file {file}")


# ---------------------------------------------------------------- building


def find_compiler() -> str:
    """$CXX, else the first of g++, c++, clang++ on PATH; HostBuildError without one."""
    path, looked = find_compiler_of("CXX", ("g++", "c++", "clang++"))
    if path:
        return path
    raise HostBuildError(f"no C++ compiler for the host build of cuda/ (looked for {looked}): {COMPILER_HINT}")


def _units() -> dict[str, str]:
    """Translation unit name -> its text: each kernel file with its exports, and the runtime."""
    units = {Path(file).stem: f'#include "{file}"\n' + "".join(f"CB_HOST_EXPORT({n})\n" for n in kernel_names(file))
             for file in K.KERNEL_FILES}
    units["runtime"] = "#define CB_HOST_DEFINE_RUNTIME\n"  # the shim is -include'd first: define it by -D instead
    return units


def _key(compiler: str, units: dict[str, str]) -> str:
    folder, digest = K.kernel_dir(), hashlib.sha256()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    sources = [(folder / name).read_text() for name in sorted(os.listdir(folder))
               if name.endswith((".cu", ".cuh", ".h"))]
    for part in (compiler, version, " ".join(FLAGS), *sorted(units.items()), *sources):
        digest.update(repr(part).encode())
    return digest.hexdigest()[:16]


def build(cache_dir: Path | None = None) -> Path:
    """The shared library's path, compiled now unless the cache holds this exact build."""
    compiler, units = find_compiler(), _units()
    target = (cache_dir or cache_root()) / "host_build" / _key(compiler, units) / LIBRARY
    if cached(target):
        return target
    refused = build_folder(target)
    if refused:
        raise HostBuildError(refused)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        objects, procs = [], []
        for stem, text in units.items():
            source, obj = Path(work) / f"{stem}.cpp", Path(work) / f"{stem}.o"
            source.write_text(text)
            define = ["-DCB_HOST_DEFINE_RUNTIME"] if stem == "runtime" else []
            command = [compiler, *FLAGS, *define, "-include", str(K.kernel_dir() / SHIM), f"-I{K.kernel_dir()}",
                       "-c", str(source), "-o", str(obj)]
            procs.append((stem, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
            objects.append(str(obj))
        logs = [(stem, proc.communicate(timeout=600)[0], proc.returncode) for stem, proc in procs]  # all finish
        for stem, log, code in logs:
            if code != 0:
                first = next((line for line in log.splitlines() if "error" in line), log.strip()[:300])
                raise HostBuildError(f"the host build of cuda/{stem} does not compile: {first.strip()}")
        linked = Path(work) / LIBRARY
        out = subprocess.run([compiler, "-shared", "-pthread", *objects, "-o", str(linked)], capture_output=True,
                             text=True, timeout=600, check=False)
        if out.returncode != 0:
            raise HostBuildError(f"the host build of cuda/ does not link: {(out.stderr or out.stdout).strip()[:300]}")
        os.replace(linked, target)  # atomic: a concurrent build of the same key lands the same bytes
    return target


# ---------------------------------------------------------------- calling kernels

_SCALARS = {"i": (np.int32, ctypes.c_int32), "I": (np.uint32, ctypes.c_uint32), "q": (np.int64, ctypes.c_int64),
            "Q": (np.uint64, ctypes.c_uint64), "f": (np.float32, ctypes.c_float), "d": (np.float64, ctypes.c_double)}


class _Shape(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("threaded", ctypes.c_int),
                ("reverse", ctypes.c_int)]


def pointer(value: Any) -> int:
    """A device address as CuPy takes it: an array's data pointer, or an integer address."""
    if isinstance(value, np.ndarray):
        return value.ctypes.data
    if hasattr(value, "data") and hasattr(value.data, "ptr"):  # CuPy-like arrays (the tests' fake CuPy)
        return int(value.data.ptr)
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise TypeError(f"a pointer argument must be an array or an address, not {type(value).__name__}")


class HostKernel:
    """One kernel of the host build, called as cupy.RawKernel: kernel(grid, block, args)."""

    def __init__(self, library: ctypes.CDLL, name: str):
        self.name, self._library = name, library
        self._launch = getattr(library, f"cb_host_launch_{name}")
        self._launch.argtypes, self._launch.restype = [ctypes.POINTER(_Shape), ctypes.c_void_p], ctypes.c_int
        sig = getattr(library, f"cb_host_signature_{name}")
        sig.restype = ctypes.c_char_p
        self.signature = sig().decode()

    def _argument(self, letter: str, value: Any, index: int) -> ctypes._SimpleCData:
        if letter == "p":
            return ctypes.c_void_p(pointer(value))
        numpy_type, c_type = _SCALARS[letter]
        if not isinstance(value, numpy_type):  # on a GPU a wrong-width scalar is silently misread
            raise TypeError(f"{self.name}: argument {index} must be {numpy_type.__name__} (the kernel's parameter "
                            f"type, as CuPy passes it), not {type(value).__name__}")
        return c_type(value.item())

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], stream: Any = None,
                 reverse: bool = False) -> None:
        if len(args) != len(self.signature):
            raise TypeError(f"{self.name} takes {len(self.signature)} arguments ({self.signature}), got {len(args)}")
        values = [self._argument(letter, value, i) for i, (letter, value) in enumerate(zip(self.signature, args))]
        pointers = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                                             for v in values])
        pad = lambda dims: (list(dims) + [1, 1, 1])[:3]  # noqa: E731
        shape = _Shape((ctypes.c_uint * 3)(*pad(grid)), (ctypes.c_uint * 3)(*pad(block)), self.name in THREADED,
                       bool(reverse))
        if self._launch(ctypes.byref(shape), pointers) != 0:
            self._library.cb_host_last_error.restype = ctypes.c_char_p
            raise HostBuildError(f"{self.name} faulted on the host: {self._library.cb_host_last_error().decode()}")


class HostKernels:
    """The host build loaded once; `function(name)` as kernels.function on a GPU. Each
    instance with `private=True` loads its own copy (its own __shared__ statics): one per
    rank when several rank_barrier launches run at once."""

    def __init__(self, path: Path | None = None, private: bool = False):
        self.path, self._kernels = path or build(), {}
        if private:  # a copy under another name is another image; the file can go once it is mapped
            with tempfile.TemporaryDirectory(prefix="commbench-host-") as folder:
                self.library = ctypes.CDLL(shutil.copy(self.path, Path(folder) / LIBRARY))
        else:
            self.library = ctypes.CDLL(str(self.path))
        self.library.cb_host_set_bounds.argtypes = [ctypes.c_void_p, ctypes.c_int]

    def function(self, name: str) -> HostKernel:
        if name not in self._kernels:
            self._kernels[name] = HostKernel(self.library, name)
        return self._kernels[name]

    @contextmanager
    def bounds(self, arrays: Sequence[np.ndarray]) -> Iterator[None]:
        """Inside, every kernel load and store must fall inside one of `arrays` (else a fault)."""
        ranges = np.array([(a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays], dtype=np.uint64).reshape(-1)
        self.library.cb_host_set_bounds(ranges.ctypes.data, len(arrays))
        try:
            yield
        finally:
            self.library.cb_host_set_bounds(None, 0)


# ---------------------------------------------------------------- memory as cudaMalloc gives it


def aligned(count: int, dtype: Any, align: int = 256) -> np.ndarray:
    """An uninitialised array whose data starts on an `align`-byte boundary, as cudaMalloc's."""
    dtype = np.dtype(dtype)
    raw = np.empty(count * dtype.itemsize + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + count * dtype.itemsize].view(dtype)


# ---------------------------------------------------------------- plan programs on the host


def run_programs(kernels: HostKernels, programs: Sequence[Sequence[P.Step]],
                 buffers: dict[tuple[int, str], np.ndarray], dtype: DType, op: str, world: int,
                 cfg: P.LaunchConfig = P.LaunchConfig(), reverse: bool = False) -> None:
    """Run one program per stream (plan.program: one for every rank on one GPU, or one
    per rank as peer and ipc modes have) in lock step, so a barrier waits for every stream,
    on `buffers` ((rank, plan.WORK or STAGE) -> storage array), launching what
    sched launches, with the tables, grids and arguments it passes."""
    address = lambda ref: buffers[(ref.rank, ref.buffer)].ctypes.data + ref.offset * dtype.itemsize  # noqa: E731
    for index in range(len(programs[0])):
        for steps in reversed(programs) if reverse else programs:
            step = steps[index]
            if isinstance(step, P.RoundLaunch) and step.tasks:
                entries, inputs, grid = P.pack_round(step.tasks, address, dtype.itemsize, cfg)
                args = (entries.view(np.uint8), np.int32(len(entries)), inputs)
                kernels.function(K.kernel_name("schedule_round", dtype.name, op))((grid,), (cfg.threads,), args,
                                                                                  reverse=reverse)
            elif isinstance(step, P.AllreduceLaunch):
                blocks, rows = P.allreduce_grid(step, dtype.itemsize, world, cfg)
                table = lambda refs: np.array([address(r) for r in refs], dtype=np.uint64)  # noqa: E731
                args = (table(step.ins), table(step.outs), np.int32(world), np.int32(step.first_rank),
                        np.int64(step.count))
                name = K.allreduce_kernel_name(step.kernel, step.phase, dtype.name, op)  # the name sched launches
                kernels.function(name)((blocks, rows), (cfg.threads,), args, reverse=reverse)


def scale(kernels: HostKernels, data: np.ndarray, dtype: DType, factor: float, threads: int = 512) -> None:
    """data *= factor, launched as sched's CudaBackend.scale launches it (avg)."""
    cast = np.float64 if dtype.name == "float64" else np.float32
    blocks = max(1, min(1024, -(-data.size // threads)))
    args = (np.uint64(data.ctypes.data), np.int64(data.size), cast(factor))
    kernels.function(K.kernel_name("scale", dtype.name))((blocks,), (threads,), args)
