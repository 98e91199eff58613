/*
 * llama.c - the Llama family (Hugging Face semantics: RMSNorm, RoPE in the
 * rotate_half convention with its rope_scaling types, grouped-query
 * attention, SwiGLU) forward and backward per unit on the host kernels, the
 * activation layout, activation checkpointing, the LM head in row chunks
 * and the memory/FLOP accounting. It reads parameters only through the
 * caller's unit buffers and the offsets of the parameter table; it never
 * owns or allocates parameters or their gradients.
 */
#include "config.h"
#include "model/llama.h"
#include "model/tp_ops.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// parameter table lookups

/* Finds name in unit u with the given shape (cols 0: 1-D); returns its offset. */
static int llama_locate(const struct fsdp_model_spec *s, const char *name, int u, size_t rows,
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

/* b must start where a (of n floats) ends: one product reads them as one matrix. */
static int llama_check_next(const struct fsdp_llama *m, int a, int b, size_t n)
{
    if (m->blk_off[b] != m->blk_off[a] + n) {
        return fsdp_err(FSDP_ERR_INTERNAL,
                        "parameter table: block tensor %d at offset %zu, the packed product needs "
                        "it right after tensor %d (%zu + %zu)",
                        b, m->blk_off[b], a, m->blk_off[a], n);
    }
    return 0;
}

/* A block tensor's size along one dimension on this rank: column-parallel
 * tensors keep 1/tpn of their rows, row-parallel ones 1/tpn of their
 * columns (cols: which dimension). */
static size_t llama_tp_dim(const struct fsdp_llama *m, enum fsdp_llama_dim d,
                           enum fsdp_tp_place p, int cols)
{
    size_t n = fsdp_llama_dim_size(m->cfg, d);
    int cut = cols ? p == FSDP_TP_ROWWISE : p == FSDP_TP_COLWISE;
    return cut ? n / (size_t)m->tpn : n;
}

static int llama_map_block(struct fsdp_llama *m, size_t l)
{
    const struct fsdp_llama_config *c = m->cfg;
    char name[FSDP_PARAM_NAME_MAX + 16];
    size_t off;
#define FSDP_LLAMA_X(id, field, suffix, rows, cols, init, decay, tp, bias)                         \
    if (!(bias) || c->attn_bias) {                                                                 \
        snprintf(name, sizeof(name), "layers.%zu.%s", l, suffix);                                  \
        FSDP_CHECK(llama_locate(m->spec, name, 1 + (int)l,                                         \
                                llama_tp_dim(m, FSDP_LLAMA_##rows, tp, 0),                         \
                                FSDP_LLAMA_##cols == FSDP_LLAMA_D1                                 \
                                    ? 0                                                            \
                                    : llama_tp_dim(m, FSDP_LLAMA_##cols, tp, 1),                   \
                                &off));                                                            \
        if (l == 0) {                                                                              \
            m->blk_off[FSDP_LLAMA_BLK_##id] = off;                                                 \
        } else if (off != m->blk_off[FSDP_LLAMA_BLK_##id]) {                                       \
            return fsdp_err(FSDP_ERR_INTERNAL,                                                     \
                            "parameter table: '%s' at offset %zu, block 0 has it at %zu", name,    \
                            off, m->blk_off[FSDP_LLAMA_BLK_##id]);                                 \
        }                                                                                          \
    } else {                                                                                       \
        m->blk_off[FSDP_LLAMA_BLK_##id] = SIZE_MAX;                                                \
    }
    FSDP_LLAMA_BLOCK_TENSORS(FSDP_LLAMA_X)
#undef FSDP_LLAMA_X
    return 0;
}

static int llama_map_params(struct fsdp_llama *m)
{
    const struct fsdp_model_spec *s = m->spec;
    const struct fsdp_llama_config *c = m->cfg;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t Q = m->lq, KV = (size_t)m->lnkv * (size_t)m->hs;
    V = m->tvl; /* tensor parallel: this rank's vocabulary slice, padded */
    FSDP_CHECK(llama_locate(s, "embed_tokens.weight", 0, V, C, &m->emb_off));
    for (size_t l = 0; l < (size_t)c->n_layer; l++) {
        FSDP_CHECK(llama_map_block(m, l));
    }
    FSDP_CHECK(llama_check_next(m, FSDP_LLAMA_BLK_QW, FSDP_LLAMA_BLK_KW, Q * C));
    FSDP_CHECK(llama_check_next(m, FSDP_LLAMA_BLK_KW, FSDP_LLAMA_BLK_VW, KV * C));
    if (c->attn_bias) {
        FSDP_CHECK(llama_check_next(m, FSDP_LLAMA_BLK_QB, FSDP_LLAMA_BLK_KB, Q));
        FSDP_CHECK(llama_check_next(m, FSDP_LLAMA_BLK_KB, FSDP_LLAMA_BLK_VB, KV));
    }
    int last = c->n_layer + 1;
    FSDP_CHECK(llama_locate(s, "norm.weight", last, C, 0, &m->head_off[0]));
    long lm = fsdp_model_spec_find(s, "lm_head.weight");
    if (c->tied) {
        if (lm >= 0) {
            return fsdp_err(FSDP_ERR_INTERNAL, "parameter table: tied model lists lm_head.weight");
        }
        m->head_off[1] = m->emb_off;
    } else {
        FSDP_CHECK(llama_locate(s, "lm_head.weight", last, V, C, &m->head_off[1]));
    }
    return 0;
}

void fsdp_llama_block_view(const struct fsdp_llama *m, float *unit, struct fsdp_llama_block_view *v)
{
#define FSDP_LLAMA_X(id, field, suffix, rows, cols, init, decay, tp, bias)                         \
    v->field = m->blk_off[FSDP_LLAMA_BLK_##id] == SIZE_MAX ? NULL                                  \
                                                           : unit + m->blk_off[FSDP_LLAMA_BLK_##id];
    FSDP_LLAMA_BLOCK_TENSORS(FSDP_LLAMA_X)
#undef FSDP_LLAMA_X
}

void fsdp_llama_head_view(const struct fsdp_llama *m, float *unit_last, float *unit0,
                          struct fsdp_llama_head_view *v)
{
    v->norm = unit_last + m->head_off[0];
    v->lm_head = m->cfg->tied ? unit0 + m->head_off[1] : unit_last + m->head_off[1];
}

// ----------------------------------------------------------------------------
// activation layout

/* Carves n floats (64-byte aligned) from base at *off; base NULL only counts. */
static float *llama_take(float *base, size_t *off, size_t n)
{
    float *p = base ? base + *off : NULL;
    *off += (n + 15) & ~(size_t)15;
    return p;
}

/* Rows of a batch of BT rows that the residual stream holds here. */
static size_t llama_rows_here(const struct fsdp_llama *m, size_t BT)
{
    return m->sp ? BT / (size_t)m->tpn : BT;
}

static void llama_layout_block(const struct fsdp_llama *m, struct fsdp_llama_block_acts *a,
                               float *base, size_t *off, size_t BT)
{
    size_t C = (size_t)m->cfg->n_embd, F = m->lf, BR = llama_rows_here(m, BT);
    a->rms1 = llama_take(base, off, BR * C);
    a->rms1_rstd = llama_take(base, off, BR);
    a->qkv = llama_take(base, off, BT * (size_t)m->qkv_w);
    a->atty = llama_take(base, off, BT * m->lq);
    a->att_lse = llama_take(base, off, BT * (size_t)m->lnh);
    a->res2 = llama_take(base, off, BR * C);
    a->rms2 = llama_take(base, off, BR * C);
    a->rms2_rstd = llama_take(base, off, BR);
    a->gate = llama_take(base, off, BT * F);
    a->up = llama_take(base, off, BT * F);
    a->h = llama_take(base, off, BT * F);
}

/* Rows of FSDP_LLAMA_HEAD_BYTES of logits, at least one. */
static int llama_head_default_rows(const struct fsdp_llama_config *c)
{
    size_t rows = FSDP_LLAMA_HEAD_BYTES / ((size_t)c->vocab_size * sizeof(float));
    return rows < 1 ? 1 : rows > INT_MAX ? INT_MAX : (int)rows;
}

/* Rows of one LM-head chunk: the chunk size, at most the largest batch. */
static size_t llama_head_rows(const struct fsdp_llama *m)
{
    size_t BT = (size_t)m->max_B * (size_t)m->max_T, k = (size_t)m->head_chunk;
    return k < BT ? k : BT;
}

/* Lays the activations out over base into a, or only counts them when base
 * is NULL (a->blocks may then be NULL too); returns the floats needed. */
static size_t llama_layout_acts(const struct fsdp_llama *m, float *base, struct fsdp_llama_acts *a)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t BT = (size_t)m->max_B * (size_t)m->max_T, C = (size_t)c->n_embd;
    size_t L = (size_t)c->n_layer, V = (size_t)c->vocab_size;
    struct fsdp_llama_block_acts blk;
    size_t off = 0;
    int any_ckpt = 0;
    a->residual = llama_take(base, &off, (L + 1) * llama_rows_here(m, BT) * C);
    a->lnf = llama_take(base, &off, BT * C);
    a->lnf_rstd = llama_take(base, &off, llama_rows_here(m, BT));
    a->head_logits = llama_take(base, &off, llama_head_rows(m) * V);
    a->ce_stats = llama_take(base, &off, 2 * BT);
    a->losses = llama_take(base, &off, BT);
    a->zt = llama_take(base, &off, m->tp ? BT : 0);
    a->xent = llama_take(base, &off, m->tp ? 3 * BT : 0);
    a->att_scratch = llama_take(base, &off, m->k->attention_scratch_floats(m->max_T));
    for (size_t l = 0; l < L; l++) {
        if (m->checkpoint[l]) {
            any_ckpt = 1;
            continue;
        }
        llama_layout_block(m, &blk, base, &off, BT);
        if (a->blocks) {
            a->blocks[l] = blk;
        }
    }
    if (any_ckpt) {
        llama_layout_block(m, &blk, base, &off, BT); /* one set shared by all of them */
        for (size_t l = 0; l < L && a->blocks; l++) {
            if (m->checkpoint[l]) {
                a->blocks[l] = blk;
            }
        }
    }
    return off;
}

static size_t llama_layout_grad_acts(const struct fsdp_llama *m, float *base,
                                     struct fsdp_llama_grad_acts *g)
{
    size_t BT = (size_t)m->max_B * (size_t)m->max_T, C = (size_t)m->cfg->n_embd;
    size_t F = m->lf, off = 0;
    g->dres = llama_take(base, &off, llama_rows_here(m, BT) * C);
    g->dbtc = llama_take(base, &off, BT * C);
    g->xfull = llama_take(base, &off, m->sp ? BT * C : 0);
    g->spg = llama_take(base, &off, m->sp ? 2 * C : 0);
    g->dqkv = llama_take(base, &off, BT * (size_t)m->qkv_w);
    /* none: the SwiGLU backward writes d(gate) and d(up) over the saved
     * gate and up, which nothing reads after it (two (BT, F) buffers less,
     * and no write-allocate traffic for them) */
    g->dgate = NULL;
    g->dup = NULL;
    g->dh = llama_take(base, &off, BT * F);
    return off;
}

int fsdp_llama_reserve(struct fsdp_llama *m)
{
    int fresh = 0;
    if (!m->act_memory) {
        m->act_floats = llama_layout_acts(m, NULL, &(struct fsdp_llama_acts){.blocks = NULL});
        m->act_memory = fsdp_alloc(m->act_floats * sizeof(float));
        if (!m->act_memory) {
            return fsdp_err(FSDP_ERR_NOMEM, "llama activations: %zu MiB",
                            m->act_floats * sizeof(float) >> 20);
        }
        llama_layout_acts(m, m->act_memory, &m->acts);
        fresh = 1;
    }
    if (!m->grad_act_memory) {
        struct fsdp_llama_grad_acts count;
        m->grad_act_floats = llama_layout_grad_acts(m, NULL, &count);
        m->grad_act_memory = fsdp_alloc(m->grad_act_floats * sizeof(float));
        if (!m->grad_act_memory) {
            return fsdp_err(FSDP_ERR_NOMEM, "llama activation gradients: %zu MiB",
                            m->grad_act_floats * sizeof(float) >> 20);
        }
        llama_layout_grad_acts(m, m->grad_act_memory, &m->gacts);
        fresh = 1;
    }
    if (fresh) {
        FSDP_DEBUG(FSDP_SUB_MODEL, "llama activations %.1f MiB, workspace %.1f MiB (B=%d T=%d)",
                   (double)(m->act_floats * sizeof(float)) / 1048576.0,
                   (double)(m->grad_act_floats * sizeof(float)) / 1048576.0, m->max_B, m->max_T);
    }
    return 0;
}

size_t fsdp_llama_activation_bytes(const struct fsdp_llama *m)
{
    struct fsdp_llama_acts count = {.blocks = NULL};
    return llama_layout_acts(m, NULL, &count) * sizeof(float);
}

size_t fsdp_llama_workspace_bytes(const struct fsdp_llama *m)
{
    struct fsdp_llama_grad_acts count;
    size_t rope = 2 * (size_t)m->max_T * (size_t)(m->hs / 2);
    return (llama_layout_grad_acts(m, NULL, &count) + rope) * sizeof(float);
}

// ----------------------------------------------------------------------------
// lifetime and settings

/* cos/sin of every position up to max_T (a batch always starts at position 0). */
static int llama_rope_tables(struct fsdp_llama *m)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t h2 = (size_t)m->hs / 2, n = (size_t)m->max_T * h2;
    struct fsdp_rope_scaling sc = {
        .type = c->rope_scaling == FSDP_LLAMA_ROPE_LINEAR   ? FSDP_ROPE_LINEAR
                : c->rope_scaling == FSDP_LLAMA_ROPE_LLAMA3 ? FSDP_ROPE_LLAMA3
                                                            : FSDP_ROPE_NONE,
        .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq,
        .high_freq_factor = c->rope_high_freq,
        .original_context = c->rope_original,
    };
    float *inv = malloc(h2 * sizeof(float));
    m->rope_cos = malloc(n * sizeof(float));
    m->rope_sin = malloc(n * sizeof(float));
    int rc = !inv || !m->rope_cos || !m->rope_sin
                 ? fsdp_err(FSDP_ERR_NOMEM, "llama RoPE tables (%d x %zu)", m->max_T, h2)
                 : 0;
    if (rc == 0 && fsdp_cpu_rope_inv_freq(inv, m->hs, c->rope_theta, &sc) < 0) {
        rc = fsdp_err(FSDP_ERR_INVALID, "llama: RoPE frequencies for head size %d, theta %g",
                      m->hs, (double)c->rope_theta);
    }
    if (rc == 0) {
        fsdp_cpu_rope_table(m->rope_cos, m->rope_sin, inv, 0, m->max_T, m->hs);
    }
    free(inv);
    return rc;
}

static int llama_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                        struct fsdp_tp *tp, struct fsdp_llama **out)
{
    int rc;
    if (spec->arch != &fsdp_llama_arch) {
        return fsdp_err(FSDP_ERR_INVALID, "llama: the spec is of architecture %s",
                        spec->arch ? spec->arch->name : "(none)");
    }
    const struct fsdp_llama_config *c = fsdp_llama_cfg(spec);
    if (max_B < 1 || max_T < 1 || max_T > c->context) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "llama: batch %d x %d invalid (need B >= 1, 1 <= T <= %d)", max_B, max_T,
                        c->context);
    }
    double per_tok = (double)c->vocab_size + (double)(c->n_layer + 2) *
                                                 (12.0 * c->n_embd + 3.0 * c->ffn_hidden);
    if ((double)max_B * max_T * per_tok * sizeof(float) > 0x1p50) {
        return fsdp_err(FSDP_ERR_INVALID, "llama: batch %d x %d needs %.3g bytes of activations",
                        max_B, max_T, (double)max_B * max_T * per_tok * sizeof(float));
    }
    struct fsdp_llama *m = calloc(1, sizeof(*m));
    if (!m) {
        return fsdp_err(FSDP_ERR_NOMEM, "llama model");
    }
    m->base.ops = &fsdp_llama_ops;
    m->base.spec = spec;
    m->spec = spec;
    m->cfg = c;
    m->k = fsdp_cpu_kernels();
    m->max_B = max_B;
    m->max_T = max_T;
    m->hs = c->n_embd / c->n_head;
    m->tp = fsdp_tp_on(tp) ? tp : NULL;
    m->tpn = m->tp ? tp->size : 1;
    m->sp = m->tp && tp->sp;
    if (m->sp && ((size_t)max_B * (size_t)max_T) % (size_t)m->tpn != 0) {
        int n = m->tpn;
        free(m);
        return fsdp_err(FSDP_ERR_INVALID, "llama: sequence parallel over tp %d: batch %d x %d "
                        "does not split into %d equal row ranges", n, max_B, max_T, n);
    }
    if (c->n_head % m->tpn != 0 || c->n_kv_head % m->tpn != 0 || c->ffn_hidden % m->tpn != 0) {
        int n = m->tpn;
        free(m);
        return fsdp_err(FSDP_ERR_INVALID, "llama: n_head %d, n_kv_head %d and ffn_hidden %d must "
                        "each be divisible by tp %d", c->n_head, c->n_kv_head, c->ffn_hidden, n);
    }
    m->lnh = c->n_head / m->tpn;
    m->lnkv = c->n_kv_head / m->tpn;
    m->lq = (size_t)m->lnh * (size_t)m->hs;
    m->lf = (size_t)c->ffn_hidden / (size_t)m->tpn;
    fsdp_tp_vocab_split((size_t)c->vocab_size, m->tpn, m->tp ? tp->rank : 0, &m->tv0, &m->tvn,
                        &m->tvl);
    m->qkv_w = (m->lnh + 2 * m->lnkv) * m->hs;
    m->ignore_index = -1;
    m->loss_scale = 1.0f;
    m->head_chunk = llama_head_default_rows(c);
    m->bwd_next = -1;
    m->loss = NAN;
    size_t nu = (size_t)spec->n_units, L = (size_t)c->n_layer;
    m->unit_params = calloc(nu, sizeof(float *));
    m->unit_grads = calloc(nu, sizeof(float *));
    m->fwd_done = calloc(nu, 1);
    m->checkpoint = calloc(L, 1);
    m->acts.blocks = calloc(L, sizeof(*m->acts.blocks));
    if (!m->unit_params || !m->unit_grads || !m->fwd_done || !m->checkpoint || !m->acts.blocks) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "llama model tables");
        goto err_free;
    }
    FSDP_CHECK_GOTO(llama_map_params(m), rc, err_free);
    FSDP_CHECK_GOTO(llama_rope_tables(m), rc, err_free);
    *out = m;
    return 0;
err_free:
    fsdp_llama_destroy(m);
    return rc;
}

int fsdp_llama_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                      struct fsdp_llama **out)
{
    return llama_create(spec, max_B, max_T, NULL, out);
}

void fsdp_llama_destroy(struct fsdp_llama *m)
{
    if (!m) {
        return;
    }
    fsdp_free(m->act_memory);
    fsdp_free(m->grad_act_memory);
    free(m->rope_cos);
    free(m->rope_sin);
    free(m->acts.blocks);
    free(m->checkpoint);
    free(m->fwd_done);
    free(m->unit_grads);
    free(m->unit_params);
    free(m);
}

/* The saved-activation layout depends on the checkpoint flags and the head
 * chunk: dropped here, rebuilt on demand (the next reserve or set_batch). */
static void llama_relayout(struct fsdp_llama *m)
{
    fsdp_free(m->act_memory);
    m->act_memory = NULL;
    m->tokens = NULL;
    m->targets = NULL;
    memset(m->fwd_done, 0, (size_t)m->spec->n_units);
}

int fsdp_llama_set_checkpoint(struct fsdp_llama *m, int l, int on)
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
    llama_relayout(m);
    return 0;
}

int fsdp_llama_set_head_chunk(struct fsdp_llama *m, int rows)
{
    if (rows < 0) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "LM head chunk of %d rows (need at least 1, or 0 for the default)", rows);
    }
    if (m->bwd_next >= 0) {
        return fsdp_err(FSDP_ERR_INVALID, "LM head chunk changed between forward and backward");
    }
    m->head_chunk = rows ? rows : llama_head_default_rows(m->cfg);
    llama_relayout(m);
    return 0;
}

