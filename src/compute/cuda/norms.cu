/*
 * norms.cu - RMSNorm and LayerNorm, forward and backward, on the GPU.
 *
 * One block per row: the row's sums are block reductions (warp shuffles,
 * then one float per warp through shared memory), and every thread then
 * writes its strided columns. The backward's input gradient is per row in
 * the same way; its weight (and bias) gradients are column sums over all
 * rows, which two more kernels form without atomics: blocks of rows write
 * partial sums per column to scratch, then one thread per column adds the
 * partials in order and accumulates into the gradient. The partition
 * depends on N only, so the sums come out the same on every run.
 *
 * Formulas and rounding order follow compute/cpu (layers.c, llama_layers.c).
 */
#include "compute/cuda/common.cuh"

/* Row blocks of the column partials: at least FSDP_NORM_ROWS rows each, at
 * most FSDP_NORM_MAX_CHUNKS of them. */
#define FSDP_NORM_ROWS 32
#define FSDP_NORM_MAX_CHUNKS 128

static size_t fsdp_norm_chunks(size_t N)
{
    size_t k = (N + FSDP_NORM_ROWS - 1) / FSDP_NORM_ROWS;
    return k > FSDP_NORM_MAX_CHUNKS ? FSDP_NORM_MAX_CHUNKS : (k ? k : 1);
}

size_t fsdp_cuda_norm_scratch_floats(size_t N, size_t C)
{
    return fsdp_norm_chunks(N) * 2 * C;
}

// ----------------------------------------------------------------------------
// forward

/* inp, out, weight and keep each stored as f32 or bf16 (its flag, for
 * common.cuh's fsdp_ld and fsdp_st); the sums and rstd in f32 */
static __global__ void fsdp_rmsnorm_forward_kernel(void *out, float *rstd, void *keep,
                                                   const void *inp, const void *weight, size_t C,
                                                   float eps, int ib, int ob, int wb, int kb)
{
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    float s = 0.0f;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = fsdp_ld(inp, row * C + c, ib);
        s += v * v;
    }
    s = fsdp_block_reduce(s, sh, 0);
    float r = 1.0f / sqrtf(s / (float)C + eps);
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = fsdp_ld(inp, row * C + c, ib);
        fsdp_st(out, row * C + c, fsdp_ld(weight, c, wb) * (v * r), ob);
        if (keep) {
            fsdp_st(keep, row * C + c, v, kb);
        }
    }
    if (threadIdx.x == 0) {
        rstd[row] = r;
    }
}

/* inp and out stored as f32 or bf16 (ib, ob); weight, bias, the sums and
 * the statistics f32 */
static __global__ void fsdp_layernorm_forward_kernel(void *out, float *mean, float *rstd,
                                                     const void *inp, const float *weight,
                                                     const float *bias, size_t C, float eps, int ib,
                                                     int ob)
{
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    float s = 0.0f;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        s += fsdp_ld(inp, row * C + c, ib);
    }
    float m = fsdp_block_reduce(s, sh, 0) / (float)C;
    float q = 0.0f;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float dv = fsdp_ld(inp, row * C + c, ib) - m;
        q += dv * dv;
    }
    float var = fsdp_block_reduce(q, sh, 0) / (float)C;
    float r = 1.0f / sqrtf(var + eps);
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float v = fsdp_ld(inp, row * C + c, ib);
        fsdp_st(out, row * C + c, (v - m) * r * weight[c] + bias[c], ob);
    }
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

static void fsdp_rmsnorm_forward(void *out, float *rstd, void *keep, const void *inp,
                                 const void *weight, size_t N, size_t C, float eps, int ib, int ob,
                                 int wb, int kb, void *stream)
{
    if (N == 0 || C == 0) {
        return;
    }
    FSDP_CUDA_LAUNCH(fsdp_rmsnorm_forward_kernel, dim3((unsigned)N), dim3(fsdp_cuda_row_threads(C)),
                     0, stream, out, rstd, keep, inp, weight, C, eps, ib, ob, wb, kb);
}

void fsdp_cuda_rmsnorm_forward(float *out, float *rstd, float *keep, const float *inp,
                               const float *weight, size_t N, size_t C, float eps, void *stream)
{
    fsdp_rmsnorm_forward(out, rstd, keep, inp, weight, N, C, eps, 0, 0, 0, 0, stream);
}

