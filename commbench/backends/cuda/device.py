"""What the CuPy-based backends (cupy, cuda) share: finding a GPU, element storage, timing.

CuPy is imported inside the functions, never at module level, so that the CLI can
import this module (to say "no GPU here" in one line) on a machine without CuPy.

- `require_gpu(backend)`: the number of visible CUDA devices, or a one-line
  BackendError with the install hint (exit 2 from the CLI, no traceback).
- Storage: CuPy has no bfloat16 dtype, so bfloat16 buffers hold the 16 bits as
  uint16 (round to nearest even on upload, exact widening on download), as shm does.
- `time_calls`: per-call times from CUDA events on the stream the calls use, read after
  one wait at the end; with `graph=True` the calls are captured in one CUDA graph and
  replayed once (as nccl-tests -G), so each call's time is the graph's mean.
- `wait_until_done`: polls work with a deadline (a dead peer must not hang the host).
- `rank_gpu`: a process's GPU under a launcher, refusing two ranks on one GPU.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from commbench.backends import bfloat16
from commbench.backends.base import BackendError, OutOfMemory
from commbench.collectives import DType

INSTALL_HINT = ("pip install 'commbench[gpu]' (CuPy for CUDA 12 with its NVRTC, NCCL, NVML; on CUDA 13: "
                "pip install 'cupy-cuda13x[ctk]' nvidia-nccl-cu13 nvidia-ml-py)")
NCCL_HINT = ("pip install nvidia-nccl-cu12 (nvidia-nccl-cu13 for cupy-cuda13x), or "
             "python -m cupyx.tools.install_library --library nccl --cuda 12.x")
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


def gpu_only(cfg, library: str) -> tuple[str, str]:
    """(device, library) of a backend that needs CuPy and a GPU, or one BackendError saying what is missing."""
    if cfg.device == "cpu":
        raise BackendError(f"--backend {cfg.backend} runs on GPUs; on the CPU: --backend torch, shm or sim")
    require_gpu(cfg.backend)
    return "cuda", library


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
        return bfloat16.from_float32(values.astype(np.float32))
    return np.ascontiguousarray(values, dtype=store_dtype(dtype))


def from_store(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Storage values (copied to the host) -> host values (DType.host)."""
    if dtype.name == "bfloat16":
        return bfloat16.to_float32(values)
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


def time_calls(call: Callable[[], None], iters: int, stream: Any, graph: bool = False,
               wait: Callable[[Any], None] | None = None) -> np.ndarray:
    """Per-call times in microseconds, from CUDA events recorded on `stream`. `wait(x)` returns
    once event or stream `x` is done (default: x.synchronize(); the cupy backend polls)."""
    import cupy

    wait = wait or _synchronize
    if graph:
        return _time_graph(call, iters, stream, wait)
    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(iters)]
    for start, end in events:
        start.record(stream)
        call()
        end.record(stream)
    if not events:
        return np.empty(0)
    wait(events[-1][1])
    return np.array([cupy.cuda.get_elapsed_time(start, end) * 1e3 for start, end in events])


def _time_graph(call: Callable[[], None], iters: int, stream: Any, wait: Callable[[Any], None]) -> np.ndarray:
    """Capture `iters` calls in one CUDA graph, upload it and let the stream drain, then replay
    it once between two events: the per-call time is the replay's mean (so every iteration
    gets the same value). Warm-up runs eagerly before this (time_warmup), so first-call setup
    (NCCL's connections, module loading) is neither captured nor timed."""
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
    captured.upload(stream)  # instantiated and resident before the clock starts
    wait(stream)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    captured.launch(stream)
    end.record(stream)
    wait(end)
    return np.full(iters, cupy.cuda.get_elapsed_time(start, end) * 1e3 / iters)


def _synchronize(work: Any) -> None:
    work.synchronize()


def wait_until_done(work: list[Any], timeout_s: float, check: Callable[[], None] = lambda: None) -> bool:
    """Poll events or streams (`.done`) until all are done, calling `check()` between polls;
    False once `timeout_s` passed first. Polling, not cudaEventSynchronize: work that waits
    on a dead peer never completes, and a blocking wait cannot be given up."""
    deadline, pause_s = time.monotonic() + timeout_s, 1e-5
    while not all(w.done for w in work):
        check()
        if time.monotonic() > deadline:
            return False
        time.sleep(pause_s)
        pause_s = min(2 * pause_s, 1e-3)
    return True


def rank_gpu(backend: str, local_rank: int, gpus: int, all_gather: Callable[[Any], list[Any]]) -> int:
    """This rank's GPU, local_rank % visible GPUs. Every rank reports (host, PCI bus id); two
    ranks on one GPU are one BackendError line on every rank. By bus id, not by counting: a
    launcher that gives each rank its own CUDA_VISIBLE_DEVICES shows each rank one GPU."""
    import socket

    import cupy

    gpu = local_rank % gpus
    owners: dict[tuple[str, str], int] = {}
    for rank, place in enumerate(all_gather((socket.gethostname(), cupy.cuda.Device(gpu).pci_bus_id))):
        place = tuple(place)
        if place in owners:
            raise BackendError(f"--backend {backend} runs one rank per GPU, but ranks {owners[place]} and {rank} "
                               f"would share GPU {place[1]} on {place[0]}: start at most as many ranks per node as "
                               f"it has GPUs (and check CUDA_VISIBLE_DEVICES)")
        owners[place] = rank
    return gpu


def launch_on(device: int, kernel: Any, grid: tuple, block: tuple, args: tuple, stream: Any) -> Callable[[], None]:
    """A closure launching `kernel` on `device`'s `stream` from any thread, whatever device is
    current there: CuPy's RawKernel launches on the device current at call time, and a
    stream of another device fails the launch."""
    import cupy

    def launch() -> None:
        with cupy.cuda.Device(device):
            kernel(grid, block, args, stream=stream)
    return launch


def enable_peer_access(devices: list[int]) -> None:
    """Every GPU may read every other's memory; a pair without P2P is one BackendError."""
    import cupy

    runtime = cupy.cuda.runtime
    for device in devices:
        with cupy.cuda.Device(device):
            for peer in devices:
                if peer == device:
                    continue
                if not runtime.deviceCanAccessPeer(device, peer):
                    raise BackendError(f"GPU {device} cannot access GPU {peer}'s memory (no peer-to-peer path); "
                                       f"use --cuda-mode virtual, or --backend cupy (NCCL)")
                try:
                    runtime.deviceEnablePeerAccess(peer)
                except runtime.CUDARuntimeError as exc:
                    if "PeerAccessAlreadyEnabled" not in str(exc):
                        raise
