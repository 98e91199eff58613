/*
 * lm_tp.c - the tensor-parallel regions of a transformer LM's blocks
 * (lm.h; tp/tp_ops.h; doc/model.md, "Tensor parallelism"): entering a
 * column-parallel product and leaving a row-parallel one, with and without
 * sequence parallelism, the norms' parameter gradients over a rank's rows,
 * the final norm's rows, and the heads check before a cut (the cut of each
 * placement is the plan's, tp/tp_plan.h); and the residual stream's views,
 * with its bf16 store's loads and saves (--activation-dtype bf16).
 * Without tensor parallelism every region is the plain product. It moves
 * activations only, through the model's workspace views (fsdp_lm_bind).
 */
#include "config.h"
#include "model/lm.h"
#include "core/error.h"

#include <assert.h>
#include <stddef.h>

int fsdp_lm_tp_enter(struct fsdp_lm *lm, float *x, const uint16_t *st, size_t BT, const void **in,
                     enum fsdp_dtype *it)
{
    if (!lm->sp) { /* the product reads the store */
        *in = fsdp_lm_act(x, (uint16_t *)st);
        *it = st ? lm->adt : FSDP_F32;
        return 0;
    }
    /* the all-gather moves f32 rows: the store widened into x first */
    fsdp_lm_act_widen(lm, x, st, fsdp_lm_rows_here(lm, BT) * lm->C);
    FSDP_CHECK(fsdp_tp_seq_gather_forward(lm->tp, x, lm->xfull, BT / (size_t)lm->tpn, lm->C));
    *in = lm->xfull;
    *it = FSDP_F32;
    return 0;
}

int fsdp_lm_tp_dout(struct fsdp_lm *lm, size_t BT, const float **dout)
{
    if (!lm->sp) {
        *dout = lm->dres;
        return 0;
    }
    FSDP_CHECK(fsdp_tp_seq_scatter_backward(lm->tp, lm->dres, lm->dbtc, BT / (size_t)lm->tpn,
                                            lm->C));
    *dout = lm->dbtc;
    return 0;
}

int fsdp_lm_tp_din(struct fsdp_lm *lm, size_t BT, const float **din)
{
    if (!lm->sp) {
        FSDP_CHECK(fsdp_tp_copy_in_backward(lm->tp, lm->dbtc, BT * lm->C));
        *din = lm->dbtc;
        return 0;
    }
    FSDP_CHECK(fsdp_tp_seq_gather_backward(lm->tp, lm->dbtc, lm->xfull, BT / (size_t)lm->tpn,
                                           lm->C));
    *din = lm->xfull;
    return 0;
}

int fsdp_lm_sp_norm_grads(struct fsdp_lm *lm, float *const *dst, int n)
{
    size_t C = lm->C;
    FSDP_CHECK(fsdp_tp_all_reduce(lm->tp, lm->spg, (size_t)n * C, FSDP_SUM));
    for (int j = 0; j < n; j++) {
        lm->k->accumulate(lm->dev, dst[j], lm->spg + (size_t)j * C, C);
    }
    return 0;
}

int fsdp_lm_row_parallel(struct fsdp_lm *lm, float *out, uint16_t *st, const void *inp,
                         enum fsdp_dtype it, const void *w, const void *bias, enum fsdp_dtype pt,
                         const float *residual, const uint16_t *rst, size_t BT, size_t K)
{
    size_t C = lm->C, BR = fsdp_lm_rows_here(lm, BT);
    enum fsdp_dtype at = st ? lm->adt : FSDP_F32, rt = rst ? lm->adt : FSDP_F32;
    const void *res = rst ? (const void *)rst : (const void *)residual;
    if (!lm->tp) {
        lm->k->matmul_forward(lm->dev, out, FSDP_F32, inp, it, w, bias, pt, residual, BT, K, C);
        fsdp_lm_act_keep(lm, st, out, BT * C);
        return 0;
    }
    float *part = lm->dbtc;
    lm->k->matmul_forward(lm->dev, part, FSDP_F32, inp, it, w, NULL, pt, NULL, BT, K, C);
    if (lm->sp) {
        FSDP_CHECK(fsdp_tp_seq_scatter_forward(lm->tp, part, out, BR, C));
        part = out;
    } else {
        FSDP_CHECK(fsdp_tp_reduce_out_forward(lm->tp, part, BT * C));
    }
    /* the sum goes to the store where there is one: nothing reads out's f32 copy after (it was the
     * reduce-scatter's target with sequence parallelism) */
    lm->k->bias_residual_forward(lm->dev, fsdp_lm_act(out, st), part, bias, pt, res, at, rt, BR, C);
    return 0;
}

