/*
 * test_cuda_emu.cpp - the CUDA kernels of src/compute/cuda, compiled as
 * host C++ under the execution-model emulation (compute/cuda/emu.h),
 * against the CPU kernels of kernels.h on awkward shapes: one row, one
 * column, widths that are not a multiple of a warp or of a block, rows
 * beyond one block of the weight-gradient partials, ignored targets,
 * uneven vocabulary slices. Every case runs twice, with blocks and threads
 * scheduled first to last and last to first, so a missing barrier shows in
 * one order or the other.
 *
 * Tolerance: f32 results within 1e-5 of the CPU's, relative to
 * max(|ref|, rms(ref)): an element that cancels to near zero (a gradient
 * summed over rows onto its old value, a rotated pair) is judged at the
 * tensor's scale, where its rounding happened. The two differ only in the
 * order of their sums (block trees against SIMD lanes), in exp (libm
 * against the CPU's polynomial, 2^-22) and in fused multiply-adds: a few
 * ulp per step, 1e-6 at most measured; a wrong index or a missing barrier
 * is off by the values themselves.
 * Casts, and what the kernels copy, must match bit for bit.
 */
extern "C" {
#include "config.h"
#include "compute/kernels.h"
#include "core/dtype.h"
#include "tests/tap.h"
}
#include "compute/cuda/common.cuh"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOL 1e-5

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static double urand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ULL << 52) - 1.0;
}

static float *randf(size_t n, double scale, double shift)
{
    float *f = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(shift + scale * urand());
    }
    return f;
}

static float *dup(const float *x, size_t n)
{
    float *f = (float *)malloc((n ? n : 1) * sizeof(float));
    memcpy(f, x, n * sizeof(float));
    return f;
}

/* the largest relative error seen per kernel family, for the summary */
static double worst[8];
enum { W_NORM, W_EW, W_ROPE, W_ADAMW, W_CE, W_SUMSQ, W_FAMILIES };
static const char *worst_name[] = {"norms", "gelu/swiglu", "rope", "adamw", "cross-entropy",
                                   "sumsq"};

/* 1 when got matches ref within TOL (see the header); else prints the diff */
static int close_to(const char *what, const float *got, const float *ref, size_t n, int family)
{
    double ss = 0.0, max_abs = 0.0, max_rel = 0.0;
    for (size_t i = 0; i < n; i++) {
        ss += (double)ref[i] * (double)ref[i];
    }
    double floor_ = sqrt(ss / (double)(n ? n : 1)); /* the tensor's rms */
    long bad = -1;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        double rel = e / fmax(fabs((double)ref[i]), floor_ > 0 ? floor_ : 1e-30);
        if (e == 0.0) {
            rel = 0.0;
        }
        if (!(rel <= TOL) && bad < 0) {
            bad = (long)i;
        }
        max_abs = fmax(max_abs, e);
        max_rel = rel > max_rel || rel != rel ? rel : max_rel;
    }
    if (max_rel > worst[family] || max_rel != max_rel) {
        worst[family] = max_rel;
    }
    if (bad >= 0) {
        tap_diag("%s: max abs %.3g, max rel %.3g (tol %.0e); first bad [%ld]: %.9g vs %.9g", what,
                 max_abs, max_rel, TOL, bad, (double)got[bad], (double)ref[bad]);
    }
    return bad < 0;
}

static int same_bits(const char *what, const void *got, const void *ref, size_t bytes)
{
    const unsigned char *g = (const unsigned char *)got, *r = (const unsigned char *)ref;
    for (size_t i = 0; i < bytes; i++) {
        if (g[i] != r[i]) {
            tap_diag("%s: first differing byte %zu: %02x vs %02x", what, i, g[i], r[i]);
            return 0;
        }
    }
    return 1;
}

static const char *order_name(int o) { return o ? "last to first" : "first to last"; }

// ----------------------------------------------------------------------------
// norms

