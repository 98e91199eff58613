/*
 * gpt2.c - GPT-2 (pre-LN, Hugging Face semantics) forward and backward per
 * unit on the CPU kernels, the activation layout, activation checkpointing,
 * deterministic sharding-independent init, the per-parameter AdamW split
 * and the memory/FLOP accounting. It reads parameters only through the
 * caller's unit buffers and the offsets of the parameter table; it never
 * owns or allocates parameters or their gradients.
 */
#include "config.h"
#include "model/gpt2.h"
#include "model/tp_ops.h"
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

/* Finds name in unit u with the given shape (cols 0: 1-D); returns its offset. */
static int gpt2_locate(const struct fsdp_model_spec *s, const char *name, int u, size_t rows,
                       size_t cols, size_t *off)
{
    long i = fsdp_model_spec_find(s, name);
    if (i < 0) {
        return fsdp_err(FSDP_ERR_INTERNAL, "parameter table has no '%s'", name);
    }
    const struct fsdp_param_spec *p = &s->params[i];
    int want_ndim = cols ? 2 : 1;
    if (p->unit != u || p->ndim != want_ndim || p->shape[0] != rows ||
        (cols && p->shape[1] != cols)) {
        return fsdp_err(FSDP_ERR_INTERNAL,
                        "parameter table: '%s' is unit %d shape (%zu, %zu), model expects unit %d "
                        "shape (%zu, %zu)",
                        name, p->unit, p->shape[0], p->shape[1], u, rows, cols ? cols : 1);
    }
    *off = p->offset;
    return 0;
}

/* A block tensor's local rows and columns (units of elements) with
 * tensor parallelism: column-parallel weights keep 1/tpn of their rows,
 * row-parallel ones 1/tpn of their columns. */
static size_t gpt2_tp_rows(const struct fsdp_gpt2 *m, size_t rows, enum fsdp_tp_place p)
{
    return p == FSDP_TP_COLWISE ? rows / (size_t)m->tpn : rows;
}

static size_t gpt2_tp_cols(const struct fsdp_gpt2 *m, size_t cols, enum fsdp_tp_place p)
{
    return p == FSDP_TP_ROWWISE ? cols / (size_t)m->tpn : cols;
}

