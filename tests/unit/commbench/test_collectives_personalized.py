"""gather, scatter, alltoallv and hypercube in the collective table (issue 39): byte counts and
algbw/busbw as nccl-tests' src/gather.cu, scatter.cu, alltoallv.cu and hypercube.cu compute them,
and verifiable data that a data movement simulated here independently passes and a misrouted
part fails."""
import numpy as np
import pytest

from commbench import collectives as C
from commbench import splits

F32 = C.DTYPES["float32"]


@pytest.mark.parametrize("name,world,size,send,recv", [
    ("gather", 4, 1000, 62, 248),  # nccl-tests: sendcount = count/n, recvcount = (count/n) n
    ("scatter", 4, 1000, 248, 62),
    ("alltoallv", 4, 1000, 248, 248),
    ("hypercube", 4, 1000, 60, 240),  # hypercube.cu: base = (count/(4n)) x 4 elements per rank
])
def test_plans_count_as_nccl_tests(name, world, size, send, recv):
    p = C.plan(name, size, F32, world)
    assert (p.send_count, p.recv_count, p.nbytes) == (send, recv, max(send, recv) * 4)


@pytest.mark.parametrize("name,algbw,busbw", [
    # GetBw with count = per-rank chunk c, n = 8, 1 GB (c x n x 4 B) in 1 s:
    ("gather", 1.0, 7 / 8),      # base = c n size / t; busbw = base (n-1)/n
    ("scatter", 1.0, 7 / 8),
    ("alltoallv", 1.0, 7 / 8),
    ("hypercube", 7 / 8, 7 / 8),  # base = c size (n-1) / t; busbw = base
])
def test_bandwidths_are_nccl_tests_formulas(name, algbw, busbw):
    assert C.bandwidths_gbps(name, 1_000_000_000, 8, 1e6) == pytest.approx((algbw, busbw))


def _inputs(pattern, p):
    return [C.input_values(pattern, r, 0, p.send_count) for r in range(p.world)]


def _moved(name, p, inputs):
    """Each rank's receive buffer after the collective, computed here without collectives.py's offsets."""
    n, root = p.world, p.root
    chunk = p.send_count // n if name == "scatter" else p.send_count
    if name in ("gather", "hypercube"):
        whole = np.concatenate(inputs)
        return [whole if name == "hypercube" or r == root else None for r in range(n)]
    if name == "scatter":
        return [inputs[root][r * chunk:(r + 1) * chunk] for r in range(n)]
    out = []  # alltoallv: the parts each source sends rank r, one after another
    for r in range(n):
        parts = [inputs[s][sum(p.splits[s][:r]):sum(p.splits[s][:r + 1])] for s in range(n)]
        out.append(np.concatenate(parts + [np.zeros(p.recv_count - sum(len(x) for x in parts), F32.host)]))
    return out


def _wrong(pattern, p, rank, actual):
    return sum(C.count_wrong(actual[s.start:s.start + s.count], C.periodic(s.source, s.offset, s.count), 0.0)
               for s in C.expected_segments(pattern, p, rank))


@pytest.mark.parametrize("name,weights", [("gather", ()), ("scatter", ()), ("hypercube", ()), ("alltoallv", ()),
                                          ("alltoallv", splits.weights("skewed:1.5:3", 4))])
def test_verifiable_data_passes_and_a_misrouted_part_fails(name, weights):
    world = 4
    pattern = C.make_pattern(F32, None, world)
    p = C.plan(name, 4000 * world * 4, F32, world, root=2, split_weights=weights)
    outs = _moved(name, p, _inputs(pattern, p))
    for rank in range(world):
        if outs[rank] is not None:
            assert _wrong(pattern, p, rank, outs[rank]) == 0, (name, rank)
    rank = 2
    broken = outs[rank].copy()
    broken[: len(broken) // 2] = np.roll(broken[: len(broken) // 2], 17)  # parts shifted off their places
    assert _wrong(pattern, p, rank, broken) > len(broken) // 8


def test_gather_leaves_non_roots_unchecked_and_hypercube_needs_a_power_of_two():
    p = C.plan("gather", 4096, F32, 4, root=1)
    assert C.expected_segments(C.make_pattern(F32, None, 4), p, 0) == []
    assert C.refused_world("hypercube", 6) and "power-of-two" in C.refused_world("hypercube", 6)
    assert C.refused_world("hypercube", 8) is None and C.refused_world("sendrecv", 1)


def test_alltoallv_splits_share_out_every_element():
    weights = splits.weights("skewed", 8)
    p = C.plan("alltoallv", 1 << 16, F32, 8, split_weights=weights)
    assert all(sum(row) == p.send_count for row in p.splits)
    assert p.recv_count == max(sum(row[d] for row in p.splits) for d in range(8)) > p.send_count  # skewed
    uniform = C.plan("alltoallv", 1 << 16, F32, 8)
    assert set(np.ravel(uniform.splits)) == {uniform.send_count // 8}
