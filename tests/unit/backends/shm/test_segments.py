"""shm's segments: each rank's buffers start a rank-dependent number of cache lines into a segment with a
page of slack (segments.start_nbytes), so that two ranks' buffers of a power-of-two size are never a
power of two apart at equal offsets (issue 38: on AMD's cores such streams evict each other's L1 way
predictions; a 256 MiB allreduce ran 1.5x slower). The peer's view must find the peer's buffer where
the peer put it, for every dtype, and views keep their offsets."""
import numpy as np
from conftest import clean_shm, end_rank, spawn_ranks  # noqa: F401

from commbench.backends.shm.segments import SEGMENT_SLACK, start_nbytes

PAGE = 4096


def test_every_rank_on_a_host_starts_on_its_own_line_within_the_slack():
    starts = [start_nbytes(rank) for rank in range(64)]
    assert len(set(starts)) == 64, "two of the first 64 ranks share a start line"
    assert all(start % 64 == 0 for start in starts), "a start that breaks the streaming copies' alignment"
    assert all(0 <= start < SEGMENT_SLACK <= PAGE for start in starts)
    assert start_nbytes(0) != start_nbytes(1)


def _rank(rank: int, world: int, port: int, queue) -> None:
    from commbench import collectives as C
    from commbench.backends.shm.backend import ShmBackend
    from commbench.launchers import LaunchInfo
    from commbench.topology import Topology

    backend = ShmBackend(LaunchInfo.local(rank, world, port), Topology(1, world), "auto", 60)
    report = []
    for dtype_name in ("float32", "float64", "int8", "bfloat16"):
        dtype = C.resolve_dtype(dtype_name)
        count = (1 << 20) // dtype.itemsize  # a power-of-two buffer, the case that aliased
        buffer = backend.alloc(count, dtype)
        backend.upload(buffer, np.full(count, rank + 1).astype(dtype.host), rank)
        backend.gather_objects(None)
        peer = (rank + 1) % world
        seen = backend._peer_array(peer, buffer)
        view = backend.view(buffer, 1000, 24)
        seen_view = backend._peer_array(peer, view)
        report.append({
            "dtype": dtype_name,
            "own_start": buffer.array.ctypes.data % PAGE,
            "peer_start": seen.ctypes.data % PAGE,
            "peer_values": sorted({int(v) for v in np.asarray(seen[[0, count // 2, count - 1]], dtype=np.float64)}
                                  if dtype_name != "bfloat16" else {int(v) for v in seen[[0, count - 1]]}),
            "view_offset_bytes": seen_view.ctypes.data - seen.ctypes.data,
            "want_view_offset_bytes": 1000 * seen.itemsize,
        })
        backend.gather_objects(None)
        backend.end_point()
    end_rank(backend, queue, rank, report)


def test_a_peer_sees_each_buffer_where_its_owner_put_it_on_different_lines(clean_shm):  # noqa: F811
    from commbench import collectives as C

    world = 2
    reports = spawn_ranks(_rank, world)
    for rank, report in reports.items():
        peer = (rank + 1) % world
        for row in report:
            assert row["own_start"] == start_nbytes(rank), row
            assert row["peer_start"] == start_nbytes(peer), row
            assert row["own_start"] != row["peer_start"], f"rank {rank}: own and peer streams on the same lines"
            if row["dtype"] == "bfloat16":  # kept as uint16 bits: the peer's value, as its bits
                bits = int(np.array([peer + 1], dtype=np.float32).view(np.uint32)[0] >> 16)
                assert row["peer_values"] == [bits], row
            else:
                host = C.resolve_dtype(row["dtype"]).host
                assert row["peer_values"] == [int(np.array(peer + 1).astype(host))], row
            assert row["view_offset_bytes"] == row["want_view_offset_bytes"], row
