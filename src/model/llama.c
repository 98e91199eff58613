/*
 * llama.c - the Llama family (Hugging Face semantics: RMSNorm, RoPE in the
 * rotate_half convention with its rope_scaling types, grouped-query
 * attention, SwiGLU) forward and backward per unit on the host kernels,
 * activation checkpointing, the LM head in row chunks and the FLOP
 * accounting (the activation layout: llama_acts.c). It reads parameters only through the
 * caller's unit buffers and the offsets of the parameter table; it never
 * owns or allocates parameters or their gradients.
 */
#include "config.h"
#include "model/llama.h"
#include "tp/tp_ops.h"
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
    return cut ? n / (size_t)m->lm.tpn : n;
}

static int llama_map_block(struct fsdp_llama *m, size_t l)
{
    const struct fsdp_llama_config *c = m->cfg;
    char name[FSDP_PARAM_NAME_MAX + 16];
    size_t off;
#define FSDP_LLAMA_X(id, field, suffix, rows, cols, init, decay, tp, bias)                         \
    if (!(bias) || c->attn_bias) {                                                                 \
        snprintf(name, sizeof(name), "layers.%zu.%s", l, suffix);                                  \
        FSDP_CHECK(fsdp_lm_locate(m->lm.spec, name, 1 + (int)l,                                    \
                                  llama_tp_dim(m, FSDP_LLAMA_##rows, tp, 0),                       \
                                  FSDP_LLAMA_##cols == FSDP_LLAMA_D1                               \
                                      ? 0                                                          \
                                      : llama_tp_dim(m, FSDP_LLAMA_##cols, tp, 1),                 \
                                  &off));                                                          \
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
    const struct fsdp_model_spec *s = m->lm.spec;
    const struct fsdp_llama_config *c = m->cfg;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t Q = m->lq, KV = (size_t)m->lnkv * (size_t)m->hs;
    V = m->lm.tvl; /* tensor parallel: this rank's vocabulary slice, padded */
    FSDP_CHECK(fsdp_lm_locate(s, "embed_tokens.weight", 0, V, C, &m->emb_off));
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
    FSDP_CHECK(fsdp_lm_locate(s, "norm.weight", last, C, 0, &m->head_off[0]));
    long lm = fsdp_model_spec_find(s, "lm_head.weight");
    if (c->tied) {
        if (lm >= 0) {
            return fsdp_err(FSDP_ERR_INTERNAL, "parameter table: tied model lists lm_head.weight");
        }
        m->head_off[1] = m->emb_off;
    } else {
        FSDP_CHECK(fsdp_lm_locate(s, "lm_head.weight", last, V, C, &m->head_off[1]));
    }
    return 0;
}

void fsdp_llama_block_view(const struct fsdp_llama *m, struct fsdp_lm_mem unit,
                           struct fsdp_llama_block_view *v)
{
#define FSDP_LLAMA_X(id, field, suffix, rows, cols, init, decay, tp, bias)                         \
    v->field = m->blk_off[FSDP_LLAMA_BLK_##id] == SIZE_MAX                                         \
                   ? NULL                                                                          \
                   : fsdp_lm_at(unit, m->blk_off[FSDP_LLAMA_BLK_##id]);
    FSDP_LLAMA_BLOCK_TENSORS(FSDP_LLAMA_X)
#undef FSDP_LLAMA_X
    v->pt = unit.pt;
}

void fsdp_llama_head_view(const struct fsdp_llama *m, struct fsdp_lm_mem unit_last,
                          struct fsdp_lm_mem unit0, struct fsdp_llama_head_view *v)
{
    v->norm = fsdp_lm_at(unit_last, m->head_off[0]);
    v->lm_head = fsdp_lm_at(m->cfg->tied ? unit0 : unit_last, m->head_off[1]);
    v->pt = unit_last.pt;
}

// ----------------------------------------------------------------------------
// lifetime and settings

void fsdp_llama_rope_scaling(const struct fsdp_llama_config *c, struct fsdp_rope_scaling *out)
{
    *out = (struct fsdp_rope_scaling){
        .type = c->rope_scaling == FSDP_LLAMA_ROPE_LINEAR   ? FSDP_ROPE_LINEAR
                : c->rope_scaling == FSDP_LLAMA_ROPE_LLAMA3 ? FSDP_ROPE_LLAMA3
                                                            : FSDP_ROPE_NONE,
        .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq,
        .high_freq_factor = c->rope_high_freq,
        .original_context = c->rope_original,
    };
}

/* cos/sin of every position up to max_T (a batch always starts at position 0). */
static int llama_rope_tables(struct fsdp_llama *m)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t h2 = (size_t)m->hs / 2, n = (size_t)m->lm.max_T * h2;
    struct fsdp_rope_scaling sc;
    fsdp_llama_rope_scaling(c, &sc);
    /* computed on the host once, then copied to the device */
    float *inv = malloc(h2 * sizeof(float)), *cs = malloc(2 * n * sizeof(float));
    void *dcos = NULL, *dsin = NULL;
    int rc =
        !inv || !cs ? fsdp_err(FSDP_ERR_NOMEM, "llama RoPE tables (%d x %zu)", m->lm.max_T, h2) : 0;
    if (rc == 0 && fsdp_cpu_rope_inv_freq(inv, m->hs, c->rope_theta, &sc) < 0) {
        rc = fsdp_err(FSDP_ERR_INVALID, "llama: RoPE frequencies for head size %d, theta %g",
                      m->hs, (double)c->rope_theta);
    }
    if (rc == 0) {
        fsdp_cpu_rope_table(cs, cs + n, inv, 0, m->lm.max_T, m->hs);
        rc = fsdp_device_alloc(m->lm.dev, n * sizeof(float), "llama RoPE cos", &dcos);
        rc = rc < 0 ? rc : fsdp_device_alloc(m->lm.dev, n * sizeof(float), "llama RoPE sin", &dsin);
    }
    m->rope_cos = dcos;
    m->rope_sin = dsin;
    if (rc == 0) {
        rc = fsdp_device_write(m->lm.dev, m->rope_cos, cs, n * sizeof(float));
        rc = rc < 0 ? rc : fsdp_device_write(m->lm.dev, m->rope_sin, cs + n, n * sizeof(float));
        rc = rc < 0 ? rc : m->lm.dev->ops->synchronize(m->lm.dev, m->lm.dev->stream);
    }
    free(inv);
    free(cs);
    return rc;
}

static int llama_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                        struct fsdp_tp *tp, struct fsdp_device *dev, enum fsdp_dtype adt,
                        struct fsdp_llama **out)
{
    int rc;
    FSDP_CHECK(fsdp_lm_check_arch(spec, &fsdp_llama_arch));
    const struct fsdp_llama_config *c = fsdp_llama_cfg(spec);
    struct fsdp_llama *m = calloc(1, sizeof(*m));
    if (!m) {
        return fsdp_err(FSDP_ERR_NOMEM, "llama model");
    }
    double per_tok = (double)c->vocab_size + (double)(c->n_layer + 2) *
                                                 (12.0 * c->n_embd + 3.0 * c->ffn_hidden);
    rc = fsdp_lm_init(&m->lm, spec, &fsdp_llama_arch, &fsdp_llama_ops, max_B, max_T, c->context,
                      per_tok, (size_t)c->n_embd, tp, dev);
    if (rc < 0) {
        free(m);
        return rc;
    }
    m->cfg = c;
    m->hs = c->n_embd / c->n_head;
    int n = m->lm.tpn;
    if (c->n_head % n != 0 || c->n_kv_head % n != 0 || c->ffn_hidden % n != 0) {
        fsdp_llama_destroy(m);
        return fsdp_err(FSDP_ERR_INVALID, "llama: n_head %d, n_kv_head %d and ffn_hidden %d must "
                        "each be divisible by tp %d", c->n_head, c->n_kv_head, c->ffn_hidden, n);
    }
    m->lnh = c->n_head / n;
    m->lnkv = c->n_kv_head / n;
    m->lq = (size_t)m->lnh * (size_t)m->hs;
    m->lf = (size_t)c->ffn_hidden / (size_t)n;
    m->qkv_w = (m->lnh + 2 * m->lnkv) * m->hs;
    m->head_chunk = fsdp_lm_head_default_rows(&m->lm, FSDP_LLAMA_HEAD_BYTES);
    m->bwd_next = -1;
    m->acts.blocks = calloc((size_t)c->n_layer, sizeof(*m->acts.blocks));
    m->acts.store = calloc((size_t)c->n_layer, sizeof(*m->acts.store));
    if (!m->acts.blocks || !m->acts.store) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "llama model tables");
        goto err_free;
    }
    if (adt != FSDP_F32 && adt != FSDP_BF16) {
        rc = fsdp_err(FSDP_ERR_INVALID,
                      "llama: activation dtype %s is not supported (use f32 or bf16)",
                      fsdp_dtype_name(adt));
        goto err_free;
    }
    m->lm.adt = adt;
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
    return llama_create(spec, max_B, max_T, NULL, NULL, FSDP_F32, out);
}

void fsdp_llama_destroy(struct fsdp_llama *m)
{
    if (!m) {
        return;
    }
    fsdp_lm_free(&m->lm);
    fsdp_lm_release(&m->lm, m->rope_cos);
    fsdp_lm_release(&m->lm, m->rope_sin);
    free(m->acts.blocks);
    free(m->acts.store);
    free(m);
}

int fsdp_llama_set_checkpoint(struct fsdp_llama *m, int l, int on)
{
    return fsdp_lm_set_checkpoint(&m->lm, l, on, m->bwd_next >= 0);
}

int fsdp_llama_set_head_chunk(struct fsdp_llama *m, int rows)
{
    FSDP_CHECK(fsdp_lm_check_head_chunk(rows, m->bwd_next >= 0));
    m->head_chunk = rows ? rows : fsdp_lm_head_default_rows(&m->lm, FSDP_LLAMA_HEAD_BYTES);
    fsdp_lm_relayout(&m->lm);
    return 0;
}

int fsdp_llama_set_unit(struct fsdp_llama *m, int u, void *params, enum fsdp_dtype pt, float *grads)
{
    return fsdp_lm_set_unit(&m->lm, u, params, pt, grads);
}

void fsdp_llama_set_ignore_index(struct fsdp_llama *m, int32_t ignore_index)
{
    m->lm.ignore_index = ignore_index;
}

void fsdp_llama_set_loss_seed(struct fsdp_llama *m, double divisor, float scale)
{
    fsdp_lm_set_loss_seed(&m->lm, divisor, scale);
}

int fsdp_llama_zero_grad(struct fsdp_llama *m, int u)
{
    return fsdp_lm_zero_grad(&m->lm, u, m->lm.spec->unit_numel[0]);
}

// ----------------------------------------------------------------------------
// forward

int fsdp_llama_set_batch(struct fsdp_model *base, const int32_t *tokens, const int32_t *targets,
                         int B, int T)
{
    struct fsdp_llama *m = fsdp_llama_of(base);
    FSDP_CHECK(fsdp_lm_check_batch_size(&m->lm, B, T));
    FSDP_CHECK(fsdp_lm_check_tokens(&m->lm, tokens, targets, B, T, 0));
    FSDP_CHECK(fsdp_llama_reserve(base));
    FSDP_CHECK(fsdp_lm_start_batch(&m->lm, tokens, targets, B, T));
    m->bwd_next = -1;
    return 0;
}

// ----------------------------------------------------------------------------
// the embedding and the blocks (tensor-parallel regions: model/lm.h)

/* x[r] = embed_tokens[tokens[r]]; with tensor parallelism vocabulary
 * parallel (sequence parallel: through dbtc to the rows held here) */
static int llama_embed_forward(struct fsdp_llama *m)
{
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)m->cfg->n_embd;
    struct fsdp_lm_mem p = fsdp_lm_params(&m->lm, 0);
    const void *wte = fsdp_lm_at(p, m->emb_off);
    float *x = fsdp_lm_residual(&m->lm, 0);
    if (m->lm.tp) {
        return fsdp_tp_embed_forward(m->lm.tp, x, m->lm.sp ? m->gacts.dbtc : x, m->lm.dtokens, wte,
                                     (size_t)m->cfg->vocab_size, NULL, p.pt, 0, BT, C);
    }
    m->lm.k->embed_gather(m->lm.dev, x, m->lm.dtokens, wte, p.pt, BT, C);
    return 0;
}

/* Block l from residual[l]; full = 0 stops before down_proj, which only
 * produces residual[l+1] (what a checkpointed backward does not need).
 * With tensor parallelism the heads and the MLP features are this rank's
 * (lnh query heads, lnkv key/value heads, lf features). */
static int llama_block_forward(struct fsdp_llama *m, int l, int full)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)c->n_embd, F = m->lf;
    size_t BR = fsdp_lm_rows_here(&m->lm, BT);
    struct fsdp_llama_block_view w;
    struct fsdp_llama_block_acts *a = &m->acts.blocks[l];
    const struct fsdp_llama_block_store *st = &m->acts.store[l];
    float *x = fsdp_lm_residual(&m->lm, l);
    const void *in;
    enum fsdp_dtype it, adt = m->lm.adt;
    fsdp_llama_block_view(m, fsdp_lm_params(&m->lm, 1 + l), &w);
    if (full && l + 1 == m->lm.stage_lo) { /* a pipeline stage's input, written into x */
        fsdp_lm_residual_save(&m->lm, l);
    }
    fsdp_lm_residual_load(&m->lm, l);
    /* Without tensor parallelism the norms' pass over the residual stream
     * also copies it to where the next row-parallel product accumulates
     * (beta = 1), so that product needs no prefill pass of its own. */
    float *keep1 = m->lm.tp ? NULL : a->res2;
    float *keep2 = m->lm.tp || !full ? NULL : fsdp_lm_residual(&m->lm, l + 1);
    /* attention: one product for q, k and v (and their biases), RoPE in place */
    m->lm.k->rmsnorm_forward(m->lm.dev, fsdp_lm_act(a->rms1, st->rms1), a->rms1_rstd, keep1, x,
                             m->lm.adt, FSDP_F32, w.attn_norm, w.pt, BR, C, c->norm_eps);
    FSDP_CHECK(fsdp_lm_tp_enter(&m->lm, a->rms1, st->rms1, BT, &in, &it));
    /* the product in f32 (RoPE works on it in place), then stored */
    m->lm.k->matmul_forward(m->lm.dev, a->qkv, FSDP_F32, in, it, w.qw, w.qb, w.pt, NULL, BT, C,
                            (size_t)m->qkv_w);
    m->lm.k->rope_forward(m->lm.dev, a->qkv, m->rope_cos, m->rope_sin, m->lm.B, m->lm.T, m->lnh,
                          m->lnkv, m->hs);
    fsdp_lm_act_store(&m->lm, st->qkv, a->qkv, BT * (size_t)m->qkv_w);
    m->lm.k->gqa_attention_forward(m->lm.dev, fsdp_lm_act(a->atty, st->atty), a->att_lse,
                                   m->acts.att_scratch, fsdp_lm_act(a->qkv, st->qkv), m->lm.adt,
                                   m->lm.B, m->lm.T, m->lnh, m->lnkv, m->hs);
    FSDP_CHECK(fsdp_lm_row_parallel(&m->lm, a->res2, st->res2, fsdp_lm_act(a->atty, st->atty), adt,
                                    w.ow, NULL, w.pt, keep1 ? a->res2 : x, NULL, BT, m->lq));
    /* MLP: gate and up as two products (as fast as one packed product, and
     * SwiGLU then runs over whole buffers rather than row by row) */
    m->lm.k->rmsnorm_forward(m->lm.dev, fsdp_lm_act(a->rms2, st->rms2), a->rms2_rstd, keep2,
                             fsdp_lm_act(a->res2, st->res2), m->lm.adt, m->lm.adt, w.mlp_norm, w.pt,
                             BR, C, c->norm_eps);
    FSDP_CHECK(fsdp_lm_tp_enter(&m->lm, a->rms2, st->rms2, BT, &in, &it));
    m->lm.k->matmul_forward(m->lm.dev, fsdp_lm_act(a->gate, st->gate), adt, in, it, w.gatew, NULL,
                            w.pt, NULL, BT, C, F);
    m->lm.k->matmul_forward(m->lm.dev, fsdp_lm_act(a->up, st->up), adt, in, it, w.upw, NULL, w.pt,
                            NULL, BT, C, F);
    m->lm.k->swiglu_forward(m->lm.dev, fsdp_lm_act(a->h, st->h), fsdp_lm_act(a->gate, st->gate),
                            fsdp_lm_act(a->up, st->up), adt, BT * F);
    if (full) {
        float *out = fsdp_lm_residual(&m->lm, l + 1);
        FSDP_CHECK(fsdp_lm_row_parallel(&m->lm, out, NULL, fsdp_lm_act(a->h, st->h), adt, w.downw,
                                        NULL, w.pt, keep2 ? out : a->res2, keep2 ? NULL : st->res2,
                                        BT, F));
        fsdp_lm_residual_save(&m->lm, l + 1);
    }
    return 0;
}