void fsdp_cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, uint16_t *keep,
                                    const uint16_t *inp, const uint16_t *weight, size_t N,
                                    size_t C, float eps, void *stream)
{
    fsdp_rmsnorm_forward(out, rstd, keep, inp, weight, N, C, eps, 1, 1, 1, 1, stream);
}

void fsdp_cuda_rmsnorm_forward_at(void *out, int obf16, float *rstd, float *keep, const void *inp,
                                  int ibf16, const float *weight, size_t N, size_t C, float eps,
                                  void *stream)
{
    fsdp_rmsnorm_forward(out, rstd, keep, inp, weight, N, C, eps, ibf16, obf16, 0, 0, stream);
}

void fsdp_cuda_layernorm_forward_at(void *out, int obf16, float *mean, float *rstd, const void *inp,
                                    int ibf16, const float *weight, const float *bias, size_t N,
                                    size_t C, float eps, void *stream)
{
    if (N == 0 || C == 0) {
        return;
    }
    FSDP_CUDA_LAUNCH(fsdp_layernorm_forward_kernel, dim3((unsigned)N),
                     dim3(fsdp_cuda_row_threads(C)), 0, stream, out, mean, rstd, inp, weight, bias,
                     C, eps, ibf16, obf16);
}

void fsdp_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, size_t N, size_t C,
                                 float eps, void *stream)
{
    fsdp_cuda_layernorm_forward_at(out, 0, mean, rstd, inp, 0, weight, bias, N, C, eps, stream);
}

// ----------------------------------------------------------------------------
// backward: the input gradient, a block per row

/* With xh = x * r, g = dout * w:  dx += r * (g - xh * mean(g * xh)) */
static __global__ void fsdp_rmsnorm_dinp_kernel(float *dinp, const float *dout, const void *inp,
                                                const float *weight, const float *rstd, size_t C,
                                                int abf16)
{
    __shared__ float sh[32];
    size_t row = blockIdx.x, x0 = row * C; /* inp's row, stored as f32 or bf16 (abf16) */
    const float *dy = dout + row * C;
    float r = rstd[row];
    float dot = 0.0f;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        dot += dy[c] * weight[c] * (fsdp_ld(inp, x0 + c, abf16) * r);
    }
    dot = fsdp_block_reduce(dot, sh, 0) / (float)C;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = fsdp_ld(inp, x0 + c, abf16) * r;
        dinp[row * C + c] += r * (dy[c] * weight[c] - xh * dot);
    }
}

/* With xh = (x - m) * r, g = dout * w:  dx += (g - mean(g) - xh * mean(g * xh)) * r */
static __global__ void fsdp_layernorm_dinp_kernel(float *dinp, const float *dout, const void *inp,
                                                  const float *weight, const float *mean,
                                                  const float *rstd, size_t C, int abf16)
{
    __shared__ float sh[32];
    size_t row = blockIdx.x, x0 = row * C; /* inp's row, stored as f32 or bf16 (abf16) */
    const float *dy = dout + row * C;
    float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float g = dy[c] * weight[c];
        sg += g;
        sgx += g * ((fsdp_ld(inp, x0 + c, abf16) - m) * r);
    }
    float mg = fsdp_block_reduce(sg, sh, 0) / (float)C;
    float mgx = fsdp_block_reduce(sgx, sh, 0) / (float)C;
    for (size_t c = threadIdx.x; c < C; c += blockDim.x) {
        float xh = (fsdp_ld(inp, x0 + c, abf16) - m) * r;
        dinp[row * C + c] += (dy[c] * weight[c] - mg - xh * mgx) * r;
    }
}

// ----------------------------------------------------------------------------
// backward: the weight and bias gradients, column sums in two passes

/* part (chunks, 2, C): row block blockIdx.y's sums of dout * xh and of
 * dout per column, xh = (x - mean) * rstd (mean NULL: 0). */
