/*
 * small.cu - the small loops of the models and the engine on the GPU
 * (compute/cpu/small.c's): gradient accumulation (f32 and 16-bit),
 * scale, strided fill, the tensor-parallel bias and residual, the
 * embedding's gather and scatter-add, the loss rows and sums, and the
 * squared norm. The 16-bit casts are with the others in elementwise.cu.
 *
 * Where the CPU's result is an order of additions, the kernel keeps it:
 * the scatter-add gives each column one thread that adds the rows in
 * order, and the loss sum is one thread's loop, so both are the CPU's bits.
 * The squared norm has too many terms for one thread: a fixed grid of
 * blocks sums strided terms in double and writes one double per block,
 * then one thread adds those in block order; the result depends on n only.
 */
#include "compute/cuda/common.cuh"

#include <math.h>

// ----------------------------------------------------------------------------
// accumulate, scale, fill, bias and residual

static __global__ void fsdp_accumulate_kernel(float *y, const float *x, size_t n)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        y[i] += x[i];
    }
}

static __global__ void fsdp_accumulate16_kernel(float *y, const uint16_t *x, size_t n, int bf16,
                                                int accumulate)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        float w = bf16 ? fsdp_bf16_bits_to_f32(x[i]) : fsdp_f16_bits_to_f32(x[i]);
        y[i] = accumulate ? y[i] + w : w; /* not 0 + w: -0 stays -0 */
    }
}

static __global__ void fsdp_scale_kernel(float *x, size_t n, float s)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        x[i] *= s;
    }
}

static __global__ void fsdp_fill_kernel(float *x, size_t n, size_t stride, float value)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        x[i * stride] = value;
    }
}

/* out and residual stored as f32 or bf16 (ob, rb); inp and bias f32 */
static __global__ void fsdp_bias_residual_kernel(void *out, const float *inp, const float *bias,
                                                 const void *residual, size_t N, size_t C, int ob,
                                                 int rb)
{
    FSDP_CUDA_GRID_FOR(i, N * C)
    {
        float v =
            inp[i] + (residual ? fsdp_ld(residual, i, rb) : 0.0f) + (bias ? bias[i % C] : 0.0f);
        fsdp_st(out, i, v, ob);
    }
}

void fsdp_cuda_accumulate(float *y, const float *x, size_t n, void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_accumulate_kernel, n, stream, y, x, n);
    }
}

void fsdp_cuda_accumulate16(float *y, const uint16_t *x, size_t n, int bf16, int accumulate,
                            void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_accumulate16_kernel, n, stream, y, x, n, bf16, accumulate);
    }
}

void fsdp_cuda_scale(float *x, size_t n, float s, void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_scale_kernel, n, stream, x, n, s);
    }
}

void fsdp_cuda_fill(float *x, size_t n, size_t stride, float value, void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_fill_kernel, n, stream, x, n, stride, value);
    }
}

void fsdp_cuda_bias_residual_forward_at(void *out, int obf16, const float *inp, const float *bias,
                                        const void *residual, int rbf16, size_t N, size_t C,
                                        void *stream)
{
    if (N && C) {
        FSDP_CUDA_EW_LAUNCH(fsdp_bias_residual_kernel, N * C, stream, out, inp, bias, residual, N,
                            C, obf16, rbf16);
    }
}

void fsdp_cuda_bias_residual_forward(float *out, const float *inp, const float *bias,
                                     const float *residual, size_t N, size_t C, void *stream)
{
    fsdp_cuda_bias_residual_forward_at(out, 0, inp, bias, residual, 0, N, C, stream);
}

// ----------------------------------------------------------------------------
// embedding rows

static __global__ void fsdp_embed_gather_kernel(float *out, const int32_t *tokens,
                                                const float *table, size_t N, size_t C)
{
    FSDP_CUDA_GRID_FOR(i, N * C)
    {
        out[i] = table[(size_t)tokens[i / C] * C + i % C];
    }
}

/* one thread per column, rows in order: repeated tokens add in the CPU's order */
static __global__ void fsdp_embed_scatter_add_kernel(float *dtable, const float *dout,
                                                     const int32_t *tokens, size_t N, size_t C)
{
    FSDP_CUDA_GRID_FOR(c, C)
    {
        for (size_t r = 0; r < N; r++) {
            dtable[(size_t)tokens[r] * C + c] += dout[r * C + c];
        }
    }
}

