/*
 * cast.c - f32 <-> bf16/f16 conversion of whole buffers, for 16-bit
 * parameter and gradient storage around f32 compute. The results are
 * bit-identical to core/dtype.c's scalar conversions (the tests compare all
 * 65536 16-bit patterns and a sweep of f32 values); the difference is that
 * every case is computed and then selected with masks, so the loops have no
 * branches and run 8 lanes at a time.
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"

#include "core/dtype.h"

typedef uint32_t cpu_vu __attribute__((vector_size(CPU_VW * 4)));
typedef uint16_t cpu_vh __attribute__((vector_size(CPU_VW * 2)));

static inline cpu_vu cpu_vu_select(cpu_vi mask, cpu_vu a, cpu_vu b)
{
    return ((cpu_vu)mask & a) | (~(cpu_vu)mask & b);
}

static inline cpu_vu cpu_vu_load(const float *p)
{
    cpu_vu v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static inline cpu_vu cpu_vu_load16(const uint16_t *p)
{
    cpu_vh h;
    memcpy(&h, p, sizeof(h));
    return __builtin_convertvector(h, cpu_vu);
}

static inline void cpu_vh_store(uint16_t *p, cpu_vu v)
{
    cpu_vh h = __builtin_convertvector(v, cpu_vh);
    memcpy(p, &h, sizeof(h));
}

static inline cpu_vu cpu_to_bf16(cpu_vu x)
{
    cpu_vi nan = (cpu_vi)(x & 0x7fffffffu) > 0x7f800000;
    cpu_vu rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return cpu_vu_select(nan, (x >> 16) | 0x40u, rounded);
}

static inline cpu_vu cpu_to_f16(cpu_vu x)
{
    cpu_vu sign = (x >> 16) & 0x8000u;
    cpu_vu a = x & 0x7fffffffu;
    cpu_vi ai = (cpu_vi)a; /* a < 2^31: signed compares are exact */
    cpu_vu normal = (a + 0xfffu + ((a >> 13) & 1u) - (112u << 23)) >> 13;
    /* below 2^-14: adding 0.5f rounds a * 2^24 to nearest even in the low bits */
    cpu_vu sub = (cpu_vu)((cpu_vf)a + 0.5f) - 0x3f000000u;
    cpu_vu r = cpu_vu_select(ai < 0x38800000, sub, normal);
    r = cpu_vu_select(ai >= 0x477ff000, (cpu_vu){0} + 0x7c00u, r);
    r = cpu_vu_select(ai > 0x7f800000, 0x7e00u | ((a >> 13) & 0x3ffu), r);
    return r | sign;
}

static inline cpu_vu cpu_from_f16(cpu_vu h)
{
    cpu_vu o = (h & 0x7fffu) << 13;
    cpu_vu e = o & (0x7c00u << 13);
    o += 112u << 23;
    cpu_vi infnan = (cpu_vi)(e == (0x7c00u << 13));
    cpu_vi sub = (cpu_vi)(e == 0u);
    o = cpu_vu_select(infnan, o + (112u << 23), o);
    /* subnormal or zero: renormalise through one exact f32 subtraction */
    cpu_vu s = (cpu_vu)((cpu_vf)(o + (1u << 23)) - (cpu_vf)((cpu_vu){0} + (113u << 23)));
    o = cpu_vu_select(sub, s, o);
    return o | ((h & 0x8000u) << 16);
}

void fsdp_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vh_store(dst + i, cpu_to_bf16(cpu_vu_load(src + i)));
    }
    for (; i < n; i++) {
        dst[i] = fsdp_f32_to_bf16(src[i]);
    }
}

void fsdp_cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vu v = cpu_vu_load16(src + i) << 16;
        memcpy(dst + i, &v, sizeof(v));
    }
    for (; i < n; i++) {
        dst[i] = fsdp_bf16_to_f32(src[i]);
    }
}

void fsdp_cpu_f32_to_f16(uint16_t *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vh_store(dst + i, cpu_to_f16(cpu_vu_load(src + i)));
    }
    for (; i < n; i++) {
        dst[i] = fsdp_f32_to_f16(src[i]);
    }
}

void fsdp_cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vu v = cpu_from_f16(cpu_vu_load16(src + i));
        memcpy(dst + i, &v, sizeof(v));
    }
    for (; i < n; i++) {
        dst[i] = fsdp_f16_to_f32(src[i]);
    }
}

/*
 * In place, the buffer is cut into pieces whose source and destination
 * bytes do not overlap, so each piece is an ordinary cast. Narrowing runs
 * front to back: with i values done, values [i, i + k), k <= i, read bytes
 * [4i, 4i + 4k) and write [2i, 2i + 2k). Widening runs back to front: with
 * n values left, values [ceil(n/2), n) read bytes [2 ceil(n/2), 2n) and
 * write [4 ceil(n/2), 4n), above every byte still to be read. The first
 * (narrowing) or last (widening) few values go through a stack buffer.
 */
#define CPU_INPLACE_HEAD 64

void fsdp_cpu_narrow_inplace(void *buf, size_t n, int bf16)
{
    float *src = buf;
    uint16_t *dst = buf, head[CPU_INPLACE_HEAD];
    size_t i = n < CPU_INPLACE_HEAD ? n : CPU_INPLACE_HEAD;
    if (bf16) {
        fsdp_cpu_f32_to_bf16(head, src, i);
    } else {
        fsdp_cpu_f32_to_f16(head, src, i);
    }
    memcpy(dst, head, i * sizeof(uint16_t));
    while (i < n) {
        size_t k = n - i < i ? n - i : i;
        if (bf16) {
            fsdp_cpu_f32_to_bf16(dst + i, src + i, k);
        } else {
            fsdp_cpu_f32_to_f16(dst + i, src + i, k);
        }
        i += k;
    }
}

void fsdp_cpu_widen_inplace(void *buf, size_t n, int bf16)
{
    const uint16_t *src = buf;
    float *dst = buf, head[CPU_INPLACE_HEAD];
    while (n > CPU_INPLACE_HEAD) {
        size_t lo = (n + 1) / 2; /* 4 lo >= 2 n: [lo, n) is disjoint from its source */
        if (bf16) {
            fsdp_cpu_bf16_to_f32(dst + lo, src + lo, n - lo);
        } else {
            fsdp_cpu_f16_to_f32(dst + lo, src + lo, n - lo);
        }
        n = lo;
    }
    /* the last (at most CPU_INPLACE_HEAD) values one at a time: the vector
     * loop here would make GCC's -Wstringop-overflow misjudge head's bounds */
    for (size_t i = 0; i < n; i++) {
        head[i] = bf16 ? fsdp_bf16_to_f32(src[i]) : fsdp_f16_to_f32(src[i]);
    }
    memcpy(dst, head, n * sizeof(float));
}
