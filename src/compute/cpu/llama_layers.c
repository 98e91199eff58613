/*
 * llama_layers.c - the Llama family's element-wise building blocks: RMSNorm,
 * rotary position embedding (with Hugging Face's rope_scaling types) and the
 * SwiGLU gate. The grouped-query attention lives with the other attention
 * (attention.c), the projections are the linear layer (matmul.c).
 *
 * Every formula is the one Hugging Face's Llama implementation computes in
 * f32, so that an imported model reproduces transformers' logits:
 *   RMSNorm  y = w * (x * rsqrt(mean(x^2) + eps))
 *   RoPE     pairs (i, i + hs/2) of every q and k head rotated by t * f_i,
 *            f_i = theta^(-2i/hs) (rotate_half convention)
 *   SwiGLU   y = silu(gate) * up
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"

#include <math.h>
#include <string.h>

// ----------------------------------------------------------------------------
// RMSNorm
//
// A row (C floats) stays in L1 between its passes, so each kernel reads its
// inputs from memory once. Sums go through CPU_VW partial sums, added
// pairwise at the end (cpu_vhsum), which is also closer to torch's tree
// reduction than one running sum.

/* sum of x^2 */
static inline float cpu_row_sumsq(const float *x, size_t n)
{
    cpu_vf acc = cpu_vset1(0.0f);
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf v = cpu_vload(x + i);
        acc += v * v;
    }
    float s = cpu_vhsum(acc);
    for (; i < n; i++) {
        s += x[i] * x[i];
    }
    return s;
}

/* y = w * (x * r); keep, when not NULL, gets a copy of x */
static inline void cpu_rms_scale_row(float *y, float *keep, const float *x, const float *w,
                                     float r, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf v = cpu_vload(x + i);
        cpu_vstore(y + i, cpu_vload(w + i) * (v * r));
        if (keep) {
            cpu_vstore(keep + i, v);
        }
    }
    for (; i < n; i++) {
        y[i] = w[i] * (x[i] * r);
        if (keep) {
            keep[i] = x[i];
        }
    }
}

void fsdp_cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                              size_t N, size_t C, float eps)
{
    fsdp_cpu_rmsnorm_forward_keep(out, rstd, NULL, inp, weight, N, C, eps);
}

void fsdp_cpu_rmsnorm_forward_keep(float *out, float *rstd, float *keep, const float *inp,
                                   const float *weight, size_t N, size_t C, float eps)
{
    CPU_OMP_FOR
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float r = 1.0f / sqrtf(cpu_row_sumsq(x, C) / (float)C + eps);
        cpu_rms_scale_row(out + n * C, keep ? keep + n * C : NULL, x, weight, r, C);
        rstd[n] = r;
    }
}

/*
 * With xh = x * r and g = dout * w:
 *   dx = r * (g - xh * mean(g * xh)),   dw += dout * xh
 * Rows are serial: every row adds into dweight.
 */
void fsdp_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, size_t N, size_t C)
{
    for (size_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *dy = dout + n * C;
        float *dx = dinp + n * C;
        float r = rstd[n];
        cpu_vf acc = cpu_vset1(0.0f);
        size_t c = 0;
        for (; c + CPU_VW <= C; c += CPU_VW) {
            cpu_vf xh = cpu_vload(x + c) * r, d = cpu_vload(dy + c);
            acc += d * cpu_vload(weight + c) * xh;
            cpu_vstore(dweight + c, cpu_vload(dweight + c) + d * xh);
        }
        float dot = cpu_vhsum(acc);
        for (; c < C; c++) {
            float xh = x[c] * r;
            dot += dy[c] * weight[c] * xh;
            dweight[c] += dy[c] * xh;
        }
        dot /= (float)C;
        for (c = 0; c + CPU_VW <= C; c += CPU_VW) {
            cpu_vf xh = cpu_vload(x + c) * r;
            cpu_vf g = cpu_vload(dy + c) * cpu_vload(weight + c);
            cpu_vstore(dx + c, cpu_vload(dx + c) + r * (g - xh * dot));
        }
        for (; c < C; c++) {
            float xh = x[c] * r;
            dx[c] += r * (dy[c] * weight[c] - xh * dot);
        }
    }
}

// ----------------------------------------------------------------------------
// rotary position embedding

