/*
 * test_cuda_matmul.c - the cuda device's matmuls (src/compute/cuda/
 * matmul_cuda.c) against the CPU's (fsdp_cpu_matmul_forward/backward), on
 * the simulated runtime (cuda_sim.c) and the simulated cuBLASLt
 * (cublaslt_sim.c), in every build and without a GPU: awkward shapes,
 * bias, residual (apart and in place), dinp, dweight and dbias each
 * present or not, accumulation on and off, alpha != 1; f32, bf16 and f16
 * weights; bf16 activations (input, output, both); products in tiles of
 * rows under a lowered staging limit against the untiled ones (the
 * tolerance of the weight gradient's split sum at dweight_close); a
 * weight at an unaligned offset; a bias at one; the plan cache; TF32 on
 * request; a cuBLASLt error as one line naming the call.
 *
 * Tolerances: f32 within 1e-5 relative (|got - want| <= 1e-5 max(1,
 * |want|); the simulation sums in another order than OpenBLAS). For
 * 16-bit weights the CPU runs on the operands the GPU multiplies (the
 * weight, bias and the rounded activation widened back to f32); a product
 * of two bf16 or two f16 values is exact in f32, so the same 1e-5 holds.
 *
 * The CUDA kernels matmul_cuda.c calls (casts, fill) are replaced here by
 * the CPU kernels run as items of the simulated stream: the CUDA ones are
 * bit for bit those (test_cuda_emu checks them).
 */
#include "config.h"
#include "compute/cuda/device_cuda.h"
#include "compute/cuda/kernels_cuda.h"
#include "compute/cuda/matmul_cuda.h"
#include "compute/kernels.h"
#include "core/error.h"
#include "tests/kernels/cublaslt_sim.h"
#include "tests/kernels/cuda_sim.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

// ----------------------------------------------------------------------------
// the kernels matmul_cuda.c calls, as stream items running the CPU's

enum kjob_kind { K_TO_BF16, K_FROM_BF16, K_TO_F16, K_FROM_F16, K_FILL };

struct kjob {
    enum kjob_kind kind;
    void *dst;
    const void *src;
    size_t n, stride;
    float value;
};

static int kernel_bad;   /* kernel calls on memory that is not the device's */
static int kernel_calls; /* kernels enqueued so far */

static void kjob_run(void *arg)
{
    struct kjob *j = arg;
    switch (j->kind) {
    case K_TO_BF16:
        fsdp_cpu_f32_to_bf16(j->dst, j->src, j->n);
        break;
    case K_FROM_BF16:
        fsdp_cpu_bf16_to_f32(j->dst, j->src, j->n);
        break;
    case K_TO_F16:
        fsdp_cpu_f32_to_f16(j->dst, j->src, j->n);
        break;
    case K_FROM_F16:
        fsdp_cpu_f16_to_f32(j->dst, j->src, j->n);
        break;
    case K_FILL:
        for (size_t i = 0; i < j->n; i++) {
            ((float *)j->dst)[i * j->stride] = j->value;
        }
        break;
    }
    free(j);
}

static void kjob(enum kjob_kind kind, void *dst, size_t dst_bytes, const void *src,
                 size_t src_bytes, size_t n, void *stream)
{
    if (!sim_is_device(dst, dst_bytes) || (src && !sim_is_device(src, src_bytes))) {
        kernel_bad++;
        return;
    }
    kernel_calls++;
    struct kjob *j = calloc(1, sizeof(*j));
    *j = (struct kjob){.kind = kind, .dst = dst, .src = src, .n = n};
    sim_enqueue_fn(stream, kjob_run, j);
}

void fsdp_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, void *stream)
{
    kjob(K_TO_BF16, dst, 2 * n, src, 4 * n, n, stream);
}

void fsdp_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream)
{
    kjob(K_FROM_BF16, dst, 4 * n, src, 2 * n, n, stream);
}

void fsdp_cuda_f32_to_f16(uint16_t *dst, const float *src, size_t n, void *stream)
{
    kjob(K_TO_F16, dst, 2 * n, src, 4 * n, n, stream);
}

void fsdp_cuda_f16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream)
{
    kjob(K_FROM_F16, dst, 4 * n, src, 2 * n, n, stream);
}

void fsdp_cuda_fill(float *x, size_t n, size_t stride, float value, void *stream)
{
    if (!sim_is_device(x, 4 * ((n - 1) * stride + 1))) {
        kernel_bad++;
        return;
    }
    struct kjob *j = calloc(1, sizeof(*j));
    *j = (struct kjob){.kind = K_FILL, .dst = x, .n = n, .stride = stride, .value = value};
    sim_enqueue_fn(stream, kjob_run, j);
}

// ----------------------------------------------------------------------------
// host helpers

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float *rand_floats(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((rng_state >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
    }
    return x;
}

static float *dup_floats(const float *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* x rounded to pt and back, in place; into16 (when not NULL) gets the
 * 16-bit values */
static void round_to(float *x, size_t n, enum fsdp_dtype pt, uint16_t *into16)
{
    if (pt == FSDP_F32) {
        return;
    }
    uint16_t *h = into16 ? into16 : malloc(2 * n + 2);
    if (pt == FSDP_BF16) {
        fsdp_cpu_f32_to_bf16(h, x, n);
        fsdp_cpu_bf16_to_f32(x, h, n);
    } else {
        fsdp_cpu_f32_to_f16(h, x, n);
        fsdp_cpu_f16_to_f32(x, h, n);
    }
    if (!into16) {
        free(h);
    }
}

/* Whether got matches want within tol relative; the first bad index and
 * the largest error go to the diagnostics. */
static int close_to(const char *what, const float *got, const float *want, size_t n, double tol)
{
    double worst = 0.0;
    size_t bad = n;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]) / fmax(1.0, fabs(want[i]));
        if (!(err <= tol) && bad == n) {
            bad = i;
        }
        if (err > worst || err != err) {
            worst = err;
        }
    }
    if (bad < n) {
        tap_diag("%s: max rel error %.3g (tol %.1g), first bad index %zu: got %.9g want %.9g", what,
                 worst, tol, bad, got[bad], want[bad]);
    }
    return bad == n;
}

