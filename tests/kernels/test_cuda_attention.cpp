/*
 * test_cuda_attention.cpp - the CUDA attention kernels (compute/cuda/
 * attention.cu), compiled as host C++ under the execution-model emulation
 * (compute/cuda/emu.h), against the CPU kernels of kernels.h: the
 * multi-head and grouped-query forward (out and lse) and backward (dqkv,
 * which must be overwritten whole), and the one-position decode.
 *
 * Shapes are awkward on purpose: T = 1, 2, 17, 65 and 130 (one row, less
 * than a tile, and tile counts that leave a partial last tile for the
 * 16-row blocks, the 32-key tiles and the 32-row query tiles alike);
 * B = 1 and 2; heads 4/4, 4/2, 6/1 and 3/3 (query/kv), so a group spans
 * 1, 2, 6 heads and NH is not a multiple of anything; hs = 8, 16, 24, 32,
 * 64 and 128 (the widest). Decode runs n = 1, 5, 33 and 161 cached rows
 * (past the 128 keys that the block's four warps take in one round).
 *
 * Every case runs twice, blocks, warps and lanes scheduled first to last
 * and last to first, so a missing barrier shows in one order or the other,
 * and the two runs must agree bit for bit (no atomics: every sum has one
 * order). Tolerance against the CPU: 1e-5 relative to max(|ref|, rms(ref))
 * as in test_cuda_emu; the kernels differ from the CPU's only in the order
 * of their sums, the online softmax's rescaling and libm's exp.
 */
extern "C" {
#include "config.h"
#include "compute/kernels.h"
#include "tests/tap.h"
}
#include "compute/cuda/attention_cuda.h"
#include "compute/cuda/common.cuh"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-5

static uint64_t att_rng = 0x2545F4914F6CDD1DULL;

/* n floats uniform in [-scale, scale) */
static float *att_rand(size_t n, float scale)
{
    float *f = (float *)malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        att_rng ^= att_rng << 13;
        att_rng ^= att_rng >> 7;
        att_rng ^= att_rng << 17;
        f[i] = scale * (float)((double)(att_rng >> 11) / (double)(1ULL << 52) - 1.0);
    }
    return f;
}

/* the largest relative error seen per result, for the summary */
enum { W_OUT, W_LSE, W_DQKV, W_DECODE, W_KINDS };
static const char *att_worst_name[W_KINDS] = {"out", "lse", "dqkv", "decode"};
static double att_worst[W_KINDS];

/* 1 when got is within TOL of ref, relative to max(|ref|, rms(ref)); else
 * prints the largest errors and the first bad index */
static int att_close(const char *what, const float *got, const float *ref, size_t n, int kind)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        ss += (double)ref[i] * (double)ref[i];
    }
    double rms = n ? sqrt(ss / (double)n) : 0.0, max_abs = 0.0, max_rel = 0.0;
    size_t bad = n;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        double den = fmax(fabs((double)ref[i]), rms > 0.0 ? rms : 1e-30);
        double rel = e == 0.0 ? 0.0 : e / den;
        if (!(rel <= TOL) && bad == n) {
            bad = i;
        }
        max_abs = e != e || e > max_abs ? e : max_abs; /* NaN shows */
        max_rel = rel != rel || rel > max_rel ? rel : max_rel;
    }
    if (max_rel != max_rel || max_rel > att_worst[kind]) {
        att_worst[kind] = max_rel;
    }
    if (bad < n) {
        tap_diag("%s: max abs %.3g, max rel %.3g (tol %.0e); first bad [%zu]: %.9g vs %.9g", what,
                 max_abs, max_rel, TOL, bad, (double)got[bad], (double)ref[bad]);
    }
    return bad == n;
}

/* the two scheduling orders' results must be the same bits */
static int att_same(const char *what, const float *a, const float *b, size_t n)
{
    if (memcmp(a, b, n * sizeof(float)) == 0) {
        return 1;
    }
    size_t i = 0;
    while (memcmp(a + i, b + i, sizeof(float)) == 0) {
        i++;
    }
    tap_diag("%s: the two orders differ first at [%zu]: %.9g vs %.9g", what, i, (double)a[i],
             (double)b[i]);
    return 0;
}

// ----------------------------------------------------------------------------
// forward and backward

struct att_shape {
    int B, T, NH, NKV, hs;
};

/* The CPU's results on the same inputs; the backward takes the CPU's out and lse. */
struct att_ref {
    float *out, *lse, *dqkv;
};

