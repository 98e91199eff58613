/*
 * embed.cu - the embedding lookups and their gradients on the GPU
 * (compute/cpu/layers.c's encoder and held-rows kernels, the 16-bit
 * gather), and the parallel cross-entropy's element-wise combination
 * (compute/cpu/small.c's xent_combine).
 *
 * Parameters are read in their storage dtype (pt: kernels.h's enum
 * fsdp_dtype values, f32 0, f16 1, bf16 2) and widened exactly, so a
 * lookup gives the CPU table's bits. The gradients keep the CPU's order of
 * additions: a table row that several rows of the batch hit is summed by
 * one thread per column over the rows in order, and a position's row by
 * one thread per element over the batch in order, so the results are the
 * CPU's bit for bit (no atomics).
 */
#include "compute/cuda/common.cuh"

#include <math.h>

/* element i of a parameter stored in pt (0 f32, 1 f16, 2 bf16), as f32 */
static __device__ __forceinline__ float fsdp_ld_param(const void *p, size_t i, int pt)
{
    if (pt == 2) {
        return fsdp_bf16_bits_to_f32(((const uint16_t *)p)[i]);
    }
    if (pt == 1) {
        return fsdp_f16_bits_to_f32(((const uint16_t *)p)[i]);
    }
    return ((const float *)p)[i];
}

// ----------------------------------------------------------------------------
// lookups

static __global__ void fsdp_encoder_forward_kernel(float *out, const int32_t *tokens,
                                                   const void *wte, const void *wpe, int pt,
                                                   size_t N, size_t T, size_t C)
{
    FSDP_CUDA_GRID_FOR(i, N * C)
    {
        size_t r = i / C, c = i % C;
        out[i] = fsdp_ld_param(wte, (size_t)tokens[r] * C + c, pt) +
                 fsdp_ld_param(wpe, (r % T) * C + c, pt);
    }
}

/* rows [v0, v0 + vn) of wte and [p0, p0 + pn) of wpe held: the sum of the
 * held terms, one term copied, or 0 (the CPU's three cases) */
static __global__ void fsdp_embed_rows_forward_kernel(float *out, const int32_t *tokens,
                                                      const void *wte, size_t v0, size_t vn,
                                                      const void *wpe, size_t p0, size_t pn,
                                                      int pt, size_t N, size_t T, size_t C)
{
    FSDP_CUDA_GRID_FOR(i, N * C)
    {
        size_t r = i / C, c = i % C, v = (size_t)tokens[r], p = r % T;
        int he = v >= v0 && v - v0 < vn, hp = p >= p0 && p - p0 < pn;
        float e = he ? fsdp_ld_param(wte, (v - v0) * C + c, pt) : 0.0f;
        float q = hp ? fsdp_ld_param(wpe, (p - p0) * C + c, pt) : 0.0f;
        out[i] = he && hp ? e + q : (he ? e : (hp ? q : 0.0f));
    }
}

static __global__ void fsdp_gather16_kernel(float *out, const int32_t *tokens, const void *table,
                                            int pt, size_t N, size_t C)
{
    FSDP_CUDA_GRID_FOR(i, N * C)
    {
        out[i] = fsdp_ld_param(table, (size_t)tokens[i / C] * C + i % C, pt);
    }
}

void fsdp_cuda_encoder_forward(float *out, const int32_t *tokens, const void *wte,
                               const void *wpe, int pt, int B, int T, int C, void *stream)
{
    size_t N = (size_t)B * (size_t)T;
    if (N && C > 0) {
        FSDP_CUDA_EW_LAUNCH(fsdp_encoder_forward_kernel, N * (size_t)C, stream, out, tokens, wte,
                            wpe, pt, N, (size_t)T, (size_t)C);
    }
}

void fsdp_cuda_embed_rows_forward(float *out, const int32_t *tokens, const void *wte, size_t v0,
                                  size_t vn, const void *wpe, size_t p0, size_t pn, int pt,
                                  size_t N, int T, int C, void *stream)
{
    if (N && C > 0) {
        FSDP_CUDA_EW_LAUNCH(fsdp_embed_rows_forward_kernel, N * (size_t)C, stream, out, tokens,
                            wte, v0, vn, wpe, p0, pn, pt, N, (size_t)T, (size_t)C);
    }
}

