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

static int llama_map_block(struct fsdp_llama *m, size_t l)
{
    const struct fsdp_llama_config *c = m->cfg;
    char name[FSDP_PARAM_NAME_MAX + 16];
    size_t off;
#define FSDP_LLAMA_X(id, field, suffix, rows, cols, init, decay, tp, bias)                         \
    if (!(bias) || c->attn_bias) {                                                                 \
        snprintf(name, sizeof(name), "layers.%zu.%s", l, suffix);                                  \
        FSDP_CHECK(llama_locate(m->spec, name, 1 + (int)l,                                         \
                                fsdp_llama_dim_size(c, FSDP_LLAMA_##rows),                         \
                                FSDP_LLAMA_##cols == FSDP_LLAMA_D1                                 \
                                    ? 0                                                            \
                                    : fsdp_llama_dim_size(c, FSDP_LLAMA_##cols),                   \
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
    size_t Q = fsdp_llama_dim_size(c, FSDP_LLAMA_DQ), KV = fsdp_llama_dim_size(c, FSDP_LLAMA_DKV);
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

static void llama_layout_block(const struct fsdp_llama *m, struct fsdp_llama_block_acts *a,
                               float *base, size_t *off, size_t BT)
{
    size_t C = (size_t)m->cfg->n_embd, F = (size_t)m->cfg->ffn_hidden;
    a->rms1 = llama_take(base, off, BT * C);
    a->rms1_rstd = llama_take(base, off, BT);
    a->qkv = llama_take(base, off, BT * (size_t)m->qkv_w);
    a->atty = llama_take(base, off, BT * C);
    a->att_lse = llama_take(base, off, BT * (size_t)m->cfg->n_head);
    a->res2 = llama_take(base, off, BT * C);
    a->rms2 = llama_take(base, off, BT * C);
    a->rms2_rstd = llama_take(base, off, BT);
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
    a->residual = llama_take(base, &off, (L + 1) * BT * C);
    a->lnf = llama_take(base, &off, BT * C);
    a->lnf_rstd = llama_take(base, &off, BT);
    a->head_logits = llama_take(base, &off, llama_head_rows(m) * V);
    a->ce_stats = llama_take(base, &off, 2 * BT);
    a->losses = llama_take(base, &off, BT);
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
    size_t F = (size_t)m->cfg->ffn_hidden, off = 0;
    g->dres = llama_take(base, &off, BT * C);
    g->dbtc = llama_take(base, &off, BT * C);
    g->dqkv = llama_take(base, &off, BT * (size_t)m->qkv_w);
    g->dgate = llama_take(base, &off, BT * F);
    g->dup = llama_take(base, &off, BT * F);
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

int fsdp_llama_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                      struct fsdp_llama **out)
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
    m->qkv_w = (c->n_head + 2 * c->n_kv_head) * m->hs;
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
    size_t stride = (size_t)m->max_B * (size_t)m->max_T * (size_t)m->cfg->n_embd;
    return m->acts.residual + (size_t)l * stride;
}

/* x[r] = embed_tokens[tokens[r]] */
static void llama_embed_forward(struct fsdp_llama *m)
{
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg->n_embd;
    const float *wte = m->unit_params[0] + m->emb_off;
    float *x = llama_residual(m, 0);
    for (size_t r = 0; r < BT; r++) {
        memcpy(x + r * C, wte + (size_t)m->tokens[r] * C, C * sizeof(float));
    }
}

/* Block l from residual[l]; full = 0 stops before down_proj, which only
 * produces residual[l+1] (what a checkpointed backward does not need). */
static void llama_block_forward(struct fsdp_llama *m, int l, int full)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, F = (size_t)c->ffn_hidden;
    struct fsdp_llama_block_view w;
    struct fsdp_llama_block_acts *a = &m->acts.blocks[l];
    float *x = llama_residual(m, l);
    fsdp_llama_block_view(m, m->unit_params[1 + l], &w);
    /* attention: one product for q, k and v (and their biases), RoPE in place */
    fsdp_cpu_rmsnorm_forward(a->rms1, a->rms1_rstd, x, w.attn_norm, BT, C, c->norm_eps);
    m->k->matmul_forward(a->qkv, a->rms1, w.qw, w.qb, NULL, BT, C, (size_t)m->qkv_w);
    fsdp_cpu_rope_forward(a->qkv, m->rope_cos, m->rope_sin, m->B, m->T, c->n_head, c->n_kv_head,
                          m->hs);
    fsdp_cpu_gqa_attention_forward(a->atty, a->att_lse, m->acts.att_scratch, a->qkv, m->B, m->T,
                                   c->n_head, c->n_kv_head, m->hs);
    m->k->matmul_forward(a->res2, a->atty, w.ow, NULL, x, BT, C, C);
    /* MLP: gate and up as two products (as fast as one packed product, and
     * SwiGLU then runs over whole buffers rather than row by row) */
    fsdp_cpu_rmsnorm_forward(a->rms2, a->rms2_rstd, a->res2, w.mlp_norm, BT, C, c->norm_eps);
    m->k->matmul_forward(a->gate, a->rms2, w.gatew, NULL, NULL, BT, C, F);
    m->k->matmul_forward(a->up, a->rms2, w.upw, NULL, NULL, BT, C, F);
    fsdp_cpu_swiglu_forward(a->h, a->gate, a->up, BT * F);
    if (full) {
        m->k->matmul_forward(llama_residual(m, l + 1), a->h, w.downw, NULL, a->res2, BT, F, C);
    }
}

/* logits (rows, V) of rows [r0, r0 + rows): lnf rows @ lm_head^T */
static void llama_head_logits(const struct fsdp_llama *m, const float *lm_head, size_t r0,
                              size_t rows, float *out)
{
    size_t C = (size_t)m->cfg->n_embd;
    m->k->matmul_forward(out, m->acts.lnf + r0 * C, lm_head, NULL, NULL, rows, C,
                         (size_t)m->cfg->vocab_size);
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
    fsdp_llama_head_view(m, m->unit_params[c->n_layer + 1], m->unit_params[0], &w);
    fsdp_cpu_rmsnorm_forward(a->lnf, a->lnf_rstd, llama_residual(m, c->n_layer), w.norm, BT, C,
                             c->norm_eps);
    m->bwd_next = -1;
    if (!m->targets) {
        return 0;
    }
    size_t kept = 0;
    double sum = 0.0;
    for (size_t r0 = 0; r0 < BT; r0 += chunk) {
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
        llama_embed_forward(m);
    } else if (u <= L) {
        llama_block_forward(m, u - 1, 1);
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
static void llama_head_backward(struct fsdp_llama *m)
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
    for (size_t r0 = 0; r0 < BT; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk, kept = 0;
        for (size_t r = r0; r < r0 + rows; r++) {
            kept += m->targets[r] != m->ignore_index;
        }
        if (kept == 0) {
            memset(g->dbtc + r0 * C, 0, rows * C * sizeof(float));
            continue;
        }
        if (chunk < BT) {
            llama_head_logits(m, w.lm_head, r0, rows, a->head_logits);
        }
        m->k->crossentropy_backward(a->head_logits, a->head_logits, a->ce_stats + 2 * r0,
                                    m->targets + r0, rows, V, m->ignore_index, 1.0f);
        m->k->matmul_backward(g->dbtc + r0 * C, dw.lm_head, NULL, a->head_logits,
                              a->lnf + r0 * C, w.lm_head, rows, C, V, alpha, 0);
    }
    memset(g->dres, 0, BT * C * sizeof(float));
    fsdp_cpu_rmsnorm_backward(g->dres, dw.norm, g->dbtc, llama_residual(m, c->n_layer), w.norm,
                              a->lnf_rstd, BT, C);
}

/* dres holds d(block output) on entry and d(block input) on return. */
static void llama_block_backward(struct fsdp_llama *m, int l)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)c->n_embd, F = (size_t)c->ffn_hidden;
    struct fsdp_llama_grad_acts *g = &m->gacts;
    struct fsdp_llama_block_acts *a = &m->acts.blocks[l];
    struct fsdp_llama_block_view w, dw;
    if (m->checkpoint[l]) {
        llama_block_forward(m, l, 0);
    }
    fsdp_llama_block_view(m, m->unit_params[1 + l], &w);
    fsdp_llama_block_view(m, m->unit_grads[1 + l], &dw);
    /* MLP */
    m->k->matmul_backward(g->dh, dw.downw, NULL, g->dres, a->h, w.downw, BT, F, C, 1.0f, 0);
    fsdp_cpu_swiglu_backward(g->dgate, g->dup, g->dh, a->gate, a->up, BT * F);
    m->k->matmul_backward(g->dbtc, dw.gatew, NULL, g->dgate, a->rms2, w.gatew, BT, C, F, 1.0f, 0);
    m->k->matmul_backward(g->dbtc, dw.upw, NULL, g->dup, a->rms2, w.upw, BT, C, F, 1.0f, 1);
    fsdp_cpu_rmsnorm_backward(g->dres, dw.mlp_norm, g->dbtc, a->res2, w.mlp_norm, a->rms2_rstd,
                              BT, C);
    /* attention */
    m->k->matmul_backward(g->dbtc, dw.ow, NULL, g->dres, a->atty, w.ow, BT, C, C, 1.0f, 0);
    fsdp_cpu_gqa_attention_backward(g->dqkv, m->acts.att_scratch, g->dbtc, a->qkv, a->atty,
                                    a->att_lse, m->B, m->T, c->n_head, c->n_kv_head, m->hs);
    fsdp_cpu_rope_backward(g->dqkv, m->rope_cos, m->rope_sin, m->B, m->T, c->n_head,
                           c->n_kv_head, m->hs);
    m->k->matmul_backward(g->dbtc, dw.qw, dw.qb, g->dqkv, a->rms1, w.qw, BT, C,
                          (size_t)m->qkv_w, 1.0f, 0);
    fsdp_cpu_rmsnorm_backward(g->dres, dw.attn_norm, g->dbtc, llama_residual(m, l), w.attn_norm,
                              a->rms1_rstd, BT, C);
}

/* d embed_tokens[tokens[r]] += d x[r], rows in order */
static void llama_embed_backward(struct fsdp_llama *m)
{
    size_t BT = (size_t)m->B * (size_t)m->T, C = (size_t)m->cfg->n_embd;
    float *dwte = m->unit_grads[0] + m->emb_off;
    const float *dx = m->gacts.dres;
    for (size_t r = 0; r < BT; r++) {
        float *row = dwte + (size_t)m->tokens[r] * C;
        for (size_t i = 0; i < C; i++) {
            row[i] += dx[r * C + i];
        }
    }
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
        llama_embed_backward(m);
    } else if (u <= L) {
        llama_block_backward(m, u - 1);
    } else {
        llama_head_backward(m);
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
    FSDP_CHECK(fsdp_llama_create(spec, o->max_B, o->max_T, &m));
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
};
