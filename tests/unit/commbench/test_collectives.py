"""The collective table: byte counts, bus factors, metrics, and verifiable data.

The verifiable-data tests run each collective's data movement in the real dtype
with torch arithmetic, reducing ranks in shuffled orders, and check that the
analytic expectation matches exactly (tolerance only for avg on floats).
"""
import numpy as np
import pytest
import torch

from commbench import collectives as C

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
         "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "int64": torch.int64}
F32 = C.DTYPES["float32"]


@pytest.mark.parametrize("name,world,size,nbytes,send,recv", [
    ("allreduce", 8, 1000, 1000, 250, 250),
    ("allreduce", 8, 1023, 1020, 255, 255),  # rounded down to whole elements
    ("allgather", 8, 1000, 992, 31, 248),  # to whole elements per rank: 31 x 8 x 4 B
    ("reduce_scatter", 8, 1000, 992, 248, 31),
    ("alltoall", 4, 1000, 992, 248, 248),  # 62 elements per peer
    ("broadcast", 3, 12, 12, 3, 3),
    ("reduce", 3, 12, 12, 3, 3),
    ("sendrecv", 2, 4096, 4096, 1024, 1024),
])
def test_plan_rounds_like_nccl_tests(name, world, size, nbytes, send, recv):
    p = C.plan(name, size, F32, world)
    assert (p.nbytes, p.send_count, p.recv_count) == (nbytes, send, recv)
    assert p.count * F32.itemsize == p.nbytes
    assert p.nbytes == max(p.send_count, p.recv_count) * F32.itemsize


def test_plan_too_small_has_zero_count():
    assert C.plan("allgather", 16, F32, 8).count == 0
    assert C.plan("allreduce", 2, F32, 8).count == 0


@pytest.mark.parametrize("name,factor8", [("allreduce", 2 * 7 / 8), ("allgather", 7 / 8), ("reduce_scatter", 7 / 8),
                                          ("alltoall", 7 / 8), ("broadcast", 1.0), ("reduce", 1.0),
                                          ("sendrecv", 1.0)])
def test_bus_factors_match_nccl_tests(name, factor8):
    assert C.COLLECTIVES[name].bus_factor(8) == pytest.approx(factor8)
    algbw, busbw = C.bandwidths_gbps(name, 1_000_000_000, 8, 1e6)  # 1 GB in 1 s
    assert algbw == pytest.approx(1.0)
    assert busbw == pytest.approx(factor8)


def test_bandwidth_units_are_1e9_bytes_per_second():
    algbw, busbw = C.bandwidths_gbps("allreduce", 1 << 20, 2, 100.0)  # 1 MiB in 100 us
    assert algbw == pytest.approx((1 << 20) / 100e-6 / 1e9)
    assert busbw == pytest.approx(algbw)  # 2(n-1)/n = 1 at n = 2
    assert C.bandwidths_gbps("allreduce", 1024, 2, 0.0) == (0.0, 0.0)


def test_resolve_names():
    assert C.resolve_collectives(["all"]) == [name for name in C.COLLECTIVES if name != "hypercube"]
    assert C.resolve_collectives(["all_reduce", "allgather,reduce-scatter", "allreduce"]) == \
        ["allreduce", "allgather", "reduce_scatter"]
    assert C.resolve_dtype("half").name == "float16" and C.resolve_dtype("bf16").name == "bfloat16"
    with pytest.raises(ValueError, match="'allfoo'"):
        C.resolve_collectives(["allfoo"])
    with pytest.raises(ValueError, match="'float8'"):
        C.resolve_dtype("float8")


# ---------------------------------------------------------------- verifiable data, executed in the real dtype

def _reduce(tensors, op, order):
    acc = tensors[order[0]].clone()
    for r in order[1:]:
        t = tensors[r]
        if op in ("sum", "avg"):
            acc += t
        elif op == "prod":
            acc *= t
        elif op == "max":
            acc = torch.maximum(acc, t)
        else:
            acc = torch.minimum(acc, t)
    if op == "avg":
        acc = acc / len(tensors) if acc.is_floating_point() else acc // len(tensors)
    return acc


def _simulate(name, inputs, op, root, world, rng):
    """What each rank's receive buffer holds after the collective, computed in the dtype."""
    order = list(rng.permutation(world))
    if name in ("allreduce", "reduce"):
        total = _reduce(inputs, op, order)
        return [total if name == "allreduce" or r == root else None for r in range(world)]
    if name == "reduce_scatter":
        chunk = len(inputs[0]) // world
        total = _reduce(inputs, op, order)
        return [total[r * chunk:(r + 1) * chunk] for r in range(world)]
    if name == "broadcast":
        return [inputs[root]] * world
    if name == "sendrecv":
        return [inputs[(r - 1) % world] for r in range(world)]
    if name == "allgather":
        return [torch.cat(inputs)] * world
    chunk = len(inputs[0]) // world  # alltoall
    return [torch.cat([inputs[s][r * chunk:(r + 1) * chunk] for s in range(world)]) for r in range(world)]