int fsdp_llama_set_unit(struct fsdp_llama *m, int u, float *params, float *grads)
{
    if (u < 0 || u >= m->spec->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "unit %d out of range [0, %d)", u, m->spec->n_units);
    }
    m->unit_params[u] = params;
    m->unit_grads[u] = grads;
    return 0;
}

void fsdp_llama_set_ignore_index(struct fsdp_llama *m, int32_t ignore_index)
{
    m->ignore_index = ignore_index;
}

void fsdp_llama_set_loss_seed(struct fsdp_llama *m, double divisor, float scale)
{
    m->loss_divisor = divisor;
    m->loss_scale = scale;
}

int fsdp_llama_zero_grad(struct fsdp_llama *m, int u)
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

int fsdp_llama_set_batch(struct fsdp_llama *m, const int32_t *tokens, const int32_t *targets,
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
    FSDP_CHECK(fsdp_llama_reserve(m));
    m->B = B;
    m->T = T;
    m->tokens = tokens;
    m->targets = targets;
    memset(m->fwd_done, 0, (size_t)m->spec->n_units);
    m->bwd_next = -1;
    return 0;
}

static float *llama_residual(const struct fsdp_llama *m, int l)
{
    size_t BT = (size_t)m->max_B * (size_t)m->max_T;
    return m->acts.residual + (size_t)l * llama_rows_here(m, BT) * (size_t)m->cfg->n_embd;
}

