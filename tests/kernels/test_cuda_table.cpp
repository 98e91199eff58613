/*
 * test_cuda_table.cpp - the CUDA device's kernel table (src/compute/cuda/
 * table.cu), compiled as host C++ under the execution-model emulation
 * (compute/cuda/emu.h), entry by entry against the CPU table on the same
 * inputs: every entry is filled; the entries that copy, cast, look up or
 * add in the CPU's order give the CPU's bits (embeddings and their
 * gradients, casts in and out of place, accumulation, fills, the loss sum,
 * the matmuls, which the emulation runs on the CPU); the others agree
 * within 1e-5 relative to max(|ref|, rms(ref)), test_cuda_emu's rule.
 * Parameters are read from f32, bf16 and f16 storage.
 *
 * Both devices are the CPU device's ops (host memory) with a different
 * table, so the table's own logic is what is tested here: which kernel
 * each entry launches with which arguments, the 16-bit parameter paths,
 * its workspaces, and the chunked in-place casts.
 */
extern "C" {
#include "config.h"
#include "compute/device.h"
#include "compute/device_impl.h"
#include "compute/kernels.h"
#include "core/dtype.h"
#include "tests/tap.h"
const struct fsdp_kernels *fsdp_cuda_kernels(void);
}

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOL 1e-5

static uint64_t rng = 0x2545F4914F6CDD1DULL;

static double urand(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ULL << 52) - 1.0;
}

static struct fsdp_device cpu, emu; /* the CPU table; the CUDA table, emulated */

/* an output (or in-out) buffer: a for the CPU table, b for the CUDA one, equal at first */
struct pair {
    float *a, *b;
    size_t n;
};

static float *randf(size_t n, double scale, double shift)
{
    float *f = (float *)calloc(n ? n : 1, sizeof(float));
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(shift + scale * urand());
    }
    return f;
}

static pair mk(size_t n, double scale = 1.0, double shift = 0.0)
{
    pair p;
    p.a = randf(n, scale, shift);
    p.b = (float *)calloc(n ? n : 1, sizeof(float));
    memcpy(p.b, p.a, n * sizeof(float));
    p.n = n;
    return p;
}

/* b = a again, after a step that may differ in rounding, before one that must not */
static void sync(pair p)
{
    memcpy(p.b, p.a, p.n * sizeof(float));
}

static void rel(pair p)
{
    free(p.a);
    free(p.b);
}

/* the root mean square of p.a: the tensor's scale */
static double rms(pair p)
{
    double ss = 0.0;
    for (size_t i = 0; i < p.n; i++) {
        ss += (double)p.a[i] * (double)p.a[i];
    }
    return sqrt(ss / (double)(p.n ? p.n : 1));
}

/* 1 when b matches a: bit for bit (bits), else within TOL of the tensor's scale */
static int agree(const char *what, pair p, int bits)
{
    double floor_ = rms(p);
    for (size_t i = 0; i < p.n; i++) {
        double e = fabs((double)p.b[i] - (double)p.a[i]);
        int ok = bits ? memcmp(&p.a[i], &p.b[i], sizeof(float)) == 0
                      : e == 0.0 || e / fmax(fabs((double)p.a[i]), floor_ > 0 ? floor_ : 1e-30) <=
                                        TOL;
        if (!ok) {
            tap_diag("%s: [%zu] %.9g (cuda) vs %.9g (cpu)%s", what, i, (double)p.b[i],
                     (double)p.a[i], bits ? ", bits differ" : "");
            return 0;
        }
    }
    return 1;
}

/* p.a and p.b (bf16 values, widened) equal or one bf16 unit apart at the
 * tensor's scale: two f32 results within TOL may round to neighbours */
static int agree16(const char *what, pair p)
{
    double floor_ = rms(p);
    for (size_t i = 0; i < p.n; i++) {
        double e = fabs((double)p.b[i] - (double)p.a[i]);
        if (e > ldexp(fmax(fabs((double)p.a[i]), floor_), -7)) {
            tap_diag("%s: [%zu] %.9g (cuda) vs %.9g (cpu), more than a bf16 unit apart", what, i,
                     (double)p.b[i], (double)p.a[i]);
            return 0;
        }
    }
    return 1;
}

/* parameters of n values in pt, and the f32 values they hold */
struct param {
    void *p;
    float *f;
};

static param mkparam(size_t n, enum fsdp_dtype pt)
{
    param q;
    q.f = randf(n, 0.5, 1.0);
    if (pt == FSDP_F32) {
        q.p = q.f;
        return q;
    }
    uint16_t *h = (uint16_t *)calloc(n ? n : 1, sizeof(uint16_t));
    (pt == FSDP_BF16 ? fsdp_cpu_f32_to_bf16 : fsdp_cpu_f32_to_f16)(h, q.f, n);
    (pt == FSDP_BF16 ? fsdp_cpu_bf16_to_f32 : fsdp_cpu_f16_to_f32)(q.f, h, n);
    q.p = h;
    return q;
}

static void relparam(param q)
{
    if (q.p != (void *)q.f) {
        free(q.p);
    }
    free(q.f);
}