static int rmsnorm_case(size_t N, size_t C, int order)
{
    float *x = randf(N * C, 2.0, 0.3), *w = randf(C, 1.0, 0.5), *dy = randf(N * C, 1.0, 0.0);
    float *out = randf(N * C, 1, 0), *rs = randf(N, 1, 0), *keep = randf(N * C, 1, 0);
    float *out_c = randf(N * C, 1, 0), *rs_c = randf(N, 1, 0);
    float *dx = randf(N * C, 1, 0), *dw = randf(C, 1, 0);
    float *dx_c = dup(dx, N * C), *dw_c = dup(dw, C);
    float *scratch = randf(fsdp_cuda_norm_scratch_floats(N, C), 1, 0);
    fsdp_emu_order = order;
    fsdp_cuda_rmsnorm_forward(out, rs, keep, x, w, N, C, 1e-5f, NULL);
    fsdp_cuda_rmsnorm_backward(dx, dw, scratch, dy, x, w, rs, N, C, NULL);
    fsdp_cpu_rmsnorm_forward(out_c, rs_c, x, w, N, C, 1e-5f);
    fsdp_cpu_rmsnorm_backward(dx_c, dw_c, dy, x, w, rs_c, N, C);
    int ok = close_to("rmsnorm out", out, out_c, N * C, W_NORM);
    ok &= close_to("rmsnorm rstd", rs, rs_c, N, W_NORM);
    ok &= same_bits("rmsnorm keep", keep, x, N * C * sizeof(float));
    ok &= close_to("rmsnorm dinp (accumulated)", dx, dx_c, N * C, W_NORM);
    ok &= close_to("rmsnorm dweight (accumulated)", dw, dw_c, C, W_NORM);
    float *ptrs[] = {x, w, dy, out, rs, keep, out_c, rs_c, dx, dw, dx_c, dw_c, scratch};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++) {
        free(ptrs[i]);
    }
    return ok;
}

static int layernorm_case(size_t N, size_t C, int order)
{
    float *x = randf(N * C, 2.0, 0.7), *w = randf(C, 1.0, 0.5), *b = randf(C, 1.0, 0.0);
    float *dy = randf(N * C, 1.0, 0.0);
    float *out = randf(N * C, 1, 0), *mu = randf(N, 1, 0), *rs = randf(N, 1, 0);
    float *out_c = randf(N * C, 1, 0), *mu_c = randf(N, 1, 0), *rs_c = randf(N, 1, 0);
    float *dx = randf(N * C, 1, 0), *dw = randf(C, 1, 0), *db = randf(C, 1, 0);
    float *dx_c = dup(dx, N * C), *dw_c = dup(dw, C), *db_c = dup(db, C);
    float *scratch = randf(fsdp_cuda_norm_scratch_floats(N, C), 1, 0);
    fsdp_emu_order = order;
    fsdp_cuda_layernorm_forward(out, mu, rs, x, w, b, N, C, 1e-5f, NULL);
    fsdp_cuda_layernorm_backward(dx, dw, db, scratch, dy, x, w, mu, rs, N, C, NULL);
    fsdp_cpu_layernorm_forward(out_c, mu_c, rs_c, x, w, b, N, C, 1e-5f);
    fsdp_cpu_layernorm_backward(dx_c, dw_c, db_c, dy, x, w, mu_c, rs_c, N, C);
    int ok = close_to("layernorm out", out, out_c, N * C, W_NORM);
    ok &= close_to("layernorm mean", mu, mu_c, N, W_NORM);
    ok &= close_to("layernorm rstd", rs, rs_c, N, W_NORM);
    ok &= close_to("layernorm dinp (accumulated)", dx, dx_c, N * C, W_NORM);
    ok &= close_to("layernorm dweight (accumulated)", dw, dw_c, C, W_NORM);
    ok &= close_to("layernorm dbias (accumulated)", db, db_c, C, W_NORM);
    float *ptrs[] = {x,     w,    b,    dy, out, mu, rs,   out_c,  mu_c,
                     rs_c,  dx,   dw,   db, dx_c, dw_c, db_c, scratch};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++) {
        free(ptrs[i]);
    }
    return ok;
}

static void test_norms(void)
{
    static const size_t shapes[][2] = {{1, 1},   {3, 7},   {5, 33}, {17, 100},
                                       {4, 257}, {70, 64}, {2, 1000}, {300, 5}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        size_t N = shapes[s][0], C = shapes[s][1];
        for (int o = 0; o < 2; o++) {
            tap_ok(rmsnorm_case(N, C, o), "rmsnorm forward+backward N=%zu C=%zu (%s)", N, C,
                   order_name(o));
            tap_ok(layernorm_case(N, C, o), "layernorm forward+backward N=%zu C=%zu (%s)", N, C,
                   order_name(o));
        }
    }
}

// ----------------------------------------------------------------------------
// element-wise

