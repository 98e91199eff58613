/*
 * gpt2.c - GPT-2 (pre-LN, Hugging Face semantics) forward and backward per
 * unit on the CPU kernels: the embedding (also by rows), the blocks, the
 * activation layout, activation checkpointing and the memory/FLOP
 * accounting; the final norm and LM head are gpt2_head.c's, and what every
 * LM here shares (bookkeeping, tensor-parallel regions) is lm.c's. It reads parameters only through the
 * caller's unit buffers and the offsets of the parameter table; it never
 * owns or allocates parameters or their gradients.
 */
#include "config.h"
#include "model/gpt2.h"
#include "model/gpt2_head.h"
#include "tp/tp_ops.h"
#include "comm/group.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// parameter table lookups

/* A block tensor's local rows and columns (units of elements) with
 * tensor parallelism: column-parallel weights keep 1/tpn of their rows,
 * row-parallel ones 1/tpn of their columns. */
static size_t gpt2_tp_rows(const struct fsdp_gpt2 *m, size_t rows, enum fsdp_tp_place p)
{
    return p == FSDP_TP_COLWISE ? rows / (size_t)m->lm.tpn : rows;
}

static size_t gpt2_tp_cols(const struct fsdp_gpt2 *m, size_t cols, enum fsdp_tp_place p)
{
    return p == FSDP_TP_ROWWISE ? cols / (size_t)m->lm.tpn : cols;
}

