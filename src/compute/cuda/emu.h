/*
 * emu.h - runs CUDA kernel sources on the host, compiled as C++ (g++), so
 * that `make check` tests the kernels of src/compute/cuda on a machine
 * without a GPU. It is not a simulator of the hardware: it emulates the
 * execution model the kernels are written against, and only that.
 *
 * What it emulates:
 *   - a launch: every block of the grid runs, one block at a time, and every
 *     thread of a block is a fiber (ucontext) with its own stack, so the
 *     threads of a block really interleave at the points where CUDA lets
 *     them wait for each other;
 *   - threadIdx, blockIdx, blockDim, gridDim (x, y, z);
 *   - __syncthreads(): a barrier over the block's threads. A barrier that
 *     some threads of the block never reach (they returned, or wait at a
 *     different barrier) stops the program with the kernel, the block and
 *     the threads named: on a GPU that is a hang or undefined behaviour;
 *   - warp shuffles (__shfl_sync, __shfl_xor_sync, __shfl_down_sync,
 *     __shfl_up_sync) and __syncwarp over warps of 32 consecutive threads:
 *     every lane of the mask must arrive (a lane of the mask that exited or
 *     does not exist is an error, as is reading from a lane outside it);
 *   - __shared__ memory, per block: static storage, which is per block
 *     because blocks run one after another (its contents are left from the
 *     block before, as a GPU leaves them undefined); dynamic shared memory
 *     through FSDP_CUDA_DYNAMIC_SHARED (common.cuh), filled with 0xff bytes
 *     (NaN as floats) before every block;
 *   - the math intrinsics the kernels use, mapped to libm (__expf is expf,
 *     rsqrtf is 1 / sqrtf).
 * Scheduling: blocks one after another; within a block, each warp runs as
 * far as it can (its lanes interleaved at shuffles and __syncwarp) before
 * the next warp starts, so warps reach a __syncthreads one at a time, as
 * far out of step as a GPU may run them. fsdp_emu_order picks the order of
 * blocks, warps and lanes: 0 first to last, 1 last to first. A test runs
 * a kernel in both orders, so a thread that reads what another writes
 * without a barrier between them sees the value in one of the two.
 *
 * What it cannot see: data races that both orders happen to hide (it
 * interleaves only at barriers and shuffles, never inside a statement);
 * code that relies on a warp running in lock step without __syncwarp; the
 * GPU's own numerics (its expf, rsqrtf and division are a few ulp from
 * libm's, tensor cores are not modelled); atomics (not provided: a kernel
 * that uses one does not compile here, which keeps the reductions
 * deterministic); memory spaces (device pointers are host pointers, so a
 * kernel handed a host pointer works here and faults on a GPU); streams
 * (launches run at once, in order); launch limits (grid and block sizes,
 * shared memory sizes) and anything about performance.
 *
 * One launch at a time, from one host thread.
 */
#ifndef FSDP_COMPUTE_CUDA_EMU_H
#define FSDP_COMPUTE_CUDA_EMU_H

#ifndef __cplusplus
#error "emu.h is C++: compile the kernel sources with a C++ compiler"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

