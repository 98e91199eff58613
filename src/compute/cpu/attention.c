/*
 * attention.c - causal self-attention forward and backward: multi-head
 * (GPT-2) and grouped-query (the Llama family), one implementation.
 *
 * Per (batch, head) the queries are taken in blocks of CPU_ATT_BLOCK rows.
 * A block of rows [i0, i1) only sees keys [0, i1), so each block is three
 * or five sgemm calls on (block x i1) score tiles and the masked upper
 * triangle is mostly never computed (about 60% of the full T x T products
 * at T = 256). Forward keeps only each row's log-sum-exp; backward recomputes
 * the probabilities P = exp(S - lse) tile by tile, flash-attention style, so
 * the saved state is O(T) per head instead of O(T^2).
 *
 * Backward, per tile, with D_i = dO_i . O_i:
 *   dP = dO V^T,  dS = P * (dP - D),  dQ = scale dS K,
 *   dK += scale dS^T Q,  dV += P^T dO
 * Tiles run from the last block to the first: the last block covers every
 * key row, so its dK/dV products initialise those rows (beta = 0) and the
 * caller's dqkv needs no zeroing.
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#define CPU_ATT_BLOCK 64 /* query rows per tile */

size_t fsdp_cpu_attention_scratch_floats(int T)
{
    /* two (block, T) tiles: scores/probabilities and their gradient in the
     * backward; the score tile and the row sums' inverses in the forward */
    return 2 * (size_t)CPU_ATT_BLOCK * (size_t)T;
}

/*
 * row[0..n) <- exp(row - max), row[n..ld) <- 0; *sum gets their sum and the
 * return value is the row's log-sum-exp. The 1/sum normalisation is applied
 * to the (hs-wide) output row instead of the (n-wide) probability row.
 */
static float cpu_softmax_row(float *row, size_t n, size_t ld, float *sum)
{
    size_t i = 0;
    cpu_vf vm = cpu_vset1(-INFINITY);
    for (; i + CPU_VW <= n; i += CPU_VW) {
        vm = cpu_vmax(vm, cpu_vload(row + i));
    }
    float m = cpu_vhmax(vm);
    for (; i < n; i++) {
        m = row[i] > m ? row[i] : m;
    }
    cpu_vf vs = cpu_vset1(0.0f);
    for (i = 0; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf e = cpu_vexp(cpu_vload(row + i) - m);
        vs += e;
        cpu_vstore(row + i, e);
    }
    if (i < n) {
        cpu_vf e = cpu_vexp(cpu_vload_tail(row + i, n - i, 0.0f) - m);
        e = cpu_vselect(cpu_vtail_mask(n - i), e, cpu_vset1(0.0f));
        vs += e;
        cpu_vstore_tail(row + i, n - i, e);
    }
    float s = cpu_vhsum(vs);
    memset(row + n, 0, (ld - n) * sizeof(float));
    *sum = s;
    return m + logf(s);
}

/* row[0..n) <- exp(row - lse), row[n..ld) <- 0 */
static void cpu_prob_row(float *row, size_t n, size_t ld, float lse)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vstore(row + i, cpu_vexp(cpu_vload(row + i) - lse));
    }
    if (i < n) {
        cpu_vstore_tail(row + i, n - i, cpu_vexp(cpu_vload_tail(row + i, n - i, 0.0f) - lse));
    }
    memset(row + n, 0, (ld - n) * sizeof(float));
}

static void cpu_scale_row(float *x, size_t n, float s)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vstore(x + i, cpu_vload(x + i) * s);
    }
    for (; i < n; i++) {
        x[i] *= s;
    }
}

/* dp[0..n) <- p * (dp - D) with D = do . o; dp[n..ld) <- 0 */
static void cpu_dscore_row(float *dp, const float *p, size_t n, size_t ld, const float *dout,
                           const float *out, size_t hs)
{
    /* partial sums, not one running sum: the in-order sum is a serial
     * chain of shuffles and adds that cost as much as the rest of the row */
    cpu_vf acc = cpu_vset1(0.0f);
    size_t i = 0;
    for (; i + CPU_VW <= hs; i += CPU_VW) {
        acc += cpu_vload(dout + i) * cpu_vload(out + i);
    }
    float D = cpu_vhsum(acc);
    for (; i < hs; i++) {
        D += dout[i] * out[i];
    }
    i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vstore(dp + i, cpu_vload(p + i) * (cpu_vload(dp + i) - D));
    }
    for (; i < n; i++) {
        dp[i] = p[i] * (dp[i] - D);
    }
    memset(dp + n, 0, (ld - n) * sizeof(float));
}

/*
 * The general form: rows of qkv hold [q (NH heads) | k (NKV heads) | v (NKV
 * heads)], each head hs wide; query head h reads key/value head h / (NH /
 * NKV) (grouped-query attention; NKV = NH is multi-head attention). K and V
 * are never repeated per query head: each query head's tiles read its
 * group's columns in place.
 */