static int gpt2_map_params(struct fsdp_gpt2 *m)
{
    const struct fsdp_model_spec *s = m->lm.spec;
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, L = (size_t)c->n_layer;
    char name[FSDP_PARAM_NAME_MAX + 16];
    V = m->lm.tvl; /* tensor parallel: this rank's vocabulary slice, padded */
    FSDP_CHECK(fsdp_lm_locate(s, "wte.weight", 0, V, C, &m->emb_off[0]));
    FSDP_CHECK(fsdp_lm_locate(s, "wpe.weight", 0, (size_t)c->context, C, &m->emb_off[1]));
    for (size_t l = 0; l < L; l++) {
        size_t off;
#define FSDP_GPT2_X(id, field, suffix, rows, cols, init, std, decay, tp)                      \
        snprintf(name, sizeof(name), "h.%zu.%s", l, suffix);                              \
        FSDP_CHECK(fsdp_lm_locate(s, name, 1 + (int)l, gpt2_tp_rows(m, (rows) * C, tp),       \
                               gpt2_tp_cols(m, (cols) * C, tp), &off));                  \
        if (l == 0) {                                                                     \
            m->blk_off[FSDP_GPT2_BLK_##id] = off;                                         \
        } else if (off != m->blk_off[FSDP_GPT2_BLK_##id]) {                               \
            return fsdp_err(FSDP_ERR_INTERNAL,                                            \
                            "parameter table: '%s' at offset %zu, block 0 has it at %zu", \
                            name, off, m->blk_off[FSDP_GPT2_BLK_##id]);                   \
        }
        FSDP_GPT2_BLOCK_TENSORS(FSDP_GPT2_X)
#undef FSDP_GPT2_X
    }
    int last = c->n_layer + 1;
    FSDP_CHECK(fsdp_lm_locate(s, "ln_f.weight", last, C, 0, &m->head_off[0]));
    FSDP_CHECK(fsdp_lm_locate(s, "ln_f.bias", last, C, 0, &m->head_off[1]));
    long lm = fsdp_model_spec_find(s, "lm_head.weight");
    if (c->tied) {
        if (lm >= 0) {
            return fsdp_err(FSDP_ERR_INTERNAL, "parameter table: tied model lists lm_head.weight");
        }
        m->head_off[2] = m->emb_off[0];
    } else {
        FSDP_CHECK(fsdp_lm_locate(s, "lm_head.weight", last, V, C, &m->head_off[2]));
    }
    return 0;
}

void fsdp_gpt2_embed_view(const struct fsdp_gpt2 *m, struct fsdp_lm_mem unit0,
                          struct fsdp_gpt2_embed_view *v)
{
    v->wte = fsdp_lm_at(unit0, m->emb_off[0]);
    v->wpe = fsdp_lm_at(unit0, m->emb_off[1]);
    v->pt = unit0.pt;
}

void fsdp_gpt2_block_view(const struct fsdp_gpt2 *m, struct fsdp_lm_mem unit,
                          struct fsdp_gpt2_block_view *v)
{
#define FSDP_GPT2_X(id, field, suffix, rows, cols, init, std, decay, tp)                           \
    v->field = fsdp_lm_at(unit, m->blk_off[FSDP_GPT2_BLK_##id]);
    FSDP_GPT2_BLOCK_TENSORS(FSDP_GPT2_X)
#undef FSDP_GPT2_X
    v->pt = unit.pt;
}

void fsdp_gpt2_head_view(const struct fsdp_gpt2 *m, struct fsdp_lm_mem unit_last,
                         struct fsdp_lm_mem unit0, struct fsdp_gpt2_head_view *v)
{
    v->lnfw = fsdp_lm_at(unit_last, m->head_off[0]);
    v->lnfb = fsdp_lm_at(unit_last, m->head_off[1]);
    v->lm_head = fsdp_lm_at(m->cfg->tied ? unit0 : unit_last, m->head_off[2]);
    v->pt = unit_last.pt;
}

// ----------------------------------------------------------------------------
// activation layout

/* A bf16 tensor of n values carved from the float buffer. */
static uint16_t *gpt2_take16(float *base, size_t *off, size_t n)
{
    return (uint16_t *)(void *)fsdp_lm_take(base, off, (n + 1) / 2);
}

/* lc and NH are this rank's heads' width and count (C and NH on one rank);
 * BR the rows of the residual stream it holds (BT, or BT / tp with
 * sequence parallelism). work NULL: the block's own f32 tensors; else
 * (bf16 activations) its tensors are stored in st and a points at work
 * for the f32 ones (gpt2_layout_work), with its own f32 statistics. */
static void gpt2_layout_block(struct fsdp_gpt2_block_acts *a, struct fsdp_gpt2_block_store *st,
                              const struct fsdp_gpt2_block_acts *work, float *base, size_t *off,
                              size_t BT, size_t BR, size_t C, size_t lc, size_t NH)
{
    const int h = work != NULL;
    *st = (struct fsdp_gpt2_block_store){NULL};
    if (work) {
        *a = *work;
    }
    fsdp_lm_take_act(&a->ln1, &st->ln1, h, base, off, BR * C);
    a->ln1_mean = fsdp_lm_take(base, off, BR);
    a->ln1_rstd = fsdp_lm_take(base, off, BR);
    fsdp_lm_take_act(&a->qkv, &st->qkv, h, base, off, BT * 3 * lc);
    fsdp_lm_take_act(&a->atty, &st->atty, h, base, off, BT * lc);
    a->att_lse = fsdp_lm_take(base, off, BT * NH);
    fsdp_lm_take_act(&a->res2, &st->res2, h, base, off, BR * C);
    fsdp_lm_take_act(&a->ln2, &st->ln2, h, base, off, BR * C);
    a->ln2_mean = fsdp_lm_take(base, off, BR);
    a->ln2_rstd = fsdp_lm_take(base, off, BR);
    fsdp_lm_take_act(&a->fch, &st->fch, h, base, off, BT * 4 * lc);
    fsdp_lm_take_act(&a->fch_gelu, &st->fch_gelu, h, base, off, BT * 4 * lc);
}

/*
 * bf16 activations: the f32 working set every block's acts point at. The
 * products, the attention and GELU read and write the stores; f32 stay
 * res2 (the MLP's product adds it as its f32 residual without tensor
 * parallelism; with sequence parallelism the attention's reduce-scatter
 * lands in it) and, with sequence parallelism, ln1 and ln2 (their rows
 * are all-gathered in f32).
 */
static void gpt2_layout_work(const struct fsdp_gpt2 *m, struct fsdp_gpt2_block_acts *w, float *base,
                             size_t *off, size_t BR, size_t C)
{
    *w = (struct fsdp_gpt2_block_acts){NULL};
    if (!m->lm.tp || m->lm.sp) {
        w->res2 = fsdp_lm_take(base, off, BR * C);
    }
    if (m->lm.sp) {
        w->ln1 = fsdp_lm_take(base, off, BR * C);
        w->ln2 = fsdp_lm_take(base, off, BR * C);
    }
}

/* The saved tensors of this stage's blocks (and, with bf16 activations,
 * their working set), after the rest. */
static void gpt2_layout_blocks(const struct fsdp_gpt2 *m, float *base, size_t *off,
                               struct fsdp_gpt2_acts *a, size_t BT, size_t BR)
{
    size_t L = (size_t)m->cfg->n_layer, C = (size_t)m->cfg->n_embd, NH = (size_t)m->lnh;
    const size_t lo = (size_t)m->lm.stage_lo, hi = (size_t)m->lm.stage_hi;
    struct fsdp_gpt2_block_acts blk, work, *w = NULL;
    struct fsdp_gpt2_block_store st;
    int any_ckpt = 0;
    if (m->lm.adt == FSDP_BF16) {
        gpt2_layout_work(m, &work, base, off, BR, C);
        w = &work;
    }
    for (size_t l = 0; l < L; l++) {
        if (l + 1 < lo || l + 1 > hi) {
            continue; /* another pipeline stage's block */
        }
        if (m->lm.checkpoint[l]) {
            any_ckpt = 1;
            continue;
        }
        gpt2_layout_block(&blk, &st, w, base, off, BT, BR, C, m->lc, NH);
        if (a->blocks) {
            a->blocks[l] = blk;
            a->store[l] = st;
        }
    }
    if (any_ckpt) { /* one set shared by all of them */
        gpt2_layout_block(&blk, &st, w, base, off, BT, BR, C, m->lc, NH);
        for (size_t l = 0; l < L && a->blocks; l++) {
            if (m->lm.checkpoint[l]) {
                a->blocks[l] = blk;
                a->store[l] = st;
            }
        }
    }
}

/*
 * Lays the activations out over base into a, or only counts them when base
 * is NULL (a->blocks may then be NULL too); returns the floats needed.
 */
static size_t gpt2_layout_acts(const struct fsdp_gpt2 *m, float *base, struct fsdp_gpt2_acts *a)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->lm.max_B * (size_t)m->lm.max_T, C = (size_t)c->n_embd;
    size_t BR = fsdp_lm_rows_here(&m->lm, BT);
    size_t slots = fsdp_lm_residual_slots(&m->lm);
    size_t off = 0;
    if (m->lm.adt == FSDP_BF16) {
        a->residual16 = gpt2_take16(base, &off, slots * BR * C);
        a->residual = fsdp_lm_take(base, &off, 2 * BR * C);
    } else {
        a->residual16 = NULL;
        a->residual = fsdp_lm_take(base, &off, slots * BR * C);
    }
    /* a pipeline stage (set_stage) lays out its own blocks, and the head's
     * buffers only where it holds the head */
    const size_t head = (size_t)m->lm.stage_hi == (size_t)c->n_layer + 1;
    a->lnf = fsdp_lm_take(base, &off, head * BT * C);
    a->lnf_mean = fsdp_lm_take(base, &off, head * BR);
    a->lnf_rstd = fsdp_lm_take(base, &off, head * BR);
    size_t R = gpt2_head_R(m, BT), rows_all = m->rows_on ? gpt2_rows_all(m, BT) : 0;
    a->head_logits = fsdp_lm_take(base, &off, head * fsdp_gpt2_head_tile_floats(m));
    a->ce_stats = fsdp_lm_take(base, &off, head * 2 * R);
    a->losses = fsdp_lm_take(base, &off, head * BT);
    /* token ids share the float buffer: 4 bytes each, only ever read as ids */
    a->tok_all = (int32_t *)(void *)fsdp_lm_take(base, &off, rows_all);
    a->tgt_all = (int32_t *)(void *)fsdp_lm_take(base, &off, gpt2_vp_head(m) ? rows_all : 0);
    a->att_scratch =
        fsdp_lm_take(base, &off, m->lm.k->attention_scratch_floats(m->lm.dev, m->lm.max_T));
    gpt2_layout_blocks(m, base, &off, a, BT, BR);
    return off;
}

/* The head and the embedding use the space of dqkv and dfch, which only a
 * block's backward needs: the workspace is the larger of the two uses. dres
 * from base, the rest from shared (a donor's, fsdp_lm_reserve_ws) or base. */
static size_t gpt2_layout_grad_acts(const struct fsdp_gpt2 *m, float *base, float *shared,
                                    struct fsdp_gpt2_grad_acts *g)
{
    size_t BT = (size_t)m->lm.max_B * (size_t)m->lm.max_T, C = (size_t)m->cfg->n_embd;
    size_t R = gpt2_head_R(m, BT), all = gpt2_rows_all(m, BT);
    int ex = m->rows_on && m->rows_W > 1, vp = ex && gpt2_vp_head(m);
    size_t off = 0;
    g->dres = fsdp_lm_take(base, &off, fsdp_lm_rows_here(&m->lm, BT) * C);
    base = shared ? shared : base;
    g->dbtc = fsdp_lm_take(base, &off, BT * C);
    g->xfull = fsdp_lm_take(base, &off, m->lm.sp ? BT * C : 0);
    g->spg = fsdp_lm_take(base, &off, m->lm.sp ? 4 * C : 0);
    size_t split = off;
    g->dqkv = fsdp_lm_take(base, &off, BT * 3 * m->lc);
    g->dfch = fsdp_lm_take(base, &off, BT * 4 * m->lc);
    size_t blocks = off;
    off = split;
    g->xall = fsdp_lm_take(base, &off, ex ? all * C : 0);
    g->dxall = fsdp_lm_take(base, &off, vp ? all * C : 0);
    g->zt = fsdp_lm_take(base, &off, R);
    /* tensor parallel: the parallel cross-entropy's scratch (3 R) */
    g->mx = fsdp_lm_take(base, &off, vp ? R : m->lm.tp ? 3 * R : 0);
    g->sz = fsdp_lm_take(base, &off, vp ? 2 * R : 0);
    return off > blocks ? off : blocks;
}

int fsdp_gpt2_reserve(struct fsdp_model *base)
{
    struct fsdp_gpt2 *m = fsdp_gpt2_of(base);
    struct fsdp_lm *lm = &m->lm;
    int fresh = 0;
    if (!lm->act_memory) {
        FSDP_CHECK(fsdp_lm_reserve_buf(lm, &lm->act_memory, &lm->act_floats,
                                       fsdp_gpt2_activation_bytes(base) / sizeof(float),
                                       "activations", &fresh));
        gpt2_layout_acts(m, lm->act_memory, &m->acts);
    }
    if (!lm->grad_act_memory) {
        struct fsdp_gpt2_grad_acts count;
        float *shared;
        size_t total = gpt2_layout_grad_acts(m, NULL, NULL, &count);
        FSDP_CHECK(fsdp_lm_reserve_ws(lm, total, &shared, &fresh));
        gpt2_layout_grad_acts(m, lm->grad_act_memory, shared, &m->gacts);
    }
    if (fresh) {
        fsdp_lm_bind(lm, m->acts.residual, m->gacts.dres, m->gacts.dbtc, m->gacts.xfull,
                     m->gacts.spg);
        lm->residual16 = m->acts.residual16;
        fsdp_lm_log_reserve(lm);
    }
    if (gpt2_vp_head(m) && !m->tgt_host) { /* the host's copy of every rank's targets */
        size_t BT = (size_t)m->lm.max_B * (size_t)m->lm.max_T;
        m->tgt_host = calloc(gpt2_rows_all(m, BT), sizeof(int32_t));
        if (!m->tgt_host) {
            return fsdp_err(FSDP_ERR_NOMEM, "gpt2: the head's targets");
        }
    }
    return 0;
}

size_t fsdp_gpt2_activation_bytes(const struct fsdp_model *base)
{
    const struct fsdp_gpt2 *m = (const struct fsdp_gpt2 *)base;
    struct fsdp_gpt2_acts count = {.blocks = NULL, .store = NULL};
    return gpt2_layout_acts(m, NULL, &count) * sizeof(float);
}

size_t fsdp_gpt2_workspace_bytes(const struct fsdp_model *base)
{
    const struct fsdp_gpt2 *m = (const struct fsdp_gpt2 *)base;
    struct fsdp_gpt2_grad_acts count;
    return fsdp_lm_ws_own(&m->lm, gpt2_layout_grad_acts(m, NULL, NULL, &count)) * sizeof(float);
}

// ----------------------------------------------------------------------------
// lifetime and settings

static int gpt2_create(const struct fsdp_model_spec *spec, int max_B, int max_T, struct fsdp_tp *tp,
                       struct fsdp_device *dev, enum fsdp_dtype adt, struct fsdp_gpt2 **out)
{
    int rc;
    FSDP_CHECK(fsdp_lm_check_arch(spec, &fsdp_gpt2_arch));
    const struct fsdp_gpt2_config *c = fsdp_gpt2_cfg(spec);
    struct fsdp_gpt2 *m = calloc(1, sizeof(*m));
    if (!m) {
        return fsdp_err(FSDP_ERR_NOMEM, "gpt2 model");
    }
    double per_tok = (double)c->vocab_size + 20.0 * c->n_embd * (c->n_layer + 2);
    rc = fsdp_lm_init(&m->lm, spec, &fsdp_gpt2_arch, &fsdp_gpt2_ops, max_B, max_T, c->context,
                      per_tok, (size_t)c->n_embd, tp, dev);
    if (rc < 0) {
        free(m);
        return rc;
    }
    m->cfg = c;
    m->head_chunk = fsdp_lm_head_default_rows(&m->lm, FSDP_GPT2_HEAD_BYTES);
    m->bwd_next = -1;
    m->lnh = c->n_head / m->lm.tpn;
    m->lc = (size_t)c->n_embd / (size_t)m->lm.tpn;
    m->acts.blocks = calloc((size_t)c->n_layer, sizeof(*m->acts.blocks));
    m->acts.store = calloc((size_t)c->n_layer, sizeof(*m->acts.store));
    if (!m->acts.blocks || !m->acts.store) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "gpt2 model tables");
        goto err_free;
    }
    if (c->n_head % m->lm.tpn != 0) {
        rc = fsdp_err(FSDP_ERR_INVALID, "gpt2: n_head %d is not divisible by tp %d", c->n_head,
                      m->lm.tpn);
        goto err_free;
    }
    if (adt != FSDP_F32 && adt != FSDP_BF16) {
        rc = fsdp_err(FSDP_ERR_INVALID,
                      "gpt2: activation dtype %s is not supported (use f32 or bf16)",
                      fsdp_dtype_name(adt));
        goto err_free;
    }
    m->lm.adt = adt;
    FSDP_CHECK_GOTO(gpt2_map_params(m), rc, err_free);
    *out = m;
    return 0;
err_free:
    fsdp_gpt2_destroy(m);
    return rc;
}

int fsdp_gpt2_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                     struct fsdp_gpt2 **out)
{
    return gpt2_create(spec, max_B, max_T, NULL, NULL, FSDP_F32, out);
}

void fsdp_gpt2_destroy(struct fsdp_gpt2 *m)
{
    if (!m) {
        return;
    }
    fsdp_lm_free(&m->lm);
    free(m->tgt_host);
    free(m->acts.blocks);
    free(m->acts.store);
    free(m);
}

/* The saved-activation layout depends on the checkpoint flags, the head
 * chunk and unit 0's rows: dropped here, rebuilt on demand (the next
 * reserve or set_batch). */
static void gpt2_relayout(struct fsdp_gpt2 *m)
{
    fsdp_lm_relayout(&m->lm);
    m->head_x_ready = 0;
}

int fsdp_gpt2_set_checkpoint(struct fsdp_gpt2 *m, int l, int on)
{
    FSDP_CHECK(fsdp_lm_set_checkpoint(&m->lm, l, on, m->bwd_next >= 0));
    m->head_x_ready = 0;
    return 0;
}

int fsdp_gpt2_set_head_chunk(struct fsdp_gpt2 *m, int rows)
{
    FSDP_CHECK(fsdp_lm_check_head_chunk(rows, m->bwd_next >= 0));
    m->head_chunk = rows ? rows : fsdp_lm_head_default_rows(&m->lm, FSDP_GPT2_HEAD_BYTES);
    gpt2_relayout(m);
    return 0;
}

int fsdp_gpt2_set_unit_rows(struct fsdp_gpt2 *m, int u, struct fsdp_group *g)
{
    const struct fsdp_model_spec *s = m->lm.spec;
    if (u < 0 || u >= s->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "unit %d out of range [0, %d)", u, s->n_units);
    }
    if (u != 0) {
        return 0; /* only the embedding tables are computed by rows */
    }
    if (m->bwd_next >= 0) {
        return fsdp_err(FSDP_ERR_INVALID, "unit 0 by rows set between forward and backward");
    }
    size_t W = g ? (size_t)g->size : 1, r = g ? (size_t)g->rank : 0, off = 0;
    long iwte = fsdp_model_spec_find(s, "wte.weight"), iwpe = fsdp_model_spec_find(s, "wpe.weight");
    for (size_t i = s->unit_first[0]; i < s->n_params && s->params[i].unit == 0; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        size_t row0, rows;
        fsdp_split_even(p->shape[0], W, r, &row0, &rows);
        if ((long)i == iwte) {
            m->wte_row0 = row0, m->wte_rows = rows, m->wte_at = off;
        } else if ((long)i == iwpe) {
            m->wpe_row0 = row0, m->wpe_rows = rows, m->wpe_at = off;
        }
        off += rows * p->shape[1];
    }
    m->rows_numel = off;
    m->rows_g = g;
    fsdp_tp_init(&m->rows_x, g, 0, m->lm.dev);
    m->rows_W = (int)W;
    m->rows_r = (int)r;
    m->rows_on = 1;
    gpt2_relayout(m);
    fsdp_lm_release(&m->lm, m->lm.grad_act_memory); /* the workspace holds every rank's rows now */
    m->lm.grad_act_memory = NULL;
    return 1;
}

int fsdp_gpt2_set_unit(struct fsdp_gpt2 *m, int u, void *params, enum fsdp_dtype pt, float *grads)
{
    return fsdp_lm_set_unit(&m->lm, u, params, pt, grads);
}

void fsdp_gpt2_set_ignore_index(struct fsdp_gpt2 *m, int32_t ignore_index)
{
    m->lm.ignore_index = ignore_index;
}

void fsdp_gpt2_set_loss_seed(struct fsdp_gpt2 *m, double divisor, float scale)
{
    fsdp_lm_set_loss_seed(&m->lm, divisor, scale);
}

int fsdp_gpt2_zero_grad(struct fsdp_gpt2 *m, int u)
{
    return fsdp_lm_zero_grad(&m->lm, u, m->rows_on ? m->rows_numel : m->lm.spec->unit_numel[0]);
}

// ----------------------------------------------------------------------------
// forward

int fsdp_gpt2_set_batch(struct fsdp_model *base, const int32_t *tokens, const int32_t *targets,
                        int B, int T)
{
    struct fsdp_gpt2 *m = fsdp_gpt2_of(base);
    FSDP_CHECK(fsdp_lm_check_batch_size(&m->lm, B, T));
    FSDP_CHECK(fsdp_lm_check_tokens(&m->lm, tokens, targets, B, T, m->rows_on));
    FSDP_CHECK(fsdp_gpt2_reserve(base));
    FSDP_CHECK(fsdp_lm_start_batch(&m->lm, tokens, targets, B, T));
    m->head_x_ready = 0;
    m->bwd_next = -1;
    return 0;
}

// ----------------------------------------------------------------------------
// the blocks (tensor-parallel regions: model/lm.h)

/* Block l from residual[l]; full = 0 stops before c_proj of the MLP, which
 * only produces residual[l+1] (what a checkpointed backward does not need).
 * With tensor parallelism q, k, v, c_fc and their activations are this
 * rank's heads and features (lc = C / tp wide, lnh heads). */
static int gpt2_block_forward(struct fsdp_gpt2 *m, int l, int full)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)c->n_embd, lc = m->lc;
    size_t BR = fsdp_lm_rows_here(&m->lm, BT);
    struct fsdp_gpt2_block_view w;
    struct fsdp_gpt2_block_acts *a = &m->acts.blocks[l];
    const struct fsdp_gpt2_block_store *st = &m->acts.store[l];
    float *x = fsdp_lm_residual(&m->lm, l);
    const void *in;
    enum fsdp_dtype it, adt = m->lm.adt;
    fsdp_gpt2_block_view(m, fsdp_lm_params(&m->lm, 1 + l), &w);
    if (full && l + 1 == m->lm.stage_lo) { /* a pipeline stage's input, written into x */
        fsdp_lm_residual_save(&m->lm, l);
    }
    fsdp_lm_residual_load(&m->lm, l);
    m->lm.k->layernorm_forward(m->lm.dev, fsdp_lm_act(a->ln1, st->ln1), a->ln1_mean, a->ln1_rstd, x,
                               adt, FSDP_F32, w.ln1w, w.ln1b, w.pt, BR, C, c->ln_eps);
    FSDP_CHECK(fsdp_lm_tp_enter(&m->lm, a->ln1, st->ln1, BT, &in, &it));
    m->lm.k->matmul_forward(m->lm.dev, fsdp_lm_act(a->qkv, st->qkv), adt, in, it, w.qkvw, w.qkvb,
                            w.pt, NULL, BT, C, 3 * lc);
    m->lm.k->attention_forward(m->lm.dev, fsdp_lm_act(a->atty, st->atty), a->att_lse,
                               m->acts.att_scratch, fsdp_lm_act(a->qkv, st->qkv), adt, m->lm.B,
                               m->lm.T, (int)lc, m->lnh);
    FSDP_CHECK(fsdp_lm_row_parallel(&m->lm, a->res2, st->res2, fsdp_lm_act(a->atty, st->atty), adt,
                                    w.attprojw, w.attprojb, w.pt, x, NULL, BT, lc));
    m->lm.k->layernorm_forward(m->lm.dev, fsdp_lm_act(a->ln2, st->ln2), a->ln2_mean, a->ln2_rstd,
                               fsdp_lm_act(a->res2, st->res2), adt, adt, w.ln2w, w.ln2b, w.pt, BR,
                               C, c->ln_eps);
    FSDP_CHECK(fsdp_lm_tp_enter(&m->lm, a->ln2, st->ln2, BT, &in, &it));
    m->lm.k->matmul_forward(m->lm.dev, fsdp_lm_act(a->fch, st->fch), adt, in, it, w.fcw, w.fcb,
                            w.pt, NULL, BT, C, 4 * lc);
    m->lm.k->gelu_forward(m->lm.dev, fsdp_lm_act(a->fch_gelu, st->fch_gelu),
                          fsdp_lm_act(a->fch, st->fch), adt, BT * 4 * lc);
    if (full) {
        FSDP_CHECK(fsdp_lm_row_parallel(&m->lm, fsdp_lm_residual(&m->lm, l + 1), NULL,
                                        fsdp_lm_act(a->fch_gelu, st->fch_gelu), adt, w.fcprojw,
                                        w.fcprojb, w.pt, a->res2, st->res2, BT, 4 * lc));
        fsdp_lm_residual_save(&m->lm, l + 1);
    }
    return 0;
}