// ----------------------------------------------------------------------------
// tensor-parallel regions (model/tp_ops.h), as GPT-2's (gpt2.c)

/* A column-parallel product's input from a norm's output x: x, or with
 * sequence parallelism every rank's rows gathered into xfull. */
static int llama_tp_enter(struct fsdp_llama *m, const float *x, size_t BT, const float **in)
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

/* dres as a row-parallel product's output gradient: dres, or with sequence
 * parallelism every rank's rows gathered into dbtc. */
static int llama_tp_dout(struct fsdp_llama *m, size_t BT, const float **dout)
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

/* A column-parallel product's input gradient part (dbtc) summed over the
 * ranks into the rows held here: all-reduced in place, or reduce-scattered
 * into xfull. */
static int llama_tp_din(struct fsdp_llama *m, size_t BT, const float **din)
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

/* Sequence parallel: n norm-weight gradients over this rank's rows (spg)
 * summed over the ranks and added into dst[0..n). */
static int llama_sp_norm_grads(struct fsdp_llama *m, float *const *dst, int n)
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

/* x[r] = embed_tokens[tokens[r]]; with tensor parallelism vocabulary
 * parallel (sequence parallel: through dbtc to the rows held here) */
static int llama_embed_forward(struct fsdp_llama *m)
{
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg->n_embd;
    const float *wte = m->unit_params[0] + m->emb_off;
    float *x = llama_residual(m, 0);
    if (m->tp) {
        return fsdp_tp_embed_forward(m->tp, x, m->sp ? m->gacts.dbtc : x, m->tokens, wte,
                                     (size_t)m->cfg->vocab_size, NULL, 0, BT, C);
    }
    for (size_t r = 0; r < BT; r++) {
        memcpy(x + r * C, wte + (size_t)m->tokens[r] * C, C * sizeof(float));
    }
    return 0;
}

