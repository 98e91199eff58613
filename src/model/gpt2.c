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

static int gpt2_map_params(struct fsdp_gpt2 *m)
{
    const struct fsdp_model_spec *s = m->spec;
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, L = (size_t)c->n_layer;
    char name[FSDP_PARAM_NAME_MAX + 16];
    FSDP_CHECK(gpt2_locate(s, "wte.weight", 0, V, C, &m->emb_off[0]));
    FSDP_CHECK(gpt2_locate(s, "wpe.weight", 0, (size_t)c->context, C, &m->emb_off[1]));
    for (size_t l = 0; l < L; l++) {
        size_t off;
#define FSDP_GPT2_X(id, field, suffix, rows, cols, init, std, decay, tp)                      \
        snprintf(name, sizeof(name), "h.%zu.%s", l, suffix);                              \
        FSDP_CHECK(gpt2_locate(s, name, 1 + (int)l, (rows) * C, (cols) * C, &off));       \
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

static void gpt2_layout_block(struct fsdp_gpt2_block_acts *a, float *base, size_t *off,
                              size_t BT, size_t C, size_t NH)
{
    a->ln1 = gpt2_take(base, off, BT * C);
    a->ln1_mean = gpt2_take(base, off, BT);
    a->ln1_rstd = gpt2_take(base, off, BT);
    a->qkv = gpt2_take(base, off, BT * 3 * C);
    a->atty = gpt2_take(base, off, BT * C);
    a->att_lse = gpt2_take(base, off, BT * NH);
    a->res2 = gpt2_take(base, off, BT * C);
    a->ln2 = gpt2_take(base, off, BT * C);
    a->ln2_mean = gpt2_take(base, off, BT);
    a->ln2_rstd = gpt2_take(base, off, BT);
    a->fch = gpt2_take(base, off, BT * 4 * C);
    a->fch_gelu = gpt2_take(base, off, BT * 4 * C);
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
    return gpt2_vp_head(m) ? m->wte_rows : (size_t)m->cfg->vocab_size;
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
    size_t L = (size_t)c->n_layer, NH = (size_t)c->n_head;
    struct fsdp_gpt2_block_acts blk;
    size_t off = 0;
    int any_ckpt = 0;
    a->residual = gpt2_take(base, &off, (L + 1) * BT * C);
    a->lnf = gpt2_take(base, &off, BT * C);
    a->lnf_mean = gpt2_take(base, &off, BT);
    a->lnf_rstd = gpt2_take(base, &off, BT);
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
        gpt2_layout_block(&blk, base, &off, BT, C, NH);
        if (a->blocks) {
            a->blocks[l] = blk;
        }
    }
    if (any_ckpt) {
        gpt2_layout_block(&blk, base, &off, BT, C, NH); /* one set shared by all of them */
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
    g->dres = gpt2_take(base, &off, BT * C);
    g->dbtc = gpt2_take(base, &off, BT * C);
    size_t shared = off;
    g->dqkv = gpt2_take(base, &off, BT * 3 * C);
    g->dfch = gpt2_take(base, &off, BT * 4 * C);
    size_t blocks = off;
    off = shared;
    g->xall = gpt2_take(base, &off, ex ? all * C : 0);
    g->dxall = gpt2_take(base, &off, vp ? all * C : 0);
    g->zt = gpt2_take(base, &off, R);
    g->mx = gpt2_take(base, &off, vp ? R : 0);
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

int fsdp_gpt2_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                     struct fsdp_gpt2 **out)
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
    FSDP_CHECK_GOTO(gpt2_map_params(m), rc, err_free);
    *out = m;
    return 0;
err_free:
    fsdp_gpt2_destroy(m);
    return rc;
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

static struct fsdp_coll_attr gpt2_coll_attr(const struct fsdp_gpt2 *m)
{
    struct fsdp_coll_attr a = {.mem = m->dev ? m->dev->mem : FSDP_MEM_HOST, .stream = NULL};
    return a;
}

static int gpt2_coll_finish(struct fsdp_work *w)
{
    int rc = fsdp_work_wait(w, -1.0);
    fsdp_work_free(w);
    return rc;
}

/* count elements of every rank into recv, rank after rank (send may be
 * this rank's block of recv) */
static int gpt2_allgather(struct fsdp_gpt2 *m, const void *send, void *recv, size_t count,
                          enum fsdp_dtype t)
{
    struct fsdp_coll_attr a = gpt2_coll_attr(m);
    struct fsdp_work *w = NULL;
    FSDP_CHECK(fsdp_allgather(m->rows_g, send, recv, count, t, &a, &w));
    return gpt2_coll_finish(w);
}

/* recv (count) = the sum over ranks of their block rank of send */
static int gpt2_reduce_scatter(struct fsdp_gpt2 *m, const float *send, float *recv, size_t count)
{
    struct fsdp_coll_attr a = gpt2_coll_attr(m);
    struct fsdp_work *w = NULL;
    FSDP_CHECK(fsdp_reduce_scatter(m->rows_g, send, recv, count, FSDP_F32, FSDP_SUM, &a, &w));
    return gpt2_coll_finish(w);
}

static int gpt2_allreduce(struct fsdp_gpt2 *m, float *buf, size_t count, enum fsdp_redop op)
{
    struct fsdp_coll_attr a = gpt2_coll_attr(m);
    struct fsdp_work *w = NULL;
    FSDP_CHECK(fsdp_allreduce(m->rows_g, buf, buf, count, FSDP_F32, op, &a, &w));
    return gpt2_coll_finish(w);
}

static float *gpt2_residual(const struct fsdp_gpt2 *m, int l)
{
    size_t stride = (size_t)m->max_B * (size_t)m->max_T * (size_t)m->cfg->n_embd;
    return m->acts.residual + (size_t)l * stride;
}

/* Block l from residual[l]; full = 0 stops before c_proj of the MLP, which
 * only produces residual[l+1] (what a checkpointed backward does not need). */
static void gpt2_block_forward(struct fsdp_gpt2 *m, int l, int full)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd;
    struct fsdp_gpt2_block_view w;
    struct fsdp_gpt2_block_acts *a = &m->acts.blocks[l];
    float *x = gpt2_residual(m, l);
    fsdp_gpt2_block_view(m, m->unit_params[1 + l], &w);
    m->k->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w.ln1w, w.ln1b, BT, C, c->ln_eps);
    m->k->matmul_forward(a->qkv, a->ln1, w.qkvw, w.qkvb, NULL, BT, C, 3 * C);
    m->k->attention_forward(a->atty, a->att_lse, m->acts.att_scratch, a->qkv, m->B, m->T,
                               c->n_embd, c->n_head);
    m->k->matmul_forward(a->res2, a->atty, w.attprojw, w.attprojb, x, BT, C, C);
    m->k->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w.ln2w, w.ln2b, BT, C,
                               c->ln_eps);
    m->k->matmul_forward(a->fch, a->ln2, w.fcw, w.fcb, NULL, BT, C, 4 * C);
    m->k->gelu_forward(a->fch_gelu, a->fch, BT * 4 * C);
    if (full) {
        m->k->matmul_forward(gpt2_residual(m, l + 1), a->fch_gelu, w.fcprojw, w.fcprojb, a->res2,
                                BT, 4 * C, C);
    }
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
    *v0 = 0;
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
    if (!m->shadow) {
        struct fsdp_gpt2_head_view w;
        fsdp_gpt2_head_view(m, m->unit_params[c->n_layer + 1], m->unit_params[0], &w);
        m->k->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, gpt2_residual(m, c->n_layer),
                                w.lnfw, w.lnfb, BT, C, c->ln_eps);
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
            gpt2_block_forward(m, u - 1, 1);
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
    float *dlnf = dX;
    if (ex) {
        dlnf = dX + (size_t)m->rows_r * BT * C;
        FSDP_CHECK(gpt2_reduce_scatter(m, dX, dlnf, BT * C));
    }
    m->head_x_ready = 0;
    memset(g->dres, 0, BT * C * sizeof(float));
    if (!m->shadow) {
        struct fsdp_gpt2_head_view w, dw;
        fsdp_gpt2_head_view(m, m->unit_params[last], m->unit_params[0], &w);
        fsdp_gpt2_head_view(m, m->unit_grads[last], m->unit_grads[0], &dw);
        m->k->layernorm_backward(g->dres, dw.lnfw, dw.lnfb, dlnf, gpt2_residual(m, c->n_layer),
                                 w.lnfw, a->lnf_mean, a->lnf_rstd, BT, C);
    }
    return 0;
}

