/*
 * gpt2_head.c - GPT-2's final layer norm and LM head with its loss (unit
 * L+1), over tiles of the head's rows and vocabulary slices with an online
 * log-sum-exp (fsdp_gpt2_set_head_chunk), split by vocabulary over tp ranks
 * (the parallel cross-entropy) or, with a tied head, over the ranks holding
 * unit 0's rows (fsdp_gpt2_set_unit_rows), and the logits of the last
 * forward. It reads the head's parameters through the unit buffers only.
 */
#include "config.h"
#include "model/gpt2_head.h"
#include "tp/tp_ops.h"
#include "core/error.h"

#include <math.h>
#include <string.h>

/* The head's logits budget in floats: head_chunk rows of V. */
static size_t gpt2_head_budget(const struct fsdp_gpt2 *m)
{
    return (size_t)m->head_chunk * (size_t)m->cfg->vocab_size;
}

/*
 * One tile of the head's logits for R rows and Vh columns: everything when
 * it fits the budget, else every row and the widest slice of 16-column
 * multiples that fits, else 16 columns and as many rows as fit.
 */
static void gpt2_head_tile(const struct fsdp_gpt2 *m, size_t R, size_t Vh, size_t *rows,
                           size_t *cols)
{
    size_t budget = gpt2_head_budget(m);
    if (R == 0 || Vh == 0 || R * Vh <= budget) {
        *rows = R;
        *cols = Vh;
        return;
    }
    size_t c = budget / R;
    c -= c % 16;
    c = c < 16 ? 16 : c;
    c = c > Vh ? Vh : c;
    size_t r = budget / c;
    *rows = r < 1 ? 1 : r > R ? R : r;
    *cols = c;
}

size_t fsdp_gpt2_head_tile_floats(const struct fsdp_gpt2 *m)
{
    size_t BT = (size_t)m->lm.max_B * (size_t)m->lm.max_T;
    size_t all = gpt2_head_R(m, BT) * gpt2_head_V(m), budget = gpt2_head_budget(m);
    budget = budget < 16 ? 16 : budget;
    return all < budget ? all : budget;
}

/* The head's weight rows (the vocabulary [v0, v0 + Vh) it holds) and their
 * gradient: unit 0's wte rows when split by vocabulary, else the whole
 * lm_head (wte when tied). */
static void gpt2_head_weights(const struct fsdp_gpt2 *m, int with_grad, struct fsdp_lm_mem *w,
                              float **dw, size_t *v0)
{
    int last = m->cfg->n_layer + 1;
    if (gpt2_vp_head(m)) {
        struct fsdp_lm_mem p = fsdp_lm_params(&m->lm, 0);
        *w = (struct fsdp_lm_mem){fsdp_lm_at(p, m->wte_at), p.pt};
        *dw = with_grad ? m->lm.unit_grads[0] + m->wte_at : NULL;
        *v0 = m->wte_row0;
        return;
    }
    struct fsdp_gpt2_head_view hv, dhv;
    fsdp_gpt2_head_view(m, fsdp_lm_params(&m->lm, last), fsdp_lm_params(&m->lm, 0), &hv);
    *w = (struct fsdp_lm_mem){hv.lm_head, hv.pt};
    *dw = NULL;
    if (with_grad) {
        fsdp_gpt2_head_view(m, fsdp_lm_grads(&m->lm, last), fsdp_lm_grads(&m->lm, 0), &dhv);
        *dw = dhv.lm_head;
    }
    *v0 = m->lm.tp ? m->lm.tv0 : 0; /* tensor parallel: this rank's slice of the vocabulary */
}

/* logits (rows, n) of X's rows against weight rows [c0, c0 + n) of w */
static void gpt2_head_tile_logits(const struct fsdp_gpt2 *m, const float *X, struct fsdp_lm_mem w,
                                  size_t c0, size_t rows, size_t n, float *out)
{
    size_t C = (size_t)m->cfg->n_embd;
    m->lm.k->matmul_forward(m->lm.dev, out, FSDP_F32, X, FSDP_F32, fsdp_lm_at(w, c0 * C), NULL,
                            w.pt, NULL, rows, C, n);
}

/*
 * Split by vocabulary, each rank's statistics cover its slice only: the row
 * maxima are reduced (max), each rank's sum rescaled to the common maximum,
 * and the sums and target logits (each held by one rank, 0 elsewhere)
 * reduced (sum). stats then hold every row's statistics over all of V.
 */
