/*
 * dtype.h - element types, reduce ops, conversions and reductions.
 *
 * f16 is IEEE binary16, bf16 is the top half of binary32. Conversions from
 * f32 round to nearest even, keep NaN a NaN (quiet, sign kept), overflow to
 * Inf, and produce subnormals where the format has them.
 */
#ifndef FSDP_CORE_DTYPE_H
#define FSDP_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum fsdp_dtype {
    FSDP_F32 = 0,
    FSDP_F16,
    FSDP_BF16,
    FSDP_I32,
    FSDP_I64,
    FSDP_U8,
    FSDP_DTYPE_COUNT,
};

enum fsdp_redop {
    FSDP_SUM = 0,
    FSDP_AVG,
    FSDP_MAX,
    FSDP_MIN,
    FSDP_REDOP_COUNT,
};

size_t fsdp_dtype_size(enum fsdp_dtype t);
const char *fsdp_dtype_name(enum fsdp_dtype t);          /* "f32", "bf16", ... */
int fsdp_dtype_parse(const char *s, enum fsdp_dtype *out); /* 0 or FSDP_ERR_INVALID */
int fsdp_dtype_is_float(enum fsdp_dtype t);
const char *fsdp_redop_name(enum fsdp_redop op);          /* "sum", "avg", ... */
int fsdp_redop_parse(const char *s, enum fsdp_redop *out);

uint16_t fsdp_f32_to_f16(float f);
float fsdp_f16_to_f32(uint16_t h);
uint16_t fsdp_f32_to_bf16(float f);
float fsdp_bf16_to_f32(uint16_t h);

/* Element i of buf (of type t) as a double, and back (rounded to t; integer
 * types truncate). For tests, tools and reference code, not hot loops; an
 * unknown type reads as NaN and writes nothing. */
static inline double fsdp_dtype_get(const void *buf, enum fsdp_dtype t, size_t i)
{
    switch (t) {
    case FSDP_F32: return ((const float *)buf)[i];
    case FSDP_F16: return fsdp_f16_to_f32(((const uint16_t *)buf)[i]);
    case FSDP_BF16: return fsdp_bf16_to_f32(((const uint16_t *)buf)[i]);
    case FSDP_I32: return ((const int32_t *)buf)[i];
    case FSDP_I64: return (double)((const int64_t *)buf)[i];
    case FSDP_U8: return ((const uint8_t *)buf)[i];
    default: return __builtin_nan("");
    }
}

static inline void fsdp_dtype_set(void *buf, enum fsdp_dtype t, size_t i, double v)
{
    switch (t) {
    case FSDP_F32: ((float *)buf)[i] = (float)v; break;
    case FSDP_F16: ((uint16_t *)buf)[i] = fsdp_f32_to_f16((float)v); break;
    case FSDP_BF16: ((uint16_t *)buf)[i] = fsdp_f32_to_bf16((float)v); break;
    case FSDP_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case FSDP_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case FSDP_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

/* Converts n elements between float types (f32, f16, bf16); 0 or error. */
int fsdp_convert(void *dst, enum fsdp_dtype dst_type, const void *src, enum fsdp_dtype src_type,
                 size_t n);

/*
 * dst[i] = op(dst[i], src[i]) for n elements. AVG accumulates like SUM (the
 * caller divides once at the end with fsdp_scale_div). f16/bf16 operate in
 * f32 and round once per call.
 */
void fsdp_reduce(void *dst, const void *src, size_t n, enum fsdp_dtype t, enum fsdp_redop op);

/* out[i] = op(a[i], b[i]); out may alias a or b. */
void fsdp_reduce3(void *out, const void *a, const void *b, size_t n, enum fsdp_dtype t,
                  enum fsdp_redop op);

/* buf[i] /= divisor (integer types truncate toward zero, like NCCL's avg). */
void fsdp_scale_div(void *buf, size_t n, enum fsdp_dtype t, int divisor);

#endif
