/*
 * table.cu - the CUDA device's kernel table (compute/device.h's struct
 * fsdp_kernels): each entry runs its kernel of src/compute/cuda on the
 * device's current stream (d->stream), with the CPU table's semantics
 * entry for entry.
 *
 * Parameters in 16-bit storage: the embedding lookups read them as they
 * are; the norms, the bias of the row-parallel product and the matmuls'
 * f32 path widen them exactly into a workspace of the table first (the
 * matmuls' 16-bit path casts the activations instead and multiplies in
 * 16-bit with f32 accumulation, matmul_cuda.c, which also takes bf16
 * activations; under the emulation the table widens them and rounds the
 * output around the CPU's product).
 *
 * The table's state (d->kstate) holds its device workspaces: widened
 * parameters, the norms' partial sums, the squared norm's partials, a
 * chunk for the in-place casts, and the cuBLASLt handle. A workspace grows
 * at its first use with a larger size (the first step), from the device's
 * arena; a kernel cannot return an error, so a workspace that cannot grow
 * ends the job with one line naming it (fsdp_fatal, through the abort hook).
 *
 * Under the host emulation (tests/kernels/test_cuda_table) the same file
 * runs every entry on the CPU; there the matmuls are the CPU's (the one
 * part the emulation does not run: cuBLASLt).
 */
#include "compute/cuda/common.cuh"
#include "compute/cuda/attention_cuda.h"

extern "C" {
#include "compute/device.h"
#include "core/dtype.h"
#include "core/error.h"
}
#if defined(__CUDACC__)
extern "C" {
#include "compute/cuda/matmul_cuda.h"
}
#endif

#include <stdio.h>
#include <stdlib.h>

/* In-place casts go through a workspace this many elements at a time. */
#define CUDA_CAST_CHUNK ((size_t)1 << 20)

struct cuda_ks {
    float *wide; /* widened parameters */
    size_t wide_floats;
    float *norm; /* the norms' partial column sums */
    size_t norm_floats;
    double *sumsq; /* fsdp_cuda_sumsq_scratch_doubles() */
    float *cast;   /* CUDA_CAST_CHUNK floats */
#if defined(__CUDACC__)
    struct fsdp_cuda_blas *blas;
#endif
};

static void ks_die(struct fsdp_device *d, const char *what, size_t bytes)
{
    size_t free_b = 0, total_b = 0;
    (void)d->ops->mem_info(d, &free_b, &total_b);
    fsdp_fatal("out of memory on device %s:%d: the kernels' %s needs %zu bytes, %zu of %zu free; "
               "use a smaller batch or --activation-checkpointing",
               d->ops->name, d->index, what, bytes, free_b, total_b);
}

#if defined(__CUDACC__)
/* A library call that failed (its error names the call and status, or
 * the memory it could not get). */
static void ks_fail(struct fsdp_device *d, const char *what)
{
    fsdp_fatal("device %s:%d: %s: %s", d->ops->name, d->index, what, fsdp_err_msg());
}
#endif

static struct cuda_ks *ks_of(struct fsdp_device *d)
{
    if (!d->kstate) {
        d->kstate = calloc(1, sizeof(struct cuda_ks));
        if (!d->kstate) {
            ks_die(d, "table state", sizeof(struct cuda_ks));
        }
    }
    return (struct cuda_ks *)d->kstate;
}

/* *p of at least need elements of es bytes, grown from the device. */
static void *ks_grow(struct fsdp_device *d, void **p, size_t *have, size_t need, size_t es,
                     const char *name)
{
    if (*p && *have >= need) {
        return *p;
    }
    if (*p) {
        d->ops->free(d, *p);
        *p = NULL;
        *have = 0;
    }
    void *mem = NULL;
    if (fsdp_device_alloc(d, (need ? need : 1) * es, name, &mem) < 0) {
        ks_die(d, name, need * es);
    }
    *p = mem;
    *have = need;
    return mem;
}

