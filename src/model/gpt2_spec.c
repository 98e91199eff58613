/*
 * gpt2_spec.c - presets, config validation, the parameter table and the
 * registration of the architecture.
 */
#include "config.h"
#include "model/gpt2_spec.h"
#include "model/gpt2.h"
#include "core/error.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fsdp_gpt2_preset(const char *name, struct fsdp_gpt2_config *out)
{
    static const struct {
        const char *name;
        struct fsdp_gpt2_config cfg;
    } presets[] = {
        {"tiny", {256, 128, 4, 4, 128, 1e-5f, 1}},
        {"bench-small", {256, 256, 4, 4, 256, 1e-5f, 1}},
        {"gpt2", {50257, 1024, 12, 12, 768, 1e-5f, 1}},
        {"gpt2-medium", {50257, 1024, 24, 16, 1024, 1e-5f, 1}},
        {"gpt2-large", {50257, 1024, 36, 20, 1280, 1e-5f, 1}},
        {"gpt2-xl", {50257, 1024, 48, 25, 1600, 1e-5f, 1}},
    };
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i].cfg;
            return 0;
        }
    }
    return fsdp_err(FSDP_ERR_INVALID,
                    "unknown preset '%s' (tiny, bench-small, gpt2, gpt2-medium, gpt2-large, gpt2-xl)",
                    name);
}

int fsdp_gpt2_config_validate(const struct fsdp_gpt2_config *c)
{
    if (c->vocab_size < 1 || c->vocab_size > (1 << 20)) {
        return fsdp_err(FSDP_ERR_INVALID, "vocab_size %d out of range [1, 2^20]", c->vocab_size);
    }
    if (c->context < 1 || c->context > (1 << 16)) {
        return fsdp_err(FSDP_ERR_INVALID, "context %d out of range [1, 65536]", c->context);
    }
    if (c->n_layer < 1 || c->n_layer > 1024) {
        return fsdp_err(FSDP_ERR_INVALID, "n_layer %d out of range [1, 1024]", c->n_layer);
    }
    if (c->n_head < 1 || c->n_embd < 1 || c->n_embd > (1 << 16)) {
        return fsdp_err(FSDP_ERR_INVALID, "n_head %d / n_embd %d out of range", c->n_head, c->n_embd);
    }
    if (c->n_embd % c->n_head != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "n_embd %d is not divisible by n_head %d", c->n_embd,
                        c->n_head);
    }
    if (!(c->ln_eps > 0.0f && c->ln_eps < 1.0f)) {
        return fsdp_err(FSDP_ERR_INVALID, "ln_eps %g out of range (0, 1)", (double)c->ln_eps);
    }
    if (c->tied != 0 && c->tied != 1) {
        return fsdp_err(FSDP_ERR_INVALID, "tied must be 0 or 1, not %d", c->tied);
    }
    return 0;
}

static int gpt2_validate(const void *cfg)
{
    return fsdp_gpt2_config_validate(cfg);
}

static int gpt2_spec_create(const void *cfg, struct fsdp_model_spec **out)
{
    return fsdp_gpt2_spec_create(cfg, out);
}

static int gpt2_preset(const char *name, void *cfg)
{
    return fsdp_gpt2_preset(name, cfg);
}