static int32_t *mktokens(size_t n, int V)
{
    int32_t *t = (int32_t *)malloc((n ? n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        t[i] = (int32_t)((i * 7 + (i % 3) * 5) % (size_t)V); /* repeats on purpose */
    }
    return t;
}

static const enum fsdp_dtype PTS[] = {FSDP_F32, FSDP_BF16, FSDP_F16};

// ----------------------------------------------------------------------------
// embeddings

static int embeddings(enum fsdp_dtype pt)
{
    const int B = 2, T = 5, C = 37, V = 11;
    size_t N = (size_t)B * T;
    int32_t *tok = mktokens(N, V);
    param wte = mkparam((size_t)V * C, pt), wpe = mkparam((size_t)(T + 1) * C, pt);
    pair out = mk(N * C), dwte = mk((size_t)V * C), dwpe = mk((size_t)(T + 1) * C);
    float *dout = randf(N * C, 1.0, 0.0);
    int ok = 1;
    cpu.k->encoder_forward(&cpu, out.a, tok, wte.p, wpe.p, pt, B, T, C);
    emu.k->encoder_forward(&emu, out.b, tok, wte.p, wpe.p, pt, B, T, C);
    ok &= agree("encoder_forward", out, 1);
    cpu.k->embed_gather(&cpu, out.a, tok, wte.p, pt, N, C);
    emu.k->embed_gather(&emu, out.b, tok, wte.p, pt, N, C);
    ok &= agree("embed_gather", out, 1);
    /* positions [1, 6) held: past T = 5, as with a context longer than the batch's */
    cpu.k->embed_rows_forward(&cpu, out.a, tok, wte.p, 2, 6, wpe.p, 1, 5, pt, N, T, C);
    emu.k->embed_rows_forward(&emu, out.b, tok, wte.p, 2, 6, wpe.p, 1, 5, pt, N, T, C);
    ok &= agree("embed_rows_forward (held rows)", out, 1);
    if (pt == FSDP_F32) { /* the gradients are f32 whatever the parameters' dtype */
        cpu.k->encoder_backward(&cpu, dwte.a, dwpe.a, dout, tok, B, T, C);
        emu.k->encoder_backward(&emu, dwte.b, dwpe.b, dout, tok, B, T, C);
        ok &= agree("encoder_backward dwte", dwte, 1) & agree("encoder_backward dwpe", dwpe, 1);
        cpu.k->embed_rows_backward(&cpu, dwte.a, dwpe.a, dout, tok, 2, 6, 1, 5, N, T, C);
        emu.k->embed_rows_backward(&emu, dwte.b, dwpe.b, dout, tok, 2, 6, 1, 5, N, T, C);
        ok &= agree("embed_rows_backward dwte", dwte, 1) &
              agree("embed_rows_backward dwpe", dwpe, 1);
        cpu.k->embed_scatter_add(&cpu, dwte.a, dout, tok, N, C);
        emu.k->embed_scatter_add(&emu, dwte.b, dout, tok, N, C);
        ok &= agree("embed_scatter_add", dwte, 1);
    }
    free(tok);
    free(dout);
    relparam(wte);
    relparam(wpe);
    rel(out);
    rel(dwte);
    rel(dwpe);
    return ok;
}

// ----------------------------------------------------------------------------
// norms, matmuls, the row-parallel bias

static int norms(enum fsdp_dtype pt)
{
    const size_t N = 9, C = 45;
    param w = mkparam(C, pt), b = mkparam(C, pt);
    float *inp = randf(N * C, 1.0, 0.2), *dout = randf(N * C, 1.0, 0.0);
    pair out = mk(N * C), mean = mk(N), rstd = mk(N), keep = mk(N * C);
    pair dinp = mk(N * C), dw = mk(C), db = mk(C);
    int ok = 1;
    const enum fsdp_dtype F = FSDP_F32;
    cpu.k->layernorm_forward(&cpu, out.a, mean.a, rstd.a, inp, F, F, w.p, b.p, pt, N, C, 1e-5f);
    emu.k->layernorm_forward(&emu, out.b, mean.b, rstd.b, inp, F, F, w.p, b.p, pt, N, C, 1e-5f);
    ok &= agree("layernorm_forward", out, 0) & agree("layernorm mean", mean, 0) &
          agree("layernorm rstd", rstd, 0);
    cpu.k->layernorm_backward(&cpu, dinp.a, dw.a, db.a, dout, inp, F, w.p, pt, mean.a, rstd.a, N,
                              C);
    emu.k->layernorm_backward(&emu, dinp.b, dw.b, db.b, dout, inp, F, w.p, pt, mean.a, rstd.a, N,
                              C);
    ok &= agree("layernorm_backward dinp", dinp, 0) & agree("layernorm_backward dweight", dw, 0) &
          agree("layernorm_backward dbias", db, 0);
    cpu.k->rmsnorm_forward(&cpu, out.a, rstd.a, keep.a, inp, F, F, w.p, pt, N, C, 1e-6f);
    emu.k->rmsnorm_forward(&emu, out.b, rstd.b, keep.b, inp, F, F, w.p, pt, N, C, 1e-6f);
    ok &= agree("rmsnorm_forward", out, 0) & agree("rmsnorm rstd", rstd, 0) &
          agree("rmsnorm keep", keep, 1);
    cpu.k->rmsnorm_backward(&cpu, dinp.a, dw.a, dout, inp, F, w.p, pt, rstd.a, N, C);
    emu.k->rmsnorm_backward(&emu, dinp.b, dw.b, dout, inp, F, w.p, pt, rstd.a, N, C);
    ok &= agree("rmsnorm_backward dinp", dinp, 0) & agree("rmsnorm_backward dweight", dw, 0);
    /* the backwards from a bf16 input (a saved activation), gradients f32 */
    uint16_t *i16 = (uint16_t *)calloc(N * C, 2);
    const enum fsdp_dtype H = FSDP_BF16;
    fsdp_cpu_f32_to_bf16(i16, inp, N * C);
    sync(dinp), sync(dw), sync(db);
    cpu.k->layernorm_backward(&cpu, dinp.a, dw.a, db.a, dout, i16, H, w.p, pt, mean.a, rstd.a, N,
                              C);
    emu.k->layernorm_backward(&emu, dinp.b, dw.b, db.b, dout, i16, H, w.p, pt, mean.a, rstd.a, N,
                              C);
    ok &= agree("layernorm_backward dinp (bf16 input)", dinp, 0) &
          agree("layernorm_backward dweight (bf16 input)", dw, 0) &
          agree("layernorm_backward dbias (bf16 input)", db, 0);
    sync(dinp), sync(dw);
    cpu.k->rmsnorm_backward(&cpu, dinp.a, dw.a, dout, i16, H, w.p, pt, rstd.a, N, C);
    emu.k->rmsnorm_backward(&emu, dinp.b, dw.b, dout, i16, H, w.p, pt, rstd.a, N, C);
    ok &= agree("rmsnorm_backward dinp (bf16 input)", dinp, 0) &
          agree("rmsnorm_backward dweight (bf16 input)", dw, 0);
    free(i16);
    cpu.k->bias_residual_forward(&cpu, out.a, inp, b.p, pt, dout, F, F, N, C);
    emu.k->bias_residual_forward(&emu, out.b, inp, b.p, pt, dout, F, F, N, C);
    ok &= agree("bias_residual_forward", out, 0);
    cpu.k->bias_residual_forward(&cpu, out.a, inp, NULL, pt, dout, F, F, N, C);
    emu.k->bias_residual_forward(&emu, out.b, inp, NULL, pt, dout, F, F, N, C);
    ok &= agree("bias_residual_forward without a bias", out, 0);
    free(inp);
    free(dout);
    relparam(w);
    relparam(b);
    pair all[] = {out, mean, rstd, keep, dinp, dw, db};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        rel(all[i]);
    }
    return ok;
}

