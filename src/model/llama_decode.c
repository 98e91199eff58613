/*
 * llama_decode.c - incremental decoding of the Llama family (model.h,
 * struct fsdp_decoder): one position per step through every block, keys
 * (after RoPE) and values of the earlier positions from a cache of NKV heads
 * per layer (grouped-query: never repeated per query head). The same kernels
 * as the forward on one row, with the RoPE angles of the step's position
 * from the same frequencies, so the logits equal a full forward's.
 */
#include "config.h"
#include "model/llama.h"
#include "compute/device.h"
#include "compute/kernels.h"
#include "core/error.h"
#include "model/lm.h"

#include <stdlib.h>
#include <string.h>

struct llama_decoder {
    struct fsdp_lm_decoder c; /* kv: (L, 2, max_T, KV); x: (C) the residual stream */
    struct fsdp_llama *m;
    float *r;        /* (C) normalised */
    float *qkv;      /* (QKV) */
    float *att;      /* (C) */
    float *gate;     /* (F) */
    float *up;       /* (F) */
    float *scores;   /* (max_T) */
    float *cs, *sn;  /* (hs / 2) this position's cos and sin (device) */
    float *rstd;     /* (1) */
    float *inv_freq; /* (hs / 2) host */
    float *hcs;      /* (hs) host: this position's cos, then sin */
};

static int llama_decode_step(struct fsdp_decoder *d, int32_t token, float *logits)
{
    struct llama_decoder *g = (struct llama_decoder *)d;
    struct fsdp_llama *m = g->m;
    const struct fsdp_llama_config *c = m->cfg;
    const struct fsdp_kernels *k = m->lm.k;
    struct fsdp_device *dev = m->lm.dev;
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, F = (size_t)c->ffn_hidden;
    size_t T = (size_t)d->max_T, hs = (size_t)m->hs, KV = (size_t)c->n_kv_head * hs;
    size_t QKV = (size_t)m->qkv_w;
    int L = c->n_layer, pos = d->pos;
    float *x = g->c.x;
    FSDP_CHECK(fsdp_lm_decode_begin(&m->lm, &g->c, token));
    struct fsdp_lm_mem u0 = fsdp_lm_params(&m->lm, 0);
    k->embed_gather(dev, x, g->c.token, fsdp_lm_at(u0, m->emb_off), u0.pt, 1, C);
    /* this position's angles, on the host from the same frequencies as the forward's tables */
    fsdp_cpu_rope_table(g->hcs, g->hcs + hs / 2, g->inv_freq, pos, 1, (int)hs);
    FSDP_CHECK(fsdp_device_write(dev, g->cs, g->hcs, hs * sizeof(float)));
    for (int l = 0; l < L; l++) {
        struct fsdp_llama_block_view w;
        fsdp_llama_block_view(m, fsdp_lm_params(&m->lm, 1 + l), &w);
        float *kc = g->c.kv + (size_t)l * 2 * T * KV, *vc = kc + T * KV;
        k->rmsnorm_forward(dev, g->r, g->rstd, NULL, x, FSDP_F32, FSDP_F32, w.attn_norm, w.pt, 1, C,
                           c->norm_eps);
        /* q, k, v (and their biases) are consecutive: one product */
        k->matmul_forward(dev, g->qkv, FSDP_F32, g->r, FSDP_F32, w.qw, w.qb, w.pt, NULL, 1, C, QKV);
        k->rope_forward(dev, g->qkv, g->cs, g->sn, 1, 1, c->n_head, c->n_kv_head, (int)hs);
        FSDP_CHECK(fsdp_device_copy(dev, kc + (size_t)pos * KV, g->qkv + C, KV * sizeof(float)));
        FSDP_CHECK(
            fsdp_device_copy(dev, vc + (size_t)pos * KV, g->qkv + C + KV, KV * sizeof(float)));
        k->attention_decode(dev, g->att, g->scores, g->qkv, kc, vc, pos + 1, c->n_head,
                            c->n_kv_head, (int)hs, (int)KV);
        k->matmul_forward(dev, x, FSDP_F32, g->att, FSDP_F32, w.ow, NULL, w.pt, x, 1, C, C);
        k->rmsnorm_forward(dev, g->r, g->rstd, NULL, x, FSDP_F32, FSDP_F32, w.mlp_norm, w.pt, 1, C,
                           c->norm_eps);
        k->matmul_forward(dev, g->gate, FSDP_F32, g->r, FSDP_F32, w.gatew, NULL, w.pt, NULL, 1, C,
                          F);
        k->matmul_forward(dev, g->up, FSDP_F32, g->r, FSDP_F32, w.upw, NULL, w.pt, NULL, 1, C, F);
        k->swiglu_forward(dev, g->gate, g->gate, g->up, FSDP_F32, F);
        k->matmul_forward(dev, x, FSDP_F32, g->gate, FSDP_F32, w.downw, NULL, w.pt, x, 1, F, C);
    }
    struct fsdp_llama_head_view h;
    fsdp_llama_head_view(m, fsdp_lm_params(&m->lm, L + 1), fsdp_lm_params(&m->lm, 0), &h);
    k->rmsnorm_forward(dev, g->r, g->rstd, NULL, x, FSDP_F32, FSDP_F32, h.norm, h.pt, 1, C,
                       c->norm_eps);
    k->matmul_forward(dev, g->c.logits, FSDP_F32, g->r, FSDP_F32, h.lm_head, NULL, h.pt, NULL, 1, C,
                      V);
    return fsdp_lm_decode_end(&m->lm, &g->c, logits);
}

