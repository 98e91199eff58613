/*
 * gpt2_decode.c - GPT-2 incremental decoding (model.h, struct fsdp_decoder):
 * each step runs one position through every block with the keys and values
 * of the earlier positions taken from a cache, so generating N tokens costs
 * N single-row passes instead of N passes over the whole window. The
 * arithmetic is the forward's (the same kernels on one row), so the logits
 * equal those of a full forward over the same prefix.
 */
#include "config.h"
#include "model/gpt2.h"
#include "compute/kernels.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

struct gpt2_decoder {
    struct fsdp_decoder base;
    struct fsdp_gpt2 *m;
    float *kv;     /* (L, 2, max_T, C): each layer's keys, then its values */
    float *x;      /* (C) the residual stream */
    float *ln;     /* (C) */
    float *qkv;    /* (3C) */
    float *att;    /* (C) */
    float *fch;    /* (4C) */
    float *scores; /* (max_T) */
    float mean, rstd;
};

static int gpt2_decode_step(struct fsdp_decoder *d, int32_t token, float *logits)
{
    struct gpt2_decoder *g = (struct gpt2_decoder *)d;
    struct fsdp_gpt2 *m = g->m;
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, T = (size_t)d->max_T;
    int L = c->n_layer, pos = d->pos;
    if (pos >= d->max_T) {
        return fsdp_err(FSDP_ERR_INVALID, "gpt2 decoder: position %d is past its cache of %d",
                        pos, d->max_T);
    }
    if (token < 0 || (size_t)token >= V) {
        return fsdp_err(FSDP_ERR_INVALID, "gpt2 decoder: token %d is not below vocab_size %zu",
                        (int)token, V);
    }
    for (int u = 0; u < L + 2; u++) {
        if (!m->unit_params[u]) {
            return fsdp_err(FSDP_ERR_INVALID, "gpt2 decoder: unit %d has no parameters set", u);
        }
    }
    struct fsdp_gpt2_embed_view e;
    fsdp_gpt2_embed_view(m, m->unit_params[0], &e);
    for (size_t i = 0; i < C; i++) {
        g->x[i] = e.wte[(size_t)token * C + i] + e.wpe[(size_t)pos * C + i];
    }
    for (int l = 0; l < L; l++) {
        struct fsdp_gpt2_block_view w;
        fsdp_gpt2_block_view(m, m->unit_params[1 + l], &w);
        float *kc = g->kv + (size_t)l * 2 * T * C, *vc = kc + T * C;
        fsdp_cpu_layernorm_forward(g->ln, &g->mean, &g->rstd, g->x, w.ln1w, w.ln1b, 1, C,
                                   c->ln_eps);
        fsdp_cpu_matmul_forward(g->qkv, g->ln, w.qkvw, w.qkvb, NULL, 1, C, 3 * C);
        memcpy(kc + (size_t)pos * C, g->qkv + C, C * sizeof(float));
        memcpy(vc + (size_t)pos * C, g->qkv + 2 * C, C * sizeof(float));
        fsdp_cpu_attention_decode(g->att, g->scores, g->qkv, kc, vc, pos + 1, c->n_head,
                                  c->n_head, (int)(C / (size_t)c->n_head), (int)C);
        fsdp_cpu_matmul_forward(g->x, g->att, w.attprojw, w.attprojb, g->x, 1, C, C);
        fsdp_cpu_layernorm_forward(g->ln, &g->mean, &g->rstd, g->x, w.ln2w, w.ln2b, 1, C,
                                   c->ln_eps);
        fsdp_cpu_matmul_forward(g->fch, g->ln, w.fcw, w.fcb, NULL, 1, C, 4 * C);
        fsdp_cpu_gelu_forward(g->fch, g->fch, 4 * C);
        fsdp_cpu_matmul_forward(g->x, g->fch, w.fcprojw, w.fcprojb, g->x, 1, 4 * C, C);
    }
    struct fsdp_gpt2_head_view h;
    fsdp_gpt2_head_view(m, m->unit_params[L + 1], m->unit_params[0], &h);
    fsdp_cpu_layernorm_forward(g->ln, &g->mean, &g->rstd, g->x, h.lnfw, h.lnfb, 1, C, c->ln_eps);
    fsdp_cpu_matmul_forward(logits, g->ln, h.lm_head, NULL, NULL, 1, C, V);
    d->pos++;
    return 0;
}

static void gpt2_decode_destroy(struct fsdp_decoder *d)
{
    struct gpt2_decoder *g = (struct gpt2_decoder *)d;
    if (!g) {
        return;
    }
    free(g->kv);
    free(g->x);
    free(g);
}

static const struct fsdp_decoder_ops gpt2_decoder_ops = {
    .step = gpt2_decode_step,
    .destroy = gpt2_decode_destroy,
};

int fsdp_gpt2_decoder_create(struct fsdp_model *model, int max_T, struct fsdp_decoder **out)
{
    struct fsdp_gpt2 *m = (struct fsdp_gpt2 *)model;
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t C = (size_t)c->n_embd;
    if (max_T < 1 || max_T > c->context) {
        return fsdp_err(FSDP_ERR_INVALID, "gpt2 decoder: %d positions (the context is %d)", max_T,
                        c->context);
    }
    if (m->rows_on) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "gpt2 decoder: unit 0 is split by rows");
    }
    struct gpt2_decoder *g = calloc(1, sizeof(*g));
    if (!g) {
        return fsdp_err(FSDP_ERR_NOMEM, "gpt2 decoder: out of memory");
    }
    size_t T = (size_t)max_T;
    g->kv = malloc((size_t)c->n_layer * 2 * T * C * sizeof(float));
    g->x = malloc((C + C + 3 * C + C + 4 * C + T) * sizeof(float));
    if (!g->kv || !g->x) {
        gpt2_decode_destroy(&g->base);
        return fsdp_err(FSDP_ERR_NOMEM, "gpt2 decoder: a cache of %d positions (%zu MiB)", max_T,
                        ((size_t)c->n_layer * 2 * T * C * sizeof(float)) >> 20);
    }
    g->ln = g->x + C;
    g->qkv = g->ln + C;
    g->att = g->qkv + 3 * C;
    g->fch = g->att + C;
    g->scores = g->fch + 4 * C;
    g->m = m;
    g->base.ops = &gpt2_decoder_ops;
    g->base.max_T = max_T;
    *out = &g->base;
    return 0;
}