static int matmuls(enum fsdp_dtype pt)
{
    const size_t N = 7, C = 33, OC = 20;
    param w = mkparam(OC * C, pt), b = mkparam(OC, pt);
    float *inp = randf(N * C, 1.0, 0.0), *dout = randf(N * OC, 1.0, 0.0);
    pair out = mk(N * OC), dinp = mk(N * C), dw = mk(OC * C), db = mk(OC);
    int ok = 1;
    cpu.k->matmul_forward(&cpu, out.a, FSDP_F32, inp, FSDP_F32, w.p, b.p, pt, NULL, N, C, OC);
    emu.k->matmul_forward(&emu, out.b, FSDP_F32, inp, FSDP_F32, w.p, b.p, pt, NULL, N, C, OC);
    ok &= agree("matmul_forward", out, 1);
    cpu.k->matmul_backward(&cpu, dinp.a, dw.a, db.a, dout, inp, FSDP_F32, w.p, pt, N, C, OC, 0.5f,
                           1);
    emu.k->matmul_backward(&emu, dinp.b, dw.b, db.b, dout, inp, FSDP_F32, w.p, pt, N, C, OC, 0.5f,
                           1);
    ok &= agree("matmul_backward dinp", dinp, 1) & agree("matmul_backward dweight", dw, 1) &
          agree("matmul_backward dbias", db, 1);
    /* bf16 activations (the emulation's product is the CPU's: bit for bit):
     * from a bf16 input to a bf16 and an f32 output, from an f32 input to
     * a bf16 output; the backward from a bf16 input */
    const enum fsdp_dtype F = FSDP_F32, H = FSDP_BF16;
    uint16_t *i16 = (uint16_t *)calloc(N * C, 2), *oa = (uint16_t *)calloc(N * OC, 2);
    uint16_t *ob = (uint16_t *)calloc(N * OC, 2);
    fsdp_cpu_f32_to_bf16(i16, inp, N * C);
    for (int m = 0; m < 3; m++) {
        enum fsdp_dtype it = m == 2 ? F : H, ot = m == 1 ? F : H;
        const void *x = it == H ? (const void *)i16 : (const void *)inp;
        cpu.k->matmul_forward(&cpu, ot == H ? (void *)oa : out.a, ot, x, it, w.p, b.p, pt, NULL, N,
                              C, OC);
        emu.k->matmul_forward(&emu, ot == H ? (void *)ob : out.b, ot, x, it, w.p, b.p, pt, NULL, N,
                              C, OC);
        if (ot == H) {
            fsdp_cpu_bf16_to_f32(out.a, oa, N * OC), fsdp_cpu_bf16_to_f32(out.b, ob, N * OC);
        }
        ok &= agree(m == 0   ? "matmul_forward (bf16 input and output)"
                    : m == 1 ? "matmul_forward (bf16 input)"
                             : "matmul_forward (bf16 output)",
                    out, 1);
    }
    cpu.k->matmul_backward(&cpu, dinp.a, dw.a, db.a, dout, i16, H, w.p, pt, N, C, OC, 0.5f, 1);
    emu.k->matmul_backward(&emu, dinp.b, dw.b, db.b, dout, i16, H, w.p, pt, N, C, OC, 0.5f, 1);
    ok &= agree("matmul_backward dinp (bf16 input)", dinp, 1) &
          agree("matmul_backward dweight (bf16 input)", dw, 1) &
          agree("matmul_backward dbias (bf16 input)", db, 1);
    free(i16), free(oa), free(ob);
    free(inp);
    free(dout);
    relparam(w);
    relparam(b);
    rel(out);
    rel(dinp);
    rel(dw);
    rel(db);
    return ok;
}

