/* shm_native.c: the shm backend's per-call path in C (commbench/backends/shm/native.py builds and loads it).

Purpose: one allreduce (any schedule) on the shm backend as ONE call from Python. The Python executor
(executor.py) calls one NumPy function per pull and runs each barrier in Python: ~0.15 us per barrier and
~0.2-0.4 us per NumPy call of fixed cost, ~0.75 us per 1 KiB one-shot call before any waiting. Here
the same pre-built list of operations (barriers, copies, reductions over the same views, in the same
order) runs in a C loop, so a 1 KiB call costs one ctypes call plus the bytes.

Approach:
- An operation is a barrier, a copy (out = a) or a reduction (out = a op b, elementwise: the same
  arithmetic as NumPy's ufunc with the same operands, so sums are bitwise identical to the Python
  executor's; integers wrap as NumPy's do: computed as unsigned).
- A barrier is waits.py's protocol on the same control segment: my counter is my epoch; bump it
  (a release store), wake futex waiters if some rank raised its flag, then wait until every peer's
  counter has reached the epoch. The wait spins (pause) for `spin_ns`; if the peer is still not
  there the call returns the index of the barrier, and Python blocks (futex), checks for a dead peer and the timeout, and resumes here.
  The spin adapts: doubled here (up to the budget) by a wait that ended while spinning; after a
  wait that blocked, Python doubles it if the whole wait fit in the budget and halves it (down
  to `spin_floor_ns`) if not (native.py `blocked` says why).
- Copies marked `stream` (the ranks' buffers together do not fit in the last-level cache) of at
  least `nt_bytes` use non-temporal stores: no read for ownership of lines that would only be
  evicted again. Where the buffers fit, the result stays in the cache for the next call. An sfence
  before every barrier makes the stores visible before the counter moves.
- A push is a copy into a peer's buffer (schedule.pushed_ahead). A reduce followed by the push of its
  result is one operation (`out2`, fused by native.py): each block is reduced in L1 and stored to
  both buffers, streaming as a copy would. The block's size, which outputs stream (in place and out of
  place apart) and a prefetch distance are context fields the planner measures per machine (plan.py).
Use: cb_shm_run(ops, count, start, resumed, ctx) -> -1 when the call is done, else the index of
the barrier at which it stopped waiting (call again with start = that index, resumed = 1).
*/
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>

#define NS_PER_CHECK 100  /* native.py's: a Python check of a counter, the unit of waits.py's budgets */
enum { OP_BARRIER = 0, OP_COPY = 1, OP_REDUCE = 2, OP_SKIP = 3 };
#define FUSED_BLOCK 8192  /* default bytes a fused reduce-and-push computes at a time (in L1) before storing it */
#define FUSED_BLOCK_MAX 65536  /* the largest block the planner may choose (the buffer lives on the stack) */
enum { STORE_OUT = 1, STORE_PUSH = 2 };  /* fused_nt bits: which of a fused op's two outputs stream */
enum { RED_SUM = 0, RED_PROD = 1, RED_MAX = 2, RED_MIN = 3 };
enum { T_F32 = 0, T_F64 = 1, T_I8 = 2, T_U8 = 3, T_I32 = 4, T_I64 = 5 };

typedef struct {
    int32_t kind, dtype, reduction, stream;  /* stream: a copy (or reduce with out2) of at least nt_bytes uses
                                                non-temporal stores */
    void *out, *out2;  /* out2: a reduce also pushes its result there (a peer's buffer), in the same pass */
    const void *a, *b;
    int64_t count;  /* elements */
} cb_op;

typedef struct {
    volatile int64_t *counters;      /* the control segment: one int64 counter per member, LINE apart */
    volatile uint64_t *flags;        /* the flag words (a byte per member: it blocks in the kernel) */
    const int64_t *peers;            /* the peers' counter indices */
    int64_t npeers, mine, flag_words;
    int64_t spin_ns, spin_budget_ns, spin_floor_ns;
    int64_t nt_bytes;                /* streaming copies from this size use non-temporal stores */
    int64_t waiting_index, waiting_epoch;  /* out: where a stopped barrier waits */
    /* The planner's knobs (plan.py; 0 = the built-in default, so a zeroed context runs as before): */
    int64_t fused_block;             /* bytes a fused reduce-and-push computes at a time (FUSED_BLOCK) */
    int64_t prefetch_bytes;          /* software prefetch of a fused op's inputs this far ahead (0: none) */
    int64_t fused_nt;                /* 1 + STORE_* bits: which streaming outputs use non-temporal stores
                                        (0: both, as 1 + STORE_OUT + STORE_PUSH) */
    int64_t fused_nt_in_place;       /* the same where the op reduces in place (out == a; 0: as fused_nt) */
} cb_ctx;