int fsdp_lm_residual_first(const struct fsdp_lm *lm)
{
    return lm->stage_lo > 0 ? lm->stage_lo - 1 : 0;
}

size_t fsdp_lm_residual_slots(const struct fsdp_lm *lm)
{
    int last = lm->stage_hi < lm->L ? lm->stage_hi : lm->L;
    return (size_t)(last - fsdp_lm_residual_first(lm) + 1);
}

/* residual[l]'s slot among those held (l must be one of them). */
static size_t lm_residual_slot(const struct fsdp_lm *lm, int l)
{
    const int first = fsdp_lm_residual_first(lm);
    assert(l >= first && (size_t)(l - first) < fsdp_lm_residual_slots(lm));
    return (size_t)(l - first);
}

float *fsdp_lm_residual(const struct fsdp_lm *lm, int l)
{
    size_t BT = (size_t)lm->max_B * (size_t)lm->max_T;
    size_t at = lm->residual16 ? (size_t)(l & 1) : lm_residual_slot(lm, l);
    return lm->residual + at * fsdp_lm_rows_here(lm, BT) * lm->C;
}

/* Stored residual[l] (bf16 activations), slots of n values. */
static uint16_t *lm_residual16(const struct fsdp_lm *lm, int l, size_t n)
{
    return lm->residual16 + lm_residual_slot(lm, l) * n;
}

/* Only the current batch's rows move: a smaller batch uses the leading
 * part of each (max_B, max_T) tensor. */
void fsdp_lm_residual_load(const struct fsdp_lm *lm, int l)
{
    if (!lm->residual16) {
        return;
    }
    size_t BT = (size_t)lm->max_B * (size_t)lm->max_T, n = fsdp_lm_rows_here(lm, BT) * lm->C;
    size_t cur = fsdp_lm_rows_here(lm, (size_t)lm->B * (size_t)lm->T) * lm->C;
    lm->k->bf16_to_f32(lm->dev, fsdp_lm_residual(lm, l), lm_residual16(lm, l, n), cur);
}

void fsdp_lm_residual_save(const struct fsdp_lm *lm, int l)
{
    if (!lm->residual16) {
        return;
    }
    size_t BT = (size_t)lm->max_B * (size_t)lm->max_T, n = fsdp_lm_rows_here(lm, BT) * lm->C;
    size_t cur = fsdp_lm_rows_here(lm, (size_t)lm->B * (size_t)lm->T) * lm->C;
    lm->k->f32_to_bf16(lm->dev, lm_residual16(lm, l, n), fsdp_lm_residual(lm, l), cur);
}

void fsdp_lm_act_keep(const struct fsdp_lm *lm, uint16_t *st, float *x, size_t n)
{
    if (st) {
        lm->k->f32_to_bf16(lm->dev, st, x, n);
        lm->k->bf16_to_f32(lm->dev, x, st, n);
    }
}

void fsdp_lm_act_store(const struct fsdp_lm *lm, uint16_t *st, const float *x, size_t n)
{
    if (st) {
        lm->k->f32_to_bf16(lm->dev, st, x, n);
    }
}

void fsdp_lm_act_widen(const struct fsdp_lm *lm, float *x, const uint16_t *st, size_t n)
{
    if (st) {
        lm->k->bf16_to_f32(lm->dev, x, st, n);
    }
}

float *fsdp_lm_lnf_mine(const struct fsdp_lm *lm, float *lnf, size_t BT)
{
    return lnf + (lm->sp ? (size_t)lm->tp->rank * fsdp_lm_rows_here(lm, BT) * lm->C : 0);
}

int fsdp_lm_lnf_gather(struct fsdp_lm *lm, const float *mine, float *lnf, size_t BT)
{
    if (lm->sp) {
        FSDP_CHECK(fsdp_tp_seq_gather_forward(lm->tp, mine, lnf, fsdp_lm_rows_here(lm, BT),
                                              lm->C));
    }
    return 0;
}

int fsdp_lm_tp_check_heads(int n_head, int tp)
{
    if (tp > n_head) {
        return fsdp_err(FSDP_ERR_INVALID, "tp %d is larger than n_head %d: every tensor-parallel "
                        "rank needs at least one attention head", tp, n_head);
    }
    if (n_head % tp != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "n_head %d is not divisible by tp %d: attention is "
                        "split by heads", n_head, tp);
    }
    return 0;
}