static int gpt2_head_combine(struct fsdp_gpt2 *m, float *stats, float *zt, size_t R)
{
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    const int have = m->wte_rows > 0;
    m->lm.k->xent_combine(m->lm.dev, 0, stats, zt, g->mx, g->sz, R, have);
    FSDP_CHECK(gpt2_allreduce(m, g->mx, R, FSDP_MAX));
    m->lm.k->xent_combine(m->lm.dev, 1, stats, zt, g->mx, g->sz, R, have);
    FSDP_CHECK(gpt2_allreduce(m, g->sz, 2 * R, FSDP_SUM));
    m->lm.k->xent_combine(m->lm.dev, 2, stats, zt, g->mx, g->sz, R, have);
    return 0;
}

/* Every rank's ln_f rows into xall (zeros from a rank without a batch). */
static int gpt2_head_gather_x(struct fsdp_gpt2 *m, size_t BT)
{
    size_t C = (size_t)m->cfg->n_embd;
    if (m->lm.shadow) {
        FSDP_CHECK(fsdp_device_zero(m->lm.dev, m->acts.lnf, BT * C * sizeof(float)));
    }
    FSDP_CHECK(gpt2_allgather(m, m->acts.lnf, m->gacts.xall, BT * C, FSDP_F32));
    m->head_x_ready = !m->lm.ws_shared; /* a shared workspace is another set's meanwhile */
    return 0;
}

/* Every rank's targets into tgt_all (the ignore index from a rank
 * without a batch), and the host's copy for the counts: one read. */
static int gpt2_head_gather_targets(struct fsdp_gpt2 *m, size_t BT)
{
    struct fsdp_gpt2_acts *a = &m->acts;
    int32_t *mine = a->tgt_all + (size_t)m->rows_r * BT;
    size_t all = gpt2_rows_all(m, BT);
    if (m->lm.shadow) {
        for (size_t i = 0; i < BT; i++) {
            m->tgt_host[i] = m->lm.ignore_index;
        }
        FSDP_CHECK(fsdp_device_write(m->lm.dev, mine, m->tgt_host, BT * sizeof(int32_t)));
    } else {
        FSDP_CHECK(fsdp_device_copy(m->lm.dev, mine, m->lm.dtargets, BT * sizeof(int32_t)));
    }
    FSDP_CHECK(gpt2_allgather(m, mine, a->tgt_all, BT, FSDP_I32));
    return fsdp_device_read(m->lm.dev, m->tgt_host, a->tgt_all, all * sizeof(int32_t));
}

/*
 * ln_f, then with targets the loss over tiles of the head's rows and a
 * vocabulary slice: each tile's logits, folded into per-row statistics and
 * target logits; the logits are dropped (unless one tile holds them all).
 * Split by vocabulary the rows are every rank's and the statistics are
 * combined over the ranks. The mean adds this rank's kept rows' losses in
 * row order in double, as the one-pass kernel does.
 */