/*
 * out = residual + inp (BT, K) @ w^T, a row-parallel layer (o_proj,
 * down_proj): w (C, K) holds this rank's K input features, so with tensor
 * parallelism the partial products are summed over the ranks (reduce-out;
 * with sequence parallelism reduce-scattered to the rows held here) before
 * the residual is added. The partial sums go through dbtc, which no forward
 * uses otherwise.
 */
static int llama_row_parallel(struct fsdp_llama *m, float *out, const float *inp, const float *w,
                              const float *residual, size_t BT, size_t K)
{
    size_t C = (size_t)m->cfg->n_embd, BR = llama_rows_here(m, BT);
    if (!m->tp) {
        m->k->matmul_forward(out, inp, w, NULL, residual, BT, K, C);
        return 0;
    }
    float *part = m->gacts.dbtc;
    m->k->matmul_forward(part, inp, w, NULL, NULL, BT, K, C);
    if (m->sp) {
        FSDP_CHECK(fsdp_tp_seq_scatter_forward(m->tp, part, out, BR, C));
        m->k->bias_residual_forward(out, out, NULL, residual, BR, C);
        return 0;
    }
    FSDP_CHECK(fsdp_tp_reduce_out_forward(m->tp, part, BT * C));
    m->k->bias_residual_forward(out, part, NULL, residual, BT, C);
    return 0;
}