/*
 * The embedding. By rows: every rank's token ids are gathered (kept for the
 * backward), each rank adds the table rows it holds into every rank's
 * positions, and the sums are scattered back, one addition of the two held
 * rows per position as the whole tables would give.
 */
static int gpt2_embed_forward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T;
    float *x = fsdp_lm_residual(&m->lm, 0);
    if (m->lm.tp) { /* vocabulary parallel; sequence parallel: through dbtc to this rank's rows */
        struct fsdp_gpt2_embed_view w;
        fsdp_gpt2_embed_view(m, fsdp_lm_params(&m->lm, 0), &w);
        return fsdp_tp_embed_forward(m->lm.tp, x, m->lm.sp ? m->gacts.dbtc : x, m->lm.dtokens,
                                     w.wte, (size_t)c->vocab_size, w.wpe, w.pt, (size_t)m->lm.T, BT,
                                     (size_t)c->n_embd);
    }
    if (!m->rows_on) {
        struct fsdp_gpt2_embed_view w;
        fsdp_gpt2_embed_view(m, fsdp_lm_params(&m->lm, 0), &w);
        m->lm.k->encoder_forward(m->lm.dev, x, m->lm.dtokens, w.wte, w.wpe, w.pt, m->lm.B, m->lm.T,
                                 c->n_embd);
        return 0;
    }
    int32_t *mine = m->acts.tok_all + (size_t)m->rows_r * BT;
    struct fsdp_lm_mem p = fsdp_lm_params(&m->lm, 0);
    const void *wte = fsdp_lm_at(p, m->wte_at), *wpe = fsdp_lm_at(p, m->wpe_at);
    if (m->lm.shadow) {
        FSDP_CHECK(fsdp_device_zero(m->lm.dev, mine, BT * sizeof(int32_t)));
    } else {
        FSDP_CHECK(fsdp_device_copy(m->lm.dev, mine, m->lm.dtokens, BT * sizeof(int32_t)));
    }
    m->head_x_ready = 0;
    if (m->rows_W == 1) {
        m->lm.k->embed_rows_forward(m->lm.dev, x, mine, wte, m->wte_row0, m->wte_rows, wpe,
                                    m->wpe_row0, m->wpe_rows, p.pt, BT, m->lm.T, c->n_embd);
        return 0;
    }
    size_t all = gpt2_rows_all(m, BT);
    FSDP_CHECK(gpt2_allgather(m, mine, m->acts.tok_all, BT, FSDP_I32));
    m->lm.k->embed_rows_forward(m->lm.dev, m->gacts.xall, m->acts.tok_all, wte, m->wte_row0,
                                m->wte_rows, wpe, m->wpe_row0, m->wpe_rows, p.pt, all, m->lm.T,
                                c->n_embd);
    return gpt2_reduce_scatter(m, m->gacts.xall, x, BT * (size_t)c->n_embd);
}