static int gelu_swiglu_case(size_t n, int order)
{
    /* wide enough to reach the clamps of exp in both directions */
    float *x = randf(n, 12.0, 0.0), *up = randf(n, 2.0, 0.0), *dy = randf(n, 1.0, 0.0);
    float *y = randf(n, 1, 0), *y_c = randf(n, 1, 0), *dx = randf(n, 1, 0), *dx_c = randf(n, 1, 0);
    float *du = randf(n, 1, 0), *du_c = randf(n, 1, 0);
    fsdp_emu_order = order;
    fsdp_cuda_gelu_forward(y, x, n, NULL);
    fsdp_cpu_gelu_forward(y_c, x, n);
    int ok = close_to("gelu forward", y, y_c, n, W_EW);
    fsdp_cuda_gelu_backward(dx, x, dy, n, NULL);
    fsdp_cpu_gelu_backward(dx_c, x, dy, n);
    ok &= close_to("gelu backward", dx, dx_c, n, W_EW);
    float *dyy = dup(dy, n); /* in place: dinp == dout */
    fsdp_cuda_gelu_backward(dyy, x, dyy, n, NULL);
    ok &= close_to("gelu backward in place", dyy, dx_c, n, W_EW);
    fsdp_cuda_swiglu_forward(y, x, up, n, NULL);
    fsdp_cpu_swiglu_forward(y_c, x, up, n);
    ok &= close_to("swiglu forward", y, y_c, n, W_EW);
    fsdp_cuda_swiglu_backward(dx, du, dy, x, up, n, NULL);
    fsdp_cpu_swiglu_backward(dx_c, du_c, dy, x, up, n);
    ok &= close_to("swiglu dgate", dx, dx_c, n, W_EW);
    ok &= close_to("swiglu dup", du, du_c, n, W_EW);
    float *ptrs[] = {x, up, dy, y, y_c, dx, dx_c, du, du_c, dyy};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++) {
        free(ptrs[i]);
    }
    return ok;
}

static int rope_case(int B, int T, int NH, int NKV, int hs, int order)
{
    size_t n = (size_t)B * T * (NH + 2 * NKV) * hs, h2 = (size_t)hs / 2;
    float *inv = randf(h2, 1, 0), *ct = randf((size_t)T * h2, 1, 0);
    float *st = randf((size_t)T * h2, 1, 0);
    fsdp_cpu_rope_inv_freq(inv, hs, 10000.0, NULL);
    fsdp_cpu_rope_table(ct, st, inv, 3, T, hs);
    float *q = randf(n, 1.0, 0.0), *q_c = dup(q, n);
    fsdp_emu_order = order;
    fsdp_cuda_rope_forward(q, ct, st, B, T, NH, NKV, hs, NULL);
    fsdp_cpu_rope_forward(q_c, ct, st, B, T, NH, NKV, hs);
    int ok = close_to("rope forward", q, q_c, n, W_ROPE);
    fsdp_cuda_rope_backward(q, ct, st, B, T, NH, NKV, hs, NULL);
    fsdp_cpu_rope_backward(q_c, ct, st, B, T, NH, NKV, hs);
    ok &= close_to("rope backward", q, q_c, n, W_ROPE);
    free(inv), free(ct), free(st), free(q), free(q_c);
    return ok;
}

static int adamw_case(size_t n, long step, int decay, int order)
{
    struct fsdp_adamw_params hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
    float *p = randf(n, 1.0, 0.0), *g = randf(n, 4.0, 0.0), *m = randf(n, 0.1, 0.0);
    float *v = randf(n, 0.01, 0.01);
    float *p_c = dup(p, n), *m_c = dup(m, n), *v_c = dup(v, n);
    fsdp_emu_order = order;
    fsdp_cuda_adamw_update(p, g, m, v, n, &hp, decay, 0.5f, NULL);
    fsdp_cpu_adamw_update(p_c, g, m_c, v_c, n, &hp, decay, 0.5f);
    int ok = close_to("adamw param", p, p_c, n, W_ADAMW);
    ok &= close_to("adamw m", m, m_c, n, W_ADAMW);
    ok &= close_to("adamw v", v, v_c, n, W_ADAMW);
    free(p), free(g), free(m), free(v), free(p_c), free(m_c), free(v_c);
    return ok;
}

