/*
 * simd.h - private to src/compute/cpu: float vectors written with the
 * GCC/Clang vector extensions, the few transcendental functions the
 * kernels need (exp, sqrt) in a branch-free form, and the row operations
 * the kernels share (max, sum of exponentials, sum of two rows).
 *
 * Why vector extensions: the default build is -O2 without -march, where the
 * compiler does not auto-vectorise; these types compile to SSE2 on any
 * x86-64 and to AVX or AVX-512 when the library is built with -mavx2 or
 * -march=native, with no runtime dispatch and no intrinsics in the kernels
 * themselves. The width follows the target (4 lanes on SSE2, 8 with AVX,
 * 16 with AVX-512F) because GCC scalarises compares on vectors wider than
 * the hardware's. Every helper is
 * static inline; no symbol leaves this header.
 *
 * Accuracy contract of cpu_vexp: relative error below 2^-22 for inputs in
 * [-87, 88]; inputs are clamped to that range (exp(-87) ~ 1.6e-38 stands
 * in for underflow, exp(88) ~ 1.7e38 for overflow); NaN stays NaN.
 */
#ifndef FSDP_COMPUTE_CPU_SIMD_H
#define FSDP_COMPUTE_CPU_SIMD_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define CPU_VW 16 /* lanes per vector */
#elif defined(__AVX__)
#define CPU_VW 8
#else
#define CPU_VW 4
#endif

typedef float cpu_vf __attribute__((vector_size(CPU_VW * 4)));
typedef int32_t cpu_vi __attribute__((vector_size(CPU_VW * 4)));

/* OpenMP is optional: loops over independent rows carry this pragma. */
#ifdef _OPENMP
#define CPU_OMP_FOR _Pragma("omp parallel for schedule(static)")
#else
#define CPU_OMP_FOR
#endif