/* logits (rows, V) of rows [r0, r0 + rows): lnf rows @ lm_head^T; with
 * tensor parallelism (rows, tvn), this rank's vocabulary slice */
static void llama_head_logits(const struct fsdp_llama *m, const struct fsdp_llama_head_view *w,
                              size_t r0, size_t rows, float *out)
{
    size_t C = (size_t)m->cfg->n_embd;
    m->lm.k->matmul_forward(m->lm.dev, out, FSDP_F32, m->acts.lnf + r0 * C, FSDP_F32, w->lm_head,
                            NULL, w->pt, NULL, rows, C,
                            m->lm.tp ? m->lm.tvn : (size_t)m->cfg->vocab_size);
}

/* Tensor parallel: each row's loss over this rank's vocabulary slice, a
 * row chunk at a time, then the parallel cross-entropy's combination over
 * the ranks; *kept counts the rows not ignored. */
static int llama_head_loss_tp(struct fsdp_llama *m, const struct fsdp_llama_head_view *w, size_t BT,
                              size_t *kept)
{
    struct fsdp_llama_acts *a = &m->acts;
    size_t chunk = fsdp_llama_head_rows(m);
    for (size_t r0 = 0; r0 < BT; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk;
        if (m->lm.tvn == 0) { /* a slice of padding only */
            m->lm.k->fill(m->lm.dev, a->ce_stats + 2 * r0, rows, 2, -INFINITY);
            m->lm.k->fill(m->lm.dev, a->ce_stats + 2 * r0 + 1, rows, 2, 0.0f);
            m->lm.k->fill(m->lm.dev, a->zt + r0, rows, 1, 0.0f);
            continue;
        }
        llama_head_logits(m, w, r0, rows, a->head_logits);
        m->lm.k->crossentropy_slice_forward(m->lm.dev, a->ce_stats + 2 * r0, a->zt + r0,
                                            a->head_logits, m->lm.dtargets + r0, rows, m->lm.tvn,
                                            m->lm.tv0, m->lm.ignore_index, 1);
    }
    FSDP_CHECK(fsdp_tp_xent_combine(m->lm.tp, a->ce_stats, a->zt, a->xent, BT));
    m->lm.k->xent_losses(m->lm.dev, a->losses, a->ce_stats, a->zt, m->lm.dtargets, BT,
                         m->lm.ignore_index);
    *kept = fsdp_lm_count_kept(&m->lm, 0, BT);
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
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t chunk = fsdp_llama_head_rows(m);
    struct fsdp_llama_acts *a = &m->acts;
    struct fsdp_llama_head_view w;
    float *mine = fsdp_lm_lnf_mine(&m->lm, a->lnf, BT);
    fsdp_llama_head_view(m, fsdp_lm_params(&m->lm, c->n_layer + 1), fsdp_lm_params(&m->lm, 0), &w);
    /* sequence parallel: this rank's rows, then every rank's gathered for the head */
    m->lm.k->rmsnorm_forward(m->lm.dev, mine, a->lnf_rstd, NULL,
                             fsdp_lm_residual(&m->lm, c->n_layer), FSDP_F32, FSDP_F32, w.norm, w.pt,
                             fsdp_lm_rows_here(&m->lm, BT), C, c->norm_eps);
    FSDP_CHECK(fsdp_lm_lnf_gather(&m->lm, mine, a->lnf, BT));
    m->bwd_next = -1;
    if (!m->lm.targets) {
        return 0;
    }
    size_t kept = 0;
    if (m->lm.tp) {
        FSDP_CHECK(llama_head_loss_tp(m, &w, BT, &kept));
    }
    for (size_t r0 = 0; r0 < BT && !m->lm.tp; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk;
        llama_head_logits(m, &w, r0, rows, a->head_logits);
        m->lm.k->crossentropy_forward(m->lm.dev, a->losses + r0, a->ce_stats + 2 * r0,
                                      a->head_logits, m->lm.dtargets + r0, rows, V,
                                      m->lm.ignore_index);
    }
    if (!m->lm.tp) {
        kept = fsdp_lm_count_kept(&m->lm, 0, BT);
    }
    m->n_kept = kept;
    fsdp_lm_set_loss(&m->lm, a->losses, BT, kept);
    m->bwd_next = m->lm.spec->n_units - 1;
    return 0;
}