// ----------------------------------------------------------------------------
// attention

static int attention(int B, int T, int NH, int NKV, int hs)
{
    size_t QKV = (size_t)(NH + 2 * NKV) * hs, N = (size_t)B * T, Cq = (size_t)NH * hs;
    float *qkv = randf(N * QKV, 1.0, 0.0), *dout = randf(N * Cq, 1.0, 0.0);
    pair out = mk(N * Cq), lse = mk((size_t)B * NH * T), dqkv = mk(N * QKV);
    size_t sa = cpu.k->gqa_attention_scratch_floats(&cpu, T, NH, NKV, hs);
    size_t sb = emu.k->gqa_attention_scratch_floats(&emu, T, NH, NKV, hs);
    float *sca = randf(sa, 1.0, 0.0), *scb = randf(sb, 1.0, 0.0);
    int ok = 1;
    const enum fsdp_dtype F = FSDP_F32, H = FSDP_BF16;
    cpu.k->gqa_attention_forward(&cpu, out.a, lse.a, sca, qkv, F, B, T, NH, NKV, hs);
    emu.k->gqa_attention_forward(&emu, out.b, lse.b, scb, qkv, F, B, T, NH, NKV, hs);
    ok &= agree("gqa_attention_forward", out, 0) & agree("gqa_attention lse", lse, 0);
    cpu.k->gqa_attention_backward(&cpu, dqkv.a, sca, dout, qkv, out.a, lse.a, F, B, T, NH, NKV, hs);
    emu.k->gqa_attention_backward(&emu, dqkv.b, scb, dout, qkv, out.a, lse.a, F, B, T, NH, NKV, hs);
    ok &= agree("gqa_attention_backward", dqkv, 0);
    /* bf16 activations: qkv and out stored bf16 (out within a bf16 unit),
     * lse and d(qkv) f32 */
    uint16_t *q16 = (uint16_t *)calloc(N * QKV, 2), *oa = (uint16_t *)calloc(N * Cq, 2);
    uint16_t *ob = (uint16_t *)calloc(N * Cq, 2);
    fsdp_cpu_f32_to_bf16(q16, qkv, N * QKV);
    cpu.k->gqa_attention_forward(&cpu, oa, lse.a, sca, q16, H, B, T, NH, NKV, hs);
    emu.k->gqa_attention_forward(&emu, ob, lse.b, scb, q16, H, B, T, NH, NKV, hs);
    fsdp_cpu_bf16_to_f32(out.a, oa, N * Cq), fsdp_cpu_bf16_to_f32(out.b, ob, N * Cq);
    ok &= agree16("gqa_attention_forward (bf16)", out) & agree("gqa_attention lse (bf16)", lse, 0);
    cpu.k->gqa_attention_backward(&cpu, dqkv.a, sca, dout, q16, oa, lse.a, H, B, T, NH, NKV, hs);
    emu.k->gqa_attention_backward(&emu, dqkv.b, scb, dout, q16, oa, lse.a, H, B, T, NH, NKV, hs);
    ok &= agree("gqa_attention_backward (bf16 activations)", dqkv, 0);
    free(q16), free(oa), free(ob);
    if (NKV == NH) { /* the GPT-2 entries: the same layout with C = NH hs */
        size_t ma = cpu.k->attention_scratch_floats(&cpu, T);
        size_t mb = emu.k->attention_scratch_floats(&emu, T);
        float *mca = randf(ma, 1.0, 0.0), *mcb = randf(mb, 1.0, 0.0);
        cpu.k->attention_forward(&cpu, out.a, lse.a, mca, qkv, F, B, T, (int)Cq, NH);
        emu.k->attention_forward(&emu, out.b, lse.b, mcb, qkv, F, B, T, (int)Cq, NH);
        ok &= agree("attention_forward", out, 0) & agree("attention lse", lse, 0);
        cpu.k->attention_backward(&cpu, dqkv.a, mca, dout, qkv, out.a, lse.a, F, B, T, (int)Cq, NH);
        emu.k->attention_backward(&emu, dqkv.b, mcb, dout, qkv, out.a, lse.a, F, B, T, (int)Cq, NH);
        ok &= agree("attention_backward", dqkv, 0);
        free(mca);
        free(mcb);
    }
    /* decode: one query against a cache of T positions with row stride ld */
    int ld = NKV * hs + 3;
    float *q = randf(Cq, 1.0, 0.0), *kc = randf((size_t)T * ld, 1.0, 0.0);
    float *vc = randf((size_t)T * ld, 1.0, 0.0);
    pair o1 = mk(Cq), scores = mk((size_t)NH * T);
    cpu.k->attention_decode(&cpu, o1.a, scores.a, q, kc, vc, T, NH, NKV, hs, ld);
    emu.k->attention_decode(&emu, o1.b, scores.b, q, kc, vc, T, NH, NKV, hs, ld);
    ok &= agree("attention_decode", o1, 0);
    free(q), free(kc), free(vc), free(qkv), free(dout), free(sca), free(scb);
    rel(o1), rel(scores), rel(out), rel(lse), rel(dqkv);
    return ok;
}

