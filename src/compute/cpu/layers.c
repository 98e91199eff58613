/*
 * layers.c - the row-wise and element-wise GPT-2 kernels: token + position
 * embedding, layer norm, GELU (tanh form) and the residual add, forward and
 * backward, on host f32 buffers. Matrix products live in matmul.c and
 * attention.c; nothing here allocates.
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"

#include <math.h>
#include <string.h>

// ----------------------------------------------------------------------------
// embeddings

void fsdp_cpu_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C)
{
    size_t Cs = (size_t)C;
    CPU_OMP_FOR
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * Cs;
        const float *e = wte + (size_t)tokens[bt] * Cs;
        const float *p = wpe + (size_t)(bt % T) * Cs;
        cpu_row_add(o, e, p, Cs);
    }
}

void fsdp_cpu_encoder_backward(float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C)
{
    /* serial on purpose: repeated tokens scatter into the same dwte row */
    size_t Cs = (size_t)C;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t bt = (size_t)b * (size_t)T + (size_t)t;
            const float *d = dout + bt * Cs;
            float *ge = dwte + (size_t)tokens[bt] * Cs, *gp = dwpe + (size_t)t * Cs;
            cpu_row_add(ge, ge, d, Cs);
            cpu_row_add(gp, gp, d, Cs);
        }
    }
}

/* Row of table (rows [row0, row0 + n) held) for index i, or NULL when not held. */
static inline const float *cpu_held_row(const float *table, size_t row0, size_t n, size_t i,
                                        size_t C)
{
    return i >= row0 && i - row0 < n ? table + (i - row0) * C : NULL;
}

void fsdp_cpu_embed_rows_forward(float *out, const int32_t *tokens, const float *wte, size_t v0,
                                 size_t vn, const float *wpe, size_t p0, size_t pn, size_t N,
                                 int T, int C)
{
    size_t Cs = (size_t)C;
    CPU_OMP_FOR
    for (size_t r = 0; r < N; r++) {
        float *o = out + r * Cs;
        const float *e = cpu_held_row(wte, v0, vn, (size_t)tokens[r], Cs);
        const float *p = cpu_held_row(wpe, p0, pn, r % (size_t)T, Cs);
        if (e && p) {
            cpu_row_add(o, e, p, Cs);
        } else if (e || p) {
            memcpy(o, e ? e : p, Cs * sizeof(float));
        } else {
            memset(o, 0, Cs * sizeof(float));
        }
    }
}

void fsdp_cpu_embed_rows_backward(float *dwte, float *dwpe, const float *dout,
                                  const int32_t *tokens, size_t v0, size_t vn, size_t p0,
                                  size_t pn, size_t N, int T, int C)
{
    /* serial on purpose, in row order: repeated tokens scatter into one row */
    size_t Cs = (size_t)C;
    for (size_t r = 0; r < N; r++) {
        const float *d = dout + r * Cs;
        float *e = (float *)cpu_held_row(dwte, v0, vn, (size_t)tokens[r], Cs);
        float *p = (float *)cpu_held_row(dwpe, p0, pn, r % (size_t)T, Cs);
        if (e) {
            cpu_row_add(e, e, d, Cs);
        }
        if (p) {
            cpu_row_add(p, p, d, Cs);
        }
    }
}

// ----------------------------------------------------------------------------
// layer norm

static inline float cpu_row_sum(const float *x, size_t n)
{
    cpu_vf acc = cpu_vset1(0.0f);
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        acc += cpu_vload(x + i);
    }
    float s = cpu_vhsum(acc);
    for (; i < n; i++) {
        s += x[i];
    }
    return s;
}

/* sum of (x - m)^2: the two-pass variance, as accurate as torch's Welford */
static inline float cpu_row_sqdev(const float *x, float m, size_t n)
{
    cpu_vf acc = cpu_vset1(0.0f);
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf d = cpu_vload(x + i) - m;
        acc += d * d;
    }
    float s = cpu_vhsum(acc);
    for (; i < n; i++) {
        float d = x[i] - m;
        s += d * d;
    }
    return s;
}

void fsdp_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, size_t N, size_t C,
                                float eps)
{
    CPU_OMP_FOR
    for (size_t r = 0; r < N; r++) {
        const float *x = inp + r * C;
        float *o = out + r * C;
        float m = cpu_row_sum(x, C) / (float)C;
        float var = cpu_row_sqdev(x, m, C) / (float)C;
        float s = 1.0f / sqrtf(var + eps);
        size_t i = 0;
        for (; i + CPU_VW <= C; i += CPU_VW) {
            cpu_vf n = (cpu_vload(x + i) - m) * s;
            cpu_vstore(o + i, n * cpu_vload(weight + i) + cpu_vload(bias + i));
        }
        for (; i < C; i++) {
            o[i] = (x[i] - m) * s * weight[i] + bias[i];
        }
        mean[r] = m;
        rstd[r] = s;
    }
}