int fsdp_gpt2_forward_unit(struct fsdp_model *base, int u)
{
    struct fsdp_gpt2 *m = fsdp_gpt2_of(base);
    int L = m->cfg->n_layer;
    FSDP_CHECK(fsdp_lm_check_forward(&m->lm, u, m->cfg->tied));
    if (u == 0) {
        FSDP_CHECK(gpt2_embed_forward(m));
        fsdp_lm_residual_save(&m->lm, 0);
    } else if (u <= L) {
        if (!m->lm.shadow) {
            FSDP_CHECK(gpt2_block_forward(m, u - 1, 1));
        }
    } else {
        fsdp_lm_residual_load(&m->lm, L);
        FSDP_CHECK(fsdp_gpt2_head_forward(m));
    }
    m->lm.fwd_done[u] = 1;
    if (u == m->lm.stage_hi && u <= L) { /* a pipeline stage's last block: its backward starts
                                            from the output gradient written into dres */
        m->bwd_next = m->lm.targets ? u : -1;
    }
    return 0;
}

int fsdp_gpt2_forward(struct fsdp_gpt2 *m, const int32_t *tokens, const int32_t *targets, int B,
                      int T, float *loss)
{
    return fsdp_lm_forward(&m->lm.base, tokens, targets, B, T, loss);
}