/* Block l from residual[l]; full = 0 stops before down_proj, which only
 * produces residual[l+1] (what a checkpointed backward does not need).
 * With tensor parallelism the heads and the MLP features are this rank's
 * (lnh query heads, lnkv key/value heads, lf features). */
static int llama_block_forward(struct fsdp_llama *m, int l, int full)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, F = m->lf;
    size_t BR = llama_rows_here(m, BT);
    struct fsdp_llama_block_view w;
    struct fsdp_llama_block_acts *a = &m->acts.blocks[l];
    float *x = llama_residual(m, l);
    const float *in;
    fsdp_llama_block_view(m, m->unit_params[1 + l], &w);
    /* Without tensor parallelism the norms' pass over the residual stream
     * also copies it to where the next row-parallel product accumulates
     * (beta = 1), so that product needs no prefill pass of its own. */
    float *keep1 = m->tp ? NULL : a->res2;
    float *keep2 = m->tp || !full ? NULL : llama_residual(m, l + 1);
    /* attention: one product for q, k and v (and their biases), RoPE in place */
    fsdp_cpu_rmsnorm_forward_keep(a->rms1, a->rms1_rstd, keep1, x, w.attn_norm, BR, C,
                                  c->norm_eps);
    FSDP_CHECK(llama_tp_enter(m, a->rms1, BT, &in));
    m->k->matmul_forward(a->qkv, in, w.qw, w.qb, NULL, BT, C, (size_t)m->qkv_w);
    fsdp_cpu_rope_forward(a->qkv, m->rope_cos, m->rope_sin, m->B, m->T, m->lnh, m->lnkv, m->hs);
    fsdp_cpu_gqa_attention_forward(a->atty, a->att_lse, m->acts.att_scratch, a->qkv, m->B, m->T,
                                   m->lnh, m->lnkv, m->hs);
    FSDP_CHECK(llama_row_parallel(m, a->res2, a->atty, w.ow, keep1 ? a->res2 : x, BT, m->lq));
    /* MLP: gate and up as two products (as fast as one packed product, and
     * SwiGLU then runs over whole buffers rather than row by row) */
    fsdp_cpu_rmsnorm_forward_keep(a->rms2, a->rms2_rstd, keep2, a->res2, w.mlp_norm, BR, C,
                                  c->norm_eps);
    FSDP_CHECK(llama_tp_enter(m, a->rms2, BT, &in));
    m->k->matmul_forward(a->gate, in, w.gatew, NULL, NULL, BT, C, F);
    m->k->matmul_forward(a->up, in, w.upw, NULL, NULL, BT, C, F);
    fsdp_cpu_swiglu_forward(a->h, a->gate, a->up, BT * F);
    if (full) {
        float *out = llama_residual(m, l + 1);
        FSDP_CHECK(llama_row_parallel(m, out, a->h, w.downw, keep2 ? out : a->res2, BT, F));
    }
    return 0;
}

/* logits (rows, V) of rows [r0, r0 + rows): lnf rows @ lm_head^T; with
 * tensor parallelism (rows, tvn), this rank's vocabulary slice */
static void llama_head_logits(const struct fsdp_llama *m, const float *lm_head, size_t r0,
                              size_t rows, float *out)
{
    size_t C = (size_t)m->cfg->n_embd;
    m->k->matmul_forward(out, m->acts.lnf + r0 * C, lm_head, NULL, NULL, rows, C,
                         m->tp ? m->tvn : (size_t)m->cfg->vocab_size);
}

/* Tensor parallel: each row's loss over this rank's vocabulary slice, a
 * row chunk at a time, then the parallel cross-entropy's combination over
 * the ranks; *kept counts the rows not ignored. */
static int llama_head_loss_tp(struct fsdp_llama *m, const float *lm_head, size_t BT,
                              size_t *kept)
{
    struct fsdp_llama_acts *a = &m->acts;
    size_t chunk = llama_head_rows(m);
    for (size_t r0 = 0; r0 < BT; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk;
        if (m->tvn == 0) { /* a slice of padding only */
            for (size_t i = r0; i < r0 + rows; i++) {
                a->ce_stats[2 * i] = -INFINITY;
                a->ce_stats[2 * i + 1] = 0.0f;
                a->zt[i] = 0.0f;
            }
            continue;
        }
        llama_head_logits(m, lm_head, r0, rows, a->head_logits);
        m->k->crossentropy_slice_forward(a->ce_stats + 2 * r0, a->zt + r0, a->head_logits,
                                         m->targets + r0, rows, m->tvn, m->tv0, m->ignore_index,
                                         1);
    }
    FSDP_CHECK(fsdp_tp_xent_combine(m->tp, a->ce_stats, a->zt, a->xent, BT));
    *kept = 0;
    for (size_t r = 0; r < BT; r++) {
        int keep = m->targets[r] != m->ignore_index;
        a->losses[r] = keep ? a->ce_stats[2 * r] + logf(a->ce_stats[2 * r + 1]) - a->zt[r] : 0.0f;
        *kept += (size_t)keep;
    }
    return 0;
}

/*
 * The final norm, then with targets the loss one row chunk at a time: the
 * chunk's logits, each row's loss and softmax statistics (kept for the
 * backward); the logits are dropped. The mean adds the kept rows' losses in
 * row order in double.
 */