static void llama_decoder_free(struct fsdp_decoder *d)
{
    struct llama_decoder *g = (struct llama_decoder *)d;
    if (g) {
        free(g->inv_freq);
    }
    fsdp_lm_decoder_free(d);
}

static const struct fsdp_decoder_ops llama_decoder_ops = {
    .step = llama_decode_step,
    .destroy = llama_decoder_free,
};

int fsdp_llama_decoder_create(struct fsdp_model *model, int max_T, struct fsdp_decoder **out)
{
    struct fsdp_llama *m = (struct fsdp_llama *)model;
    const struct fsdp_llama_config *c = m->cfg;
    size_t C = (size_t)c->n_embd, F = (size_t)c->ffn_hidden, hs = (size_t)m->hs;
    size_t KV = (size_t)c->n_kv_head * hs, T = (size_t)max_T;
    struct fsdp_lm_decoder *d;
    FSDP_CHECK(fsdp_lm_decoder_alloc(&m->lm, max_T, c->context, KV,
                                     C + C + (size_t)m->qkv_w + C + 2 * F + T + hs + 1,
                                     sizeof(struct llama_decoder), &llama_decoder_ops, &d));
    struct llama_decoder *g = (struct llama_decoder *)d;
    g->r = d->x + C;
    g->qkv = g->r + C;
    g->att = g->qkv + m->qkv_w;
    g->gate = g->att + C;
    g->up = g->gate + F;
    g->scores = g->up + F;
    g->cs = g->scores + T;
    g->sn = g->cs + hs / 2;
    g->rstd = g->sn + hs / 2;
    g->inv_freq = malloc((hs / 2 + hs) * sizeof(float));
    if (!g->inv_freq) {
        llama_decoder_free(&d->base);
        return fsdp_err(FSDP_ERR_NOMEM, "llama decoder");
    }
    g->hcs = g->inv_freq + hs / 2;
    struct fsdp_rope_scaling sc;
    fsdp_llama_rope_scaling(c, &sc);
    if (fsdp_cpu_rope_inv_freq(g->inv_freq, (int)hs, c->rope_theta, &sc) < 0) {
        llama_decoder_free(&d->base);
        return fsdp_err(FSDP_ERR_INVALID, "llama decoder: RoPE frequencies for head size %zu",
                        hs);
    }
    g->m = m;
    *out = &d->base;
    return 0;
}