/* *p of bytes that never change size, allocated at its first use. */
static void *ks_once(struct fsdp_device *d, void **p, size_t bytes, const char *name)
{
    size_t have = *p ? 1 : 0;
    return ks_grow(d, p, &have, 1, bytes, name);
}

static void ks_free(struct fsdp_device *d)
{
    struct cuda_ks *k = (struct cuda_ks *)d->kstate;
    void *bufs[] = {k->wide, k->norm, k->sumsq, k->cast};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        if (bufs[i]) {
            d->ops->free(d, bufs[i]);
        }
    }
#if defined(__CUDACC__)
    fsdp_cuda_blas_destroy(k->blas);
#endif
    free(k);
    d->kstate = NULL;
}

static void ks_widen_into(float *dst, const void *src, size_t n, enum fsdp_dtype pt, void *s)
{
    if (pt == FSDP_BF16) {
        fsdp_cuda_bf16_to_f32(dst, (const uint16_t *)src, n, s);
    } else {
        fsdp_cuda_f16_to_f32(dst, (const uint16_t *)src, n, s);
    }
}

/* a (na values) and b (nb; either may be NULL) as f32 device pointers:
 * themselves in f32, else widened into the workspace */
static void ks_params(struct fsdp_device *d, enum fsdp_dtype pt, const void *a, size_t na,
                      const float **wa, const void *b, size_t nb, const float **wb)
{
    if (pt == FSDP_F32) {
        *wa = (const float *)a;
        if (wb) {
            *wb = (const float *)b;
        }
        return;
    }
    struct cuda_ks *k = ks_of(d);
    na = a ? na : 0;
    nb = b ? nb : 0;
    float *w = (float *)ks_grow(d, (void **)&k->wide, &k->wide_floats, na + nb, sizeof(float),
                                "widened parameters");
    *wa = NULL;
    if (a) {
        ks_widen_into(w, a, na, pt, d->stream);
        *wa = w;
    }
    if (wb) {
        *wb = NULL;
        if (b) {
            ks_widen_into(w + na, b, nb, pt, d->stream);
            *wb = w + na;
        }
    }
}

static float *ks_norm(struct fsdp_device *d, size_t N, size_t C)
{
    struct cuda_ks *k = ks_of(d);
    return (float *)ks_grow(d, (void **)&k->norm, &k->norm_floats,
                            fsdp_cuda_norm_scratch_floats(N, C), sizeof(float),
                            "norm partial sums");
}

// ----------------------------------------------------------------------------
// embeddings, norms, matmuls

static void c_encoder_forward(struct fsdp_device *d, float *out, const int32_t *tokens,
                              const void *wte, const void *wpe, enum fsdp_dtype pt, int B, int T,
                              int C)
{
    fsdp_cuda_encoder_forward(out, tokens, wte, wpe, (int)pt, B, T, C, d->stream);
}

static void c_encoder_backward(struct fsdp_device *d, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C)
{
    fsdp_cuda_encoder_backward(dwte, dwpe, dout, tokens, B, T, C, d->stream);
}

static void c_layernorm_forward(struct fsdp_device *d, void *out, float *mean, float *rstd,
                                const void *inp, enum fsdp_dtype at, enum fsdp_dtype it,
                                const void *weight, const void *bias, enum fsdp_dtype pt, size_t N,
                                size_t C, float eps)
{
    const float *w, *b;
    ks_params(d, pt, weight, C, &w, bias, C, &b);
    fsdp_cuda_layernorm_forward_at(out, at == FSDP_BF16, mean, rstd, inp, it == FSDP_BF16, w, b, N,
                                   C, eps, d->stream);
}

