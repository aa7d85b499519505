"""What the CuPy-based backends (cupy, cuda) share: finding a GPU, element storage, timing.

CuPy is imported inside the functions, never at module level, so that the CLI can
import this module (to say "no GPU here" in one line) on a machine without CuPy.

- `require_gpu(backend)`: the number of visible CUDA devices, or a one-line
  BackendError with the install hint (exit 2 from the CLI, no traceback).
- Storage: CuPy has no bfloat16 dtype, so bfloat16 buffers hold the 16 bits as
  uint16 (round to nearest even on upload, exact widening on download), as shm does.
- `time_calls`: per-call times from CUDA events on the stream the calls use, read after
  one synchronisation at the end; with `graph=True` the calls are captured in one CUDA
  graph and replayed once (as nccl-tests -G), so each call's time is the graph's mean.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from commbench.backends.base import BackendError, OutOfMemory
from commbench.collectives import DType

INSTALL_HINT = "pip install 'commbench[gpu]' (CuPy for CUDA 12; on CUDA 13: pip install cupy-cuda13x nvidia-ml-py)"
MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (unified addressing, peers included)


def require_gpu(backend: str) -> int:
    """Visible CUDA devices (>= 1), or BackendError naming what is missing."""
    try:
        import cupy
    except ImportError:
        raise BackendError(f"--backend {backend} needs CuPy, which is not installed: {INSTALL_HINT}") from None
    except Exception as exc:  # noqa: BLE001 - a broken CuPy install (mismatched CUDA libraries) is the same problem
        raise BackendError(f"--backend {backend}: CuPy failed to import ({_first_line(exc)}): {INSTALL_HINT}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: no driver, driver too old, no device
        raise BackendError(f"--backend {backend}: no CUDA device visible ({_first_line(exc)}); it needs an "
                           f"NVIDIA GPU, its driver, and CuPy for that CUDA version: {INSTALL_HINT}") from None
    if count < 1:
        raise BackendError(f"--backend {backend}: no CUDA device visible (CUDA_VISIBLE_DEVICES="
                           f"{_visible_devices()!r}); it needs an NVIDIA GPU, its driver, and CuPy: {INSTALL_HINT}")
    return count


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _visible_devices() -> str | None:
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES")


# ---------------------------------------------------------------- storage


def store_dtype(dtype: DType) -> np.dtype:
    """The NumPy/CuPy dtype a buffer of `dtype` is held in on the GPU."""
    return np.dtype(np.uint16) if dtype.name == "bfloat16" else np.dtype(dtype.host)


def dtype_of(array: Any) -> DType:
    """The commbench dtype a storage array holds (uint16 storage is bfloat16)."""
    from commbench.collectives import DTYPES

    if array.dtype == np.uint16:
        return DTYPES["bfloat16"]
    return next(d for d in DTYPES.values() if np.dtype(d.host) == array.dtype and d.name != "bfloat16")


def to_store(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Host values (DType.host) -> contiguous storage values."""
    if dtype.name == "bfloat16":
        from commbench.backends.shm import _float32_to_bf16

        return _float32_to_bf16(values.astype(np.float32))
    return np.ascontiguousarray(values, dtype=store_dtype(dtype))


def from_store(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Storage values (copied to the host) -> host values (DType.host)."""
    if dtype.name == "bfloat16":
        from commbench.backends.shm import _bf16_to_float32

        return _bf16_to_float32(values)
    return values


def fill_value(value: float, dtype: DType) -> Any:
    """`value` as one storage element (the bits of bfloat16)."""
    return to_store(np.array([value], dtype=np.float64), dtype)[0]


def oom_or(exc: BaseException, nbytes: int) -> BaseException:
    """OutOfMemory for CuPy's allocation failures, else `exc` itself."""
    text = str(exc)
    if type(exc).__name__ == "OutOfMemoryError" or "cudaErrorMemoryAllocation" in text or "out of memory" in text:
        return OutOfMemory(f"could not allocate {nbytes} bytes on the GPU")
    return exc


# ---------------------------------------------------------------- timing


def time_calls(call: Callable[[], None], iters: int, stream: Any, graph: bool = False) -> np.ndarray:
    """Per-call times in microseconds, from CUDA events recorded on `stream`."""
    import cupy

    if graph:
        return _time_graph(call, iters, stream)
    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(iters)]
    for start, end in events:
        start.record(stream)
        call()
        end.record(stream)
    if not events:
        return np.empty(0)
    events[-1][1].synchronize()
    return np.array([cupy.cuda.get_elapsed_time(start, end) * 1e3 for start, end in events])


def _time_graph(call: Callable[[], None], iters: int, stream: Any) -> np.ndarray:
    """Capture `iters` calls in one CUDA graph, replay it once between two events; the
    per-call time is the mean (per-iteration percentiles are then all equal)."""
    import cupy

    if iters < 1:
        return np.empty(0)
    with stream:
        stream.begin_capture()
        try:
            for _ in range(iters):
                call()
        finally:
            captured = stream.end_capture()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    captured.launch(stream)
    end.record(stream)
    end.synchronize()
    return np.full(iters, cupy.cuda.get_elapsed_time(start, end) * 1e3 / iters)