static void test_elementwise(void)
{
    static const size_t sizes[] = {1, 31, 1000, 4099};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        for (int o = 0; o < 2; o++) {
            size_t n = sizes[s];
            tap_ok(gelu_swiglu_case(n, o), "gelu and swiglu forward+backward n=%zu (%s)", n,
                   order_name(o));
            tap_ok(adamw_case(n, 1, 1, o), "adamw step 1 with decay n=%zu (%s)", n, order_name(o));
            tap_ok(adamw_case(n, 7, 0, o), "adamw step 7 without decay n=%zu (%s)", n,
                   order_name(o));
        }
    }
    static const int ropes[][5] = {
        {1, 1, 1, 1, 2}, {2, 3, 4, 2, 6}, {2, 5, 3, 3, 16}, {1, 7, 6, 1, 10}};
    for (size_t s = 0; s < sizeof(ropes) / sizeof(ropes[0]); s++) {
        const int *r = ropes[s];
        for (int o = 0; o < 2; o++) {
            tap_ok(rope_case(r[0], r[1], r[2], r[3], r[4], o),
                   "rope forward+backward B=%d T=%d NH=%d NKV=%d hs=%d (%s)", r[0], r[1], r[2],
                   r[3], r[4], order_name(o));
        }
    }
}

/* every 16-bit pattern widened; f32 patterns over every exponent with the
 * low bits at, just under and around the rounding tie (bf16 drops 16 bits,
 * f16 13) narrowed: NaN, Inf, overflow, subnormal results, ties */
static void test_casts(void)
{
    size_t n = 65536;
    uint16_t *h = (uint16_t *)malloc(n * 2), *h2 = (uint16_t *)malloc(n * 2);
    float *f = (float *)malloc(n * 4), *f_c = (float *)malloc(n * 4);
    for (int bf = 1; bf >= 0; bf--) {
        const char *name = bf ? "bf16" : "f16";
        uint32_t tie = bf ? 0x8000u : 0x1000u;
        for (size_t i = 0; i < n; i++) {
            h[i] = (uint16_t)i;
        }
        (bf ? fsdp_cuda_bf16_to_f32 : fsdp_cuda_f16_to_f32)(f, h, n, NULL);
        (bf ? fsdp_cpu_bf16_to_f32 : fsdp_cpu_f16_to_f32)(f_c, h, n);
        tap_ok(same_bits(name, f, f_c, n * 4), "%s -> f32: all 65536 patterns, bitwise", name);
        for (size_t i = 0; i < n; i++) {
            uint32_t low = i % 3 == 0 ? tie : i % 3 == 1 ? tie - 1 : (uint32_t)i;
            uint32_t u = (uint32_t)i << 16 | low;
            memcpy(f + i, &u, 4);
        }
        (bf ? fsdp_cuda_f32_to_bf16 : fsdp_cuda_f32_to_f16)(h, f, n, NULL);
        (bf ? fsdp_cpu_f32_to_bf16 : fsdp_cpu_f32_to_f16)(h2, f, n);
        tap_ok(same_bits(name, h, h2, n * 2),
               "f32 -> %s: ties, near-ties, NaN, Inf, overflow, subnormals, bitwise", name);
    }
    free(h), free(h2), free(f), free(f_c);
}

// ----------------------------------------------------------------------------
// cross-entropy

/* columns [c0, c0 + n) of the (N, V) rows */
static float *columns(const float *x, size_t N, size_t V, size_t c0, size_t n)
{
    float *s = (float *)malloc((N * n > 0 ? N * n : 1) * sizeof(float));
    for (size_t r = 0; r < N; r++) {
        memcpy(s + r * n, x + r * V + c0, n * sizeof(float));
    }
    return s;
}

static int ce_whole_case(const float *x, const int32_t *tg, size_t N, size_t V)
{
    float *loss = randf(N, 1, 0), *st = randf(2 * N, 1, 0), *d = randf(N * V, 1, 0);
    float *loss_c = randf(N, 1, 0), *st_c = randf(2 * N, 1, 0), *d_c = randf(N * V, 1, 0);
    size_t kept = 0;
    fsdp_cuda_crossentropy_forward(loss, st, x, tg, N, V, -100, NULL);
    fsdp_cpu_crossentropy_forward(loss_c, st_c, x, tg, N, V, -100, &kept);
    float dscale = 1.0f / (float)(kept ? kept : 1);
    int ok = close_to("crossentropy losses", loss, loss_c, N, W_CE);
    ok &= close_to("crossentropy stats", st, st_c, 2 * N, W_CE);
    fsdp_cuda_crossentropy_backward(d, x, st, tg, N, V, -100, dscale, NULL);
    fsdp_cpu_crossentropy_backward(d_c, x, st_c, tg, N, V, -100, dscale);
    ok &= close_to("crossentropy dlogits", d, d_c, N * V, W_CE);
    memcpy(d, x, N * V * sizeof(float)); /* in place */
    fsdp_cuda_crossentropy_backward(d, d, st, tg, N, V, -100, dscale, NULL);
    ok &= close_to("crossentropy dlogits in place", d, d_c, N * V, W_CE);
    free(loss), free(st), free(d), free(loss_c), free(st_c), free(d_c);
    return ok;
}

