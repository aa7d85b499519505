"""shm's shared memory: the segments the ranks map, and the buffers viewed in them.

Every buffer the harness allocates lives in a shared-memory segment
(/dev/shm/cb_<job>_<rank>_<n>), which is how NCCL's user-buffer registration lets
peers address each other's memory. A segment's pages are reserved when it is created (a full
/dev/shm is an error, not SIGBUS) and mapped with their page tables filled.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np

from commbench.backends.base import OutOfMemory

# Where a rank's buffers start in their segments. The fused reduce reads its own chunk and the peer's at the
# same element offsets. Segments of a power-of-two size mapped next to each other put those two streams a
# power of two apart in the address space (256 MiB: every address bit 12-27 alike), and on AMD's cores,
# whose L1 way predictor tags lines by a hash of exactly those bits (Lipp et al., "Take A Way", AsiaCCS
# 2020), the two streams then evict each other's way predictions in every set. On a 2-core EPYC VM a 256 MiB
# allreduce ran at 22-23 ms where a copy of the same bytes took 13-14 ms, and at 14.9-16.6 ms with this
# layout (docs/performance.md, issue 38). So each segment has a page of slack, and each rank's
# buffers start a rank-dependent number of cache lines in (within that page): any two ranks' buffers then
# sit in different L1 sets at equal offsets, wherever the kernel maps them; 64-byte steps keep every
# alignment the streaming copies need.
SEGMENT_SLACK = 4096
START_STEP_NBYTES, START_STEPS = 64, 64


def start_nbytes(rank: int) -> int:
    """The byte offset at which rank `rank`'s buffers start in their segments (< SEGMENT_SLACK)."""
    return START_STEP_NBYTES * (rank % START_STEPS)


@dataclass
class ShmBuffer:
    """Elements [offset, offset + count) of segment `seq`, viewed as `array` (bfloat16 kept as uint16)."""
    seq: int
    offset: int
    array: np.ndarray


class Segment:
    def __init__(self, path: str, nbytes: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, max(nbytes, 1))  # reserve now: a full /dev/shm is an error, not SIGBUS
                except OSError as exc:
                    os.unlink(path)
                    raise OutOfMemory(f"/dev/shm has no room for {nbytes} bytes ({exc.strerror})") from exc
            self.map = map_segment(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        self.path, self.nbytes = path, nbytes

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a NumPy view still exports it; the mapping goes when the view does
            pass


def map_segment(fd: int, nbytes: int) -> mmap.mmap:
    """The segment mapped with its page tables filled now (MAP_POPULATE): no page faults in the first
    timed calls, in a peer's mapping as in the creator's (whose posix_fallocate allocated the pages)."""
    return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))


def shm_page_note() -> str | None:
    """What page size shm's segments get here, when it is not huge pages (a header note)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled", encoding="ascii") as handle:
            mode = handle.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None
    if mode in ("always", "force", "within_size"):
        return None
    return (f"note: shm segments use 4 KiB pages here (transparent_hugepage/shmem_enabled = {mode}; huge "
            f"pages for /dev/shm are a system setting: 'always' or 'within_size', or a huge= mount option)")


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