void fsdp_cuda_embed_gather(float *out, const int32_t *tokens, const float *table, size_t N,
                            size_t C, void *stream)
{
    if (N && C) {
        FSDP_CUDA_EW_LAUNCH(fsdp_embed_gather_kernel, N * C, stream, out, tokens, table, N, C);
    }
}

void fsdp_cuda_embed_scatter_add(float *dtable, const float *dout, const int32_t *tokens,
                                 size_t N, size_t C, void *stream)
{
    if (N && C) {
        FSDP_CUDA_EW_LAUNCH(fsdp_embed_scatter_add_kernel, C, stream, dtable, dout, tokens, N, C);
    }
}

// ----------------------------------------------------------------------------
// loss rows and sums

static __global__ void fsdp_xent_losses_kernel(float *losses, const float *stats,
                                               const float *target_logit, const int32_t *targets,
                                               size_t N, int32_t ignore_index)
{
    FSDP_CUDA_GRID_FOR(r, N)
    {
        int keep = targets[r] != ignore_index;
        losses[r] = keep ? stats[2 * r] + logf(stats[2 * r + 1]) - target_logit[r] : 0.0f;
    }
}

/* one thread, rows in order: the host loop's double sum, bit for bit */
static __global__ void fsdp_loss_sum_kernel(double *acc, const float *losses,
                                            const int32_t *targets, size_t N,
                                            int32_t ignore_index)
{
    double sum = *acc;
    for (size_t r = 0; r < N; r++) {
        if (targets[r] != ignore_index) {
            sum += losses[r];
        }
    }
    *acc = sum;
}

void fsdp_cuda_xent_losses(float *losses, const float *stats, const float *target_logit,
                           const int32_t *targets, size_t N, int32_t ignore_index, void *stream)
{
    if (N) {
        FSDP_CUDA_EW_LAUNCH(fsdp_xent_losses_kernel, N, stream, losses, stats, target_logit,
                            targets, N, ignore_index);
    }
}

void fsdp_cuda_loss_sum(double *acc, const float *losses, const int32_t *targets, size_t N,
                        int32_t ignore_index, void *stream)
{
    FSDP_CUDA_LAUNCH(fsdp_loss_sum_kernel, dim3(1), dim3(1), 0, stream, acc, losses, targets, N,
                     ignore_index);
}

// ----------------------------------------------------------------------------
// squared norm

#define FSDP_SUMSQ_BLOCKS 256 /* most blocks of the first pass: its scratch doubles */

size_t fsdp_cuda_sumsq_scratch_doubles(void)
{
    return FSDP_SUMSQ_BLOCKS;
}

/* part[blockIdx.x] = the block's strided sum of x^2, in double */
static __global__ void fsdp_sumsq_partial_kernel(double *part, const float *x, size_t n)
{
    __shared__ double sh[32];
    double s = 0.0;
    FSDP_CUDA_GRID_FOR(i, n)
    {
        s += (double)x[i] * (double)x[i];
    }
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
    }
    unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sh[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (unsigned w = 0; w < blockDim.x / 32; w++) {
            t += sh[w];
        }
        part[blockIdx.x] = t;
    }
}

static __global__ void fsdp_sumsq_finish_kernel(double *acc, const double *part, unsigned k)
{
    double t = 0.0;
    for (unsigned b = 0; b < k; b++) {
        t += part[b];
    }
    *acc += t;
}

void fsdp_cuda_sumsq(double *acc, double *scratch, const float *x, size_t n, void *stream)
{
    if (n == 0) {
        return;
    }
    unsigned blocks = fsdp_cuda_ew_blocks(n);
    blocks = blocks > FSDP_SUMSQ_BLOCKS ? FSDP_SUMSQ_BLOCKS : blocks;
    FSDP_CUDA_LAUNCH(fsdp_sumsq_partial_kernel, dim3(blocks), dim3(FSDP_CUDA_EW_THREADS), 0,
                     stream, scratch, x, n);
    FSDP_CUDA_LAUNCH(fsdp_sumsq_finish_kernel, dim3(1), dim3(1), 0, stream, acc, scratch, blocks);
}