/* three uneven vocabulary slices (empty ones left out) */
static int ce_slices_case(const float *x, const int32_t *tg, size_t N, size_t V)
{
    size_t w[3] = {(V + 1) / 3, 0, 0};
    w[1] = (V - w[0]) / 2;
    w[2] = V - w[0] - w[1];
    float *st = randf(2 * N, 1, 0), *tl = randf(N, 1, 0), *st_c = randf(2 * N, 1, 0);
    float *tl_c = randf(N, 1, 0);
    int ok = 1, first = 1;
    for (size_t k = 0, c0 = 0; k < 3; c0 += w[k], k++) {
        if (w[k] == 0) {
            continue;
        }
        float *s = columns(x, N, V, c0, w[k]);
        fsdp_cuda_crossentropy_slice_forward(st, tl, s, tg, N, w[k], c0, -100, first, NULL);
        fsdp_cpu_crossentropy_slice_forward(st_c, tl_c, s, tg, N, w[k], c0, -100, first);
        first = 0;
        free(s);
    }
    ok &= close_to("slice stats", st, st_c, 2 * N, W_CE);
    ok &= same_bits("slice target logits", tl, tl_c, N * sizeof(float));
    for (size_t k = 0, c0 = 0; k < 3; c0 += w[k], k++) {
        if (w[k] == 0) {
            continue;
        }
        float *s = columns(x, N, V, c0, w[k]), *d = randf(N * w[k], 1, 0);
        float *d_c = randf(N * w[k], 1, 0);
        fsdp_cuda_crossentropy_slice_backward(d, s, st, tg, N, w[k], c0, -100, 0.25f, NULL);
        fsdp_cpu_crossentropy_slice_backward(d_c, s, st_c, tg, N, w[k], c0, -100, 0.25f);
        ok &= close_to("slice dlogits", d, d_c, N * w[k], W_CE);
        free(s), free(d), free(d_c);
    }
    free(st), free(tl), free(st_c), free(tl_c);
    return ok;
}

static void test_crossentropy(void)
{
    static const size_t shapes[][2] = {{1, 1}, {5, 37}, {7, 1000}, {3, 2}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        size_t N = shapes[s][0], V = shapes[s][1];
        float *x = randf(N * V, 5.0, 0.0);
        int32_t *tg = (int32_t *)malloc(N * sizeof(int32_t));
        for (size_t r = 0; r < N; r++) {
            tg[r] = r % 4 == 1 ? -100 : (int32_t)((urand() + 1.0) / 2.0 * (double)V) % (int32_t)V;
        }
        for (int o = 0; o < 2; o++) {
            fsdp_emu_order = o;
            tap_ok(ce_whole_case(x, tg, N, V), "crossentropy forward+backward N=%zu V=%zu (%s)",
                   N, V, order_name(o));
            tap_ok(ce_slices_case(x, tg, N, V),
                   "crossentropy over 3 vocabulary slices N=%zu V=%zu (%s)", N, V, order_name(o));
        }
        free(x), free(tg);
    }
}

// ----------------------------------------------------------------------------
// bf16 storage: each result is the f32 result rounded to bf16, so it must
// be what rounding gives for some f32 value within the f32 tolerance of
// the CPU's result (one bf16 value, or two where that interval straddles
// a rounding point): truncating instead of rounding fails

static uint16_t *to_bf16(const float *x, size_t n)
{
    uint16_t *h = (uint16_t *)malloc((n ? n : 1) * 2);
    fsdp_cpu_f32_to_bf16(h, x, n);
    return h;
}

static float *from_bf16(const uint16_t *h, size_t n)
{
    float *f = (float *)malloc((n ? n : 1) * 4);
    fsdp_cpu_bf16_to_f32(f, h, n);
    return f;
}

/* bf16 bits as an integer that counts ulps across zero */
static long worst_ulp; /* the most bf16 ulps seen, for the summary */

static long bf16_rank(uint16_t b)
{
    return b & 0x8000u ? -(long)(b & 0x7fffu) : (long)b;
}