static void cpu_attention_forward(float *out, float *lse, float *scratch, const float *qkv,
                                  size_t B, size_t T, size_t NH, size_t NKV, size_t hs)
{
    size_t C = NH * hs, KV = NKV * hs, ld = C + 2 * KV, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
    float *S = scratch;                              /* (block, i1) */
    float *inv = scratch + (size_t)CPU_ATT_BLOCK * T; /* (block) 1 / row sums */
    for (size_t b = 0; b < B; b++) {
        for (size_t h = 0; h < NH; h++) {
            const float *q = qkv + b * T * ld + h * hs;
            const float *k = qkv + b * T * ld + C + (h / group) * hs, *v = k + KV;
            float *o = out + b * T * C + h * hs;
            float *l = lse + (b * NH + h) * T;
            for (size_t i0 = 0; i0 < T; i0 += CPU_ATT_BLOCK) {
                size_t nb = T - i0 < CPU_ATT_BLOCK ? T - i0 : CPU_ATT_BLOCK;
                size_t i1 = i0 + nb;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)i1, (int)hs,
                            scale, q + i0 * ld, (int)ld, k, (int)ld, 0.0f, S, (int)i1);
                for (size_t r = 0; r < nb; r++) {
                    float sum;
                    l[i0 + r] = cpu_softmax_row(S + r * i1, i0 + r + 1, i1, &sum);
                    inv[r] = 1.0f / sum;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, (int)hs, (int)i1,
                            1.0f, S, (int)i1, v, (int)ld, 0.0f, o + i0 * C, (int)C);
                for (size_t r = 0; r < nb; r++) {
                    cpu_scale_row(o + (i0 + r) * C, hs, inv[r]);
                }
            }
        }
    }
}

/* dK and dV of a key/value head collect the tiles of every query head of
 * its group: the first tile to reach a row (the last block of the group's
 * first head) initialises it (beta = 0), every later one adds. */
static void cpu_attention_backward(float *dqkv, float *scratch, const float *dout,
                                   const float *qkv, const float *out, const float *lse,
                                   size_t B, size_t T, size_t NH, size_t NKV, size_t hs)
{
    size_t C = NH * hs, KV = NKV * hs, ld = C + 2 * KV, group = NH / NKV;
    float scale = 1.0f / sqrtf((float)hs);
    float *P = scratch, *dP = scratch + (size_t)CPU_ATT_BLOCK * T; /* (block, i1) each */
    size_t nblk = (T + CPU_ATT_BLOCK - 1) / CPU_ATT_BLOCK;
    for (size_t b = 0; b < B; b++) {
        for (size_t h = 0; h < NH; h++) {
            size_t qoff = b * T * ld + h * hs, kvoff = b * T * ld + C + (h / group) * hs;
            size_t ooff = b * T * C + h * hs;
            const float *q = qkv + qoff, *k = qkv + kvoff, *v = k + KV;
            float *dq = dqkv + qoff, *dk = dqkv + kvoff, *dv = dk + KV;
            const float *o = out + ooff, *dout_h = dout + ooff;
            const float *l = lse + (b * NH + h) * T;
            for (size_t blk = nblk; blk-- > 0;) {
                size_t i0 = blk * CPU_ATT_BLOCK;
                size_t nb = T - i0 < CPU_ATT_BLOCK ? T - i0 : CPU_ATT_BLOCK;
                size_t i1 = i0 + nb;
                float beta = blk == nblk - 1 && h % group == 0 ? 0.0f : 1.0f;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)i1, (int)hs,
                            scale, q + i0 * ld, (int)ld, k, (int)ld, 0.0f, P, (int)i1);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)i1, (int)hs,
                            1.0f, dout_h + i0 * C, (int)C, v, (int)ld, 0.0f, dP, (int)i1);
                for (size_t r = 0; r < nb; r++) {
                    size_t i = i0 + r;
                    cpu_prob_row(P + r * i1, i + 1, i1, l[i]);
                    cpu_dscore_row(dP + r * i1, P + r * i1, i + 1, i1, dout_h + i * C, o + i * C, hs);
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, (int)hs, (int)i1,
                            scale, dP, (int)i1, k, (int)ld, 0.0f, dq + i0 * ld, (int)ld);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)i1, (int)hs, (int)nb,
                            scale, dP, (int)i1, q + i0 * ld, (int)ld, beta, dk, (int)ld);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)i1, (int)hs, (int)nb,
                            1.0f, P, (int)i1, dout_h + i0 * C, (int)C, beta, dv, (int)ld);
            }
        }
    }
}

void fsdp_cpu_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int B,
                                int T, int C, int NH)
{
    cpu_attention_forward(out, lse, scratch, qkv, (size_t)B, (size_t)T, (size_t)NH, (size_t)NH,
                          (size_t)(C / NH));
}

void fsdp_cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                 const float *out, const float *lse, int B, int T, int C, int NH)
{
    cpu_attention_backward(dqkv, scratch, dout, qkv, out, lse, (size_t)B, (size_t)T, (size_t)NH,
                           (size_t)NH, (size_t)(C / NH));
}

void fsdp_cpu_gqa_attention_forward(float *out, float *lse, float *scratch, const float *qkv,
                                    int B, int T, int NH, int NKV, int hs)
{
    cpu_attention_forward(out, lse, scratch, qkv, (size_t)B, (size_t)T, (size_t)NH, (size_t)NKV,
                          (size_t)hs);
}

void fsdp_cpu_gqa_attention_backward(float *dqkv, float *scratch, const float *dout,
                                     const float *qkv, const float *out, const float *lse, int B,
                                     int T, int NH, int NKV, int hs)
{
    cpu_attention_backward(dqkv, scratch, dout, qkv, out, lse, (size_t)B, (size_t)T, (size_t)NH,
                           (size_t)NKV, (size_t)hs);
}