static int llama_head_forward(struct fsdp_llama *m)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t chunk = llama_head_rows(m);
    struct fsdp_llama_acts *a = &m->acts;
    struct fsdp_llama_head_view w;
    size_t BR = llama_rows_here(m, BT);
    float *mine = a->lnf + (m->sp ? (size_t)m->tp->rank * BR * C : 0);
    fsdp_llama_head_view(m, m->unit_params[c->n_layer + 1], m->unit_params[0], &w);
    /* sequence parallel: this rank's rows, then every rank's gathered for the head */
    fsdp_cpu_rmsnorm_forward(mine, a->lnf_rstd, llama_residual(m, c->n_layer), w.norm, BR, C,
                             c->norm_eps);
    if (m->sp) {
        FSDP_CHECK(fsdp_tp_seq_gather_forward(m->tp, mine, a->lnf, BR, C));
    }
    m->bwd_next = -1;
    if (!m->targets) {
        return 0;
    }
    size_t kept = 0;
    double sum = 0.0;
    if (m->tp) {
        FSDP_CHECK(llama_head_loss_tp(m, w.lm_head, BT, &kept));
    }
    for (size_t r0 = 0; r0 < BT && !m->tp; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk, k;
        llama_head_logits(m, w.lm_head, r0, rows, a->head_logits);
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

int fsdp_llama_logits(struct fsdp_llama *m, size_t row0, size_t rows, float *out)
{
    int last = m->spec->n_units - 1;
    size_t BT = (size_t)m->B * (size_t)m->T;
    if (!m->tokens || !m->fwd_done[last]) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "logits: no forward of the last unit since the batch was set");
    }
    if (row0 > BT || rows > BT - row0) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: rows [%zu, %zu + %zu) outside the batch's %zu",
                        row0, row0, rows, BT);
    }
    if (!m->unit_params[last] || (m->cfg->tied && !m->unit_params[0])) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: the head's parameters are not set");
    }
    if (m->tp) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: with tensor parallelism this rank holds only "
                        "the head's vocabulary [%zu, %zu)", m->tv0, m->tv0 + m->tvn);
    }
    struct fsdp_llama_head_view w;
    fsdp_llama_head_view(m, m->unit_params[last], m->unit_params[0], &w);
    if (rows > 0) {
        llama_head_logits(m, w.lm_head, row0, rows, out);
    }
    return 0;
}

int fsdp_llama_forward_unit(struct fsdp_llama *m, int u)
{
    int n = m->spec->n_units, L = m->cfg->n_layer;
    if (u < 0 || u >= n) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: unit %d out of range [0, %d)", u, n);
    }
    if (!m->tokens) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: no batch (set_batch)");
    }
    if (u > 0 && !m->fwd_done[u - 1]) {
        return fsdp_err(FSDP_ERR_INVALID, "forward of unit %d before unit %d's", u, u - 1);
    }
    if (!m->unit_params[u] || (u == L + 1 && m->cfg->tied && !m->unit_params[0])) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: unit %d's parameters are not set%s", u,
                        u == L + 1 && m->cfg->tied ? " (the tied head also reads unit 0)" : "");
    }
    if (u == 0) {
        FSDP_CHECK(llama_embed_forward(m));
    } else if (u <= L) {
        FSDP_CHECK(llama_block_forward(m, u - 1, 1));
    } else {
        FSDP_CHECK(llama_head_forward(m));
    }
    m->fwd_done[u] = 1;
    return 0;
}

