/*
 * test_adamw.c - the CPU AdamW update (src/compute/cpu/adamw.c) equals a
 * plain one-element-at-a-time reference bit for bit, and the optimizer's
 * threaded ranges equal its one-thread ranges.
 *
 * The reference is torch's single-tensor order of operations written out
 * per element, compiled like the kernel without contraction and with fmaf
 * exactly where the kernel fuses (targets with FMA), so any difference is
 * the kernel's: a tail left out or computed otherwise, a
 * vector that reads past its range or from the wrong offset, a thread piece
 * missing or overlapping, a constant rounded otherwise. Sizes 0, 1, 7, 33
 * and 1000003 (vector body, tails of every length class), and 1900003 over
 * 2 to 7 threads; the four buffers each start at their own odd offset from a
 * 64-byte boundary; with and without weight decay; gradient scales 1 and a
 * clip coefficient; steps 1 to 3 (the bias corrections); special gradients
 * (zero, huge enough to overflow g^2, subnormal, infinite, NaN: the kernel
 * does not skip on them, the caller does, so they must come out as the
 * reference says). Closeness to torch itself is test_torch_oracle's and
 * test_kernels_grad's.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "config.h"
#include "compute/kernels.h"
#include "core/spec.h"
#include "optim/optim.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float urand(float lo, float hi)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return lo + (hi - lo) * (float)((double)(rng >> 40) / (double)(1ull << 24));
}

static float *xalloc(size_t floats)
{
    float *p = aligned_alloc(64, (floats + 15) / 16 * 64);
    if (!p) {
        tap_ok(0, "no memory for %zu floats", floats);
        exit(tap_done());
    }
    return p;
}

/* a * b + c rounded once where the kernel fuses (the target has FMA), else twice */
static float fused(float a, float b, float c)
{
#if defined(__AVX512F__) || (defined(__AVX__) && defined(__FMA__))
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

/* one element, torch's operations in order, each rounded to f32 but for
 * the three multiply-adds the kernel fuses where it can */
static void ref_adamw(float *p, float g, float *m, float *v, const struct fsdp_adamw_params *hp,
                      int decay, float grad_scale)
{
    double bc1 = 1.0 - pow((double)hp->beta1, (double)hp->step);
    double bc2 = 1.0 - pow((double)hp->beta2, (double)hp->step);
    float step_size = (float)((double)hp->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    float wd_mul = decay ? (float)(1.0 - (double)hp->lr * (double)hp->weight_decay) : 1.0f;
    g = g * grad_scale;
    float mm = fused(1.0f - hp->beta1, g - *m, *m);
    float vv = fused(*v, hp->beta2, (1.0f - hp->beta2) * (g * g));
    float d = sqrtf(vv) / bc2_sqrt + hp->eps;
    *p = fused(*p, wd_mul, (-step_size * mm) / d);
    *m = mm;
    *v = vv;
}

/* the same bits, or NaN on both sides (payloads may differ) */
static int same(float a, float b)
{
    return memcmp(&a, &b, sizeof(a)) == 0 || (isnan(a) && isnan(b));
}

/* the four buffers of one case, each at its own offset, with guard values
 * on either side of the range that must survive the update */
struct bufs {
    float *base[4], *x[4]; /* p, g, m, v */
    size_t n;
};

#define GUARD 24
static const size_t offsets[4] = {1, 3, 5, 7}; /* floats past a 64-byte boundary */

static void bufs_make(struct bufs *b, size_t n, int specials)
{
    b->n = n;
    size_t total = (n + 2 * GUARD + 8 + 15) / 16 * 16; /* offsets[k] < 8 */
    for (int k = 0; k < 4; k++) {
        b->base[k] = xalloc(total);
        for (size_t i = 0; i < total; i++) {
            b->base[k][i] = -777.0f;
        }
        b->x[k] = b->base[k] + GUARD + offsets[k];
    }
    for (size_t i = 0; i < n; i++) {
        b->x[0][i] = urand(-1.0f, 1.0f);
        b->x[1][i] = urand(-1.0f, 1.0f) * (i % 5 == 0 ? 1e-4f : 1.0f);
        b->x[2][i] = urand(-0.1f, 0.1f);
        b->x[3][i] = urand(0.0f, 0.01f);
    }
    static const float special[] = {0.0f, -0.0f, 3e30f, 1e-40f, INFINITY, NAN};
    for (size_t i = 0; specials && i < sizeof(special) / sizeof(special[0]) && i < n; i++) {
        b->x[1][(i * 7919) % n] = special[i];
    }
}

static void bufs_free(struct bufs *b)
{
    for (int k = 0; k < 4; k++) {
        free(b->base[k]);
    }
}

/* first difference between the kernel's buffers and the reference's, or
 * guard damage; prints it and returns 0 */
static int bufs_agree(const char *what, const struct bufs *got, const struct bufs *want)
{
    static const char *names[4] = {"param", "grad", "exp_avg", "exp_avg_sq"};
    size_t n = got->n;
    for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < n; i++) {
            if (!same(got->x[k][i], want->x[k][i])) {
                tap_diag("%s: %s[%zu] = %.9g, reference %.9g (bits differ)", what, names[k], i,
                         (double)got->x[k][i], (double)want->x[k][i]);
                return 0;
            }
        }
        for (size_t i = 1; i <= GUARD; i++) {
            if (got->x[k][-(ptrdiff_t)i] != -777.0f || got->x[k][n + i - 1] != -777.0f) {
                tap_diag("%s: %s written outside its range (element -%zu or %zu)", what, names[k],
                         i, n + i - 1);
                return 0;
            }
        }
    }
    return 1;
}