static int gpt2_map_params(struct fsdp_gpt2 *m)
{
    const struct fsdp_model_spec *s = m->spec;
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, L = (size_t)c->n_layer;
    char name[FSDP_PARAM_NAME_MAX + 16];
    V = m->tvl; /* tensor parallel: this rank's vocabulary slice, padded */
    FSDP_CHECK(gpt2_locate(s, "wte.weight", 0, V, C, &m->emb_off[0]));
    FSDP_CHECK(gpt2_locate(s, "wpe.weight", 0, (size_t)c->context, C, &m->emb_off[1]));
    for (size_t l = 0; l < L; l++) {
        size_t off;
#define FSDP_GPT2_X(id, field, suffix, rows, cols, init, std, decay, tp)                      \
        snprintf(name, sizeof(name), "h.%zu.%s", l, suffix);                              \
        FSDP_CHECK(gpt2_locate(s, name, 1 + (int)l, gpt2_tp_rows(m, (rows) * C, tp),       \
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
    FSDP_CHECK(gpt2_locate(s, "ln_f.weight", last, C, 0, &m->head_off[0]));
    FSDP_CHECK(gpt2_locate(s, "ln_f.bias", last, C, 0, &m->head_off[1]));
    long lm = fsdp_model_spec_find(s, "lm_head.weight");
    if (c->tied) {
        if (lm >= 0) {
            return fsdp_err(FSDP_ERR_INTERNAL, "parameter table: tied model lists lm_head.weight");
        }
        m->head_off[2] = m->emb_off[0];
    } else {
        FSDP_CHECK(gpt2_locate(s, "lm_head.weight", last, V, C, &m->head_off[2]));
    }
    return 0;
}

void fsdp_gpt2_embed_view(const struct fsdp_gpt2 *m, float *unit0, struct fsdp_gpt2_embed_view *v)
{
    v->wte = unit0 + m->emb_off[0];
    v->wpe = unit0 + m->emb_off[1];
}

void fsdp_gpt2_block_view(const struct fsdp_gpt2 *m, float *unit, struct fsdp_gpt2_block_view *v)
{
#define FSDP_GPT2_X(id, field, suffix, rows, cols, init, std, decay, tp) \
    v->field = unit + m->blk_off[FSDP_GPT2_BLK_##id];
    FSDP_GPT2_BLOCK_TENSORS(FSDP_GPT2_X)
#undef FSDP_GPT2_X
}

void fsdp_gpt2_head_view(const struct fsdp_gpt2 *m, float *unit_last, float *unit0,
                         struct fsdp_gpt2_head_view *v)
{
    v->lnfw = unit_last + m->head_off[0];
    v->lnfb = unit_last + m->head_off[1];
    v->lm_head = m->cfg->tied ? unit0 + m->head_off[2] : unit_last + m->head_off[2];
}

// ----------------------------------------------------------------------------
// activation layout

/* Carves n floats (64-byte aligned) from base at *off; base NULL only counts. */
static float *gpt2_take(float *base, size_t *off, size_t n)
{
    float *p = base ? base + *off : NULL;
    *off += (n + 15) & ~(size_t)15;
    return p;
}

/* lc and NH are this rank's heads' width and count (C and NH on one rank);
 * BR the rows of the residual stream it holds (BT, or BT / tp with
 * sequence parallelism). */
static void gpt2_layout_block(struct fsdp_gpt2_block_acts *a, float *base, size_t *off,
                              size_t BT, size_t BR, size_t C, size_t lc, size_t NH)
{
    a->ln1 = gpt2_take(base, off, BR * C);
    a->ln1_mean = gpt2_take(base, off, BR);
    a->ln1_rstd = gpt2_take(base, off, BR);
    a->qkv = gpt2_take(base, off, BT * 3 * lc);
    a->atty = gpt2_take(base, off, BT * lc);
    a->att_lse = gpt2_take(base, off, BT * NH);
    a->res2 = gpt2_take(base, off, BR * C);
    a->ln2 = gpt2_take(base, off, BR * C);
    a->ln2_mean = gpt2_take(base, off, BR);
    a->ln2_rstd = gpt2_take(base, off, BR);
    a->fch = gpt2_take(base, off, BT * 4 * lc);
    a->fch_gelu = gpt2_take(base, off, BT * 4 * lc);
}

/* Rows of a batch of BT rows that the residual stream holds here. */
static size_t gpt2_rows_here(const struct fsdp_gpt2 *m, size_t BT)
{
    return m->sp ? BT / (size_t)m->tpn : BT;
}

/* Rows of FSDP_GPT2_HEAD_BYTES of logits, at least one. */
static int gpt2_head_default_rows(const struct fsdp_gpt2_config *c)
{
    size_t rows = FSDP_GPT2_HEAD_BYTES / ((size_t)c->vocab_size * sizeof(float));
    return rows < 1 ? 1 : rows > INT_MAX ? INT_MAX : (int)rows;
}

/* The tied head split by vocabulary over the ranks of unit 0's rows. */
static int gpt2_vp_head(const struct fsdp_gpt2 *m)
{
    return m->rows_on && m->cfg->tied;
}

/* Rows of every rank's batch, as exchanged with unit 0 by rows. */
static size_t gpt2_rows_all(const struct fsdp_gpt2 *m, size_t BT)
{
    return m->rows_on ? (size_t)m->rows_W * BT : BT;
}

/* Rows the head computes (every rank's when split by vocabulary) and the
 * vocabulary columns it holds. */
static size_t gpt2_head_R(const struct fsdp_gpt2 *m, size_t BT)
{
    return gpt2_vp_head(m) ? gpt2_rows_all(m, BT) : BT;
}

static size_t gpt2_head_V(const struct fsdp_gpt2 *m)
{
    return gpt2_vp_head(m) ? m->wte_rows : m->tp ? m->tvn : (size_t)m->cfg->vocab_size;
}

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

/* Floats of the tile buffer: no tile of any batch up to the largest exceeds it. */
static size_t gpt2_head_tile_floats(const struct fsdp_gpt2 *m)
{
    size_t BT = (size_t)m->max_B * (size_t)m->max_T;
    size_t all = gpt2_head_R(m, BT) * gpt2_head_V(m), budget = gpt2_head_budget(m);
    budget = budget < 16 ? 16 : budget;
    return all < budget ? all : budget;
}

/*
 * Lays the activations out over base into a, or only counts them when base
 * is NULL (a->blocks may then be NULL too); returns the floats needed.
 */
static size_t gpt2_layout_acts(const struct fsdp_gpt2 *m, float *base, struct fsdp_gpt2_acts *a)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->max_B * (size_t)m->max_T, C = (size_t)c->n_embd;
    size_t L = (size_t)c->n_layer, NH = (size_t)m->lnh, lc = m->lc, BR = gpt2_rows_here(m, BT);
    struct fsdp_gpt2_block_acts blk;
    size_t off = 0;
    int any_ckpt = 0;
    a->residual = gpt2_take(base, &off, (L + 1) * BR * C);
    a->lnf = gpt2_take(base, &off, BT * C);
    a->lnf_mean = gpt2_take(base, &off, BR);
    a->lnf_rstd = gpt2_take(base, &off, BR);
    size_t R = gpt2_head_R(m, BT), rows_all = m->rows_on ? gpt2_rows_all(m, BT) : 0;
    a->head_logits = gpt2_take(base, &off, gpt2_head_tile_floats(m));
    a->ce_stats = gpt2_take(base, &off, 2 * R);
    a->losses = gpt2_take(base, &off, BT);
    /* token ids share the float buffer: 4 bytes each, only ever read as ids */
    a->tok_all = (int32_t *)(void *)gpt2_take(base, &off, rows_all);
    a->tgt_all = (int32_t *)(void *)gpt2_take(base, &off, gpt2_vp_head(m) ? rows_all : 0);
    a->att_scratch = gpt2_take(base, &off, m->k->attention_scratch_floats(m->max_T));
    for (size_t l = 0; l < L; l++) {
        if (m->checkpoint[l]) {
            any_ckpt = 1;
            continue;
        }
        gpt2_layout_block(&blk, base, &off, BT, BR, C, lc, NH);
        if (a->blocks) {
            a->blocks[l] = blk;
        }
    }
    if (any_ckpt) {
        gpt2_layout_block(&blk, base, &off, BT, BR, C, lc, NH); /* one set shared by all of them */
        for (size_t l = 0; l < L && a->blocks; l++) {
            if (m->checkpoint[l]) {
                a->blocks[l] = blk;
            }
        }
    }
    return off;
}

/* The head and the embedding use the space of dqkv and dfch, which only a
 * block's backward needs: the workspace is the larger of the two uses. */
static size_t gpt2_layout_grad_acts(const struct fsdp_gpt2 *m, float *base,
                                    struct fsdp_gpt2_grad_acts *g)
{
    size_t BT = (size_t)m->max_B * (size_t)m->max_T, C = (size_t)m->cfg->n_embd;
    size_t R = gpt2_head_R(m, BT), all = gpt2_rows_all(m, BT);
    int ex = m->rows_on && m->rows_W > 1, vp = ex && gpt2_vp_head(m);
    size_t off = 0;
    g->dres = gpt2_take(base, &off, gpt2_rows_here(m, BT) * C);
    g->dbtc = gpt2_take(base, &off, BT * C);
    g->xfull = gpt2_take(base, &off, m->sp ? BT * C : 0);
    g->spg = gpt2_take(base, &off, m->sp ? 4 * C : 0);
    size_t shared = off;
    g->dqkv = gpt2_take(base, &off, BT * 3 * m->lc);
    g->dfch = gpt2_take(base, &off, BT * 4 * m->lc);
    size_t blocks = off;
    off = shared;
    g->xall = gpt2_take(base, &off, ex ? all * C : 0);
    g->dxall = gpt2_take(base, &off, vp ? all * C : 0);
    g->zt = gpt2_take(base, &off, R);
    /* tensor parallel: the parallel cross-entropy's scratch (3 R) */
    g->mx = gpt2_take(base, &off, vp ? R : m->tp ? 3 * R : 0);
    g->sz = gpt2_take(base, &off, vp ? 2 * R : 0);
    return off > blocks ? off : blocks;
}

/* Activation memory from the model's device (host memory without one). */
static void *gpt2_alloc(const struct fsdp_gpt2 *m, size_t bytes)
{
    return m->dev ? m->dev->ops->alloc(m->dev, bytes) : fsdp_alloc(bytes);
}

static void gpt2_free(const struct fsdp_gpt2 *m, void *p)
{
    if (m->dev) {
        m->dev->ops->free(m->dev, p);
    } else {
        fsdp_free(p);
    }
}

int fsdp_gpt2_reserve(struct fsdp_gpt2 *m)
{
    int fresh = 0;
    if (!m->act_memory) {
        m->act_floats = fsdp_gpt2_activation_bytes(m) / sizeof(float);
        m->act_memory = gpt2_alloc(m, m->act_floats * sizeof(float));
        if (!m->act_memory) {
            return fsdp_err(FSDP_ERR_NOMEM, "gpt2 activations: %zu MiB",
                            m->act_floats * sizeof(float) >> 20);
        }
        gpt2_layout_acts(m, m->act_memory, &m->acts);
        fresh = 1;
    }
    if (!m->grad_act_memory) {
        m->grad_act_floats = fsdp_gpt2_workspace_bytes(m) / sizeof(float);
        m->grad_act_memory = gpt2_alloc(m, m->grad_act_floats * sizeof(float));
        if (!m->grad_act_memory) {
            return fsdp_err(FSDP_ERR_NOMEM, "gpt2 activation gradients: %zu MiB",
                            m->grad_act_floats * sizeof(float) >> 20);
        }
        gpt2_layout_grad_acts(m, m->grad_act_memory, &m->gacts);
        fresh = 1;
    }
    if (fresh) {
        FSDP_DEBUG(FSDP_SUB_MODEL, "gpt2 activations %.1f MiB, workspace %.1f MiB (B=%d T=%d)",
                   (double)(m->act_floats * sizeof(float)) / 1048576.0,
                   (double)(m->grad_act_floats * sizeof(float)) / 1048576.0, m->max_B, m->max_T);
    }
    return 0;
}

size_t fsdp_gpt2_activation_bytes(const struct fsdp_gpt2 *m)
{
    struct fsdp_gpt2_acts count = {.blocks = NULL};
    return gpt2_layout_acts(m, NULL, &count) * sizeof(float);
}

size_t fsdp_gpt2_workspace_bytes(const struct fsdp_gpt2 *m)
{
    struct fsdp_gpt2_grad_acts count;
    return gpt2_layout_grad_acts(m, NULL, &count) * sizeof(float);
}

// ----------------------------------------------------------------------------
// lifetime and settings

static int gpt2_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                       struct fsdp_tp *tp, struct fsdp_gpt2 **out)
{
    int rc;
    if (spec->arch != &fsdp_gpt2_arch) {
        return fsdp_err(FSDP_ERR_INVALID, "gpt2: the spec is of architecture %s",
                        spec->arch ? spec->arch->name : "(none)");
    }
    const struct fsdp_gpt2_config *c = fsdp_gpt2_cfg(spec);
    if (max_B < 1 || max_T < 1 || max_T > c->context) {
        return fsdp_err(FSDP_ERR_INVALID, "gpt2: batch %d x %d invalid (need B >= 1, 1 <= T <= %d)",
                        max_B, max_T, c->context);
    }
    double floats = (double)max_B * max_T * ((double)c->vocab_size + 20.0 * c->n_embd * (c->n_layer + 2));
    if (floats * sizeof(float) > 0x1p50) {
        return fsdp_err(FSDP_ERR_INVALID, "gpt2: batch %d x %d needs %.3g bytes of activations",
                        max_B, max_T, floats * sizeof(float));
    }
    struct fsdp_gpt2 *m = calloc(1, sizeof(*m));
    if (!m) {
        return fsdp_err(FSDP_ERR_NOMEM, "gpt2 model");
    }
    m->base.ops = &fsdp_gpt2_ops;
    m->base.spec = spec;
    m->k = fsdp_cpu_kernels();
    m->spec = spec;
    m->cfg = c;
    m->max_B = max_B;
    m->max_T = max_T;
    m->ignore_index = -1;
    m->loss_scale = 1.0f;
    m->head_chunk = gpt2_head_default_rows(c);
    m->bwd_next = -1;
    m->loss = NAN;
    m->tp = fsdp_tp_on(tp) ? tp : NULL;
    m->tpn = m->tp ? tp->size : 1;
    m->sp = m->tp && tp->sp;
    m->lnh = c->n_head / m->tpn;
    m->lc = (size_t)c->n_embd / (size_t)m->tpn;
    fsdp_tp_vocab_split((size_t)c->vocab_size, m->tpn, m->tp ? tp->rank : 0, &m->tv0, &m->tvn,
                        &m->tvl);
    size_t nu = (size_t)spec->n_units, L = (size_t)c->n_layer;
    m->unit_params = calloc(nu, sizeof(float *));
    m->unit_grads = calloc(nu, sizeof(float *));
    m->fwd_done = calloc(nu, 1);
    m->checkpoint = calloc(L, 1);
    m->acts.blocks = calloc(L, sizeof(*m->acts.blocks));
    if (!m->unit_params || !m->unit_grads || !m->fwd_done || !m->checkpoint || !m->acts.blocks) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "gpt2 model tables");
        goto err_free;
    }
    if (c->n_head % m->tpn != 0) {
        rc = fsdp_err(FSDP_ERR_INVALID, "gpt2: n_head %d is not divisible by tp %d", c->n_head,
                      m->tpn);
        goto err_free;
    }
    if (m->sp && ((size_t)max_B * (size_t)max_T) % (size_t)m->tpn != 0) {
        rc = fsdp_err(FSDP_ERR_INVALID, "gpt2: sequence parallel over tp %d: batch %d x %d does "
                      "not split into %d equal row ranges", m->tpn, max_B, max_T, m->tpn);
        goto err_free;
    }
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
    return gpt2_create(spec, max_B, max_T, NULL, out);
}