static void c_layernorm_backward(struct fsdp_device *d, float *dinp, float *dweight, float *dbias,
                                 const float *dout, const void *inp, enum fsdp_dtype at,
                                 const void *weight, enum fsdp_dtype pt, const float *mean,
                                 const float *rstd, size_t N, size_t C)
{
    const float *w;
    float *scratch = ks_norm(d, N, C);
    ks_params(d, pt, weight, C, &w, NULL, 0, NULL);
    fsdp_cuda_layernorm_backward_at(dinp, dweight, dbias, scratch, dout, inp, at == FSDP_BF16, w,
                                    mean, rstd, N, C, d->stream);
}

#if !defined(__CUDACC__)
/* The emulation's f32 operands: a bf16 input (xn values) widened and yn
 * floats for an output to round, after the widened parameters (pn floats
 * at the workspace's start, which ks_params fills). */
static float *ks_mm_acts(struct fsdp_device *d, size_t pn, size_t xn, size_t yn)
{
    struct cuda_ks *k = ks_of(d);
    float *w = (float *)ks_grow(d, (void **)&k->wide, &k->wide_floats, pn + xn + yn, sizeof(float),
                                "widened parameters");
    return w + pn;
}
#endif

static void c_matmul_forward(struct fsdp_device *d, void *out, enum fsdp_dtype ot, const void *inp,
                             enum fsdp_dtype it, const void *weight, const void *bias,
                             enum fsdp_dtype pt, const float *residual, size_t N, size_t C,
                             size_t OC)
{
    fsdp_device_check_matmul(d, ot, residual);
#if defined(__CUDACC__)
    struct cuda_ks *k = ks_of(d);
    if (!k->blas && fsdp_cuda_blas_create(d, &k->blas) < 0) {
        ks_die(d, "cuBLASLt handle and workspace", 0);
    }
    if (fsdp_cuda_matmul_forward(k->blas, out, ot, inp, it, weight, bias, pt, residual, N, C, OC,
                                 d->stream) < 0) {
        ks_fail(d, "matmul_forward");
    }
#else
    const float *w, *b, *x = (const float *)inp;
    size_t pn = pt == FSDP_F32 ? 0 : OC * C + (bias ? OC : 0);
    size_t xn = it == FSDP_F32 ? 0 : N * C, yn = ot == FSDP_F32 ? 0 : N * OC;
    float *ws = xn + yn ? ks_mm_acts(d, pn, xn, yn) : NULL;
    ks_params(d, pt, weight, OC * C, &w, bias, OC, &b);
    if (xn) {
        fsdp_cuda_bf16_to_f32(ws, (const uint16_t *)inp, xn, d->stream);
        x = ws;
    }
    fsdp_cpu_matmul_forward(yn ? ws + xn : (float *)out, x, w, b, residual, N, C, OC);
    if (yn) {
        fsdp_cuda_f32_to_bf16((uint16_t *)out, ws + xn, yn, d->stream);
    }
#endif
}

static void c_matmul_backward(struct fsdp_device *d, float *dinp, float *dweight, float *dbias,
                              const float *dout, const void *inp, enum fsdp_dtype it,
                              const void *weight, enum fsdp_dtype pt, size_t N, size_t C, size_t OC,
                              float alpha, int accumulate_dinp)
{
#if defined(__CUDACC__)
    struct cuda_ks *k = ks_of(d);
    if (!k->blas && fsdp_cuda_blas_create(d, &k->blas) < 0) {
        ks_die(d, "cuBLASLt handle and workspace", 0);
    }
    if (fsdp_cuda_matmul_backward(k->blas, dinp, dweight, dbias, dout, inp, it, weight, pt, N, C,
                                  OC, alpha, accumulate_dinp, d->stream) < 0) {
        ks_fail(d, "matmul_backward");
    }
#else
    /* the input is read by the weight gradient alone (as on the CPU) */
    const float *w, *x = dweight ? (const float *)inp : NULL;
    size_t pn = pt == FSDP_F32 || !dinp ? 0 : OC * C, xn = it == FSDP_F32 || !dweight ? 0 : N * C;
    float *ws = xn ? ks_mm_acts(d, pn, xn, 0) : NULL;
    ks_params(d, pt, weight, dinp ? OC * C : 0, &w, NULL, 0, NULL);
    if (xn) {
        fsdp_cuda_bf16_to_f32(ws, (const uint16_t *)inp, xn, d->stream);
        x = ws;
    }
    fsdp_cpu_matmul_backward(dinp, dweight, dbias, dout, x, w, N, C, OC, alpha, accumulate_dinp);
#endif
}

