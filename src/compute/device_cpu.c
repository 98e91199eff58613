/*
 * device_cpu.c - the CPU device's kernel table (device.h): each entry
 * runs its fsdp_cpu_* kernel (kernels.h) between the device's kernel
 * hooks, which only a checking device sets (device_guarded.c reuses this
 * table and the ops behind its guard), widening 16-bit parameters and bf16
 * activations for the f32 kernels and rounding bf16 outputs. Its ops
 * (memory, copies, streams, events): device_cpu_ops.c.
 */
#include "config.h"
#include "compute/device.h"
#include "compute/device_impl.h"
#include "core/error.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* p: the kernel's pointer arguments, the nw it writes first, then those it
 * reads (NULL ones included: the hook skips them). */
static inline void k_enter(struct fsdp_device *d, const void *const *p, int nw, int n)
{
    if (d->kernel_enter) {
        d->kernel_enter(d, p, nw, n);
    }
}

static inline void k_leave(struct fsdp_device *d)
{
    if (d->kernel_leave) {
        d->kernel_leave(d);
    }
}

// ----------------------------------------------------------------------------
// parameters in 16-bit storage, widened exactly for the f32 kernels

static void k_widen_into(float *dst, const void *src, size_t n, enum fsdp_dtype pt)
{
    (pt == FSDP_BF16 ? fsdp_cpu_bf16_to_f32 : fsdp_cpu_f16_to_f32)(dst, src, n);
}

/*
 * The parameters a kernel reads, as f32: themselves when pt is f32, else
 * widened into the device's workspace (a's na values, then b's nb; either
 * may be NULL, as an absent bias is). A kernel returns nothing, so a
 * workspace that cannot grow ends the job with one line naming what was
 * asked (fsdp_fatal).
 */
/* The CPU table's state (d->kstate): the widening workspace, grown to the
 * largest tensor one kernel reads; host memory, freed with the device. */
struct cpu_kstate {
    float *wide;
    size_t floats;
};

/* The workspace grown to need floats, or NULL when host memory ran out. */
static float *k_grow(struct fsdp_device *d, size_t need)
{
    struct cpu_kstate *ks = d->kstate;
    if (!ks && !(ks = d->kstate = calloc(1, sizeof(*ks)))) {
        fsdp_fatal("device %s: no host memory for the kernels' state", d->ops->name);
    }
    if (!ks->wide || need > ks->floats) {
        fsdp_free(ks->wide);
        ks->wide = fsdp_alloc(need * sizeof(float));
        ks->floats = ks->wide ? need : 0;
    }
    return ks->wide;
}

/* The workspace, grown to need floats: a kernel's widened 16-bit (dt)
 * parameter or activation (what) values; hint says how to do without. */
static float *k_work(struct fsdp_device *d, size_t need, enum fsdp_dtype dt, const char *what,
                     const char *hint)
{
    float *w = k_grow(d, need);
    if (!w) {
        fsdp_fatal("device %s: no host memory to widen %zu %s %s values for a kernel "
                   "(%zu bytes); free memory or use %s",
                   d->ops->name, need, fsdp_dtype_name(dt), what, need * sizeof(float), hint);
    }
    return w;
}

/* p's n values (of dtype dt) as f32: p itself when dt is f32 or p is
 * NULL, else widened exactly into *ws, which then moves past them. */
static const float *k_wide(float **ws, const void *p, size_t n, enum fsdp_dtype dt)
{
    if (dt == FSDP_F32 || !p) {
        return p;
    }
    float *w = *ws;
    k_widen_into(w, p, n, dt);
    *ws = w + n;
    return w;
}

static void k_widen(struct fsdp_device *d, enum fsdp_dtype pt, const void *a, size_t na,
                    const float **wa, const void *b, size_t nb, const float **wb)
{
    size_t need = (a ? na : 0) + (b && wb ? nb : 0);
    float *ws = pt == FSDP_F32 ? NULL : k_work(d, need, pt, "parameter", "--param-dtype f32");
    *wa = k_wide(&ws, a, na, pt);
    if (wb) {
        *wb = k_wide(&ws, b, nb, pt);
    }
}

static void k_kstate_free(struct fsdp_device *d)
{
    struct cpu_kstate *ks = d->kstate;
    fsdp_free(ks->wide);
    free(ks);
    d->kstate = NULL;
}

/* out[r,:] = table[tokens[r],:] widened from 16-bit, row by row. */
static void k_rows16(float *out, const int32_t *tokens, const void *table, size_t N, size_t C,
                     enum fsdp_dtype pt)
{
    const uint16_t *t = table;
    for (size_t r = 0; r < N; r++) {
        k_widen_into(out + r * C, t + (size_t)tokens[r] * C, C, pt);
    }
}

// ----------------------------------------------------------------------------
// activations in bf16 storage, widened and rounded tile by tile

/* Values per tile of the element-wise entries (on the stack): a multiple
 * of every SIMD width, so each value meets the same vector code as in one
 * call over the whole tensor, and the results are the same bits. */
#define K_TILE 2048

