/*
 * common.cuh - what every kernel source of src/compute/cuda includes: the
 * CUDA runtime under nvcc, the host emulation (emu.h) under a C++
 * compiler, the launch macro that is the same call in both, and the device
 * helpers the kernels share (block reductions, bf16 rounding).
 *
 * The kernels are CUDA C++ kept C-like: no templates of our own in
 * kernels, no STL, no atomics (every reduction has a fixed order, so a
 * result does not depend on scheduling, on a GPU or here).
 */
#ifndef FSDP_COMPUTE_CUDA_COMMON_CUH
#define FSDP_COMPUTE_CUDA_COMMON_CUH

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
/* FSDP_CUDA_LAUNCH(kernel, grid, block, shared bytes, stream, args...) */
#define FSDP_CUDA_LAUNCH(k, grid, block, shmem, stream, ...) \
    k<<<(grid), (block), (shmem), (cudaStream_t)(stream)>>>(__VA_ARGS__)
#define FSDP_CUDA_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#else
#include "compute/cuda/emu.h"
/* Runs at once; the arguments are evaluated by every thread (keep them plain). */
#define FSDP_CUDA_LAUNCH(k, grid, block, shmem, stream, ...) \
    ((void)(stream), fsdp_emu_launch(#k, (grid), (block), (shmem), [&]() { k(__VA_ARGS__); }))
#define FSDP_CUDA_DYNAMIC_SHARED(T, name) T *name = (T *)fsdp_emu.dyn_shared
#endif

#include "compute/cuda/kernels_cuda.h"

/* Threads per block of the row kernels (a multiple of 32, at most 1024). */
#define FSDP_CUDA_ROW_THREADS 256
/* Threads per block and most blocks of the element-wise kernels (grid-stride loops). */
#define FSDP_CUDA_EW_THREADS 256
#define FSDP_CUDA_EW_MAX_BLOCKS 4096

/* Threads for a row of C floats: C rounded up to a warp, at most FSDP_CUDA_ROW_THREADS. */
static inline unsigned fsdp_cuda_row_threads(size_t C)
{
    size_t t = (C + 31) / 32 * 32;
    return t > FSDP_CUDA_ROW_THREADS ? FSDP_CUDA_ROW_THREADS : (t ? (unsigned)t : 32u);
}

/* for (i over [0, n)) as a grid-stride loop: any n on a bounded grid */
#define FSDP_CUDA_GRID_FOR(i, n)                                                      \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);           \
         i += (size_t)gridDim.x * blockDim.x)

/* launches an element-wise kernel over n items (n > 0) */
#define FSDP_CUDA_EW_LAUNCH(k, n, stream, ...)                                        \
    FSDP_CUDA_LAUNCH(k, dim3(fsdp_cuda_ew_blocks(n)), dim3(FSDP_CUDA_EW_THREADS), 0, stream, \
                     __VA_ARGS__)

/* Blocks of a grid-stride loop over n items. */
static inline unsigned fsdp_cuda_ew_blocks(size_t n)
{
    size_t b = (n + FSDP_CUDA_EW_THREADS - 1) / FSDP_CUDA_EW_THREADS;
    return b > FSDP_CUDA_EW_MAX_BLOCKS ? FSDP_CUDA_EW_MAX_BLOCKS : (b ? (unsigned)b : 1u);
}

// ----------------------------------------------------------------------------
// reductions over a warp and a block (blockDim.x a multiple of 32, every
// thread of the block calls them: they contain barriers)

static __device__ __forceinline__ float fsdp_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

static __device__ __forceinline__ float fsdp_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

/* The block's sum (max when is_max), returned to every thread. sh: 32
 * floats of shared memory, free again when it returns. The order of the
 * additions depends on the block size only. */
static __device__ __forceinline__ float fsdp_block_reduce(float v, float *sh, int is_max)
{
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? fsdp_warp_max(v) : fsdp_warp_sum(v);
    if (lane == 0) {
        sh[warp] = v;
    }
    __syncthreads();
    v = lane < nw ? sh[lane] : (is_max ? -INFINITY : 0.0f);
    v = is_max ? fsdp_warp_max(v) : fsdp_warp_sum(v);
    __syncthreads(); /* sh is read by every warp before anyone reuses it */
    return v;
}

// ----------------------------------------------------------------------------
// bf16: the top half of an f32, rounded to nearest even; NaN kept quiet
// (core/dtype.c's rule, so the casts match the CPU's bit for bit)

static __device__ __forceinline__ uint16_t fsdp_f32_to_bf16_bits(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u);
    }
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float fsdp_bf16_bits_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* element i of a buffer stored as f32 (bf16 0) or bf16 (1) */
static __device__ __forceinline__ float fsdp_ld(const void *p, size_t i, int bf16)
{
    return bf16 ? fsdp_bf16_bits_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static __device__ __forceinline__ void fsdp_st(void *p, size_t i, float v, int bf16)
{
    if (bf16) {
        ((uint16_t *)p)[i] = fsdp_f32_to_bf16_bits(v);
    } else {
        ((float *)p)[i] = v;
    }
}

// ----------------------------------------------------------------------------
// f16: IEEE binary16, round to nearest even, NaN kept quiet with its top
// payload bits, overflow to Inf, subnormals kept (core/dtype.c's rule)

static __device__ __forceinline__ uint16_t fsdp_f32_to_f16_bits(float f)
{
    uint32_t x = __float_as_uint(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    if (a >= 0x477ff000u) { /* Inf, or rounds to >= 65520 */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) {
        /* below 2^-14: adding 0.5 rounds |f| * 2^24 to nearest even in the low bits */
        return (uint16_t)(sign | (__float_as_uint(__uint_as_float(a) + 0.5f) - 0x3f000000u));
    }
    return (uint16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u) - (112u << 23)) >> 13));
}

static __device__ __forceinline__ float fsdp_f16_bits_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (m << 13));
    }
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* exact */
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

#endif