// ----------------------------------------------------------------------------
// element-wise, loss, optimizer, casts, the engine's loops

static int elementwise(void)
{
    const size_t n = 1000;
    const int B = 2, T = 3, NH = 4, NKV = 2, hs = 8;
    float *x = randf(n, 2.0, 0.0), *y = randf(n, 1.0, 0.0), *z = randf(n, 1.0, 0.0);
    pair o = mk(n), o2 = mk(n);
    int ok = 1;
    const enum fsdp_dtype F = FSDP_F32;
    cpu.k->gelu_forward(&cpu, o.a, x, F, n), emu.k->gelu_forward(&emu, o.b, x, F, n);
    ok &= agree("gelu_forward", o, 0);
    cpu.k->gelu_backward(&cpu, o.a, x, y, F, n), emu.k->gelu_backward(&emu, o.b, x, y, F, n);
    ok &= agree("gelu_backward", o, 0);
    cpu.k->swiglu_forward(&cpu, o.a, x, y, F, n), emu.k->swiglu_forward(&emu, o.b, x, y, F, n);
    ok &= agree("swiglu_forward", o, 0);
    cpu.k->swiglu_backward(&cpu, o.a, o2.a, z, x, y, F, n);
    emu.k->swiglu_backward(&emu, o.b, o2.b, z, x, y, F, n);
    ok &= agree("swiglu_backward dgate", o, 0) & agree("swiglu_backward dup", o2, 0);
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * hs;
    pair qkv = mk(nq);
    float *cs = randf((size_t)T * hs / 2, 1.0, 0.0), *sn = randf((size_t)T * hs / 2, 1.0, 0.0);
    cpu.k->rope_forward(&cpu, qkv.a, cs, sn, B, T, NH, NKV, hs);
    emu.k->rope_forward(&emu, qkv.b, cs, sn, B, T, NH, NKV, hs);
    ok &= agree("rope_forward", qkv, 0);
    cpu.k->rope_backward(&cpu, qkv.a, cs, sn, B, T, NH, NKV, hs);
    emu.k->rope_backward(&emu, qkv.b, cs, sn, B, T, NH, NKV, hs);
    ok &= agree("rope_backward", qkv, 0);
    sync(o);
    cpu.k->scale(&cpu, o.a, n, 0.37f), emu.k->scale(&emu, o.b, n, 0.37f);
    ok &= agree("scale", o, 1);
    cpu.k->accumulate(&cpu, o.a, x, n), emu.k->accumulate(&emu, o.b, x, n);
    ok &= agree("accumulate", o, 1);
    cpu.k->fill(&cpu, o.a, n / 3, 3, -INFINITY), emu.k->fill(&emu, o.b, n / 3, 3, -INFINITY);
    ok &= agree("fill (strided)", o, 1);
    free(x), free(y), free(z), free(cs), free(sn);
    rel(o), rel(o2), rel(qkv);
    return ok;
}

/* The norms' forwards to a bf16 output (a saved activation) from a bf16
 * input (a store) and an f32 one (the residual stream's slot): outputs
 * within a bf16 unit of the CPU table's, statistics and RMSNorm's f32
 * kept copy within TOL. */
static int norms_act16(enum fsdp_dtype pt)
{
    const size_t N = 9, C = 45;
    const enum fsdp_dtype F = FSDP_F32, H = FSDP_BF16;
    param w = mkparam(C, pt), b = mkparam(C, pt);
    float *inp = randf(N * C, 1.0, 0.2);
    uint16_t *i16 = (uint16_t *)calloc(N * C, 2), *oa = (uint16_t *)calloc(N * C, 2);
    uint16_t *ob = (uint16_t *)calloc(N * C, 2);
    pair out = mk(N * C), mean = mk(N), rstd = mk(N), keep = mk(N * C);
    int ok = 1;
    fsdp_cpu_f32_to_bf16(i16, inp, N * C);
    for (int m = 0; m < 2; m++) {
        const void *x = m ? (const void *)inp : i16;
        enum fsdp_dtype it = m ? F : H;
        const char *in = m ? " from f32" : " from bf16";
        char what[96];
        cpu.k->layernorm_forward(&cpu, oa, mean.a, rstd.a, x, H, it, w.p, b.p, pt, N, C, 1e-5f);
        emu.k->layernorm_forward(&emu, ob, mean.b, rstd.b, x, H, it, w.p, b.p, pt, N, C, 1e-5f);
        fsdp_cpu_bf16_to_f32(out.a, oa, N * C), fsdp_cpu_bf16_to_f32(out.b, ob, N * C);
        snprintf(what, sizeof(what), "layernorm_forward (bf16 output%s)", in);
        ok &= agree16(what, out) & agree(what, mean, 0) & agree(what, rstd, 0);
        cpu.k->rmsnorm_forward(&cpu, oa, rstd.a, keep.a, x, H, it, w.p, pt, N, C, 1e-6f);
        emu.k->rmsnorm_forward(&emu, ob, rstd.b, keep.b, x, H, it, w.p, pt, N, C, 1e-6f);
        fsdp_cpu_bf16_to_f32(out.a, oa, N * C), fsdp_cpu_bf16_to_f32(out.b, ob, N * C);
        snprintf(what, sizeof(what), "rmsnorm_forward (bf16 output%s)", in);
        ok &= agree16(what, out) & agree(what, rstd, 0) & agree(what, keep, 1);
    }
    /* the residual add: to a bf16 output from a bf16 residual, and to an
     * f32 output from a bf16 residual (the f32 one within TOL) */
    float *part = randf(N * C, 1.0, 0.0);
    cpu.k->bias_residual_forward(&cpu, oa, part, b.p, pt, i16, H, H, N, C);
    emu.k->bias_residual_forward(&emu, ob, part, b.p, pt, i16, H, H, N, C);
    fsdp_cpu_bf16_to_f32(out.a, oa, N * C), fsdp_cpu_bf16_to_f32(out.b, ob, N * C);
    ok &= agree16("bias_residual_forward (bf16 output and residual)", out);
    cpu.k->bias_residual_forward(&cpu, out.a, part, b.p, pt, i16, F, H, N, C);
    emu.k->bias_residual_forward(&emu, out.b, part, b.p, pt, i16, F, H, N, C);
    ok &= agree("bias_residual_forward (bf16 residual)", out, 0);
    free(part);
    free(inp), free(i16), free(oa), free(ob);
    relparam(w);
    relparam(b);
    rel(out), rel(mean), rel(rstd), rel(keep);
    return ok;
}

