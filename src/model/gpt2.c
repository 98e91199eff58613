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

/* Rows of one LM-head chunk: the chunk size, at most the largest batch. */
static size_t gpt2_head_rows(const struct fsdp_gpt2 *m)
{
    size_t BT = (size_t)m->max_B * (size_t)m->max_T, k = (size_t)m->head_chunk;
    return k < BT ? k : BT;
}

/*
 * Lays the activations out over base into a, or only counts them when base
 * is NULL (a->blocks may then be NULL too); returns the floats needed.
 */
static size_t gpt2_layout_acts(const struct fsdp_gpt2 *m, float *base, struct fsdp_gpt2_acts *a)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->max_B * (size_t)m->max_T, C = (size_t)c->n_embd;
    size_t L = (size_t)c->n_layer, V = (size_t)c->vocab_size, NH = (size_t)c->n_head;
    struct fsdp_gpt2_block_acts blk;
    size_t off = 0;
    int any_ckpt = 0;
    a->residual = gpt2_take(base, &off, (L + 1) * BT * C);
    a->lnf = gpt2_take(base, &off, BT * C);
    a->lnf_mean = gpt2_take(base, &off, BT);
    a->lnf_rstd = gpt2_take(base, &off, BT);
    a->head_logits = gpt2_take(base, &off, gpt2_head_rows(m) * V);
    a->ce_stats = gpt2_take(base, &off, 2 * BT);
    a->losses = gpt2_take(base, &off, BT);
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

static size_t gpt2_layout_grad_acts(const struct fsdp_gpt2 *m, float *base,
                                    struct fsdp_gpt2_grad_acts *g)
{
    size_t BT = (size_t)m->max_B * (size_t)m->max_T, C = (size_t)m->cfg->n_embd;
    size_t off = 0;
    g->dres = gpt2_take(base, &off, BT * C);
    g->dbtc = gpt2_take(base, &off, BT * C);
    g->dqkv = gpt2_take(base, &off, BT * 3 * C);
    g->dfch = gpt2_take(base, &off, BT * 4 * C);
    return off;
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
    fsdp_free(m->act_memory);
    m->act_memory = NULL;
    m->tokens = NULL;
    m->targets = NULL;
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
        memset(m->unit_grads[i], 0, m->spec->unit_numel[i] * sizeof(float));
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
    if (!tokens) {
        return fsdp_err(FSDP_ERR_INVALID, "batch has no tokens");
    }
    for (size_t i = 0; i < (size_t)B * (size_t)T; i++) {
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
    memset(m->fwd_done, 0, (size_t)m->spec->n_units);
    m->bwd_next = -1;
    return 0;
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

/* logits (rows, V) of rows [r0, r0 + rows): lnf rows @ lm_head^T */
static void gpt2_head_logits(const struct fsdp_gpt2 *m, const float *lm_head, size_t r0,
                             size_t rows, float *out)
{
    size_t C = (size_t)m->cfg->n_embd, V = (size_t)m->cfg->vocab_size;
    m->k->matmul_forward(out, m->acts.lnf + r0 * C, lm_head, NULL, NULL, rows, C, V);
}

/*
 * ln_f, then with targets the loss one row chunk at a time: the chunk's
 * logits, each row's loss and softmax statistics (kept for the backward);
 * the logits are dropped. The mean adds the kept rows' losses in row order
 * in double, as the one-pass kernel does.
 */
static int gpt2_head_forward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t chunk = gpt2_head_rows(m);
    struct fsdp_gpt2_acts *a = &m->acts;
    struct fsdp_gpt2_head_view w;
    fsdp_gpt2_head_view(m, m->unit_params[c->n_layer + 1], m->unit_params[0], &w);
    m->k->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, gpt2_residual(m, c->n_layer),
                               w.lnfw, w.lnfb, BT, C, c->ln_eps);
    if (!m->targets) {
        return 0;
    }
    size_t kept = 0;
    double sum = 0.0;
    for (size_t r0 = 0; r0 < BT; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk, k;
        gpt2_head_logits(m, w.lm_head, r0, rows, a->head_logits);
        FSDP_CHECK(m->k->crossentropy_forward(a->losses + r0, a->ce_stats + 2 * r0,
                                                 a->head_logits, m->targets + r0, rows, V,
                                                 m->ignore_index, &k));
        kept += k;
    }
    for (size_t r = 0; r < BT; r++) {
        if (m->targets[r] != m->ignore_index) {
            sum += a->losses[r];
        }
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
    if (!m->unit_params[last] || (m->cfg->tied && !m->unit_params[0])) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: the head's parameters are not set");
    }
    struct fsdp_gpt2_head_view w;
    fsdp_gpt2_head_view(m, m->unit_params[last], m->unit_params[0], &w);
    if (rows > 0) {
        gpt2_head_logits(m, w.lm_head, row0, rows, out);
    }
    return 0;
}

