"""shm's waits with more ranks than cores: a rank that waits spins briefly, then blocks in the
kernel (a futex on its peer's counter) and gives its core to the peer it waits for, so an
oversubscribed job completes its sweep, every result checked (speed: benchmarks/shm_waits.py)."""
import ctypes
import mmap
import os

import numpy as np
import pytest
from conftest import commbench, results_of

from commbench.backends.shm.waits import FUTEX as _FUTEX

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
OVERSUBSCRIBED = min(8, max(4, CORES + 2))  # more ranks than this machine has cores (4 on a 2-core box)
ADAPTIVE = ["--min-time", "0.02"]  # adaptive counts: thousands of waits per point


@pytest.mark.parametrize("backend,args", [
    ("shm", ["--sizes", "1K,16K,256K,1M", "-c", "allreduce", "-c", "allgather"]),  # oneshot, ring; ring
    ("hybrid", ["--topology", f"2x{OVERSUBSCRIBED // 2}", "--algorithm", "hier", "--sizes", "1K,256K"]),
])
def test_oversubscribed_sweep_completes_checked(tmp_path, clean_shm, backend, args):  # noqa: F811
    ranks = OVERSUBSCRIBED - OVERSUBSCRIBED % 2
    proc = commbench("sweep", "--backend", backend, "--nprocs", str(ranks), *ADAPTIVE, *args,
                     "--json", str(tmp_path / "r.jsonl"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    results, _ = results_of(tmp_path / "r.jsonl")
    assert results and all(r["wrong"] == 0 and r["world_size"] == ranks for r in results)
    assert all(r["iters"] >= 5 for r in results)


@pytest.mark.skipif(not _FUTEX.available, reason="no futex here (the waits yield and sleep instead)")
def test_futex_wait_returns_when_the_word_moved_or_after_its_timeout():
    shared = mmap.mmap(-1, 4096)
    counters = np.frombuffer(shared, dtype=np.int64)
    counters[0] = 7
    address = counters.ctypes.data
    _FUTEX.wait(address, 6)  # the word is not 6: returns at once
    _FUTEX.wait(address, 7)  # the word is 7 and nobody wakes it: returns after the block timeout
    _FUTEX.wake(address)  # nobody waits: a no-op
    counters[0] = (1 << 32) + 7  # only the low 32 bits are the futex word
    _FUTEX.wait(address, 7)
    assert ctypes.c_uint32.from_address(address).value == 7
    del counters
