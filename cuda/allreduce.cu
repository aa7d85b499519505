// allreduce.cu: one-shot and two-shot allreduce over an array of rank buffer pointers.
//
// Both kernels read peers' buffers directly (NVLink or PCIe peer access, or CUDA IPC
// mappings), as the custom allreduce kernels of vLLM and TensorRT-LLM do. `ins[r]` is
// rank r's buffer as this GPU addresses it; the same code serves all three pointer
// modes of commbench/backends/cuda/sched.py: virtual ranks on one GPU, several GPUs of
// one process, one process per GPU. Only where the pointers come from differs.
// Row blockIdx.y of the grid writes output `outs[y]`, the buffer of rank
// first_rank + y: virtual ranks compute every rank's result in one launch, a process
// that owns one GPU launches one row.
//
// oneshot_allreduce_<dtype>_<op>(ins, outs, world, first_rank, count)
//   Purpose: small-message allreduce in one step: every rank reads every rank's whole
//   buffer and writes the reduction. Latency of one pass; reads (n-1) x S per rank.
//   `outs` must not alias any `ins` the other rows still read: in place, the host
//   writes into a staging buffer and copies it back after every rank has read.
//
// twoshot_reduce_scatter_<dtype>_<op>(ins, outs, world, first_rank, count) and
// twoshot_allgather_<dtype>(ins, outs, world, first_rank, count)
//   Purpose: large-message allreduce in two launches, each rank reading 2 (n-1)/n S:
//   reduce-scatter: rank q reduces segment q of every rank's buffer into segment q of
//   its output; all-gather: rank q copies segment p of rank p's output into its own,
//   for every p != q (a copy: one kernel per dtype, no operator). Segment p of
//   a rank is written only by that rank in the first launch and only read by others
//   in the second, so two-shot runs in place (outs == ins) without staging. The host
//   puts a barrier between the launches (a launch boundary on one GPU, events across
//   GPUs, rank_barrier across processes). Segments are commbench.schedule.split(count,
//   world), the cut of the schedule `twoshot` in commbench/backends/cuda/plan.py.
//
// Optimisations: cb::reduce_span (16-byte loads, UNROLL in flight, paired fp16/bf16
// arithmetic); every thread of a block reads the same n input pointers, which stay
// in L1.
#include "common.cuh"

__device__ __forceinline__ void segment(long long count, int world, int p, long long* start, long long* stop) {
  long long base = count / world, extra = count % world;
  *start = p * base + (p < extra ? p : extra);
  *stop = *start + base + (p < extra ? 1 : 0);
}

template <typename T, typename Op>
__device__ __forceinline__ void oneshot(const T* const* ins, T* const* outs, int world, long long count) {
  T* out = outs[blockIdx.y];
  long long begin, end;
  cb::block_span<T>(out, count, gridDim.x, blockIdx.x, &begin, &end);
  cb::reduce_span<T, Op>(out, ins, world, begin, end);
}

template <typename T, typename Op, bool GATHER>
__device__ __forceinline__ void twoshot(const T* const* ins, T* const* outs, int world, int first_rank,
                                        long long count) {
  const int q = first_rank + blockIdx.y;
  T* out = outs[blockIdx.y];
  for (int p = 0; p < world; ++p) {
    if (GATHER == (p == q)) continue;  // reduce-scatter: only my segment; all-gather: every other one
    long long start, stop, begin, end;
    segment(count, world, p, &start, &stop);
    cb::block_span<T>(out + start, stop - start, gridDim.x, blockIdx.x, &begin, &end);
    if (GATHER) {
      const T* src[1] = {ins[p]};
      cb::reduce_span<T, Op>(out, src, 1, start + begin, start + end);
    } else {
      cb::reduce_span<T, Op>(out, ins, world, start + begin, start + end);
    }
  }
}

#define CB_ALLREDUCE(T, NAME, OP, OPTYPE)                                                              \
  extern "C" __global__ void __launch_bounds__(512) oneshot_allreduce_##NAME##_##OP(                    \
      const T* const* ins, T* const* outs, int world, int first_rank, long long count) {               \
    oneshot<T, OPTYPE>(ins, outs, world, count);                                                        \
  }                                                                                                     \
  extern "C" __global__ void __launch_bounds__(512) twoshot_reduce_scatter_##NAME##_##OP(               \
      const T* const* ins, T* const* outs, int world, int first_rank, long long count) {               \
    twoshot<T, OPTYPE, false>(ins, outs, world, first_rank, count);                                     \
  }
CB_FOR_EACH_DTYPE_AND_OP(CB_ALLREDUCE)

#define CB_ALLGATHER(T, NAME, UNUSED)                                                                  \
  extern "C" __global__ void __launch_bounds__(512) twoshot_allgather_##NAME(                           \
      const T* const* ins, T* const* outs, int world, int first_rank, long long count) {               \
    twoshot<T, cb::OpSum, true>(ins, outs, world, first_rank, count);                                   \
  }
CB_FOR_EACH_DTYPE(CB_ALLGATHER, none)