// ----------------------------------------------------------------------------
// backward

/* dres holds d(block output) on entry and d(block input) on return. With
 * tensor parallelism each rank's d(ln_1) and d(ln_2) are its heads' and
 * features' part, summed over the ranks (copy-in's backward) before the
 * norms' backward; the row-parallel biases' gradients, from dres, which
 * every rank holds whole, come out whole. */
static int gpt2_block_backward(struct fsdp_gpt2 *m, int l)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)c->n_embd, lc = m->lc;
    size_t BR = fsdp_lm_rows_here(&m->lm, BT);
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    struct fsdp_gpt2_block_acts *a = &m->acts.blocks[l];
    const struct fsdp_gpt2_block_store *st = &m->acts.store[l];
    struct fsdp_gpt2_block_view w, dw;
    const float *dout, *din;
    const void *in;
    enum fsdp_dtype it, adt = m->lm.adt;
    /* sequence parallel: the norms' parameter gradients of this rank's rows
     * go through spg (summed over the ranks at the end), and the gathered
     * dres occupies dbtc, so d(attention output) goes to xfull */
    float *spg = g->spg, *datty = m->lm.sp ? g->xfull : g->dbtc;
    m->head_x_ready = 0; /* dqkv and dfch overwrite the head's scratch */
    if (m->lm.checkpoint[l]) {
        FSDP_CHECK(gpt2_block_forward(m, l, 0));
    } else { /* the products read the stores; ln_1's backward reads x in f32 */
        fsdp_lm_residual_load(&m->lm, l);
    }
    fsdp_gpt2_block_view(m, fsdp_lm_params(&m->lm, 1 + l), &w);
    fsdp_gpt2_block_view(m, fsdp_lm_grads(&m->lm, 1 + l), &dw);
    if (m->lm.sp) {
        FSDP_CHECK(fsdp_device_zero(m->lm.dev, spg, 4 * C * sizeof(float)));
    }
    /* MLP */
    FSDP_CHECK(fsdp_lm_tp_dout(&m->lm, BT, &dout));
    m->lm.k->matmul_backward(m->lm.dev, g->dfch, dw.fcprojw, dw.fcprojb, dout,
                             fsdp_lm_act(a->fch_gelu, st->fch_gelu), adt, w.fcprojw, w.pt, BT,
                             4 * lc, C, 1.0f, 0);
    m->lm.k->gelu_backward(m->lm.dev, g->dfch, fsdp_lm_act(a->fch, st->fch), g->dfch, m->lm.adt,
                           BT * 4 * lc);
    FSDP_CHECK(fsdp_lm_tp_enter(&m->lm, a->ln2, st->ln2, BT, &in, &it));
    m->lm.k->matmul_backward(m->lm.dev, g->dbtc, dw.fcw, dw.fcb, g->dfch, in, it, w.fcw, w.pt, BT,
                             C, 4 * lc, 1.0f, 0);
    FSDP_CHECK(fsdp_lm_tp_din(&m->lm, BT, &din));
    m->lm.k->layernorm_backward(m->lm.dev, g->dres, m->lm.sp ? spg : dw.ln2w,
                                m->lm.sp ? spg + C : dw.ln2b, din, fsdp_lm_act(a->res2, st->res2),
                                m->lm.adt, w.ln2w, w.pt, a->ln2_mean, a->ln2_rstd, BR, C);
    /* attention */
    FSDP_CHECK(fsdp_lm_tp_dout(&m->lm, BT, &dout));
    m->lm.k->matmul_backward(m->lm.dev, datty, dw.attprojw, dw.attprojb, dout,
                             fsdp_lm_act(a->atty, st->atty), adt, w.attprojw, w.pt, BT, lc, C, 1.0f,
                             0);
    m->lm.k->attention_backward(m->lm.dev, g->dqkv, m->acts.att_scratch, datty,
                                fsdp_lm_act(a->qkv, st->qkv), fsdp_lm_act(a->atty, st->atty),
                                a->att_lse, m->lm.adt, m->lm.B, m->lm.T, (int)lc, m->lnh);
    FSDP_CHECK(fsdp_lm_tp_enter(&m->lm, a->ln1, st->ln1, BT, &in, &it));
    m->lm.k->matmul_backward(m->lm.dev, g->dbtc, dw.qkvw, dw.qkvb, g->dqkv, in, it, w.qkvw, w.pt,
                             BT, C, 3 * lc, 1.0f, 0);
    FSDP_CHECK(fsdp_lm_tp_din(&m->lm, BT, &din));
    m->lm.k->layernorm_backward(m->lm.dev, g->dres, m->lm.sp ? spg + 2 * C : dw.ln1w,
                                m->lm.sp ? spg + 3 * C : dw.ln1b, din, fsdp_lm_residual(&m->lm, l),
                                FSDP_F32, w.ln1w, w.pt, a->ln1_mean, a->ln1_rstd, BR, C);
    if (m->lm.sp) {
        float *const dst[4] = {dw.ln2w, dw.ln2b, dw.ln1w, dw.ln1b};
        FSDP_CHECK(fsdp_lm_sp_norm_grads(&m->lm, dst, 4));
    }
    return 0;
}