int fsdp_llama_forward(struct fsdp_llama *m, const int32_t *tokens, const int32_t *targets, int B,
                       int T, float *loss)
{
    FSDP_CHECK(fsdp_llama_set_batch(m, tokens, targets, B, T));
    for (int u = 0; u < m->spec->n_units; u++) {
        FSDP_CHECK(fsdp_llama_forward_unit(m, u));
    }
    if (loss) {
        *loss = targets ? m->loss : NAN;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// backward

/*
 * Per row chunk: the logits again (the forward's product, so the same bits)
 * unless one chunk holds them all, their gradient from the saved
 * statistics, d(lnf) rows and the lm_head (tied: embed_tokens) gradient
 * accumulated with the seed scale as alpha. A chunk with every target
 * ignored has zero gradient and is skipped.
 */
static int llama_head_backward(struct fsdp_llama *m)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t chunk = llama_head_rows(m);
    struct fsdp_llama_acts *a = &m->acts;
    struct fsdp_llama_grad_acts *g = &m->gacts;
    struct fsdp_llama_head_view w, dw;
    int last = c->n_layer + 1;
    fsdp_llama_head_view(m, m->unit_params[last], m->unit_params[0], &w);
    fsdp_llama_head_view(m, m->unit_grads[last], m->unit_grads[0], &dw);
    double div = m->loss_divisor > 0 ? m->loss_divisor : (double)m->n_kept;
    /* no kept token: every dlogits row is zero, so is the gradient */
    float alpha = div > 0 ? (float)((double)m->loss_scale / div) : 0.0f;
    size_t cols = m->tp ? m->tvn : V; /* tensor parallel: this rank's vocabulary slice */
    for (size_t r0 = 0; r0 < BT; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk, kept = 0;
        for (size_t r = r0; r < r0 + rows; r++) {
            kept += m->targets[r] != m->ignore_index;
        }
        if (kept == 0 || cols == 0) {
            memset(g->dbtc + r0 * C, 0, rows * C * sizeof(float));
            continue;
        }
        if (chunk < BT) {
            llama_head_logits(m, w.lm_head, r0, rows, a->head_logits);
        }
        if (m->tp) {
            m->k->crossentropy_slice_backward(a->head_logits, a->head_logits,
                                              a->ce_stats + 2 * r0, m->targets + r0, rows, cols,
                                              m->tv0, m->ignore_index, 1.0f);
        } else {
            m->k->crossentropy_backward(a->head_logits, a->head_logits, a->ce_stats + 2 * r0,
                                        m->targets + r0, rows, V, m->ignore_index, 1.0f);
        }
        m->k->matmul_backward(g->dbtc + r0 * C, dw.lm_head, NULL, a->head_logits,
                              a->lnf + r0 * C, w.lm_head, rows, C, cols, alpha, 0);
    }
    /* tensor parallel: each rank's d(norm output) is its vocabulary slice's
     * part, summed over the ranks into the rows held here */
    size_t BR = llama_rows_here(m, BT);
    const float *dlnf = g->dbtc;
    if (m->tp) {
        FSDP_CHECK(llama_tp_din(m, BT, &dlnf));
    }
    memset(g->dres, 0, BR * C * sizeof(float));
    if (m->sp) {
        memset(g->spg, 0, C * sizeof(float));
    }
    fsdp_cpu_rmsnorm_backward(g->dres, m->sp ? g->spg : dw.norm, dlnf,
                              llama_residual(m, c->n_layer), w.norm, a->lnf_rstd, BR, C);
    if (m->sp) {
        float *const dst[1] = {dw.norm};
        FSDP_CHECK(llama_sp_norm_grads(m, dst, 1));
    }
    return 0;
}

/* dres holds d(block output) on entry and d(block input) on return. With
 * tensor parallelism each rank's d(norm output) is its heads' and
 * features' part, summed over the ranks (copy-in's backward) before the
 * norms' backward. */
static int llama_block_backward(struct fsdp_llama *m, int l)
{
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg->n_embd, F = m->lf;
    size_t BR = llama_rows_here(m, BT);
    struct fsdp_llama_grad_acts *g = &m->gacts;
    struct fsdp_llama_block_acts *a = &m->acts.blocks[l];
    struct fsdp_llama_block_view w, dw;
    const float *dout, *in, *din;
    /* sequence parallel: the norms' weight gradients of this rank's rows go
     * through spg, and the gathered dres occupies dbtc, so d(attention
     * output) goes to xfull */
    float *spg = g->spg, *datty = m->sp ? g->xfull : g->dbtc;
    if (m->checkpoint[l]) {
        FSDP_CHECK(llama_block_forward(m, l, 0));
    }
    fsdp_llama_block_view(m, m->unit_params[1 + l], &w);
    fsdp_llama_block_view(m, m->unit_grads[1 + l], &dw);
    if (m->sp) {
        memset(spg, 0, 2 * C * sizeof(float));
    }
    /* MLP */
    FSDP_CHECK(llama_tp_dout(m, BT, &dout));
    m->k->matmul_backward(g->dh, dw.downw, NULL, dout, a->h, w.downw, BT, F, C, 1.0f, 0);
    fsdp_cpu_swiglu_backward(a->gate, a->up, g->dh, a->gate, a->up, BT * F); /* in place */
    FSDP_CHECK(llama_tp_enter(m, a->rms2, BT, &in));
    m->k->matmul_backward(g->dbtc, dw.gatew, NULL, a->gate, in, w.gatew, BT, C, F, 1.0f, 0);
    m->k->matmul_backward(g->dbtc, dw.upw, NULL, a->up, in, w.upw, BT, C, F, 1.0f, 1);
    FSDP_CHECK(llama_tp_din(m, BT, &din));
    fsdp_cpu_rmsnorm_backward(g->dres, m->sp ? spg : dw.mlp_norm, din, a->res2, w.mlp_norm,
                              a->rms2_rstd, BR, C);
    /* attention */
    FSDP_CHECK(llama_tp_dout(m, BT, &dout));
    m->k->matmul_backward(datty, dw.ow, NULL, dout, a->atty, w.ow, BT, m->lq, C, 1.0f, 0);
    fsdp_cpu_gqa_attention_backward(g->dqkv, m->acts.att_scratch, datty, a->qkv, a->atty,
                                    a->att_lse, m->B, m->T, m->lnh, m->lnkv, m->hs);
    fsdp_cpu_rope_backward(g->dqkv, m->rope_cos, m->rope_sin, m->B, m->T, m->lnh, m->lnkv, m->hs);
    FSDP_CHECK(llama_tp_enter(m, a->rms1, BT, &in));
    m->k->matmul_backward(g->dbtc, dw.qw, dw.qb, g->dqkv, in, w.qw, BT, C, (size_t)m->qkv_w, 1.0f,
                          0);
    FSDP_CHECK(llama_tp_din(m, BT, &din));
    fsdp_cpu_rmsnorm_backward(g->dres, m->sp ? spg + C : dw.attn_norm, din, llama_residual(m, l),
                              w.attn_norm, a->rms1_rstd, BR, C);
    if (m->sp) {
        float *const dst[2] = {dw.mlp_norm, dw.attn_norm};
        FSDP_CHECK(llama_sp_norm_grads(m, dst, 2));
    }
    return 0;
}

/* d embed_tokens[tokens[r]] += d x[r], rows in order (sequence parallel:
 * every rank's rows gathered first, so every rank's table gradient is whole) */
static int llama_embed_backward(struct fsdp_llama *m)
{
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg->n_embd;
    float *dwte = m->unit_grads[0] + m->emb_off;
    const float *dx;
    FSDP_CHECK(llama_tp_dout(m, BT, &dx));
    if (m->tp) { /* vocabulary parallel: the rows of the ids this rank holds */
        fsdp_tp_embed_backward(m->tp, dwte, NULL, dx, m->tokens, (size_t)m->cfg->vocab_size, 0,
                               BT, C);
        return 0;
    }
    for (size_t r = 0; r < BT; r++) {
        float *row = dwte + (size_t)m->tokens[r] * C;
        for (size_t i = 0; i < C; i++) {
            row[i] += dx[r * C + i];
        }
    }
    return 0;
}

int fsdp_llama_backward_unit(struct fsdp_llama *m, int u)
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
        return fsdp_err(FSDP_ERR_INVALID,
                        "backward: unit %d's parameters or gradients are not set%s", u,
                        tied_head ? " (the tied head also uses unit 0's)" : "");
    }
    if (u == 0) {
        FSDP_CHECK(llama_embed_backward(m));
    } else if (u <= L) {
        FSDP_CHECK(llama_block_backward(m, u - 1));
    } else {
        FSDP_CHECK(llama_head_backward(m));
    }
    m->bwd_next = u - 1;
    return 0;
}