void fsdp_gpt2_destroy(struct fsdp_gpt2 *m)
{
    if (!m) {
        return;
    }
    gpt2_free(m, m->act_memory);
    gpt2_free(m, m->grad_act_memory);
    free(m->acts.blocks);
    free(m->checkpoint);
    free(m->fwd_done);
    free(m->unit_grads);
    free(m->unit_params);
    free(m);
}

/* The saved-activation layout depends on the checkpoint flags and the head
 * chunk: dropped here, rebuilt on demand (the next reserve or set_batch). */
static void gpt2_relayout(struct fsdp_gpt2 *m)
{
    gpt2_free(m, m->act_memory);
    m->act_memory = NULL;
    m->tokens = NULL;
    m->targets = NULL;
    m->shadow = 0;
    m->head_x_ready = 0;
    memset(m->fwd_done, 0, (size_t)m->spec->n_units);
}

int fsdp_gpt2_set_checkpoint(struct fsdp_gpt2 *m, int l, int on)
{
    int L = m->cfg->n_layer;
    if (l >= L) {
        return fsdp_err(FSDP_ERR_INVALID, "checkpoint: block %d out of range [0, %d)", l, L);
    }
    if (m->bwd_next >= 0) {
        return fsdp_err(FSDP_ERR_INVALID, "checkpoint flags changed between forward and backward");
    }
    for (int i = 0; i < L; i++) {
        if (l < 0 || i == l) {
            m->checkpoint[i] = on ? 1 : 0;
        }
    }
    gpt2_relayout(m);
    return 0;
}

int fsdp_gpt2_set_head_chunk(struct fsdp_gpt2 *m, int rows)
{
    if (rows < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "LM head chunk of %d rows (need at least 1, or 0 for "
                        "the default)", rows);
    }
    if (m->bwd_next >= 0) {
        return fsdp_err(FSDP_ERR_INVALID, "LM head chunk changed between forward and backward");
    }
    m->head_chunk = rows ? rows : gpt2_head_default_rows(m->cfg);
    gpt2_relayout(m);
    return 0;
}

int fsdp_gpt2_set_unit_rows(struct fsdp_gpt2 *m, int u, struct fsdp_group *g)
{
    const struct fsdp_model_spec *s = m->spec;
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
    fsdp_tp_init(&m->rows_x, g, 0, m->dev ? m->dev->mem : FSDP_MEM_HOST, m->k);
    m->rows_W = (int)W;
    m->rows_r = (int)r;
    m->rows_on = 1;
    gpt2_relayout(m);
    gpt2_free(m, m->grad_act_memory); /* the workspace holds every rank's rows now */
    m->grad_act_memory = NULL;
    return 1;
}

int fsdp_gpt2_set_unit(struct fsdp_gpt2 *m, int u, float *params, float *grads)
{
    if (u < 0 || u >= m->spec->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "unit %d out of range [0, %d)", u, m->spec->n_units);
    }
    m->unit_params[u] = params;
    m->unit_grads[u] = grads;
    return 0;
}

void fsdp_gpt2_set_ignore_index(struct fsdp_gpt2 *m, int32_t ignore_index)
{
    m->ignore_index = ignore_index;
}

void fsdp_gpt2_set_loss_seed(struct fsdp_gpt2 *m, double divisor, float scale)
{
    m->loss_divisor = divisor;
    m->loss_scale = scale;
}

int fsdp_gpt2_zero_grad(struct fsdp_gpt2 *m, int u)
{
    int n = m->spec->n_units;
    if (u >= n) {
        return fsdp_err(FSDP_ERR_INVALID, "unit %d out of range [0, %d)", u, n);
    }
    for (int i = u < 0 ? 0 : u; i < (u < 0 ? n : u + 1); i++) {
        if (!m->unit_grads[i]) {
            return fsdp_err(FSDP_ERR_INVALID, "zero_grad: unit %d has no gradient buffer", i);
        }
        size_t numel = i == 0 && m->rows_on ? m->rows_numel : m->spec->unit_numel[i];
        memset(m->unit_grads[i], 0, numel * sizeof(float));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// forward

int fsdp_gpt2_set_batch(struct fsdp_gpt2 *m, const int32_t *tokens, const int32_t *targets,
                        int B, int T)
{
    int V = m->cfg->vocab_size;
    if (B < 1 || B > m->max_B || T < 1 || T > m->max_T) {
        return fsdp_err(FSDP_ERR_INVALID, "batch %d x %d exceeds the model's %d x %d", B, T,
                        m->max_B, m->max_T);
    }
    if (m->sp && ((size_t)B * (size_t)T) % (size_t)m->tpn != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "batch %d x %d does not split over the %d ranks of "
                        "sequence parallelism", B, T, m->tpn);
    }
    if (!tokens && (!m->rows_on || targets)) {
        return fsdp_err(FSDP_ERR_INVALID, "batch has %s", targets ? "targets but no tokens" : "no tokens");
    }
    for (size_t i = 0; tokens && i < (size_t)B * (size_t)T; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            return fsdp_err(FSDP_ERR_INVALID, "token %d at (b=%zu, t=%zu) out of range [0, %d)",
                            (int)tokens[i], i / (size_t)T, i % (size_t)T, V);
        }
        if (targets && targets[i] != m->ignore_index && (targets[i] < 0 || targets[i] >= V)) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "target %d at (b=%zu, t=%zu) out of range [0, %d) and not the ignore "
                            "index %d",
                            (int)targets[i], i / (size_t)T, i % (size_t)T, V, (int)m->ignore_index);
        }
    }
    FSDP_CHECK(fsdp_gpt2_reserve(m));
    m->B = B;
    m->T = T;
    m->tokens = tokens;
    m->targets = targets;
    m->shadow = tokens == NULL;
    m->head_x_ready = 0;
    memset(m->fwd_done, 0, (size_t)m->spec->n_units);
    m->bwd_next = -1;
    return 0;
}