// ----------------------------------------------------------------------------
// device helpers

static struct fsdp_device *dev;
static struct fsdp_cuda_blas *blas;

static void *up(const void *host, size_t bytes)
{
    void *p = NULL;
    if (fsdp_device_alloc(dev, bytes ? bytes : 4, "test", &p) < 0) {
        tap_diag("alloc: %s", fsdp_err_msg());
        exit(1);
    }
    if (host && bytes) {
        fsdp_device_write(dev, p, host, bytes);
    }
    return p;
}

static void down(void *host, const void *p, size_t bytes)
{
    if (bytes) {
        fsdp_device_read(dev, host, p, bytes);
    }
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void drop_all(void *const *bufs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (bufs[i]) {
            dev->ops->free(dev, bufs[i]);
        }
    }
}

static void free_all(float *const *bufs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(bufs[i]);
    }
}

/* The weight (or bias) as the device holds it: f32, or pt's 16-bit
 * values; host keeps the f32 the CPU reference should use. */
static void *up_param(float *host, size_t n, enum fsdp_dtype pt)
{
    if (pt == FSDP_F32) {
        return up(host, n * 4);
    }
    uint16_t *h = malloc(2 * n + 2);
    round_to(host, n, pt, h);
    void *p = up(h, 2 * n);
    free(h);
    return p;
}

// ----------------------------------------------------------------------------
// forward

static const size_t shape_n[] = {1, 7, 64}, shape_c[] = {1, 24, 33}, shape_oc[] = {5, 48};

enum { RES_NONE, RES_APART, RES_IN_PLACE };

static int forward_case(size_t N, size_t C, size_t OC, enum fsdp_dtype pt, int with_bias,
                        int res_mode, double tol)
{
    float *inp = rand_floats(N * C), *w = rand_floats(OC * C), *bias = rand_floats(OC);
    float *res = rand_floats(N * OC), *stale = rand_floats(N * OC);
    void *d_w = up_param(w, OC * C, pt), *d_b = with_bias ? up_param(bias, OC, pt) : NULL;
    float *d_inp = up(inp, N * C * 4), *d_res = res_mode == RES_APART ? up(res, N * OC * 4) : NULL;
    float *d_out = up(res_mode == RES_IN_PLACE ? res : stale, N * OC * 4);
    const float *d_residual = res_mode == RES_APART      ? d_res
                              : res_mode == RES_IN_PLACE ? d_out
                                                         : NULL;
    fsdp_err_clear();
    int rc = fsdp_cuda_matmul_forward(blas, d_out, FSDP_F32, d_inp, FSDP_F32, d_w, d_b, pt,
                                      d_residual, N, C, OC, dev->stream);
    float *got = malloc(N * OC * 4);
    down(got, d_out, N * OC * 4);

    float *want = dup_floats(res, N * OC);
    round_to(inp, N * C, pt, NULL);
    const float *residual = res_mode == RES_APART ? res : res_mode == RES_IN_PLACE ? want : NULL;
    fsdp_cpu_matmul_forward(want, inp, w, with_bias ? bias : NULL, residual, N, C, OC);
    char what[96];
    snprintf(what, sizeof(what), "forward N=%zu C=%zu OC=%zu", N, C, OC);
    int ok = rc == 0 && close_to(what, got, want, N * OC, tol);
    if (rc < 0) {
        tap_diag("%s: %s", what, fsdp_err_msg());
    }
    void *dbufs[] = {d_w, d_b, d_inp, d_res, d_out};
    drop_all(dbufs, COUNT(dbufs));
    float *hbufs[] = {inp, w, bias, res, stale, got, want};
    free_all(hbufs, COUNT(hbufs));
    return ok;
}