static void c_rmsnorm_forward(struct fsdp_device *d, void *out, float *rstd, float *keep,
                              const void *inp, enum fsdp_dtype at, enum fsdp_dtype it,
                              const void *weight, enum fsdp_dtype pt, size_t N, size_t C, float eps)
{
    const float *w;
    ks_params(d, pt, weight, C, &w, NULL, 0, NULL);
    fsdp_cuda_rmsnorm_forward_at(out, at == FSDP_BF16, rstd, keep, inp, it == FSDP_BF16, w, N, C,
                                 eps, d->stream);
}

static void c_rmsnorm_backward(struct fsdp_device *d, float *dinp, float *dweight,
                               const float *dout, const void *inp, enum fsdp_dtype at,
                               const void *weight, enum fsdp_dtype pt, const float *rstd, size_t N,
                               size_t C)
{
    const float *w;
    float *scratch = ks_norm(d, N, C);
    ks_params(d, pt, weight, C, &w, NULL, 0, NULL);
    fsdp_cuda_rmsnorm_backward_at(dinp, dweight, scratch, dout, inp, at == FSDP_BF16, w, rstd, N, C,
                                  d->stream);
}

static void c_embed_rows_forward(struct fsdp_device *d, float *out, const int32_t *tokens,
                                 const void *wte, size_t v0, size_t vn, const void *wpe, size_t p0,
                                 size_t pn, enum fsdp_dtype pt, size_t N, int T, int C)
{
    fsdp_cuda_embed_rows_forward(out, tokens, wte, v0, vn, wpe, p0, pn, (int)pt, N, T, C,
                                 d->stream);
}

static void c_embed_rows_backward(struct fsdp_device *d, float *dwte, float *dwpe,
                                  const float *dout, const int32_t *tokens, size_t v0, size_t vn,
                                  size_t p0, size_t pn, size_t N, int T, int C)
{
    fsdp_cuda_embed_rows_backward(dwte, dwpe, dout, tokens, v0, vn, p0, pn, N, T, C, d->stream);
}

static void c_bias_residual_forward(struct fsdp_device *d, void *out, const float *inp,
                                    const void *bias, enum fsdp_dtype pt, const void *residual,
                                    enum fsdp_dtype at, enum fsdp_dtype rt, size_t N, size_t C)
{
    const float *b;
    ks_params(d, pt, bias, C, &b, NULL, 0, NULL);
    fsdp_cuda_bias_residual_forward_at(out, at == FSDP_BF16, inp, b, residual, rt == FSDP_BF16, N,
                                       C, d->stream);
}

static void c_embed_gather(struct fsdp_device *d, float *out, const int32_t *tokens,
                           const void *table, enum fsdp_dtype pt, size_t N, size_t C)
{
    if (pt == FSDP_F32) {
        fsdp_cuda_embed_gather(out, tokens, (const float *)table, N, C, d->stream);
    } else {
        fsdp_cuda_embed_gather16(out, tokens, table, (int)pt, N, C, d->stream);
    }
}

static void c_embed_scatter_add(struct fsdp_device *d, float *dtable, const float *dout,
                                const int32_t *tokens, size_t N, size_t C)
{
    fsdp_cuda_embed_scatter_add(dtable, dout, tokens, N, C, d->stream);
}

// ----------------------------------------------------------------------------
// attention

