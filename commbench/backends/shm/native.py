"""shm_native: the shm executor's compiled fast path (shm_native.c), built at run time, loaded with ctypes.

The shm backend turns a schedule into a flat plan of steps (barrier, copy, reduce over fixed views,
executor.py `_plan`). The Python executor calls one NumPy function or barrier closure per step; this
one hands the whole plan to C once, as an array of `Op`, and a call is one ctypes call
(shm_native.c says how the barrier and the kernels work; they keep waits.py's protocol, so the two
executors interoperate and give bitwise the same results for the same plan).

Which executor runs is $COMMBENCH_SHM_EXECUTOR:
  auto    native if it builds (and supports the call's dtype), else python, with one note in the header;
  native  native or a clear error;
  python  the reference executor (executor.py), always.
The library is compiled once with the C compiler ($CC, else cc, gcc, clang) into a cache folder keyed
by a hash of the source, the compiler, its flags and this CPU (built with -march=native):
$COMMBENCH_CACHE_DIR, else $XDG_CACHE_HOME/commbench, else ~/.cache/commbench (build_cache.py).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from commbench.backends.build_cache import build_folder, cache_root, cached
from commbench.backends.build_cache import find_compiler as find_compiler_of

EXECUTOR_VAR = "COMMBENCH_SHM_EXECUTOR"
EXECUTORS = ("auto", "native", "python")
SOURCE = Path(__file__).with_name("shm_native.c")
LIBRARY = "libcb_shm.so"
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-strict-aliasing")
OP_BARRIER, OP_COPY, OP_REDUCE, OP_SKIP = 0, 1, 2, 3
REDUCTIONS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 0}  # avg: a sum, divided after the call
DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.int8): 2, np.dtype(np.uint8): 3,
          np.dtype(np.int32): 4, np.dtype(np.int64): 5}  # float16 and bfloat16 (uint16 storage) stay in Python
NT_MIN_BYTES = 256 << 10  # streaming copies from this size use non-temporal stores (shm_native.c)
NS_PER_CHECK = 100  # waits.py's spin budgets count Python reads of ~100 ns; the C spin counts time


class NativeUnavailable(Exception):
    """The fast path cannot be built or loaded here (one line: why)."""


class Op(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("dtype", ctypes.c_int32), ("reduction", ctypes.c_int32),
                ("stream", ctypes.c_int32), ("out", ctypes.c_void_p), ("out2", ctypes.c_void_p),
                ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("count", ctypes.c_int64)]


class Context(ctypes.Structure):
    _fields_ = [("counters", ctypes.c_void_p), ("flags", ctypes.c_void_p), ("peers", ctypes.c_void_p),
                ("npeers", ctypes.c_int64), ("mine", ctypes.c_int64), ("flag_words", ctypes.c_int64),
                ("spin_ns", ctypes.c_int64), ("spin_budget_ns", ctypes.c_int64), ("spin_floor_ns", ctypes.c_int64),
                ("nt_bytes", ctypes.c_int64), ("waiting_index", ctypes.c_int64), ("waiting_epoch", ctypes.c_int64),
                ("fused_block", ctypes.c_int64), ("prefetch_bytes", ctypes.c_int64), ("fused_nt", ctypes.c_int64),
                ("fused_nt_in_place", ctypes.c_int64)]


def requested() -> str:
    """$COMMBENCH_SHM_EXECUTOR, checked (a bad value is one ValueError line)."""
    value = os.environ.get(EXECUTOR_VAR, "auto").strip().lower() or "auto"
    if value not in EXECUTORS:
        raise ValueError(f"${EXECUTOR_VAR}={value!r}: expected one of {', '.join(EXECUTORS)}")
    return value


def find_compiler() -> str:
    path, looked = find_compiler_of("CC", ("cc", "gcc", "clang"))
    if path:
        return path
    raise NativeUnavailable(f"no C compiler (looked for {looked})")


def _cpu() -> str:
    """What -march=native depends on: the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return "\n".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))


def build(cache_dir: Path | None = None) -> Path:
    """The library's path, compiled now unless the cache holds this exact build."""
    compiler = find_compiler()
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeUnavailable(f"{compiler} does not run ({exc})") from exc
    digest = hashlib.sha256(repr((compiler, version, FLAGS, SOURCE.read_text(), _cpu())).encode()).hexdigest()[:16]
    target = (cache_dir or cache_root()) / "shm_native" / digest / LIBRARY
    if cached(target):
        return target
    try:
        refused = build_folder(target)
        if refused:
            raise NativeUnavailable(refused)
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            built = Path(work) / LIBRARY
            out = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True,
                                 timeout=300)
            if out.returncode != 0:
                log = (out.stderr or out.stdout).strip().splitlines()
                first = next((line for line in log if "error" in line), log[0] if log else "")
                raise NativeUnavailable(f"{SOURCE.name} does not compile with {compiler}: {first.strip()[:200]}")
            os.replace(built, target)  # atomic: ranks building the same key at once land the same bytes
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeUnavailable(f"building {SOURCE.name} failed ({exc})") from exc
    return target


@functools.cache
def _load(path: str) -> ctypes.CDLL:
    library = ctypes.CDLL(path)
    library.cb_shm_run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    library.cb_shm_run.restype = ctypes.c_int64
    library.cb_shm_layout.argtypes, library.cb_shm_layout.restype = [ctypes.c_int64], ctypes.c_int64
    if (library.cb_shm_layout(0), library.cb_shm_layout(1)) != (ctypes.sizeof(Op), ctypes.sizeof(Context)):
        raise NativeUnavailable(f"{LIBRARY}'s structures differ from native.py's")
    return library