int fsdp_cpu_rope_inv_freq(float *inv_freq, int hs, double theta,
                           const struct fsdp_rope_scaling *sc)
{
    if (hs <= 0 || hs % 2 != 0 || !(theta > 0)) {
        return -1;
    }
    const double two_pi = 6.283185307179586476925286766559;
    for (int i = 0; i < hs / 2; i++) {
        /* as transformers: the exponent in f32 (arange(0, hs, 2).float() / hs) */
        float e = (float)(2 * i) / (float)hs;
        double f = 1.0 / pow(theta, (double)e);
        if (sc && sc->type == FSDP_ROPE_LINEAR) {
            f /= sc->factor;
        } else if (sc && sc->type == FSDP_ROPE_LLAMA3) {
            double low_wl = sc->original_context / sc->low_freq_factor;
            double high_wl = sc->original_context / sc->high_freq_factor;
            double wl = two_pi / f;
            if (wl > low_wl) {
                f /= sc->factor;
            } else if (wl >= high_wl) {
                double smooth = (sc->original_context / wl - sc->low_freq_factor) /
                                (sc->high_freq_factor - sc->low_freq_factor);
                f = (1.0 - smooth) * f / sc->factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
    return 0;
}

void fsdp_cpu_rope_table(float *cos_t, float *sin_t, const float *inv_freq, int pos0, int T,
                         int hs)
{
    int h2 = hs / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < h2; i++) {
            /* the angle as transformers forms it: f32 position x f32 frequency */
            float a = (float)(pos0 + t) * inv_freq[i];
            cos_t[(size_t)t * (size_t)h2 + (size_t)i] = cosf(a);
            sin_t[(size_t)t * (size_t)h2 + (size_t)i] = sinf(a);
        }
    }
}

/* One head's pairs (x[i], x[i + h2]) rotated by cos c[i], sin dir * s[i]. */
static inline void cpu_rope_pairs(float *x, const float *c, const float *s, size_t h2, float dir)
{
    size_t i = 0;
    for (; i + CPU_VW <= h2; i += CPU_VW) {
        cpu_vf x1 = cpu_vload(x + i), x2 = cpu_vload(x + i + h2);
        cpu_vf cv = cpu_vload(c + i), sn = cpu_vload(s + i) * dir;
        cpu_vstore(x + i, x1 * cv - x2 * sn);
        cpu_vstore(x + i + h2, x2 * cv + x1 * sn);
    }
    for (; i < h2; i++) {
        float x1 = x[i], x2 = x[i + h2], sn = dir * s[i];
        x[i] = x1 * c[i] - x2 * sn;
        x[i + h2] = x2 * c[i] + x1 * sn;
    }
}

/* Rotates the heads [h0, h0 + nh) of every row of buf (row stride ld), by
 * +angle (dir 1) or -angle (dir -1). */
static void cpu_rope_heads(float *buf, size_t ld, size_t h0, size_t nh, const float *cos_t,
                           const float *sin_t, int B, int T, int hs, float dir)
{
    size_t h2 = (size_t)hs / 2;
    for (size_t b = 0; b < (size_t)B; b++) {
        for (size_t t = 0; t < (size_t)T; t++) {
            float *row = buf + (b * (size_t)T + t) * ld;
            const float *c = cos_t + t * h2, *s = sin_t + t * h2;
            for (size_t h = h0; h < h0 + nh; h++) {
                cpu_rope_pairs(row + h * (size_t)hs, c, s, h2, dir);
            }
        }
    }
}

void fsdp_cpu_rope_forward(float *qkv, const float *cos_t, const float *sin_t, int B, int T,
                           int NH, int NKV, int hs)
{
    /* q heads then k heads: contiguous, NH + NKV of them */
    size_t ld = (size_t)(NH + 2 * NKV) * (size_t)hs;
    cpu_rope_heads(qkv, ld, 0, (size_t)(NH + NKV), cos_t, sin_t, B, T, hs, 1.0f);
}

void fsdp_cpu_rope_backward(float *dqkv, const float *cos_t, const float *sin_t, int B, int T,
                            int NH, int NKV, int hs)
{
    /* the rotation's transpose is the rotation by -angle */
    size_t ld = (size_t)(NH + 2 * NKV) * (size_t)hs;
    cpu_rope_heads(dqkv, ld, 0, (size_t)(NH + NKV), cos_t, sin_t, B, T, hs, -1.0f);
}

// ----------------------------------------------------------------------------
// SwiGLU

/* silu(g) and the sigmoid of g, a vector at a time (cpu_vexp: rel error
 * below 2^-22; the clamp keeps exp(-g) finite, so 1 / (1 + e) is exact at
 * both ends). */
static inline cpu_vf cpu_sigmoid(cpu_vf g)
{
    return 1.0f / (1.0f + cpu_vexp(-g));
}

void fsdp_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf g = cpu_vload(gate + i);
        cpu_vstore(out + i, g * cpu_sigmoid(g) * cpu_vload(up + i));
    }
    if (i < n) {
        cpu_vf g = cpu_vload_tail(gate + i, n - i, 0.0f);
        cpu_vstore_tail(out + i, n - i, g * cpu_sigmoid(g) * cpu_vload_tail(up + i, n - i, 0.0f));
    }
}

void fsdp_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf g = cpu_vload(gate + i), u = cpu_vload(up + i), dy = cpu_vload(dout + i);
        cpu_vf sg = cpu_sigmoid(g);
        cpu_vstore(dup + i, dy * g * sg);
        cpu_vstore(dgate + i, dy * u * sg * (1.0f + g * (1.0f - sg)));
    }
    if (i < n) {
        size_t k = n - i;
        cpu_vf g = cpu_vload_tail(gate + i, k, 0.0f), u = cpu_vload_tail(up + i, k, 0.0f);
        cpu_vf dy = cpu_vload_tail(dout + i, k, 0.0f), sg = cpu_sigmoid(g);
        cpu_vstore_tail(dup + i, k, dy * g * sg);
        cpu_vstore_tail(dgate + i, k, dy * u * sg * (1.0f + g * (1.0f - sg)));
    }
}