int fsdp_gpt2_head_forward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)c->n_embd;
    struct fsdp_gpt2_acts *a = &m->acts;
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    int vp = gpt2_vp_head(m), ex = vp && m->rows_W > 1;
    if (!m->lm.shadow) { /* sequence parallel: this rank's rows, then every rank's gathered */
        struct fsdp_gpt2_head_view w;
        float *mine = fsdp_lm_lnf_mine(&m->lm, a->lnf, BT);
        fsdp_gpt2_head_view(m, fsdp_lm_params(&m->lm, c->n_layer + 1), fsdp_lm_params(&m->lm, 0),
                            &w);
        m->lm.k->layernorm_forward(m->lm.dev, mine, a->lnf_mean, a->lnf_rstd,
                                   fsdp_lm_residual(&m->lm, c->n_layer), FSDP_F32, FSDP_F32, w.lnfw,
                                   w.lnfb, w.pt, fsdp_lm_rows_here(&m->lm, BT), C, c->ln_eps);
        FSDP_CHECK(fsdp_lm_lnf_gather(&m->lm, mine, a->lnf, BT));
    }
    m->bwd_next = -1;
    if (!m->lm.targets && !m->lm.shadow) {
        return 0;
    }
    m->n_kept = 0;
    m->kept_all = 0;
    m->lm.loss = NAN;
    m->lm.loss_pending = 0;
    if (m->lm.shadow && !ex) {
        m->bwd_next = m->lm.spec->n_units - 1; /* nothing here, and no one to serve */
        return 0;
    }
    size_t R = gpt2_head_R(m, BT), Vh = gpt2_head_V(m), own = 0, v0, rt, ct;
    const float *X = a->lnf;
    struct fsdp_lm_mem W;
    const int32_t *tgt = m->lm.dtargets, *htgt = m->lm.targets; /* device, host */
    float *dW;
    gpt2_head_weights(m, 0, &W, &dW, &v0);
    if (ex) {
        FSDP_CHECK(gpt2_head_gather_x(m, BT));
        FSDP_CHECK(gpt2_head_gather_targets(m, BT));
        X = g->xall;
        tgt = a->tgt_all;
        htgt = m->tgt_host;
        own = (size_t)m->rows_r * BT;
    }
    gpt2_head_tile(m, R, Vh, &rt, &ct);
    if (Vh == 0) { /* a slice of padding only: nothing to add */
        m->lm.k->fill(m->lm.dev, a->ce_stats, R, 2, -INFINITY);
        m->lm.k->fill(m->lm.dev, a->ce_stats + 1, R, 2, 0.0f);
        m->lm.k->fill(m->lm.dev, g->zt, R, 1, 0.0f);
    }
    for (size_t i0 = 0; i0 < R && Vh > 0; i0 += rt) {
        size_t rows = R - i0 < rt ? R - i0 : rt;
        for (size_t c0 = 0; c0 < Vh; c0 += ct) {
            size_t n = Vh - c0 < ct ? Vh - c0 : ct;
            gpt2_head_tile_logits(m, X + i0 * C, W, c0, rows, n, a->head_logits);
            m->lm.k->crossentropy_slice_forward(m->lm.dev, a->ce_stats + 2 * i0, g->zt + i0,
                                                a->head_logits, tgt + i0, rows, n, v0 + c0,
                                                m->lm.ignore_index, c0 == 0);
        }
    }
    if (ex) {
        FSDP_CHECK(gpt2_head_combine(m, a->ce_stats, g->zt, R));
    } else if (m->lm.tp) { /* the parallel cross-entropy: every row's statistics over all of V */
        FSDP_CHECK(fsdp_tp_xent_combine(m->lm.tp, a->ce_stats, g->zt, g->mx, R));
    }
    for (size_t i = 0; i < R; i++) {
        m->kept_all += htgt[i] != m->lm.ignore_index;
    }
    if (!m->lm.shadow) {
        size_t kept = fsdp_lm_count_kept(&m->lm, 0, BT);
        m->lm.k->xent_losses(m->lm.dev, a->losses, a->ce_stats + 2 * own, g->zt + own,
                             m->lm.dtargets, BT, m->lm.ignore_index);
        m->n_kept = kept;
        fsdp_lm_set_loss(&m->lm, a->losses, BT, kept);
    }
    m->bwd_next = m->lm.spec->n_units - 1;
    return 0;
}

int fsdp_gpt2_logits(struct fsdp_model *base, size_t row0, size_t rows, float *out)
{
    struct fsdp_gpt2 *m = fsdp_gpt2_of(base);
    int last = m->lm.spec->n_units - 1;
    FSDP_CHECK(fsdp_lm_check_logits(&m->lm, row0, rows, m->cfg->tied));
    if (gpt2_vp_head(m)) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: this rank holds only wte rows [%zu, %zu) of "
                        "the tied head", m->wte_row0, m->wte_row0 + m->wte_rows);
    }
    struct fsdp_gpt2_head_view w;
    fsdp_gpt2_head_view(m, fsdp_lm_params(&m->lm, last), fsdp_lm_params(&m->lm, 0), &w);
    if (rows > 0) {
        size_t C = (size_t)m->cfg->n_embd;
        gpt2_head_tile_logits(m, m->acts.lnf + row0 * C, (struct fsdp_lm_mem){w.lm_head, w.pt}, 0,
                              rows, (size_t)m->cfg->vocab_size, out);
    }
    return 0;
}

/*
 * Per tile: the logits again (the forward's product, so the same bits)
 * unless one tile holds them all, their gradient from the saved statistics,
 * d(ln_f) rows (accumulated over the slices) and the head's (tied: wte)
 * gradient rows of the slice, with the seed scale as alpha. Row chunks whose
 * targets are all ignored have zero gradient and are skipped. Split by
 * vocabulary, every rank's ln_f rows are used (still in the workspace from
 * the forward, or gathered again) and d(ln_f) is summed over the ranks,
 * each keeping its own rows.
 */