/* casts out of place and in place (the chunked path: more than one chunk) */
/* GELU and SwiGLU on bf16 activations (stored bf16, gradients f32), as
 * the models call them with --activation-dtype bf16: the forwards' bf16
 * outputs within a bf16 unit of the CPU table's, the backwards' f32
 * gradients within TOL. */
static int elementwise_act16(void)
{
    const size_t n = 1001;
    const enum fsdp_dtype H = FSDP_BF16;
    float *x = randf(n, 2.0, 0.0), *y = randf(n, 1.0, 0.0), *z = randf(n, 1.0, 0.0);
    uint16_t *x16 = (uint16_t *)calloc(n, 2), *y16 = (uint16_t *)calloc(n, 2);
    uint16_t *oa = (uint16_t *)calloc(n, 2), *ob = (uint16_t *)calloc(n, 2);
    pair o = mk(n), o2 = mk(n);
    int ok = 1;
    fsdp_cpu_f32_to_bf16(x16, x, n), fsdp_cpu_f32_to_bf16(y16, y, n);
    cpu.k->gelu_forward(&cpu, oa, x16, H, n), emu.k->gelu_forward(&emu, ob, x16, H, n);
    fsdp_cpu_bf16_to_f32(o.a, oa, n), fsdp_cpu_bf16_to_f32(o.b, ob, n);
    ok &= agree16("gelu_forward (bf16)", o);
    cpu.k->gelu_backward(&cpu, o.a, x16, z, H, n), emu.k->gelu_backward(&emu, o.b, x16, z, H, n);
    ok &= agree("gelu_backward (bf16 activations)", o, 0);
    cpu.k->swiglu_forward(&cpu, oa, x16, y16, H, n),
        emu.k->swiglu_forward(&emu, ob, x16, y16, H, n);
    fsdp_cpu_bf16_to_f32(o.a, oa, n), fsdp_cpu_bf16_to_f32(o.b, ob, n);
    ok &= agree16("swiglu_forward (bf16)", o);
    cpu.k->swiglu_backward(&cpu, o.a, o2.a, z, x16, y16, H, n);
    emu.k->swiglu_backward(&emu, o.b, o2.b, z, x16, y16, H, n);
    ok &= agree("swiglu_backward dgate (bf16 activations)", o, 0) &
          agree("swiglu_backward dup (bf16 activations)", o2, 0);
    free(x), free(y), free(z), free(x16), free(y16), free(oa), free(ob);
    rel(o), rel(o2);
    return ok;
}

static int casts(void)
{
    int ok = 1;
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        const size_t n = ((size_t)1 << 20) + 1000; /* two chunks of the table's in-place casts */
        pair buf = mk(n, 100.0, 0.0);
        uint16_t *ha = (uint16_t *)malloc(n * 2), *hb = (uint16_t *)malloc(n * 2);
        const char *t = bf16 ? "bf16" : "f16";
        char what[64];
        (bf16 ? cpu.k->f32_to_bf16 : cpu.k->f32_to_f16)(&cpu, ha, buf.a, n);
        (bf16 ? emu.k->f32_to_bf16 : emu.k->f32_to_f16)(&emu, hb, buf.a, n);
        snprintf(what, sizeof(what), "f32 to %s", t);
        ok &= tap_ok(memcmp(ha, hb, n * 2) == 0, "cuda table: %s bit for bit", what);
        pair w = mk(n);
        (bf16 ? cpu.k->bf16_to_f32 : cpu.k->f16_to_f32)(&cpu, w.a, ha, n);
        (bf16 ? emu.k->bf16_to_f32 : emu.k->f16_to_f32)(&emu, w.b, ha, n);
        snprintf(what, sizeof(what), "%s to f32", t);
        ok &= agree(what, w, 1);
        cpu.k->accumulate16(&cpu, w.a, ha, n, bf16, 1);
        emu.k->accumulate16(&emu, w.b, ha, n, bf16, 1);
        ok &= agree("accumulate16", w, 1);
        cpu.k->narrow_inplace(&cpu, buf.a, n, bf16);
        emu.k->narrow_inplace(&emu, buf.b, n, bf16);
        ok &= tap_ok(memcmp(buf.a, buf.b, n * 2) == 0,
                     "cuda table: narrowing %zu values to %s in place, in chunks, bit for bit", n,
                     t);
        cpu.k->widen_inplace(&cpu, buf.a, n, bf16);
        emu.k->widen_inplace(&emu, buf.b, n, bf16);
        snprintf(what, sizeof(what), "widening %s in place", t);
        ok &= agree(what, buf, 1);
        free(ha), free(hb);
        rel(buf), rel(w);
    }
    return ok;
}