static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t load(volatile int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* Wait for counters[index] >= epoch: spin; 0 if it did not arrive within the budget. */
static int wait_for(cb_ctx *c, int64_t index, int64_t epoch, int *spun) {
    volatile int64_t *word = &c->counters[index];
    if (load(word) >= epoch) return 1;
    *spun = 1;
    int64_t start = now_ns();
    for (int64_t checks = 1;; checks++) {
        _mm_pause();
        if (load(word) >= epoch) return 1;
        if ((checks & 63) == 0 && now_ns() - start > c->spin_ns) break;
    }
    /* No sched_yield phase: with other processes runnable a yield hands the core away for a
       whole time slice (ms), where a rank that blocks is woken by its peer's arrival and, having
       slept, is scheduled at once. */
    return 0;
}

static int barrier(cb_ctx *c, int resumed) {
    volatile int64_t *mine = &c->counters[c->mine];
    int64_t epoch;
    if (resumed) {
        epoch = load(mine);
    } else {
        _mm_sfence();  /* non-temporal stores of this call before the counter */
        epoch = load(mine) + 1;
        /* seq_cst: the flags below are read after the counter is visible, or a peer that raised its flag
           and read the old counter would sleep until its timeout without this wake-up */
        __atomic_store_n(mine, epoch, __ATOMIC_SEQ_CST);
        for (int64_t w = 0; w < c->flag_words; w++) {
            if (c->flags[w]) {
                syscall(SYS_futex, (void *)mine, 1 /* FUTEX_WAKE, shared */, INT_MAX, NULL, NULL, 0);
                break;
            }
        }
    }
    int spun = 0;
    for (int64_t p = 0; p < c->npeers; p++) {
        if (!wait_for(c, c->peers[p], epoch, &spun)) {
            c->waiting_index = c->peers[p];
            c->waiting_epoch = epoch;
            return 0;
        }
    }
    if (spun && c->spin_ns < c->spin_budget_ns) {
        c->spin_ns = c->spin_ns * 2 < c->spin_budget_ns ? c->spin_ns * 2 : c->spin_budget_ns;
    }
    return 1;
}

static void copy_bytes(void *out, const void *a, int64_t nbytes, int64_t nt_bytes) {
    if (out == a || nbytes <= 0) return;
    /* Streams only from 64 bytes (a fused reduce's last block can be shorter than the head to the first
       32-byte line: streaming it would write past its end) and where both sides sit alike on a line. */
    if (nbytes < nt_bytes || nbytes < 64 || ((uintptr_t)out & 31) != ((uintptr_t)a & 31)) {
        memmove(out, a, (size_t)nbytes);
        return;
    }
    char *o = (char *)out;
    const char *s = (const char *)a;
    int64_t head = (int64_t)((32 - ((uintptr_t)o & 31)) & 31);
    memcpy(o, s, (size_t)head);
    int64_t i = head;
    for (; i + 128 <= nbytes; i += 128) {
#ifdef __AVX__
        __m256i x0 = _mm256_load_si256((const __m256i *)(s + i));
        __m256i x1 = _mm256_load_si256((const __m256i *)(s + i + 32));
        __m256i x2 = _mm256_load_si256((const __m256i *)(s + i + 64));
        __m256i x3 = _mm256_load_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(o + i), x0);
        _mm256_stream_si256((__m256i *)(o + i + 32), x1);
        _mm256_stream_si256((__m256i *)(o + i + 64), x2);
        _mm256_stream_si256((__m256i *)(o + i + 96), x3);
#else  /* x86-64 without AVX: SSE2's 16-byte streaming stores (every x86-64 has them) */
        for (int k = 0; k < 128; k += 16)
            _mm_stream_si128((__m128i *)(o + i + k), _mm_load_si128((const __m128i *)(s + i + k)));
#endif
    }
    memcpy(o + i, s + i, (size_t)(nbytes - i));
}

/* out = a op b elementwise. Floats: IEEE as NumPy (max/min propagate NaN, as np.maximum/minimum, and
   give the second operand when the two are equal, as they do: max(-0.0, +0.0) is +0.0);
   integers: sum and product computed unsigned (they wrap as NumPy's do, no undefined overflow). */
#define FLOAT_LOOPS(T)                                                                       \
    switch (red) {                                                                           \
    case RED_SUM: for (i = 0; i < n; i++) o[i] = x[i] + y[i]; break;                        \
    case RED_PROD: for (i = 0; i < n; i++) o[i] = x[i] * y[i]; break;                       \
    case RED_MAX: for (i = 0; i < n; i++) { T p = x[i], q = y[i];                           \
        o[i] = (p > q || p != p) ? p : q; } break;                                           \
    default: for (i = 0; i < n; i++) { T p = x[i], q = y[i];                                \
        o[i] = (p < q || p != p) ? p : q; } break;                                           \
    }
#define INT_LOOPS(T, U)                                                                      \
    switch (red) {                                                                           \
    case RED_SUM: for (i = 0; i < n; i++) o[i] = (T)((U)x[i] + (U)y[i]); break;             \
    case RED_PROD: for (i = 0; i < n; i++) o[i] = (T)((U)x[i] * (U)y[i]); break;            \
    case RED_MAX: for (i = 0; i < n; i++) o[i] = x[i] >= y[i] ? x[i] : y[i]; break;         \
    default: for (i = 0; i < n; i++) o[i] = x[i] <= y[i] ? x[i] : y[i]; break;              \
    }
