/*
 * dtype.c - conversions between f32 and the 16-bit float formats, and the
 * element-wise reductions the host backends use. Loops are written per type
 * (no per-element dispatch) so the compiler vectorises them.
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"

#include <math.h>
#include <string.h>
#include <strings.h>

static const char *const dtype_names[FSDP_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "i64", "u8"};
static const size_t dtype_sizes[FSDP_DTYPE_COUNT] = {4, 2, 2, 4, 8, 1};
static const char *const redop_names[FSDP_REDOP_COUNT] = {"sum", "avg", "max", "min"};

size_t fsdp_dtype_size(enum fsdp_dtype t)
{
    return (unsigned)t < FSDP_DTYPE_COUNT ? dtype_sizes[t] : 0;
}

const char *fsdp_dtype_name(enum fsdp_dtype t)
{
    return (unsigned)t < FSDP_DTYPE_COUNT ? dtype_names[t] : "?";
}

int fsdp_dtype_parse(const char *s, enum fsdp_dtype *out)
{
    static const struct { const char *alias; enum fsdp_dtype t; } aliases[] = {
        {"float32", FSDP_F32}, {"float", FSDP_F32}, {"float16", FSDP_F16}, {"half", FSDP_F16},
        {"bfloat16", FSDP_BF16}, {"int32", FSDP_I32}, {"int", FSDP_I32}, {"int64", FSDP_I64},
        {"uint8", FSDP_U8}, {"fp32", FSDP_F32}, {"fp16", FSDP_F16},
    };
    for (int i = 0; i < FSDP_DTYPE_COUNT; i++) {
        if (strcasecmp(s, dtype_names[i]) == 0) {
            *out = (enum fsdp_dtype)i;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++) {
        if (strcasecmp(s, aliases[i].alias) == 0) {
            *out = aliases[i].t;
            return 0;
        }
    }
    return fsdp_err(FSDP_ERR_INVALID, "unknown dtype '%s' (f32, f16, bf16, i32, i64, u8)", s);
}

int fsdp_dtype_is_float(enum fsdp_dtype t)
{
    return t == FSDP_F32 || t == FSDP_F16 || t == FSDP_BF16;
}

const char *fsdp_redop_name(enum fsdp_redop op)
{
    return (unsigned)op < FSDP_REDOP_COUNT ? redop_names[op] : "?";
}

int fsdp_redop_parse(const char *s, enum fsdp_redop *out)
{
    for (int i = 0; i < FSDP_REDOP_COUNT; i++) {
        if (strcasecmp(s, redop_names[i]) == 0) {
            *out = (enum fsdp_redop)i;
            return 0;
        }
    }
    return fsdp_err(FSDP_ERR_INVALID, "unknown reduce op '%s' (sum, avg, max, min)", s);
}

// ----------------------------------------------------------------------------
// 16-bit float conversions

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fsdp_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* Inf or NaN */
        if (absx > 0x7f800000u) {
            return (uint16_t)(sign | 0x7e00u | ((absx >> 13) & 0x3ffu));
        }
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx >= 0x477ff000u) { /* rounds to >= 65520: overflow to Inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (absx < 0x38800000u) { /* below 2^-14: subnormal half or zero */
        if (absx < 0x33000000u) { /* below half of the smallest subnormal: zero */
            return sign;
        }
        uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
        int exp = (int)(absx >> 23); /* 102..112 */
        int shift = 126 - exp;       /* 14..24: result = mant >> shift */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) {
            half++;
        }
        return (uint16_t)(sign | half);
    }
    /* normal: rebias exponent, round mantissa from 23 to 10 bits */
    uint32_t r = absx + 0xfffu + ((absx >> 13) & 1u);
    r -= (uint32_t)(127 - 15) << 23;
    return (uint16_t)(sign | (r >> 13));
}

