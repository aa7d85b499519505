// common.cuh: what every commbench kernel shares.
//
// Purpose: element types, reduction operators, 16-byte packs, and the one device
// routine all data movement goes through, `reduce_span`: out[i] = in_0[i] op ... op
// in_{k-1}[i] over a range, where the k inputs may live on this GPU or on peers
// (NVLink/PCIe peer access, CUDA IPC). A copy is the k = 1 case.
//
// Approach and optimisations:
// - 16-byte vector loads and stores (uint4): one instruction moves 4 floats or 8
//   halves, which is what it takes to approach DRAM and NVLink bandwidth. A range
//   whose pointers are not equally misaligned falls back to scalar code (correct,
//   slower); commbench's buffers are 256-byte aligned and every rank's chunk sits at
//   the same offset, so in practice only the first 15 bytes of a piece are scalar.
// - Each thread loads UNROLL packs of an input before reducing them, so it has UNROLL
//   independent 16-byte loads in flight (memory-level parallelism is what hides NVLink
//   latency). The number of inputs is a run-time value, so inputs are visited one
//   after another: whether the compiler overlaps one input's loads with the previous
//   input's arithmetic is up to it, and how much latency this hides is unmeasured.
// - Inputs are read with ld.global.cg (L2 only): the data is streamed once, and L1 is
//   not coherent with writes made by peer GPUs between our launches.
// - fp16 / bf16 are reduced two lanes per instruction (__hadd2, __hmax2, ...), in
//   their own precision, as NCCL does; integer sums and products wrap.
//
// Everything here must compile under NVRTC as well as nvcc: no host headers, only
// cuda_fp16.h / cuda_bf16.h, fixed-width types spelled as built-in types. It also
// compiles on the CPU (g++, COMMBENCH_HOST_BUILD, cuda/host_shim.h), where the tests
// run every kernel body against NumPy: use nothing from CUDA the shim does not supply.
#pragma once

#ifndef COMMBENCH_HOST_BUILD  // the host build (CPU tests) gets these types from cuda/host_shim.h
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

namespace cb {

typedef unsigned long long u64;

constexpr int PACK_BYTES = 16;  // one uint4
constexpr int UNROLL = 4;       // packs in flight per thread and input

// ---------------------------------------------------------------- reduction operators

struct OpSum {
  template <typename T> static __device__ __forceinline__ T apply(T a, T b) { return T(a + b); }
  static __device__ __forceinline__ __half apply(__half a, __half b) { return __hadd(a, b); }
  static __device__ __forceinline__ __half2 apply(__half2 a, __half2 b) { return __hadd2(a, b); }
  static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) { return __hadd(a, b); }
  static __device__ __forceinline__ __nv_bfloat162 apply(__nv_bfloat162 a, __nv_bfloat162 b) { return __hadd2(a, b); }
};

struct OpProd {
  template <typename T> static __device__ __forceinline__ T apply(T a, T b) { return T(a * b); }
  static __device__ __forceinline__ __half apply(__half a, __half b) { return __hmul(a, b); }
  static __device__ __forceinline__ __half2 apply(__half2 a, __half2 b) { return __hmul2(a, b); }
  static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmul(a, b); }
  static __device__ __forceinline__ __nv_bfloat162 apply(__nv_bfloat162 a, __nv_bfloat162 b) { return __hmul2(a, b); }
};

struct OpMax {
  template <typename T> static __device__ __forceinline__ T apply(T a, T b) { return a > b ? a : b; }
  static __device__ __forceinline__ __half apply(__half a, __half b) { return __hmax(a, b); }
  static __device__ __forceinline__ __half2 apply(__half2 a, __half2 b) { return __hmax2(a, b); }
  static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmax(a, b); }
  static __device__ __forceinline__ __nv_bfloat162 apply(__nv_bfloat162 a, __nv_bfloat162 b) { return __hmax2(a, b); }
};

struct OpMin {
  template <typename T> static __device__ __forceinline__ T apply(T a, T b) { return a < b ? a : b; }
  static __device__ __forceinline__ __half apply(__half a, __half b) { return __hmin(a, b); }
  static __device__ __forceinline__ __half2 apply(__half2 a, __half2 b) { return __hmin2(a, b); }
  static __device__ __forceinline__ __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmin(a, b); }
  static __device__ __forceinline__ __nv_bfloat162 apply(__nv_bfloat162 a, __nv_bfloat162 b) { return __hmin2(a, b); }
};

// ---------------------------------------------------------------- 16-byte packs

// Lane type of a pack: two 16-bit floats go through one paired instruction.
template <typename T> struct Lane { typedef T type; };
template <> struct Lane<__half> { typedef __half2 type; };
template <> struct Lane<__nv_bfloat16> { typedef __nv_bfloat162 type; };

template <typename T, typename Op>
__device__ __forceinline__ uint4 reduce_pack(uint4 a, uint4 b) {
  typedef typename Lane<T>::type L;
  constexpr int LANES = PACK_BYTES / sizeof(L);
  L* x = reinterpret_cast<L*>(&a);
  const L* y = reinterpret_cast<const L*>(&b);
#pragma unroll
  for (int i = 0; i < LANES; ++i) x[i] = Op::apply(x[i], y[i]);
  return a;
}

// Scalar loads through L2 only (see the header comment); 16-bit floats by their bits.
template <typename T> __device__ __forceinline__ T load_cg(const T* p) { return __ldcg(p); }
template <> __device__ __forceinline__ __half load_cg(const __half* p) {
  return __ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}
template <> __device__ __forceinline__ __nv_bfloat16 load_cg(const __nv_bfloat16* p) {
  return __ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}

// ---------------------------------------------------------------- spans