static int losses(void)
{
    const size_t N = 6, V = 53, n = 20, col0 = 17;
    int32_t tg[N] = {3, 52, -1, 17, 36, 0};
    float *logits = randf(N * V, 3.0, 0.0), *cols = randf(N * n, 3.0, 0.0);
    pair l = mk(N), st = mk(2 * N), dl = mk(N * V), zt = mk(N), mx = mk(N), sz = mk(2 * N);
    int ok = 1;
    cpu.k->crossentropy_forward(&cpu, l.a, st.a, logits, tg, N, V, -1);
    emu.k->crossentropy_forward(&emu, l.b, st.b, logits, tg, N, V, -1);
    ok &= agree("crossentropy_forward losses", l, 0) & agree("crossentropy_forward stats", st, 0);
    cpu.k->crossentropy_backward(&cpu, dl.a, logits, st.a, tg, N, V, -1, 0.25f);
    emu.k->crossentropy_backward(&emu, dl.b, logits, st.a, tg, N, V, -1, 0.25f);
    ok &= agree("crossentropy_backward", dl, 0);
    for (int first = 1; first >= 0; first--) {
        cpu.k->crossentropy_slice_forward(&cpu, st.a, zt.a, cols, tg, N, n, col0, -1, first);
        emu.k->crossentropy_slice_forward(&emu, st.b, zt.b, cols, tg, N, n, col0, -1, first);
        ok &= agree("crossentropy_slice_forward stats", st, 0) &
              agree("crossentropy_slice_forward target logits", zt, 0);
    }
    cpu.k->crossentropy_slice_backward(&cpu, dl.a, cols, st.a, tg, N, n, col0, -1, 0.5f);
    emu.k->crossentropy_slice_backward(&emu, dl.b, cols, st.a, tg, N, n, col0, -1, 0.5f);
    ok &= agree("crossentropy_slice_backward", dl, 0);
    for (int phase = 0; phase < 3; phase++) {
        cpu.k->xent_combine(&cpu, phase, st.a, zt.a, mx.a, sz.a, N, 1);
        emu.k->xent_combine(&emu, phase, st.b, zt.b, mx.b, sz.b, N, 1);
        ok &= agree("xent_combine maxima", mx, 0) & agree("xent_combine sums", sz, 0);
    }
    cpu.k->xent_losses(&cpu, l.a, st.a, zt.a, tg, N, -1);
    emu.k->xent_losses(&emu, l.b, st.a, zt.a, tg, N, -1);
    ok &= agree("xent_losses", l, 0);
    double acc[2] = {0.5, 0.5};
    cpu.k->loss_sum(&cpu, &acc[0], l.a, tg, N, -1);
    emu.k->loss_sum(&emu, &acc[1], l.a, tg, N, -1);
    ok &= tap_ok(acc[0] == acc[1], "cuda table: loss_sum adds the kept rows in the CPU's order "
                 "(%.17g vs %.17g)", acc[1], acc[0]);
    free(logits), free(cols);
    pair all[] = {l, st, dl, zt, mx, sz};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        rel(all[i]);
    }
    return ok;
}

static int optimizer(void)
{
    const size_t n = 777;
    struct fsdp_adamw_params hp = {};
    hp.lr = 1e-3f, hp.beta1 = 0.9f, hp.beta2 = 0.95f, hp.eps = 1e-8f, hp.weight_decay = 0.1f;
    hp.step = 3;
    float *g = randf(n, 1.0, 0.0);
    pair p = mk(n), m = mk(n, 0.1, 0.0), v = mk(n, 0.01, 0.02);
    cpu.k->adamw_update(&cpu, p.a, g, m.a, v.a, n, &hp, 1, 0.5f);
    emu.k->adamw_update(&emu, p.b, g, m.b, v.b, n, &hp, 1, 0.5f);
    int ok = agree("adamw param", p, 0) & agree("adamw m", m, 0) & agree("adamw v", v, 0);
    double s[2] = {1.0, 1.0};
    cpu.k->sumsq(&cpu, &s[0], g, n);
    emu.k->sumsq(&emu, &s[1], g, n);
    /* the CPU sums f32 lanes over 4096 terms before double, the GPU doubles in
     * a fixed tree: equal to the CPU's f32 rounding */
    ok &= tap_ok(fabs(s[0] - s[1]) <= 1e-6 * (s[0] - 1.0), "cuda table: sumsq into a device "
                 "double (%.17g vs %.17g)", s[1], s[0]);
    free(g);
    rel(p), rel(m), rel(v);
    return ok;
}

static int filled(void)
{
    const struct fsdp_kernels *t = emu.k;
    size_t nptr = (sizeof(*t) - offsetof(struct fsdp_kernels, encoder_forward)) / sizeof(void *);
    const unsigned char *base = (const unsigned char *)t + offsetof(struct fsdp_kernels,
                                                                    encoder_forward);
    size_t missing = 0;
    for (size_t i = 0; i < nptr; i++) {
        void *p;
        memcpy(&p, base + i * sizeof(void *), sizeof(p));
        missing += p == NULL;
    }
    return tap_ok(t->size == sizeof(*t) && missing == 0,
                  "cuda table: size %zu (want %zu), %zu of %zu entries missing", t->size,
                  sizeof(*t), missing, nptr);
}