/* Values [i, i + n) of the bf16 activation src widened into tile. */
static const float *k_tile_in(float *tile, const void *src, size_t i, size_t n)
{
    fsdp_cpu_bf16_to_f32(tile, (const uint16_t *)src + i, n);
    return tile;
}

/* tile's n values rounded (to nearest even) into [i, i + n) of bf16 dst. */
static void k_tile_out(void *dst, const float *tile, size_t i, size_t n)
{
    fsdp_cpu_f32_to_bf16((uint16_t *)dst + i, tile, n);
}

// ----------------------------------------------------------------------------
// kernels: the fsdp_cpu_* functions between the hooks

static void k_encoder_forward(struct fsdp_device *d, float *out, const int32_t *tokens,
                              const void *wte, const void *wpe, enum fsdp_dtype pt, int B, int T,
                              int C)
{
    const void *p[] = {out, tokens, wte, wpe};
    k_enter(d, p, 1, 4);
    if (pt == FSDP_F32) {
        fsdp_cpu_encoder_forward(out, tokens, wte, wpe, B, T, C);
    } else { /* the looked-up rows, then + wpe: the f32 kernel's sums */
        size_t BT = (size_t)B * (size_t)T, Cs = (size_t)C;
        const float *pos;
        k_widen(d, pt, wpe, (size_t)T * Cs, &pos, NULL, 0, NULL);
        k_rows16(out, tokens, wte, BT, Cs, pt);
        for (size_t bt = 0; bt < BT; bt++) {
            fsdp_cpu_accumulate(out + bt * Cs, pos + (bt % (size_t)T) * Cs, Cs);
        }
    }
    k_leave(d);
}

static void k_encoder_backward(struct fsdp_device *d, float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C)
{
    const void *p[] = {dwte, dwpe, dout, tokens};
    k_enter(d, p, 2, 4);
    fsdp_cpu_encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
    k_leave(d);
}

/*
 * A norm's forward with its input (it) or output (at) in bf16: the weight
 * and bias widened (pt not f32) and a tile of rows at a time through the
 * workspace: the input widened, the f32 kernel, the output rounded (the
 * kernels compute each row apart, so the tiles give their bits). mean
 * NULL: RMSNorm, whose keep (f32) gets the widened input.
 */
static void k_norm16_forward(struct fsdp_device *d, void *out, enum fsdp_dtype at, float *mean,
                             float *rstd, float *keep, const void *inp, enum fsdp_dtype it,
                             const void *weight, const void *bias, enum fsdp_dtype pt, size_t N,
                             size_t C, float eps)
{
    size_t rows = C < 16 * K_TILE ? 16 * K_TILE / C : 1;
    size_t wn = pt == FSDP_F32 ? 0 : (bias ? 2 * C : C);
    float *ws = k_work(d, wn + 2 * rows * C, FSDP_BF16, "activation", "--activation-dtype f32");
    float *xt = ws + wn, *yt = xt + rows * C;
    const float *w = k_wide(&ws, weight, C, pt), *b = k_wide(&ws, bias, C, pt);
    for (size_t r = 0; r < N; r += rows) {
        size_t n = N - r < rows ? N - r : rows;
        const float *x = it == FSDP_F32 ? (const float *)inp + r * C : xt;
        float *y = at == FSDP_F32 ? (float *)out + r * C : yt;
        float *kp = keep ? keep + r * C : NULL;
        if (it != FSDP_F32) {
            fsdp_cpu_bf16_to_f32(xt, (const uint16_t *)inp + r * C, n * C);
        }
        if (mean) {
            fsdp_cpu_layernorm_forward(y, mean + r, rstd + r, x, w, b, n, C, eps);
        } else {
            fsdp_cpu_rmsnorm_forward_keep(y, rstd + r, kp, x, w, n, C, eps);
        }
        if (at != FSDP_F32) {
            fsdp_cpu_f32_to_bf16((uint16_t *)out + r * C, yt, n * C);
        }
    }
}

static void k_layernorm_forward(struct fsdp_device *d, void *out, float *mean, float *rstd,
                                const void *inp, enum fsdp_dtype at, enum fsdp_dtype it,
                                const void *weight, const void *bias, enum fsdp_dtype pt, size_t N,
                                size_t C, float eps)
{
    const void *p[] = {out, mean, rstd, inp, weight, bias};
    const float *w, *b;
    k_enter(d, p, 3, 6);
    if (at == FSDP_F32 && it == FSDP_F32) {
        k_widen(d, pt, weight, C, &w, bias, C, &b);
        fsdp_cpu_layernorm_forward(out, mean, rstd, inp, w, b, N, C, eps);
    } else {
        k_norm16_forward(d, out, at, mean, rstd, NULL, inp, it, weight, bias, pt, N, C, eps);
    }
    k_leave(d);
}

/*
 * A norm's backward from a bf16 input: the weight widened (pt not f32) and
 * the input rows a tile at a time into the workspace, and the f32 kernel
 * over each tile in order (it adds each row's parameter gradients in row
 * order, so the tiles give its bits). mean NULL: RMSNorm.
 */