static __global__ void fsdp_norm_partials_kernel(float *part, const float *dout, const void *inp,
                                                 const float *mean, const float *rstd, size_t N,
                                                 size_t C, size_t rows, int abf16)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) {
        return; /* no barrier below */
    }
    size_t r0 = (size_t)blockIdx.y * rows, r1 = r0 + rows < N ? r0 + rows : N;
    float sw = 0.0f, sb = 0.0f;
    for (size_t r = r0; r < r1; r++) {
        float xh = (fsdp_ld(inp, r * C + c, abf16) - (mean ? mean[r] : 0.0f)) * rstd[r];
        float d = dout[r * C + c];
        sw += d * xh;
        sb += d;
    }
    part[(size_t)blockIdx.y * 2 * C + c] = sw;
    part[(size_t)blockIdx.y * 2 * C + C + c] = sb;
}

/* dweight[c] += the partials' sum, in row-block order; dbias likewise unless NULL */
static __global__ void fsdp_norm_finish_kernel(float *dweight, float *dbias, const float *part,
                                               size_t chunks, size_t C)
{
    size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) {
        return;
    }
    float sw = 0.0f, sb = 0.0f;
    for (size_t k = 0; k < chunks; k++) {
        sw += part[k * 2 * C + c];
        sb += part[k * 2 * C + C + c];
    }
    dweight[c] += sw;
    if (dbias) {
        dbias[c] += sb;
    }
}

static void fsdp_norm_param_grads(float *dweight, float *dbias, float *scratch, const float *dout,
                                  const void *inp, int abf16, const float *mean, const float *rstd,
                                  size_t N, size_t C, void *stream)
{
    size_t chunks = fsdp_norm_chunks(N);
    size_t rows = (N + chunks - 1) / chunks;
    unsigned cols = (unsigned)((C + FSDP_CUDA_EW_THREADS - 1) / FSDP_CUDA_EW_THREADS);
    FSDP_CUDA_LAUNCH(fsdp_norm_partials_kernel, dim3(cols, (unsigned)chunks),
                     dim3(FSDP_CUDA_EW_THREADS), 0, stream, scratch, dout, inp, mean, rstd, N, C,
                     rows, abf16);
    FSDP_CUDA_LAUNCH(fsdp_norm_finish_kernel, dim3(cols), dim3(FSDP_CUDA_EW_THREADS), 0, stream,
                     dweight, dbias, scratch, chunks, C);
}

void fsdp_cuda_rmsnorm_backward_at(float *dinp, float *dweight, float *scratch, const float *dout,
                                   const void *inp, int abf16, const float *weight,
                                   const float *rstd, size_t N, size_t C, void *stream)
{
    if (N == 0 || C == 0) {
        return;
    }
    FSDP_CUDA_LAUNCH(fsdp_rmsnorm_dinp_kernel, dim3((unsigned)N), dim3(fsdp_cuda_row_threads(C)), 0,
                     stream, dinp, dout, inp, weight, rstd, C, abf16);
    fsdp_norm_param_grads(dweight, NULL, scratch, dout, inp, abf16, NULL, rstd, N, C, stream);
}

void fsdp_cuda_layernorm_backward_at(float *dinp, float *dweight, float *dbias, float *scratch,
                                     const float *dout, const void *inp, int abf16,
                                     const float *weight, const float *mean, const float *rstd,
                                     size_t N, size_t C, void *stream)
{
    if (N == 0 || C == 0) {
        return;
    }
    FSDP_CUDA_LAUNCH(fsdp_layernorm_dinp_kernel, dim3((unsigned)N), dim3(fsdp_cuda_row_threads(C)),
                     0, stream, dinp, dout, inp, weight, mean, rstd, C, abf16);
    fsdp_norm_param_grads(dweight, dbias, scratch, dout, inp, abf16, mean, rstd, N, C, stream);
}

void fsdp_cuda_rmsnorm_backward(float *dinp, float *dweight, float *scratch, const float *dout,
                                const float *inp, const float *weight, const float *rstd, size_t N,
                                size_t C, void *stream)
{
    fsdp_cuda_rmsnorm_backward_at(dinp, dweight, scratch, dout, inp, 0, weight, rstd, N, C, stream);
}

void fsdp_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, float *scratch,
                                  const float *dout, const float *inp, const float *weight,
                                  const float *mean, const float *rstd, size_t N, size_t C,
                                  void *stream)
{
    fsdp_cuda_layernorm_backward_at(dinp, dweight, dbias, scratch, dout, inp, 0, weight, mean, rstd,
                                    N, C, stream);
}
