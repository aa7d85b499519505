// reduce_copy.cu: the vectorised reduce-copy, and the element-wise helpers around it.
//
// reduce_copy_<dtype>_<op>(out, a, b, count)
//   Purpose: out = a op b, element-wise: the step every reduction algorithm repeats
//   (a ring's reduce-scatter step is "my chunk op the chunk my peer holds"). `a`, `b`
//   and `out` may be on this GPU or on a peer (peer access or CUDA IPC); `out` may
//   alias `a` (in place).
//   Approach: a grid of blocks, each taking one contiguous, 16-byte aligned run of the
//   range (cb::block_span), reduced by cb::reduce_span with 16-byte loads, UNROLL packs
//   in flight per thread, 16-bit floats two lanes per instruction (common.cuh).
//   It is also the kernel whose bandwidth docs/gpu.md compares with a device-to-device
//   copy: reading two buffers and writing one moves 3 x count x sizeof(T) bytes.
//   Use: commbench/backends/cuda/kernels.py (`reduce_copy`), and the GPU tests.
//
// scale_<dtype>(data, count, factor)
//   Purpose: data *= factor, for avg, which commbench runs as sum and then this scale
//   by 1/n. Computed in float (double for float64) and rounded once. NCCL differs:
//   for floats it multiplies every input by 1/n before summing, so a float16 sum that
//   overflows 65504 here may not there, and the roundings differ.
//
// One block per 16-byte aligned run; grid-stride is unnecessary because the host
// sizes the grid (commbench/backends/cuda/plan.py: LaunchConfig.blocks_for) from the byte count.
#include "common.cuh"

template <typename T, typename Op>
__device__ __forceinline__ void reduce_copy(T* out, const T* a, const T* b, long long count) {
  const T* ins[2] = {a, b};
  long long begin, end;
  cb::block_span<T>(out, count, gridDim.x, blockIdx.x, &begin, &end);
  cb::reduce_span<T, Op>(out, ins, 2, begin, end);
}

#define CB_REDUCE_COPY(T, NAME, OP, OPTYPE)                                                       \
  extern "C" __global__ void __launch_bounds__(512)                                                \
      reduce_copy_##NAME##_##OP(T* out, const T* a, const T* b, long long count) {                 \
    reduce_copy<T, OPTYPE>(out, a, b, count);                                                      \
  }
CB_FOR_EACH_DTYPE_AND_OP(CB_REDUCE_COPY)

template <typename T, typename F>
__device__ __forceinline__ void scale(T* data, long long count, F factor) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = T(F(data[i]) * factor);
  }
}

extern "C" __global__ void scale_float32(float* data, long long count, float factor) { scale(data, count, factor); }
extern "C" __global__ void scale_float64(double* data, long long count, double factor) { scale(data, count, factor); }
extern "C" __global__ void scale_float16(__half* data, long long count, float factor) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = __float2half_rn(__half2float(data[i]) * factor);
  }
}
extern "C" __global__ void scale_bfloat16(__nv_bfloat16* data, long long count, float factor) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = __float2bfloat16_rn(__bfloat162float(data[i]) * factor);
  }
}
