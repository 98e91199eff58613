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
#include "compute/device.h"
#include "core/error.h"
#include "model/lm.h"

#include <stdlib.h>
#include <string.h>

struct gpt2_decoder {
    struct fsdp_lm_decoder c; /* kv: (L, 2, max_T, C); x: (C) the residual stream */
    struct fsdp_gpt2 *m;
    float *ln;     /* (C) */
    float *qkv;    /* (3C) */
    float *att;    /* (C) */
    float *fch;    /* (4C) */
    float *scores; /* (max_T) */
    float *stats;  /* (2) the norm's mean and rstd */
};

static int gpt2_decode_step(struct fsdp_decoder *d, int32_t token, float *logits)
{
    struct gpt2_decoder *g = (struct gpt2_decoder *)d;
    struct fsdp_gpt2 *m = g->m;
    const struct fsdp_gpt2_config *c = m->cfg;
    const struct fsdp_kernels *k = m->lm.k;
    struct fsdp_device *dev = m->lm.dev;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, T = (size_t)d->max_T;
    int L = c->n_layer, pos = d->pos;
    float *x = g->c.x, *mean = g->stats, *rstd = g->stats + 1;
    FSDP_CHECK(fsdp_lm_decode_begin(&m->lm, &g->c, token));
    struct fsdp_gpt2_embed_view e;
    fsdp_gpt2_embed_view(m, fsdp_lm_params(&m->lm, 0), &e);
    k->encoder_forward(dev, x, g->c.token, e.wte,
                       fsdp_lm_at((struct fsdp_lm_mem){e.wpe, e.pt}, (size_t)pos * C), e.pt, 1, 1,
                       (int)C);
    for (int l = 0; l < L; l++) {
        struct fsdp_gpt2_block_view w;
        fsdp_gpt2_block_view(m, fsdp_lm_params(&m->lm, 1 + l), &w);
        float *kc = g->c.kv + (size_t)l * 2 * T * C, *vc = kc + T * C;
        k->layernorm_forward(dev, g->ln, mean, rstd, x, FSDP_F32, FSDP_F32, w.ln1w, w.ln1b, w.pt, 1,
                             C, c->ln_eps);
        k->matmul_forward(dev, g->qkv, FSDP_F32, g->ln, FSDP_F32, w.qkvw, w.qkvb, w.pt, NULL, 1, C,
                          3 * C);
        FSDP_CHECK(fsdp_device_copy(dev, kc + (size_t)pos * C, g->qkv + C, C * sizeof(float)));
        FSDP_CHECK(fsdp_device_copy(dev, vc + (size_t)pos * C, g->qkv + 2 * C, C * sizeof(float)));
        k->attention_decode(dev, g->att, g->scores, g->qkv, kc, vc, pos + 1, c->n_head, c->n_head,
                            (int)(C / (size_t)c->n_head), (int)C);
        k->matmul_forward(dev, x, FSDP_F32, g->att, FSDP_F32, w.attprojw, w.attprojb, w.pt, x, 1, C,
                          C);
        k->layernorm_forward(dev, g->ln, mean, rstd, x, FSDP_F32, FSDP_F32, w.ln2w, w.ln2b, w.pt, 1,
                             C, c->ln_eps);
        k->matmul_forward(dev, g->fch, FSDP_F32, g->ln, FSDP_F32, w.fcw, w.fcb, w.pt, NULL, 1, C,
                          4 * C);
        k->gelu_forward(dev, g->fch, g->fch, FSDP_F32, 4 * C);
        k->matmul_forward(dev, x, FSDP_F32, g->fch, FSDP_F32, w.fcprojw, w.fcprojb, w.pt, x, 1,
                          4 * C, C);
    }
    struct fsdp_gpt2_head_view h;
    fsdp_gpt2_head_view(m, fsdp_lm_params(&m->lm, L + 1), fsdp_lm_params(&m->lm, 0), &h);
    k->layernorm_forward(dev, g->ln, mean, rstd, x, FSDP_F32, FSDP_F32, h.lnfw, h.lnfb, h.pt, 1, C,
                         c->ln_eps);
    k->matmul_forward(dev, g->c.logits, FSDP_F32, g->ln, FSDP_F32, h.lm_head, NULL, h.pt, NULL, 1,
                      C, V);
    return fsdp_lm_decode_end(&m->lm, &g->c, logits);
}

static const struct fsdp_decoder_ops gpt2_decoder_ops = {
    .step = gpt2_decode_step,
    .destroy = fsdp_lm_decoder_free,
};

int fsdp_gpt2_decoder_create(struct fsdp_model *model, int max_T, struct fsdp_decoder **out)
{
    struct fsdp_gpt2 *m = (struct fsdp_gpt2 *)model;
    const struct fsdp_gpt2_config *c = m->cfg;
    size_t C = (size_t)c->n_embd, T = (size_t)max_T;
    struct fsdp_lm_decoder *d;
    if (m->rows_on) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "gpt2 decoder: unit 0 is split by rows");
    }
    FSDP_CHECK(fsdp_lm_decoder_alloc(&m->lm, max_T, c->context, C,
                                     C + C + 3 * C + C + 4 * C + T + 2, sizeof(struct gpt2_decoder),
                                     &gpt2_decoder_ops, &d));
    struct gpt2_decoder *g = (struct gpt2_decoder *)d;
    g->ln = d->x + C;
    g->qkv = g->ln + C;
    g->att = g->qkv + 3 * C;
    g->fch = g->att + C;
    g->scores = g->fch + 4 * C;
    g->stats = g->scores + T;
    g->m = m;
    *out = &d->base;
    return 0;
}