int fsdp_llama_logits(struct fsdp_model *base, size_t row0, size_t rows, float *out)
{
    struct fsdp_llama *m = fsdp_llama_of(base);
    int last = m->lm.spec->n_units - 1;
    FSDP_CHECK(fsdp_lm_check_logits(&m->lm, row0, rows, m->cfg->tied));
    struct fsdp_llama_head_view w;
    fsdp_llama_head_view(m, fsdp_lm_params(&m->lm, last), fsdp_lm_params(&m->lm, 0), &w);
    if (rows > 0) {
        llama_head_logits(m, &w, row0, rows, out);
    }
    return 0;
}

int fsdp_llama_forward_unit(struct fsdp_model *base, int u)
{
    struct fsdp_llama *m = fsdp_llama_of(base);
    int L = m->cfg->n_layer;
    FSDP_CHECK(fsdp_lm_check_forward(&m->lm, u, m->cfg->tied));
    if (u == 0) {
        FSDP_CHECK(llama_embed_forward(m));
        fsdp_lm_residual_save(&m->lm, 0);
    } else if (u <= L) {
        FSDP_CHECK(llama_block_forward(m, u - 1, 1));
    } else {
        fsdp_lm_residual_load(&m->lm, L);
        FSDP_CHECK(llama_head_forward(m));
    }
    m->lm.fwd_done[u] = 1;
    if (u == m->lm.stage_hi && u <= L) { /* a pipeline stage's last block: its backward starts
                                            from the output gradient written into dres */
        m->bwd_next = m->lm.targets ? u : -1;
    }
    return 0;
}