static void k_norm16_backward(struct fsdp_device *d, float *dinp, float *dweight, float *dbias,
                              const float *dout, const void *inp, const void *weight,
                              enum fsdp_dtype pt, const float *mean, const float *rstd, size_t N,
                              size_t C)
{
    size_t rows = C < 16 * K_TILE ? 16 * K_TILE / C : 1, wn = pt == FSDP_F32 ? 0 : C;
    float *ws = k_work(d, wn + rows * C, FSDP_BF16, "activation", "--activation-dtype f32");
    const float *w = k_wide(&ws, weight, C, pt);
    for (size_t r = 0; r < N; r += rows) {
        size_t n = N - r < rows ? N - r : rows;
        fsdp_cpu_bf16_to_f32(ws, (const uint16_t *)inp + r * C, n * C);
        if (mean) {
            fsdp_cpu_layernorm_backward(dinp + r * C, dweight, dbias, dout + r * C, ws, w, mean + r,
                                        rstd + r, n, C);
        } else {
            fsdp_cpu_rmsnorm_backward(dinp + r * C, dweight, dout + r * C, ws, w, rstd + r, n, C);
        }
    }
}

static void k_layernorm_backward(struct fsdp_device *d, float *dinp, float *dweight, float *dbias,
                                 const float *dout, const void *inp, enum fsdp_dtype at,
                                 const void *weight, enum fsdp_dtype pt, const float *mean,
                                 const float *rstd, size_t N, size_t C)
{
    const void *p[] = {dinp, dweight, dbias, dout, inp, weight, mean, rstd};
    const float *w;
    k_enter(d, p, 3, 8);
    if (at == FSDP_F32) {
        k_widen(d, pt, weight, C, &w, NULL, 0, NULL);
        fsdp_cpu_layernorm_backward(dinp, dweight, dbias, dout, inp, w, mean, rstd, N, C);
    } else {
        k_norm16_backward(d, dinp, dweight, dbias, dout, inp, weight, pt, mean, rstd, N, C);
    }
    k_leave(d);
}

/*
 * The products' operands as f32 for the f32 kernel: 16-bit parameters
 * (weight wn values, bias bn) and a bf16 input (xn values) widened exactly
 * into the workspace as whole operands, so the kernel's call is the one an
 * f32 run makes and its bits cannot move; yn more floats after them for
 * an output to round. NULL when nothing needs widening or rounding; out
 * of host memory, one line naming what it widens and rounds.
 */
static float *k_mm_work(struct fsdp_device *d, enum fsdp_dtype pt, size_t wn, enum fsdp_dtype it,
                        size_t xn, size_t yn)
{
    size_t pw = pt == FSDP_F32 ? 0 : wn, px = it == FSDP_F32 ? 0 : xn, need = pw + px + yn;
    if (!need) {
        return NULL;
    }
    float *ws = k_grow(d, need);
    if (!ws) { /* name what it widens and rounds, and the flags that avoid each */
        const char *part[3];
        int n = 0;
        part[n] = "widen 16-bit weights", n += pw != 0;
        part[n] = "widen a bf16 input", n += px != 0;
        part[n] = "round a bf16 output", n += yn != 0;
        const char *acts =
            pw ? "--param-dtype f32 and --activation-dtype f32" : "--activation-dtype f32";
        fsdp_fatal("device %s: no host memory to %s%s%s%s%s for a matmul (%zu f32 values, %zu "
                   "bytes); free memory or use %s",
                   d->ops->name, part[0], n > 1 ? (n > 2 ? ", " : " and ") : "",
                   n > 1 ? part[1] : "", n > 2 ? " and " : "", n > 2 ? part[2] : "", need,
                   need * sizeof(float), px || yn ? acts : "--param-dtype f32");
    }
    return ws;
}

static void k_matmul_forward(struct fsdp_device *d, void *out, enum fsdp_dtype ot, const void *inp,
                             enum fsdp_dtype it, const void *weight, const void *bias,
                             enum fsdp_dtype pt, const float *residual, size_t N, size_t C,
                             size_t OC)
{
    const void *p[] = {out, inp, weight, bias, residual};
    fsdp_device_check_matmul(d, ot, residual);
    k_enter(d, p, 1, 5);
    size_t yn = ot == FSDP_F32 ? 0 : N * OC;
    float *ws = k_mm_work(d, pt, OC * C + (bias ? OC : 0), it, N * C, yn);
    const float *w = k_wide(&ws, weight, OC * C, pt), *b = k_wide(&ws, bias, OC, pt);
    const float *x = k_wide(&ws, inp, N * C, it);
    fsdp_cpu_matmul_forward(yn ? ws : out, x, w, b, residual, N, C, OC);
    if (yn) { /* rounded to nearest even */
        fsdp_cpu_f32_to_bf16(out, ws, yn);
    }
    k_leave(d);
}