def load() -> ctypes.CDLL:
    """The built library (NativeUnavailable: why not)."""
    return load_built()[0]


def load_built() -> tuple[ctypes.CDLL, Path]:
    """The built library and its path (the planner's cache lies beside it; NativeUnavailable: why not)."""
    path = build()
    try:
        return _load(str(path)), path
    except OSError as exc:
        raise NativeUnavailable(f"{LIBRARY} does not load ({exc})") from exc


def unsupported(dtype: np.dtype, op: str) -> str | None:
    """Why the fast path cannot run this reduction, or None."""
    if np.dtype(dtype) not in DTYPES:
        return f"no native kernels for {'bfloat16' if np.dtype(dtype) == np.uint16 else np.dtype(dtype).name}"
    if op not in REDUCTIONS:
        return f"no native kernel for op {op}"
    return None


def llc_bytes() -> int:
    """The last-level cache's size (sysfs), 32 MiB if it cannot be read."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for index in base.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG") or 0) * scale)
    return max(sizes, default=32 << 20)


class NativeExecutor:
    """One rank's native state: the context (counters, flags, spin) shared by all its prepared calls."""

    def __init__(self, library: ctypes.CDLL, counters_address: int, flags_address: int, flag_words: int,
                 mine: int, peers: list[int], spin_budget_checks: int, spin_floor_checks: int):
        self.run = library.cb_shm_run
        self._raw_run = library["cb_shm_run"]  # another handle, without argtypes: called with ready ctypes values
        self._raw_run.restype = ctypes.c_int64
        self._peers = np.array(peers or [0], dtype=np.int64)  # kept alive: the context points at it
        self.context = Context(counters_address, flags_address, self._peers.ctypes.data, len(peers), mine, flag_words,
                               spin_budget_checks * NS_PER_CHECK, spin_budget_checks * NS_PER_CHECK,
                               spin_floor_checks * NS_PER_CHECK, NT_MIN_BYTES, -1, 0)
        self.address = ctypes.addressof(self.context)

    def tune(self, values: dict[str, int]) -> None:
        """The planner's knobs (shm_plan.Plan.context_values): the fused op's block, stores and prefetch."""
        for name, value in values.items():
            setattr(self.context, name, value)

    def first_call(self, ops: ctypes.Array) -> functools.partial:
        """run(ops, len(ops), start 0, not resumed, context) with its arguments converted once: the ctypes
        call then costs ~0.27 us here, against ~0.5 us converting Python ints through argtypes."""
        args = (ctypes.c_void_p(ctypes.addressof(ops)), ctypes.c_int64(len(ops)), ctypes.c_int64(0),
                ctypes.c_int64(0), ctypes.c_void_p(self.address))
        return functools.partial(self._raw_run, *args)

    def stalled(self) -> tuple[int, int]:
        """(counter index, epoch) the last stopped call waits for."""
        return self.context.waiting_index, self.context.waiting_epoch

    def blocked(self, seconds: float) -> None:
        """After a wait that outlasted the spin and blocked for `seconds`: had the whole wait fit in the
        budget, a longer spin would have caught it without a wake-up (double the spin); else spinning
        only held a core that other processes, the peer among them, could use (halve it). Under other
        processes' load, waits.py's rule (halve on every block) left the spin at its floor and every
        barrier blocking at 1 KiB (6.9-7.6 us per call against 1.7-2.1 us, same load), and a spin
        that never shrinks cost ~2 ms per barrier whenever the peer was descheduled (256 MiB, 33
        barriers per call: 80-190 ms against 26 ms; docs/performance.md)."""
        context = self.context
        if context.spin_ns + seconds * 1e9 < context.spin_budget_ns:
            context.spin_ns = min(context.spin_budget_ns, 2 * context.spin_ns)
        else:
            context.spin_ns = max(context.spin_floor_ns, context.spin_ns // 2)

    def ops(self, plan: list[tuple], reduction: str, stream: bool = False) -> ctypes.Array:
        """The plan's steps ("barrier",), ("copy", dst, src), ("reduce", out, a, b), ("push", dst, src) as an Op
        array; `stream`: the ranks' buffers exceed the last-level cache, so large copies bypass it. A reduce
        followed by the push of its result becomes one fused Op (out2) and the push an OP_SKIP: the array
        keeps the plan's indices, which a stopped barrier returns."""
        array = (Op * len(plan))()
        for index, (slot, step) in enumerate(zip(array, plan)):
            if step[0] == "barrier":
                slot.kind = OP_BARRIER
                continue
            arrays = step[1:]
            slot.kind = OP_REDUCE if step[0] == "reduce" else OP_COPY
            slot.stream = int(stream)
            slot.dtype, slot.reduction, slot.count = DTYPES[arrays[0].dtype], REDUCTIONS[reduction], len(arrays[0])
            slot.out, slot.a = arrays[0].ctypes.data, arrays[1].ctypes.data
            slot.b = arrays[2].ctypes.data if len(arrays) > 2 else None
            if step[0] == "push" and index and _pushes_result_of(plan[index - 1], step) and not array[index - 1].out2:
                array[index - 1].out2, slot.kind = slot.out, OP_SKIP
        return array


def _pushes_result_of(before: tuple, push: tuple) -> bool:
    """Whether `push` copies exactly the output of the reduce step `before`."""
    return before[0] == "reduce" and before[1].ctypes.data == push[2].ctypes.data and len(before[1]) == len(push[2])
