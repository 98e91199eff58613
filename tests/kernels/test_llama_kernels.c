/*
 * test_llama_kernels.c - the Llama family's CPU kernels (RMSNorm, RoPE with
 * its scaling types, SwiGLU, grouped-query attention) against naive
 * double-precision references written from Hugging Face's definitions:
 * forward outputs directly, backward by central finite differences of the
 * reference (J = sum(out * R) for a random R, so the backward gets dout = R).
 * Also: grouped-query attention equals multi-head attention on K/V heads
 * repeated per group (outputs, dQ, and dK/dV summed over each group), and
 * the rotation's backward undoes its forward.
 */
#include "config.h"
#include "compute/kernels.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243F6A8885A308D3ULL;

static double urand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ULL << 52) - 1.0;
}

static float *randf(size_t n, double scale)
{
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(scale * urand());
    }
    return f;
}

static double *todouble(const float *f, size_t n)
{
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        d[i] = f[i];
    }
    return d;
}

/* max |got - want| / max |want| */
static double relerr(const float *got, const double *want, size_t n)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        m = e > m ? e : m;
        s = fabs(want[i]) > s ? fabs(want[i]) : s;
    }
    return m / (s > 0 ? s : 1);
}

// ----------------------------------------------------------------------------
// references (double)

static void ref_rmsnorm(double *out, const double *x, const double *w, size_t N, size_t C,
                        double eps)
{
    for (size_t n = 0; n < N; n++) {
        double ss = 0;
        for (size_t c = 0; c < C; c++) ss += x[n * C + c] * x[n * C + c];
        double r = 1.0 / sqrt(ss / (double)C + eps);
        for (size_t c = 0; c < C; c++) out[n * C + c] = w[c] * (x[n * C + c] * r);
    }
}

/* inv_freq as transformers computes it (and, for llama3, its
 * _compute_llama3_parameters), in double */
static void ref_inv_freq(double *f, int hs, double theta, const struct fsdp_rope_scaling *sc)
{
    for (int i = 0; i < hs / 2; i++) {
        double x = 1.0 / pow(theta, (double)(2 * i) / hs);
        if (sc->type == FSDP_ROPE_LINEAR) {
            x = x / sc->factor;
        } else if (sc->type == FSDP_ROPE_LLAMA3) {
            double wavelen = 2 * M_PI / x;
            double low = sc->original_context / sc->low_freq_factor;
            double high = sc->original_context / sc->high_freq_factor;
            if (wavelen < high) {
                /* kept */
            } else if (wavelen > low) {
                x = x / sc->factor;
            } else {
                double smooth = (sc->original_context / wavelen - sc->low_freq_factor) /
                                (sc->high_freq_factor - sc->low_freq_factor);
                x = (1 - smooth) * x / sc->factor + smooth * x;
            }
        }
        f[i] = x;
    }
}

/* q*cos + rotate_half(q)*sin on the q and k heads of each row */
static void ref_rope(double *y, const double *x, const double *f, int B, int T, int NH, int NKV,
                     int hs)
{
    size_t ld = (size_t)(NH + 2 * NKV) * hs;
    memcpy(y, x, (size_t)B * T * ld * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH + NKV; h++) {
                const double *xi = x + ((size_t)b * T + t) * ld + (size_t)h * hs;
                double *yi = y + ((size_t)b * T + t) * ld + (size_t)h * hs;
                for (int d = 0; d < hs; d++) {
                    double a = t * f[d % (hs / 2)];
                    double rot = d < hs / 2 ? -xi[d + hs / 2] : xi[d - hs / 2];
                    yi[d] = xi[d] * cos(a) + rot * sin(a);
                }
            }
        }
    }
}

static void ref_swiglu(double *y, const double *g, const double *u, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = g[i] / (1 + exp(-g[i])) * u[i];
}

static void ref_gqa(double *out, const double *qkv, int B, int T, int NH, int NKV, int hs)
{
    size_t C = (size_t)NH * hs, KV = (size_t)NKV * hs, ld = C + 2 * KV;
    double *s = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            for (int i = 0; i < T; i++) {
                const double *q = qkv + ((size_t)b * T + i) * ld + (size_t)h * hs;
                double m = -INFINITY, z = 0;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * ld + C + (size_t)g * hs;
                    double d = 0;
                    for (int e = 0; e < hs; e++) d += q[e] * k[e];
                    s[j] = d / sqrt((double)hs);
                    m = s[j] > m ? s[j] : m;
                }
                for (int j = 0; j <= i; j++) z += exp(s[j] - m);
                double *o = out + ((size_t)b * T + i) * C + (size_t)h * hs;
                for (int e = 0; e < hs; e++) {
                    double acc = 0;
                    for (int j = 0; j <= i; j++) {
                        const double *v = qkv + ((size_t)b * T + j) * ld + C + KV + (size_t)g * hs;
                        acc += exp(s[j] - m) / z * v[e];
                    }
                    o[e] = acc;
                }
            }
        }
    }
    free(s);
}