int fsdp_gpt2_head_backward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)c->n_embd;
    struct fsdp_gpt2_acts *a = &m->acts;
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    int ex = gpt2_vp_head(m) && m->rows_W > 1, last = c->n_layer + 1;
    if (m->lm.shadow && !ex) {
        return fsdp_device_zero(m->lm.dev, g->dres, BT * C * sizeof(float));
    }
    size_t R = gpt2_head_R(m, BT), Vh = gpt2_head_V(m), v0, rt, ct;
    const float *X = a->lnf;
    struct fsdp_lm_mem W;
    const int32_t *tgt = m->lm.dtargets, *htgt = m->lm.targets; /* device, host */
    float *dX = g->dbtc, *dW;
    gpt2_head_weights(m, 1, &W, &dW, &v0);
    if (ex) {
        if (!m->head_x_ready) {
            FSDP_CHECK(gpt2_head_gather_x(m, BT));
        }
        X = g->xall;
        dX = g->dxall;
        tgt = a->tgt_all;
        htgt = m->tgt_host;
    }
    float alpha = fsdp_lm_seed_alpha(&m->lm, m->kept_all);
    gpt2_head_tile(m, R, Vh, &rt, &ct);
    int whole = rt == R && ct == Vh; /* the forward's logits are still in the tile */
    for (size_t i0 = 0; i0 < R; i0 += rt) {
        size_t rows = R - i0 < rt ? R - i0 : rt, kept = 0;
        for (size_t r = i0; r < i0 + rows; r++) {
            kept += htgt[r] != m->lm.ignore_index;
        }
        if (kept == 0 || Vh == 0) {
            FSDP_CHECK(fsdp_device_zero(m->lm.dev, dX + i0 * C, rows * C * sizeof(float)));
            continue;
        }
        for (size_t c0 = 0; c0 < Vh; c0 += ct) {
            size_t n = Vh - c0 < ct ? Vh - c0 : ct;
            if (!whole) {
                gpt2_head_tile_logits(m, X + i0 * C, W, c0, rows, n, a->head_logits);
            }
            m->lm.k->crossentropy_slice_backward(m->lm.dev, a->head_logits, a->head_logits,
                                                 a->ce_stats + 2 * i0, tgt + i0, rows, n, v0 + c0,
                                                 m->lm.ignore_index, 1.0f);
            m->lm.k->matmul_backward(m->lm.dev, dX + i0 * C, dW + c0 * C, NULL, a->head_logits,
                                     X + i0 * C, FSDP_F32, fsdp_lm_at(W, c0 * C), W.pt, rows, C, n,
                                     alpha, c0 > 0);
        }
    }
    const float *dlnf = dX;
    if (ex) {
        float *mine = dX + (size_t)m->rows_r * BT * C;
        FSDP_CHECK(gpt2_reduce_scatter(m, dX, mine, BT * C));
        dlnf = mine;
    } else if (m->lm.tp) {
        /* d(ln_f): the vocabulary slices' parts summed into the rows held here (dX: dbtc) */
        FSDP_CHECK(fsdp_lm_tp_din(&m->lm, BT, &dlnf));
    }
    m->head_x_ready = 0;
    size_t BR = fsdp_lm_rows_here(&m->lm, BT);
    FSDP_CHECK(fsdp_device_zero(m->lm.dev, g->dres, BR * C * sizeof(float)));
    if (!m->lm.shadow) {
        struct fsdp_gpt2_head_view w, dw;
        fsdp_gpt2_head_view(m, fsdp_lm_params(&m->lm, last), fsdp_lm_params(&m->lm, 0), &w);
        fsdp_gpt2_head_view(m, fsdp_lm_grads(&m->lm, last), fsdp_lm_grads(&m->lm, 0), &dw);
        if (m->lm.sp) {
            FSDP_CHECK(fsdp_device_zero(m->lm.dev, g->spg, 2 * C * sizeof(float)));
        }
        m->lm.k->layernorm_backward(m->lm.dev, g->dres, m->lm.sp ? g->spg : dw.lnfw,
                                    m->lm.sp ? g->spg + C : dw.lnfb, dlnf,
                                    fsdp_lm_residual(&m->lm, c->n_layer), FSDP_F32, w.lnfw, w.pt,
                                    a->lnf_mean, a->lnf_rstd, BR, C);
        if (m->lm.sp) {
            float *const dst[2] = {dw.lnfw, dw.lnfb};
            FSDP_CHECK(fsdp_lm_sp_norm_grads(&m->lm, dst, 2));
        }
    }
    return 0;
}