/* The embedding's gradient. By rows: every rank's d(residual) rows are
 * gathered and each rank adds them into the table rows it holds, in the
 * order of the rows (rank after rank), as one rank with every batch would. */
static int gpt2_embed_backward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)c->n_embd;
    float *dres = m->gacts.dres, *dg = m->lm.unit_grads[0];
    if (m->lm.tp) { /* vocabulary parallel (sequence parallel: every rank's rows gathered) */
        struct fsdp_gpt2_embed_view dw;
        const float *dout;
        FSDP_CHECK(fsdp_lm_tp_dout(&m->lm, BT, &dout));
        fsdp_gpt2_embed_view(m, fsdp_lm_grads(&m->lm, 0), &dw);
        fsdp_tp_embed_backward(m->lm.tp, dw.wte, dw.wpe, dout, m->lm.dtokens, (size_t)c->vocab_size,
                               (size_t)m->lm.T, BT, C);
        return 0;
    }
    if (!m->rows_on) {
        struct fsdp_gpt2_embed_view dw;
        fsdp_gpt2_embed_view(m, fsdp_lm_grads(&m->lm, 0), &dw);
        m->lm.k->encoder_backward(m->lm.dev, dw.wte, dw.wpe, dres, m->lm.dtokens, m->lm.B, m->lm.T,
                                  c->n_embd);
        return 0;
    }
    const float *rows = dres;
    size_t n = BT;
    if (m->lm.shadow) {
        FSDP_CHECK(fsdp_device_zero(m->lm.dev, dres, BT * C * sizeof(float)));
    }
    m->head_x_ready = 0;
    if (m->rows_W > 1) {
        n = gpt2_rows_all(m, BT);
        FSDP_CHECK(gpt2_allgather(m, dres, m->gacts.xall, BT * C, FSDP_F32));
        rows = m->gacts.xall;
    }
    m->lm.k->embed_rows_backward(m->lm.dev, dg + m->wte_at, dg + m->wpe_at, rows, m->acts.tok_all,
                                 m->wte_row0, m->wte_rows, m->wpe_row0, m->wpe_rows, n, m->lm.T,
                                 c->n_embd);
    return 0;
}