/* attention with heads wider than the kernels take: the child stops with one line */
static void wide_heads(void)
{
    int fds[2];
    char msg[512] = "";
    if (pipe(fds) != 0) {
        tap_ok(0, "cuda table: a pipe for the wide-head check");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        const int hs = 136;
        float *x = randf((size_t)3 * hs, 1.0, 0.0), *o = randf(hs, 1.0, 0.0), lse[1];
        emu.k->gqa_attention_forward(&emu, o, lse, NULL, x, FSDP_F32, 1, 1, 1, 1, hs);
        _exit(0);
    }
    close(fds[1]);
    ssize_t got = read(fds[0], msg, sizeof(msg) - 1);
    msg[got > 0 ? got : 0] = 0;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    tap_ok(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(msg, "136 wide") &&
               strchr(msg, '\n') == msg + strlen(msg) - 1,
           "cuda table: heads 136 wide end the process with one line (%s)", msg);
}

/* matmul_forward with a residual and a bf16 output: the child stops with
 * the line every table says; and the backward without dweight widens no
 * bf16 input (only the weight gradient reads it, as on the CPU) */
static void matmul_contract(void)
{
    int fds[2];
    char msg[512] = "";
    if (pipe(fds) != 0) {
        tap_ok(0, "cuda table: a pipe for the matmul contract check");
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        float *x = randf(8, 1.0, 0.0);
        emu.k->matmul_forward(&emu, x, FSDP_BF16, x, FSDP_F32, x, NULL, FSDP_F32, x, 2, 2, 2);
        _exit(0);
    }
    close(fds[1]);
    ssize_t got = read(fds[0], msg, sizeof(msg) - 1);
    msg[got > 0 ? got : 0] = 0;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    int one = WIFEXITED(st) && WEXITSTATUS(st) == 1 &&
              strstr(msg, "matmul_forward with a residual writes f32, not bf16") &&
              strchr(msg, '\n') == msg + strlen(msg) - 1;
    msg[strcspn(msg, "\n")] = 0;
    tap_ok(one,
           "cuda table: a residual with a bf16 output ends the process with the CPU table's "
           "line (%s)",
           msg);
    const size_t N = 7, C = 33, OC = 20;
    float *w = randf(OC * C, 1.0, 0.0), *dout = randf(N * OC, 1.0, 0.0);
    uint16_t *i16 = (uint16_t *)calloc(N * C, 2);
    pair dinp = mk(N * C);
    if (emu.kstate) {
        emu.k->kstate_free(&emu);
    }
    size_t before = emu.stats.bytes_now;
    cpu.k->matmul_backward(&cpu, dinp.a, NULL, NULL, dout, i16, FSDP_BF16, w, FSDP_F32, N, C, OC,
                           1.0f, 0);
    emu.k->matmul_backward(&emu, dinp.b, NULL, NULL, dout, i16, FSDP_BF16, w, FSDP_F32, N, C, OC,
                           1.0f, 0);
    size_t grew = emu.stats.bytes_now - before;
    tap_ok(agree("matmul_backward dinp alone (bf16 input)", dinp, 1) & (grew == 0),
           "cuda table: the backward without dweight widens no bf16 input (%zu bytes of "
           "workspace), dinp the CPU's",
           grew);
    rel(dinp);
    free(w), free(dout), free(i16);
}

int main(void)
{
    fsdp_cpu_device_init(&cpu, 0);
    fsdp_cpu_device_init(&emu, 0);
    emu.k = fsdp_cuda_kernels();
    filled();
    for (int i = 0; i < 3; i++) {
        const char *t = fsdp_dtype_name(PTS[i]);
        tap_ok(embeddings(PTS[i]), "cuda table: embeddings from %s parameters%s", t,
               PTS[i] == FSDP_F32 ? ", and their gradients" : "");
        tap_ok(norms(PTS[i]), "cuda table: layer and RMS norms, the row-parallel bias (%s)", t);
        tap_ok(norms_act16(PTS[i]),
               "cuda table: the norms' forwards and the residual add on bf16 activations (%s)", t);
        tap_ok(matmuls(PTS[i]), "cuda table: matmuls (%s)", t);
    }
    const int shapes[][5] = {{1, 1, 2, 2, 8}, {2, 17, 4, 4, 8}, {1, 33, 6, 2, 16}, {2, 9, 3, 1, 24}};
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        const int *s = shapes[i];
        tap_ok(attention(s[0], s[1], s[2], s[3], s[4]),
               "cuda table: attention B=%d T=%d NH=%d NKV=%d hs=%d (and decode)", s[0], s[1],
               s[2], s[3], s[4]);
    }
    tap_ok(elementwise(), "cuda table: GELU, SwiGLU, RoPE, scale, accumulate, fill");
    tap_ok(elementwise_act16(), "cuda table: GELU and SwiGLU on bf16 activations");
    casts();
    tap_ok(losses(), "cuda table: cross-entropy whole and by slices, the combination, loss rows");
    tap_ok(optimizer(), "cuda table: AdamW");
    wide_heads();
    matmul_contract();
    /* the emulated table's workspaces go with its state */
    if (emu.kstate) {
        emu.k->kstate_free(&emu);
    }
    tap_ok(emu.kstate == NULL && emu.stats.bytes_now == 0,
           "cuda table: its workspaces freed with its state (%zu bytes left)", emu.stats.bytes_now);
    return tap_done();
}
