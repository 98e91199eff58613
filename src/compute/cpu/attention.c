/*
 * attention.c - causal self-attention forward and backward: multi-head
 * (GPT-2) and grouped-query (the Llama family), one implementation.
 *
 * Per (batch, key/value head) the queries are taken in tiles: rows [i0, i1)
 * of every query head that shares the key/value head, stacked head after
 * head. A tile only sees keys [0, i1), so each tile is three or five sgemm
 * calls on (rows x i1) score tiles and the masked upper triangle is mostly
 * never computed (about 60% of the full T x T products at T = 256 with 64
 * rows a head). Forward keeps only each row's log-sum-exp; backward
 * recomputes the probabilities P = exp(S - lse) tile by tile, flash-attention
 * style, so the saved state is O(T) per head instead of O(T^2).
 *
 * Backward, per tile, with D_i = dO_i . O_i:
 *   dP = dO V^T,  dS = P * (dP - D),  dQ = scale dS K,
 *   dK += scale dS^T Q,  dV += P^T dO
 * Tiles run from the last to the first: the last covers every key row, so
 * its dK/dV products initialise those rows (beta = 0) and the caller's dqkv
 * needs no zeroing.
 */
#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

/* A tile holds CPU_ATT_ROWS query rows, CPU_ATT_ROWS / group of each head
 * of the group (at least CPU_ATT_MIN_ROWS). Measured at T = 256, hs = 64 on
 * one AVX-512 core, forward + backward against one head a tile: group 2
 * with 32 rows a head is about 7% faster, with 64 rows a head (128-row
 * tiles) only about 4% (those leave OpenBLAS's small-matrix kernels for its
 * packing path), and the finer causal blocks skip more of the masked
 * triangle; group 1 with 32 rows was no faster than with 64. */
#define CPU_ATT_ROWS 64
#define CPU_ATT_MIN_ROWS 16

/* query rows of each head in a full tile */
static size_t cpu_att_head_rows(size_t group)
{
    size_t n = CPU_ATT_ROWS / group;
    return n < CPU_ATT_MIN_ROWS ? CPU_ATT_MIN_ROWS : n;
}

size_t fsdp_cpu_gqa_attention_scratch_floats(int T, int NH, int NKV, int hs)
{
    /* two (rows, T) tiles: scores/probabilities and their gradient in the
     * backward; the score tile and the row sums' inverses in the forward.
     * For group > 1 two (rows, hs) panels more: the stacked heads' q and dO
     * (or O) */
    size_t group = (size_t)(NH / NKV), rows = group * cpu_att_head_rows(group);
    return 2 * rows * (size_t)T + (group > 1 ? 2 * rows * (size_t)hs : 0);
}

size_t fsdp_cpu_attention_scratch_floats(int T)
{
    return fsdp_cpu_gqa_attention_scratch_floats(T, 1, 1, 0);
}

/*
 * row[0..n) <- exp(row - max), row[n..ld) <- 0; *sum gets their sum and the
 * return value is the row's log-sum-exp. The 1/sum normalisation is applied
 * to the (hs-wide) output row instead of the (n-wide) probability row.
 */
static float cpu_softmax_row(float *row, size_t n, size_t ld, float *sum)
{
    float m = cpu_row_max(row, n);
    float s = cpu_row_expsum(row, row, m, n);
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
 * are never repeated per query head, and a tile reads its group's K/V once
 * for all the group's heads.
 *
 * The heads' q (and dO, O, dQ) columns sit side by side in a row, so for
 * group > 1 a tile copies them to and from (rows, hs) panels, head after
 * head: hs floats a row against i1 * hs multiply-adds per product row. With
 * group = 1 the tile reads and writes the head's columns in place.
 */
struct cpu_att_tile {
    size_t i0, nb, i1; /* query rows [i0, i1) of each head; nb = i1 - i0 */
    size_t rows;       /* group * nb, the tile's product rows */
};

static void cpu_att_tile_at(struct cpu_att_tile *t, size_t i0, size_t T, size_t group)
{
    size_t n = cpu_att_head_rows(group);
    t->i0 = i0;
    t->nb = T - i0 < n ? T - i0 : n;
    t->i1 = i0 + t->nb;
    t->rows = group * t->nb;
}

/* dst[0..n) <- s * src[0..n); inline because a memcpy call per 64-float
 * row cost as much as the copy itself */
static void cpu_att_copy_row(float *dst, const float *src, size_t n, float s)
{
    size_t i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vstore(dst + i, cpu_vload(src + i) * s);
    }
    for (; i < n; i++) {
        dst[i] = src[i] * s;
    }
}