int fsdp_gpt2_backward_unit(struct fsdp_model *base, int u)
{
    struct fsdp_gpt2 *m = fsdp_gpt2_of(base);
    int L = m->cfg->n_layer;
    FSDP_CHECK(fsdp_lm_check_backward(&m->lm, u, m->bwd_next, m->cfg->tied));
    if (u == 0) {
        FSDP_CHECK(gpt2_embed_backward(m));
    } else if (u <= L) {
        if (!m->lm.shadow) {
            FSDP_CHECK(gpt2_block_backward(m, u - 1));
        }
    } else {
        fsdp_lm_residual_load(&m->lm, L);
        FSDP_CHECK(fsdp_gpt2_head_backward(m));
    }
    m->bwd_next = u - 1;
    return 0;
}

int fsdp_gpt2_backward(struct fsdp_gpt2 *m)
{
    return fsdp_model_backward(&m->lm.base);
}

// ----------------------------------------------------------------------------
// accounting

double fsdp_gpt2_flops_per_token(const struct fsdp_model_spec *s, int T)
{
    const struct fsdp_gpt2_config *c = fsdp_gpt2_cfg(s);
    double C = c->n_embd, V = c->vocab_size, L = c->n_layer;
    double N = (double)s->total_numel - (double)c->context * C; /* no wpe: a lookup */
    if (!c->tied) {
        N -= V * C; /* wte is only a lookup; lm_head is the product */
    }
    return fsdp_lm_flops(N, L, C, T);
}