/* The attention kernels hold a head's row in registers: a model with wider
 * heads is refused at its first attention, in one line. */
static void ks_check_hs(struct fsdp_device *d, int hs)
{
    if (hs > FSDP_CUDA_ATTENTION_MAX_HS) {
        fsdp_fatal("device %s:%d: attention heads %d wide are wider than the cuda kernels take "
                   "(%d); use --device cpu for this model",
                   d->ops->name, d->index, hs, FSDP_CUDA_ATTENTION_MAX_HS);
    }
}

static size_t c_attention_scratch_floats(struct fsdp_device *d, int T)
{
    (void)d;
    return fsdp_cuda_attention_scratch_floats(T);
}

/* qkv and out in at (f32 or bf16), converted in registers */
static void c_attention_forward(struct fsdp_device *d, void *out, float *lse, float *scratch,
                                const void *qkv, enum fsdp_dtype at, int B, int T, int C, int NH)
{
    ks_check_hs(d, C / NH);
    fsdp_cuda_gqa_attention_forward_at(out, lse, scratch, qkv, at == FSDP_BF16, B, T, NH, NH,
                                       C / NH, d->stream);
}

static void c_attention_backward(struct fsdp_device *d, float *dqkv, float *scratch,
                                 const float *dout, const void *qkv, const void *out,
                                 const float *lse, enum fsdp_dtype at, int B, int T, int C, int NH)
{
    ks_check_hs(d, C / NH);
    fsdp_cuda_gqa_attention_backward_at(dqkv, scratch, dout, qkv, out, lse, at == FSDP_BF16, B, T,
                                        NH, NH, C / NH, d->stream);
}

static size_t c_gqa_attention_scratch_floats(struct fsdp_device *d, int T, int NH, int NKV, int hs)
{
    (void)d;
    return fsdp_cuda_gqa_attention_scratch_floats(T, NH, NKV, hs);
}

static void c_gqa_attention_forward(struct fsdp_device *d, void *out, float *lse, float *scratch,
                                    const void *qkv, enum fsdp_dtype at, int B, int T, int NH,
                                    int NKV, int hs)
{
    ks_check_hs(d, hs);
    fsdp_cuda_gqa_attention_forward_at(out, lse, scratch, qkv, at == FSDP_BF16, B, T, NH, NKV, hs,
                                       d->stream);
}

static void c_gqa_attention_backward(struct fsdp_device *d, float *dqkv, float *scratch,
                                     const float *dout, const void *qkv, const void *out,
                                     const float *lse, enum fsdp_dtype at, int B, int T, int NH,
                                     int NKV, int hs)
{
    ks_check_hs(d, hs);
    fsdp_cuda_gqa_attention_backward_at(dqkv, scratch, dout, qkv, out, lse, at == FSDP_BF16, B, T,
                                        NH, NKV, hs, d->stream);
}

static void c_attention_decode(struct fsdp_device *d, float *out, float *scores, const float *q,
                               const float *kcache, const float *vcache, int n, int NH, int NKV,
                               int hs, int ld)
{
    ks_check_hs(d, hs);
    fsdp_cuda_attention_decode(out, scores, q, kcache, vcache, n, NH, NKV, hs, ld, d->stream);
}

// ----------------------------------------------------------------------------
// element-wise, loss, optimizer, casts

/* Saved activations in at (f32 or bf16), converted in registers. */
static void c_gelu_forward(struct fsdp_device *d, void *out, const void *inp, enum fsdp_dtype at,
                           size_t n)
{
    if (at == FSDP_BF16) {
        fsdp_cuda_gelu_forward_bf16((uint16_t *)out, (const uint16_t *)inp, n, d->stream);
    } else {
        fsdp_cuda_gelu_forward((float *)out, (const float *)inp, n, d->stream);
    }
}

