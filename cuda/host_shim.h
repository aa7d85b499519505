// host_shim.h: what the kernels in cuda/ take from CUDA, for a host build on the CPU.
//
// Purpose: run the kernels' own code (index arithmetic, 16-byte pack paths and their
// scalar fallbacks, tails, UNROLL bounds, paired fp16/bf16 lanes, op templates) on a
// machine without a GPU, against NumPy (tests/unit/backends/cuda/test_host.py, `commbench selftest`).
// The GPU build never sees this file: commbench/backends/cuda/host.py compiles each .cu
// with the system C++ compiler and `-DCOMMBENCH_HOST_BUILD -include host_shim.h`;
// common.cuh includes cuda_fp16.h / cuda_bf16.h only without that macro, and
// schedule_round.cu picks the host equivalents of its inline PTX under it.
//
// Approach:
// - __global__, __device__, __forceinline__, __launch_bounds__ vanish; a kernel is a plain
//   extern "C" function. threadIdx, blockIdx, blockDim, gridDim are thread_local, set by
//   the launcher (cb_host::launch) before it calls the kernel once per (block, thread).
// - A launch runs the grid's blocks one after another (forward or reversed: no launch may
//   depend on the order of its blocks), and the threads of a block one after another,
//   except for kernels that need the threads of a block together (__syncthreads, shared
//   memory: rank_barrier), whose threads run as real threads (`threaded`) with a barrier
//   that counts exited threads out. __shared__ is `static`: a threaded launch has one
//   block, and one launch at a time per copy of the library (a test that runs several
//   barriers at once loads one copy per rank).
// - __half, __nv_bfloat16 and their pairs hold bits; arithmetic is done in float and
//   rounded once to nearest even, which is exactly the correctly rounded 16-bit result
//   (float has more than 2p + 2 bits for p = 11 and 8), as sm_53+ (fp16) and sm_80+
//   (bf16) compute it. They have no operators: a template that used `+` on them would
//   not compile here, as it would not mean the same thing there.
// - __ldcg / __stcg fault on a misaligned address (the GPU raises "misaligned address"
//   where x86 would silently cope) and, when the caller registered its allocations
//   (cb_host_set_bounds), on an address outside them. A fault stops the launch with an
//   exception; the launcher returns non-zero and cb_host_last_error() says why.
// - ld.acquire.sys / st.release.sys / %globaltimer become __atomic loads and stores and
//   steady_clock; a spinning acquire load yields the CPU (the host has fewer cores than
//   spinning threads). This checks the barrier's logic, not the GPU's memory ordering.
// Integer overflow wraps as on the GPU because the host build compiles with -fwrapv,
// and reinterpret_cast between packs and lanes is kept by -fno-strict-aliasing.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static

struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };

inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

// ---------------------------------------------------------------- 16-bit floats

struct __half { unsigned short bits; };
struct alignas(4) __half2 { __half x, y; };
struct __nv_bfloat16 { unsigned short bits; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };

namespace cb_host {

inline float float_of_bits(unsigned int bits) { float f; std::memcpy(&f, &bits, 4); return f; }
inline unsigned int bits_of_float(float f) { unsigned int bits; std::memcpy(&bits, &f, 4); return bits; }

inline float half_to_float(unsigned short h) {
  unsigned int sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return float_of_bits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in float
    float magnitude = (float)mantissa * float_of_bits(0x33800000u);
    return sign ? -magnitude : magnitude;
  }
  return float_of_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// float -> half, round to nearest even, overflow to inf, NaN kept quiet.
inline unsigned short float_to_half(float f) {
  unsigned int x = bits_of_float(f), sign = (x >> 16) & 0x8000u, magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return (unsigned short)(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  if (magnitude >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520: rounds to inf
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), in units of 2^-24
    unsigned int shift = 126 - (magnitude >> 23);  // 14..., value = m x 2^(e-150)
    if (shift > 24) return (unsigned short)sign;  // below 2^-25: zero (2^-25 itself is a tie to even: zero)
    unsigned int mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    unsigned int kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    kept += (rest > half || (rest == half && (kept & 1u))) ? 1u : 0u;
    return (unsigned short)(sign | kept);
  }
  unsigned int rebased = magnitude - 0x38000000u;  // exponent - 112, still 23 mantissa bits
  unsigned int kept = rebased >> 13, rest = rebased & 0x1fffu;
  kept += (rest > 0x1000u || (rest == 0x1000u && (kept & 1u))) ? 1u : 0u;
  return (unsigned short)(sign | kept);
}

inline float bf16_to_float(unsigned short b) { return float_of_bits((unsigned int)b << 16); }

inline unsigned short float_to_bf16(float f) {
  unsigned int x = bits_of_float(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);  // NaN stays NaN
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// CUDA's __hmax / __hmin: a NaN input yields the other input; +0 is larger than -0.
inline float fmax_cuda(float a, float b) {
  if (a != a) return b;
  if (b != b) return a;
  if (a == 0.0f && b == 0.0f) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}
inline float fmin_cuda(float a, float b) {
  if (a != a) return b;
  if (b != b) return a;
  if (a == 0.0f && b == 0.0f) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

}  // namespace cb_host

inline float __half2float(__half h) { return cb_host::half_to_float(h.bits); }
inline __half __float2half_rn(float f) { return __half{cb_host::float_to_half(f)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return cb_host::bf16_to_float(b.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{cb_host::float_to_bf16(f)}; }
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }

#define CB_HOST_HALF_OPS(H, H2, TO_FLOAT, FROM_FLOAT)                                                  \
  inline H __hadd(H a, H b) { return FROM_FLOAT(TO_FLOAT(a) + TO_FLOAT(b)); }                          \
  inline H __hmul(H a, H b) { return FROM_FLOAT(TO_FLOAT(a) * TO_FLOAT(b)); }                          \
  inline H __hmax(H a, H b) { return FROM_FLOAT(cb_host::fmax_cuda(TO_FLOAT(a), TO_FLOAT(b))); }      \
  inline H __hmin(H a, H b) { return FROM_FLOAT(cb_host::fmin_cuda(TO_FLOAT(a), TO_FLOAT(b))); }      \
  inline H2 __hadd2(H2 a, H2 b) { return H2{__hadd(a.x, b.x), __hadd(a.y, b.y)}; }                    \
  inline H2 __hmul2(H2 a, H2 b) { return H2{__hmul(a.x, b.x), __hmul(a.y, b.y)}; }                    \
  inline H2 __hmax2(H2 a, H2 b) { return H2{__hmax(a.x, b.x), __hmax(a.y, b.y)}; }                    \
  inline H2 __hmin2(H2 a, H2 b) { return H2{__hmin(a.x, b.x), __hmin(a.y, b.y)}; }
CB_HOST_HALF_OPS(__half, __half2, __half2float, __float2half_rn)
CB_HOST_HALF_OPS(__nv_bfloat16, __nv_bfloat162, __bfloat162float, __float2bfloat16_rn)

// ---------------------------------------------------------------- faults and memory checks

namespace cb_host {

struct Fault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline std::mutex& fault_mutex() { static std::mutex m; return m; }
inline std::string& last_error() { static std::string text; return text; }
inline std::vector<std::pair<std::uintptr_t, std::uintptr_t>>& bounds() {  // [begin, end) the caller owns
  static std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  return ranges;
}

[[noreturn]] inline void fault(const char* what, const void* address, std::size_t bytes) {
  char text[256];
  std::snprintf(text, sizeof text, "%s: %zu bytes at %p (block %u,%u thread %u)", what, bytes, address,
                blockIdx.x, blockIdx.y, threadIdx.x);
  throw Fault(text);
}

inline void check_access(const void* p, std::size_t bytes, std::size_t align) {
  std::uintptr_t address = reinterpret_cast<std::uintptr_t>(p);
  if (address % align != 0) fault("misaligned address", p, bytes);
  const auto& ranges = bounds();
  if (ranges.empty()) return;
  for (const auto& r : ranges)
    if (address >= r.first && address + bytes <= r.second) return;
  fault("access outside every allocation", p, bytes);
}

template <typename T> inline T load(const T* p) {
  check_access(p, sizeof(T), alignof(T));
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

template <typename T> inline void store(T* p, const T& value) {
  check_access(p, sizeof(T), alignof(T));
  std::memcpy(p, &value, sizeof(T));
}

// ---------------------------------------------------------------- block barrier, launches

// __syncthreads for the threads of one block run as real threads; a thread that returns
// leaves the count, as an exited GPU thread no longer holds the others back.
class BlockBarrier {
 public:
  explicit BlockBarrier(unsigned int threads) : live_(threads) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    unsigned long long generation = generation_;
    if (++arrived_ == live_) release();
    else changed_.wait(lock, [&] { return generation_ != generation; });
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    --live_;
    if (live_ > 0 && arrived_ == live_) release();
  }

 private:
  void release() { arrived_ = 0; ++generation_; changed_.notify_all(); }
  std::mutex mutex_;
  std::condition_variable changed_;
  unsigned int live_, arrived_ = 0;
  unsigned long long generation_ = 0;
};

inline thread_local BlockBarrier* block_barrier = nullptr;

struct Shape {  // what a launch passes from Python (commbench/backends/cuda/host.py builds it)
  unsigned int grid[3], block[3];
  int threaded;  // the block's threads as real threads (kernels with __syncthreads)
  int reverse;   // blocks in reverse order
};

template <typename Body>
void run_block(const Shape& s, uint3 block, Body&& body) {
  const unsigned int threads = s.block[0] * s.block[1] * s.block[2];
  auto enter = [&](unsigned int t) {
    blockIdx = block;
    gridDim = dim3{s.grid[0], s.grid[1], s.grid[2]};
    blockDim = dim3{s.block[0], s.block[1], s.block[2]};
    threadIdx = uint3{t % s.block[0], t / s.block[0] % s.block[1], t / (s.block[0] * s.block[1])};
  };
  if (!s.threaded) {
    for (unsigned int t = 0; t < threads; ++t) {
      enter(t);
      body();
    }
    return;
  }
  BlockBarrier barrier(threads);
  std::vector<std::thread> pool;
  std::vector<std::string> errors(threads);
  for (unsigned int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      enter(t);
      block_barrier = &barrier;
      try {
        body();
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
      block_barrier = nullptr;
      barrier.leave();
    });
  }
  for (auto& thread : pool) thread.join();
  for (const auto& e : errors)
    if (!e.empty()) throw Fault(e);
}

template <typename... P, std::size_t... I>
void call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}

// Runs every (block, thread) of the grid; 0, or 1 with cb_host_last_error() set.
template <typename... P>
int launch(void (*kernel)(P...), const Shape* s, void** args) {
  try {
    const long long blocks = (long long)s->grid[0] * s->grid[1] * s->grid[2];
    for (long long i = 0; i < blocks; ++i) {
      long long b = s->reverse ? blocks - 1 - i : i;
      uint3 block{(unsigned int)(b % s->grid[0]), (unsigned int)(b / s->grid[0] % s->grid[1]),
                  (unsigned int)(b / ((long long)s->grid[0] * s->grid[1]))};
      run_block(*s, block, [&] { call(kernel, args, std::index_sequence_for<P...>{}); });
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(fault_mutex());
    last_error() = e.what();
    return 1;
  }
  return 0;
}

// The kernel's parameter list as letters (p pointer, i int, q long long, Q unsigned long
// long, f float, d double), so that Python passes exactly the bytes the kernel reads.
template <typename T> constexpr char letter() {
  if (std::is_pointer<T>::value) return 'p';
  if (std::is_same<T, float>::value) return 'f';
  if (std::is_same<T, double>::value) return 'd';
  if (std::is_integral<T>::value && sizeof(T) == 4) return std::is_signed<T>::value ? 'i' : 'I';
  if (std::is_integral<T>::value && sizeof(T) == 8) return std::is_signed<T>::value ? 'q' : 'Q';
  return '?';
}

template <typename... P> const char* signature(void (*)(P...)) {
  static const char text[] = {letter<std::remove_cv_t<P>>()..., '\0'};
  return text;
}

inline void sync_threads() {
  if (block_barrier == nullptr) throw Fault("__syncthreads in a launch whose threads run one by one (launch it threaded)");
  block_barrier->wait();
}

inline unsigned long long global_timer_ns() {
  return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline void store_release_sys(unsigned long long* p, unsigned long long v) {
  check_access(p, sizeof v, alignof(unsigned long long));
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

inline unsigned long long load_acquire_sys(const unsigned long long* p) {
  check_access(p, sizeof(unsigned long long), alignof(unsigned long long));
  std::this_thread::yield();  // spinning threads outnumber the host's cores
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

}  // namespace cb_host

// ---------------------------------------------------------------- the CUDA names the kernels use

template <typename T> inline T __ldcg(const T* p) { return cb_host::load(p); }
template <typename T> inline void __stcg(T* p, T value) { cb_host::store(p, value); }
inline void __syncthreads() { cb_host::sync_threads(); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline int atomicCAS(int* address, int compare, int value) {
  __atomic_compare_exchange_n(address, &compare, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;  // the old value, as CUDA's atomicCAS returns
}

// The library's own entry points, defined in one translation unit (backends/cuda/host.py compiles
// an empty one with CB_HOST_DEFINE_RUNTIME).
#ifdef CB_HOST_DEFINE_RUNTIME
extern "C" const char* cb_host_last_error() { return cb_host::last_error().c_str(); }
// Every later __ldcg / __stcg / acquire / release must fall inside one of these n ranges
// [ranges[2i], ranges[2i + 1]); n = 0 turns the check off.
extern "C" void cb_host_set_bounds(const unsigned long long* ranges, int n) {
  auto& b = cb_host::bounds();
  b.clear();
  for (int i = 0; i < n; ++i) b.emplace_back((std::uintptr_t)ranges[2 * i], (std::uintptr_t)ranges[2 * i + 1]);
}
#endif

// One exported launcher and signature per kernel, after the kernel's definition.
#define CB_HOST_EXPORT(kernel)                                                                           \
  extern "C" int cb_host_launch_##kernel(const cb_host::Shape* shape, void** args) {                    \
    return cb_host::launch(kernel, shape, args);                                                         \
  }                                                                                                      \
  extern "C" const char* cb_host_signature_##kernel() { return cb_host::signature(kernel); }