static int bf16_close(const char *what, const uint16_t *got, const float *ref, size_t n)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        ss += (double)ref[i] * (double)ref[i];
    }
    double rms = sqrt(ss / (double)(n ? n : 1));
    long bad = -1, max_ulp = 0;
    for (size_t i = 0; i < n; i++) {
        double t = TOL * fmax(fabs((double)ref[i]), rms);
        long lo = bf16_rank(fsdp_f32_to_bf16((float)((double)ref[i] - t)));
        long hi = bf16_rank(fsdp_f32_to_bf16((float)((double)ref[i] + t)));
        long g = bf16_rank(got[i]), d = labs(g - bf16_rank(fsdp_f32_to_bf16(ref[i])));
        max_ulp = d > max_ulp ? d : max_ulp;
        worst_ulp = d > worst_ulp ? d : worst_ulp;
        if ((g < lo || g > hi) && bad < 0) {
            bad = (long)i;
        }
    }
    if (bad >= 0) {
        tap_diag("%s: max %ld bf16 ulps from the rounded f32 result; first bad [%ld]: %.9g vs "
                 "%.9g", what, max_ulp, bad, (double)fsdp_bf16_to_f32(got[bad]), (double)ref[bad]);
    }
    return bad < 0;
}

static int bf16_ew_case(size_t n, int order)
{
    float *x = randf(n, 12.0, 0.0), *up = randf(n, 2.0, 0.0), *dy = randf(n, 1.0, 0.0);
    uint16_t *hx = to_bf16(x, n), *hu = to_bf16(up, n), *hd = to_bf16(dy, n);
    float *wx = from_bf16(hx, n), *wu = from_bf16(hu, n), *wd = from_bf16(hd, n);
    uint16_t *h1 = to_bf16(x, n), *h2 = to_bf16(x, n);
    float *r1 = randf(n, 1, 0), *r2 = randf(n, 1, 0);
    fsdp_emu_order = order;
    fsdp_cuda_gelu_forward_bf16(h1, hx, n, NULL);
    fsdp_cpu_gelu_forward(r1, wx, n);
    int ok = bf16_close("gelu forward bf16", h1, r1, n);
    fsdp_cuda_gelu_backward_bf16(h1, hx, hd, n, NULL);
    fsdp_cpu_gelu_backward(r1, wx, wd, n);
    ok &= bf16_close("gelu backward bf16", h1, r1, n);
    fsdp_cuda_swiglu_forward_bf16(h1, hx, hu, n, NULL);
    fsdp_cpu_swiglu_forward(r1, wx, wu, n);
    ok &= bf16_close("swiglu forward bf16", h1, r1, n);
    fsdp_cuda_swiglu_backward_bf16(h1, h2, hd, hx, hu, n, NULL);
    fsdp_cpu_swiglu_backward(r1, r2, wd, wx, wu, n);
    ok &= bf16_close("swiglu dgate bf16", h1, r1, n);
    ok &= bf16_close("swiglu dup bf16", h2, r2, n);
    free(x), free(up), free(dy), free(hx), free(hu), free(hd), free(wx), free(wu), free(wd);
    free(h1), free(h2), free(r1), free(r2);
    return ok;
}

static int bf16_rmsnorm_case(size_t N, size_t C, int order)
{
    float *x = randf(N * C, 2.0, 0.3), *w = randf(C, 1.0, 0.5);
    uint16_t *hx = to_bf16(x, N * C), *hw = to_bf16(w, C);
    float *wx = from_bf16(hx, N * C), *ww = from_bf16(hw, C);
    uint16_t *out = to_bf16(x, N * C), *keep = to_bf16(x, N * C);
    memset(keep, 0, N * C * 2);
    float *rs = randf(N, 1, 0), *ref = randf(N * C, 1, 0), *rs_c = randf(N, 1, 0);
    fsdp_emu_order = order;
    fsdp_cuda_rmsnorm_forward_bf16(out, rs, keep, hx, hw, N, C, 1e-5f, NULL);
    fsdp_cpu_rmsnorm_forward(ref, rs_c, wx, ww, N, C, 1e-5f);
    int ok = bf16_close("rmsnorm out bf16", out, ref, N * C);
    ok &= close_to("rmsnorm rstd (bf16 input)", rs, rs_c, N, W_NORM);
    ok &= same_bits("rmsnorm keep bf16", keep, hx, N * C * 2);
    free(x), free(w), free(hx), free(hw), free(wx), free(ww), free(out), free(keep);
    free(rs), free(ref), free(rs_c);
    return ok;
}

static void test_bf16(void)
{
    static const size_t sizes[] = {1, 33, 4099};
    static const size_t shapes[][2] = {{1, 1}, {5, 33}, {4, 257}};
    for (int o = 0; o < 2; o++) {
        for (size_t s = 0; s < 3; s++) {
            tap_ok(bf16_ew_case(sizes[s], o), "gelu and swiglu on bf16 storage n=%zu (%s)",
                   sizes[s], order_name(o));
            tap_ok(bf16_rmsnorm_case(shapes[s][0], shapes[s][1], o),
                   "rmsnorm forward on bf16 storage N=%zu C=%zu (%s)", shapes[s][0],
                   shapes[s][1], order_name(o));
        }
    }
}