static void c_gelu_backward(struct fsdp_device *d, float *dinp, const void *inp, const float *dout,
                            enum fsdp_dtype at, size_t n)
{
    if (at == FSDP_BF16) {
        fsdp_cuda_gelu_backward_act16(dinp, (const uint16_t *)inp, dout, n, d->stream);
    } else {
        fsdp_cuda_gelu_backward(dinp, (const float *)inp, dout, n, d->stream);
    }
}

static void c_swiglu_forward(struct fsdp_device *d, void *out, const void *gate, const void *up,
                             enum fsdp_dtype at, size_t n)
{
    if (at == FSDP_BF16) {
        fsdp_cuda_swiglu_forward_bf16((uint16_t *)out, (const uint16_t *)gate, (const uint16_t *)up,
                                      n, d->stream);
    } else {
        fsdp_cuda_swiglu_forward((float *)out, (const float *)gate, (const float *)up, n,
                                 d->stream);
    }
}

static void c_swiglu_backward(struct fsdp_device *d, float *dgate, float *dup, const float *dout,
                              const void *gate, const void *up, enum fsdp_dtype at, size_t n)
{
    if (at == FSDP_BF16) {
        fsdp_cuda_swiglu_backward_act16(dgate, dup, dout, (const uint16_t *)gate,
                                        (const uint16_t *)up, n, d->stream);
    } else {
        fsdp_cuda_swiglu_backward(dgate, dup, dout, (const float *)gate, (const float *)up, n,
                                  d->stream);
    }
}

static void c_rope_forward(struct fsdp_device *d, float *qkv, const float *cos_t,
                           const float *sin_t, int B, int T, int NH, int NKV, int hs)
{
    fsdp_cuda_rope_forward(qkv, cos_t, sin_t, B, T, NH, NKV, hs, d->stream);
}

static void c_rope_backward(struct fsdp_device *d, float *dqkv, const float *cos_t,
                            const float *sin_t, int B, int T, int NH, int NKV, int hs)
{
    fsdp_cuda_rope_backward(dqkv, cos_t, sin_t, B, T, NH, NKV, hs, d->stream);
}

static void c_crossentropy_forward(struct fsdp_device *d, float *losses, float *stats,
                                   const float *logits, const int32_t *targets, size_t N, size_t V,
                                   int32_t ignore_index)
{
    fsdp_cuda_crossentropy_forward(losses, stats, logits, targets, N, V, ignore_index, d->stream);
}

static void c_crossentropy_backward(struct fsdp_device *d, float *dlogits, const float *logits,
                                    const float *stats, const int32_t *targets, size_t N, size_t V,
                                    int32_t ignore_index, float dscale)
{
    fsdp_cuda_crossentropy_backward(dlogits, logits, stats, targets, N, V, ignore_index, dscale,
                                    d->stream);
}

static void c_crossentropy_slice_forward(struct fsdp_device *d, float *stats, float *target_logit,
                                         const float *logits, const int32_t *targets, size_t N,
                                         size_t n, size_t col0, int32_t ignore_index, int first)
{
    fsdp_cuda_crossentropy_slice_forward(stats, target_logit, logits, targets, N, n, col0,
                                         ignore_index, first, d->stream);
}

static void c_crossentropy_slice_backward(struct fsdp_device *d, float *dlogits,
                                          const float *logits, const float *stats,
                                          const int32_t *targets, size_t N, size_t n, size_t col0,
                                          int32_t ignore_index, float dscale)
{
    fsdp_cuda_crossentropy_slice_backward(dlogits, logits, stats, targets, N, n, col0,
                                          ignore_index, dscale, d->stream);
}

static void c_adamw_update(struct fsdp_device *d, float *param, const float *grad, float *m,
                           float *v, size_t n, const struct fsdp_adamw_params *hp, int decay,
                           float grad_scale)
{
    fsdp_cuda_adamw_update(param, grad, m, v, n, hp, decay, grad_scale, d->stream);
}