/*
 * With xhat = (x - mean) * rstd and g = dout * weight:
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
 * Rows are processed serially because every row adds into dweight/dbias.
 */
void fsdp_cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, size_t N, size_t C)
{
    for (size_t r = 0; r < N; r++) {
        const float *x = inp + r * C, *d = dout + r * C;
        float *dx = dinp + r * C;
        float m = mean[r], s = rstd[r];
        cpu_vf a_g = cpu_vset1(0.0f), a_gx = cpu_vset1(0.0f);
        size_t i = 0;
        for (; i + CPU_VW <= C; i += CPU_VW) {
            cpu_vf xh = (cpu_vload(x + i) - m) * s;
            cpu_vf dv = cpu_vload(d + i);
            cpu_vf g = dv * cpu_vload(weight + i);
            a_g += g;
            a_gx += g * xh;
            cpu_vstore(dbias + i, cpu_vload(dbias + i) + dv);
            cpu_vstore(dweight + i, cpu_vload(dweight + i) + dv * xh);
        }
        float sg = cpu_vhsum(a_g), sgx = cpu_vhsum(a_gx);
        for (size_t j = i; j < C; j++) {
            float xh = (x[j] - m) * s;
            float g = d[j] * weight[j];
            sg += g;
            sgx += g * xh;
            dbias[j] += d[j];
            dweight[j] += d[j] * xh;
        }
        float mg = sg / (float)C, mgx = sgx / (float)C;
        for (i = 0; i + CPU_VW <= C; i += CPU_VW) {
            cpu_vf xh = (cpu_vload(x + i) - m) * s;
            cpu_vf g = cpu_vload(d + i) * cpu_vload(weight + i);
            cpu_vstore(dx + i, cpu_vload(dx + i) + (g - mg - xh * mgx) * s);
        }
        for (; i < C; i++) {
            float xh = (x[i] - m) * s;
            float g = d[i] * weight[i];
            dx[i] += (g - mg - xh * mgx) * s;
        }
    }
}

// ----------------------------------------------------------------------------
// GELU, tanh form
//
// 0.5 (1 + tanh(u)) == sigmoid(2u), so gelu(x) = x / (1 + exp(-2u)): one exp
// and no cancellation for negative x. With e = exp(-2u) and s = 1 / (1 + e),
// 1 - s = e s, so the derivative also avoids the cancellation in 1 - s:
//   gelu'(x) = s + 2 x e s^2 du/dx,   du/dx = k (1 + 3 c x^2).

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

/* exp(-2u) = exp(x (-2k - 2kc x^2)) */
static inline cpu_vf cpu_gelu_exp(cpu_vf x)
{
    return cpu_vexp(x * (-2.0f * GELU_K + (-2.0f * GELU_K * GELU_C) * (x * x)));
}

static inline cpu_vf cpu_gelu_grad(cpu_vf x)
{
    cpu_vf e = cpu_gelu_exp(x);
    cpu_vf s = 1.0f / (1.0f + e);
    cpu_vf du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    cpu_vf es = e * s; /* 1 - s, in [0, 1]: multiply it in first so nothing overflows */
    return s + (2.0f * x * du) * es * s;
}

void fsdp_cpu_gelu_forward(float *out, const float *inp, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf x = cpu_vload(inp + i);
        cpu_vstore(out + i, x / (1.0f + cpu_gelu_exp(x)));
    }
    if (i < n) {
        cpu_vf x = cpu_vload_tail(inp + i, n - i, 0.0f);
        cpu_vstore_tail(out + i, n - i, x / (1.0f + cpu_gelu_exp(x)));
    }
}

void fsdp_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf x = cpu_vload(inp + i);
        cpu_vstore(dinp + i, cpu_vload(dout + i) * cpu_gelu_grad(x));
    }
    if (i < n) {
        cpu_vf x = cpu_vload_tail(inp + i, n - i, 0.0f);
        cpu_vf d = cpu_vload_tail(dout + i, n - i, 0.0f);
        cpu_vstore_tail(dinp + i, n - i, d * cpu_gelu_grad(x));
    }
}

void fsdp_cpu_residual_forward(float *out, const float *a, const float *b, size_t n)
{
    cpu_row_add(out, a, b, n);
}

void fsdp_cpu_bias_residual_forward(float *out, const float *inp, const float *bias,
                                    const float *residual, size_t N, size_t C)
{
    CPU_OMP_FOR
    for (size_t r = 0; r < N; r++) {
        const float *x = inp + r * C, *res = residual ? residual + r * C : NULL;
        float *o = out + r * C;
        for (size_t i = 0; i < C; i++) {
            o[i] = x[i] + (res ? res[i] : 0.0f) + (bias ? bias[i] : 0.0f);
        }
    }
}