// Which elements block `lb` of `n_blocks` handles in a piece of `count` elements whose
// output starts at `out`: block 0 also takes the `lead` elements before the first
// 16-byte boundary, so every other block starts aligned; the rest is cut into equal
// runs of whole packs. commbench/backends/cuda/plan.py mirrors this (block_span).
template <typename T>
__device__ __forceinline__ void block_span(const T* out, long long count, int n_blocks, int lb,
                                           long long* begin, long long* end) {
  constexpr long long E = PACK_BYTES / sizeof(T);
  long long misalign = (long long)(reinterpret_cast<u64>(out) & (PACK_BYTES - 1));
  long long lead = ((PACK_BYTES - misalign) & (PACK_BYTES - 1)) / (long long)sizeof(T);
  if (lead > count) lead = count;
  long long per = (count - lead + n_blocks - 1) / n_blocks;
  per = (per + E - 1) / E * E;
  if (per < E) per = E;
  long long b = lb == 0 ? 0 : lead + (long long)lb * per;
  long long e = lead + (long long)(lb + 1) * per;
  *begin = b < count ? b : count;
  *end = e < count ? e : count;
}

template <typename T, typename Op>
__device__ __forceinline__ void reduce_scalar(T* out, const T* const* ins, int n_in, long long begin, long long end) {
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    T acc = load_cg(ins[0] + i);
    for (int j = 1; j < n_in; ++j) acc = Op::apply(acc, load_cg(ins[j] + i));
    out[i] = acc;
  }
}

// out[i] = ins[0][i] op ... op ins[n_in - 1][i] for i in [begin, end); all threads of the
// block take part. Element pointers; `ins` may point to global or local memory.
// Per pass a thread holds UNROLL packs: it loads them from input 0, then, input by
// input, issues UNROLL loads before the arithmetic that consumes them (n_in is not a
// compile-time constant, so the input loop is not unrolled and the loads in flight are
// UNROLL per thread, not UNROLL x n_in).
template <typename T, typename Op>
__device__ void reduce_span(T* out, const T* const* ins, int n_in, long long begin, long long end) {
  constexpr long long E = PACK_BYTES / sizeof(T);
  if (begin >= end) return;
  long long misalign = (long long)(reinterpret_cast<u64>(out + begin) & (PACK_BYTES - 1));
  long long head = ((PACK_BYTES - misalign) & (PACK_BYTES - 1)) / (long long)sizeof(T);
  if (head > end - begin) head = end - begin;
  long long start = begin + head;
  bool aligned = true;
  for (int j = 0; j < n_in; ++j) aligned = aligned && (reinterpret_cast<u64>(ins[j] + start) & (PACK_BYTES - 1)) == 0;
  if (!aligned) {  // peers at different alignments: correct, not fast
    reduce_scalar<T, Op>(out, ins, n_in, begin, end);
    return;
  }
  long long n_packs = (end - start) / E;
  reduce_scalar<T, Op>(out, ins, n_in, begin, start);
  reduce_scalar<T, Op>(out, ins, n_in, start + n_packs * E, end);
  uint4* out4 = reinterpret_cast<uint4*>(out + start);
  const long long stride = (long long)blockDim.x * UNROLL;
  for (long long base = threadIdx.x; base < n_packs; base += stride) {
    uint4 acc[UNROLL];
    const uint4* in0 = reinterpret_cast<const uint4*>(ins[0] + start);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      long long p = base + (long long)u * blockDim.x;
      if (p < n_packs) acc[u] = __ldcg(in0 + p);
    }
    for (int j = 1; j < n_in; ++j) {
      const uint4* in = reinterpret_cast<const uint4*>(ins[j] + start);
      uint4 data[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {  // this input's loads first, then its arithmetic
        long long p = base + (long long)u * blockDim.x;
        if (p < n_packs) data[u] = __ldcg(in + p);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        long long p = base + (long long)u * blockDim.x;
        if (p < n_packs) acc[u] = reduce_pack<T, Op>(acc[u], data[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      long long p = base + (long long)u * blockDim.x;
      if (p < n_packs) __stcg(out4 + p, acc[u]);
    }
  }
}

}  // namespace cb

// ---------------------------------------------------------------- instantiation tables
// Kernels are extern "C" wrappers named <kernel>_<dtype>_<op>, so that NVRTC needs no
// name expressions and `nvcc -ptx` compiles (and so checks) every instantiation.
// The dtype names are commbench's (commbench/collectives.py).

#define CB_FOR_EACH_DTYPE(X, ...)          \
  X(float, float32, __VA_ARGS__)           \
  X(__half, float16, __VA_ARGS__)          \
  X(__nv_bfloat16, bfloat16, __VA_ARGS__)  \
  X(double, float64, __VA_ARGS__)          \
  X(int, int32, __VA_ARGS__)               \
  X(signed char, int8, __VA_ARGS__)        \
  X(unsigned char, uint8, __VA_ARGS__)     \
  X(long long, int64, __VA_ARGS__)

#define CB_FOR_EACH_FLOAT(X, ...)          \
  X(float, float32, __VA_ARGS__)           \
  X(__half, float16, __VA_ARGS__)          \
  X(__nv_bfloat16, bfloat16, __VA_ARGS__)  \
  X(double, float64, __VA_ARGS__)

#define CB_FOR_EACH_DTYPE_AND_OP(X)  \
  CB_FOR_EACH_DTYPE(X, sum, cb::OpSum)    \
  CB_FOR_EACH_DTYPE(X, prod, cb::OpProd)  \
  CB_FOR_EACH_DTYPE(X, max, cb::OpMax)    \
  CB_FOR_EACH_DTYPE(X, min, cb::OpMin)