int fsdp_llama_forward(struct fsdp_llama *m, const int32_t *tokens, const int32_t *targets, int B,
                       int T, float *loss)
{
    return fsdp_lm_forward(&m->lm.base, tokens, targets, B, T, loss);
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
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t chunk = fsdp_llama_head_rows(m);
    struct fsdp_llama_acts *a = &m->acts;
    struct fsdp_llama_grad_acts *g = &m->gacts;
    struct fsdp_llama_head_view w, dw;
    int last = c->n_layer + 1;
    fsdp_llama_head_view(m, fsdp_lm_params(&m->lm, last), fsdp_lm_params(&m->lm, 0), &w);
    fsdp_llama_head_view(m, fsdp_lm_grads(&m->lm, last), fsdp_lm_grads(&m->lm, 0), &dw);
    float alpha = fsdp_lm_seed_alpha(&m->lm, m->n_kept);
    size_t cols = m->lm.tp ? m->lm.tvn : V; /* tensor parallel: this rank's vocabulary slice */
    for (size_t r0 = 0; r0 < BT; r0 += chunk) {
        size_t rows = BT - r0 < chunk ? BT - r0 : chunk;
        if (fsdp_lm_count_kept(&m->lm, r0, rows) == 0 || cols == 0) {
            FSDP_CHECK(fsdp_device_zero(m->lm.dev, g->dbtc + r0 * C, rows * C * sizeof(float)));
            continue;
        }
        if (chunk < BT) {
            llama_head_logits(m, &w, r0, rows, a->head_logits);
        }
        if (m->lm.tp) {
            m->lm.k->crossentropy_slice_backward(m->lm.dev, a->head_logits, a->head_logits,
                                                 a->ce_stats + 2 * r0, m->lm.dtargets + r0, rows,
                                                 cols, m->lm.tv0, m->lm.ignore_index, 1.0f);
        } else {
            m->lm.k->crossentropy_backward(m->lm.dev, a->head_logits, a->head_logits,
                                           a->ce_stats + 2 * r0, m->lm.dtargets + r0, rows, V,
                                           m->lm.ignore_index, 1.0f);
        }
        m->lm.k->matmul_backward(m->lm.dev, g->dbtc + r0 * C, dw.lm_head, NULL, a->head_logits,
                                 a->lnf + r0 * C, FSDP_F32, w.lm_head, w.pt, rows, C, cols, alpha,
                                 0);
    }
    /* tensor parallel: each rank's d(norm output) is its vocabulary slice's
     * part, summed over the ranks into the rows held here */
    size_t BR = fsdp_lm_rows_here(&m->lm, BT);
    const float *dlnf = g->dbtc;
    if (m->lm.tp) {
        FSDP_CHECK(fsdp_lm_tp_din(&m->lm, BT, &dlnf));
    }
    FSDP_CHECK(fsdp_device_zero(m->lm.dev, g->dres, BR * C * sizeof(float)));
    if (m->lm.sp) {
        FSDP_CHECK(fsdp_device_zero(m->lm.dev, g->spg, C * sizeof(float)));
    }
    m->lm.k->rmsnorm_backward(m->lm.dev, g->dres, m->lm.sp ? g->spg : dw.norm, dlnf,
                              fsdp_lm_residual(&m->lm, c->n_layer), FSDP_F32, w.norm, w.pt,
                              a->lnf_rstd, BR, C);
    if (m->lm.sp) {
        float *const dst[1] = {dw.norm};
        FSDP_CHECK(fsdp_lm_sp_norm_grads(&m->lm, dst, 1));
    }
    return 0;
}