void fsdp_cuda_embed_gather16(float *out, const int32_t *tokens, const void *table, int pt,
                              size_t N, size_t C, void *stream)
{
    if (N && C) {
        FSDP_CUDA_EW_LAUNCH(fsdp_gather16_kernel, N * C, stream, out, tokens, table, pt, N, C);
    }
}

// ----------------------------------------------------------------------------
// gradients, in the CPU's order

/* one thread per column: the rows whose token is held, in row order */
static __global__ void fsdp_rows_scatter_kernel(float *dwte, const float *dout,
                                                const int32_t *tokens, size_t v0, size_t vn,
                                                size_t N, size_t C)
{
    FSDP_CUDA_GRID_FOR(c, C)
    {
        for (size_t r = 0; r < N; r++) {
            size_t v = (size_t)tokens[r];
            if (v >= v0 && v - v0 < vn) {
                dwte[(v - v0) * C + c] += dout[r * C + c];
            }
        }
    }
}

/* one thread per element of the held positions' rows: rows p, p + T, ... in
 * order (a position at or past T, held but beyond this batch's length, gets
 * nothing) */
static __global__ void fsdp_pos_scatter_kernel(float *dwpe, const float *dout, size_t p0,
                                               size_t pn, size_t N, size_t T, size_t C)
{
    FSDP_CUDA_GRID_FOR(i, pn * C)
    {
        size_t p = p0 + i / C, c = i % C;
        float acc = dwpe[i];
        for (size_t r = p; p < T && r < N; r += T) {
            acc += dout[r * C + c];
        }
        dwpe[i] = acc;
    }
}

void fsdp_cuda_embed_rows_backward(float *dwte, float *dwpe, const float *dout,
                                   const int32_t *tokens, size_t v0, size_t vn, size_t p0,
                                   size_t pn, size_t N, int T, int C, void *stream)
{
    size_t Cs = (size_t)C;
    if (N == 0 || C <= 0) {
        return;
    }
    if (dwte && vn > 0) {
        FSDP_CUDA_EW_LAUNCH(fsdp_rows_scatter_kernel, Cs, stream, dwte, dout, tokens, v0, vn, N,
                            Cs);
    }
    if (dwpe && pn > 0) {
        FSDP_CUDA_EW_LAUNCH(fsdp_pos_scatter_kernel, pn * Cs, stream, dwpe, dout, p0, pn, N,
                            (size_t)T, Cs);
    }
}

void fsdp_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                const int32_t *tokens, int B, int T, int C, void *stream)
{
    size_t N = (size_t)B * (size_t)T;
    const size_t every_id = (size_t)INT32_MAX + 1; /* tokens are int32: every id is held */
    fsdp_cuda_embed_rows_backward(dwte, dwpe, dout, tokens, 0, every_id, 0, (size_t)T, N, T, C,
                                  stream);
}

// ----------------------------------------------------------------------------
// the parallel cross-entropy's combination

static __global__ void fsdp_xent_combine_kernel(int phase, float *stats, float *zt, float *mx,
                                                float *sz, size_t N, int have)
{
    FSDP_CUDA_GRID_FOR(i, N)
    {
        if (phase == 0) {
            mx[i] = have ? stats[2 * i] : -INFINITY;
        } else if (phase == 1) {
            float s = have ? stats[2 * i + 1] : 0.0f;
            sz[i] = s > 0.0f ? s * expf(stats[2 * i] - mx[i]) : 0.0f;
            sz[N + i] = have ? zt[i] : 0.0f;
        } else {
            stats[2 * i] = mx[i];
            stats[2 * i + 1] = sz[i];
            zt[i] = sz[N + i];
        }
    }
}

void fsdp_cuda_xent_combine(int phase, float *stats, float *zt, float *mx, float *sz, size_t N,
                            int have, void *stream)
{
    if (N) {
        FSDP_CUDA_EW_LAUNCH(fsdp_xent_combine_kernel, N, stream, phase, stats, zt, mx, sz, N,
                            have);
    }
}
