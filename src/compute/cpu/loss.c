/*
 * loss.c - softmax cross-entropy over the LM head's logits: one pass for the
 * row maximum, one that computes exp(x - max) and sums it, and for the
 * gradient one that scales those terms and subtracts the one-hot. Either
 * fused (loss and gradient of the same rows at once, the gradient may
 * overwrite the logits) or split into a forward that keeps two floats per
 * row (max, sum) and a backward that rebuilds the gradient from them, for a
 * head that recomputes its logits a row chunk at a time. The split pair
 * gives the fused kernel's bits. A head that streams over vocabulary slices
 * keeps running statistics per row instead (online log-sum-exp) and the
 * target's logit, and rebuilds each slice's gradient from the final ones;
 * one slice covering the whole row gives the split pair's bits again.
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"
#include "core/error.h"

#include <math.h>
#include <string.h>

/* Counts the rows whose target is not ignore_index; an error names the first bad target. */
static int cpu_ce_validate(const int32_t *targets, size_t N, size_t V, int32_t ignore_index,
                           size_t *kept)
{
    size_t n = 0;
    for (size_t r = 0; r < N; r++) {
        int32_t t = targets[r];
        if (t == ignore_index) {
            continue;
        }
        if (t < 0 || (size_t)t >= V) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "target %d at position %zu out of range [0, %zu) (ignore index %d)",
                            (int)t, r, V, (int)ignore_index);
        }
        n++;
    }
    *kept = n;
    return 0;
}

/* d = e * inv, then d[t] -= dscale (t < 0: no target in this row): the
 * gradient row from its exp terms */
static void cpu_ce_grad_row(float *d, size_t V, float inv, long t, float dscale)
{
    size_t i = 0;
    for (; i + CPU_VW <= V; i += CPU_VW) {
        cpu_vstore(d + i, cpu_vload(d + i) * inv);
    }
    for (; i < V; i++) {
        d[i] *= inv;
    }
    if (t >= 0) {
        d[t] -= dscale;
    }
}

/* Column of target t within the slice [col0, col0 + n), or -1. */
static long cpu_ce_slice_col(int32_t t, size_t col0, size_t n)
{
    return t >= 0 && (size_t)t >= col0 && (size_t)t - col0 < n ? (long)((size_t)t - col0) : -1;
}

int fsdp_cpu_crossentropy_fused(float *losses, float *dlogits, const float *logits,
                                const int32_t *targets, size_t N, size_t V, int32_t ignore_index,
                                float dscale, size_t *n_kept, float *mean)
{
    /* validate first: a bad target must not leave half-written outputs */
    size_t kept = 0;
    FSDP_CHECK(cpu_ce_validate(targets, N, V, ignore_index, &kept));
    double sum = 0.0;
    for (size_t r = 0; r < N; r++) {
        const float *x = logits + r * V;
        float *d = dlogits ? dlogits + r * V : NULL;
        int32_t t = targets[r];
        if (t == ignore_index) {
            losses[r] = 0.0f;
            if (d) {
                memset(d, 0, V * sizeof(float));
            }
            continue;
        }
        float xt = x[t]; /* before d (possibly x) is overwritten */
        float m = cpu_row_max(x, V);
        float s = cpu_row_expsum(d, x, m, V);
        float loss = m + logf(s) - xt;
        losses[r] = loss;
        sum += loss;
        if (d) {
            cpu_ce_grad_row(d, V, dscale / s, t, dscale);
        }
    }
    *n_kept = kept;
    *mean = kept ? (float)(sum / (double)kept) : NAN;
    return 0;
}

int fsdp_cpu_crossentropy_forward(float *losses, float *stats, const float *logits,
                                  const int32_t *targets, size_t N, size_t V, int32_t ignore_index,
                                  size_t *n_kept)
{
    FSDP_CHECK(cpu_ce_validate(targets, N, V, ignore_index, n_kept));
    for (size_t r = 0; r < N; r++) {
        const float *x = logits + r * V;
        int32_t t = targets[r];
        if (t == ignore_index) {
            losses[r] = 0.0f;
            stats[2 * r] = 0.0f;
            stats[2 * r + 1] = 0.0f;
            continue;
        }
        float m = cpu_row_max(x, V);
        float s = cpu_row_expsum(NULL, x, m, V);
        losses[r] = m + logf(s) - x[t];
        stats[2 * r] = m;
        stats[2 * r + 1] = s;
    }
    return 0;
}

void fsdp_cpu_crossentropy_backward(float *dlogits, const float *logits, const float *stats,
                                    const int32_t *targets, size_t N, size_t V,
                                    int32_t ignore_index, float dscale)
{
    /* one slice that is the whole row */
    fsdp_cpu_crossentropy_slice_backward(dlogits, logits, stats, targets, N, V, 0, ignore_index,
                                         dscale);
}

void fsdp_cpu_crossentropy_slice_forward(float *stats, float *target_logit, const float *logits,
                                         const int32_t *targets, size_t N, size_t n, size_t col0,
                                         int32_t ignore_index, int first)
{
    for (size_t r = 0; r < N; r++) {
        const float *x = logits + r * n;
        int32_t t = targets[r];
        if (t == ignore_index) {
            if (first) {
                stats[2 * r] = 0.0f;
                stats[2 * r + 1] = 0.0f;
                target_logit[r] = 0.0f;
            }
            continue;
        }
        float m = cpu_row_max(x, n);
        float s = cpu_row_expsum(NULL, x, m, n);
        long c = cpu_ce_slice_col(t, col0, n);
        if (first) {
            stats[2 * r] = m;
            stats[2 * r + 1] = s;
            target_logit[r] = c >= 0 ? x[c] : 0.0f;
            continue;
        }
        float m0 = stats[2 * r], s0 = stats[2 * r + 1];
        float mx = m > m0 ? m : m0;
        stats[2 * r] = mx;
        stats[2 * r + 1] = s0 * expf(m0 - mx) + s * expf(m - mx);
        if (c >= 0) {
            target_logit[r] = x[c];
        }
    }
}

void fsdp_cpu_crossentropy_slice_backward(float *dlogits, const float *logits, const float *stats,
                                          const int32_t *targets, size_t N, size_t n, size_t col0,
                                          int32_t ignore_index, float dscale)
{
    for (size_t r = 0; r < N; r++) {
        float *d = dlogits + r * n;
        int32_t t = targets[r];
        if (t == ignore_index) {
            memset(d, 0, n * sizeof(float));
            continue;
        }
        /* the forward's sum, not this pass's: the same terms in the same order */
        cpu_row_expsum(d, logits + r * n, stats[2 * r], n);
        cpu_ce_grad_row(d, n, dscale / stats[2 * r + 1], cpu_ce_slice_col(t, col0, n), dscale);
    }
}