static void k_matmul_backward(struct fsdp_device *d, float *dinp, float *dweight, float *dbias,
                              const float *dout, const void *inp, enum fsdp_dtype it,
                              const void *weight, enum fsdp_dtype pt, size_t N, size_t C, size_t OC,
                              float alpha, int accumulate_dinp)
{
    const void *p[] = {dinp, dweight, dbias, dout, inp, weight};
    k_enter(d, p, 3, 6);
    size_t wn = dinp ? OC * C : 0, xn = dweight ? N * C : 0;
    float *ws = k_mm_work(d, pt, wn, it, xn, 0);
    const float *w = k_wide(&ws, dinp ? weight : NULL, wn, pt);
    const float *x = k_wide(&ws, dweight ? inp : NULL, xn, it);
    fsdp_cpu_matmul_backward(dinp, dweight, dbias, dout, x, w, N, C, OC, alpha, accumulate_dinp);
    k_leave(d);
}

static size_t k_attention_scratch_floats(struct fsdp_device *d, int T)
{
    (void)d;
    return fsdp_cpu_attention_scratch_floats(T);
}

/*
 * The attentions from bf16 activations: each sequence's qkv (T rows of
 * ld) (and, backward, its out, T rows of C) widened into the workspace,
 * the f32 kernel over that one sequence (which computes each apart, so
 * the results are its bits over the batch), out rounded to bf16.
 */
static void k_att16_forward(struct fsdp_device *d, void *out, float *lse, float *scratch,
                            const void *qkv, int B, int T, int NH, int NKV, int hs)
{
    size_t C = (size_t)NH * (size_t)hs, ld = C + 2 * (size_t)NKV * (size_t)hs, Ts = (size_t)T;
    float *x = k_work(d, Ts * (ld + C), FSDP_BF16, "activation", "--activation-dtype f32");
    for (size_t b = 0; b < (size_t)B; b++) {
        fsdp_cpu_bf16_to_f32(x, (const uint16_t *)qkv + b * Ts * ld, Ts * ld);
        fsdp_cpu_gqa_attention_forward(x + Ts * ld, lse + b * (size_t)NH * Ts, scratch, x, 1, T, NH,
                                       NKV, hs);
        fsdp_cpu_f32_to_bf16((uint16_t *)out + b * Ts * C, x + Ts * ld, Ts * C);
    }
}

static void k_att16_backward(struct fsdp_device *d, float *dqkv, float *scratch, const float *dout,
                             const void *qkv, const void *out, const float *lse, int B, int T,
                             int NH, int NKV, int hs)
{
    size_t C = (size_t)NH * (size_t)hs, ld = C + 2 * (size_t)NKV * (size_t)hs, Ts = (size_t)T;
    float *x = k_work(d, Ts * (ld + C), FSDP_BF16, "activation", "--activation-dtype f32");
    for (size_t b = 0; b < (size_t)B; b++) {
        fsdp_cpu_bf16_to_f32(x, (const uint16_t *)qkv + b * Ts * ld, Ts * ld);
        fsdp_cpu_bf16_to_f32(x + Ts * ld, (const uint16_t *)out + b * Ts * C, Ts * C);
        fsdp_cpu_gqa_attention_backward(dqkv + b * Ts * ld, scratch, dout + b * Ts * C, x,
                                        x + Ts * ld, lse + b * (size_t)NH * Ts, 1, T, NH, NKV, hs);
    }
}

static void k_attention_forward(struct fsdp_device *d, void *out, float *lse, float *scratch,
                                const void *qkv, enum fsdp_dtype at, int B, int T, int C, int NH)
{
    const void *p[] = {out, lse, scratch, qkv};
    k_enter(d, p, 3, 4);
    if (at == FSDP_F32) {
        fsdp_cpu_attention_forward(out, lse, scratch, qkv, B, T, C, NH);
    } else {
        k_att16_forward(d, out, lse, scratch, qkv, B, T, NH, NH, C / NH);
    }
    k_leave(d);
}

static void k_attention_backward(struct fsdp_device *d, float *dqkv, float *scratch,
                                 const float *dout, const void *qkv, const void *out,
                                 const float *lse, enum fsdp_dtype at, int B, int T, int C, int NH)
{
    const void *p[] = {dqkv, scratch, dout, qkv, out, lse};
    k_enter(d, p, 2, 6);
    if (at == FSDP_F32) {
        fsdp_cpu_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH);
    } else {
        k_att16_backward(d, dqkv, scratch, dout, qkv, out, lse, B, T, NH, NH, C / NH);
    }
    k_leave(d);
}

static void k_gelu_forward(struct fsdp_device *d, void *out, const void *inp, enum fsdp_dtype at,
                           size_t n)
{
    const void *p[] = {out, inp};
    k_enter(d, p, 1, 2);
    if (at == FSDP_F32) {
        fsdp_cpu_gelu_forward(out, inp, n);
    } else {
        float x[K_TILE], y[K_TILE];
        for (size_t i = 0; i < n; i += K_TILE) {
            size_t t = n - i < K_TILE ? n - i : K_TILE;
            fsdp_cpu_gelu_forward(y, k_tile_in(x, inp, i, t), t);
            k_tile_out(out, y, i, t);
        }
    }
    k_leave(d);
}