/* dres holds d(block output) on entry and d(block input) on return. With
 * tensor parallelism each rank's d(norm output) is its heads' and
 * features' part, summed over the ranks (copy-in's backward) before the
 * norms' backward. */
static int llama_block_backward(struct fsdp_llama *m, int l)
{
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)m->cfg->n_embd, F = m->lf;
    size_t BR = fsdp_lm_rows_here(&m->lm, BT);
    struct fsdp_llama_grad_acts *g = &m->gacts;
    struct fsdp_llama_block_acts *a = &m->acts.blocks[l];
    const struct fsdp_llama_block_store *st = &m->acts.store[l];
    struct fsdp_llama_block_view w, dw;
    const float *dout, *din;
    const void *in;
    enum fsdp_dtype it, adt = m->lm.adt;
    /* sequence parallel: the norms' weight gradients of this rank's rows go
     * through spg, and the gathered dres occupies dbtc, so d(attention
     * output) goes to xfull */
    float *spg = g->spg, *datty = m->lm.sp ? g->xfull : g->dbtc;
    if (m->lm.checkpoint[l]) {
        FSDP_CHECK(llama_block_forward(m, l, 0));
    } else { /* the products read the stores; RMSNorm 1's backward reads x in f32 */
        fsdp_lm_residual_load(&m->lm, l);
    }
    fsdp_llama_block_view(m, fsdp_lm_params(&m->lm, 1 + l), &w);
    fsdp_llama_block_view(m, fsdp_lm_grads(&m->lm, 1 + l), &dw);
    if (m->lm.sp) {
        FSDP_CHECK(fsdp_device_zero(m->lm.dev, spg, 2 * C * sizeof(float)));
    }
    /* MLP */
    FSDP_CHECK(fsdp_lm_tp_dout(&m->lm, BT, &dout));
    m->lm.k->matmul_backward(m->lm.dev, g->dh, dw.downw, NULL, dout, fsdp_lm_act(a->h, st->h), adt,
                             w.downw, w.pt, BT, F, C, 1.0f, 0);
    /* d(gate), d(up) over the f32 gate and up (at f32 in place; at bf16
     * their working set, read from the store) */
    m->lm.k->swiglu_backward(m->lm.dev, a->gate, a->up, g->dh, fsdp_lm_act(a->gate, st->gate),
                             fsdp_lm_act(a->up, st->up), m->lm.adt, BT * F);
    FSDP_CHECK(fsdp_lm_tp_enter(&m->lm, a->rms2, st->rms2, BT, &in, &it));
    m->lm.k->matmul_backward(m->lm.dev, g->dbtc, dw.gatew, NULL, a->gate, in, it, w.gatew, w.pt, BT,
                             C, F, 1.0f, 0);
    m->lm.k->matmul_backward(m->lm.dev, g->dbtc, dw.upw, NULL, a->up, in, it, w.upw, w.pt, BT, C, F,
                             1.0f, 1);
    FSDP_CHECK(fsdp_lm_tp_din(&m->lm, BT, &din));
    m->lm.k->rmsnorm_backward(m->lm.dev, g->dres, m->lm.sp ? spg : dw.mlp_norm, din,
                              fsdp_lm_act(a->res2, st->res2), m->lm.adt, w.mlp_norm, w.pt,
                              a->rms2_rstd, BR, C);
    /* attention */
    FSDP_CHECK(fsdp_lm_tp_dout(&m->lm, BT, &dout));
    m->lm.k->matmul_backward(m->lm.dev, datty, dw.ow, NULL, dout, fsdp_lm_act(a->atty, st->atty),
                             adt, w.ow, w.pt, BT, m->lq, C, 1.0f, 0);
    m->lm.k->gqa_attention_backward(m->lm.dev, g->dqkv, m->acts.att_scratch, datty,
                                    fsdp_lm_act(a->qkv, st->qkv), fsdp_lm_act(a->atty, st->atty),
                                    a->att_lse, m->lm.adt, m->lm.B, m->lm.T, m->lnh, m->lnkv,
                                    m->hs);
    m->lm.k->rope_backward(m->lm.dev, g->dqkv, m->rope_cos, m->rope_sin, m->lm.B, m->lm.T, m->lnh,
                           m->lnkv, m->hs);
    FSDP_CHECK(fsdp_lm_tp_enter(&m->lm, a->rms1, st->rms1, BT, &in, &it));
    m->lm.k->matmul_backward(m->lm.dev, g->dbtc, dw.qw, dw.qb, g->dqkv, in, it, w.qw, w.pt, BT, C,
                             (size_t)m->qkv_w, 1.0f, 0);
    FSDP_CHECK(fsdp_lm_tp_din(&m->lm, BT, &din));
    m->lm.k->rmsnorm_backward(m->lm.dev, g->dres, m->lm.sp ? spg + C : dw.attn_norm, din,
                              fsdp_lm_residual(&m->lm, l), FSDP_F32, w.attn_norm, w.pt,
                              a->rms1_rstd, BR, C);
    if (m->lm.sp) {
        float *const dst[2] = {dw.mlp_norm, dw.attn_norm};
        FSDP_CHECK(fsdp_lm_sp_norm_grads(&m->lm, dst, 2));
    }
    return 0;
}