/* A batch was set: this rank's, or none here with unit 0 by rows. */
static int gpt2_has_batch(const struct fsdp_gpt2 *m)
{
    return m->tokens || m->shadow;
}

// ----------------------------------------------------------------------------
// exchanges between the ranks holding unit 0's rows (blocking: the units
// that need them cannot compute before they complete)

/* count elements of every rank into recv, rank after rank (send may be
 * this rank's block of recv); counted in rows_x like every exchange here */
static int gpt2_allgather(struct fsdp_gpt2 *m, const void *send, void *recv, size_t count,
                          enum fsdp_dtype t)
{
    return fsdp_tp_all_gather(&m->rows_x, send, recv, count, t);
}

/* recv (count) = the sum over ranks of their block rank of send */
static int gpt2_reduce_scatter(struct fsdp_gpt2 *m, const float *send, float *recv, size_t count)
{
    return fsdp_tp_reduce_scatter(&m->rows_x, send, recv, count);
}

static int gpt2_allreduce(struct fsdp_gpt2 *m, float *buf, size_t count, enum fsdp_redop op)
{
    return fsdp_tp_all_reduce(&m->rows_x, buf, count, op);
}

static float *gpt2_residual(const struct fsdp_gpt2 *m, int l)
{
    size_t BT = (size_t)m->max_B * (size_t)m->max_T;
    return m->acts.residual + (size_t)l * gpt2_rows_here(m, BT) * (size_t)m->cfg->n_embd;
}

// ----------------------------------------------------------------------------
// tensor-parallel regions (model/tp_ops.h): entering a column-parallel
// product and leaving a row-parallel one, with and without sequence
// parallelism

/* The input of a column-parallel product from a norm's output x (the rows
 * held here): x itself, or with sequence parallelism every rank's rows
 * gathered into xfull. */
static int gpt2_tp_enter(struct fsdp_gpt2 *m, const float *x, size_t BT, const float **in)
{
    size_t C = (size_t)m->cfg->n_embd;
    if (!m->sp) {
        *in = x;
        return 0;
    }
    FSDP_CHECK(fsdp_tp_seq_gather_forward(m->tp, x, m->gacts.xfull, BT / (size_t)m->tpn, C));
    *in = m->gacts.xfull;
    return 0;
}

/* The gradient of a residual-stream tensor (dres, rows held here) as a
 * row-parallel product's output gradient: dres itself, or with sequence
 * parallelism every rank's rows gathered into dbtc. */
static int gpt2_tp_dout(struct fsdp_gpt2 *m, size_t BT, const float **dout)
{
    size_t C = (size_t)m->cfg->n_embd;
    if (!m->sp) {
        *dout = m->gacts.dres;
        return 0;
    }
    FSDP_CHECK(fsdp_tp_seq_scatter_backward(m->tp, m->gacts.dres, m->gacts.dbtc,
                                            BT / (size_t)m->tpn, C));
    *dout = m->gacts.dbtc;
    return 0;
}

/* A column-parallel product's input gradient part (dbtc, every row) into
 * the rows held here, summed over the ranks: all-reduced in place, or with
 * sequence parallelism reduce-scattered into xfull. */
static int gpt2_tp_din(struct fsdp_gpt2 *m, size_t BT, const float **din)
{
    size_t C = (size_t)m->cfg->n_embd;
    if (!m->sp) {
        FSDP_CHECK(fsdp_tp_copy_in_backward(m->tp, m->gacts.dbtc, BT * C));
        *din = m->gacts.dbtc;
        return 0;
    }
    FSDP_CHECK(fsdp_tp_seq_gather_backward(m->tp, m->gacts.dbtc, m->gacts.xfull,
                                           BT / (size_t)m->tpn, C));
    *din = m->gacts.xfull;
    return 0;
}

/* Sequence parallel: n norm-parameter gradients over this rank's rows
 * (spg, n x C) summed over the ranks and added into dst[0..n). */
static int gpt2_sp_norm_grads(struct fsdp_gpt2 *m, float *const *dst, int n)
{
    size_t C = (size_t)m->cfg->n_embd;
    FSDP_CHECK(fsdp_tp_all_reduce(m->tp, m->gacts.spg, (size_t)n * C, FSDP_SUM));
    for (int j = 0; j < n; j++) {
        for (size_t i = 0; i < C; i++) {
            dst[j][i] += m->gacts.spg[(size_t)j * C + i];
        }
    }
    return 0;
}

/*
 * out = residual + inp (BT, K) @ w^T + bias, a row-parallel layer (c_proj):
 * w (C, K) holds this rank's K input features, so with tensor parallelism
 * the partial products are summed over the ranks (reduce-out; with sequence
 * parallelism reduce-scattered to the rows held here) before the bias and
 * the residual, which every rank holds, are added. The partial sums go
 * through dbtc, which no forward uses otherwise. out and residual have the
 * rows held here.
 */
static int gpt2_row_parallel(struct fsdp_gpt2 *m, float *out, const float *inp, const float *w,
                             const float *bias, const float *residual, size_t BT, size_t K)
{
    size_t C = (size_t)m->cfg->n_embd, BR = gpt2_rows_here(m, BT);
    if (!m->tp) {
        m->k->matmul_forward(out, inp, w, bias, residual, BT, K, C);
        return 0;
    }
    float *part = m->gacts.dbtc;
    m->k->matmul_forward(part, inp, w, NULL, NULL, BT, K, C);
    if (m->sp) {
        FSDP_CHECK(fsdp_tp_seq_scatter_forward(m->tp, part, out, BR, C));
        m->k->bias_residual_forward(out, out, bias, residual, BR, C);
        return 0;
    }
    FSDP_CHECK(fsdp_tp_reduce_out_forward(m->tp, part, BT * C));
    m->k->bias_residual_forward(out, part, bias, residual, BT, C);
    return 0;
}

/* Block l from residual[l]; full = 0 stops before c_proj of the MLP, which
 * only produces residual[l+1] (what a checkpointed backward does not need).
 * With tensor parallelism q, k, v, c_fc and their activations are this
 * rank's heads and features (lc = C / tp wide, lnh heads). */
