/*
 * small.c - the small loops around the big kernels: the Llama embedding's
 * gather and scatter-add, gradient accumulation, the loss sum and the
 * tensor-parallel loss rows, fills. They were host loops in the models and
 * the engine; as kernels they run where the buffers live (compute/device.h).
 * Each keeps the arithmetic order of the loop it replaces, so results are
 * bit for bit those of before.
 */
#include "config.h"
#include "compute/kernels.h"

#include <math.h>
#include <string.h>

void fsdp_cpu_embed_gather(float *out, const int32_t *tokens, const float *table, size_t N,
                           size_t C)
{
    for (size_t r = 0; r < N; r++) {
        memcpy(out + r * C, table + (size_t)tokens[r] * C, C * sizeof(float));
    }
}

void fsdp_cpu_embed_scatter_add(float *dtable, const float *dout, const int32_t *tokens, size_t N,
                                size_t C)
{
    for (size_t r = 0; r < N; r++) {
        float *row = dtable + (size_t)tokens[r] * C;
        const float *d = dout + r * C;
        for (size_t i = 0; i < C; i++) {
            row[i] += d[i];
        }
    }
}

void fsdp_cpu_accumulate(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        y[i] += x[i];
    }
}

void fsdp_cpu_accumulate16(float *y, const uint16_t *x, size_t n, int bf16, int accumulate)
{
    if (!accumulate) {
        (bf16 ? fsdp_cpu_bf16_to_f32 : fsdp_cpu_f16_to_f32)(y, x, n);
        return;
    }
    float tmp[256];
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        size_t k = n - i0 < 256 ? n - i0 : 256;
        (bf16 ? fsdp_cpu_bf16_to_f32 : fsdp_cpu_f16_to_f32)(tmp, x + i0, k);
        for (size_t i = 0; i < k; i++) {
            y[i0 + i] += tmp[i];
        }
    }
}

void fsdp_cpu_loss_sum(double *acc, const float *losses, const int32_t *targets, size_t N,
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

void fsdp_cpu_xent_losses(float *losses, const float *stats, const float *target_logit,
                          const int32_t *targets, size_t N, int32_t ignore_index)
{
    for (size_t r = 0; r < N; r++) {
        int keep = targets[r] != ignore_index;
        losses[r] = keep ? stats[2 * r] + logf(stats[2 * r + 1]) - target_logit[r] : 0.0f;
    }
}

void fsdp_cpu_xent_combine(int phase, float *stats, float *zt, float *mx, float *sz, size_t N,
                           int have)
{
    for (size_t i = 0; i < N; i++) {
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

void fsdp_cpu_fill(float *x, size_t n, size_t stride, float value)
{
    for (size_t i = 0; i < n; i++) {
        x[i * stride] = value;
    }
}