/* d embed_tokens[tokens[r]] += d x[r], rows in order (sequence parallel:
 * every rank's rows gathered first, so every rank's table gradient is whole) */
static int llama_embed_backward(struct fsdp_llama *m)
{
    size_t BT = (size_t)m->lm.B * (size_t)m->lm.T, C = (size_t)m->cfg->n_embd;
    float *dwte = m->lm.unit_grads[0] + m->emb_off;
    const float *dx;
    FSDP_CHECK(fsdp_lm_tp_dout(&m->lm, BT, &dx));
    if (m->lm.tp) { /* vocabulary parallel: the rows of the ids this rank holds */
        fsdp_tp_embed_backward(m->lm.tp, dwte, NULL, dx, m->lm.dtokens, (size_t)m->cfg->vocab_size,
                               0, BT, C);
        return 0;
    }
    m->lm.k->embed_scatter_add(m->lm.dev, dwte, dx, m->lm.dtokens, BT, C);
    return 0;
}

int fsdp_llama_backward_unit(struct fsdp_model *base, int u)
{
    struct fsdp_llama *m = fsdp_llama_of(base);
    int L = m->cfg->n_layer;
    FSDP_CHECK(fsdp_lm_check_backward(&m->lm, u, m->bwd_next, m->cfg->tied));
    if (u == 0) {
        FSDP_CHECK(llama_embed_backward(m));
    } else if (u <= L) {
        FSDP_CHECK(llama_block_backward(m, u - 1));
    } else {
        fsdp_lm_residual_load(&m->lm, L);
        FSDP_CHECK(llama_head_backward(m));
    }
    m->bwd_next = u - 1;
    return 0;
}