static int gpt2_block_forward(struct fsdp_gpt2 *m, int l, int full)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, lc = m->lc;
    size_t BR = gpt2_rows_here(m, BT);
    struct fsdp_gpt2_block_view w;
    struct fsdp_gpt2_block_acts *a = &m->acts.blocks[l];
    float *x = gpt2_residual(m, l);
    const float *in;
    fsdp_gpt2_block_view(m, m->unit_params[1 + l], &w);
    m->k->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w.ln1w, w.ln1b, BR, C, c->ln_eps);
    FSDP_CHECK(gpt2_tp_enter(m, a->ln1, BT, &in));
    m->k->matmul_forward(a->qkv, in, w.qkvw, w.qkvb, NULL, BT, C, 3 * lc);
    m->k->attention_forward(a->atty, a->att_lse, m->acts.att_scratch, a->qkv, m->B, m->T,
                            (int)lc, m->lnh);
    FSDP_CHECK(gpt2_row_parallel(m, a->res2, a->atty, w.attprojw, w.attprojb, x, BT, lc));
    m->k->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w.ln2w, w.ln2b, BR, C,
                               c->ln_eps);
    FSDP_CHECK(gpt2_tp_enter(m, a->ln2, BT, &in));
    m->k->matmul_forward(a->fch, in, w.fcw, w.fcb, NULL, BT, C, 4 * lc);
    m->k->gelu_forward(a->fch_gelu, a->fch, BT * 4 * lc);
    if (full) {
        FSDP_CHECK(gpt2_row_parallel(m, gpt2_residual(m, l + 1), a->fch_gelu, w.fcprojw,
                                     w.fcprojb, a->res2, BT, 4 * lc));
    }
    return 0;
}

/* The head's weight rows (the vocabulary [v0, v0 + Vh) it holds) and their
 * gradient: unit 0's wte rows when split by vocabulary, else the whole
 * lm_head (wte when tied). */
static void gpt2_head_weights(const struct fsdp_gpt2 *m, int with_grad, const float **w,
                              float **dw, size_t *v0)
{
    int last = m->cfg->n_layer + 1;
    if (gpt2_vp_head(m)) {
        *w = m->unit_params[0] + m->wte_at;
        *dw = with_grad ? m->unit_grads[0] + m->wte_at : NULL;
        *v0 = m->wte_row0;
        return;
    }
    struct fsdp_gpt2_head_view hv, dhv;
    fsdp_gpt2_head_view(m, m->unit_params[last], m->unit_params[0], &hv);
    *w = hv.lm_head;
    *dw = NULL;
    if (with_grad) {
        fsdp_gpt2_head_view(m, m->unit_grads[last], m->unit_grads[0], &dhv);
        *dw = dhv.lm_head;
    }
    *v0 = m->tp ? m->tv0 : 0; /* tensor parallel: this rank's slice of the vocabulary */
}

/* logits (rows, n) of X's rows against weight rows [c0, c0 + n) of w */
static void gpt2_head_tile_logits(const struct fsdp_gpt2 *m, const float *X, const float *w,
                                  size_t c0, size_t rows, size_t n, float *out)
{
    size_t C = (size_t)m->cfg->n_embd;
    m->k->matmul_forward(out, X, w + c0 * C, NULL, NULL, rows, C, n);
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
    for (size_t i = 0; i < R; i++) {
        g->mx[i] = m->wte_rows ? stats[2 * i] : -INFINITY;
    }
    FSDP_CHECK(gpt2_allreduce(m, g->mx, R, FSDP_MAX));
    for (size_t i = 0; i < R; i++) {
        float s = m->wte_rows ? stats[2 * i + 1] : 0.0f;
        g->sz[i] = s > 0.0f ? s * expf(stats[2 * i] - g->mx[i]) : 0.0f;
        g->sz[R + i] = m->wte_rows ? zt[i] : 0.0f;
    }
    FSDP_CHECK(gpt2_allreduce(m, g->sz, 2 * R, FSDP_SUM));
    for (size_t i = 0; i < R; i++) {
        stats[2 * i] = g->mx[i];
        stats[2 * i + 1] = g->sz[i];
        zt[i] = g->sz[R + i];
    }
    return 0;
}

/* Every rank's ln_f rows into xall (zeros from a rank without a batch). */
static int gpt2_head_gather_x(struct fsdp_gpt2 *m, size_t BT)
{
    size_t C = (size_t)m->cfg->n_embd;
    if (m->shadow) {
        memset(m->acts.lnf, 0, BT * C * sizeof(float));
    }
    FSDP_CHECK(gpt2_allgather(m, m->acts.lnf, m->gacts.xall, BT * C, FSDP_F32));
    m->head_x_ready = 1;
    return 0;
}

/*
 * ln_f, then with targets the loss over tiles of the head's rows and a
 * vocabulary slice: each tile's logits, folded into per-row statistics and
 * target logits; the logits are dropped (unless one tile holds them all).
 * Split by vocabulary the rows are every rank's and the statistics are
 * combined over the ranks. The mean adds this rank's kept rows' losses in
 * row order in double, as the one-pass kernel does.
 */
static int gpt2_head_forward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd;
    struct fsdp_gpt2_acts *a = &m->acts;
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    int vp = gpt2_vp_head(m), ex = vp && m->rows_W > 1;
    if (!m->shadow) { /* sequence parallel: this rank's rows, then every rank's gathered */
        struct fsdp_gpt2_head_view w;
        size_t BR = gpt2_rows_here(m, BT);
        float *mine = a->lnf + (m->sp ? (size_t)m->tp->rank * BR * C : 0);
        fsdp_gpt2_head_view(m, m->unit_params[c->n_layer + 1], m->unit_params[0], &w);
        m->k->layernorm_forward(mine, a->lnf_mean, a->lnf_rstd, gpt2_residual(m, c->n_layer),
                                w.lnfw, w.lnfb, BR, C, c->ln_eps);
        if (m->sp) {
            FSDP_CHECK(fsdp_tp_seq_gather_forward(m->tp, mine, a->lnf, BR, C));
        }
    }
    m->bwd_next = -1;
    if (!m->targets && !m->shadow) {
        return 0;
    }
    m->n_kept = 0;
    m->kept_all = 0;
    m->loss = NAN;
    if (m->shadow && !ex) {
        m->bwd_next = m->spec->n_units - 1; /* nothing here, and no one to serve */
        return 0;
    }
    size_t R = gpt2_head_R(m, BT), Vh = gpt2_head_V(m), own = 0, v0, rt, ct;
    const float *X = a->lnf, *W;
    const int32_t *tgt = m->targets;
    float *dW;
    gpt2_head_weights(m, 0, &W, &dW, &v0);
    if (ex) {
        FSDP_CHECK(gpt2_head_gather_x(m, BT));
        int32_t *mine = a->tgt_all + (size_t)m->rows_r * BT;
        for (size_t i = 0; i < BT; i++) {
            mine[i] = m->shadow ? m->ignore_index : m->targets[i];
        }
        FSDP_CHECK(gpt2_allgather(m, mine, a->tgt_all, BT, FSDP_I32));
        X = g->xall;
        tgt = a->tgt_all;
        own = (size_t)m->rows_r * BT;
    }
    gpt2_head_tile(m, R, Vh, &rt, &ct);
    for (size_t i = 0; i < R && Vh == 0; i++) { /* a slice of padding only: nothing to add */
        a->ce_stats[2 * i] = -INFINITY;
        a->ce_stats[2 * i + 1] = 0.0f;
        g->zt[i] = 0.0f;
    }
    for (size_t i0 = 0; i0 < R && Vh > 0; i0 += rt) {
        size_t rows = R - i0 < rt ? R - i0 : rt;
        for (size_t c0 = 0; c0 < Vh; c0 += ct) {
            size_t n = Vh - c0 < ct ? Vh - c0 : ct;
            gpt2_head_tile_logits(m, X + i0 * C, W, c0, rows, n, a->head_logits);
            m->k->crossentropy_slice_forward(a->ce_stats + 2 * i0, g->zt + i0, a->head_logits,
                                             tgt + i0, rows, n, v0 + c0, m->ignore_index,
                                             c0 == 0);
        }
    }
    if (ex) {
        FSDP_CHECK(gpt2_head_combine(m, a->ce_stats, g->zt, R));
    } else if (m->tp) { /* the parallel cross-entropy: every row's statistics over all of V */
        FSDP_CHECK(fsdp_tp_xent_combine(m->tp, a->ce_stats, g->zt, g->mx, R));
    }
    for (size_t i = 0; i < R; i++) {
        m->kept_all += tgt[i] != m->ignore_index;
    }
    size_t kept = 0;
    double sum = 0.0;
    for (size_t r = 0; r < BT && !m->shadow; r++) {
        const float *st = a->ce_stats + 2 * (own + r);
        if (m->targets[r] == m->ignore_index) {
            a->losses[r] = 0.0f;
            continue;
        }
        a->losses[r] = st[0] + logf(st[1]) - g->zt[own + r];
        sum += a->losses[r];
        kept++;
    }
    m->n_kept = kept;
    m->loss = kept ? (float)(sum / (double)kept) : NAN;
    m->bwd_next = m->spec->n_units - 1;
    return 0;
}