def _host(t):
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _wrong(pattern, p, rank, actual):
    return sum(C.count_wrong(actual[s.start:s.start + s.count], C.periodic(s.source, s.offset, s.count),
                             C.tolerance(pattern)) for s in C.expected_segments(pattern, p, rank))


@pytest.mark.parametrize("dtype", list(C.DTYPES))
@pytest.mark.parametrize("op", C.OPS)
@pytest.mark.parametrize("world", [1, 2, 3, 8, 300])
def test_verifiable_reductions_are_exact_in_every_dtype(dtype, op, world):
    dt = C.DTYPES[dtype]
    if op == "avg" and not dt.is_float:
        pytest.skip("avg on integers is not offered (gloo has none)")
    rng = np.random.default_rng(world)
    pattern = C.make_pattern(dt, op, world)
    for name in ("allreduce", "reduce_scatter", "reduce"):
        p = C.plan(name, max(8, 3000 // world) * world * dt.itemsize + 3, dt, world, root=world - 1)
        inputs = [torch.from_numpy(C.input_values(pattern, r, 0, p.send_count)).to(TORCH[dtype]) for r in range(world)]
        outs = _simulate(name, inputs, op, p.root, world, rng)
        for rank in {0, world - 1}:
            if outs[rank] is not None:
                assert _wrong(pattern, p, rank, _host(outs[rank])) == 0, (name, rank)


@pytest.mark.parametrize("dtype", list(C.DTYPES))
@pytest.mark.parametrize("name", ["allgather", "broadcast", "alltoall", "sendrecv"])
def test_verifiable_data_movement(dtype, name):
    dt, world = C.DTYPES[dtype], 4
    pattern = C.make_pattern(dt, None, world)
    p = C.plan(name, 7777 * world, dt, world, root=2)
    inputs = [torch.from_numpy(C.input_values(pattern, r, 0, p.send_count)).to(TORCH[dtype]) for r in range(world)]
    outs = _simulate(name, inputs, None, 2, world, np.random.default_rng(0))
    for rank in range(world):
        assert _wrong(pattern, p, rank, _host(outs[rank])) == 0


def test_inputs_depend_on_rank_and_index():
    pattern = C.make_pattern(F32, "sum", 4)
    p = C.plan("allreduce", 4 * C.PERIOD * 2, F32, 4)
    a, b = C.input_values(pattern, 0, 0, p.send_count), C.input_values(pattern, 1, 0, p.send_count)
    assert not np.array_equal(a, b)
    assert len(np.unique(a[:1000])) > 50
    assert np.array_equal(a[:C.PERIOD], a[C.PERIOD:2 * C.PERIOD])  # periodic, so the checker can tile it


@pytest.mark.parametrize("name", ["allgather", "alltoall", "reduce_scatter"])
def test_misrouted_chunk_is_counted_wrong(name):
    """Swap two ranks' chunks in the output: the check must notice."""
    world, dt = 4, F32
    pattern = C.make_pattern(dt, "sum", world)
    p = C.plan(name, 4096 * world, dt, world)
    inputs = [torch.from_numpy(C.input_values(pattern, r, 0, p.send_count)) for r in range(world)]
    out = _host(_simulate(name, inputs, "sum", 0, world, np.random.default_rng(0))[1]).copy()
    assert _wrong(pattern, p, 1, out) == 0
    if name == "reduce_scatter":
        out = out[::-1].copy()  # a chunk reduced from the wrong offsets
    else:
        chunk = len(out) // world
        out[:chunk], out[chunk:2 * chunk] = out[chunk:2 * chunk].copy(), out[:chunk].copy()
    assert _wrong(pattern, p, 1, out) > len(out) // (2 * world)


def test_unwritten_output_is_wrong():
    dt = C.DTYPES["int32"]
    pattern = C.make_pattern(dt, "sum", 2)
    p = C.plan("allreduce", 4096, dt, 2)
    untouched = np.full(p.recv_count, C.sentinel(dt), dtype=dt.host)
    assert _wrong(pattern, p, 0, untouched) == p.recv_count
    nan = np.full(p.recv_count, C.sentinel(F32), dtype=np.float32)
    assert _wrong(C.make_pattern(F32, "sum", 2), C.plan("allreduce", 4096, F32, 2), 0, nan) == p.recv_count


def test_periodic_matches_modular_indexing():
    values = np.arange(7)
    for start in (0, 3, 7, 20):
        assert np.array_equal(C.periodic(values, start, 30), values[(start + np.arange(30)) % 7])