/* dres holds d(block output) on entry and d(block input) on return. */
static void gpt2_block_backward(struct fsdp_gpt2 *m, int l)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd;
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    struct fsdp_gpt2_block_acts *a = &m->acts.blocks[l];
    struct fsdp_gpt2_block_view w, dw;
    m->head_x_ready = 0; /* dqkv and dfch overwrite the head's scratch */
    if (m->checkpoint[l]) {
        gpt2_block_forward(m, l, 0);
    }
    fsdp_gpt2_block_view(m, m->unit_params[1 + l], &w);
    fsdp_gpt2_block_view(m, m->unit_grads[1 + l], &dw);
    /* MLP */
    m->k->matmul_backward(g->dfch, dw.fcprojw, dw.fcprojb, g->dres, a->fch_gelu, w.fcprojw, BT,
                             4 * C, C, 1.0f, 0);
    m->k->gelu_backward(g->dfch, a->fch, g->dfch, BT * 4 * C);
    m->k->matmul_backward(g->dbtc, dw.fcw, dw.fcb, g->dfch, a->ln2, w.fcw, BT, C, 4 * C, 1.0f, 0);
    m->k->layernorm_backward(g->dres, dw.ln2w, dw.ln2b, g->dbtc, a->res2, w.ln2w, a->ln2_mean,
                                a->ln2_rstd, BT, C);
    /* attention */
    m->k->matmul_backward(g->dbtc, dw.attprojw, dw.attprojb, g->dres, a->atty, w.attprojw, BT, C,
                             C, 1.0f, 0);
    m->k->attention_backward(g->dqkv, m->acts.att_scratch, g->dbtc, a->qkv, a->atty, a->att_lse,
                                m->B, m->T, c->n_embd, c->n_head);
    m->k->matmul_backward(g->dbtc, dw.qkvw, dw.qkvb, g->dqkv, a->ln1, w.qkvw, BT, C, 3 * C, 1.0f, 0);
    m->k->layernorm_backward(g->dres, dw.ln1w, dw.ln1b, g->dbtc, gpt2_residual(m, l), w.ln1w,
                                a->ln1_mean, a->ln1_rstd, BT, C);
}

/* The embedding's gradient. By rows: every rank's d(residual) rows are
 * gathered and each rank adds them into the table rows it holds, in the
 * order of the rows (rank after rank), as one rank with every batch would. */
static int gpt2_embed_backward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd;
    float *dres = m->gacts.dres, *dg = m->unit_grads[0];
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
            gpt2_block_backward(m, u - 1);
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
    FSDP_CHECK(fsdp_gpt2_create(spec, o->max_B, o->max_T, &m));
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
    double W = g ? g->size : 1, table = (double)gm->cfg->vocab_size + gm->cfg->context;
    if (u == 0 && table <= 2.0 * W * gm->max_B * gm->max_T) {
        return 0;
    }
    return fsdp_gpt2_set_unit_rows(gm, u, g);
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
};