int fsdp_llama_backward(struct fsdp_llama *m)
{
    return fsdp_model_backward(&m->lm.base);
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
    return fsdp_lm_flops(N, L, C, T);
}

// ----------------------------------------------------------------------------
// the generic interface (model.h)

static int llama_op_create(const struct fsdp_model_spec *spec, const struct fsdp_model_opts *o,
                           struct fsdp_model **out)
{
    struct fsdp_llama *m = NULL;
    FSDP_CHECK(llama_create(spec, o->max_B, o->max_T, o->tp, o->dev, o->act_dtype, &m));
    if (o->head_chunk > 0) {
        int rc = fsdp_llama_set_head_chunk(m, o->head_chunk);
        if (rc < 0) {
            fsdp_llama_destroy(m);
            return rc;
        }
    }
    *out = &m->lm.base;
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
    FSDP_CHECK(fsdp_lm_tp_check_heads(c->n_head, tp));
    if (c->n_kv_head % tp != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "n_kv_head %d is not divisible by tp %d: key/value "
                        "heads are split across tp (grouped-query attention keeps %d query heads "
                        "per key/value head)", c->n_kv_head, tp, c->n_head / c->n_kv_head);
    }
    if (c->ffn_hidden % tp != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "ffn_hidden %d is not divisible by tp %d: the MLP is "
                        "split by features", c->ffn_hidden, tp);
    }
    fsdp_tp_cut_of_place(p->tp, 1, out);
    return 0;
}

