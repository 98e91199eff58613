/*
 * bench_data.c - the values fsdpc-bench checks collectives with.
 *
 * Rank r holds, at global element index i of a checked iteration with seed s,
 *     v(s, r, i) = f(s, i) + g(s, r)        f, g in [-4, 3]  (u8: [0, 7])
 * f is a hash of the index, so a block that lands at the wrong offset is
 * caught whatever the count; g differs between ranks (for up to 8 ranks in a
 * row), so a rank's data counted twice or missing is caught. Every value and
 * every sum over ranks is a small integer: exact in f32, f16 and bf16 up to 32
 * ranks, so sums and max/min compare exactly, and AVG within one rounding.
 * The reduction of v over ranks is n*f + sum(g), f + max(g) or f + min(g):
 * O(1) per element once the g terms are summed, for any number of ranks.
 *
 * Owns no state; never allocates.
 */
#include "config.h"
#include "programs/bench/bench.h"

#include <math.h>

// ----------------------------------------------------------------------------
// the generator

static int bench_data_offset(enum fsdp_dtype t)
{
    return t == FSDP_U8 ? 4 : 0; /* keep unsigned values non-negative */
}

static int64_t bench_data_f(uint32_t seed, size_t index, int off)
{
    uint64_t x = ((uint64_t)index + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)seed * 0xD1B54A32D192ED03ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (int64_t)(x >> 61) - 4 + off;
}

static int64_t bench_data_g(uint32_t seed, int rank, int off)
{
    return (int64_t)((seed + 3u * (uint32_t)rank) & 7u) - 4 + off;
}

/* Half an ulp of the type at 1.0, doubled for the one rounding of AVG. */
static double bench_data_tolerance(enum fsdp_dtype t)
{
    switch (t) {
    case FSDP_F32: return 1e-6;
    case FSDP_F16: return 1e-3;
    case FSDP_BF16: return 8e-3;
    default: return 0.0;
    }
}

/* Exact for integer types (expected already wrapped/truncated as the type
 * does); within a relative tolerance for float types. NaN is always wrong. */
static int bench_data_wrong(const void *buf, enum fsdp_dtype t, size_t k, double expected)
{
    if (t == FSDP_I64) {
        return ((const int64_t *)buf)[k] != (int64_t)expected;
    }
    double a = fsdp_dtype_get(buf, t, k);
    double tol = bench_data_tolerance(t) * (1.0 + fabs(expected));
    return !(fabs(a - expected) <= tol);
}

// ----------------------------------------------------------------------------
// fill and check

void fsdp_bench_fill_rank(void *buf, enum fsdp_dtype t, size_t n, size_t index0, int rank,
                          uint32_t seed)
{
    int off = bench_data_offset(t);
    int64_t g = bench_data_g(seed, rank, off);
    if (t == FSDP_F32) { /* the common case, without the per-element switch */
        float *p = buf;
        for (size_t k = 0; k < n; k++) {
            p[k] = (float)(bench_data_f(seed, index0 + k, off) + g);
        }
        return;
    }
    for (size_t k = 0; k < n; k++) {
        fsdp_dtype_set(buf, t, k, (double)(bench_data_f(seed, index0 + k, off) + g));
    }
}

void fsdp_bench_poison(void *buf, enum fsdp_dtype t, size_t n)
{
    /* outside every reachable value: |v| <= 8 per rank, sums <= 8 * ranks */
    for (size_t k = 0; k < n; k++) {
        switch (t) {
        case FSDP_F32: ((float *)buf)[k] = -1000.5f; break;
        case FSDP_F16: ((uint16_t *)buf)[k] = fsdp_f32_to_f16(-1000.5f); break;
        case FSDP_BF16: ((uint16_t *)buf)[k] = fsdp_f32_to_bf16(-1000.5f); break;
        case FSDP_I32: ((int32_t *)buf)[k] = -1000000; break;
        case FSDP_I64: ((int64_t *)buf)[k] = -1000000; break;
        case FSDP_U8: ((uint8_t *)buf)[k] = 255; break;
        default: break;
        }
    }
}

size_t fsdp_bench_check_rank(const void *buf, enum fsdp_dtype t, size_t n, size_t index0,
                             int rank, uint32_t seed)
{
    int off = bench_data_offset(t);
    int64_t g = bench_data_g(seed, rank, off);
    size_t wrong = 0;
    for (size_t k = 0; k < n; k++) {
        int64_t e = bench_data_f(seed, index0 + k, off) + g;
        wrong += (size_t)bench_data_wrong(buf, t, k, (double)e);
    }
    return wrong;
}

/* Wraps an exact integer result the way the element type stores it. */
static double bench_data_as_type(enum fsdp_dtype t, int64_t v)
{
    switch (t) {
    case FSDP_I32: return (double)(int32_t)v;
    case FSDP_U8: return (double)(uint8_t)v;
    default: return (double)v;
    }
}

size_t fsdp_bench_check_reduced(const void *buf, enum fsdp_dtype t, size_t n, size_t index0,
                                int nranks, enum fsdp_redop op, uint32_t seed)
{
    int off = bench_data_offset(t);
    int64_t gsum = 0, gmax = INT64_MIN, gmin = INT64_MAX;
    for (int r = 0; r < nranks; r++) {
        int64_t g = bench_data_g(seed, r, off);
        gsum += g;
        gmax = g > gmax ? g : gmax;
        gmin = g < gmin ? g : gmin;
    }
    int is_float = fsdp_dtype_is_float(t);
    size_t wrong = 0;
    for (size_t k = 0; k < n; k++) {
        int64_t f = bench_data_f(seed, index0 + k, off);
        double e;
        switch (op) {
        case FSDP_SUM: e = bench_data_as_type(t, (int64_t)nranks * f + gsum); break;
        case FSDP_AVG: {
            int64_t s = (int64_t)nranks * f + gsum;
            /* integer AVG truncates toward zero, as C division does */
            e = is_float ? (double)s / nranks : bench_data_as_type(t, s / nranks);
            break;
        }
        case FSDP_MAX: e = (double)(f + gmax); break;
        case FSDP_MIN: e = (double)(f + gmin); break;
        default: e = NAN; break;
        }
        wrong += (size_t)bench_data_wrong(buf, t, k, e);
    }
    return wrong;
}