#define TYPED(T, LOOPS) { T *o = (T *)op->out; const T *x = (const T *)op->a, *y = (const T *)op->b; LOOPS; }

static void reduce(const cb_op *op) {
    int64_t i, n = op->count;
    int red = op->reduction;
    switch (op->dtype) {
    case T_F32: TYPED(float, FLOAT_LOOPS(float)) break;
    case T_F64: TYPED(double, FLOAT_LOOPS(double)) break;
    case T_I8: TYPED(int8_t, INT_LOOPS(int8_t, uint8_t)) break;
    case T_U8: TYPED(uint8_t, INT_LOOPS(uint8_t, uint32_t)) break;
    case T_I32: TYPED(int32_t, INT_LOOPS(int32_t, uint32_t)) break;
    default: TYPED(int64_t, INT_LOOPS(int64_t, uint64_t)) break;
    }
}

static const int64_t ITEMSIZE[] = {4, 8, 1, 1, 4, 8};

/* out = out2 = a op b in one pass: each block is reduced into a buffer in L1 (aligned as `out` is, so the
   stores can stream), then stored to both: the inputs are read once and the outputs written once (a
   reduce, then a pull of its result by the peer, reads the chunk a third time and writes it from the
   other core). `streams`: both outputs may stream (every block of at least 64 bytes, as copy_bytes').
   The same arithmetic as reduce(): bitwise the same results. The block size, the prefetch distance and
   which outputs stream (in place and not) are the context's (the planner's, plan.py; 0: FUSED_BLOCK,
   none, both). */
static void reduce_push(const cb_op *op, const cb_ctx *c, int streams) {
    _Alignas(64) char tmp[FUSED_BLOCK_MAX + 64];
    int64_t block = c->fused_block > 0 && c->fused_block <= FUSED_BLOCK_MAX ? c->fused_block & ~(int64_t)63 : 0;
    int64_t ahead = c->prefetch_bytes > 0 ? c->prefetch_bytes : 0;
    /* In place the output's lines were just read (they are in the cache): whether streaming them pays
       differs from out of place, where a store that does not stream first reads the line it writes. */
    int64_t mode = op->out == op->a && c->fused_nt_in_place > 0 ? c->fused_nt_in_place : c->fused_nt;
    int64_t nt_bits = mode > 0 ? mode - 1 : STORE_OUT | STORE_PUSH;
    int64_t nt_out = streams && (nt_bits & STORE_OUT) ? 0 : INT64_MAX;
    int64_t nt_push = streams && (nt_bits & STORE_PUSH) ? 0 : INT64_MAX;
    int64_t size = ITEMSIZE[op->dtype], nbytes = op->count * size;
    char *t = tmp + ((uintptr_t)op->out & 63);
    block = block ? block : FUSED_BLOCK;
    for (int64_t at = 0; at < nbytes; at += block) {
        int64_t n = nbytes - at < block ? nbytes - at : block;
        if (ahead) {  /* the next lines of both inputs, `ahead` bytes past this block's start */
            const char *pa = (const char *)op->a + at + ahead, *pb = (const char *)op->b + at + ahead;
            int64_t reach = nbytes - at - ahead < n ? nbytes - at - ahead : n;
            for (int64_t k = 0; k < reach; k += 64) {
                __builtin_prefetch(pa + k, 0, 0);
                __builtin_prefetch(pb + k, 0, 0);
            }
        }
        cb_op part = *op;
        part.out = t;
        part.a = (const char *)op->a + at;
        part.b = (const char *)op->b + at;
        part.count = n / size;
        reduce(&part);
        copy_bytes((char *)op->out + at, t, n, nt_out);
        copy_bytes((char *)op->out2 + at, t, n, nt_push);
    }
}

int64_t cb_shm_run(const cb_op *ops, int64_t count, int64_t start, int64_t resumed, cb_ctx *c) {
    for (int64_t k = start; k < count; k++) {
        const cb_op *op = &ops[k];
        if (op->kind == OP_BARRIER) {
            if (!barrier(c, k == start && resumed)) return k;
        } else if (op->kind == OP_COPY) {
            copy_bytes(op->out, op->a, op->count * ITEMSIZE[op->dtype], op->stream ? c->nt_bytes : INT64_MAX);
        } else if (op->kind == OP_REDUCE) {
            if (!op->out2) {
                reduce(op);
            } else {
                reduce_push(op, c, op->stream && op->count * ITEMSIZE[op->dtype] >= c->nt_bytes);
            }
        }
    }
    _mm_sfence();  /* the last non-temporal copy visible before Python (or a Python barrier) goes on */
    return -1;
}

/* The struct sizes, so that Python checks its ctypes layout against this build. */
int64_t cb_shm_layout(int64_t which) { return which == 0 ? (int64_t)sizeof(cb_op) : (int64_t)sizeof(cb_ctx); }