static void c_sumsq(struct fsdp_device *d, double *acc, const float *x, size_t n)
{
    struct cuda_ks *k = ks_of(d);
    double *scratch =
        (double *)ks_once(d, (void **)&k->sumsq, fsdp_cuda_sumsq_scratch_doubles() * sizeof(double),
                          "squared-norm partials");
    fsdp_cuda_sumsq(acc, scratch, x, n, d->stream);
}

static void c_scale(struct fsdp_device *d, float *x, size_t n, float s)
{
    fsdp_cuda_scale(x, n, s, d->stream);
}

/* 16-bit values replace the n f32 at the start of buf, a chunk at a time in
 * ascending order: each chunk's 16-bit values land where f32 values already
 * cast were (2 i0 + 2 K <= 4 i0 + 4 K), through the workspace. */
static void c_narrow_inplace(struct fsdp_device *d, void *buf, size_t n, int bf16)
{
    struct cuda_ks *k = ks_of(d);
    uint16_t *ws =
        (uint16_t *)ks_once(d, (void **)&k->cast, CUDA_CAST_CHUNK * sizeof(float), "cast chunk");
    for (size_t i0 = 0; i0 < n; i0 += CUDA_CAST_CHUNK) {
        size_t m = n - i0 < CUDA_CAST_CHUNK ? n - i0 : CUDA_CAST_CHUNK;
        const float *src = (const float *)buf + i0;
        if (bf16) {
            fsdp_cuda_f32_to_bf16(ws, src, m, d->stream);
        } else {
            fsdp_cuda_f32_to_f16(ws, src, m, d->stream);
        }
        (void)d->ops->copy(d, (uint16_t *)buf + i0, ws, m * sizeof(uint16_t), FSDP_COPY_D2D,
                           NULL);
    }
}

/* The inverse, a chunk at a time from the end: each chunk's f32 values
 * land above the 16-bit values not yet read (4 i0 >= 2 i0). */
static void c_widen_inplace(struct fsdp_device *d, void *buf, size_t n, int bf16)
{
    struct cuda_ks *k = ks_of(d);
    float *ws =
        (float *)ks_once(d, (void **)&k->cast, CUDA_CAST_CHUNK * sizeof(float), "cast chunk");
    for (size_t end = n; end > 0;) {
        size_t m = end < CUDA_CAST_CHUNK ? end : CUDA_CAST_CHUNK, i0 = end - m;
        ks_widen_into(ws, (const uint16_t *)buf + i0, m, bf16 ? FSDP_BF16 : FSDP_F16, d->stream);
        (void)d->ops->copy(d, (float *)buf + i0, ws, m * sizeof(float), FSDP_COPY_D2D, NULL);
        end = i0;
    }
}

static void c_f32_to_bf16(struct fsdp_device *d, uint16_t *dst, const float *src, size_t n)
{
    fsdp_cuda_f32_to_bf16(dst, src, n, d->stream);
}

static void c_bf16_to_f32(struct fsdp_device *d, float *dst, const uint16_t *src, size_t n)
{
    fsdp_cuda_bf16_to_f32(dst, src, n, d->stream);
}

static void c_f32_to_f16(struct fsdp_device *d, uint16_t *dst, const float *src, size_t n)
{
    fsdp_cuda_f32_to_f16(dst, src, n, d->stream);
}

static void c_f16_to_f32(struct fsdp_device *d, float *dst, const uint16_t *src, size_t n)
{
    fsdp_cuda_f16_to_f32(dst, src, n, d->stream);
}

// ----------------------------------------------------------------------------
// the engine's loops and the loss rows

static void c_accumulate(struct fsdp_device *d, float *y, const float *x, size_t n)
{
    fsdp_cuda_accumulate(y, x, n, d->stream);
}

static void c_accumulate16(struct fsdp_device *d, float *y, const uint16_t *x, size_t n, int bf16,
                           int accumulate)
{
    fsdp_cuda_accumulate16(y, x, n, bf16, accumulate, d->stream);
}

