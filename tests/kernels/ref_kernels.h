/*
 * ref_kernels.h - naive double-precision GPT-2 building blocks, written
 * straight from the PyTorch / Hugging Face definitions, for the gradient
 * checks of the kernels and the model. Clarity over speed; no shared code
 * with src/compute.
 */
#ifndef FSDP_TESTS_REF_KERNELS_H
#define FSDP_TESTS_REF_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

__attribute__((unused)) static void ref_encoder(double *out, const int32_t *tok, const double *wte,
                                                const double *wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int c = 0; c < C; c++) {
                out[((size_t)b * T + t) * C + c] =
                    wte[(size_t)tok[b * T + t] * C + c] + wpe[(size_t)t * C + c];
            }
        }
    }
}

/* torch.nn.LayerNorm: biased variance, eps inside the square root */
__attribute__((unused)) static void ref_layernorm(double *out, const double *inp, const double *w,
                                                  const double *b, size_t N, size_t C, double eps)
{
    for (size_t r = 0; r < N; r++) {
        const double *x = inp + r * C;
        double m = 0, v = 0;
        for (size_t i = 0; i < C; i++) m += x[i];
        m /= (double)C;
        for (size_t i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= (double)C;
        for (size_t i = 0; i < C; i++) {
            out[r * C + i] = (x[i] - m) / sqrt(v + eps) * w[i] + b[i];
        }
    }
}

/* out = inp @ W^T + b (W is (OC, C)); b may be NULL */
__attribute__((unused)) static void ref_matmul(double *out, const double *inp, const double *W,
                                               const double *b, size_t N, size_t C, size_t OC)
{
    for (size_t r = 0; r < N; r++) {
        for (size_t o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (size_t i = 0; i < C; i++) s += inp[r * C + i] * W[o * C + i];
            out[r * OC + o] = s;
        }
    }
}

/* HF GPT-2 attention: q,k,v = split(qkv, C); scores / sqrt(hs); causal mask */
__attribute__((unused)) static void ref_attention(double *out, const double *qkv, int B, int T,
                                                  int C, int NH)
{
    int hs = C / NH;
    double *p = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)b * T + i) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double s = 0;
                    for (int d = 0; d < hs; d++) s += q[d] * k[d];
                    p[j] = s / sqrt((double)hs);
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= i; j++) {
                    p[j] = exp(p[j] - mx);
                    sum += p[j];
                }
                for (int d = 0; d < hs; d++) {
                    double s = 0;
                    for (int j = 0; j <= i; j++) {
                        s += p[j] / sum * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * hs + d];
                    }
                    out[((size_t)b * T + i) * C + h * hs + d] = s;
                }
            }
        }
    }
    free(p);
}

/* torch.nn.GELU(approximate='tanh') */
__attribute__((unused)) static void ref_gelu(double *out, const double *inp, size_t n)
{
    const double k = sqrt(2.0 / M_PI);
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
}

/* torch.nn.functional.cross_entropy, reduction='mean' over kept rows */
__attribute__((unused)) static double ref_crossentropy(const double *logits, const int32_t *tgt,
                                                       size_t N, size_t V, int32_t ignore)
{
    double sum = 0;
    size_t kept = 0;
    for (size_t r = 0; r < N; r++) {
        if (tgt[r] == ignore) continue;
        const double *x = logits + r * V;
        double mx = -INFINITY, s = 0;
        for (size_t i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
        for (size_t i = 0; i < V; i++) s += exp(x[i] - mx);
        sum += mx + log(s) - x[tgt[r]];
        kept++;
    }
    return kept ? sum / (double)kept : NAN;
}

// ----------------------------------------------------------------------------
// comparison helpers shared by the gradient tests

/* deterministic uniform in [-1, 1) (xorshift64*) */
__attribute__((unused)) static double ref_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t r = *s * 0x2545F4914F6CDD1DULL;
    return (double)(r >> 11) * 0x1p-52 - 1.0;
}

struct ref_cmp {
    double max_abs; /* max |got - want| */
    double max_rel; /* max |got - want| / |want| over |want| > 1e-3 * scale */
    double scale;   /* max |want| */
    size_t worst;   /* index of max_abs */
};

__attribute__((unused)) static struct ref_cmp ref_compare(const float *got, const double *want,
                                                          size_t n)
{
    struct ref_cmp c = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) c.scale = fabs(want[i]) > c.scale ? fabs(want[i]) : c.scale;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (e > c.max_abs || isnan(e)) {
            c.max_abs = isnan(e) ? INFINITY : e;
            c.worst = i;
        }
        if (fabs(want[i]) > 1e-3 * c.scale && e / fabs(want[i]) > c.max_rel) c.max_rel = e / fabs(want[i]);
    }
    return c;
}

#endif
