/*
 * optim.c - the gradient-norm helpers (sum of squares, clip coefficient,
 * scaling) beside the AdamW update (adamw.c). The sharding engine calls
 * these on its local shards; which ranges decay is the model's business
 * (fsdp_optimizer_update in src/optim splits a unit range by parameter).
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"

#include <math.h>

double fsdp_cpu_sumsq(const float *x, size_t n)
{
    double total = 0.0;
    size_t i = 0;
    while (i + CPU_VW <= n) {
        /* f32 lanes over at most 4096 elements, then into double */
        size_t end = i + 4096 < n ? i + 4096 : n;
        cpu_vf acc = cpu_vset1(0.0f);
        for (; i + CPU_VW <= end; i += CPU_VW) {
            cpu_vf t = cpu_vload(x + i);
            acc += t * t;
        }
        total += (double)cpu_vhsum(acc);
    }
    for (; i < n; i++) {
        total += (double)x[i] * (double)x[i];
    }
    return total;
}

float fsdp_cpu_clip_coef(double sumsq, float max_norm)
{
    double coef = (double)max_norm / (sqrt(sumsq) + 1e-6);
    if (isnan(coef)) {
        return NAN; /* a non-finite norm must stay visible, as in torch */
    }
    return coef < 1.0 ? (float)coef : 1.0f;
}

void fsdp_cpu_scale(float *x, size_t n, float s)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vstore(x + i, cpu_vload(x + i) * s);
    }
    for (; i < n; i++) {
        x[i] *= s;
    }
}