static void att_cpu(struct att_ref *r, const struct att_shape *s, const float *qkv,
                    const float *dout, size_t n_qkv, size_t n_out, size_t n_lse)
{
    float *scratch =
        att_rand(fsdp_cpu_gqa_attention_scratch_floats(s->T, s->NH, s->NKV, s->hs), 1.0f);
    r->out = att_rand(n_out, 1.0f), r->lse = att_rand(n_lse, 1.0f);
    r->dqkv = att_rand(n_qkv, 1.0f);
    if (s->NH == s->NKV) {
        int C = s->NH * s->hs;
        fsdp_cpu_attention_forward(r->out, r->lse, scratch, qkv, s->B, s->T, C, s->NH);
        fsdp_cpu_attention_backward(r->dqkv, scratch, dout, qkv, r->out, r->lse, s->B, s->T, C,
                                    s->NH);
    } else {
        fsdp_cpu_gqa_attention_forward(r->out, r->lse, scratch, qkv, s->B, s->T, s->NH, s->NKV,
                                       s->hs);
        fsdp_cpu_gqa_attention_backward(r->dqkv, scratch, dout, qkv, r->out, r->lse, s->B, s->T,
                                        s->NH, s->NKV, s->hs);
    }
    free(scratch);
}

/* The CUDA kernels in one order: through the multi-head entries when
 * mha (NH = NKV), else the grouped-query ones. out, lse, dqkv start as
 * garbage, so an element a kernel leaves out shows. */
static void att_cuda(struct att_ref *g, const struct att_shape *s, int mha, const float *qkv,
                     const float *dout, const struct att_ref *ref, size_t n_qkv, size_t n_out,
                     size_t n_lse)
{
    size_t ns = mha ? fsdp_cuda_attention_scratch_floats(s->T)
                    : fsdp_cuda_gqa_attention_scratch_floats(s->T, s->NH, s->NKV, s->hs);
    float *scratch = ns ? att_rand(ns, 1.0f) : NULL;
    g->out = att_rand(n_out, 9.0f), g->lse = att_rand(n_lse, 9.0f), g->dqkv = att_rand(n_qkv, 9.0f);
    if (mha) {
        int C = s->NH * s->hs;
        fsdp_cuda_attention_forward(g->out, g->lse, scratch, qkv, s->B, s->T, C, s->NH, NULL);
        fsdp_cuda_attention_backward(g->dqkv, scratch, dout, qkv, ref->out, ref->lse, s->B, s->T, C,
                                     s->NH, NULL);
    } else {
        fsdp_cuda_gqa_attention_forward(g->out, g->lse, scratch, qkv, s->B, s->T, s->NH, s->NKV,
                                        s->hs, NULL);
        fsdp_cuda_gqa_attention_backward(g->dqkv, scratch, dout, qkv, ref->out, ref->lse, s->B,
                                         s->T, s->NH, s->NKV, s->hs, NULL);
    }
    free(scratch);
}

static void att_free(struct att_ref *r)
{
    free(r->out), free(r->lse), free(r->dqkv);
}

/* forward and backward of one shape, both orders; mha picks the entries */
static int att_case(const struct att_shape *s, int mha)
{
    size_t ld = (size_t)(s->NH + 2 * s->NKV) * (size_t)s->hs;
    size_t n_qkv = (size_t)s->B * (size_t)s->T * ld;
    size_t n_out = (size_t)s->B * (size_t)s->T * (size_t)s->NH * (size_t)s->hs;
    size_t n_lse = (size_t)s->B * (size_t)s->NH * (size_t)s->T;
    float *qkv = att_rand(n_qkv, 2.0f), *dout = att_rand(n_out, 1.0f);
    struct att_ref ref, got[2];
    att_cpu(&ref, s, qkv, dout, n_qkv, n_out, n_lse);
    int ok = 1;
    for (int o = 0; o < 2; o++) {
        fsdp_emu_order = o;
        att_cuda(&got[o], s, mha, qkv, dout, &ref, n_qkv, n_out, n_lse);
        char what[64];
        snprintf(what, sizeof(what), "%s order %d", "out", o);
        ok &= att_close(what, got[o].out, ref.out, n_out, W_OUT);
        snprintf(what, sizeof(what), "%s order %d", "lse", o);
        ok &= att_close(what, got[o].lse, ref.lse, n_lse, W_LSE);
        snprintf(what, sizeof(what), "%s order %d", "dqkv", o);
        ok &= att_close(what, got[o].dqkv, ref.dqkv, n_qkv, W_DQKV);
    }
    ok &= att_same("out", got[0].out, got[1].out, n_out);
    ok &= att_same("lse", got[0].lse, got[1].lse, n_lse);
    ok &= att_same("dqkv", got[0].dqkv, got[1].dqkv, n_qkv);
    att_free(&ref), att_free(&got[0]), att_free(&got[1]);
    free(qkv), free(dout);
    return ok;
}