static void k_gelu_backward(struct fsdp_device *d, float *dinp, const void *inp, const float *dout,
                            enum fsdp_dtype at, size_t n)
{
    const void *p[] = {dinp, inp, dout};
    k_enter(d, p, 1, 3);
    if (at == FSDP_F32) {
        fsdp_cpu_gelu_backward(dinp, inp, dout, n);
    } else {
        float x[K_TILE];
        for (size_t i = 0; i < n; i += K_TILE) {
            size_t t = n - i < K_TILE ? n - i : K_TILE;
            fsdp_cpu_gelu_backward(dinp + i, k_tile_in(x, inp, i, t), dout + i, t);
        }
    }
    k_leave(d);
}

static void k_crossentropy_forward(struct fsdp_device *d, float *losses, float *stats,
                                   const float *logits, const int32_t *targets, size_t N, size_t V,
                                   int32_t ignore_index)
{
    const void *p[] = {losses, stats, logits, targets};
    k_enter(d, p, 2, 4);
    size_t kept;
    (void)fsdp_cpu_crossentropy_forward(losses, stats, logits, targets, N, V, ignore_index, &kept);
    k_leave(d);
}

static void k_crossentropy_backward(struct fsdp_device *d, float *dlogits, const float *logits,
                                    const float *stats, const int32_t *targets, size_t N, size_t V,
                                    int32_t ignore_index, float dscale)
{
    const void *p[] = {dlogits, logits, stats, targets};
    k_enter(d, p, 1, 4);
    fsdp_cpu_crossentropy_backward(dlogits, logits, stats, targets, N, V, ignore_index, dscale);
    k_leave(d);
}

static void k_adamw_update(struct fsdp_device *d, float *param, const float *grad, float *m,
                           float *v, size_t n, const struct fsdp_adamw_params *hp, int decay,
                           float grad_scale)
{
    const void *p[] = {param, m, v, grad};
    k_enter(d, p, 3, 4);
    fsdp_cpu_adamw_update(param, grad, m, v, n, hp, decay, grad_scale);
    k_leave(d);
}

static void k_sumsq(struct fsdp_device *d, double *acc, const float *x, size_t n)
{
    const void *p[] = {acc, x};
    k_enter(d, p, 1, 2);
    *acc += fsdp_cpu_sumsq(x, n);
    k_leave(d);
}

static void k_scale(struct fsdp_device *d, float *x, size_t n, float s)
{
    const void *p[] = {x};
    k_enter(d, p, 1, 1);
    fsdp_cpu_scale(x, n, s);
    k_leave(d);
}

static void k_narrow_inplace(struct fsdp_device *d, void *buf, size_t n, int bf16)
{
    const void *p[] = {buf};
    k_enter(d, p, 1, 1);
    fsdp_cpu_narrow_inplace(buf, n, bf16);
    k_leave(d);
}

static void k_widen_inplace(struct fsdp_device *d, void *buf, size_t n, int bf16)
{
    const void *p[] = {buf};
    k_enter(d, p, 1, 1);
    fsdp_cpu_widen_inplace(buf, n, bf16);
    k_leave(d);
}

static void k_f32_to_bf16(struct fsdp_device *d, uint16_t *dst, const float *src, size_t n)
{
    const void *p[] = {dst, src};
    k_enter(d, p, 1, 2);
    fsdp_cpu_f32_to_bf16(dst, src, n);
    k_leave(d);
}

static void k_bf16_to_f32(struct fsdp_device *d, float *dst, const uint16_t *src, size_t n)
{
    const void *p[] = {dst, src};
    k_enter(d, p, 1, 2);
    fsdp_cpu_bf16_to_f32(dst, src, n);
    k_leave(d);
}

static void k_f32_to_f16(struct fsdp_device *d, uint16_t *dst, const float *src, size_t n)
{
    const void *p[] = {dst, src};
    k_enter(d, p, 1, 2);
    fsdp_cpu_f32_to_f16(dst, src, n);
    k_leave(d);
}

static void k_f16_to_f32(struct fsdp_device *d, float *dst, const uint16_t *src, size_t n)
{
    const void *p[] = {dst, src};
    k_enter(d, p, 1, 2);
    fsdp_cpu_f16_to_f32(dst, src, n);
    k_leave(d);
}

static void k_embed_rows_forward(struct fsdp_device *d, float *out, const int32_t *tokens,
                                 const void *wte, size_t v0, size_t vn, const void *wpe, size_t p0,
                                 size_t pn, enum fsdp_dtype pt, size_t N, int T, int C)
{
    const void *p[] = {out, tokens, wte, wpe};
    const float *e, *pos;
    k_enter(d, p, 1, 4);
    k_widen(d, pt, wte, vn * (size_t)C, &e, wpe, pn * (size_t)C, &pos);
    fsdp_cpu_embed_rows_forward(out, tokens, e, v0, vn, pos, p0, pn, N, T, C);
    k_leave(d);
}