// ----------------------------------------------------------------------------
// the emulation itself: what a GPU would hang on or leave undefined stops it

static __global__ void emu_exit_before_barrier(float *x)
{
    if (threadIdx.x == 5) {
        return;
    }
    __syncthreads();
    x[threadIdx.x] = 1.0f;
}

static __global__ void emu_shuffle_with_exited_lane(float *x)
{
    if (threadIdx.x == 3) {
        return;
    }
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

static __global__ void emu_divergent_barriers(float *x)
{
    if (threadIdx.x == 0) {
        __syncthreads();
    } else {
        x[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
    }
}

static float emu_buf[64];
static void launch_exit(void)
{
    FSDP_CUDA_LAUNCH(emu_exit_before_barrier, dim3(2), dim3(64), 0, NULL, emu_buf);
}

static void launch_shfl(void)
{
    FSDP_CUDA_LAUNCH(emu_shuffle_with_exited_lane, dim3(1), dim3(32), 0, NULL, emu_buf);
}

static void launch_div(void)
{
    FSDP_CUDA_LAUNCH(emu_divergent_barriers, dim3(1), dim3(64), 0, NULL, emu_buf);
}

/* 1 when launch() stops the process (SIGABRT) with expect in its message */
static int emu_stops(void (*launch)(void), const char *expect)
{
    int fd[2];
    char msg[512] = {0};
    fflush(stdout);
    if (pipe(fd) != 0) {
        return 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        launch();
        _exit(0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got < sizeof(msg) - 1 && (r = read(fd[0], msg + got, sizeof(msg) - 1 - got)) > 0) {
        got += (size_t)r;
    }
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    int ok = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(msg, expect);
    if (!ok) {
        tap_diag("expected a stop naming \"%s\"; got status %d, message: %s", expect, st, msg);
    }
    return ok;
}

static void test_emulation(void)
{
    tap_ok(emu_stops(launch_exit, "__syncthreads waits for threads that have exited"),
           "emulation: a thread that returns before a __syncthreads stops the kernel");
    tap_ok(emu_stops(launch_shfl, "waits for a lane that has exited"),
           "emulation: a shuffle over a lane that has returned stops the kernel");
    tap_ok(emu_stops(launch_div, "deadlock"),
           "emulation: a __syncthreads in divergent code stops the kernel");
}

// ----------------------------------------------------------------------------
// the small loops

/* y = (accumulate ? y : 0) + 16-bit values, over every pattern */
static int accumulate16_case(void)
{
    size_t n = 65536;
    uint16_t *h2 = (uint16_t *)malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        h2[i] = (uint16_t)i;
    }
    int ok = 1;
    for (int acc = 0; acc < 2; acc++) {
        for (int bf = 0; bf < 2; bf++) {
            float *y = randf(n, 1.0, 0.0), *y_c = dup(y, n);
            fsdp_cuda_accumulate16(y, h2, n, bf, acc, NULL);
            fsdp_cpu_accumulate16(y_c, h2, n, bf, acc);
            ok &= same_bits(bf ? "accumulate16 bf16" : "accumulate16 f16", y, y_c, n * 4);
            free(y), free(y_c);
        }
    }
    free(h2);
    return ok;
}

static int rows_case(size_t N, size_t C, size_t V)
{
    float *table = randf(V * C, 1.0, 0.0), *d = randf(N * C, 1.0, 0.0), *b = randf(C, 1, 0);
    float *res = randf(N * C, 1, 0), *out = randf(N * C, 1, 0), *out_c = randf(N * C, 1, 0);
    float *dt = dup(table, V * C), *dt_c = dup(table, V * C);
    int32_t *tok = (int32_t *)malloc(N * sizeof(int32_t));
    for (size_t r = 0; r < N; r++) {
        tok[r] = (int32_t)(r * 7 % V); /* repeats once N > V */
    }
    fsdp_cuda_embed_gather(out, tok, table, N, C, NULL);
    fsdp_cpu_embed_gather(out_c, tok, table, N, C);
    int ok = same_bits("embed gather", out, out_c, N * C * 4);
    fsdp_cuda_embed_scatter_add(dt, d, tok, N, C, NULL);
    fsdp_cpu_embed_scatter_add(dt_c, d, tok, N, C);
    ok &= same_bits("embed scatter-add", dt, dt_c, V * C * 4);
    for (int k = 0; k < 4; k++) {
        const float *bb = k & 1 ? b : NULL, *rr = k & 2 ? res : NULL;
        fsdp_cuda_bias_residual_forward(out, d, bb, rr, N, C, NULL);
        fsdp_cpu_bias_residual_forward(out_c, d, bb, rr, N, C);
        ok &= same_bits("bias and residual", out, out_c, N * C * 4);
    }
    size_t m = (N < V ? N : V) * C;
    fsdp_cuda_accumulate(dt, d, m, NULL);
    fsdp_cpu_accumulate(dt_c, d, m);
    fsdp_cuda_scale(dt, V * C, 0.37f, NULL);
    fsdp_cpu_scale(dt_c, V * C, 0.37f);
    fsdp_cuda_fill(dt, (V * C + 2) / 3, 3, -INFINITY, NULL);
    fsdp_cpu_fill(dt_c, (V * C + 2) / 3, 3, -INFINITY);
    ok &= same_bits("accumulate, scale, strided fill", dt, dt_c, V * C * 4);
    float *ptrs[] = {table, d, b, res, out, out_c, dt, dt_c};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++) {
        free(ptrs[i]);
    }
    free(tok);
    return ok;
}

static int sums_case(size_t n)
{
    float *x = randf(n, 3.0, 0.0), *st = randf(2 * n, 1.0, 0.0), *zt = randf(n, 1.0, 0.0);
    float *l = randf(n, 1, 0), *l_c = randf(n, 1, 0);
    for (size_t r = 0; r < n; r++) {
        st[2 * r + 1] = 1.0f + fabsf(st[2 * r + 1]);
    }
    int32_t *tg = (int32_t *)malloc(n * sizeof(int32_t));
    for (size_t r = 0; r < n; r++) {
        tg[r] = r % 3 == 2 ? -100 : 5;
    }
    fsdp_cuda_xent_losses(l, st, zt, tg, n, -100, NULL);
    fsdp_cpu_xent_losses(l_c, st, zt, tg, n, -100);
    int ok = same_bits("xent losses", l, l_c, n * 4);
    double acc = 0.25, acc_c = 0.25;
    fsdp_cuda_loss_sum(&acc, l, tg, n, -100, NULL);
    fsdp_cpu_loss_sum(&acc_c, l_c, tg, n, -100);
    ok &= same_bits("loss sum", &acc, &acc_c, sizeof(double));
    double *scratch = (double *)malloc(fsdp_cuda_sumsq_scratch_doubles() * sizeof(double));
    double ss = 1.5, ss_c = 1.5 + fsdp_cpu_sumsq(x, n);
    fsdp_cuda_sumsq(&ss, scratch, x, n, NULL);
    float got = (float)ss, ref = (float)ss_c; /* compared once rounded to f32 */
    ok &= close_to("sumsq", &got, &ref, 1, W_SUMSQ);
    free(x), free(st), free(zt), free(l), free(l_c), free(tg), free(scratch);
    return ok;
}

static void test_small(void)
{
    tap_ok(accumulate16_case(), "accumulate16: f16 and bf16, accumulating and not, bitwise");
    static const size_t rows[][3] = {{1, 1, 1}, {9, 33, 4}, {40, 7, 13}};
    for (size_t s = 0; s < 3; s++) {
        for (int o = 0; o < 2; o++) {
            fsdp_emu_order = o;
            tap_ok(rows_case(rows[s][0], rows[s][1], rows[s][2]),
                   "embedding rows, bias+residual, accumulate, scale, fill N=%zu C=%zu V=%zu "
                   "(%s), bitwise", rows[s][0], rows[s][1], rows[s][2], order_name(o));
        }
    }
    static const size_t sums[] = {1, 100, 70001};
    for (size_t s = 0; s < 3; s++) {
        tap_ok(sums_case(sums[s]), "xent losses and loss sum (bitwise), sumsq n=%zu", sums[s]);
    }
}

int main(void)
{
    test_emulation();
    test_norms();
    test_elementwise();
    test_casts();
    test_crossentropy();
    test_small();
    test_bf16();
    for (int k = 0; k < W_FAMILIES; k++) {
        tap_diag("largest relative error, %s: %.3g (tolerance %.0e)", worst_name[k], worst[k], TOL);
    }
    tap_diag("largest distance on bf16 storage: %ld bf16 ulp from the CPU's f32 result rounded",
             worst_ulp);
    return tap_done();
}