static void test_forward_backward(void)
{
    static const int Ts[] = {1, 2, 17, 65, 130};
    static const int heads[][2] = {{4, 4}, {4, 2}, {6, 1}, {3, 3}};
    static const int hss[] = {8, 16, 24, 32, 64};
    int n = 0;
    for (int t = 0; t < 5; t++) {
        for (int k = 0; k < 4; k++, n++) {
            /* each T with both B and four of the hs; each head layout with every hs */
            struct att_shape s = {1 + n % 2, Ts[t], heads[k][0], heads[k][1], hss[(t + k) % 5]};
            int mha = s.NH == s.NKV && n % 3 != 0; /* NH = NKV also through the gqa entries */
            tap_ok(att_case(&s, mha),
                   "%s attention forward+backward B=%d T=%d NH=%d NKV=%d hs=%d (both orders)",
                   mha ? "multi-head" : "grouped-query", s.B, s.T, s.NH, s.NKV, s.hs);
        }
    }
    /* the widest head: above 48 KiB of shared memory in the backward */
    struct att_shape wide = {1, 40, 2, 1, FSDP_CUDA_ATTENTION_MAX_HS};
    tap_ok(att_case(&wide, 0),
           "grouped-query attention forward+backward B=1 T=40 NH=2 NKV=1 "
           "hs=%d (both orders)",
           wide.hs);
}

// ----------------------------------------------------------------------------
// decode

/* q against n cached rows; interleaved: k and v share rows of a wider
 * cache (ld past 2 NKV hs), else two tight caches (ld = NKV hs, as the
 * models keep them) */
static int decode_case(int n, int NH, int NKV, int hs, int interleaved)
{
    size_t KV = (size_t)NKV * (size_t)hs, ld = interleaved ? 2 * KV + 3 : KV;
    float *q = att_rand((size_t)NH * (size_t)hs, 2.0f);
    float *kc = att_rand((size_t)n * ld, 2.0f), *vc = att_rand((size_t)n * ld, 1.0f);
    const float *kp = kc, *vp = interleaved ? kc + KV : vc;
    float *scores = att_rand((size_t)n, 1.0f), *ref = att_rand((size_t)NH * (size_t)hs, 1.0f);
    fsdp_cpu_attention_decode(ref, scores, q, kp, vp, n, NH, NKV, hs, (int)ld);
    float *got[2];
    int ok = 1;
    for (int o = 0; o < 2; o++) {
        fsdp_emu_order = o;
        got[o] = att_rand((size_t)NH * (size_t)hs, 9.0f);
        fsdp_cuda_attention_decode(got[o], scores, q, kp, vp, n, NH, NKV, hs, (int)ld, NULL);
        ok &= att_close(o ? "decode order 1" : "decode order 0", got[o], ref,
                        (size_t)NH * (size_t)hs, W_DECODE);
    }
    ok &= att_same("decode", got[0], got[1], (size_t)NH * (size_t)hs);
    free(q), free(kc), free(vc), free(scores), free(ref), free(got[0]), free(got[1]);
    return ok;
}

static void test_decode(void)
{
    static const int ns[] = {1, 5, 33, 161};
    static const int heads[][2] = {{4, 4}, {4, 2}, {6, 1}, {3, 3}};
    static const int hss[] = {8, 24, 64, 128};
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < 4; k++) {
            int hs = hss[(i + k) % 4], il = (i + k) % 2;
            tap_ok(decode_case(ns[i], heads[k][0], heads[k][1], hs, il),
                   "attention decode n=%d NH=%d NKV=%d hs=%d, %s cache (both orders)", ns[i],
                   heads[k][0], heads[k][1], hs, il ? "interleaved" : "tight");
        }
    }
}

// ----------------------------------------------------------------------------
// limits

/* no scratch; a head wider than the kernels hold gives NaN, not stale values */
static void test_limits(void)
{
    tap_ok(fsdp_cuda_attention_scratch_floats(4096) == 0 &&
               fsdp_cuda_gqa_attention_scratch_floats(4096, 32, 8, 128) == 0,
           "the attention kernels need no scratch");
    int hs = FSDP_CUDA_ATTENTION_MAX_HS + 8, T = 3, NH = 2;
    size_t n_out = (size_t)T * (size_t)NH * (size_t)hs, n_qkv = 3 * n_out;
    float *qkv = att_rand(n_qkv, 1.0f), *out = att_rand(n_out, 1.0f);
    float *lse = att_rand((size_t)NH * (size_t)T, 1.0f), *dqkv = att_rand(n_qkv, 1.0f);
    fsdp_cuda_gqa_attention_forward(out, lse, NULL, qkv, 1, T, NH, NH, hs, NULL);
    fsdp_cuda_gqa_attention_backward(dqkv, NULL, out, qkv, out, lse, 1, T, NH, NH, hs, NULL);
    int nan = 1;
    for (size_t i = 0; i < n_qkv; i++) {
        nan &= isnan(dqkv[i]) && (i >= n_out || isnan(out[i])) &&
               (i >= (size_t)(NH * T) || isnan(lse[i]));
    }
    tap_ok(nan, "hs=%d (past the widest head): out, lse and dqkv are NaN", hs);
    free(qkv), free(out), free(lse), free(dqkv);
}

int main(void)
{
    test_forward_backward();
    test_decode();
    test_limits();
    for (int k = 0; k < W_KINDS; k++) {
        tap_diag("largest relative error, %s: %.3g (tolerance %.0e)", att_worst_name[k],
                 att_worst[k], TOL);
    }
    return tap_done();
}