// ----------------------------------------------------------------------------
// finite differences: d/dx_i of sum(fwd(x) * R) for a sample of i

typedef void (*ref_fn)(double *out, const double *in, void *ctx);

static double fd_check(const char *what, ref_fn fn, void *ctx, double *x, size_t nin,
                       size_t nout, const double *R, const float *grad, double tol)
{
    double *o = malloc(nout * sizeof(double));
    double worst = 0, scale = 0;
    size_t step = nin > 200 ? nin / 200 : 1;
    for (size_t i = 0; i < nin; i += step) {
        double keep = x[i], jp = 0, jm = 0, h = 1e-5;
        x[i] = keep + h;
        fn(o, x, ctx);
        for (size_t k = 0; k < nout; k++) jp += o[k] * R[k];
        x[i] = keep - h;
        fn(o, x, ctx);
        for (size_t k = 0; k < nout; k++) jm += o[k] * R[k];
        x[i] = keep;
        double want = (jp - jm) / (2 * h);
        double e = fabs(grad[i] - want);
        worst = e > worst ? e : worst;
        scale = fabs(want) > scale ? fabs(want) : scale;
    }
    free(o);
    double rel = worst / (scale > 0 ? scale : 1);
    tap_ok(rel <= tol, "%s: backward against finite differences, rel err %.2g", what, rel);
    return rel;
}

// ---- RMSNorm

struct rms_ctx { const double *w; size_t N, C; double eps; };
static void rms_fn(double *out, const double *in, void *p)
{
    struct rms_ctx *c = p;
    ref_rmsnorm(out, in, c->w, c->N, c->C, c->eps);
}
struct rmsw_ctx { const double *x; size_t N, C; double eps; };
static void rmsw_fn(double *out, const double *w, void *p)
{
    struct rmsw_ctx *c = p;
    ref_rmsnorm(out, c->x, w, c->N, c->C, c->eps);
}

static void test_rmsnorm(void)
{
    size_t N = 7, C = 37;
    float eps = 1e-5f;
    float *x = randf(N * C, 2.0), *w = randf(C, 1.5), *R = randf(N * C, 1.0);
    double *xd = todouble(x, N * C), *wd = todouble(w, C), *Rd = todouble(R, N * C);
    float *y = malloc(N * C * sizeof(float)), *rstd = malloc(N * sizeof(float));
    double *yd = malloc(N * C * sizeof(double));
    fsdp_cpu_rmsnorm_forward(y, rstd, x, w, N, C, eps);
    ref_rmsnorm(yd, xd, wd, N, C, eps);
    tap_ok(relerr(y, yd, N * C) < 1e-6, "rmsnorm forward: rel err %.2g", relerr(y, yd, N * C));
    float *dx = calloc(N * C, sizeof(float)), *dw = calloc(C, sizeof(float));
    fsdp_cpu_rmsnorm_backward(dx, dw, R, x, w, rstd, N, C);
    struct rms_ctx c1 = {wd, N, C, eps};
    fd_check("rmsnorm d(input)", rms_fn, &c1, xd, N * C, N * C, Rd, dx, 1e-4);
    struct rmsw_ctx c2 = {xd, N, C, eps};
    fd_check("rmsnorm d(weight)", rmsw_fn, &c2, wd, C, N * C, Rd, dw, 1e-4);
    free(x), free(w), free(R), free(xd), free(wd), free(Rd), free(y), free(rstd), free(yd);
    free(dx), free(dw);
}

// ---- RoPE

struct rope_ctx { const double *f; int B, T, NH, NKV, hs; };
static void rope_fn(double *out, const double *in, void *p)
{
    struct rope_ctx *c = p;
    ref_rope(out, in, c->f, c->B, c->T, c->NH, c->NKV, c->hs);
}