int fsdp_gpt2_spec_create(const struct fsdp_gpt2_config *c, struct fsdp_model_spec **out)
{
    FSDP_CHECK(fsdp_gpt2_config_validate(c));
    size_t L = (size_t)c->n_layer, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t T = (size_t)c->context;
    struct fsdp_model_spec *s;
    FSDP_CHECK(fsdp_model_spec_alloc(&fsdp_gpt2_arch, c->n_layer + 2,
                                     2 + FSDP_GPT2_BLK_COUNT * L + 3, &s));
    memcpy(s->cfg, c, sizeof(*c));
    s->vocab_size = c->vocab_size;
    s->context = c->context;
    /* GPT-2 init: N(0, 0.02); residual projections scaled by 1/sqrt(2L) */
    const float STD = 0.02f, RES = 0.02f / sqrtf(2.0f * (float)L);
    char name[FSDP_PARAM_NAME_MAX];
    int rc = 0;
    rc |= fsdp_model_spec_add(s, 0, "wte.weight", V, C, 2, FSDP_INIT_NORMAL, STD, 0, FSDP_TP_VOCAB);
    rc |= fsdp_model_spec_add(s, 0, "wpe.weight", T, C, 2, FSDP_INIT_NORMAL, STD, 0,
                              FSDP_TP_REPLICATE);
    for (size_t l = 0; l < L; l++) {
#define FSDP_GPT2_X(id, field, suffix, rows, cols, init, std, decay, tp)                  \
        snprintf(name, sizeof(name), "h.%zu.%s", l, suffix);                          \
        rc |= fsdp_model_spec_add(s, 1 + (int)l, name, (rows) * C, (cols) * C, (cols) ? 2 : 1, \
                                  init, std, decay, tp);
        FSDP_GPT2_BLOCK_TENSORS(FSDP_GPT2_X)
#undef FSDP_GPT2_X
    }
    int last = c->n_layer + 1;
    rc |= fsdp_model_spec_add(s, last, "ln_f.weight", C, 1, 1, FSDP_INIT_ONES, 0.0f, 0,
                              FSDP_TP_REPLICATE);
    rc |= fsdp_model_spec_add(s, last, "ln_f.bias", C, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0,
                              FSDP_TP_REPLICATE);
    if (c->tied) {
        rc |= fsdp_model_spec_tie(s, last, "wte.weight");
    } else {
        rc |= fsdp_model_spec_add(s, last, "lm_head.weight", V, C, 2, FSDP_INIT_NORMAL, STD, 1,
                                  FSDP_TP_VOCAB);
    }
    if (rc != 0) {
        fsdp_model_spec_destroy(s);
        return FSDP_ERR_INTERNAL;
    }
    *out = s;
    return 0;
}

/* Which config fields a parameter's shape follows: "vocab_size=256, n_embd=128". */
static void gpt2_shape_reason(const void *cfg, const char *name, char *buf, size_t len)
{
    const struct fsdp_gpt2_config *c = cfg;
    if (strncmp(name, "wte.", 4) == 0 || strncmp(name, "lm_head.", 8) == 0) {
        snprintf(buf, len, "vocab_size=%d, n_embd=%d", c->vocab_size, c->n_embd);
    } else if (strncmp(name, "wpe.", 4) == 0) {
        snprintf(buf, len, "context=%d, n_embd=%d", c->context, c->n_embd);
    } else {
        snprintf(buf, len, "n_embd=%d", c->n_embd);
    }
}

static void gpt2_describe(const void *cfg, char *buf, size_t len)
{
    const struct fsdp_gpt2_config *c = cfg;
    snprintf(buf, len, "L=%d NH=%d C=%d V=%d context=%d %s", c->n_layer, c->n_head, c->n_embd,
             c->vocab_size, c->context, c->tied ? "tied" : "untied");
}

// ----------------------------------------------------------------------------
// registration

#define GPT2_ATTR(field, name, type) {name, type, offsetof(struct fsdp_gpt2_config, field)}
static const struct fsdp_attr_desc gpt2_attrs[] = {
    GPT2_ATTR(vocab_size, "vocab_size", FSDP_ATTR_INT),
    GPT2_ATTR(context, "context", FSDP_ATTR_INT),
    GPT2_ATTR(n_layer, "n_layer", FSDP_ATTR_INT),
    GPT2_ATTR(n_head, "n_head", FSDP_ATTR_INT),
    GPT2_ATTR(n_embd, "n_embd", FSDP_ATTR_INT),
    GPT2_ATTR(ln_eps, "ln_eps", FSDP_ATTR_FLOAT),
    GPT2_ATTR(tied, "tied_embeddings", FSDP_ATTR_BOOL),
};
#undef GPT2_ATTR

const struct fsdp_arch fsdp_gpt2_arch = {
    .size = sizeof(struct fsdp_arch),
    .name = FSDP_MODEL_ARCH_GPT2,
    .cfg_size = sizeof(struct fsdp_gpt2_config),
    .attrs = gpt2_attrs,
    .n_attrs = sizeof(gpt2_attrs) / sizeof(gpt2_attrs[0]),
    .validate = gpt2_validate,
    .spec_create = gpt2_spec_create,
    .preset = gpt2_preset,
    .ops = &fsdp_gpt2_ops,
    .shape_reason = gpt2_shape_reason,
    .describe = gpt2_describe,
};
