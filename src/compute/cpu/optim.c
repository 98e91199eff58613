/*
 * optim.c - the AdamW update on a flat f32 range and the gradient-norm
 * helpers (sum of squares, clip coefficient, scaling). The sharding engine
 * calls these on its local shards; which ranges decay is the model's
 * business (fsdp_optimizer_update in src/optim splits a unit range by parameter).
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"

#include <math.h>

/*
 * Same order of operations as torch.optim.AdamW (single-tensor path), so
 * results agree to rounding of the scalar factors: the bias corrections are
 * computed in double and rounded once, as torch does with Python floats.
 */
void fsdp_cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                           const struct fsdp_adamw_params *hp, int decay, float grad_scale)
{
    double bc1 = 1.0 - pow((double)hp->beta1, (double)hp->step);
    double bc2 = 1.0 - pow((double)hp->beta2, (double)hp->step);
    float step_size = (float)((double)hp->lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float wd_mul = decay ? (float)(1.0 - (double)hp->lr * (double)hp->weight_decay) : 1.0f;
    float w1 = 1.0f - hp->beta1, b2 = hp->beta2, w2 = 1.0f - hp->beta2, eps = hp->eps;
    CPU_OMP_FOR
    for (size_t i0 = 0; i0 < n; i0 += 1024) {
        size_t i1 = i0 + 1024 < n ? i0 + 1024 : n;
        size_t i = i0;
        for (; i + CPU_VW <= i1; i += CPU_VW) {
            cpu_vf g = cpu_vload(grad + i) * grad_scale;
            cpu_vf p = cpu_vload(param + i) * wd_mul;
            cpu_vf mm = cpu_vload(m + i);
            mm = mm + w1 * (g - mm);
            cpu_vf vv = cpu_vload(v + i) * b2 + w2 * (g * g);
            cpu_vf denom = cpu_vsqrt(vv) / bc2_sqrt + eps;
            p = p + (-step_size) * mm / denom;
            cpu_vstore(m + i, mm);
            cpu_vstore(v + i, vv);
            cpu_vstore(param + i, p);
        }
        for (; i < i1; i++) {
            float g = grad[i] * grad_scale;
            float p = param[i] * wd_mul;
            float mm = m[i] + w1 * (g - m[i]);
            float vv = v[i] * b2 + w2 * (g * g);
            float denom = sqrtf(vv) / bc2_sqrt + eps;
            m[i] = mm;
            v[i] = vv;
            param[i] = p + (-step_size) * mm / denom;
        }
    }
}

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
