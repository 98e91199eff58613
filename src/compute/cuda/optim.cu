/*
 * optim.cu - the AdamW step over a flat f32 shard on the GPU, one element
 * per thread in a grid-stride loop. The step's scalars (bias corrections,
 * decay factor) are formed on the host in double, as compute/cpu/optim.c
 * forms them, and the element arithmetic is the CPU's, term for term.
 */
#include "compute/cuda/common.cuh"

#include <math.h>

struct fsdp_adamw_scalars {
    float step_size; /* lr / (1 - beta1^step) */
    float bc2_sqrt;  /* sqrt(1 - beta2^step) */
    float wd_mul;    /* 1 - lr * weight_decay, or 1 */
    float w1, b2, w2, eps, grad_scale;
};

static __global__ void fsdp_adamw_kernel(float *param, const float *grad, float *m, float *v,
                                         size_t n, struct fsdp_adamw_scalars k)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        float g = grad[i] * k.grad_scale;
        float p = param[i] * k.wd_mul;
        float mm = m[i] + k.w1 * (g - m[i]);
        float vv = v[i] * k.b2 + k.w2 * (g * g);
        float denom = sqrtf(vv) / k.bc2_sqrt + k.eps;
        m[i] = mm;
        v[i] = vv;
        param[i] = p + (-k.step_size) * mm / denom;
    }
}

void fsdp_cuda_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                            const struct fsdp_adamw_params *hp, int decay, float grad_scale,
                            void *stream)
{
    if (n == 0) {
        return;
    }
    double bc1 = 1.0 - pow((double)hp->beta1, (double)hp->step);
    double bc2 = 1.0 - pow((double)hp->beta2, (double)hp->step);
    struct fsdp_adamw_scalars k;
    k.step_size = (float)((double)hp->lr / bc1);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.wd_mul = decay ? (float)(1.0 - (double)hp->lr * (double)hp->weight_decay) : 1.0f;
    k.w1 = 1.0f - hp->beta1;
    k.b2 = hp->beta2;
    k.w2 = 1.0f - hp->beta2;
    k.eps = hp->eps;
    k.grad_scale = grad_scale;
    FSDP_CUDA_EW_LAUNCH(fsdp_adamw_kernel, n, stream, param, grad, m, v, n, k);
}
