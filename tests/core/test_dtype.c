/*
 * test_dtype.c - f32 <-> f16/bf16 conversions checked against every one of
 * the 65536 bit patterns, rounding of f32 values to nearest even, and the
 * reductions on every dtype.
 */
#include "config.h"
#include "core/dtype.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Reference f16 decode by arithmetic, independent of the bit tricks. */
static double f16_ref(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) {
        v = m ? NAN : INFINITY;
    } else if (e == 0) {
        v = ldexp((double)m, -24);
    } else {
        v = ldexp(1024.0 + m, e - 25);
    }
    return s ? -v : v;
}

/* Reference rounding to a grid by exhaustive neighbour comparison. */
static uint16_t f16_nearest_ref(float f)
{
    if (isnan(f)) {
        return 0x7e00;
    }
    /* candidates: every finite f16 with the right sign, choose nearest/even */
    double x = f;
    int neg = signbit(f) ? 1 : 0;
    double ax = fabs(x);
    if (ax >= 65520.0) {
        return (uint16_t)(neg << 15 | 0x7c00);
    }
    uint16_t best = 0;
    double bestd = INFINITY;
    /* binary search over the monotone positive codes 0..0x7bff */
    int lo = 0, hi = 0x7bff;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (f16_ref((uint16_t)mid) <= ax) lo = mid; else hi = mid;
    }
    for (int c = lo; c <= hi; c++) {
        double d = fabs(f16_ref((uint16_t)c) - ax);
        if (d < bestd || (d == bestd && (c & 1) == 0)) {
            bestd = d;
            best = (uint16_t)c;
        }
    }
    return (uint16_t)(neg << 15 | best);
}

static int test_f16_all(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fsdp_f16_to_f32((uint16_t)h);
        double ref = f16_ref((uint16_t)h);
        int ok = isnan(ref) ? isnan(f) : ((double)f == ref && !!signbit(f) == !!signbit(ref));
        /* and back: every f16 value round-trips exactly (NaN stays NaN) */
        uint16_t back = fsdp_f32_to_f16(f);
        if (isnan(ref)) {
            ok = ok && ((back & 0x7c00) == 0x7c00) && (back & 0x3ff) && ((back ^ h) & 0x8000) == 0;
        } else {
            ok = ok && back == h;
        }
        if (!ok && bad++ < 5) {
            tap_diag("f16 0x%04x: decoded %.9g want %.9g, re-encoded 0x%04x", h, f, ref, back);
        }
    }
    return tap_ok(bad == 0, "f16: all 65536 patterns decode exactly and round-trip (%d bad)", bad);
}

static int test_bf16_all(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fsdp_bf16_to_f32((uint16_t)h);
        uint32_t want = h << 16;
        uint16_t back = fsdp_f32_to_bf16(f);
        int isn = ((h & 0x7f80) == 0x7f80) && (h & 0x7f);
        int ok = bits(f) == want;
        ok = ok && (isn ? ((back & 0x7f80) == 0x7f80 && (back & 0x7f) && ((back ^ h) & 0x8000) == 0)
                        : back == h);
        if (!ok && bad++ < 5) {
            tap_diag("bf16 0x%04x: decoded bits 0x%08x want 0x%08x, re-encoded 0x%04x", h, bits(f),
                     want, back);
        }
    }
    return tap_ok(bad == 0, "bf16: all 65536 patterns decode exactly and round-trip (%d bad)", bad);
}

/* Midpoints and near-midpoints between every pair of adjacent codes. */
static int test_rounding(void)
{
    int bad16 = 0, badb = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double a = f16_ref((uint16_t)h), b = f16_ref((uint16_t)(h + 1));
        double mid = (a + b) / 2;
        float probes[3] = {(float)mid, nextafterf((float)mid, -INFINITY), nextafterf((float)mid, INFINITY)};
        for (int k = 0; k < 3; k++) {
            for (int sgn = 0; sgn < 2; sgn++) {
                float p = sgn ? -probes[k] : probes[k];
                uint16_t got = fsdp_f32_to_f16(p), want = f16_nearest_ref(p);
                if (got != want && bad16++ < 5) {
                    tap_diag("f16 round %.10g: got 0x%04x want 0x%04x", p, got, want);
                }
            }
        }
    }
    for (uint32_t h = 0; h < 0x7f80; h++) {
        /* the f32 exactly between h and h+1 has low half 0x8000: ties to even */
        uint32_t mid = (h << 16) | 0x8000u;
        uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        uint16_t got = fsdp_f32_to_bf16(from_bits(mid));
        uint16_t up = fsdp_f32_to_bf16(from_bits(mid + 1));
        uint16_t down = fsdp_f32_to_bf16(from_bits(mid - 1));
        if ((got != want || up != h + 1 || down != h) && badb++ < 5) {
            tap_diag("bf16 round near 0x%04x: mid->0x%04x (want 0x%04x) up->0x%04x down->0x%04x", h,
                     got, want, up, down);
        }
    }
    tap_ok(bad16 == 0, "f32->f16 rounds to nearest even at every midpoint (%d bad)", bad16);
    return tap_ok(badb == 0, "f32->bf16 rounds to nearest even at every midpoint (%d bad)", badb);
}