float fsdp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) {
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    }
    if (exp == 0) {
        if (mant == 0) {
            return bits_f32(sign);
        }
        /* subnormal: value = mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t fsdp_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) { /* NaN: keep sign, force quiet */
        return (uint16_t)((x >> 16) | 0x40u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

float fsdp_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

int fsdp_convert(void *dst, enum fsdp_dtype dst_type, const void *src, enum fsdp_dtype src_type,
                 size_t n)
{
    if (!fsdp_dtype_is_float(dst_type) || !fsdp_dtype_is_float(src_type)) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "conversion %s -> %s not supported",
                        fsdp_dtype_name(src_type), fsdp_dtype_name(dst_type));
    }
    if (dst_type == src_type) {
        if (dst != src) {
            memmove(dst, src, n * fsdp_dtype_size(dst_type));
        }
        return 0;
    }
    if (src_type == FSDP_F32) {
        const float *s = src;
        uint16_t *d = dst;
        if (dst_type == FSDP_F16) {
            for (size_t i = 0; i < n; i++) d[i] = fsdp_f32_to_f16(s[i]);
        } else {
            for (size_t i = 0; i < n; i++) d[i] = fsdp_f32_to_bf16(s[i]);
        }
        return 0;
    }
    if (dst_type == FSDP_F32) {
        const uint16_t *s = src;
        float *d = dst;
        /* walk backwards so that an in-place widening (dst == src) is safe */
        if (src_type == FSDP_F16) {
            for (size_t i = n; i-- > 0;) d[i] = fsdp_f16_to_f32(s[i]);
        } else {
            for (size_t i = n; i-- > 0;) d[i] = fsdp_bf16_to_f32(s[i]);
        }
        return 0;
    }
    /* f16 <-> bf16 through f32 */
    const uint16_t *s = src;
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        d[i] = src_type == FSDP_F16 ? fsdp_f32_to_bf16(fsdp_f16_to_f32(s[i]))
                                    : fsdp_f32_to_f16(fsdp_bf16_to_f32(s[i]));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// reductions

#define REDUCE_LOOP(T, EXPR)                                                  \
    do {                                                                      \
        T *o_ = out;                                                          \
        const T *a_ = a, *b_ = b;                                             \
        for (size_t i = 0; i < n; i++) {                                      \
            T x = a_[i], y = b_[i];                                           \
            o_[i] = (EXPR);                                                   \
        }                                                                     \
    } while (0)

#define REDUCE_NATIVE(T)                                                      \
    do {                                                                      \
        switch (op) {                                                         \
        case FSDP_SUM:                                                        \
        case FSDP_AVG: REDUCE_LOOP(T, (T)(x + y)); break;                     \
        case FSDP_MAX: REDUCE_LOOP(T, x > y ? x : y); break;                  \
        case FSDP_MIN: REDUCE_LOOP(T, x < y ? x : y); break;                  \
        default: break;                                                       \
        }                                                                     \
    } while (0)

/* f32 max/min propagate NaN like torch (a NaN operand wins). */
static void reduce_f32(float *out, const float *a, const float *b, size_t n, enum fsdp_redop op)
{
    switch (op) {
    case FSDP_SUM:
    case FSDP_AVG:
        for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
        break;
    case FSDP_MAX:
        for (size_t i = 0; i < n; i++) out[i] = (a[i] > b[i] || a[i] != a[i]) ? a[i] : b[i];
        break;
    case FSDP_MIN:
        for (size_t i = 0; i < n; i++) out[i] = (a[i] < b[i] || a[i] != a[i]) ? a[i] : b[i];
        break;
    default:
        break;
    }
}

#define REDUCE_HALF(TO, FROM)                                                 \
    do {                                                                      \
        uint16_t *o_ = out;                                                   \
        const uint16_t *a_ = a, *b_ = b;                                      \
        for (size_t i = 0; i < n; i++) {                                      \
            float x = FROM(a_[i]), y = FROM(b_[i]), r;                        \
            switch (op) {                                                     \
            case FSDP_MAX: r = (x > y || x != x) ? x : y; break;              \
            case FSDP_MIN: r = (x < y || x != x) ? x : y; break;              \
            default: r = x + y; break;                                        \
            }                                                                 \
            o_[i] = TO(r);                                                    \
        }                                                                     \
    } while (0)

void fsdp_reduce3(void *out, const void *a, const void *b, size_t n, enum fsdp_dtype t,
                  enum fsdp_redop op)
{
    switch (t) {
    case FSDP_F32: reduce_f32(out, a, b, n, op); break;
    case FSDP_F16: REDUCE_HALF(fsdp_f32_to_f16, fsdp_f16_to_f32); break;
    case FSDP_BF16: REDUCE_HALF(fsdp_f32_to_bf16, fsdp_bf16_to_f32); break;
    case FSDP_I32: REDUCE_NATIVE(int32_t); break;
    case FSDP_I64: REDUCE_NATIVE(int64_t); break;
    case FSDP_U8: REDUCE_NATIVE(uint8_t); break;
    default: break;
    }
}

void fsdp_reduce(void *dst, const void *src, size_t n, enum fsdp_dtype t, enum fsdp_redop op)
{
    fsdp_reduce3(dst, dst, src, n, t, op);
}

void fsdp_scale_div(void *buf, size_t n, enum fsdp_dtype t, int divisor)
{
    if (divisor == 1) {
        return;
    }
    switch (t) {
    case FSDP_F32: {
        float *p = buf;
        float inv = 1.0f / (float)divisor;
        for (size_t i = 0; i < n; i++) p[i] *= inv;
        break;
    }
    case FSDP_F16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = fsdp_f32_to_f16(fsdp_f16_to_f32(p[i]) / (float)divisor);
        break;
    }
    case FSDP_BF16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = fsdp_f32_to_bf16(fsdp_bf16_to_f32(p[i]) / (float)divisor);
        break;
    }
    case FSDP_I32: {
        int32_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] /= divisor;
        break;
    }
    case FSDP_I64: {
        int64_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] /= divisor;
        break;
    }
    case FSDP_U8: {
        uint8_t *p = buf;
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(p[i] / divisor);
        break;
    }
    default:
        break;
    }
}