int fsdp_llama_backward(struct fsdp_llama *m)
{
    for (int u = m->spec->n_units - 1; u >= 0; u--) {
        FSDP_CHECK(fsdp_llama_backward_unit(m, u));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// accounting

double fsdp_llama_flops_per_token(const struct fsdp_model_spec *s, int T)
{
    const struct fsdp_llama_config *c = fsdp_llama_cfg(s);
    double C = c->n_embd, V = c->vocab_size, L = c->n_layer;
    double N = (double)s->total_numel;
    if (!c->tied) {
        N -= V * C; /* embed_tokens is only a lookup; lm_head is the product */
    }
    return 6.0 * N + 12.0 * L * C * (double)T;
}

// ----------------------------------------------------------------------------
// the generic interface (model.h)

static struct fsdp_llama *llama_of(struct fsdp_model *m)
{
    return (struct fsdp_llama *)m;
}

static int llama_op_create(const struct fsdp_model_spec *spec, const struct fsdp_model_opts *o,
                           struct fsdp_model **out)
{
    struct fsdp_llama *m = NULL;
    if (o->dev && o->dev->mem != FSDP_MEM_HOST) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "llama: runs on host memory only, not on device %d (RMSNorm, RoPE and "
                        "SwiGLU have host kernels only)", o->dev->index);
    }
    FSDP_CHECK(llama_create(spec, o->max_B, o->max_T, o->tp, &m));
    if (o->dev) {
        m->k = o->dev->k;
    }
    if (o->head_chunk > 0) {
        int rc = fsdp_llama_set_head_chunk(m, o->head_chunk);
        if (rc < 0) {
            fsdp_llama_destroy(m);
            return rc;
        }
    }
    *out = &m->base;
    return 0;
}

/*
 * Megatron-LM's layout: q, k, v (and their biases) by heads, gate and up by
 * features, o_proj and down_proj by input columns, embed_tokens (and an
 * untied lm_head) by vocabulary, padded; the norms whole on every rank. Grouped-query attention keeps its
 * grouping on every rank: each holds NH / tp query heads and the NKV / tp
 * key/value heads they read.
 */
static int llama_op_tp_cut(const struct fsdp_model_spec *spec, int tp, size_t i,
                           struct fsdp_tp_cut *out)
{
    const struct fsdp_llama_config *c = fsdp_llama_cfg(spec);
    const struct fsdp_param_spec *p = &spec->params[i];
    if (tp > c->n_head) {
        return fsdp_err(FSDP_ERR_INVALID, "tp %d is larger than n_head %d: every tensor-parallel "
                        "rank needs at least one attention head", tp, c->n_head);
    }
    if (c->n_head % tp != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "n_head %d is not divisible by tp %d: attention is "
                        "split by heads", c->n_head, tp);
    }
    if (c->n_kv_head % tp != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "n_kv_head %d is not divisible by tp %d: key/value "
                        "heads are split across tp (grouped-query attention keeps %d query heads "
                        "per key/value head)", c->n_kv_head, tp, c->n_head / c->n_kv_head);
    }
    if (c->ffn_hidden % tp != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "ffn_hidden %d is not divisible by tp %d: the MLP is "
                        "split by features", c->ffn_hidden, tp);
    }
    *out = (struct fsdp_tp_cut){.dim = -1, .chunks = 1, .pad = 0};
    if (p->tp == FSDP_TP_COLWISE) {
        out->dim = 0;
    } else if (p->tp == FSDP_TP_ROWWISE) {
        out->dim = 1;
    } else if (p->tp == FSDP_TP_VOCAB) {
        out->dim = 0;
        out->pad = 1;
    }
    return 0;
}

static void llama_op_destroy(struct fsdp_model *m)
{
    fsdp_llama_destroy(llama_of(m));
}

/* Units are blocks from 1 to L; -1: every block. The embedding and the
 * head keep their activations (they are small next to a block's). */
static int llama_op_set_checkpoint(struct fsdp_model *m, int u, int on)
{
    struct fsdp_llama *g = llama_of(m);
    if (u < 0) {
        return fsdp_llama_set_checkpoint(g, -1, on);
    }
    if (u < 1 || u > g->cfg->n_layer) {
        return 0;
    }
    return fsdp_llama_set_checkpoint(g, u - 1, on);
}

static int llama_op_reserve(struct fsdp_model *m)
{
    return fsdp_llama_reserve(llama_of(m));
}

static int llama_op_set_unit(struct fsdp_model *m, int u, float *params, float *grads)
{
    return fsdp_llama_set_unit(llama_of(m), u, params, grads);
}

static void llama_op_set_loss_seed(struct fsdp_model *m, double divisor, float scale)
{
    fsdp_llama_set_loss_seed(llama_of(m), divisor, scale);
}

static int llama_op_set_batch(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets,
                              int B, int T)
{
    return fsdp_llama_set_batch(llama_of(m), tokens, targets, B, T);
}

static int llama_op_forward_unit(struct fsdp_model *m, int u)
{
    return fsdp_llama_forward_unit(llama_of(m), u);
}

static int llama_op_backward_unit(struct fsdp_model *m, int u)
{
    return fsdp_llama_backward_unit(llama_of(m), u);
}

static float llama_op_loss(const struct fsdp_model *m)
{
    return ((const struct fsdp_llama *)m)->loss;
}

static int llama_op_logits(struct fsdp_model *m, size_t row0, size_t rows, float *out)
{
    return fsdp_llama_logits(llama_of(m), row0, rows, out);
}

static size_t llama_op_activation_bytes(const struct fsdp_model *m)
{
    return fsdp_llama_activation_bytes((const struct fsdp_llama *)m);
}

static size_t llama_op_workspace_bytes(const struct fsdp_model *m)
{
    return fsdp_llama_workspace_bytes((const struct fsdp_llama *)m);
}

const struct fsdp_model_ops fsdp_llama_ops = {
    .size = sizeof(struct fsdp_model_ops),
    .name = FSDP_MODEL_ARCH_LLAMA,
    .create = llama_op_create,
    .destroy = llama_op_destroy,
    .set_checkpoint = llama_op_set_checkpoint,
    .reserve = llama_op_reserve,
    .set_unit = llama_op_set_unit,
    .set_loss_seed = llama_op_set_loss_seed,
    .set_batch = llama_op_set_batch,
    .forward_unit = llama_op_forward_unit,
    .backward_unit = llama_op_backward_unit,
    .loss = llama_op_loss,
    .logits = llama_op_logits,
    .activation_bytes = llama_op_activation_bytes,
    .workspace_bytes = llama_op_workspace_bytes,
    .flops_per_token = fsdp_llama_flops_per_token,
    .decoder_create = fsdp_llama_decoder_create,
    .tp_cut = llama_op_tp_cut,
};
