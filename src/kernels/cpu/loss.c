/*
 * loss.c - softmax cross-entropy over the LM head's logits, fused with its
 * gradient: one pass for the row maximum, one that computes exp(x - max),
 * sums it and parks it in the gradient row, one that scales it and
 * subtracts the one-hot. The logits buffer may be reused for the gradient,
 * which saves a (B, T, V) activation.
 */
#include "config.h"
#include "kernels/kernels.h"
#include "kernels/cpu/simd.h"
#include "core/error.h"

#include <math.h>
#include <string.h>

static float cpu_row_max(const float *x, size_t n)
{
    size_t i = 0;
    cpu_vf vm = cpu_vset1(-INFINITY);
    for (; i + CPU_VW <= n; i += CPU_VW) {
        vm = cpu_vmax(vm, cpu_vload(x + i));
    }
    float m = cpu_vhmax(vm);
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

/* sum of exp(x - m); writes the terms to e unless e is NULL (e may equal x) */
static float cpu_row_expsum(float *e, const float *x, float m, size_t n)
{
    size_t i = 0;
    cpu_vf vs = cpu_vset1(0.0f);
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf t = cpu_vexp(cpu_vload(x + i) - m);
        vs += t;
        if (e) {
            cpu_vstore(e + i, t);
        }
    }
    if (i < n) {
        cpu_vf t = cpu_vexp(cpu_vload_tail(x + i, n - i, 0.0f) - m);
        t = cpu_vselect(cpu_vtail_mask(n - i), t, cpu_vset1(0.0f));
        vs += t;
        if (e) {
            cpu_vstore_tail(e + i, n - i, t);
        }
    }
    return cpu_vhsum(vs);
}

int fsdp_cpu_crossentropy_fused(float *losses, float *dlogits, const float *logits,
                                const int32_t *targets, size_t N, size_t V, int32_t ignore_index,
                                float dscale, size_t *n_kept, float *mean)
{
    /* validate first: a bad target must not leave half-written outputs */
    size_t kept = 0;
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
        kept++;
    }
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
            float inv = dscale / s;
            size_t i = 0;
            for (; i + CPU_VW <= V; i += CPU_VW) {
                cpu_vstore(d + i, cpu_vload(d + i) * inv);
            }
            for (; i < V; i++) {
                d[i] *= inv;
            }
            d[t] -= dscale;
        }
    }
    *n_kept = kept;
    *mean = kept ? (float)(sum / (double)kept) : NAN;
    return 0;
}