static void k_embed_rows_backward(struct fsdp_device *d, float *dwte, float *dwpe,
                                  const float *dout, const int32_t *tokens, size_t v0, size_t vn,
                                  size_t p0, size_t pn, size_t N, int T, int C)
{
    const void *p[] = {dwte, dwpe, dout, tokens};
    k_enter(d, p, 2, 4);
    fsdp_cpu_embed_rows_backward(dwte, dwpe, dout, tokens, v0, vn, p0, pn, N, T, C);
    k_leave(d);
}

static void k_crossentropy_slice_forward(struct fsdp_device *d, float *stats, float *target_logit,
                                         const float *logits, const int32_t *targets, size_t N,
                                         size_t n, size_t col0, int32_t ignore_index, int first)
{
    const void *p[] = {stats, target_logit, logits, targets};
    k_enter(d, p, 2, 4);
    fsdp_cpu_crossentropy_slice_forward(stats, target_logit, logits, targets, N, n, col0,
                                        ignore_index, first);
    k_leave(d);
}

static void k_crossentropy_slice_backward(struct fsdp_device *d, float *dlogits,
                                          const float *logits, const float *stats,
                                          const int32_t *targets, size_t N, size_t n, size_t col0,
                                          int32_t ignore_index, float dscale)
{
    const void *p[] = {dlogits, logits, stats, targets};
    k_enter(d, p, 1, 4);
    fsdp_cpu_crossentropy_slice_backward(dlogits, logits, stats, targets, N, n, col0, ignore_index,
                                         dscale);
    k_leave(d);
}

/* The residual add with its output (at) or residual (rt) in bf16: a tile
 * of rows at a time through the workspace (the kernel adds each value
 * apart), the residual widened, the output rounded. */
static void k_bias_residual16(struct fsdp_device *d, void *out, const float *inp, const void *bias,
                              enum fsdp_dtype pt, const void *residual, enum fsdp_dtype at,
                              enum fsdp_dtype rt, size_t N, size_t C)
{
    size_t rows = C < 16 * K_TILE ? 16 * K_TILE / C : 1, wn = pt == FSDP_F32 || !bias ? 0 : C;
    float *ws = k_work(d, wn + 2 * rows * C, FSDP_BF16, "activation", "--activation-dtype f32");
    float *rt_ = ws + wn, *yt = rt_ + rows * C;
    const float *b = k_wide(&ws, bias, C, pt);
    for (size_t r = 0; r < N; r += rows) {
        size_t n = N - r < rows ? N - r : rows;
        const float *res = residual && rt == FSDP_F32 ? (const float *)residual + r * C : NULL;
        float *y = at == FSDP_F32 ? (float *)out + r * C : yt;
        if (residual && rt != FSDP_F32) {
            fsdp_cpu_bf16_to_f32(rt_, (const uint16_t *)residual + r * C, n * C);
            res = rt_;
        }
        fsdp_cpu_bias_residual_forward(y, inp + r * C, b, res, n, C);
        if (at != FSDP_F32) {
            fsdp_cpu_f32_to_bf16((uint16_t *)out + r * C, yt, n * C);
        }
    }
}

static void k_bias_residual_forward(struct fsdp_device *d, void *out, const float *inp,
                                    const void *bias, enum fsdp_dtype pt, const void *residual,
                                    enum fsdp_dtype at, enum fsdp_dtype rt, size_t N, size_t C)
{
    const void *p[] = {out, inp, bias, residual};
    const float *b;
    k_enter(d, p, 1, 4);
    if (at == FSDP_F32 && (rt == FSDP_F32 || !residual)) {
        k_widen(d, pt, bias, C, &b, NULL, 0, NULL);
        fsdp_cpu_bias_residual_forward(out, inp, b, residual, N, C);
    } else {
        k_bias_residual16(d, out, inp, bias, pt, residual, at, rt, N, C);
    }
    k_leave(d);
}

static void k_rmsnorm_forward(struct fsdp_device *d, void *out, float *rstd, float *keep,
                              const void *inp, enum fsdp_dtype at, enum fsdp_dtype it,
                              const void *weight, enum fsdp_dtype pt, size_t N, size_t C, float eps)
{
    const void *p[] = {out, rstd, keep, inp, weight};
    const float *w;
    k_enter(d, p, 3, 5);
    if (at == FSDP_F32 && it == FSDP_F32) {
        k_widen(d, pt, weight, C, &w, NULL, 0, NULL);
        fsdp_cpu_rmsnorm_forward_keep(out, rstd, keep, inp, w, N, C, eps);
    } else {
        k_norm16_forward(d, out, at, NULL, rstd, keep, inp, it, weight, NULL, pt, N, C, eps);
    }
    k_leave(d);
}

static void k_rmsnorm_backward(struct fsdp_device *d, float *dinp, float *dweight,
                               const float *dout, const void *inp, enum fsdp_dtype at,
                               const void *weight, enum fsdp_dtype pt, const float *rstd, size_t N,
                               size_t C)
{
    const void *p[] = {dinp, dweight, dout, inp, weight, rstd};
    const float *weight_f;
    k_enter(d, p, 2, 6);
    if (at == FSDP_F32) {
        k_widen(d, pt, weight, C, &weight_f, NULL, 0, NULL);
        fsdp_cpu_rmsnorm_backward(dinp, dweight, dout, inp, weight_f, rstd, N, C);
    } else {
        k_norm16_backward(d, dinp, dweight, NULL, dout, inp, weight, pt, NULL, rstd, N, C);
    }
    k_leave(d);
}