/* panel (rows, hs) <- rows [i0, i1) of the group's heads in src (row stride ld) */
static void cpu_att_pack(float *panel, const float *src, size_t ld, const struct cpu_att_tile *t,
                         size_t group, size_t hs)
{
    for (size_t j = 0; j < group; j++) {
        for (size_t r = 0; r < t->nb; r++) {
            cpu_att_copy_row(panel + (j * t->nb + r) * hs, src + (t->i0 + r) * ld + j * hs, hs,
                             1.0f);
        }
    }
}

/* the inverse of cpu_att_pack, panel row m scaled by scale[m] (or by 1) */
static void cpu_att_unpack(float *dst, size_t ld, const float *panel, const float *scale,
                           const struct cpu_att_tile *t, size_t group, size_t hs)
{
    for (size_t j = 0; j < group; j++) {
        for (size_t r = 0; r < t->nb; r++) {
            size_t m = j * t->nb + r;
            cpu_att_copy_row(dst + (t->i0 + r) * ld + j * hs, panel + m * hs, hs,
                             scale ? scale[m] : 1.0f);
        }
    }
}

/* One forward tile of a group: q, o point at its first query head's
 * columns, k, v at its key/value head's, l at its first head's lse row. */
static void cpu_attention_forward_tile(float *o, float *l, float *scratch, const float *q,
                                       const float *k, const float *v,
                                       const struct cpu_att_tile *t, size_t T, size_t C,
                                       size_t ld, size_t group, size_t hs)
{
    size_t M = group * cpu_att_head_rows(group), nb = t->nb, i1 = t->i1;
    float scale = 1.0f / sqrtf((float)hs);
    float *S = scratch;      /* (rows, i1) */
    float *inv = S + M * T;  /* (rows) 1 / row sums */
    float *qp = inv + M;     /* (rows, hs) group > 1 only */
    float *op = qp + M * hs; /* (rows, hs) group > 1 only */
    const float *qt = q + t->i0 * ld;
    float *ot = o + t->i0 * C;
    size_t ldq = ld, ldo = C;
    if (group > 1) {
        cpu_att_pack(qp, q, ld, t, group, hs);
        qt = qp, ot = op, ldq = ldo = hs;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->rows, (int)i1, (int)hs, scale,
                qt, (int)ldq, k, (int)ld, 0.0f, S, (int)i1);
    for (size_t m = 0; m < t->rows; m++) {
        size_t j = m / nb, i = t->i0 + m % nb;
        float sum;
        l[j * T + i] = cpu_softmax_row(S + m * i1, i + 1, i1, &sum);
        inv[m] = 1.0f / sum;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t->rows, (int)hs, (int)i1, 1.0f,
                S, (int)i1, v, (int)ld, 0.0f, ot, (int)ldo);
    if (group > 1) {
        cpu_att_unpack(o, C, op, inv, t, group, hs);
        return;
    }
    for (size_t m = 0; m < t->rows; m++) {
        cpu_scale_row(ot + m * ldo, hs, inv[m]);
    }
}

static void cpu_attention_forward(float *out, float *lse, float *scratch, const float *qkv,
                                  size_t B, size_t T, size_t NH, size_t NKV, size_t hs)
{
    size_t C = NH * hs, KV = NKV * hs, ld = C + 2 * KV, group = NH / NKV;
    size_t n = cpu_att_head_rows(group);
    struct cpu_att_tile t;
    for (size_t b = 0; b < B; b++) {
        for (size_t g = 0; g < NKV; g++) {
            const float *q = qkv + b * T * ld + g * group * hs;
            const float *k = qkv + b * T * ld + C + g * hs, *v = k + KV;
            float *o = out + b * T * C + g * group * hs;
            float *l = lse + (b * NH + g * group) * T;
            for (size_t i0 = 0; i0 < T; i0 += n) {
                cpu_att_tile_at(&t, i0, T, group);
                cpu_attention_forward_tile(o, l, scratch, q, k, v, &t, T, C, ld, group, hs);
            }
        }
    }
}