static void test_rope(const char *name, const struct fsdp_rope_scaling *sc, double theta)
{
    int B = 2, T = 11, NH = 4, NKV = 2, hs = 16;
    size_t n = (size_t)B * T * (NH + 2 * NKV) * hs;
    float inv[8], *cs = malloc((size_t)T * 8 * sizeof(float)), *sn = malloc((size_t)T * 8 * sizeof(float));
    double f[8];
    ref_inv_freq(f, hs, theta, sc);
    fsdp_cpu_rope_inv_freq(inv, hs, theta, sc);
    double fe = 0;
    for (int i = 0; i < hs / 2; i++) {
        double e = fabs(inv[i] - f[i]) / f[i];
        fe = e > fe ? e : fe;
    }
    tap_ok(fe < 1e-6, "rope %s: inverse frequencies, rel err %.2g", name, fe);
    fsdp_cpu_rope_table(cs, sn, inv, 0, T, hs);
    float *x = randf(n, 1.0), *R = randf(n, 1.0);
    double *xd = todouble(x, n), *Rd = todouble(R, n), *yd = malloc(n * sizeof(double));
    float *y = malloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    fsdp_cpu_rope_forward(y, cs, sn, B, T, NH, NKV, hs);
    ref_rope(yd, xd, f, B, T, NH, NKV, hs);
    tap_ok(relerr(y, yd, n) < 2e-6, "rope %s forward (q and k rotated, v untouched): rel err %.2g",
           name, relerr(y, yd, n));
    float *g = malloc(n * sizeof(float));
    memcpy(g, R, n * sizeof(float));
    fsdp_cpu_rope_backward(g, cs, sn, B, T, NH, NKV, hs);
    struct rope_ctx c = {f, B, T, NH, NKV, hs};
    char what[64];
    snprintf(what, sizeof(what), "rope %s d(q, k)", name);
    fd_check(what, rope_fn, &c, xd, n, n, Rd, g, 1e-4);
    /* backward of forward is the identity (the rotation is orthogonal) */
    fsdp_cpu_rope_backward(y, cs, sn, B, T, NH, NKV, hs);
    double e = 0;
    for (size_t i = 0; i < n; i++) e = fabs(y[i] - x[i]) > e ? fabs(y[i] - x[i]) : e;
    tap_ok(e < 1e-5, "rope %s: the backward undoes the forward (max abs %.2g)", name, e);
    free(cs), free(sn), free(x), free(R), free(xd), free(Rd), free(yd), free(y), free(g);
}

// ---- SwiGLU

struct sw_ctx { const double *other; size_t n; int wrt_gate; };
static void sw_fn(double *out, const double *in, void *p)
{
    struct sw_ctx *c = p;
    if (c->wrt_gate) ref_swiglu(out, in, c->other, c->n);
    else ref_swiglu(out, c->other, in, c->n);
}

static void test_swiglu(void)
{
    size_t n = 301;
    float *g = randf(n, 4.0), *u = randf(n, 2.0), *R = randf(n, 1.0), *y = malloc(n * 4);
    double *gd = todouble(g, n), *ud = todouble(u, n), *Rd = todouble(R, n), *yd = malloc(n * 8);
    fsdp_cpu_swiglu_forward(y, g, u, n);
    ref_swiglu(yd, gd, ud, n);
    tap_ok(relerr(y, yd, n) < 1e-6, "swiglu forward: rel err %.2g", relerr(y, yd, n));
    float *dg = malloc(n * 4), *du = malloc(n * 4);
    fsdp_cpu_swiglu_backward(dg, du, R, g, u, n);
    struct sw_ctx c1 = {ud, n, 1}, c2 = {gd, n, 0};
    fd_check("swiglu d(gate)", sw_fn, &c1, gd, n, n, Rd, dg, 1e-4);
    fd_check("swiglu d(up)", sw_fn, &c2, ud, n, n, Rd, du, 1e-4);
    free(g), free(u), free(R), free(y), free(gd), free(ud), free(Rd), free(yd), free(dg), free(du);
}

// ---- grouped-query attention

struct gqa_ctx { int B, T, NH, NKV, hs; };
static void gqa_fn(double *out, const double *in, void *p)
{
    struct gqa_ctx *c = p;
    ref_gqa(out, in, c->B, c->T, c->NH, c->NKV, c->hs);
}

