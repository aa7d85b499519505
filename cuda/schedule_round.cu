// schedule_round.cu: one round of a commbench Schedule as one kernel launch, and the
// barrier between rounds across processes.
//
// schedule_round_<dtype>_<op>(entries, n_entries, inputs)
//   Purpose: execute every transfer of one round (commbench/schedule.py) that this
//   launch owns, concurrently, in one launch. The host (commbench/backends/cuda/plan.py, plan_round) has
//   already turned the round's transfers into entries: each entry is one output range
//   and the k input ranges reduced into it (a copy is k = 1; transfers that reduce
//   into the same elements are fused, so the output is written once, not k - 1 times;
//   overlapping ranges are cut into pieces first). Entries whose output another
//   transfer of the round still reads (one-shot in place) write to a staging buffer,
//   copied back by a second launch after a barrier.
//   Approach: entry e owns blocks [first_block, first_block + n_blocks) of the grid, in
//   proportion to its bytes (plan.assign_blocks). A block finds its entry by
//   binary search over first_block (a round has at most a few hundred entries; the
//   table stays in L1), takes its span of the entry (cb::block_span) and runs
//   cb::reduce_span over it: 16-byte loads, UNROLL packs in flight per thread.
//   `inputs` holds every entry's input pointers back to back (entry.in_offset).
//   Use: commbench/backends/cuda/sched.py, in all three pointer modes.
//
// rank_barrier(peer_flags, my_flags, my_epoch, rank, world, timeout_ns, error)
//   Purpose: all ranks (one process per GPU, CUDA IPC) reach this point of their
//   streams before any goes on: between rounds, so that no rank reads a chunk before
//   its owner has written it, or overwrites one a peer still reads.
//   Approach: one block of >= world threads. Thread p stores the new epoch into slot
//   `rank` of peer p's flag array (st.release.sys, after __threadfence_system so this
//   GPU's earlier writes are visible first), then spins on slot p of its own array
//   (ld.acquire.sys) until peer p has arrived. The epoch lives in device memory and is
//   advanced by the kernel itself, so the launch has no changing argument and can be
//   captured in a CUDA graph. A spin that outlasts timeout_ns (%globaltimer) records
//   the missing peer in *error and gives up; the other threads see *error (volatile,
//   re-read every spin) and stop too, and every later barrier returns at once while
//   *error is set, so the calls already queued (up to 1000 per timed loop) finish in
//   one timeout, not one per barrier. The host checks *error after synchronising.
//   The acquire/release PTX needs sm_70 or newer (backends/cuda/kernels.py MIN_ARCH).
#include "common.cuh"

struct RoundEntry {  // 32 bytes; commbench/backends/cuda/plan.py ENTRY_DTYPE mirrors it
  unsigned long long out;
  long long count;
  int in_offset;
  int n_in;
  int first_block;
  int n_blocks;
};
static_assert(sizeof(RoundEntry) == 32, "RoundEntry layout is shared with backends/cuda/plan.py ENTRY_DTYPE");

template <typename T, typename Op>
__device__ __forceinline__ void schedule_round(const RoundEntry* entries, int n_entries,
                                               const unsigned long long* inputs) {
  int lo = 0, hi = n_entries - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (entries[mid].first_block <= (int)blockIdx.x) lo = mid; else hi = mid - 1;
  }
  const RoundEntry e = entries[lo];
  T* out = reinterpret_cast<T*>(e.out);
  long long begin, end;
  cb::block_span<T>(out, e.count, e.n_blocks, (int)blockIdx.x - e.first_block, &begin, &end);
  cb::reduce_span<T, Op>(out, reinterpret_cast<const T* const*>(inputs + e.in_offset), e.n_in, begin, end);
}

#define CB_ROUND(T, NAME, OP, OPTYPE)                                                                  \
  extern "C" __global__ void __launch_bounds__(512) schedule_round_##NAME##_##OP(                       \
      const RoundEntry* entries, int n_entries, const unsigned long long* inputs) {                     \
    schedule_round<T, OPTYPE>(entries, n_entries, inputs);                                              \
  }
CB_FOR_EACH_DTYPE_AND_OP(CB_ROUND)

#ifndef COMMBENCH_HOST_BUILD
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void store_release_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ unsigned long long load_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
#else  // the CPU tests: steady_clock and __atomic acquire/release (cuda/host_shim.h)
using cb_host::global_timer_ns;
using cb_host::load_acquire_sys;
using cb_host::store_release_sys;
#endif

extern "C" __global__ void rank_barrier(unsigned long long* const* peer_flags, unsigned long long* my_flags,
                                        unsigned long long* my_epoch, int rank, int world,
                                        unsigned long long timeout_ns, int* error) {
  __shared__ unsigned long long epoch;
  __shared__ int failed;
  volatile int* error_word = error;  // re-read on every spin: another thread may have given up
  if (threadIdx.x == 0) {
    epoch = *my_epoch + 1;
    failed = *error_word;
  }
  __syncthreads();
  if (failed) return;  // an earlier barrier timed out: the run is over, the queued calls drain at once
  const int p = threadIdx.x;
  if (p < world) {
    __threadfence_system();
    store_release_sys(peer_flags[p] + rank, epoch);
    const unsigned long long started = global_timer_ns();
    while (load_acquire_sys(my_flags + p) < epoch) {
      if (*error_word != 0) break;  // a peer of this barrier is missing: stop waiting for the others
      if (global_timer_ns() - started > timeout_ns) {
        atomicCAS(error, 0, p + 1);  // the first peer found missing, + 1 (0 means no error)
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *my_epoch = epoch;
}