static void k_rope_forward(struct fsdp_device *d, float *qkv, const float *cos_t,
                           const float *sin_t, int B, int T, int NH, int NKV, int hs)
{
    const void *p[] = {qkv, cos_t, sin_t};
    k_enter(d, p, 1, 3);
    fsdp_cpu_rope_forward(qkv, cos_t, sin_t, B, T, NH, NKV, hs);
    k_leave(d);
}

static void k_rope_backward(struct fsdp_device *d, float *dqkv, const float *cos_t,
                            const float *sin_t, int B, int T, int NH, int NKV, int hs)
{
    const void *p[] = {dqkv, cos_t, sin_t};
    k_enter(d, p, 1, 3);
    fsdp_cpu_rope_backward(dqkv, cos_t, sin_t, B, T, NH, NKV, hs);
    k_leave(d);
}

static void k_swiglu_forward(struct fsdp_device *d, void *out, const void *gate, const void *up,
                             enum fsdp_dtype at, size_t n)
{
    const void *p[] = {out, gate, up};
    k_enter(d, p, 1, 3);
    if (at == FSDP_F32) {
        fsdp_cpu_swiglu_forward(out, gate, up, n);
    } else {
        float g[K_TILE], u[K_TILE], y[K_TILE];
        for (size_t i = 0; i < n; i += K_TILE) {
            size_t t = n - i < K_TILE ? n - i : K_TILE;
            fsdp_cpu_swiglu_forward(y, k_tile_in(g, gate, i, t), k_tile_in(u, up, i, t), t);
            k_tile_out(out, y, i, t);
        }
    }
    k_leave(d);
}

static void k_swiglu_backward(struct fsdp_device *d, float *dgate, float *dup, const float *dout,
                              const void *gate, const void *up, enum fsdp_dtype at, size_t n)
{
    const void *p[] = {dgate, dup, dout, gate, up};
    k_enter(d, p, 2, 5);
    if (at == FSDP_F32) {
        fsdp_cpu_swiglu_backward(dgate, dup, dout, gate, up, n);
    } else {
        float g[K_TILE], u[K_TILE];
        for (size_t i = 0; i < n; i += K_TILE) {
            size_t t = n - i < K_TILE ? n - i : K_TILE;
            fsdp_cpu_swiglu_backward(dgate + i, dup + i, dout + i, k_tile_in(g, gate, i, t),
                                     k_tile_in(u, up, i, t), t);
        }
    }
    k_leave(d);
}

static size_t k_gqa_attention_scratch_floats(struct fsdp_device *d, int T, int NH, int NKV, int hs)
{
    (void)d;
    return fsdp_cpu_gqa_attention_scratch_floats(T, NH, NKV, hs);
}

static void k_gqa_attention_forward(struct fsdp_device *d, void *out, float *lse, float *scratch,
                                    const void *qkv, enum fsdp_dtype at, int B, int T, int NH,
                                    int NKV, int hs)
{
    const void *p[] = {out, lse, scratch, qkv};
    k_enter(d, p, 3, 4);
    if (at == FSDP_F32) {
        fsdp_cpu_gqa_attention_forward(out, lse, scratch, qkv, B, T, NH, NKV, hs);
    } else {
        k_att16_forward(d, out, lse, scratch, qkv, B, T, NH, NKV, hs);
    }
    k_leave(d);
}

static void k_gqa_attention_backward(struct fsdp_device *d, float *dqkv, float *scratch,
                                     const float *dout, const void *qkv, const void *out,
                                     const float *lse, enum fsdp_dtype at, int B, int T, int NH,
                                     int NKV, int hs)
{
    const void *p[] = {dqkv, scratch, dout, qkv, out, lse};
    k_enter(d, p, 2, 6);
    if (at == FSDP_F32) {
        fsdp_cpu_gqa_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, NH, NKV, hs);
    } else {
        k_att16_backward(d, dqkv, scratch, dout, qkv, out, lse, B, T, NH, NKV, hs);
    }
    k_leave(d);
}

static void k_embed_gather(struct fsdp_device *d, float *out, const int32_t *tokens,
                           const void *table, enum fsdp_dtype pt, size_t N, size_t C)
{
    const void *p[] = {out, tokens, table};
    k_enter(d, p, 1, 3);
    if (pt == FSDP_F32) {
        fsdp_cpu_embed_gather(out, tokens, table, N, C);
    } else {
        k_rows16(out, tokens, table, N, C, pt);
    }
    k_leave(d);
}

static void k_embed_scatter_add(struct fsdp_device *d, float *dtable, const float *dout,
                                const int32_t *tokens, size_t N, size_t C)
{
    const void *p[] = {dtable, dout, tokens};
    k_enter(d, p, 1, 3);
    fsdp_cpu_embed_scatter_add(dtable, dout, tokens, N, C);
    k_leave(d);
}

