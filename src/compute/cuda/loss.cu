/*
 * loss.cu - softmax cross-entropy on the GPU, over whole rows of logits or
 * over vocabulary slices (compute/kernels.h describes both). One block per
 * row: the row maximum and the sum of exp(x - max) are block reductions,
 * whose order depends on the block size only; the gradient is one element
 * per thread. An ignored row's block returns at once, all its threads
 * together (no barrier is left waiting).
 */
#include "compute/cuda/common.cuh"

/* Column of target t within the slice [col0, col0 + n), or -1. */
static __device__ __forceinline__ long fsdp_ce_col(int32_t t, size_t col0, size_t n)
{
    return t >= 0 && (size_t)t >= col0 && (size_t)t - col0 < n ? (long)((size_t)t - col0) : -1;
}

/* (max, sum of exp(x - max)) of the row, to every thread of the block */
static __device__ __forceinline__ void fsdp_ce_row_stats(const float *x, size_t n, float *sh,
                                                         float *m_out, float *s_out)
{
    float m = -INFINITY;
    for (size_t c = threadIdx.x; c < n; c += blockDim.x) {
        m = fmaxf(m, x[c]);
    }
    m = fsdp_block_reduce(m, sh, 1);
    float s = 0.0f;
    for (size_t c = threadIdx.x; c < n; c += blockDim.x) {
        s += expf(x[c] - m);
    }
    *m_out = m;
    *s_out = fsdp_block_reduce(s, sh, 0);
}

/* losses and stats of the rows whose slice is the whole row (col0 0, n V);
 * losses NULL: a vocabulary slice, merged into stats and target_logit */
static __global__ void fsdp_ce_forward_kernel(float *losses, float *stats, float *target_logit,
                                              const float *logits, const int32_t *targets,
                                              size_t n, size_t col0, int32_t ignore_index,
                                              int first)
{
    __shared__ float sh[32];
    size_t row = blockIdx.x;
    int32_t t = targets[row];
    if (t == ignore_index) {
        if (first && threadIdx.x == 0) {
            stats[2 * row] = 0.0f;
            stats[2 * row + 1] = 0.0f;
            if (losses) {
                losses[row] = 0.0f;
            } else {
                target_logit[row] = 0.0f;
            }
        }
        return;
    }
    const float *x = logits + row * n;
    float m, s;
    fsdp_ce_row_stats(x, n, sh, &m, &s);
    if (threadIdx.x != 0) {
        return;
    }
    long c = fsdp_ce_col(t, col0, n);
    if (losses) {
        losses[row] = m + logf(s) - x[t];
        stats[2 * row] = m;
        stats[2 * row + 1] = s;
    } else if (first) {
        stats[2 * row] = m;
        stats[2 * row + 1] = s;
        target_logit[row] = c >= 0 ? x[c] : 0.0f;
    } else {
        float m0 = stats[2 * row], s0 = stats[2 * row + 1];
        float mx = m > m0 ? m : m0;
        stats[2 * row] = mx;
        stats[2 * row + 1] = s0 * expf(m0 - mx) + s * expf(m - mx);
        if (c >= 0) {
            target_logit[row] = x[c];
        }
    }
}

/* dlogits of the slice [col0, col0 + n) from the final stats; may equal logits */
static __global__ void fsdp_ce_backward_kernel(float *dlogits, const float *logits,
                                               const float *stats, const int32_t *targets,
                                               size_t n, size_t col0, int32_t ignore_index,
                                               float dscale)
{
    size_t row = blockIdx.x;
    int32_t t = targets[row];
    float *d = dlogits + row * n;
    const float *x = logits + row * n;
    if (t == ignore_index) {
        for (size_t c = threadIdx.x; c < n; c += blockDim.x) {
            d[c] = 0.0f;
        }
        return;
    }
    float m = stats[2 * row], inv = dscale / stats[2 * row + 1];
    long tc = fsdp_ce_col(t, col0, n);
    for (size_t c = threadIdx.x; c < n; c += blockDim.x) {
        float g = expf(x[c] - m) * inv;
        d[c] = (long)c == tc ? g - dscale : g;
    }
}

void fsdp_cuda_crossentropy_forward(float *losses, float *stats, const float *logits,
                                    const int32_t *targets, size_t N, size_t V,
                                    int32_t ignore_index, void *stream)
{
    if (N == 0 || V == 0) {
        return;
    }
    FSDP_CUDA_LAUNCH(fsdp_ce_forward_kernel, dim3((unsigned)N), dim3(fsdp_cuda_row_threads(V)), 0,
                     stream, losses, stats, (float *)NULL, logits, targets, V, (size_t)0,
                     ignore_index, 1);
}

void fsdp_cuda_crossentropy_backward(float *dlogits, const float *logits, const float *stats,
                                     const int32_t *targets, size_t N, size_t V,
                                     int32_t ignore_index, float dscale, void *stream)
{
    fsdp_cuda_crossentropy_slice_backward(dlogits, logits, stats, targets, N, V, 0, ignore_index,
                                          dscale, stream);
}

void fsdp_cuda_crossentropy_slice_forward(float *stats, float *target_logit, const float *logits,
                                          const int32_t *targets, size_t N, size_t n, size_t col0,
                                          int32_t ignore_index, int first, void *stream)
{
    if (N == 0 || n == 0) {
        return;
    }
    FSDP_CUDA_LAUNCH(fsdp_ce_forward_kernel, dim3((unsigned)N), dim3(fsdp_cuda_row_threads(n)), 0,
                     stream, (float *)NULL, stats, target_logit, logits, targets, n, col0,
                     ignore_index, first);
}

void fsdp_cuda_crossentropy_slice_backward(float *dlogits, const float *logits, const float *stats,
                                           const int32_t *targets, size_t N, size_t n,
                                           size_t col0, int32_t ignore_index, float dscale,
                                           void *stream)
{
    if (N == 0 || n == 0) {
        return;
    }
    FSDP_CUDA_LAUNCH(fsdp_ce_backward_kernel, dim3((unsigned)N), dim3(fsdp_cuda_row_threads(n)), 0,
                     stream, dlogits, logits, stats, targets, n, col0, ignore_index, dscale);
}
