/*
 * test_kernels_grad.c - every CPU kernel against a naive double-precision
 * reference: forward outputs directly, backward by central finite
 * differences of the reference (objective J = sum(out * R) for a random R,
 * so the kernel's backward gets dout = R). Shapes are small and odd so that
 * vector tails, several attention tiles and repeated tokens are exercised.
 * Also: AdamW against a double reference over several steps, the
 * cross-entropy ignore index, gradient-norm helpers, the 16-bit casts
 * against core/dtype.c bit for bit, and the vector exp's accuracy.
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "tests/kernels/ref_kernels.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

/* float buffer and its exact double copy, uniform in [lo, hi) */
static float *rand_f(double **dcopy, size_t n, double lo, double hi)
{
    float *f = malloc(n * sizeof(float));
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(lo + (hi - lo) * 0.5 * (ref_rand(&rng) + 1.0));
        d[i] = f[i];
    }
    *dcopy = d;
    return f;
}

/* Reports a comparison; the pass criterion is max abs error <= tol * max |want|. */
static int report(const char *what, const float *got, const double *want, size_t n, double tol)
{
    struct ref_cmp c = ref_compare(got, want, n);
    double norm = c.max_abs / (c.scale > 0 ? c.scale : 1.0);
    int ok = norm <= tol;
    if (!ok) {
        tap_diag("%s: worst index %zu got %.9g want %.9g", what, c.worst, (double)got[c.worst],
                 want[c.worst]);
    }
    return tap_ok(ok, "%s: max abs err %.3g (%.2g of max |ref| %.3g), max rel err %.3g, worst index %zu",
                  what, c.max_abs, norm, c.scale, c.max_rel, c.worst);
}

// ----------------------------------------------------------------------------
// finite differences over a sample of a double input

typedef double (*objective_fn)(void *ctx);

#define FD_H 1e-5
#define FD_MAX 300

/* Fills idx with up to FD_MAX indices of [0, n) (all when n is small). */
static size_t fd_sample(size_t *idx, size_t n)
{
    if (n <= FD_MAX) {
        for (size_t i = 0; i < n; i++) idx[i] = i;
        return n;
    }
    idx[0] = 0;
    idx[1] = n - 1;
    for (size_t k = 2; k < FD_MAX; k++) {
        idx[k] = (size_t)((ref_rand(&rng) + 1.0) * 0.5 * (double)n) % n;
    }
    return FD_MAX;
}

/*
 * Checks the analytic float gradient of input x (n elements) against
 * central differences of f; got[i] is compared at the sampled indices.
 * offset and scale map the analytic value: want = offset[i] + scale * fd.
 */
static int fd_check(const char *what, const float *got, double *x, size_t n, objective_fn f,
                    void *ctx, const float *offset, double scale, double tol)
{
    size_t idx[FD_MAX];
    size_t m = fd_sample(idx, n);
    float g[FD_MAX];
    double want[FD_MAX];
    for (size_t k = 0; k < m; k++) {
        size_t i = idx[k];
        double save = x[i];
        x[i] = save + FD_H;
        double fp = f(ctx);
        x[i] = save - FD_H;
        double fm = f(ctx);
        x[i] = save;
        want[k] = (offset ? offset[i] : 0.0) + scale * (fp - fm) / (2 * FD_H);
        g[k] = got[i];
    }
    return report(what, g, want, m, tol);
}

