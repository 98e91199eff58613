/*
 * matmul.c - the linear layer out = inp @ W^T + b (W is (OC, C) like
 * torch.nn.Linear) forward and backward through cblas_sgemm. Bias and
 * residual adds are folded into the product: they are written into the
 * output first and sgemm accumulates onto them (beta = 1).
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"

#include <cblas.h>
#include <string.h>

/* out[r,:] = (residual ? residual[r,:] : 0) + (bias ? bias : 0) */
static void cpu_prefill(float *out, const float *bias, const float *residual, size_t N, size_t OC)
{
    CPU_OMP_FOR
    for (size_t r = 0; r < N; r++) {
        float *o = out + r * OC;
        const float *res = residual ? residual + r * OC : NULL;
        if (res && bias) {
            cpu_row_add(o, res, bias, OC);
        } else if (bias) {
            memcpy(o, bias, OC * sizeof(float));
        } else if (res != o) {
            memcpy(o, res, OC * sizeof(float));
        }
    }
}

void fsdp_cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                             const float *residual, size_t N, size_t C, size_t OC)
{
    float beta = 0.0f;
    if (bias || residual) {
        /* in place with no bias: the residual already sits in out */
        if (bias || residual != out) {
            cpu_prefill(out, bias, residual, N, OC);
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0f, inp,
                (int)C, weight, (int)C, beta, out, (int)OC);
}

/* db[o] += alpha * sum_r dout[r,o], a 256-column tile at a time in a stack accumulator */
static void cpu_bias_grad(float *dbias, const float *dout, size_t N, size_t OC, float alpha)
{
    for (size_t o0 = 0; o0 < OC; o0 += 256) {
        size_t o1 = o0 + 256 < OC ? o0 + 256 : OC;
        float acc[256];
        memset(acc, 0, sizeof(acc));
        for (size_t r = 0; r < N; r++) {
            cpu_row_add(acc, acc, dout + r * OC + o0, o1 - o0);
        }
        for (size_t o = o0; o < o1; o++) {
            dbias[o] += alpha * acc[o - o0];
        }
    }
}

void fsdp_cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, size_t N, size_t C,
                              size_t OC, float alpha, int accumulate_dinp)
{
    if (dinp) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, alpha,
                    dout, (int)OC, weight, (int)C, accumulate_dinp ? 1.0f : 0.0f, dinp, (int)C);
    }
    if (dweight) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, alpha, dout,
                    (int)OC, inp, (int)C, 1.0f, dweight, (int)C);
    }
    if (dbias) {
        cpu_bias_grad(dbias, dout, N, OC, alpha);
    }
}