static void test_forward(void)
{
    static const enum fsdp_dtype pts[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    static const char *res_names[] = {"no residual", "residual apart", "residual in place"};
    for (int p = 0; p < 3; p++) {
        for (int v = 0; v < 6; v++) {
            int with_bias = v & 1, res_mode = v / 2, bad = 0;
            for (int i = 0; i < 3; i++) {
                for (int j = 0; j < 3; j++) {
                    for (int k = 0; k < 2; k++) {
                        bad += !forward_case(shape_n[i], shape_c[j], shape_oc[k], pts[p], with_bias,
                                             res_mode, 1e-5);
                    }
                }
            }
            tap_ok(bad == 0, "forward, %s weights, %s, %s: 18 shapes as the CPU's (%d bad)",
                   fsdp_dtype_name(pts[p]), with_bias ? "bias" : "no bias", res_names[res_mode],
                   bad);
        }
    }
}

// ----------------------------------------------------------------------------
// backward

enum { B_DINP = 1, B_DW = 2, B_DB = 4 };

struct bwd_variant {
    int outs, accumulate;
    float alpha;
};

static int backward_case(size_t N, size_t C, size_t OC, enum fsdp_dtype pt,
                         const struct bwd_variant *v)
{
    float *dout = rand_floats(N * OC), *inp = rand_floats(N * C), *w = rand_floats(OC * C);
    float *dinp = rand_floats(N * C), *dw = rand_floats(OC * C), *db = rand_floats(OC);
    void *d_w = up_param(w, OC * C, pt);
    float *d_dout = up(dout, N * OC * 4), *d_inp = up(inp, N * C * 4);
    float *d_dinp = v->outs & B_DINP ? up(dinp, N * C * 4) : NULL;
    float *d_dw = v->outs & B_DW ? up(dw, OC * C * 4) : NULL;
    float *d_db = v->outs & B_DB ? up(db, OC * 4) : NULL;
    fsdp_err_clear();
    int rc = fsdp_cuda_matmul_backward(blas, d_dinp, d_dw, d_db, d_dout, d_inp, FSDP_F32, d_w, pt,
                                       N, C, OC, v->alpha, v->accumulate, dev->stream);
    char what[96];
    snprintf(what, sizeof(what), "backward N=%zu C=%zu OC=%zu", N, C, OC);
    if (rc < 0) {
        tap_diag("%s: %s", what, fsdp_err_msg());
    }
    int ok = rc == 0;
    /* dinp meets the weight: on the rounded dout; dweight and dbias on dout */
    float *dout_r = dup_floats(dout, N * OC);
    round_to(dout_r, N * OC, pt, NULL);
    float *got = malloc((N * C > OC * C ? N * C : OC * C) * 4 + 4);
    if (v->outs & B_DINP) {
        fsdp_cpu_matmul_backward(dinp, NULL, NULL, dout_r, inp, w, N, C, OC, v->alpha,
                                 v->accumulate);
        down(got, d_dinp, N * C * 4);
        ok = ok && close_to("dinp", got, dinp, N * C, 1e-5);
    }
    fsdp_cpu_matmul_backward(NULL, dw, db, dout, inp, w, N, C, OC, v->alpha, v->accumulate);
    if (v->outs & B_DW) {
        down(got, d_dw, OC * C * 4);
        ok = ok && close_to("dweight", got, dw, OC * C, 1e-5);
    }
    if (v->outs & B_DB) {
        down(got, d_db, OC * 4);
        ok = ok && close_to("dbias", got, db, OC, 1e-5);
    }
    if (!ok) {
        tap_diag("  in %s", what);
    }
    void *dbufs[] = {d_w, d_dout, d_inp, d_dinp, d_dw, d_db};
    drop_all(dbufs, COUNT(dbufs));
    float *hbufs[] = {dout, inp, w, dinp, dw, db, dout_r, got};
    free_all(hbufs, COUNT(hbufs));
    return ok;
}

static void test_backward(void)
{
    static const enum fsdp_dtype pts[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    static const struct bwd_variant vs[] = {
        {B_DINP | B_DW | B_DB, 0, 1.0f},
        {B_DINP | B_DW | B_DB, 1, 0.5f},
        {B_DINP, 0, -2.0f},
        {B_DW | B_DB, 0, 1.0f},
        {B_DB, 1, 0.25f},
    };
    for (int p = 0; p < 3; p++) {
        for (size_t x = 0; x < sizeof(vs) / sizeof(vs[0]); x++) {
            int bad = 0;
            for (int i = 0; i < 3; i++) {
                for (int j = 0; j < 3; j++) {
                    for (int k = 0; k < 2; k++) {
                        bad += !backward_case(shape_n[i], shape_c[j], shape_oc[k], pts[p], &vs[x]);
                    }
                }
            }
            tap_ok(bad == 0,
                   "backward, %s weights, dinp %s, dweight %s, dbias %s, %s, alpha %g: 18 shapes "
                   "as the CPU's (%d bad)",
                   fsdp_dtype_name(pts[p]), vs[x].outs & B_DINP ? "yes" : "no",
                   vs[x].outs & B_DW ? "yes" : "no", vs[x].outs & B_DB ? "yes" : "no",
                   vs[x].accumulate ? "accumulating" : "overwriting", (double)vs[x].alpha, bad);
        }
    }
}

// ----------------------------------------------------------------------------
// activations in bf16 storage

/* got (bf16 values, widened) is want rounded to nearest: within half a
 * bf16 unit of it, plus tol relative for the simulation's order of sums
 * (a truncated or unrounded result is a unit off for about half). */
static int rounded_from(const char *what, const float *got, const float *want, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        int e;
        frexp(want[i], &e);
        double lim = ldexp(1.0, e - 9) + tol * fmax(1.0, fabs(want[i]));
        if (!(fabs((double)got[i] - want[i]) <= lim)) {
            tap_diag("%s: [%zu] got %.9g, want %.9g rounded to bf16 (within %.3g)", what, i,
                     (double)got[i], (double)want[i], lim);
            return 0;
        }
    }
    return 1;
}

/* The forward with its input in it and output in ot (a bias), and with a
 * bf16 input the backward (dinp and dweight: both use the staging), each
 * against the CPU's on the widened input (rounded to pt where it meets a
 * 16-bit weight), a bf16 output against the f32 result rounded. */
static int act_case(size_t N, size_t C, size_t OC, enum fsdp_dtype pt, enum fsdp_dtype it,
                    enum fsdp_dtype ot)
{
    const enum fsdp_dtype H = FSDP_BF16;
    float *inp = rand_floats(N * C), *w = rand_floats(OC * C), *bias = rand_floats(OC);
    float *dout = rand_floats(N * OC), *dw = calloc(OC * C + 1, 4), *dinp = malloc(N * C * 4 + 4);
    float *got = malloc((N * OC + OC * C + N * C) * 4), *want = malloc(N * OC * 4);
    uint16_t *i16 = malloc(2 * N * C + 2), *o16 = malloc(2 * N * OC + 2);
    round_to(inp, N * C, it, i16); /* the widened input */
    float *x = dup_floats(inp, N * C), *dout_r = dup_floats(dout, N * OC);
    void *d_w = up_param(w, OC * C, pt), *d_b = up_param(bias, OC, pt);
    void *d_inp = it == H ? up(i16, 2 * N * C) : up(inp, 4 * N * C);
    void *d_out = up(NULL, N * OC * (ot == H ? 2 : 4)), *d_dout = up(dout, N * OC * 4);
    float *d_dw = up(dw, OC * C * 4), *d_dinp = up(NULL, N * C * 4);
    int rc = fsdp_cuda_matmul_forward(blas, d_out, ot, d_inp, it, d_w, d_b, pt, NULL, N, C, OC,
                                      dev->stream);
    if (ot == H) {
        down(o16, d_out, 2 * N * OC);
        fsdp_cpu_bf16_to_f32(got, o16, N * OC);
    } else {
        down(got, d_out, 4 * N * OC);
    }
    round_to(x, N * C, pt, NULL);
    fsdp_cpu_matmul_forward(want, x, w, bias, NULL, N, C, OC);
    int ok = rc == 0 && (ot == H ? rounded_from("forward (bf16 output)", got, want, N * OC, 1e-5)
                                 : close_to("forward", got, want, N * OC, 1e-5));
    if (it == H) {
        rc = fsdp_cuda_matmul_backward(blas, d_dinp, d_dw, NULL, d_dout, d_inp, it, d_w, pt, N, C,
                                       OC, 0.5f, 0, dev->stream);
        round_to(dout_r, N * OC, pt, NULL);
        fsdp_cpu_matmul_backward(dinp, NULL, NULL, dout_r, inp, w, N, C, OC, 0.5f, 0);
        fsdp_cpu_matmul_backward(NULL, dw, NULL, dout, inp, w, N, C, OC, 0.5f, 0);
        down(got, d_dinp, N * C * 4);
        ok = ok && rc == 0 && close_to("dinp (bf16 input)", got, dinp, N * C, 1e-5);
        down(got, d_dw, OC * C * 4);
        ok = ok && close_to("dweight (bf16 input)", got, dw, OC * C, 1e-5);
    }
    if (rc < 0) {
        tap_diag("N=%zu C=%zu OC=%zu: %s", N, C, OC, fsdp_err_msg());
    }
    void *dbufs[] = {d_w, d_b, d_inp, d_out, d_dout, d_dw, d_dinp};
    drop_all(dbufs, COUNT(dbufs));
    free(i16), free(o16);
    float *hbufs[] = {inp, w, bias, dout, dw, dinp, got, want, x, dout_r};
    free_all(hbufs, COUNT(hbufs));
    return ok;
}

static void test_act_dtypes(void)
{
    static const enum fsdp_dtype pts[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    static const char *modes[] = {"a bf16 input and output", "a bf16 input", "a bf16 output"};
    const enum fsdp_dtype F = FSDP_F32, H = FSDP_BF16;
    for (int p = 0; p < 3; p++) {
        for (int m = 0; m < 3; m++) {
            int bad = 0;
            for (int i = 0; i < 3; i++) {
                for (int j = 0; j < 3; j++) {
                    for (int k = 0; k < 2; k++) {
                        bad += !act_case(shape_n[i], shape_c[j], shape_oc[k], pts[p],
                                         m == 2 ? F : H, m == 1 ? F : H);
                    }
                }
            }
            tap_ok(bad == 0, "%s weights, %s: forward%s, 18 shapes as the CPU's (%d bad)",
                   fsdp_dtype_name(pts[p]), modes[m], m < 2 ? " and backward" : "", bad);
        }
    }
    float *x = up(NULL, 64), *w = up(NULL, 64), *out = up(NULL, 64);
    int before = kernel_calls; /* bf16 weights meet a bf16 input as it is */
    int rc0 = fsdp_cuda_matmul_forward(blas, out, F, x, H, w, NULL, H, NULL, 2, 2, 2, dev->stream);
    tap_ok(rc0 == 0 && kernel_calls == before,
           "a bf16 input meets bf16 weights as it is: no staging kernel (%d run)",
           kernel_calls - before);
    fsdp_err_clear();
    int rc = fsdp_cuda_matmul_forward(blas, out, H, x, F, w, NULL, F, (float *)out, 2, 2, 2,
                                      dev->stream);
    tap_ok(rc < 0 && strstr(fsdp_err_msg(), "residual writes f32, not bf16"),
           "a bf16 output with a residual is refused in one line (%s)", fsdp_err_msg());
    void *bufs[] = {x, w, out};
    drop_all(bufs, COUNT(bufs));
}

// ----------------------------------------------------------------------------
// bounded staging: products in tiles of rows

static struct fsdp_cuda_blas *tiny; /* a handle whose staging limit each product lowers */

/* Bytes of the live buffers named "cuda matmul staging", as the device's
 * allocator reports them. */
static size_t stage_held(void)
{
    struct fsdp_device_buffer bufs[64];
    size_t n = dev->ops->buffers(dev, bufs, 64), held = 0;
    for (size_t i = 0; i < n && i < 64; i++) {
        held += strcmp(bufs[i].name, "cuda matmul staging") == 0 ? bufs[i].bytes : 0;
    }
    return held;
}

#define TILE_N 23 /* prime: 2 to 11 rows a tile leave a remainder, in 3 to 12 tiles */

struct tile_run {
    int matmuls;
    unsigned long plans;
    size_t held, limit;
};

/* Lowers tiny's limit so a product staging row_bytes a row (beside fixed
 * bytes, rounded up to 256 as each part of the staging is) takes tiles of
 * 6 rows (4 tiles, the last 5); row_bytes 0: no staging per row, so no
 * tiling. blas's staging is dropped, so what the allocator reports from
 * here is tiny's. */
static void tile_begin(struct tile_run *t, size_t fixed, size_t row_bytes)
{
    fsdp_cuda_blas_set_stage_limit(blas, 1);
    fsdp_cuda_blas_set_stage_limit(blas, 0);
    t->limit = row_bytes ? (fixed + 255) / 256 * 256 + 3 * 256 + 6 * row_bytes : 64 * MiB;
    fsdp_cuda_blas_set_stage_limit(tiny, t->limit);
    t->matmuls = sim_lt_matmuls;
    t->plans = fsdp_cuda_blas_plans_made(tiny);
}

/* The tiled product ran in 3 to 12 tiles (a remainder), made at most two
 * plans, and staged within the limit; extra matmuls not of the tiling
 * (the bias gradient) are subtracted. */
static int tile_end(struct tile_run *t, int tiled, int extra, const char *what)
{
    int mm = sim_lt_matmuls - t->matmuls - extra;
    unsigned long plans = fsdp_cuda_blas_plans_made(tiny) - t->plans;
    size_t held = stage_held();
    int ok = (tiled ? mm >= 3 && mm <= 12 && held > 0 : mm == 1) && plans <= 2 && held <= t->limit;
    if (!ok) {
        tap_diag("%s: %d products, %lu plans, %zu staging bytes (limit %zu)", what, mm, plans, held,
                 t->limit);
    }
    return ok;
}

static int same_bytes(const char *what, const void *a, const void *b, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++) {
        if (((const unsigned char *)a)[i] != ((const unsigned char *)b)[i]) {
            tap_diag("%s: byte %zu differs", what, i);
            return 0;
        }
    }
    return 1;
}

/* The forward, untiled (blas) and tiled (tiny), from the same operands:
 * the same bytes (a tile's rows are the same products). */
static int tiled_forward(size_t C, size_t OC, enum fsdp_dtype pt, enum fsdp_dtype it,
                         enum fsdp_dtype ot, int with_bias, int res_mode)
{
    const size_t N = TILE_N, oes = ot == FSDP_F32 ? 4 : 2, ies = it == FSDP_F32 ? 4 : 2;
    float *inp = rand_floats(N * C), *w = rand_floats(OC * C), *bias = rand_floats(OC);
    float *res = rand_floats(N * OC);
    uint16_t *i16 = malloc(2 * N * C + 2);
    round_to(inp, N * C, it, i16);
    void *d_w = up_param(w, OC * C, pt), *d_b = with_bias ? up_param(bias, OC, pt) : NULL;
    void *d_inp = up(it == FSDP_F32 ? (void *)inp : (void *)i16, N * C * ies);
    void *d_out[2], *d_res[2];
    char *got[2] = {NULL, NULL};
    int rc = 0, ok = 1;
    for (int t = 0; t < 2; t++) {
        d_out[t] = up(res, N * OC * oes);
        d_res[t] = res_mode == RES_APART ? up(res, N * OC * 4) : NULL;
        const float *r = res_mode == RES_IN_PLACE ? d_out[t] : d_res[t];
        struct tile_run tr;
        int cast = pt != FSDP_F32 && pt != it, widen = it != FSDP_F32 && pt != it;
        size_t row = (cast ? 2 * C : 0) + (widen ? 4 * C : 0) + (ot != FSDP_F32 ? 4 * OC : 0);
        tile_begin(&tr, pt != FSDP_F32 && with_bias ? 4 * OC : 0, row);
        rc |= fsdp_cuda_matmul_forward(t ? blas : tiny, d_out[t], ot, d_inp, it, d_w, d_b, pt, r, N,
                                       C, OC, dev->stream);
        if (!t) {
            ok = tile_end(&tr, row != 0, 0, "tiled forward");
        }
        got[t] = malloc(N * OC * oes);
        down(got[t], d_out[t], N * OC * oes);
    }
    ok = ok && rc == 0 && same_bytes("tiled forward", got[0], got[1], N * OC * oes);
    if (rc < 0) {
        tap_diag("tiled forward C=%zu OC=%zu: %s", C, OC, fsdp_err_msg());
    }
    void *dbufs[] = {d_w, d_b, d_inp, d_out[0], d_out[1], d_res[0], d_res[1]};
    drop_all(dbufs, COUNT(dbufs));
    float *hbufs[] = {inp, w, bias, res, (float *)got[0], (float *)got[1], (float *)i16};
    free_all(hbufs, COUNT(hbufs));
    return ok;
}

static void test_tiled_forward(void)
{
    static const enum fsdp_dtype pts[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    const enum fsdp_dtype F = FSDP_F32, H = FSDP_BF16;
    for (int p = 0; p < 3; p++) {
        for (int m = 0; m < 4; m++) {
            enum fsdp_dtype it = m & 1 ? H : F, ot = m & 2 ? H : F;
            int bad = 0, n = 0;
            for (int v = 0; v < 6; v++) {
                int with_bias = v & 1, res_mode = v / 2;
                if (res_mode != RES_NONE && ot != F) {
                    continue; /* refused: a residual writes f32 */
                }
                bad += !tiled_forward(33, 48, pts[p], it, ot, with_bias, res_mode);
                bad += !tiled_forward(24, 25, pts[p], it, ot, with_bias, res_mode);
                n += 2;
            }
            tap_ok(bad == 0,
                   "tiled forward, %s weights, %s input, %s output: %d cases (bias, residual) the "
                   "untiled bytes, in 3+ tiles with a remainder where it stages, within the "
                   "staging limit (%d bad)",
                   fsdp_dtype_name(pts[p]), fsdp_dtype_name(it), fsdp_dtype_name(ot), n, bad);
        }
    }
}

/* |tiled - untiled| of the weight gradient, each within the first-order
 * bound of two f32 sums of the same N products split differently: each
 * is within (N + 2 tiles) u S of the exact value (u = 2^-24; S = |dw0| +
 * sum |alpha g x|: N - 1 additions in a sum, alpha's product and the add
 * into dweight per tile), so they differ by at most 2 (N + 2 T + 2) u S. */
static int dweight_close(const float *got, const float *want, const float *dw0, const float *dout,
                         const float *x, size_t C, size_t OC, float alpha, int tiles)
{
    const size_t N = TILE_N;
    for (size_t o = 0; o < OC; o++) {
        for (size_t c = 0; c < C; c++) {
            double S = fabs(dw0[o * C + c]);
            for (size_t l = 0; l < N; l++) {
                S += fabs((double)alpha * dout[l * OC + o] * x[l * C + c]);
            }
            double lim = 2.0 * (double)(N + 2 * tiles + 2) * ldexp(1.0, -24) * S;
            double err = fabs((double)got[o * C + c] - want[o * C + c]);
            if (!(err <= lim)) {
                tap_diag("tiled dweight [%zu, %zu]: got %.9g, untiled %.9g (bound %.3g)", o, c,
                         (double)got[o * C + c], (double)want[o * C + c], lim);
                return 0;
            }
        }
    }
    return 1;
}

/* The backward, untiled (blas) and tiled (tiny), accumulating with alpha
 * 0.5: dinp (its own call, tiled when pt is 16-bit) the same bytes,
 * dweight (tiled for a bf16 input) within dweight_close, dbias the same. */
static int tiled_backward(size_t C, size_t OC, enum fsdp_dtype pt, enum fsdp_dtype it)
{
    const size_t N = TILE_N, ies = it == FSDP_F32 ? 4 : 2;
    float *inp = rand_floats(N * C), *w = rand_floats(OC * C), *dout = rand_floats(N * OC);
    float *dinp0 = rand_floats(N * C), *dw0 = rand_floats(OC * C), *db0 = rand_floats(OC);
    uint16_t *i16 = malloc(2 * N * C + 2);
    round_to(inp, N * C, it, i16);
    void *d_w = up_param(w, OC * C, pt),
         *d_inp = up(it == FSDP_F32 ? (void *)inp : i16, N * C * ies);
    float *d_dout = up(dout, N * OC * 4), *d_dx[2], *d_dw[2], *d_db[2];
    float *g_dx[2], *g_dw[2], *g_db[2];
    int rc = 0, ok = 1, tiles = 0;
    for (int t = 0; t < 2; t++) {
        struct fsdp_cuda_blas *h = t ? blas : tiny;
        d_dx[t] = up(dinp0, N * C * 4), d_dw[t] = up(dw0, OC * C * 4), d_db[t] = up(db0, OC * 4);
        struct tile_run tr;
        tile_begin(&tr, 0, pt != FSDP_F32 ? 2 * OC : 0);
        rc |= fsdp_cuda_matmul_backward(h, d_dx[t], NULL, NULL, d_dout, d_inp, it, d_w, pt, N, C,
                                        OC, 0.5f, 1, dev->stream);
        ok = ok && (t || tile_end(&tr, pt != FSDP_F32, 0, "tiled dinp"));
        tile_begin(&tr, 0, it != FSDP_F32 ? 4 * C : 0);
        rc |= fsdp_cuda_matmul_backward(h, NULL, d_dw[t], d_db[t], d_dout, d_inp, it, d_w, pt, N, C,
                                        OC, 0.5f, 1, dev->stream);
        tiles = t ? tiles : sim_lt_matmuls - tr.matmuls - 1;
        ok = ok && (t || tile_end(&tr, it != FSDP_F32, 1, "tiled dweight"));
        g_dx[t] = malloc(N * C * 4), g_dw[t] = malloc(OC * C * 4), g_db[t] = malloc(OC * 4);
        down(g_dx[t], d_dx[t], N * C * 4);
        down(g_dw[t], d_dw[t], OC * C * 4);
        down(g_db[t], d_db[t], OC * 4);
    }
    ok = ok && rc == 0 && same_bytes("tiled dinp", g_dx[0], g_dx[1], N * C * 4) &&
         dweight_close(g_dw[0], g_dw[1], dw0, dout, inp, C, OC, 0.5f, tiles) &&
         same_bytes("tiled dbias", g_db[0], g_db[1], OC * 4);
    if (rc < 0) {
        tap_diag("tiled backward C=%zu OC=%zu: %s", C, OC, fsdp_err_msg());
    }
    void *dbufs[] = {d_w, d_inp, d_dout, d_dx[0], d_dx[1], d_dw[0], d_dw[1], d_db[0], d_db[1]};
    drop_all(dbufs, COUNT(dbufs));
    float *hbufs[] = {inp,     w,       dout,    dinp0,   dw0,     db0,    (float *)i16,
                      g_dx[0], g_dx[1], g_dw[0], g_dw[1], g_db[0], g_db[1]};
    free_all(hbufs, COUNT(hbufs));
    return ok;
}

static void test_tiled_backward(void)
{
    static const enum fsdp_dtype pts[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    for (int p = 0; p < 3; p++) {
        for (int m = 0; m < 2; m++) {
            enum fsdp_dtype it = m ? FSDP_BF16 : FSDP_F32;
            int bad = !tiled_backward(33, 48, pts[p], it) + !tiled_backward(24, 25, pts[p], it);
            tap_ok(bad == 0,
                   "tiled backward, %s weights, %s input, accumulating: dinp%s and dbias the "
                   "untiled bytes, dweight%s within f32 rounding of the split, within the staging "
                   "limit (%d bad)",
                   fsdp_dtype_name(pts[p]), fsdp_dtype_name(it),
                   pts[p] != FSDP_F32 ? " in 3+ tiles" : "", m ? " in 3+ tiles" : "", bad);
        }
    }
}

// ----------------------------------------------------------------------------
// alignment, the plan cache, TF32, errors

/* A weight and an input one element past an aligned start, as a weight
 * inside a gathered unit can be: a plan of its own, the same result. */
static void test_unaligned(void)
{
    static const enum fsdp_dtype pts[] = {FSDP_F32, FSDP_BF16};
    size_t N = 7, C = 33, OC = 48;
    for (int p = 0; p < 2; p++) {
        enum fsdp_dtype pt = pts[p];
        size_t es = pt == FSDP_F32 ? 4 : 2;
        float *inp = rand_floats(N * C), *w = rand_floats(OC * C), *want = malloc(N * OC * 4);
        float *got = malloc(N * OC * 4);
        void *w_dev = up_param(w, OC * C, pt);
        char *w_big = up(NULL, (OC * C + 1) * es), *i_big = up(NULL, (N * C + 1) * 4);
        fsdp_device_copy(dev, w_big + es, w_dev, OC * C * es);
        fsdp_device_write(dev, i_big + 4, inp, N * C * 4);
        float *d_out = up(NULL, N * OC * 4);
        unsigned long made = fsdp_cuda_blas_plans_made(blas);
        int rc = fsdp_cuda_matmul_forward(blas, d_out, FSDP_F32, (float *)(i_big + 4), FSDP_F32,
                                          w_big + es, NULL, pt, NULL, N, C, OC, dev->stream);
        down(got, d_out, N * OC * 4);
        round_to(inp, N * C, pt, NULL);
        fsdp_cpu_matmul_forward(want, inp, w, NULL, NULL, N, C, OC);
        tap_ok(rc == 0 && close_to("unaligned", got, want, N * OC, 1e-5) &&
                   fsdp_cuda_blas_plans_made(blas) == made + 1,
               "%s weight and input %zu and 4 bytes off alignment: the CPU's result, a plan of "
               "their own (rc %d)",
               fsdp_dtype_name(pt), es, rc);
        void *dbufs[] = {w_dev, w_big, i_big, d_out};
        drop_all(dbufs, COUNT(dbufs));
        float *hbufs[] = {inp, w, want, got};
        free_all(hbufs, COUNT(hbufs));
    }
}

/* An f32 bias 4 bytes off alignment (the BIAS epilogue reads it as it
 * is): the heuristic reads the bias pointer's alignment, so it must be
 * set before the heuristic is asked, and a plan made for an aligned bias
 * must not serve a misaligned one. */
static void test_bias_alignment(void)
{
    size_t N = 5, C = 20, OC = 36; /* a shape no other test uses */
    float *inp = rand_floats(N * C), *w = rand_floats(OC * C), *bias = rand_floats(OC);
    float *want = malloc(N * OC * 4), *got = malloc(N * OC * 4);
    float *d_inp = up(inp, N * C * 4), *d_w = up(w, OC * C * 4), *d_out = up(NULL, N * OC * 4);
    float *b_al = up(bias, OC * 4);
    char *b_big = up(NULL, (OC + 1) * 4);
    fsdp_device_write(dev, b_big + 4, bias, OC * 4);
    const float *b_off = (const float *)(b_big + 4);
    int refused = sim_lt_refused, ok[2];
    fsdp_err_clear();
    for (int t = 0; t < 2; t++) { /* N rows: misaligned first; N - 1: aligned, then misaligned */
        size_t n = N - (size_t)t;
        unsigned long made = fsdp_cuda_blas_plans_made(blas);
        int rc = 0;
        if (t) {
            rc = fsdp_cuda_matmul_forward(blas, d_out, FSDP_F32, d_inp, FSDP_F32, d_w, b_al,
                                          FSDP_F32, NULL, n, C, OC, dev->stream);
        }
        rc |= fsdp_cuda_matmul_forward(blas, d_out, FSDP_F32, d_inp, FSDP_F32, d_w, b_off, FSDP_F32,
                                       NULL, n, C, OC, dev->stream);
        down(got, d_out, n * OC * 4);
        fsdp_cpu_matmul_forward(want, inp, w, bias, NULL, n, C, OC);
        ok[t] = rc == 0 && sim_lt_refused == refused &&
                fsdp_cuda_blas_plans_made(blas) == made + 1 + (unsigned long)t &&
                close_to("misaligned bias", got, want, n * OC, 1e-5);
        if (rc < 0) {
            tap_diag("misaligned bias: %s", fsdp_err_msg());
        }
    }
    tap_ok(ok[0], "a bias 4 bytes off alignment on a new shape: the heuristic sees its pointer, "
                  "nothing refused, the CPU's result");
    tap_ok(ok[1], "a bias 4 bytes off alignment after an aligned one of the same shape: a plan of "
                  "its own, nothing refused, the CPU's result");
    void *dbufs[] = {d_inp, d_w, d_out, b_al, b_big};
    drop_all(dbufs, COUNT(dbufs));
    float *hbufs[] = {inp, w, bias, want, got};
    free_all(hbufs, COUNT(hbufs));
}

static void test_cache(void)
{
    size_t N = 16, C = 40, OC = 24; /* a shape no other test uses */
    float *h = rand_floats(N * C > OC * C ? N * C : OC * C);
    float *x = up(h, N * C * 4), *w = up(h, OC * C * 4), *bias = up(h, OC * 4);
    float *out = up(NULL, N * OC * 4), *dx = up(NULL, N * C * 4), *dw = up(NULL, OC * C * 4);
    float *db = up(NULL, OC * 4);
    uint16_t *w16 = up(NULL, OC * C * 2), *b16 = up(NULL, OC * 2);
    void *s = dev->stream;
    for (int pass = 0; pass < 2; pass++) {
        unsigned long made = fsdp_cuda_blas_plans_made(blas);
        int heur = sim_lt_heuristics, mallocs = sim_mallocs;
        size_t live = dev->stats.bytes_now;
        int rc = fsdp_cuda_matmul_forward(blas, out, FSDP_F32, x, FSDP_F32, w, bias, FSDP_F32, out,
                                          N, C, OC, s);
        rc |= fsdp_cuda_matmul_backward(blas, dx, dw, db, out, x, FSDP_F32, w, FSDP_F32, N, C, OC,
                                        1.0f, 1, s);
        rc |= fsdp_cuda_matmul_forward(blas, out, FSDP_F32, x, FSDP_F32, w16, b16, FSDP_BF16, NULL,
                                       N, C, OC, s);
        rc |= fsdp_cuda_matmul_backward(blas, dx, dw, db, out, x, FSDP_F32, w16, FSDP_BF16, N, C,
                                        OC, 1.0f, 0, s);
        unsigned long added = fsdp_cuda_blas_plans_made(blas) - made;
        if (pass == 0) {
            tap_ok(rc == 0 && added == 6 && sim_lt_heuristics - heur == 6,
                   "first use of a shape: 6 plans (f32 and bf16 forward and dinp, dweight, dbias; "
                   "%lu made)",
                   added);
        } else {
            tap_ok(rc == 0 && added == 0 && sim_lt_heuristics == heur && sim_mallocs == mallocs &&
                       dev->stats.bytes_now == live,
                   "the same calls again: no plan, no heuristic, no allocation (%lu plans, %zu "
                   "bytes more)",
                   added, dev->stats.bytes_now - live);
        }
    }
    void *dbufs[] = {x, w, bias, out, dx, dw, db, w16, b16};
    drop_all(dbufs, COUNT(dbufs));
    free(h);
}

static int one_line(const char *msg, const char *a, const char *b)
{
    int ok = strchr(msg, '\n') == NULL && strstr(msg, a) && strstr(msg, b);
    if (!ok) {
        tap_diag("message: %s", msg);
    }
    return ok;
}

static void test_errors(void)
{
    size_t N = 7, C = 24, OC = 5;
    float *h = rand_floats(OC * C + N * C);
    float *x = up(h, N * C * 4), *w = up(h, OC * C * 4), *out = up(NULL, N * OC * 4);
    fsdp_err_clear(); /* the first message stays until cleared */
    sim_lt_fail_call = "cublasLtMatmul";
    sim_lt_fail_status = CUBLAS_STATUS_EXECUTION_FAILED;
    int rc = fsdp_cuda_matmul_forward(blas, out, FSDP_F32, x, FSDP_F32, w, NULL, FSDP_F32, NULL, N,
                                      C, OC, dev->stream);
    tap_ok(rc == FSDP_ERR_BACKEND &&
               one_line(fsdp_err_msg(), "cublasLtMatmul failed", "CUBLAS_STATUS_EXECUTION_FAILED"),
           "a failing cublasLtMatmul: one line naming the call and the status");
    unsigned long made = fsdp_cuda_blas_plans_made(blas);
    fsdp_err_clear();
    sim_lt_fail_call = "cublasLtMatmulAlgoGetHeuristic";
    sim_lt_fail_status = CUBLAS_STATUS_NOT_SUPPORTED;
    rc = fsdp_cuda_matmul_forward(blas, out, FSDP_F32, x, FSDP_F32, w, NULL, FSDP_F32, NULL, N + 1,
                                  C, OC, dev->stream);
    tap_ok(rc < 0 && one_line(fsdp_err_msg(), "cublasLtMatmulAlgoGetHeuristic failed",
                              "CUBLAS_STATUS_NOT_SUPPORTED"),
           "a failing heuristic: one line naming it");
    rc = fsdp_cuda_matmul_forward(blas, out, FSDP_F32, x, FSDP_F32, w, NULL, FSDP_F32, NULL, N + 1,
                                  C, OC, dev->stream);
    tap_ok(rc == 0 && fsdp_cuda_blas_plans_made(blas) == made + 1,
           "no half-made plan stays: the next call makes it whole");
    fsdp_err_clear();
    rc = fsdp_cuda_matmul_forward(blas, out, FSDP_F32, x, FSDP_F32, w, NULL, FSDP_I32, NULL, N, C,
                                  OC, dev->stream);
    tap_ok(rc == FSDP_ERR_UNSUPPORTED && one_line(fsdp_err_msg(), "matmul", "i32"),
           "i32 weights: refused in one line");
    void *dbufs[] = {x, w, out};
    drop_all(dbufs, COUNT(dbufs));
    free(h);
}

static void test_tf32(void)
{
    struct fsdp_cuda_blas *t = NULL;
    setenv("FSDPC_CUDA_TF32", "1", 1);
    int rc = fsdp_cuda_blas_create(dev, &t);
    unsetenv("FSDPC_CUDA_TF32");
    if (!tap_ok(rc == 0, "a handle with FSDPC_CUDA_TF32=1")) {
        return;
    }
    size_t N = 64, C = 33, OC = 48;
    float *inp = rand_floats(N * C), *w = rand_floats(OC * C), *want = malloc(N * OC * 4);
    float *got = malloc(N * OC * 4);
    float *d_inp = up(inp, N * C * 4), *d_w = up(w, OC * C * 4), *d_out = up(NULL, N * OC * 4);
    float *d_db = up(NULL, OC * 4);
    int tf32 = sim_lt_tf32;
    rc = fsdp_cuda_matmul_forward(t, d_out, FSDP_F32, d_inp, FSDP_F32, d_w, NULL, FSDP_F32, NULL, N,
                                  C, OC, dev->stream);
    down(got, d_out, N * OC * 4);
    fsdp_cpu_matmul_forward(want, inp, w, NULL, NULL, N, C, OC);
    tap_ok(rc == 0 && sim_lt_tf32 == tf32 + 1 && close_to("tf32", got, want, N * OC, 1e-2),
           "TF32 on request: the f32 forward computes in TF32, within 1e-2 of f32");
    tf32 = sim_lt_tf32;
    rc = fsdp_cuda_matmul_backward(t, NULL, NULL, d_db, d_out, d_inp, FSDP_F32, d_w, FSDP_F32, N, C,
                                   OC, 1.0f, 0, dev->stream);
    tap_ok(rc == 0 && sim_lt_tf32 == tf32, "the bias gradient stays exact f32 under TF32");
    fsdp_cuda_blas_destroy(t);
    void *dbufs[] = {d_inp, d_w, d_out, d_db};
    drop_all(dbufs, COUNT(dbufs));
    float *hbufs[] = {inp, w, want, got};
    free_all(hbufs, COUNT(hbufs));
}

int main(void)
{
    unsetenv("FSDPC_CUDA_DEVICE");
    unsetenv("FSDPC_CUDA_TF32");
    sim_capacity = 256 * MiB;
    int live = sim_live();
    if (!tap_ok(fsdp_cuda_device_create_ops_only(0, &dev) == 0,
                "a cuda device on the simulation")) {
        return tap_done();
    }
    fsdp_device_reserve(dev, 64 * MiB);
    if (!tap_ok(fsdp_cuda_blas_create(dev, &blas) == 0, "a cuBLASLt handle and its workspace")) {
        return tap_done();
    }
    test_forward();
    test_backward();
    test_act_dtypes();
    if (!tap_ok(fsdp_cuda_blas_create(dev, &tiny) == 0, "a second handle, for tiles")) {
        return tap_done();
    }
    test_tiled_forward();
    test_tiled_backward();
    fsdp_cuda_blas_destroy(tiny);
    test_unaligned();
    test_bias_alignment();
    test_cache();
    tap_ok(sim_lt_refused == 0 && sim_bad_calls == 0 && kernel_bad == 0 && sim_legacy_uses == 0,
           "nothing refused (cuBLASLt calls %d, copies %d, kernels %d), nothing on the legacy "
           "stream (%d)",
           sim_lt_refused, sim_bad_calls, kernel_bad, sim_legacy_uses);
    test_errors();
    test_tf32();
    fsdp_cuda_blas_destroy(blas);
    tap_ok(sim_lt_live() == 0 && dev->stats.bytes_now == 0,
           "every cuBLASLt object and device buffer went back (%d objects, %zu bytes)",
           sim_lt_live(), dev->stats.bytes_now);
    fsdp_cuda_device_destroy(dev);
    tap_ok(sim_live() == live, "the device went back whole");
    return tap_done();
}
