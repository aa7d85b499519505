"""--backend cupy's gather, scatter, alltoallv and hypercube (issue 39) without a GPU: the grouped
sends and receives each rank issues are matched here rank to rank over byte arrays standing in for
device memory, as NCCL matches them, and the harness's check reads the result."""
import types

import numpy as np
import pytest

from commbench import collectives as C
from commbench import splits
from commbench.backends.cuda.nccl import grouped_calls, personalized_steps

F32 = C.DTYPES["float32"]
SPAN = 1 << 32  # rank r's memory starts at r x SPAN


class Memory:
    """Every rank's device memory as one byte array each; a fake CuPy array is a pointer into it."""

    def __init__(self, world):
        self.bytes = [bytearray(SPAN >> 16) for _ in range(world)]
        self.used = [0] * world

    def array(self, rank, count, at=None):
        start = self.used[rank] if at is None else at
        self.used[rank] = max(self.used[rank], start + count * 4)
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=rank * SPAN + start), itemsize=4, size=count)

    def view(self, pointer, nbytes):
        rank, offset = divmod(pointer, SPAN)
        return memoryview(self.bytes[rank])[offset:offset + nbytes]

    def values(self, array):
        return np.frombuffer(self.view(array.data.ptr, array.size * 4), dtype=np.float32).copy()


def _run(memory, steps_of_rank):
    """NCCL's matching: in each step, rank a's send to b meets b's receive from a (in posting order)."""
    for step in range(max(len(s) for s in steps_of_rank)):
        posted = {}
        for rank, steps in enumerate(steps_of_rank):
            sends, receives = steps[step]
            if sends and sends[0][2] == -1:  # the device copy of hypercube's own chunk
                memory.view(receives[0][0], receives[0][1])[:] = memory.view(sends[0][0], sends[0][1])
                continue
            for pointer, count, peer in sends:
                posted.setdefault((rank, peer), []).append(bytes(memory.view(pointer, count * 4)))
        for rank, steps in enumerate(steps_of_rank):
            sends, receives = steps[step]
            for pointer, count, peer in receives if not (sends and sends[0][2] == -1) else ():
                memory.view(pointer, count * 4)[:] = posted[(peer, rank)].pop(0)
        assert all(not left for left in posted.values()), "a send nobody received"


@pytest.mark.parametrize("name,spec,world", [("gather", "uniform", 4), ("scatter", "uniform", 3),
                                             ("alltoallv", "uniform", 4), ("alltoallv", "skewed:2:5", 4),
                                             ("hypercube", "uniform", 8)])
@pytest.mark.parametrize("inplace", [False, True])
def test_grouped_sends_and_receives_pass_the_check(name, spec, world, inplace):
    if inplace and not C.COLLECTIVES[name].inplace:
        pytest.skip("no in-place form")
    p = C.plan(name, 300 * world * 4, F32, world, root=1, split_weights=splits.weights(spec, world))
    pattern, memory, arrays, steps = C.make_pattern(F32, None, world), Memory(world), [], []
    for rank in range(world):
        if inplace:  # as bench._buffers lays it out: the rank's chunk at its place in one buffer
            whole = memory.array(rank, max(p.send_count, p.recv_count))
            send_at = rank * p.send_count * 4 if p.recv_count > p.send_count else 0
            recv_at = rank * p.recv_count * 4 if p.send_count > p.recv_count else 0
            send = memory.array(rank, p.send_count, at=whole.data.ptr % SPAN + send_at)
            recv = memory.array(rank, p.recv_count, at=whole.data.ptr % SPAN + recv_at)
        else:
            send, recv = memory.array(rank, p.send_count), memory.array(rank, p.recv_count)
        memory.view(send.data.ptr, p.send_count * 4)[:] = C.input_values(pattern, rank, 0, p.send_count).tobytes()
        arrays.append((send, recv))
        steps.append(personalized_steps(name, send, recv, p.root, rank, world, p.splits))
    _run(memory, steps)
    for rank, (_, recv) in enumerate(arrays):
        got = memory.values(recv)
        wrong = sum(C.count_wrong(got[s.start:s.start + s.count], C.periodic(s.source, s.offset, s.count), 0.0)
                    for s in C.expected_segments(pattern, p, rank))
        assert wrong == 0, (name, rank)


def test_each_step_is_one_nccl_group():
    log = []
    nccl = types.SimpleNamespace(groupStart=lambda: log.append("start"), groupEnd=lambda: log.append("end"))
    comm = types.SimpleNamespace(send=lambda *a: log.append(("send", a[3])), recv=lambda *a: log.append(("recv", a[3])))
    grouped_calls(nccl, comm, 0, 7, [([(0, 4, 1)], [(8, 4, 1)]), ([(0, 8, 2)], [(16, 8, 2)])])()
    assert log == ["start", ("send", 1), ("recv", 1), "end", "start", ("send", 2), ("recv", 2), "end"]