int fsdp_gpt2_logits(struct fsdp_gpt2 *m, size_t row0, size_t rows, float *out)
{
    int last = m->spec->n_units - 1;
    size_t BT = (size_t)m->B * (size_t)m->T;
    if (!m->tokens || !m->fwd_done[last]) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: no forward of the last unit since the batch was set");
    }
    if (row0 > BT || rows > BT - row0) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: rows [%zu, %zu + %zu) outside the batch's %zu",
                        row0, row0, rows, BT);
    }
    if (gpt2_vp_head(m)) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: this rank holds only wte rows [%zu, %zu) of "
                        "the tied head", m->wte_row0, m->wte_row0 + m->wte_rows);
    }
    if (m->tp) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: with tensor parallelism this rank holds only "
                        "the head's vocabulary [%zu, %zu)", m->tv0, m->tv0 + m->tvn);
    }
    if (!m->unit_params[last] || (m->cfg->tied && !m->unit_params[0])) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: the head's parameters are not set");
    }
    struct fsdp_gpt2_head_view w;
    fsdp_gpt2_head_view(m, m->unit_params[last], m->unit_params[0], &w);
    if (rows > 0) {
        size_t C = (size_t)m->cfg->n_embd;
        gpt2_head_tile_logits(m, m->acts.lnf + row0 * C, w.lm_head, 0, rows,
                              (size_t)m->cfg->vocab_size, out);
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
    size_t BT = (size_t)m->B * (size_t)m->T;
    float *x = gpt2_residual(m, 0);
    if (m->tp) { /* vocabulary parallel; sequence parallel: through dbtc to this rank's rows */
        struct fsdp_gpt2_embed_view w;
        fsdp_gpt2_embed_view(m, m->unit_params[0], &w);
        return fsdp_tp_embed_forward(m->tp, x, m->sp ? m->gacts.dbtc : x, m->tokens, w.wte,
                                     (size_t)c->vocab_size, w.wpe, (size_t)m->T, BT,
                                     (size_t)c->n_embd);
    }
    if (!m->rows_on) {
        struct fsdp_gpt2_embed_view w;
        fsdp_gpt2_embed_view(m, m->unit_params[0], &w);
        m->k->encoder_forward(x, m->tokens, w.wte, w.wpe, m->B, m->T, c->n_embd);
        return 0;
    }
    int32_t *mine = m->acts.tok_all + (size_t)m->rows_r * BT;
    const float *p = m->unit_params[0];
    for (size_t i = 0; i < BT; i++) {
        mine[i] = m->shadow ? 0 : m->tokens[i];
    }
    m->head_x_ready = 0;
    if (m->rows_W == 1) {
        m->k->embed_rows_forward(x, mine, p + m->wte_at, m->wte_row0, m->wte_rows,
                                 p + m->wpe_at, m->wpe_row0, m->wpe_rows, BT, m->T, c->n_embd);
        return 0;
    }
    size_t all = gpt2_rows_all(m, BT);
    FSDP_CHECK(gpt2_allgather(m, mine, m->acts.tok_all, BT, FSDP_I32));
    m->k->embed_rows_forward(m->gacts.xall, m->acts.tok_all, p + m->wte_at, m->wte_row0,
                             m->wte_rows, p + m->wpe_at, m->wpe_row0, m->wpe_rows, all, m->T,
                             c->n_embd);
    return gpt2_reduce_scatter(m, m->gacts.xall, x, BT * (size_t)c->n_embd);
}

int fsdp_gpt2_forward_unit(struct fsdp_gpt2 *m, int u)
{
    int n = m->spec->n_units, L = m->cfg->n_layer;
    if (u < 0 || u >= n) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: unit %d out of range [0, %d)", u, n);
    }
    if (!gpt2_has_batch(m)) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: no batch (fsdp_gpt2_set_batch)");
    }
    if (u > 0 && !m->fwd_done[u - 1]) {
        return fsdp_err(FSDP_ERR_INVALID, "forward of unit %d before unit %d's", u, u - 1);
    }
    if (!m->unit_params[u] || (u == L + 1 && m->cfg->tied && !m->unit_params[0])) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: unit %d's parameters are not set%s", u,
                        u == L + 1 && m->cfg->tied ? " (the tied head also reads unit 0)" : "");
    }
    if (u == 0) {
        FSDP_CHECK(gpt2_embed_forward(m));
    } else if (u <= L) {
        if (!m->shadow) {
            FSDP_CHECK(gpt2_block_forward(m, u - 1, 1));
        }
    } else {
        FSDP_CHECK(gpt2_head_forward(m));
    }
    m->fwd_done[u] = 1;
    return 0;
}