// ----------------------------------------------------------------------------
// the language

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;
typedef void *cudaStream_t;

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* __expf and __logf: glibc declares them, as expf and logf */
static inline float __fdividef(float a, float b) { return a / b; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
template <class T> static inline T __ldg(const T *p) { return *p; }

// ----------------------------------------------------------------------------
// the machine

enum { FSDP_EMU_RUN, FSDP_EMU_BLOCK, FSDP_EMU_WARP, FSDP_EMU_DONE };
#define FSDP_EMU_STACK (64 * 1024)

struct fsdp_emu_thread {
    ucontext_t ctx;
    dim3 idx;
    int state;
    unsigned mask;  /* the lanes it waits for at a warp barrier */
    unsigned shfls; /* shuffles done: picks the exchange buffer */
};

struct fsdp_emu_machine {
    ucontext_t sched;
    const char *kernel;
    dim3 grid, block, block_idx;
    struct fsdp_emu_thread *threads, *cur;
    unsigned nthreads;
    char *stacks;
    uint64_t *xchg; /* (2, warps, 32): double-buffered shuffle values */
    unsigned char *dyn_shared;
    size_t dyn_bytes;
    void (*body)(void *);
    void *arg;
};

inline struct fsdp_emu_machine fsdp_emu;
inline int fsdp_emu_order; /* 0: blocks and threads first to last; 1: last to first */

#define threadIdx (fsdp_emu.cur->idx)
#define blockIdx (fsdp_emu.block_idx)
#define blockDim (fsdp_emu.block)
#define gridDim (fsdp_emu.grid)

[[noreturn]] static inline void fsdp_emu_fail(const char *what, unsigned tid)
{
    const dim3 &b = fsdp_emu.block_idx;
    fprintf(stderr, "cuda emulation: kernel %s, block (%u,%u,%u), thread %u: %s\n",
            fsdp_emu.kernel, b.x, b.y, b.z, tid, what);
    abort();
}

static inline unsigned fsdp_emu_tid(const struct fsdp_emu_thread *t)
{
    return (unsigned)(t - fsdp_emu.threads);
}

/* Back to the scheduler in state s; returns when the barrier is released. */
static inline void fsdp_emu_wait(int s)
{
    struct fsdp_emu_thread *t = fsdp_emu.cur;
    t->state = s;
    swapcontext(&t->ctx, &fsdp_emu.sched);
}

static inline void __syncthreads(void) { fsdp_emu_wait(FSDP_EMU_BLOCK); }

/* The lanes that exist in the calling thread's warp (a block's last warp may be partial). */
static inline unsigned fsdp_emu_warp_lanes(unsigned tid)
{
    unsigned w0 = tid & ~31u, n = fsdp_emu.nthreads - w0;
    return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    struct fsdp_emu_thread *t = fsdp_emu.cur;
    unsigned tid = fsdp_emu_tid(t);
    if (!(mask & (1u << (tid & 31))) || (mask & ~fsdp_emu_warp_lanes(tid))) {
        fsdp_emu_fail("warp mask leaves out the calling lane or names lanes that do not exist",
                      tid);
    }
    t->mask = mask;
    fsdp_emu_wait(FSDP_EMU_WARP);
}

/* Every lane of mask offers v, then reads lane src's offer (its own when src < 0). */
static inline uint64_t fsdp_emu_exchange(unsigned mask, uint64_t v, int src)
{
    struct fsdp_emu_thread *t = fsdp_emu.cur;
    unsigned tid = fsdp_emu_tid(t), warp = tid / 32, nwarps = (fsdp_emu.nthreads + 31) / 32;
    /* Two buffers in turn: a lane writes one only after every lane of the
     * mask has read it two shuffles back (each lane reads right after its
     * release, before it can arrive at the next shuffle). */
    uint64_t *buf = fsdp_emu.xchg + ((size_t)(t->shfls & 1) * nwarps + warp) * 32;
    t->shfls++;
    buf[tid & 31] = v;
    __syncwarp(mask);
    if (src < 0) {
        return v;
    }
    if (src >= 32 || !(mask & (1u << src))) {
        fsdp_emu_fail("shuffle reads a lane outside its mask", tid);
    }
    return buf[src];
}

template <class T> static inline T fsdp_emu_shfl(unsigned mask, T v, int src)
{
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    b = fsdp_emu_exchange(mask, b, src);
    memcpy(&v, &b, sizeof(T));
    return v;
}

static inline int fsdp_emu_lane(void) { return (int)(fsdp_emu_tid(fsdp_emu.cur) & 31); }

template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    int lane = fsdp_emu_lane();
    return fsdp_emu_shfl(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32)
{
    int lane = fsdp_emu_lane(), s = lane ^ lm;
    /* CUDA: a source beyond the lane's own width segment gives the lane's own value */
    return fsdp_emu_shfl(mask, v, (s & ~(width - 1)) > (lane & ~(width - 1)) ? -1 : s);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    int lane = fsdp_emu_lane(), s = lane + (int)d;
    return fsdp_emu_shfl(mask, v, (s & ~(width - 1)) != (lane & ~(width - 1)) ? -1 : s);
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    int lane = fsdp_emu_lane(), s = lane - (int)d;
    return fsdp_emu_shfl(mask, v, s < (lane & ~(width - 1)) ? -1 : s);
}

// ----------------------------------------------------------------------------
// the scheduler

static inline void fsdp_emu_entry(void)
{
    fsdp_emu.body(fsdp_emu.arg);
    fsdp_emu.cur->state = FSDP_EMU_DONE; /* uc_link returns to the scheduler */
}

/* Releases the threads of the warp at w0 from a warp barrier once every
 * lane of its mask has arrived; 1 when it did. */
static inline int fsdp_emu_release_warp(unsigned w0)
{
    struct fsdp_emu_thread *t = fsdp_emu.threads + w0;
    unsigned n = fsdp_emu.nthreads - w0 < 32 ? fsdp_emu.nthreads - w0 : 32;
    unsigned mask = 0, arrived = 0;
    for (unsigned l = 0; l < n; l++) {
        if (t[l].state == FSDP_EMU_WARP) {
            mask = t[l].mask;
            arrived |= 1u << l;
        }
    }
    if (!arrived) {
        return 0;
    }
    for (unsigned l = 0; l < n; l++) {
        if ((mask & (1u << l)) && t[l].state == FSDP_EMU_DONE) {
            fsdp_emu_fail("a warp barrier or shuffle waits for a lane that has exited", w0 + l);
        }
    }
    if ((arrived & mask) != mask) {
        return 0;
    }
    for (unsigned l = 0; l < n; l++) {
        if (mask & (1u << l)) {
            t[l].state = FSDP_EMU_RUN;
        }
    }
    return 1;
}

/* Runs the warp at w0 as far as it goes: until each of its threads has
 * exited or waits at __syncthreads (or at a warp barrier its lanes never
 * all reach). A warp thus runs ahead of the others to the next block
 * barrier, as a GPU may let it. */
static inline void fsdp_emu_run_warp(unsigned w0)
{
    unsigned n = fsdp_emu.nthreads - w0 < 32 ? fsdp_emu.nthreads - w0 : 32;
    do {
        for (unsigned k = 0; k < n; k++) {
            struct fsdp_emu_thread *t = fsdp_emu.threads + w0 + (fsdp_emu_order ? n - 1 - k : k);
            if (t->state == FSDP_EMU_RUN) {
                fsdp_emu.cur = t;
                swapcontext(&fsdp_emu.sched, &t->ctx);
            }
        }
    } while (fsdp_emu_release_warp(w0));
}

/* Releases the block barrier when every thread waits at it. */
static inline int fsdp_emu_release_block(void)
{
    unsigned waiting = 0, done = 0, first_done = 0;
    for (unsigned i = 0; i < fsdp_emu.nthreads; i++) {
        int s = fsdp_emu.threads[i].state;
        waiting += s == FSDP_EMU_BLOCK;
        if (s == FSDP_EMU_DONE && done++ == 0) {
            first_done = i;
        }
    }
    if (waiting == 0 || waiting + done < fsdp_emu.nthreads) {
        return 0;
    }
    if (done) {
        fsdp_emu_fail("__syncthreads waits for threads that have exited (this one first)",
                      first_done);
    }
    for (unsigned i = 0; i < fsdp_emu.nthreads; i++) {
        fsdp_emu.threads[i].state = FSDP_EMU_RUN;
    }
    return 1;
}

static inline void fsdp_emu_run_block(void)
{
    unsigned n = fsdp_emu.nthreads, bx = fsdp_emu.block.x, by = fsdp_emu.block.y;
    for (unsigned i = 0; i < n; i++) {
        struct fsdp_emu_thread *t = fsdp_emu.threads + i;
        t->idx = dim3(i % bx, i / bx % by, i / (bx * by));
        t->state = FSDP_EMU_RUN;
        t->shfls = 0;
        getcontext(&t->ctx);
        t->ctx.uc_stack.ss_sp = fsdp_emu.stacks + (size_t)i * FSDP_EMU_STACK;
        t->ctx.uc_stack.ss_size = FSDP_EMU_STACK;
        t->ctx.uc_link = &fsdp_emu.sched;
        makecontext(&t->ctx, fsdp_emu_entry, 0);
    }
    unsigned nwarps = (n + 31) / 32;
    for (;;) {
        for (unsigned k = 0; k < nwarps; k++) {
            fsdp_emu_run_warp(32 * (fsdp_emu_order ? nwarps - 1 - k : k));
        }
        unsigned done = 0;
        for (unsigned i = 0; i < n; i++) {
            done += fsdp_emu.threads[i].state == FSDP_EMU_DONE;
        }
        if (done == n) {
            return;
        }
        if (!fsdp_emu_release_block()) {
            fsdp_emu_fail("deadlock: threads wait at different barriers (a barrier in divergent "
                          "code)", 0);
        }
    }
}

/* Runs body(arg) as every thread of every block of the grid. */
static inline void fsdp_emu_run(const char *kernel, dim3 grid, dim3 block, size_t shmem,
                                void (*body)(void *), void *arg)
{
    unsigned n = block.x * block.y * block.z;
    size_t nblocks = (size_t)grid.x * grid.y * grid.z;
    if (n == 0 || n > 1024 || nblocks == 0) {
        fprintf(stderr, "cuda emulation: kernel %s launched with %u threads per block and "
                        "%zu blocks\n", kernel, n, nblocks);
        abort();
    }
    fsdp_emu.kernel = kernel;
    fsdp_emu.grid = grid;
    fsdp_emu.block = block;
    fsdp_emu.nthreads = n;
    fsdp_emu.body = body;
    fsdp_emu.arg = arg;
    fsdp_emu.threads = (struct fsdp_emu_thread *)calloc(n, sizeof(struct fsdp_emu_thread));
    fsdp_emu.stacks = (char *)malloc((size_t)n * FSDP_EMU_STACK);
    fsdp_emu.xchg = (uint64_t *)calloc((size_t)2 * ((n + 31) / 32) * 32, sizeof(uint64_t));
    fsdp_emu.dyn_shared = (unsigned char *)malloc(shmem ? shmem : 1);
    fsdp_emu.dyn_bytes = shmem;
    if (!fsdp_emu.threads || !fsdp_emu.stacks || !fsdp_emu.xchg || !fsdp_emu.dyn_shared) {
        fprintf(stderr, "cuda emulation: out of memory for %u fibers\n", n);
        abort();
    }
    for (size_t k = 0; k < nblocks; k++) {
        size_t b = fsdp_emu_order ? nblocks - 1 - k : k;
        fsdp_emu.block_idx = dim3((unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                                  (unsigned)(b / ((size_t)grid.x * grid.y)));
        memset(fsdp_emu.dyn_shared, 0xff, shmem); /* NaN floats: a read before a write shows */
        fsdp_emu_run_block();
    }
    free(fsdp_emu.dyn_shared);
    free(fsdp_emu.xchg);
    free(fsdp_emu.stacks);
    free(fsdp_emu.threads);
    fsdp_emu.threads = fsdp_emu.cur = NULL;
}

template <class F> static inline void fsdp_emu_launch(const char *kernel, dim3 grid, dim3 block,
                                                      size_t shmem, F f)
{
    fsdp_emu_run(kernel, grid, block, shmem, [](void *p) { (*(F *)p)(); }, &f);
}

#endif