static void llama_op_destroy(struct fsdp_model *m)
{
    fsdp_llama_destroy(fsdp_llama_of(m));
}

/* Units are blocks from 1 to L; -1: every block. The embedding and the
 * head keep their activations (they are small next to a block's). */
static int llama_op_set_checkpoint(struct fsdp_model *m, int u, int on)
{
    struct fsdp_llama *g = fsdp_llama_of(m);
    if (u < 0) {
        return fsdp_llama_set_checkpoint(g, -1, on);
    }
    if (u < 1 || u > g->cfg->n_layer) {
        return 0;
    }
    return fsdp_llama_set_checkpoint(g, u - 1, on);
}

const struct fsdp_model_ops fsdp_llama_ops = {
    .size = sizeof(struct fsdp_model_ops),
    .name = FSDP_MODEL_ARCH_LLAMA,
    .create = llama_op_create,
    .destroy = llama_op_destroy,
    .set_checkpoint = llama_op_set_checkpoint,
    .reserve = fsdp_llama_reserve,
    .set_unit = fsdp_lm_op_set_unit,
    .set_loss_seed = fsdp_lm_op_set_loss_seed,
    .set_batch = fsdp_llama_set_batch,
    .forward_unit = fsdp_llama_forward_unit,
    .backward_unit = fsdp_llama_backward_unit,
    .loss = fsdp_lm_op_loss,
    .logits = fsdp_llama_logits,
    .activation_bytes = fsdp_llama_activation_bytes,
    .workspace_bytes = fsdp_llama_workspace_bytes,
    .flops_per_token = fsdp_llama_flops_per_token,
    .decoder_create = fsdp_llama_decoder_create,
    .tp_cut = llama_op_tp_cut,
    .set_stage = fsdp_lm_op_set_stage,
    .stage_buffers = fsdp_lm_op_stage_buffers,
    .share_workspace = fsdp_lm_op_share_workspace,
};
