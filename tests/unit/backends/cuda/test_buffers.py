"""commbench/backends/cuda/buffers.py: a buffer's address on each rank, without a GPU."""
from commbench.backends.cuda.buffers import Allocation, GpuBuffer
from commbench.collectives import DTYPES


def test_a_buffer_points_at_its_offset_in_each_ranks_allocation():
    alloc = Allocation(seq=3, bases={0: 0x7000_0000, 1: 0x9000_0000})
    half = GpuBuffer(arrays={}, alloc=alloc, offsets={0: 0, 1: 10}, count=5, dtype=DTYPES["bfloat16"])
    assert half.pointer(0) == 0x7000_0000 and half.pointer(1) == 0x9000_0000 + 10 * 2
    double = GpuBuffer(arrays={}, alloc=alloc, offsets={0: 7, 1: 7}, count=1, dtype=DTYPES["float64"])
    assert double.pointer(1) - double.pointer(0) == 0x2000_0000 and double.pointer(0) == 0x7000_0000 + 56
    assert Allocation(seq=0).bases == {} and Allocation(seq=1).bases is not Allocation(seq=2).bases