static double dot_d(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// ----------------------------------------------------------------------------
// encoder

struct enc_ctx {
    double *wte, *wpe, *R, *out;
    int32_t *tok;
    int B, T, C;
};

static double enc_obj(void *p)
{
    struct enc_ctx *c = p;
    ref_encoder(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return dot_d(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_encoder(void)
{
    int B = 2, T = 5, C = 11, V = 7;
    size_t n = (size_t)B * T * C;
    struct enc_ctx c = {.B = B, .T = T, .C = C};
    int32_t tok[10] = {3, 1, 3, 6, 0, 3, 3, 2, 5, 1}; /* repeats within and across rows */
    c.tok = tok;
    float *wte = rand_f(&c.wte, (size_t)V * C, -1, 1), *wpe = rand_f(&c.wpe, (size_t)T * C, -1, 1);
    float *R = rand_f(&c.R, n, -1, 1);
    float *out = malloc(n * sizeof(float));
    c.out = malloc(n * sizeof(double));
    fsdp_cpu_encoder_forward(out, tok, wte, wpe, B, T, C);
    ref_encoder(c.out, tok, c.wte, c.wpe, B, T, C);
    report("encoder forward", out, c.out, n, 1e-7);
    float *dwte = calloc((size_t)V * C, sizeof(float)), *dwpe = calloc((size_t)T * C, sizeof(float));
    fsdp_cpu_encoder_backward(dwte, dwpe, R, tok, B, T, C);
    fd_check("encoder backward dwte", dwte, c.wte, (size_t)V * C, enc_obj, &c, NULL, 1.0, 1e-6);
    fd_check("encoder backward dwpe", dwpe, c.wpe, (size_t)T * C, enc_obj, &c, NULL, 1.0, 1e-6);
    free(wte), free(wpe), free(R), free(out), free(dwte), free(dwpe);
    free(c.wte), free(c.wpe), free(c.R), free(c.out);
}

/*
 * The embedding by rows: W ranks each holding a slice of wte and of wpe
 * (uneven, some empty); summed over the ranks, the partial rows equal the
 * whole-table encoder bit for bit, and the backward of every rank's slice
 * equals the whole backward's rows, bit for bit.
 */
static void test_embed_rows(void)
{
    int B = 2, T = 5, C = 11, V = 7, W = 3;
    size_t N = (size_t)B * T, n = N * C;
    int32_t tok[10] = {3, 1, 3, 6, 0, 3, 3, 2, 5, 1};
    double *dd;
    float *wte = rand_f(&dd, (size_t)V * C, -1, 1);
    free(dd);
    float *wpe = rand_f(&dd, (size_t)T * C, -1, 1);
    free(dd);
    float *R = rand_f(&dd, n, -1, 1);
    free(dd);
    float *want = malloc(n * sizeof(float)), *sum = calloc(n, sizeof(float));
    float *part = malloc(n * sizeof(float));
    float *dwte = calloc((size_t)V * C, sizeof(float)), *dwpe = calloc((size_t)T * C, sizeof(float));
    float *gte = calloc((size_t)V * C, sizeof(float)), *gpe = calloc((size_t)T * C, sizeof(float));
    fsdp_cpu_encoder_forward(want, tok, wte, wpe, B, T, C);
    fsdp_cpu_encoder_backward(dwte, dwpe, R, tok, B, T, C);
    /* wte rows 3 / 2 / 2, wpe rows 2 / 2 / 1; then W = 9 with empty slices */
    size_t fwd_bad = 0, bwd_bad = 0;
    for (int ws = W; ws <= 9; ws += 6) {
        memset(sum, 0, n * sizeof(float));
        memset(gte, 0, (size_t)V * C * sizeof(float));
        memset(gpe, 0, (size_t)T * C * sizeof(float));
        for (int r = 0; r < ws; r++) {
            size_t v0, vn, p0, pn;
            fsdp_split_even((size_t)V, (size_t)ws, (size_t)r, &v0, &vn);
            fsdp_split_even((size_t)T, (size_t)ws, (size_t)r, &p0, &pn);
            fsdp_cpu_embed_rows_forward(part, tok, wte + v0 * C, v0, vn, wpe + p0 * C, p0, pn, N,
                                        T, C);
            for (size_t i = 0; i < n; i++) sum[i] += part[i];
            fsdp_cpu_embed_rows_backward(gte + v0 * C, gpe + p0 * C, R, tok, v0, vn, p0, pn, N,
                                         T, C);
        }
        fwd_bad += memcmp(sum, want, n * sizeof(float)) != 0;
        bwd_bad += memcmp(gte, dwte, (size_t)V * C * sizeof(float)) != 0 ||
                   memcmp(gpe, dwpe, (size_t)T * C * sizeof(float)) != 0;
    }
    tap_ok(fwd_bad == 0, "embedding by rows over 3 and 9 ranks: the ranks' rows summed equal the "
           "whole-table encoder bit for bit");
    tap_ok(bwd_bad == 0, "embedding by rows over 3 and 9 ranks: each rank's table gradient rows "
           "equal the whole backward's bit for bit");
    free(wte), free(wpe), free(R), free(want), free(sum), free(part);
    free(dwte), free(dwpe), free(gte), free(gpe);
}

// ----------------------------------------------------------------------------
// layer norm

struct ln_ctx {
    double *inp, *w, *b, *R, *out;
    size_t N, C;
};

static double ln_obj(void *p)
{
    struct ln_ctx *c = p;
    ref_layernorm(c->out, c->inp, c->w, c->b, c->N, c->C, 1e-5);
    return dot_d(c->out, c->R, c->N * c->C);
}

static void test_layernorm(size_t N, size_t C)
{
    char what[96];
    struct ln_ctx c = {.N = N, .C = C};
    size_t n = N * C;
    float *inp = rand_f(&c.inp, n, 1.0, 3.0); /* non-zero mean */
    float *w = rand_f(&c.w, C, 0.5, 1.5), *b = rand_f(&c.b, C, -0.5, 0.5);
    float *R = rand_f(&c.R, n, -1, 1);
    float *out = malloc(n * sizeof(float)), *mean = malloc(N * sizeof(float));
    float *rstd = malloc(N * sizeof(float));
    c.out = malloc(n * sizeof(double));
    fsdp_cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, 1e-5f);
    ref_layernorm(c.out, c.inp, c.w, c.b, N, C, 1e-5);
    snprintf(what, sizeof(what), "layernorm forward N=%zu C=%zu", N, C);
    report(what, out, c.out, n, 2e-6);
    /* backward accumulates: start from non-zero gradients */
    double *d0;
    float *dinp = rand_f(&d0, n, -1, 1), *dinp0 = malloc(n * sizeof(float));
    memcpy(dinp0, dinp, n * sizeof(float));
    float *dw = calloc(C, sizeof(float)), *db = calloc(C, sizeof(float));
    fsdp_cpu_layernorm_backward(dinp, dw, db, R, inp, w, mean, rstd, N, C);
    snprintf(what, sizeof(what), "layernorm backward dinp (accumulating) N=%zu C=%zu", N, C);
    fd_check(what, dinp, c.inp, n, ln_obj, &c, dinp0, 1.0, 1e-5);
    snprintf(what, sizeof(what), "layernorm backward dweight N=%zu C=%zu", N, C);
    fd_check(what, dw, c.w, C, ln_obj, &c, NULL, 1.0, 1e-5);
    snprintf(what, sizeof(what), "layernorm backward dbias N=%zu C=%zu", N, C);
    fd_check(what, db, c.b, C, ln_obj, &c, NULL, 1.0, 1e-5);
    free(inp), free(w), free(b), free(R), free(out), free(mean), free(rstd), free(dinp);
    free(dinp0), free(dw), free(db), free(d0);
    free(c.inp), free(c.w), free(c.b), free(c.R), free(c.out);
}

// ----------------------------------------------------------------------------
// matmul

struct mm_ctx {
    double *inp, *W, *b, *R, *out;
    size_t N, C, OC;
};

static double mm_obj(void *p)
{
    struct mm_ctx *c = p;
    ref_matmul(c->out, c->inp, c->W, c->b, c->N, c->C, c->OC);
    return dot_d(c->out, c->R, c->N * c->OC);
}

static void test_matmul(void)
{
    size_t N = 7, C = 13, OC = 11;
    float alpha = 0.75f;
    struct mm_ctx c = {.N = N, .C = C, .OC = OC};
    float *inp = rand_f(&c.inp, N * C, -1, 1), *W = rand_f(&c.W, OC * C, -1, 1);
    float *b = rand_f(&c.b, OC, -1, 1), *R = rand_f(&c.R, N * OC, -1, 1);
    double *dres;
    float *res = rand_f(&dres, N * OC, -1, 1);
    float *out = malloc(N * OC * sizeof(float));
    c.out = malloc(N * OC * sizeof(double));
    ref_matmul(c.out, c.inp, c.W, c.b, N, C, OC);

    fsdp_cpu_matmul_forward(out, inp, W, b, NULL, N, C, OC);
    report("matmul forward with bias", out, c.out, N * OC, 1e-6);
    for (size_t i = 0; i < N * OC; i++) c.out[i] += dres[i];
    fsdp_cpu_matmul_forward(out, inp, W, b, res, N, C, OC);
    report("matmul forward with bias and residual", out, c.out, N * OC, 1e-6);
    memcpy(out, res, N * OC * sizeof(float));
    fsdp_cpu_matmul_forward(out, inp, W, b, out, N, C, OC);
    report("matmul forward, residual in place", out, c.out, N * OC, 1e-6);
    memcpy(out, res, N * OC * sizeof(float));
    fsdp_cpu_matmul_forward(out, inp, W, NULL, out, N, C, OC);
    ref_matmul(c.out, c.inp, c.W, NULL, N, C, OC);
    for (size_t i = 0; i < N * OC; i++) c.out[i] += dres[i];
    report("matmul forward, no bias, residual in place", out, c.out, N * OC, 1e-6);

    double *d1, *d2, *d3; /* unused double copies */
    float *dinp = rand_f(&d1, N * C, -1, 1), *dinp0 = malloc(N * C * sizeof(float));
    float *dW = rand_f(&d2, OC * C, -1, 1), *dW0 = malloc(OC * C * sizeof(float));
    float *db = rand_f(&d3, OC, -1, 1), *db0 = malloc(OC * sizeof(float));
    memcpy(dinp0, dinp, N * C * sizeof(float));
    memcpy(dW0, dW, OC * C * sizeof(float));
    memcpy(db0, db, OC * sizeof(float));
    fsdp_cpu_matmul_backward(dinp, dW, db, R, inp, W, N, C, OC, alpha, 1);
    fd_check("matmul backward dinp (accumulate, alpha 0.75)", dinp, c.inp, N * C, mm_obj, &c, dinp0,
             alpha, 1e-6);
    fd_check("matmul backward dweight (+=, alpha 0.75)", dW, c.W, OC * C, mm_obj, &c, dW0, alpha, 1e-6);
    fd_check("matmul backward dbias (+=, alpha 0.75)", db, c.b, OC, mm_obj, &c, db0, alpha, 1e-6);
    fsdp_cpu_matmul_backward(dinp, NULL, NULL, R, inp, W, N, C, OC, 1.0f, 0);
    fd_check("matmul backward dinp (overwrite)", dinp, c.inp, N * C, mm_obj, &c, NULL, 1.0, 1e-6);
    free(inp), free(W), free(b), free(R), free(res), free(out), free(dinp), free(dinp0);
    free(dW), free(dW0), free(db), free(db0), free(dres), free(d1), free(d2), free(d3);
    free(c.inp), free(c.W), free(c.b), free(c.R), free(c.out);
}

// ----------------------------------------------------------------------------
// attention

struct att_ctx {
    double *qkv, *R, *out;
    int B, T, C, NH;
};

static double att_obj(void *p)
{
    struct att_ctx *c = p;
    ref_attention(c->out, c->qkv, c->B, c->T, c->C, c->NH);
    return dot_d(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_attention(int B, int T, int C, int NH)
{
    char what[96];
    struct att_ctx c = {.B = B, .T = T, .C = C, .NH = NH};
    size_t n = (size_t)B * T * C, n3 = 3 * n;
    float *qkv = rand_f(&c.qkv, n3, -1.5, 1.5), *R = rand_f(&c.R, n, -1, 1);
    float *out = malloc(n * sizeof(float));
    float *lse = malloc((size_t)B * NH * T * sizeof(float));
    float *scratch = malloc(fsdp_cpu_attention_scratch_floats(T) * sizeof(float));
    float *dqkv = malloc(n3 * sizeof(float));
    c.out = malloc(n * sizeof(double));
    fsdp_cpu_attention_forward(out, lse, scratch, qkv, B, T, C, NH);
    ref_attention(c.out, c.qkv, B, T, C, NH);
    snprintf(what, sizeof(what), "attention forward B=%d T=%d C=%d NH=%d", B, T, C, NH);
    report(what, out, c.out, n, 2e-6);
    for (size_t i = 0; i < n3; i++) dqkv[i] = NAN; /* backward must overwrite every element */
    fsdp_cpu_attention_backward(dqkv, scratch, R, qkv, out, lse, B, T, C, NH);
    snprintf(what, sizeof(what), "attention backward dqkv B=%d T=%d C=%d NH=%d", B, T, C, NH);
    fd_check(what, dqkv, c.qkv, n3, att_obj, &c, NULL, 1.0, 2e-5);
    size_t bad = 0;
    for (size_t i = 0; i < n3; i++) bad += isnan(dqkv[i]) ? 1 : 0;
    tap_ok(bad == 0, "attention backward T=%d writes all of dqkv (%zu unwritten)", T, bad);
    free(qkv), free(R), free(out), free(lse), free(scratch), free(dqkv);
    free(c.qkv), free(c.R), free(c.out);
}

// ----------------------------------------------------------------------------
// GELU and residual

struct gelu_ctx {
    double *inp, *R, *out;
    size_t n;
};

static double gelu_obj(void *p)
{
    struct gelu_ctx *c = p;
    ref_gelu(c->out, c->inp, c->n);
    return dot_d(c->out, c->R, c->n);
}

static void test_gelu(void)
{
    size_t n = 203;
    struct gelu_ctx c = {.n = n};
    float *inp = rand_f(&c.inp, n, -8, 8), *R = rand_f(&c.R, n, -1, 1);
    inp[0] = 0.0f, inp[1] = -30.0f, inp[2] = 30.0f, inp[3] = 1e-4f;
    for (int i = 0; i < 4; i++) c.inp[i] = inp[i];
    float *out = malloc(n * sizeof(float)), *d = malloc(n * sizeof(float));
    c.out = malloc(n * sizeof(double));
    fsdp_cpu_gelu_forward(out, inp, n);
    ref_gelu(c.out, c.inp, n);
    report("gelu forward (tanh form) n=203", out, c.out, n, 1e-6);
    memcpy(d, R, n * sizeof(float));
    fsdp_cpu_gelu_backward(d, inp, d, n); /* in place */
    fd_check("gelu backward (in place) n=203", d, c.inp, n, gelu_obj, &c, NULL, 1.0, 1e-6);
    float *a = malloc(n * sizeof(float));
    double *want = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) want[i] = (double)inp[i] + (double)R[i];
    fsdp_cpu_residual_forward(a, inp, R, n);
    report("residual forward n=203", a, want, n, 1e-7);
    free(inp), free(R), free(out), free(d), free(a), free(want);
    free(c.inp), free(c.R), free(c.out);
}

// ----------------------------------------------------------------------------
// cross-entropy

struct ce_ctx {
    double *logits;
    int32_t *tgt;
    size_t N, V;
    int32_t ignore;
};

static double ce_obj(void *p)
{
    struct ce_ctx *c = p;
    return ref_crossentropy(c->logits, c->tgt, c->N, c->V, c->ignore);
}

static void test_crossentropy(int32_t ignore)
{
    char what[96];
    size_t N = 9, V = 37, kept = 0;
    int32_t tgt[9] = {5, ignore, 36, 0, ignore, 17, 17, 3, ignore};
    struct ce_ctx c = {.tgt = tgt, .N = N, .V = V, .ignore = ignore};
    float *logits = rand_f(&c.logits, N * V, -4, 4);
    float *losses = malloc(N * sizeof(float)), *d = malloc(N * V * sizeof(float));
    float mean = 0;
    int rc = fsdp_cpu_crossentropy_fused(losses, d, logits, tgt, N, V, ignore, 1.0f / 6.0f, &kept, &mean);
    tap_ok(rc == 0 && kept == 6, "crossentropy ignore_index %d: rc %d, kept %zu of 9 (want 6)",
           (int)ignore, rc, kept);
    double want = ref_crossentropy(c.logits, tgt, N, V, ignore);
    tap_ok(fabs(mean - want) <= 1e-6 * fabs(want), "crossentropy mean %.9g, reference %.9g",
           (double)mean, want);
    double wl[9];
    for (size_t r = 0; r < N; r++) {
        int32_t one[1] = {tgt[r]};
        wl[r] = tgt[r] == ignore ? 0.0 : ref_crossentropy(c.logits + r * V, one, 1, V, ignore);
    }
    snprintf(what, sizeof(what), "crossentropy per-token losses (ignore %d)", (int)ignore);
    report(what, losses, wl, N, 1e-6);
    snprintf(what, sizeof(what), "crossentropy dlogits = d(mean)/dlogits (ignore %d)", (int)ignore);
    fd_check(what, d, c.logits, N * V, ce_obj, &c, NULL, 1.0, 1e-6);
    size_t nz = 0;
    for (size_t r = 0; r < N; r++) {
        for (size_t i = 0; tgt[r] == ignore && i < V; i++) nz += d[r * V + i] != 0.0f;
    }
    tap_ok(nz == 0, "crossentropy: ignored rows have zero gradient (%zu non-zero)", nz);
    /* in place gives the same bits */
    float *inpl = malloc(N * V * sizeof(float));
    memcpy(inpl, logits, N * V * sizeof(float));
    rc = fsdp_cpu_crossentropy_fused(losses, inpl, inpl, tgt, N, V, ignore, 1.0f / 6.0f, &kept, &mean);
    tap_ok(rc == 0 && memcmp(inpl, d, N * V * sizeof(float)) == 0,
           "crossentropy in place (dlogits == logits) is bit-identical");
    /* split: forward keeps (max, sum) per row, backward rebuilds the gradient */
    float *stats = malloc(2 * N * sizeof(float)), *l2 = malloc(N * sizeof(float));
    size_t kept2 = 0;
    memcpy(inpl, logits, N * V * sizeof(float));
    rc = fsdp_cpu_crossentropy_forward(l2, stats, inpl, tgt, N, V, ignore, &kept2);
    fsdp_cpu_crossentropy_backward(inpl, inpl, stats, tgt, N, V, ignore, 1.0f / 6.0f);
    tap_ok(rc == 0 && kept2 == kept && memcmp(l2, losses, N * sizeof(float)) == 0 &&
               memcmp(inpl, d, N * V * sizeof(float)) == 0,
           "crossentropy forward + backward (in place) bit-identical to the fused kernel");
    int32_t bad[9];
    memcpy(bad, tgt, sizeof(bad));
    bad[3] = (int32_t)V;
    rc = fsdp_cpu_crossentropy_forward(l2, stats, logits, bad, N, V, ignore, &kept2);
    tap_ok(rc == FSDP_ERR_INVALID, "crossentropy forward: target V is an error: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    free(stats), free(l2);
    free(inpl), free(logits), free(losses), free(d), free(c.logits);
}

/*
 * The loss over vocabulary slices: columns [c0, c0 + n) of the logits at a
 * time (slices of several widths, the last one short, one holding every
 * column), its statistics and target logits against the whole rows', and
 * each slice's gradient against the same columns of the whole gradient.
 */
static void test_crossentropy_slices(int32_t ignore)
{
    size_t N = 9, V = 37;
    int32_t tgt[9] = {5, ignore, 36, 0, ignore, 17, 17, 3, ignore};
    double *dd;
    float *logits = rand_f(&dd, N * V, -4, 4);
    free(dd);
    float *losses = malloc(N * sizeof(float)), *want_st = malloc(2 * N * sizeof(float));
    float *want_d = malloc(N * V * sizeof(float)), *st = malloc(2 * N * sizeof(float));
    float *zt = malloc(N * sizeof(float)), *tile = malloc(N * V * sizeof(float));
    size_t kept = 0;
    fsdp_cpu_crossentropy_forward(losses, want_st, logits, tgt, N, V, ignore, &kept);
    memcpy(want_d, logits, N * V * sizeof(float));
    fsdp_cpu_crossentropy_backward(want_d, want_d, want_st, tgt, N, V, ignore, 0.25f);
    const size_t widths[] = {37, 16, 5, 1};
    for (size_t k = 0; k < sizeof(widths) / sizeof(widths[0]); k++) {
        size_t w = widths[k];
        double loss_err = 0, grad_err = 0;
        int bits = 1;
        for (size_t c0 = 0; c0 < V; c0 += w) {
            size_t n = V - c0 < w ? V - c0 : w;
            for (size_t r = 0; r < N; r++) memcpy(tile + r * n, logits + r * V + c0, n * sizeof(float));
            fsdp_cpu_crossentropy_slice_forward(st, zt, tile, tgt, N, n, c0, ignore, c0 == 0);
        }
        for (size_t r = 0; r < N; r++) {
            if (tgt[r] == ignore) {
                bits &= st[2 * r] == 0.0f && st[2 * r + 1] == 0.0f && zt[r] == 0.0f;
                continue;
            }
            float l = st[2 * r] + logf(st[2 * r + 1]) - zt[r];
            loss_err = fmax(loss_err, fabs((double)l - losses[r]) / fabs((double)losses[r]));
            if (w == V) {
                bits &= memcmp(&l, &losses[r], sizeof(float)) == 0 &&
                        memcmp(st + 2 * r, want_st + 2 * r, 2 * sizeof(float)) == 0;
            }
        }
        for (size_t c0 = 0; c0 < V; c0 += w) {
            size_t n = V - c0 < w ? V - c0 : w;
            for (size_t r = 0; r < N; r++) memcpy(tile + r * n, logits + r * V + c0, n * sizeof(float));
            fsdp_cpu_crossentropy_slice_backward(tile, tile, st, tgt, N, n, c0, ignore, 0.25f);
            for (size_t r = 0; r < N; r++) {
                for (size_t i = 0; i < n; i++) {
                    grad_err = fmax(grad_err, fabs((double)tile[r * n + i] - want_d[r * V + c0 + i]));
                    if (w == V) bits &= tile[r * n + i] == want_d[r * V + c0 + i];
                }
            }
        }
        tap_ok(bits && loss_err <= 1e-6 && grad_err <= 1e-7,
               "crossentropy over vocabulary slices of %zu columns (ignore %d): losses rel err "
               "%.3g, gradient abs err %.3g%s", w, (int)ignore, loss_err, grad_err,
               w == V ? ", one slice bit-identical to the split kernels" : "");
    }
    free(logits), free(losses), free(want_st), free(want_d), free(st), free(zt), free(tile);
}

static void test_crossentropy_edges(void)
{
    float logits[2 * 5] = {0}, losses[2], d[10], mean = 0;
    size_t kept = 1;
    int32_t tgt[2] = {-1, -1};
    int rc = fsdp_cpu_crossentropy_fused(losses, d, logits, tgt, 2, 5, -1, 1.0f, &kept, &mean);
    tap_ok(rc == 0 && kept == 0 && isnan(mean) && d[0] == 0.0f && losses[1] == 0.0f,
           "crossentropy: all rows ignored gives mean NaN (as torch), zero grads");
    int32_t bad[2] = {1, 5};
    rc = fsdp_cpu_crossentropy_fused(losses, d, logits, bad, 2, 5, -1, 1.0f, &kept, &mean);
    tap_ok(rc == FSDP_ERR_INVALID, "crossentropy: target 5 with V=5 is an error: %s", fsdp_err_msg());
    fsdp_err_clear();
    int32_t bad2[2] = {-1, -100};
    rc = fsdp_cpu_crossentropy_fused(losses, d, logits, bad2, 2, 5, -1, 1.0f, &kept, &mean);
    tap_ok(rc == FSDP_ERR_INVALID, "crossentropy: target -100 with ignore -1 is an error: %s",
           fsdp_err_msg());
    fsdp_err_clear();
}

// ----------------------------------------------------------------------------
// AdamW, norms

static void test_adamw(int decay, float grad_scale)
{
    size_t n = 1000 + 5; /* vector body, block boundary and tail */
    struct fsdp_adamw_params hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                   .weight_decay = 0.1f};
    double *p_d, *g_d;
    float *p = rand_f(&p_d, n, -1, 1), *g = rand_f(&g_d, n, -1, 1);
    float *m = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    double *m_d = calloc(n, sizeof(double)), *v_d = calloc(n, sizeof(double));
    for (long step = 1; step <= 5; step++) {
        hp.step = step;
        for (size_t i = 0; i < n; i++) {
            g[i] = (float)ref_rand(&rng) * (i % 7 == 0 ? 1e-4f : 1.0f);
            g_d[i] = (double)g[i] * grad_scale;
        }
        fsdp_cpu_adamw_update(p, g, m, v, n, &hp, decay, grad_scale);
        double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
        for (size_t i = 0; i < n; i++) {
            if (decay) p_d[i] *= 1.0 - lr * hp.weight_decay;
            m_d[i] = b1 * m_d[i] + (1 - b1) * g_d[i];
            v_d[i] = b2 * v_d[i] + (1 - b2) * g_d[i] * g_d[i];
            double mh = m_d[i] / (1 - pow(b1, (double)step)), vh = v_d[i] / (1 - pow(b2, (double)step));
            p_d[i] -= lr * mh / (sqrt(vh) + hp.eps);
        }
    }
    char what[96];
    snprintf(what, sizeof(what), "adamw 5 steps decay=%d grad_scale=%g: params", decay, (double)grad_scale);
    report(what, p, p_d, n, 2e-6);
    snprintf(what, sizeof(what), "adamw 5 steps decay=%d grad_scale=%g: exp_avg", decay, (double)grad_scale);
    report(what, m, m_d, n, 1e-5);
    snprintf(what, sizeof(what), "adamw 5 steps decay=%d grad_scale=%g: exp_avg_sq", decay, (double)grad_scale);
    report(what, v, v_d, n, 1e-5);
    free(p), free(g), free(m), free(v), free(p_d), free(g_d), free(m_d), free(v_d);
}

static void test_norms(void)
{
    size_t n = 10007;
    double *xd, want = 0;
    float *x = rand_f(&xd, n, -2, 2);
    for (size_t i = 0; i < n; i++) want += xd[i] * xd[i];
    double got = fsdp_cpu_sumsq(x, n);
    tap_ok(fabs(got - want) <= 1e-6 * want, "sumsq n=%zu: %.10g, reference %.10g", n, got, want);
    float cc = fsdp_cpu_clip_coef(want, 1.0f);
    tap_ok(fabs(cc - 1.0 / (sqrt(want) + 1e-6)) < 1e-6, "clip coef %.7g for norm %.5g", (double)cc,
           sqrt(want));
    tap_ok(fsdp_cpu_clip_coef(0.25, 1.0f) == 1.0f && isnan(fsdp_cpu_clip_coef(NAN, 1.0f)),
           "clip coef is 1 below max_norm and NaN for a NaN norm");
    fsdp_cpu_scale(x, n, 0.5f);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += x[i] != (float)(xd[i] * 0.5);
    tap_ok(bad == 0, "scale by 0.5 exact (%zu wrong)", bad);
    free(x), free(xd);
}

// ----------------------------------------------------------------------------
// casts and exp

static float f_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_casts(void)
{
    /* 16 -> 32: every pattern */
    uint16_t *h = malloc(65536 * sizeof(uint16_t));
    float *f = malloc(65536 * sizeof(float));
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    size_t bad = 0;
    fsdp_cpu_f16_to_f32(f, h, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        float w = fsdp_f16_to_f32(h[i]);
        bad += memcmp(&w, &f[i], 4) != 0;
    }
    tap_ok(bad == 0, "f16 -> f32 matches core on all 65536 patterns (%zu differ)", bad);
    bad = 0;
    fsdp_cpu_bf16_to_f32(f, h, 65536);
    for (uint32_t i = 0; i < 65536; i++) {
        float w = fsdp_bf16_to_f32(h[i]);
        bad += memcmp(&w, &f[i], 4) != 0;
    }
    tap_ok(bad == 0, "bf16 -> f32 matches core on all 65536 patterns (%zu differ)", bad);
    /* 32 -> 16: a sweep over all exponents plus every f16 rounding boundary */
    size_t n = 0, cap = 1 << 21;
    float *src = malloc(cap * sizeof(float));
    uint16_t *dst = malloc(cap * sizeof(uint16_t));
    for (uint64_t u = 0; u < (1ULL << 32) && n < cap; u += 4099) src[n++] = f_from_bits((uint32_t)u);
    for (uint32_t i = 0; i < 65536 && n + 6 <= cap; i++) {
        uint32_t mid = ((uint32_t)i << 13) + 0x38000000u + 0x1000u; /* near half-way points */
        src[n++] = f_from_bits(mid - 1), src[n++] = f_from_bits(mid), src[n++] = f_from_bits(mid + 1);
        src[n++] = f_from_bits(((uint32_t)i << 16) | 0x8000u);       /* bf16 ties */
        src[n++] = f_from_bits(((uint32_t)i << 16) | 0x7fffu);
        src[n++] = f_from_bits(((uint32_t)i << 16) | 0x8001u);
    }
    size_t bad16 = 0, badb = 0, worst = 0;
    fsdp_cpu_f32_to_f16(dst, src, n);
    for (size_t i = 0; i < n; i++) {
        if (dst[i] != fsdp_f32_to_f16(src[i]) && bad16++ == 0) worst = i;
    }
    tap_ok(bad16 == 0, "f32 -> f16 matches core on %zu values (%zu differ, first index %zu)", n, bad16,
           worst);
    fsdp_cpu_f32_to_bf16(dst, src, n);
    for (size_t i = 0; i < n; i++) {
        if (dst[i] != fsdp_f32_to_bf16(src[i]) && badb++ == 0) worst = i;
    }
    tap_ok(badb == 0, "f32 -> bf16 matches core on %zu values (%zu differ, first index %zu)", n, badb,
           worst);
    /* in place, over lengths around the stack-buffer and halving boundaries */
    const size_t lens[] = {0, 1, 63, 64, 65, 127, 128, 129, 1000, 4097, 100003};
    size_t badi = 0;
    float *buf = malloc(100003 * sizeof(float)), *back = malloc(100003 * sizeof(float));
    for (int bf = 0; bf < 2; bf++) {
        for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
            size_t len = lens[k];
            memcpy(buf, src + 77, len * sizeof(float));
            fsdp_cpu_narrow_inplace(buf, len, bf);
            (bf ? fsdp_cpu_f32_to_bf16 : fsdp_cpu_f32_to_f16)(dst, src + 77, len);
            badi += memcmp(buf, dst, len * sizeof(uint16_t)) != 0;
            (bf ? fsdp_cpu_bf16_to_f32 : fsdp_cpu_f16_to_f32)(back, dst, len);
            fsdp_cpu_widen_inplace(buf, len, bf);
            badi += memcmp(buf, back, len * sizeof(float)) != 0;
        }
    }
    tap_ok(badi == 0, "narrowing and widening in place equal the two-buffer casts (%zu of 44 differ)",
           badi);
    free(buf), free(back);
    free(h), free(f), free(src), free(dst);
}

static void test_vexp(void)
{
    double worst = 0, at = 0;
    for (int i = 0; i < 200000; i += CPU_VW) {
        float xs[CPU_VW], ys[CPU_VW];
        for (int k = 0; k < CPU_VW; k++) xs[k] = -87.0f + 175.0f * (float)(i + k) / 200000.0f;
        cpu_vstore(ys, cpu_vexp(cpu_vload(xs)));
        for (int k = 0; k < CPU_VW; k++) {
            double e = fabs(ys[k] / exp((double)xs[k]) - 1.0);
            if (e > worst) worst = e, at = xs[k];
        }
    }
    tap_ok(worst < 0x1p-22, "vector exp on [-87, 88]: max rel err %.3g at x=%.6g (limit 2^-22)", worst, at);
    /* 16: a whole number of vectors at every width simd.h picks (4, 8, 16) */
    float in[16] = {NAN, -INFINITY, INFINITY, 0, 1, -1, -200, 200}, o[16];
    for (int k = 0; k < 16; k += CPU_VW) cpu_vstore(o + k, cpu_vexp(cpu_vload(in + k)));
    tap_ok(isnan(o[0]) && o[1] >= 0 && o[1] < 1e-37f && o[2] > 1e38f && o[3] == 1.0f && o[6] < 1e-37f &&
               o[7] > 1e38f,
           "vector exp: NaN stays NaN, -inf -> ~0, +inf -> large finite");
}

int main(void)
{
    test_encoder();
    test_embed_rows();
    test_layernorm(5, 19);
    test_layernorm(3, 64);
    test_matmul();
    test_attention(3, 1, 8, 2);    /* a single position */
    test_attention(2, 9, 12, 2);   /* hs 6, one tile */
    test_attention(1, 70, 16, 2);  /* two tiles, the second partial */
    test_attention(2, 130, 8, 1);  /* three tiles */
    test_gelu();
    test_crossentropy(-1);
    test_crossentropy(-100);
    test_crossentropy_edges();
    test_crossentropy_slices(-1);
    test_crossentropy_slices(-100);
    test_adamw(1, 1.0f);
    test_adamw(0, 0.5f);
    test_norms();
    test_casts();
    test_vexp();
    return tap_done();
}