static void k_attention_decode(struct fsdp_device *d, float *out, float *scores, const float *q,
                               const float *kcache, const float *vcache, int n, int NH, int NKV,
                               int hs, int ld)
{
    const void *p[] = {out, scores, q, kcache, vcache};
    k_enter(d, p, 2, 5);
    fsdp_cpu_attention_decode(out, scores, q, kcache, vcache, n, NH, NKV, hs, ld);
    k_leave(d);
}

static void k_accumulate(struct fsdp_device *d, float *y, const float *x, size_t n)
{
    const void *p[] = {y, x};
    k_enter(d, p, 1, 2);
    fsdp_cpu_accumulate(y, x, n);
    k_leave(d);
}

static void k_accumulate16(struct fsdp_device *d, float *y, const uint16_t *x, size_t n, int bf16,
                           int accumulate)
{
    const void *p[] = {y, x};
    k_enter(d, p, 1, 2);
    fsdp_cpu_accumulate16(y, x, n, bf16, accumulate);
    k_leave(d);
}

static void k_loss_sum(struct fsdp_device *d, double *acc, const float *losses,
                       const int32_t *targets, size_t N, int32_t ignore_index)
{
    const void *p[] = {acc, losses, targets};
    k_enter(d, p, 1, 3);
    fsdp_cpu_loss_sum(acc, losses, targets, N, ignore_index);
    k_leave(d);
}

static void k_xent_losses(struct fsdp_device *d, float *losses, const float *stats,
                          const float *target_logit, const int32_t *targets, size_t N,
                          int32_t ignore_index)
{
    const void *p[] = {losses, stats, target_logit, targets};
    k_enter(d, p, 1, 4);
    fsdp_cpu_xent_losses(losses, stats, target_logit, targets, N, ignore_index);
    k_leave(d);
}

static void k_xent_combine(struct fsdp_device *d, int phase, float *stats, float *zt, float *mx,
                           float *sz, size_t N, int have)
{
    const void *p[] = {stats, zt, mx, sz};
    k_enter(d, p, 4, 4);
    fsdp_cpu_xent_combine(phase, stats, zt, mx, sz, N, have);
    k_leave(d);
}

static void k_fill(struct fsdp_device *d, float *x, size_t n, size_t stride, float value)
{
    const void *p[] = {x};
    k_enter(d, p, 1, 1);
    fsdp_cpu_fill(x, n, stride, value);
    k_leave(d);
}

static const struct fsdp_kernels cpu_kernels = {
    .size = sizeof(struct fsdp_kernels),
    .encoder_forward = k_encoder_forward,
    .encoder_backward = k_encoder_backward,
    .layernorm_forward = k_layernorm_forward,
    .layernorm_backward = k_layernorm_backward,
    .matmul_forward = k_matmul_forward,
    .matmul_backward = k_matmul_backward,
    .attention_scratch_floats = k_attention_scratch_floats,
    .attention_forward = k_attention_forward,
    .attention_backward = k_attention_backward,
    .gelu_forward = k_gelu_forward,
    .gelu_backward = k_gelu_backward,
    .crossentropy_forward = k_crossentropy_forward,
    .crossentropy_backward = k_crossentropy_backward,
    .adamw_update = k_adamw_update,
    .sumsq = k_sumsq,
    .scale = k_scale,
    .narrow_inplace = k_narrow_inplace,
    .widen_inplace = k_widen_inplace,
    .f32_to_bf16 = k_f32_to_bf16,
    .bf16_to_f32 = k_bf16_to_f32,
    .f32_to_f16 = k_f32_to_f16,
    .f16_to_f32 = k_f16_to_f32,
    .embed_rows_forward = k_embed_rows_forward,
    .embed_rows_backward = k_embed_rows_backward,
    .crossentropy_slice_forward = k_crossentropy_slice_forward,
    .crossentropy_slice_backward = k_crossentropy_slice_backward,
    .bias_residual_forward = k_bias_residual_forward,
    .rmsnorm_forward = k_rmsnorm_forward,
    .rmsnorm_backward = k_rmsnorm_backward,
    .rope_forward = k_rope_forward,
    .rope_backward = k_rope_backward,
    .swiglu_forward = k_swiglu_forward,
    .swiglu_backward = k_swiglu_backward,
    .gqa_attention_scratch_floats = k_gqa_attention_scratch_floats,
    .gqa_attention_forward = k_gqa_attention_forward,
    .gqa_attention_backward = k_gqa_attention_backward,
    .embed_gather = k_embed_gather,
    .embed_scatter_add = k_embed_scatter_add,
    .attention_decode = k_attention_decode,
    .accumulate = k_accumulate,
    .accumulate16 = k_accumulate16,
    .loss_sum = k_loss_sum,
    .xent_losses = k_xent_losses,
    .xent_combine = k_xent_combine,
    .fill = k_fill,
    .kstate_free = k_kstate_free,
};

const struct fsdp_kernels *fsdp_cpu_kernels(void)
{
    return &cpu_kernels;
}