/* The pointers of one backward tile: as in the forward, q, dq, dout, o and
 * l at the group's first query head; k, v, dk, dv at its key/value head. */
struct cpu_att_bwd {
    const float *q, *k, *v, *dout, *o, *l;
    float *dq, *dk, *dv;
};

/* One backward tile of a group; beta is 0 for the group's first tile (the
 * last rows, which see every key row) and 1 for the others. */
static void cpu_attention_backward_tile(const struct cpu_att_bwd *p, float *scratch,
                                        const struct cpu_att_tile *t, float beta, size_t T,
                                        size_t C, size_t ld, size_t group, size_t hs)
{
    size_t M = group * cpu_att_head_rows(group), nb = t->nb, i1 = t->i1;
    float scale = 1.0f / sqrtf((float)hs);
    float *P = scratch, *dP = P + M * T; /* (rows, i1) each */
    float *qp = dP + M * T;              /* (rows, hs) group > 1 only; then dQ */
    float *dop = qp + M * hs;            /* (rows, hs) group > 1 only */
    const float *qt = p->q + t->i0 * ld, *dot = p->dout + t->i0 * C;
    float *dqt = p->dq + t->i0 * ld;
    size_t ldq = ld, lddo = C;
    if (group > 1) {
        cpu_att_pack(qp, p->q, ld, t, group, hs);
        cpu_att_pack(dop, p->dout, C, t, group, hs);
        qt = dqt = qp, dot = dop, ldq = lddo = hs;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->rows, (int)i1, (int)hs, scale,
                qt, (int)ldq, p->k, (int)ld, 0.0f, P, (int)i1);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t->rows, (int)i1, (int)hs, 1.0f,
                dot, (int)lddo, p->v, (int)ld, 0.0f, dP, (int)i1);
    for (size_t m = 0; m < t->rows; m++) {
        size_t j = m / nb, i = t->i0 + m % nb;
        const float *orow = p->o + i * C + j * hs, *dorow = p->dout + i * C + j * hs;
        cpu_prob_row(P + m * i1, i + 1, i1, p->l[j * T + i]);
        cpu_dscore_row(dP + m * i1, P + m * i1, i + 1, i1, dorow, orow, hs);
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)i1, (int)hs, (int)t->rows, scale,
                dP, (int)i1, qt, (int)ldq, beta, p->dk, (int)ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)i1, (int)hs, (int)t->rows, 1.0f, P,
                (int)i1, dot, (int)lddo, beta, p->dv, (int)ld);
    /* after dK: for group > 1, dQ overwrites the q panel */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t->rows, (int)hs, (int)i1, scale,
                dP, (int)i1, p->k, (int)ld, 0.0f, dqt, (int)ldq);
    if (group > 1) {
        cpu_att_unpack(p->dq, ld, qp, NULL, t, group, hs);
    }
}

static void cpu_attention_backward(float *dqkv, float *scratch, const float *dout,
                                   const float *qkv, const float *out, const float *lse,
                                   size_t B, size_t T, size_t NH, size_t NKV, size_t hs)
{
    size_t C = NH * hs, KV = NKV * hs, ld = C + 2 * KV, group = NH / NKV;
    size_t n = cpu_att_head_rows(group), nblk = (T + n - 1) / n;
    struct cpu_att_tile t;
    for (size_t b = 0; b < B; b++) {
        for (size_t g = 0; g < NKV; g++) {
            size_t qoff = b * T * ld + g * group * hs, kvoff = b * T * ld + C + g * hs;
            size_t ooff = b * T * C + g * group * hs;
            struct cpu_att_bwd p = {
                .q = qkv + qoff, .k = qkv + kvoff, .v = qkv + kvoff + KV,
                .dout = dout + ooff, .o = out + ooff, .l = lse + (b * NH + g * group) * T,
                .dq = dqkv + qoff, .dk = dqkv + kvoff, .dv = dqkv + kvoff + KV,
            };
            for (size_t blk = nblk; blk-- > 0;) {
                cpu_att_tile_at(&t, blk * n, T, group);
                cpu_attention_backward_tile(&p, scratch, &t, blk == nblk - 1 ? 0.0f : 1.0f, T, C,
                                            ld, group, hs);
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