int fsdp_gpt2_forward(struct fsdp_gpt2 *m, const int32_t *tokens, const int32_t *targets, int B,
                      int T, float *loss)
{
    FSDP_CHECK(fsdp_gpt2_set_batch(m, tokens, targets, B, T));
    for (int u = 0; u < m->spec->n_units; u++) {
        FSDP_CHECK(fsdp_gpt2_forward_unit(m, u));
    }
    if (loss) {
        *loss = targets ? m->loss : NAN;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// backward

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
static int gpt2_head_backward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd;
    struct fsdp_gpt2_acts *a = &m->acts;
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    int ex = gpt2_vp_head(m) && m->rows_W > 1, last = c->n_layer + 1;
    if (m->shadow && !ex) {
        memset(g->dres, 0, BT * C * sizeof(float));
        return 0;
    }
    size_t R = gpt2_head_R(m, BT), Vh = gpt2_head_V(m), v0, rt, ct;
    const float *X = a->lnf, *W;
    const int32_t *tgt = m->targets;
    float *dX = g->dbtc, *dW;
    gpt2_head_weights(m, 1, &W, &dW, &v0);
    if (ex) {
        if (!m->head_x_ready) {
            FSDP_CHECK(gpt2_head_gather_x(m, BT));
        }
        X = g->xall;
        dX = g->dxall;
        tgt = a->tgt_all;
    }
    double div = m->loss_divisor > 0 ? m->loss_divisor : (double)m->kept_all;
    /* no kept token: every dlogits row is zero, so is the gradient */
    float alpha = div > 0 ? (float)((double)m->loss_scale / div) : 0.0f;
    gpt2_head_tile(m, R, Vh, &rt, &ct);
    int whole = rt == R && ct == Vh; /* the forward's logits are still in the tile */
    for (size_t i0 = 0; i0 < R; i0 += rt) {
        size_t rows = R - i0 < rt ? R - i0 : rt, kept = 0;
        for (size_t r = i0; r < i0 + rows; r++) {
            kept += tgt[r] != m->ignore_index;
        }
        if (kept == 0 || Vh == 0) {
            memset(dX + i0 * C, 0, rows * C * sizeof(float));
            continue;
        }
        for (size_t c0 = 0; c0 < Vh; c0 += ct) {
            size_t n = Vh - c0 < ct ? Vh - c0 : ct;
            if (!whole) {
                gpt2_head_tile_logits(m, X + i0 * C, W, c0, rows, n, a->head_logits);
            }
            m->k->crossentropy_slice_backward(a->head_logits, a->head_logits,
                                              a->ce_stats + 2 * i0, tgt + i0, rows, n, v0 + c0,
                                              m->ignore_index, 1.0f);
            m->k->matmul_backward(dX + i0 * C, dW + c0 * C, NULL, a->head_logits, X + i0 * C,
                                  W + c0 * C, rows, C, n, alpha, c0 > 0);
        }
    }
    const float *dlnf = dX;
    if (ex) {
        float *mine = dX + (size_t)m->rows_r * BT * C;
        FSDP_CHECK(gpt2_reduce_scatter(m, dX, mine, BT * C));
        dlnf = mine;
    } else if (m->tp) {
        /* each rank's d(ln_f) is its vocabulary slice's part: summed over
         * the ranks into the rows held here (dX is dbtc) */
        FSDP_CHECK(gpt2_tp_din(m, BT, &dlnf));
    }
    m->head_x_ready = 0;
    size_t BR = gpt2_rows_here(m, BT);
    memset(g->dres, 0, BR * C * sizeof(float));
    if (!m->shadow) {
        struct fsdp_gpt2_head_view w, dw;
        fsdp_gpt2_head_view(m, m->unit_params[last], m->unit_params[0], &w);
        fsdp_gpt2_head_view(m, m->unit_grads[last], m->unit_grads[0], &dw);
        if (m->sp) {
            memset(g->spg, 0, 2 * C * sizeof(float));
        }
        m->k->layernorm_backward(g->dres, m->sp ? g->spg : dw.lnfw, m->sp ? g->spg + C : dw.lnfb,
                                 dlnf, gpt2_residual(m, c->n_layer), w.lnfw, a->lnf_mean,
                                 a->lnf_rstd, BR, C);
        if (m->sp) {
            float *const dst[2] = {dw.lnfw, dw.lnfb};
            FSDP_CHECK(gpt2_sp_norm_grads(m, dst, 2));
        }
    }
    return 0;
}

/* dres holds d(block output) on entry and d(block input) on return. With
 * tensor parallelism each rank's d(ln_1) and d(ln_2) are its heads' and
 * features' part, summed over the ranks (copy-in's backward) before the
 * norms' backward; the row-parallel biases' gradients, from dres, which
 * every rank holds whole, come out whole. */
static int gpt2_block_backward(struct fsdp_gpt2 *m, int l)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, lc = m->lc;
    size_t BR = gpt2_rows_here(m, BT);
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    struct fsdp_gpt2_block_acts *a = &m->acts.blocks[l];
    struct fsdp_gpt2_block_view w, dw;
    const float *dout, *in, *din;
    /* sequence parallel: the norms' parameter gradients of this rank's rows
     * go through spg (summed over the ranks at the end), and the gathered
     * dres occupies dbtc, so d(attention output) goes to xfull */
    float *spg = g->spg, *datty = m->sp ? g->xfull : g->dbtc;
    m->head_x_ready = 0; /* dqkv and dfch overwrite the head's scratch */
    if (m->checkpoint[l]) {
        FSDP_CHECK(gpt2_block_forward(m, l, 0));
    }
    fsdp_gpt2_block_view(m, m->unit_params[1 + l], &w);
    fsdp_gpt2_block_view(m, m->unit_grads[1 + l], &dw);
    if (m->sp) {
        memset(spg, 0, 4 * C * sizeof(float));
    }
    /* MLP */
    FSDP_CHECK(gpt2_tp_dout(m, BT, &dout));
    m->k->matmul_backward(g->dfch, dw.fcprojw, dw.fcprojb, dout, a->fch_gelu, w.fcprojw, BT,
                          4 * lc, C, 1.0f, 0);
    m->k->gelu_backward(g->dfch, a->fch, g->dfch, BT * 4 * lc);
    FSDP_CHECK(gpt2_tp_enter(m, a->ln2, BT, &in));
    m->k->matmul_backward(g->dbtc, dw.fcw, dw.fcb, g->dfch, in, w.fcw, BT, C, 4 * lc, 1.0f, 0);
    FSDP_CHECK(gpt2_tp_din(m, BT, &din));
    m->k->layernorm_backward(g->dres, m->sp ? spg : dw.ln2w, m->sp ? spg + C : dw.ln2b, din,
                             a->res2, w.ln2w, a->ln2_mean, a->ln2_rstd, BR, C);
    /* attention */
    FSDP_CHECK(gpt2_tp_dout(m, BT, &dout));
    m->k->matmul_backward(datty, dw.attprojw, dw.attprojb, dout, a->atty, w.attprojw, BT, lc, C,
                          1.0f, 0);
    m->k->attention_backward(g->dqkv, m->acts.att_scratch, datty, a->qkv, a->atty, a->att_lse,
                             m->B, m->T, (int)lc, m->lnh);
    FSDP_CHECK(gpt2_tp_enter(m, a->ln1, BT, &in));
    m->k->matmul_backward(g->dbtc, dw.qkvw, dw.qkvb, g->dqkv, in, w.qkvw, BT, C, 3 * lc, 1.0f, 0);
    FSDP_CHECK(gpt2_tp_din(m, BT, &din));
    m->k->layernorm_backward(g->dres, m->sp ? spg + 2 * C : dw.ln1w,
                             m->sp ? spg + 3 * C : dw.ln1b, din, gpt2_residual(m, l), w.ln1w,
                             a->ln1_mean, a->ln1_rstd, BR, C);
    if (m->sp) {
        float *const dst[4] = {dw.ln2w, dw.ln2b, dw.ln1w, dw.ln1b};
        FSDP_CHECK(gpt2_sp_norm_grads(m, dst, 4));
    }
    return 0;
}

/* The embedding's gradient. By rows: every rank's d(residual) rows are
 * gathered and each rank adds them into the table rows it holds, in the
 * order of the rows (rank after rank), as one rank with every batch would. */
static int gpt2_embed_backward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd;
    float *dres = m->gacts.dres, *dg = m->unit_grads[0];
    if (m->tp) { /* vocabulary parallel (sequence parallel: every rank's rows gathered) */
        struct fsdp_gpt2_embed_view dw;
        const float *dout;
        FSDP_CHECK(gpt2_tp_dout(m, BT, &dout));
        fsdp_gpt2_embed_view(m, dg, &dw);
        fsdp_tp_embed_backward(m->tp, dw.wte, dw.wpe, dout, m->tokens, (size_t)c->vocab_size,
                               (size_t)m->T, BT, C);
        return 0;
    }
    if (!m->rows_on) {
        struct fsdp_gpt2_embed_view dw;
        fsdp_gpt2_embed_view(m, dg, &dw);
        m->k->encoder_backward(dw.wte, dw.wpe, dres, m->tokens, m->B, m->T, c->n_embd);
        return 0;
    }
    const float *rows = dres;
    size_t n = BT;
    if (m->shadow) {
        memset(dres, 0, BT * C * sizeof(float));
    }
    m->head_x_ready = 0;
    if (m->rows_W > 1) {
        n = gpt2_rows_all(m, BT);
        FSDP_CHECK(gpt2_allgather(m, dres, m->gacts.xall, BT * C, FSDP_F32));
        rows = m->gacts.xall;
    }
    m->k->embed_rows_backward(dg + m->wte_at, dg + m->wpe_at, rows, m->acts.tok_all, m->wte_row0,
                              m->wte_rows, m->wpe_row0, m->wpe_rows, n, m->T, c->n_embd);
    return 0;
}