static void test_gqa(int B, int T, int NH, int NKV, int hs)
{
    size_t C = (size_t)NH * hs, KV = (size_t)NKV * hs, ld = C + 2 * KV;
    size_t nin = (size_t)B * T * ld, nout = (size_t)B * T * C;
    float *qkv = randf(nin, 1.5), *R = randf(nout, 1.0);
    double *qd = todouble(qkv, nin), *Rd = todouble(R, nout), *od = malloc(nout * 8);
    float *out = malloc(nout * 4), *lse = malloc((size_t)B * NH * T * 4);
    /* shared by the grouped and the multi-head kernels below */
    size_t nscr = fsdp_cpu_gqa_attention_scratch_floats(T, NH, NKV, hs);
    nscr = fsdp_cpu_attention_scratch_floats(T) > nscr ? fsdp_cpu_attention_scratch_floats(T) : nscr;
    float *scratch = malloc(nscr * 4);
    float *dqkv = malloc(nin * 4);
    char what[96];
    fsdp_cpu_gqa_attention_forward(out, lse, scratch, qkv, B, T, NH, NKV, hs);
    ref_gqa(od, qd, B, T, NH, NKV, hs);
    tap_ok(relerr(out, od, nout) < 1e-5, "gqa attention NH=%d NKV=%d T=%d forward: rel err %.2g",
           NH, NKV, T, relerr(out, od, nout));
    fsdp_cpu_gqa_attention_backward(dqkv, scratch, R, qkv, out, lse, B, T, NH, NKV, hs);
    struct gqa_ctx c = {B, T, NH, NKV, hs};
    snprintf(what, sizeof(what), "gqa attention NH=%d NKV=%d T=%d", NH, NKV, T);
    fd_check(what, gqa_fn, &c, qd, nin, nout, Rd, dqkv, 1e-3);

    /* the same as multi-head attention on K/V repeated per group */
    size_t ldm = 3 * C;
    float *rep = malloc((size_t)B * T * ldm * 4), *outm = malloc(nout * 4);
    float *dm = malloc((size_t)B * T * ldm * 4), *lsem = malloc((size_t)B * NH * T * 4);
    for (size_t r = 0; r < (size_t)B * T; r++) {
        memcpy(rep + r * ldm, qkv + r * ld, C * 4);
        for (int h = 0; h < NH; h++) {
            int g = h / (NH / NKV);
            memcpy(rep + r * ldm + C + (size_t)h * hs, qkv + r * ld + C + (size_t)g * hs, (size_t)hs * 4);
            memcpy(rep + r * ldm + 2 * C + (size_t)h * hs, qkv + r * ld + C + KV + (size_t)g * hs,
                   (size_t)hs * 4);
        }
    }
    fsdp_cpu_attention_forward(outm, lsem, scratch, rep, B, T, (int)C, NH);
    fsdp_cpu_attention_backward(dm, scratch, R, rep, outm, lsem, B, T, (int)C, NH);
    double eo = 0, eg = 0;
    for (size_t i = 0; i < nout; i++) eo = fabs(out[i] - outm[i]) > eo ? fabs(out[i] - outm[i]) : eo;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        for (size_t e = 0; e < C; e++) {
            double d = fabs(dqkv[r * ld + e] - dm[r * ldm + e]);
            eg = d > eg ? d : eg;
        }
        for (int g = 0; g < NKV; g++) {
            for (int part = 1; part <= 2; part++) {
                for (int e = 0; e < hs; e++) {
                    double sum = 0;
                    for (int h = g * (NH / NKV); h < (g + 1) * (NH / NKV); h++) {
                        sum += dm[r * ldm + (size_t)part * C + (size_t)h * hs + (size_t)e];
                    }
                    double d = fabs(dqkv[r * ld + C + (size_t)(part - 1) * KV + (size_t)g * hs + (size_t)e] - sum);
                    eg = d > eg ? d : eg;
                }
            }
        }
    }
    tap_ok(eo < 1e-6 && eg < 1e-5, "gqa NH=%d NKV=%d = multi-head on repeated K/V: out %.2g, "
           "grads (dK, dV summed per group) %.2g", NH, NKV, eo, eg);
    free(qkv), free(R), free(qd), free(Rd), free(od), free(out), free(lse), free(scratch);
    free(dqkv), free(rep), free(outm), free(dm), free(lsem);
}

int main(void)
{
    test_rmsnorm();
    struct fsdp_rope_scaling none = {FSDP_ROPE_NONE, 1, 0, 0, 0};
    struct fsdp_rope_scaling lin = {FSDP_ROPE_LINEAR, 4.0, 0, 0, 0};
    /* Llama 3.1's values; a small theta and context put some frequencies in
     * each of the three bands */
    struct fsdp_rope_scaling l3 = {FSDP_ROPE_LLAMA3, 8.0, 1.0, 4.0, 64};
    test_rope("none", &none, 10000.0);
    test_rope("linear", &lin, 10000.0);
    test_rope("llama3", &l3, 500000.0);
    float f[8];
    tap_ok(fsdp_cpu_rope_inv_freq(f, 7, 1e4, &none) < 0, "rope: an odd head size is refused");
    test_swiglu();
    test_gqa(2, 9, 4, 2, 8);   /* groups of 2 */
    test_gqa(1, 70, 4, 1, 8);  /* multi-query: a group of 4, five tiles of 16 rows per head */
    test_gqa(1, 5, 3, 3, 4);   /* NKV = NH */
    return tap_done();
}