static int test_specials(void)
{
    int ok = 1;
    ok &= fsdp_f32_to_f16(65504.0f) == 0x7bff;
    ok &= fsdp_f32_to_f16(65519.99f) == 0x7bff;
    ok &= fsdp_f32_to_f16(65520.0f) == 0x7c00;
    ok &= fsdp_f32_to_f16(-INFINITY) == 0xfc00;
    ok &= fsdp_f32_to_f16(0x1p-24f) == 0x0001;
    ok &= fsdp_f32_to_f16(0x1p-25f) == 0x0000;          /* tie to even: zero */
    ok &= fsdp_f32_to_f16(0x1.8p-25f) == 0x0001;
    ok &= fsdp_f32_to_f16(-0.0f) == 0x8000;
    ok &= fsdp_f32_to_f16(1e-30f) == 0x0000;
    ok &= isnan(fsdp_f16_to_f32(fsdp_f32_to_f16(NAN)));
    ok &= fsdp_f32_to_bf16(INFINITY) == 0x7f80;
    ok &= fsdp_f32_to_bf16(3.4028235e38f) == 0x7f80;   /* rounds up to Inf */
    ok &= isnan(fsdp_bf16_to_f32(fsdp_f32_to_bf16(from_bits(0x7f800001u)))); /* sNaN stays NaN */
    ok &= fsdp_f32_to_bf16(from_bits(0x00000001u)) == 0x0000; /* f32 subnormal rounds */
    ok &= fsdp_f32_to_bf16(from_bits(0x00018000u)) == 0x0002; /* subnormal tie -> even */
    return tap_ok(ok, "special values: max, overflow, subnormals, signed zero, NaN, Inf");
}

static int test_reduce(void)
{
    int ok = 1;
    float a[5] = {1, -2, 3.5f, NAN, 0}, b[5] = {2, -3, 1, 1, -0.0f}, o[5];
    fsdp_reduce3(o, a, b, 5, FSDP_F32, FSDP_SUM);
    ok &= o[0] == 3 && o[1] == -5 && o[2] == 4.5f && isnan(o[3]);
    fsdp_reduce3(o, a, b, 5, FSDP_F32, FSDP_MAX);
    ok &= o[0] == 2 && o[1] == -2 && o[2] == 3.5f && isnan(o[3]);
    fsdp_reduce3(o, a, b, 5, FSDP_F32, FSDP_MIN);
    ok &= o[0] == 1 && o[1] == -3 && o[2] == 1 && isnan(o[3]);
    int32_t ia[3] = {7, -7, 100}, ib[3] = {1, 2, -300};
    fsdp_reduce(ia, ib, 3, FSDP_I32, FSDP_SUM);
    fsdp_scale_div(ia, 3, FSDP_I32, 2);
    ok &= ia[0] == 4 && ia[1] == -2 && ia[2] == -100;
    int64_t la[2] = {1ll << 40, -5}, lb[2] = {3, 9};
    fsdp_reduce(la, lb, 2, FSDP_I64, FSDP_MAX);
    ok &= la[0] == (1ll << 40) && la[1] == 9;
    uint8_t ua[2] = {200, 3}, ub[2] = {100, 4};
    fsdp_reduce(ua, ub, 2, FSDP_U8, FSDP_MIN);
    ok &= ua[0] == 100 && ua[1] == 3;
    /* bf16 sum adds in f32: 256 + 1 + 1 in two steps stays 256 (rounding each
     * step), but one f32 add of two values rounds once */
    uint16_t h1[1] = {fsdp_f32_to_bf16(256.0f)}, h2[1] = {fsdp_f32_to_bf16(1.5f)};
    fsdp_reduce(h1, h2, 1, FSDP_BF16, FSDP_SUM);
    ok &= fsdp_bf16_to_f32(h1[0]) == 258.0f; /* 257.5 -> nearest bf16 (step 2) is 258 */
    uint16_t f1[1] = {fsdp_f32_to_f16(1000.0f)}, f2[1] = {fsdp_f32_to_f16(0.25f)};
    fsdp_reduce(f1, f2, 1, FSDP_F16, FSDP_SUM);
    ok &= fsdp_f16_to_f32(f1[0]) == 1000.0f; /* 1000.25 rounds to 1000 (step 0.5) */
    float cf[4] = {1, 2, 3, 4};
    uint16_t ch[4];
    float back[4];
    fsdp_convert(ch, FSDP_BF16, cf, FSDP_F32, 4);
    fsdp_convert(back, FSDP_F32, ch, FSDP_BF16, 4);
    ok &= memcmp(cf, back, sizeof(cf)) == 0;
    return tap_ok(ok, "reductions: sum/max/min with NaN, integer avg truncation, 16-bit adds in f32");
}

static int test_names(void)
{
    enum fsdp_dtype t;
    enum fsdp_redop op;
    int ok = fsdp_dtype_parse("bf16", &t) == 0 && t == FSDP_BF16;
    ok &= fsdp_dtype_parse("float16", &t) == 0 && t == FSDP_F16;
    ok &= fsdp_dtype_parse("f33", &t) < 0;
    ok &= fsdp_redop_parse("avg", &op) == 0 && op == FSDP_AVG;
    ok &= fsdp_redop_parse("prod", &op) < 0;
    ok &= fsdp_dtype_size(FSDP_I64) == 8 && fsdp_dtype_size(FSDP_BF16) == 2;
    return tap_ok(ok, "dtype and op names parse, unknown names are errors");
}

int main(void)
{
    test_f16_all();
    test_bf16_all();
    test_rounding();
    test_specials();
    test_reduce();
    test_names();
    return tap_done();
}