static inline cpu_vf cpu_vload(const float *p)
{
    cpu_vf v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline void cpu_vstore(float *p, cpu_vf v)
{
    memcpy(p, &v, sizeof(v));
}

static inline cpu_vf cpu_vset1(float x)
{
    cpu_vf z = {0};
    return z + x;
}

/* Loads n < CPU_VW elements; the other lanes hold fill. */
static inline cpu_vf cpu_vload_tail(const float *p, size_t n, float fill)
{
    float t[CPU_VW];
    for (size_t i = 0; i < CPU_VW; i++) {
        t[i] = i < n ? p[i] : fill;
    }
    return cpu_vload(t);
}

static inline void cpu_vstore_tail(float *p, size_t n, cpu_vf v)
{
    float t[CPU_VW];
    cpu_vstore(t, v);
    for (size_t i = 0; i < n; i++) {
        p[i] = t[i];
    }
}

/* lanes [0, n) all-ones, the others zero */
static inline cpu_vi cpu_vtail_mask(size_t n)
{
    cpu_vi lane;
    for (int i = 0; i < CPU_VW; i++) {
        lane[i] = i;
    }
    return lane < (int32_t)n;
}

/* mask lanes are all-ones or zero (the result of a vector comparison) */
static inline cpu_vf cpu_vselect(cpu_vi mask, cpu_vf a, cpu_vf b)
{
    return (cpu_vf)((mask & (cpu_vi)a) | (~mask & (cpu_vi)b));
}

/* max(a, b) that returns a when a is NaN */
static inline cpu_vf cpu_vmax(cpu_vf a, cpu_vf b)
{
    return cpu_vselect(b > a, b, a);
}

/* pairwise: lane i += lane i + w, halving w */
static inline float cpu_vhsum(cpu_vf v)
{
    float t[CPU_VW];
    cpu_vstore(t, v);
    for (int w = CPU_VW / 2; w > 0; w /= 2) {
        for (int i = 0; i < w; i++) {
            t[i] += t[i + w];
        }
    }
    return t[0];
}

static inline float cpu_vhmax(cpu_vf v)
{
    float m = v[0];
    for (int i = 1; i < CPU_VW; i++) {
        m = v[i] > m ? v[i] : m;
    }
    return m;
}

/* min(max(x, lo), hi) that keeps a NaN x (minps/maxps return their second operand on NaN) */
static inline cpu_vf cpu_vclamp(cpu_vf x, cpu_vf lo, cpu_vf hi)
{
#if defined(__AVX512F__)
    __m512 a, l, h;
    memcpy(&a, &x, sizeof(a));
    memcpy(&l, &lo, sizeof(l));
    memcpy(&h, &hi, sizeof(h));
    a = _mm512_min_ps(h, _mm512_max_ps(l, a));
    memcpy(&x, &a, sizeof(a));
    return x;
#elif defined(__AVX__)
    __m256 a, l, h;
    memcpy(&a, &x, sizeof(a));
    memcpy(&l, &lo, sizeof(l));
    memcpy(&h, &hi, sizeof(h));
    a = _mm256_min_ps(h, _mm256_max_ps(l, a));
    memcpy(&x, &a, sizeof(a));
    return x;
#elif defined(__SSE2__)
    __m128 a, l, h;
    memcpy(&a, &x, sizeof(a));
    memcpy(&l, &lo, sizeof(l));
    memcpy(&h, &hi, sizeof(h));
    a = _mm_min_ps(h, _mm_max_ps(l, a));
    memcpy(&x, &a, sizeof(a));
    return x;
#else
    x = cpu_vselect(x < lo, lo, x);
    return cpu_vselect(x > hi, hi, x);
#endif
}

/*
 * exp(x): x = n ln2 + r with |r| <= ln2/2, exp(r) by its degree-7 Taylor
 * polynomial (truncation error < 2^-24 relative on that interval) in
 * Estrin's form, whose dependency chain is half as deep as Horner's, then
 * 2^n put straight into the exponent bits. n is rounded to nearest by adding
 * and subtracting 1.5 * 2^23, which also leaves n's integer value in the low
 * mantissa bits.
 */
static inline cpu_vf cpu_vexp(cpu_vf x)
{
    const cpu_vf magic = cpu_vset1(12582912.0f);
    x = cpu_vclamp(x, cpu_vset1(-87.0f), cpu_vset1(88.0f));
    cpu_vf t = x * 1.44269504088896341f + magic;
    cpu_vf n = t - magic;
    cpu_vf r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187045e-06f;
    cpu_vf r2 = r * r;
    cpu_vf a0 = 1.0f + r, a1 = 0.5f + r * (1.0f / 6.0f);
    cpu_vf a2 = 1.0f / 24.0f + r * (1.0f / 120.0f), a3 = 1.0f / 720.0f + r * (1.0f / 5040.0f);
    cpu_vf p = (a0 + a1 * r2) + (a2 + a3 * r2) * (r2 * r2);
    cpu_vi e = ((cpu_vi)t - (cpu_vi)magic + 127) << 23;
    return p * (cpu_vf)e;
}

static inline cpu_vf cpu_vsqrt(cpu_vf x)
{
#if defined(__AVX512F__)
    __m512 a;
    memcpy(&a, &x, sizeof(a));
    a = _mm512_sqrt_ps(a);
    memcpy(&x, &a, sizeof(a));
#elif defined(__AVX__)
    __m256 a;
    memcpy(&a, &x, sizeof(a));
    a = _mm256_sqrt_ps(a);
    memcpy(&x, &a, sizeof(a));
#elif defined(__SSE2__)
    __m128 a;
    memcpy(&a, &x, sizeof(a));
    a = _mm_sqrt_ps(a);
    memcpy(&x, &a, sizeof(a));
#else
    for (int i = 0; i < CPU_VW; i++) {
        x[i] = __builtin_sqrtf(x[i]);
    }
#endif
    return x;
}

// ----------------------------------------------------------------------------
// row reductions the softmax kernels share (attention, cross-entropy): the
// same terms in the same order wherever a row is reduced

/* max of x[0..n) */
static inline float cpu_row_max(const float *x, size_t n)
{
    size_t i = 0;
    cpu_vf vm = cpu_vset1(-INFINITY);
    for (; i + CPU_VW <= n; i += CPU_VW) {
        vm = cpu_vmax(vm, cpu_vload(x + i));
    }
    float m = cpu_vhmax(vm);
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

/* sum of exp(x - m); writes the terms to e unless e is NULL (e may equal x) */
static inline float cpu_row_expsum(float *e, const float *x, float m, size_t n)
{
    size_t i = 0;
    cpu_vf vs = cpu_vset1(0.0f);
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf t = cpu_vexp(cpu_vload(x + i) - m);
        vs += t;
        if (e) {
            cpu_vstore(e + i, t);
        }
    }
    if (i < n) {
        cpu_vf t = cpu_vexp(cpu_vload_tail(x + i, n - i, 0.0f) - m);
        t = cpu_vselect(cpu_vtail_mask(n - i), t, cpu_vset1(0.0f));
        vs += t;
        if (e) {
            cpu_vstore_tail(e + i, n - i, t);
        }
    }
    return cpu_vhsum(vs);
}

// ----------------------------------------------------------------------------
// element-wise rows

/* out[0..n) = a + b; out may be a or b */
static inline void cpu_row_add(float *out, const float *a, const float *b, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vstore(out + i, cpu_vload(a + i) + cpu_vload(b + i));
    }
    for (; i < n; i++) {
        out[i] = a[i] + b[i];
    }
}

#endif