// ----------------------------------------------------------------------------
// the generic interface (model.h)

static int gpt2_op_create(const struct fsdp_model_spec *spec, const struct fsdp_model_opts *o,
                          struct fsdp_model **out)
{
    struct fsdp_gpt2 *m = NULL;
    FSDP_CHECK(gpt2_create(spec, o->max_B, o->max_T, o->tp, o->dev, o->act_dtype, &m));
    if (o->head_chunk > 0) {
        int rc = fsdp_gpt2_set_head_chunk(m, o->head_chunk);
        if (rc < 0) {
            fsdp_gpt2_destroy(m);
            return rc;
        }
    }
    *out = &m->lm.base;
    return 0;
}

static void gpt2_op_destroy(struct fsdp_model *m)
{
    fsdp_gpt2_destroy(fsdp_gpt2_of(m));
}

/* Units are blocks from 1 to L; -1: every block. The embedding and the
 * head keep their activations (they are small next to a block's). */
static int gpt2_op_set_checkpoint(struct fsdp_model *m, int u, int on)
{
    struct fsdp_gpt2 *g = fsdp_gpt2_of(m);
    if (u < 0) {
        return fsdp_gpt2_set_checkpoint(g, -1, on);
    }
    if (u < 1 || u > g->cfg->n_layer) {
        return 0;
    }
    return fsdp_gpt2_set_checkpoint(g, u - 1, on);
}

/*
 * Unit 0 is taken by rows when that moves less data than gathering it:
 * gathering moves the unit, (V + context) x C floats, once as parameters
 * and once as gradient per micro-batch; by rows four exchanges of every
 * rank's B x T x C activations move instead. Where the batch is the larger
 * (bench-small: 0.5 MiB of tables against 8 MiB of exchanges at 2 ranks)
 * the tables stay gathered, which is also cheap in memory there.
 */
static int gpt2_op_set_unit_rows(struct fsdp_model *m, int u, struct fsdp_group *g)
{
    struct fsdp_gpt2 *gm = fsdp_gpt2_of(m);
    if (gm->lm.tp) {
        return 0; /* tensor parallelism splits the tables over tp instead */
    }
    double W = g ? g->size : 1, table = (double)gm->cfg->vocab_size + gm->cfg->context;
    if (u == 0 && table <= 2.0 * W * gm->lm.max_B * gm->lm.max_T) {
        return 0;
    }
    return fsdp_gpt2_set_unit_rows(gm, u, g);
}

/*
 * Megatron-LM's layout: c_attn by heads ([q | k | v] rows, each split), c_fc
 * by features, both c_proj by input columns, wte (and an untied lm_head) by
 * vocabulary, padded; norms, the row-parallel biases and wpe whole on every
 * rank.
 */
static int gpt2_op_tp_cut(const struct fsdp_model_spec *spec, int tp, size_t i,
                          struct fsdp_tp_cut *out)
{
    const struct fsdp_gpt2_config *c = fsdp_gpt2_cfg(spec);
    const struct fsdp_param_spec *p = &spec->params[i];
    FSDP_CHECK(fsdp_lm_tp_check_heads(c->n_head, tp));
    fsdp_tp_cut_of_place(p->tp, strstr(p->name, ".attn.c_attn.") != NULL ? 3 : 1, out);
    return 0;
}

static void gpt2_op_comm_counts(const struct fsdp_model *m, struct fsdp_comm_counts *out)
{
    fsdp_comm_counts_add(out, &((const struct fsdp_gpt2 *)m)->rows_x.counts);
}

const struct fsdp_model_ops fsdp_gpt2_ops = {
    .size = sizeof(struct fsdp_model_ops),
    .name = FSDP_MODEL_ARCH_GPT2,
    .create = gpt2_op_create,
    .destroy = gpt2_op_destroy,
    .set_checkpoint = gpt2_op_set_checkpoint,
    .reserve = fsdp_gpt2_reserve,
    .set_unit = fsdp_lm_op_set_unit,
    .set_loss_seed = fsdp_lm_op_set_loss_seed,
    .set_batch = fsdp_gpt2_set_batch,
    .forward_unit = fsdp_gpt2_forward_unit,
    .backward_unit = fsdp_gpt2_backward_unit,
    .loss = fsdp_lm_op_loss,
    .logits = fsdp_gpt2_logits,
    .activation_bytes = fsdp_gpt2_activation_bytes,
    .workspace_bytes = fsdp_gpt2_workspace_bytes,
    .flops_per_token = fsdp_gpt2_flops_per_token,
    .set_unit_rows = gpt2_op_set_unit_rows,
    .decoder_create = fsdp_gpt2_decoder_create,
    .tp_cut = gpt2_op_tp_cut,
    .comm_counts = gpt2_op_comm_counts,
    .set_stage = fsdp_lm_op_set_stage,
    .stage_buffers = fsdp_lm_op_stage_buffers,
    .share_workspace = fsdp_lm_op_share_workspace,
};