static void c_loss_sum(struct fsdp_device *d, double *acc, const float *losses,
                       const int32_t *targets, size_t N, int32_t ignore_index)
{
    fsdp_cuda_loss_sum(acc, losses, targets, N, ignore_index, d->stream);
}

static void c_xent_losses(struct fsdp_device *d, float *losses, const float *stats,
                          const float *target_logit, const int32_t *targets, size_t N,
                          int32_t ignore_index)
{
    fsdp_cuda_xent_losses(losses, stats, target_logit, targets, N, ignore_index, d->stream);
}

static void c_xent_combine(struct fsdp_device *d, int phase, float *stats, float *zt, float *mx,
                           float *sz, size_t N, int have)
{
    fsdp_cuda_xent_combine(phase, stats, zt, mx, sz, N, have, d->stream);
}

static void c_fill(struct fsdp_device *d, float *x, size_t n, size_t stride, float value)
{
    fsdp_cuda_fill(x, n, stride, value, d->stream);
}

static struct fsdp_kernels cuda_table;

extern "C" const struct fsdp_kernels *fsdp_cuda_kernels(void)
{
    /* filled in order here: C++ has no designated initializers for a C struct before C++20 */
    struct fsdp_kernels *t = &cuda_table;
    if (t->size) {
        return t;
    }
    t->encoder_forward = c_encoder_forward;
    t->encoder_backward = c_encoder_backward;
    t->layernorm_forward = c_layernorm_forward;
    t->layernorm_backward = c_layernorm_backward;
    t->matmul_forward = c_matmul_forward;
    t->matmul_backward = c_matmul_backward;
    t->attention_scratch_floats = c_attention_scratch_floats;
    t->attention_forward = c_attention_forward;
    t->attention_backward = c_attention_backward;
    t->gelu_forward = c_gelu_forward;
    t->gelu_backward = c_gelu_backward;
    t->crossentropy_forward = c_crossentropy_forward;
    t->crossentropy_backward = c_crossentropy_backward;
    t->adamw_update = c_adamw_update;
    t->sumsq = c_sumsq;
    t->scale = c_scale;
    t->narrow_inplace = c_narrow_inplace;
    t->widen_inplace = c_widen_inplace;
    t->f32_to_bf16 = c_f32_to_bf16;
    t->bf16_to_f32 = c_bf16_to_f32;
    t->f32_to_f16 = c_f32_to_f16;
    t->f16_to_f32 = c_f16_to_f32;
    t->embed_rows_forward = c_embed_rows_forward;
    t->embed_rows_backward = c_embed_rows_backward;
    t->crossentropy_slice_forward = c_crossentropy_slice_forward;
    t->crossentropy_slice_backward = c_crossentropy_slice_backward;
    t->bias_residual_forward = c_bias_residual_forward;
    t->rmsnorm_forward = c_rmsnorm_forward;
    t->rmsnorm_backward = c_rmsnorm_backward;
    t->rope_forward = c_rope_forward;
    t->rope_backward = c_rope_backward;
    t->swiglu_forward = c_swiglu_forward;
    t->swiglu_backward = c_swiglu_backward;
    t->gqa_attention_scratch_floats = c_gqa_attention_scratch_floats;
    t->gqa_attention_forward = c_gqa_attention_forward;
    t->gqa_attention_backward = c_gqa_attention_backward;
    t->embed_gather = c_embed_gather;
    t->embed_scatter_add = c_embed_scatter_add;
    t->attention_decode = c_attention_decode;
    t->accumulate = c_accumulate;
    t->accumulate16 = c_accumulate16;
    t->loss_sum = c_loss_sum;
    t->xent_losses = c_xent_losses;
    t->xent_combine = c_xent_combine;
    t->fill = c_fill;
    t->kstate_free = ks_free;
    t->size = sizeof(struct fsdp_kernels);
    return t;
}