int fsdp_gpt2_forward_unit(struct fsdp_gpt2 *m, int u)
{
    int n = m->spec->n_units, L = m->cfg->n_layer;
    if (u < 0 || u >= n) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: unit %d out of range [0, %d)", u, n);
    }
    if (!m->tokens) {
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
        struct fsdp_gpt2_embed_view w;
        fsdp_gpt2_embed_view(m, m->unit_params[0], &w);
        m->k->encoder_forward(gpt2_residual(m, 0), m->tokens, w.wte, w.wpe, m->B, m->T,
                                 m->cfg->n_embd);
    } else if (u <= L) {
        gpt2_block_forward(m, u - 1, 1);
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
 * Per row chunk: the logits again (the forward's product, so the same
 * bits), their gradient from the saved statistics, d(lnf) rows and the
 * lm_head (tied: wte) gradient accumulated with the seed scale as alpha.
 * A chunk with every target ignored has zero gradient and is skipped.
 */
static void gpt2_head_backward(struct fsdp_gpt2 *m)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t chunk = gpt2_head_rows(m);
    struct fsdp_gpt2_acts *a = &m->acts;
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    struct fsdp_gpt2_head_view w, dw;
    int last = c->n_layer + 1;
    fsdp_gpt2_head_view(m, m->unit_params[last], m->unit_params[0], &w);
    fsdp_gpt2_head_view(m, m->unit_grads[last], m->unit_grads[0], &dw);
    double div = m->loss_divisor > 0 ? m->loss_divisor : (double)m->n_kept;
    /* no kept token: every dlogits row is zero, so is the gradient */
    float alpha = div > 0 ? (float)((double)m->loss_scale / div) : 0.0f;
    for (size_t r0 = 0; r0 < BT; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk, kept = 0;
        for (size_t r = r0; r < r0 + rows; r++) {
            kept += m->targets[r] != m->ignore_index;
        }
        if (kept == 0) {
            memset(g->dbtc + r0 * C, 0, rows * C * sizeof(float));
            continue;
        }
        if (chunk < BT) { /* one chunk still holds the forward's logits; else recompute: same bits */
            gpt2_head_logits(m, w.lm_head, r0, rows, a->head_logits);
        }
        m->k->crossentropy_backward(a->head_logits, a->head_logits, a->ce_stats + 2 * r0,
                                       m->targets + r0, rows, V, m->ignore_index, 1.0f);
        m->k->matmul_backward(g->dbtc + r0 * C, dw.lm_head, NULL, a->head_logits,
                                 a->lnf + r0 * C, w.lm_head, rows, C, V, alpha, 0);
    }
    memset(g->dres, 0, BT * C * sizeof(float));
    m->k->layernorm_backward(g->dres, dw.lnfw, dw.lnfb, g->dbtc, gpt2_residual(m, c->n_layer),
                                w.lnfw, a->lnf_mean, a->lnf_rstd, BT, C);
}

/* dres holds d(block output) on entry and d(block input) on return. */
static void gpt2_block_backward(struct fsdp_gpt2 *m, int l)
{
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd;
    struct fsdp_gpt2_grad_acts *g = &m->gacts;
    struct fsdp_gpt2_block_acts *a = &m->acts.blocks[l];
    struct fsdp_gpt2_block_view w, dw;
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
        struct fsdp_gpt2_embed_view dw;
        fsdp_gpt2_embed_view(m, m->unit_grads[0], &dw);
        m->k->encoder_backward(dw.wte, dw.wpe, m->gacts.dres, m->tokens, m->B, m->T,
                                  m->cfg->n_embd);
    } else if (u <= L) {
        gpt2_block_backward(m, u - 1);
    } else {
        gpt2_head_backward(m);
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
};