static void test_case(size_t n, int decay, float grad_scale, int threads, int specials)
{
    struct bufs got, want;
    uint64_t seed = rng;
    bufs_make(&got, n, specials);
    rng = seed;
    bufs_make(&want, n, specials);
    struct fsdp_adamw_params hp = {.lr = 3e-3f,
                                   .beta1 = 0.9f,
                                   .beta2 = 0.95f,
                                   .eps = 1e-8f,
                                   .weight_decay = 0.1f,
                                   .threads = threads};
    for (hp.step = 1; hp.step <= 3; hp.step++) {
        fsdp_cpu_adamw_update(got.x[0], got.x[1], got.x[2], got.x[3], n, &hp, decay, grad_scale);
        for (size_t i = 0; i < n; i++) {
            ref_adamw(&want.x[0][i], want.x[1][i], &want.x[2][i], &want.x[3][i], &hp, decay,
                      grad_scale);
        }
    }
    char what[128];
    snprintf(what, sizeof(what), "adamw n=%zu decay=%d grad_scale=%g threads=%d%s", n, decay,
             (double)grad_scale, threads, specials ? " special gradients" : "");
    tap_ok(bufs_agree(what, &got, &want), "%s: 3 steps equal the reference bit for bit", what);
    bufs_free(&got), bufs_free(&want);
}

// ----------------------------------------------------------------------------
// the optimizer's ranges: threads change nothing

static void test_optimizer_threads(void)
{
    /* two parameters in one unit, one decayed, one not; the range cuts into both */
    struct fsdp_model_spec *s = NULL;
    int rc = fsdp_model_spec_alloc(NULL, 1, 2, &s);
    rc = rc ? rc : fsdp_model_spec_add(s, 0, "w", 700, 1000, 2, FSDP_INIT_NORMAL, 0.02f, 1, 0);
    rc = rc ? rc : fsdp_model_spec_add(s, 0, "b", 1001, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0, 0);
    if (!tap_ok(rc == 0, "a spec of two parameters in one unit")) {
        fsdp_model_spec_destroy(s);
        return;
    }
    size_t total = 700 * 1000 + 1001, start = 3, count = total - 3 - 5;
    float *buf[2][4];
    for (int r = 0; r < 2; r++) {
        rng = 7;
        for (int k = 0; k < 4; k++) {
            buf[r][k] = xalloc(total);
            for (size_t i = 0; i < total; i++) {
                buf[r][k][i] = k == 3 ? urand(0.0f, 0.01f) : urand(-1.0f, 1.0f);
            }
        }
    }
    struct fsdp_optim_config oc = {
        .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    for (int r = 0; r < 2; r++) {
        struct fsdp_optimizer o;
        oc.threads = r ? 3 : 0;
        fsdp_adamw_init(&o, &oc, s, NULL);
        for (int step = 0; step < 2; step++) {
            fsdp_optimizer_begin(&o, 1e-3);
            float *st[2] = {buf[r][2] + start, buf[r][3] + start};
            tap_ok(fsdp_optimizer_update(&o, 0, start, count, buf[r][0] + start, buf[r][1] + start,
                                         st, 0.5f) == 0,
                   "optimizer update, threads %d, step %d", oc.threads, step + 1);
        }
    }
    size_t bad = 0, first = 0;
    for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < total; i++) {
            if (!same(buf[0][k][i], buf[1][k][i]) && !bad++) {
                first = i;
            }
        }
    }
    if (bad) {
        tap_diag("first difference at element %zu of %zu", first, total);
    }
    tap_ok(bad == 0, "optimizer over a unit range: 3 threads equal 1 (%zu elements differ)", bad);
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 4; k++) {
            free(buf[r][k]);
        }
    }
    fsdp_model_spec_destroy(s);
}

int main(void)
{
    static const size_t sizes[] = {0, 1, 7, 33, 1000003};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        for (int decay = 0; decay <= 1; decay++) {
            test_case(sizes[s], decay, 1.0f, 1, 0);
            test_case(sizes[s], decay, 0.37f, 1, 0);
        }
    }
    test_case(33, 1, 0.5f, 1, 1);
    test_case(1000003, 1, 0.5f, 1, 1);
    /* 2 to 7 pieces of at least 2^18 elements (adamw.c's least per thread) */
    for (int threads = 2; threads <= 7; threads++) {
        test_case(1900003, threads & 1, 0.37f, threads, threads == 7);
    }
    test_case(1000003, 1, 1.0f, FSDP_ADAMW_MAX_THREADS + 5, 0);
    test_optimizer_threads();
    return tap_done();
}