int fsdp_gpt2_backward_unit(struct fsdp_gpt2 *m, int u)
{
    int n = m->spec->n_units, L = m->cfg->n_layer;
    if (u < 0 || u >= n) {
        return fsdp_err(FSDP_ERR_INVALID, "backward: unit %d out of range [0, %d)", u, n);
    }
    if (m->bwd_next < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "backward of unit %d without a forward with targets", u);
    }
    if (u != m->bwd_next) {
        return fsdp_err(FSDP_ERR_INVALID, "backward of unit %d out of order (expected unit %d)", u,
                        m->bwd_next);
    }
    int tied_head = u == L + 1 && m->cfg->tied;
    if (!m->unit_params[u] || !m->unit_grads[u] ||
        (tied_head && (!m->unit_params[0] || !m->unit_grads[0]))) {
        return fsdp_err(FSDP_ERR_INVALID, "backward: unit %d's parameters or gradients are not set%s",
                        u, tied_head ? " (the tied head also uses unit 0's)" : "");
    }
    if (u == 0) {
        FSDP_CHECK(gpt2_embed_backward(m));
    } else if (u <= L) {
        if (!m->shadow) {
            FSDP_CHECK(gpt2_block_backward(m, u - 1));
        }
    } else {
        FSDP_CHECK(gpt2_head_backward(m));
    }
    m->bwd_next = u - 1;
    return 0;
}

int fsdp_gpt2_backward(struct fsdp_gpt2 *m)
{
    for (int u = m->spec->n_units - 1; u >= 0; u--) {
        FSDP_CHECK(fsdp_gpt2_backward_unit(m, u));
    }
    return 0;
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
    return 6.0 * N + 12.0 * L * C * (double)T;
}

// ----------------------------------------------------------------------------
// the generic interface (model.h)

static struct fsdp_gpt2 *gpt2_of(struct fsdp_model *m)
{
    return (struct fsdp_gpt2 *)m;
}

static int gpt2_op_create(const struct fsdp_model_spec *spec, const struct fsdp_model_opts *o,
                          struct fsdp_model **out)
{
    struct fsdp_gpt2 *m = NULL;
    FSDP_CHECK(gpt2_create(spec, o->max_B, o->max_T, o->tp, &m));
    if (o->dev) {
        m->dev = o->dev;
        m->k = o->dev->k;
    }
    if (o->head_chunk > 0) {
        int rc = fsdp_gpt2_set_head_chunk(m, o->head_chunk);
        if (rc < 0) {
            fsdp_gpt2_destroy(m);
            return rc;
        }
    }
    *out = &m->base;
    return 0;
}

static void gpt2_op_destroy(struct fsdp_model *m)
{
    fsdp_gpt2_destroy(gpt2_of(m));
}

/* Units are blocks from 1 to L; -1: every block. The embedding and the
 * head keep their activations (they are small next to a block's). */
static int gpt2_op_set_checkpoint(struct fsdp_model *m, int u, int on)
{
    struct fsdp_gpt2 *g = gpt2_of(m);
    if (u < 0) {
        return fsdp_gpt2_set_checkpoint(g, -1, on);
    }
    if (u < 1 || u > g->cfg->n_layer) {
        return 0;
    }
    return fsdp_gpt2_set_checkpoint(g, u - 1, on);
}

static int gpt2_op_reserve(struct fsdp_model *m)
{
    return fsdp_gpt2_reserve(gpt2_of(m));
}

static int gpt2_op_set_unit(struct fsdp_model *m, int u, float *params, float *grads)
{
    return fsdp_gpt2_set_unit(gpt2_of(m), u, params, grads);
}

static void gpt2_op_set_loss_seed(struct fsdp_model *m, double divisor, float scale)
{
    fsdp_gpt2_set_loss_seed(gpt2_of(m), divisor, scale);
}

static int gpt2_op_set_batch(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets,
                             int B, int T)
{
    return fsdp_gpt2_set_batch(gpt2_of(m), tokens, targets, B, T);
}

static int gpt2_op_forward_unit(struct fsdp_model *m, int u)
{
    return fsdp_gpt2_forward_unit(gpt2_of(m), u);
}

static int gpt2_op_backward_unit(struct fsdp_model *m, int u)
{
    return fsdp_gpt2_backward_unit(gpt2_of(m), u);
}

static float gpt2_op_loss(const struct fsdp_model *m)
{
    return ((const struct fsdp_gpt2 *)m)->loss;
}

static int gpt2_op_logits(struct fsdp_model *m, size_t row0, size_t rows, float *out)
{
    return fsdp_gpt2_logits(gpt2_of(m), row0, rows, out);
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
    struct fsdp_gpt2 *gm = gpt2_of(m);
    if (gm->tp) {
        return 0; /* tensor parallelism splits the tables over tp instead */
    }
    double W = g ? g->size : 1, table = (double)gm->cfg->vocab_size + gm->cfg->context;
    if (u == 0 && table <= 2.0 * W * gm->max_B * gm->max_T) {
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
    if (tp > c->n_head) {
        return fsdp_err(FSDP_ERR_INVALID, "tp %d is larger than n_head %d: every tensor-parallel "
                        "rank needs at least one attention head", tp, c->n_head);
    }
    if (c->n_head % tp != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "n_head %d is not divisible by tp %d: attention is "
                        "split by heads", c->n_head, tp);
    }
    int qkv = strstr(p->name, ".attn.c_attn.") != NULL;
    *out = (struct fsdp_tp_cut){.dim = -1, .chunks = 1, .pad = 0};
    if (p->tp == FSDP_TP_COLWISE) {
        out->dim = 0;
        out->chunks = qkv ? 3 : 1;
    } else if (p->tp == FSDP_TP_ROWWISE) {
        out->dim = 1;
    } else if (p->tp == FSDP_TP_VOCAB) {
        out->dim = 0;
        out->pad = 1;
    }
    return 0;
}

static void gpt2_op_comm_counts(const struct fsdp_model *m, struct fsdp_tp_counts *out)
{
    fsdp_tp_counts_add(out, &((const struct fsdp_gpt2 *)m)->rows_x.counts);
}

static size_t gpt2_op_activation_bytes(const struct fsdp_model *m)
{
    return fsdp_gpt2_activation_bytes((const struct fsdp_gpt2 *)m);
}

static size_t gpt2_op_workspace_bytes(const struct fsdp_model *m)
{
    return fsdp_gpt2_workspace_bytes((const struct fsdp_gpt2 *)m);
}

const struct fsdp_model_ops fsdp_gpt2_ops = {
    .size = sizeof(struct fsdp_model_ops),
    .name = FSDP_MODEL_ARCH_GPT2,
    .create = gpt2_op_create,
    .destroy = gpt2_op_destroy,
    .set_checkpoint = gpt2_op_set_checkpoint,
    .reserve = gpt2_op_reserve,
    .set_unit = gpt2_op_set_unit,
    .set_loss_seed = gpt2_op_set_loss_seed,
    .set_batch = gpt2_op_set_batch,
    .forward_unit = gpt2_op_forward_unit,
    .backward_unit = gpt2_op_backward_unit,
    .loss = gpt2_op_loss,
    .logits = gpt2_op_logits,
    .activation_bytes = gpt2_op_activation_bytes,
    .workspace_bytes = gpt2_op_workspace_bytes,
    .flops_per_token = fsdp_gpt2_flops_per_token,
    .set_unit_rows = gpt2_op_set_unit_rows,
    .decoder_create = fsdp_gpt2_decoder_create,
    .tp_cut = gpt2_op_tp_cut,
    .comm_counts = gpt2_op_comm_counts,
};
