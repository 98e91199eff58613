/*
 * gpt2_spec.c - presets, config validation and the parameter table.
 */
#include "config.h"
#include "model/gpt2_spec.h"
#include "core/error.h"

#include <math.h>
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

static void add_param(struct fsdp_gpt2_spec *s, size_t *n, int unit, const char *name, size_t rows,
                      size_t cols, int ndim, enum fsdp_init_kind init, float std, int decay)
{
    struct fsdp_param_spec *p = &s->params[*n];
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->unit = unit;
    p->ndim = ndim;
    p->shape[0] = rows;
    p->shape[1] = ndim == 2 ? cols : 1;
    p->numel = rows * p->shape[1];
    p->offset = s->unit_numel[unit];
    p->init = init;
    p->std = std;
    p->decay = decay;
    if (s->unit_numel[unit] == 0) {
        s->unit_first[unit] = *n;
    }
    s->unit_numel[unit] += p->numel;
    s->total_numel += p->numel;
    (*n)++;
}

int fsdp_gpt2_spec_create(const struct fsdp_gpt2_config *c, struct fsdp_gpt2_spec **out)
{
    FSDP_CHECK(fsdp_gpt2_config_validate(c));
    struct fsdp_gpt2_spec *s = calloc(1, sizeof(*s));
    size_t L = (size_t)c->n_layer, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t T = (size_t)c->context;
    size_t cap = 2 + 12 * L + 3;
    if (!s) {
        return fsdp_err(FSDP_ERR_NOMEM, "gpt2 spec");
    }
    s->cfg = *c;
    s->n_units = c->n_layer + 2;
    s->params = calloc(cap, sizeof(*s->params));
    s->unit_numel = calloc((size_t)s->n_units, sizeof(size_t));
    s->unit_first = calloc((size_t)s->n_units, sizeof(size_t));
    if (!s->params || !s->unit_numel || !s->unit_first) {
        fsdp_gpt2_spec_destroy(s);
        return fsdp_err(FSDP_ERR_NOMEM, "gpt2 spec");
    }
    /* GPT-2 init: N(0, 0.02); residual projections scaled by 1/sqrt(2L) */
    const float std = 0.02f, res_std = 0.02f / sqrtf(2.0f * (float)L);
    size_t n = 0;
    char name[FSDP_PARAM_NAME_MAX];
    add_param(s, &n, 0, "wte.weight", V, C, 2, FSDP_INIT_NORMAL, std, 0);
    add_param(s, &n, 0, "wpe.weight", T, C, 2, FSDP_INIT_NORMAL, std, 0);
    for (size_t l = 0; l < L; l++) {
        int u = 1 + (int)l;
#define P(suffix, rows, cols, ndim, init, sd, decay)                       \
        snprintf(name, sizeof(name), "h.%zu.%s", l, suffix);               \
        add_param(s, &n, u, name, rows, cols, ndim, init, sd, decay)
        P("ln_1.weight", C, 1, 1, FSDP_INIT_ONES, 0.0f, 0);
        P("ln_1.bias", C, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0);
        P("attn.c_attn.weight", 3 * C, C, 2, FSDP_INIT_NORMAL, std, 1);
        P("attn.c_attn.bias", 3 * C, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0);
        P("attn.c_proj.weight", C, C, 2, FSDP_INIT_NORMAL, res_std, 1);
        P("attn.c_proj.bias", C, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0);
        P("ln_2.weight", C, 1, 1, FSDP_INIT_ONES, 0.0f, 0);
        P("ln_2.bias", C, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0);
        P("mlp.c_fc.weight", 4 * C, C, 2, FSDP_INIT_NORMAL, std, 1);
        P("mlp.c_fc.bias", 4 * C, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0);
        P("mlp.c_proj.weight", C, 4 * C, 2, FSDP_INIT_NORMAL, res_std, 1);
        P("mlp.c_proj.bias", C, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0);
#undef P
    }
    int last = 1 + c->n_layer;
    add_param(s, &n, last, "ln_f.weight", C, 1, 1, FSDP_INIT_ONES, 0.0f, 0);
    add_param(s, &n, last, "ln_f.bias", C, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0);
    if (!c->tied) {
        add_param(s, &n, last, "lm_head.weight", V, C, 2, FSDP_INIT_NORMAL, std, 1);
    }
    s->n_params = n;
    *out = s;
    return 0;
}

size_t fsdp_gpt2_spec_largest(const struct fsdp_gpt2_spec *s)
{
    size_t n = 1;
    for (size_t i = 0; i < s->n_params; i++) {
        size_t k = s->params[i].shape[0] * s->params[i].shape[1];
        n = k > n ? k : n;
    }
    return n;
}

void fsdp_gpt2_spec_destroy(struct fsdp_gpt2_spec *s)
{
    if (!s) {
        return;
    }
    free(s->params);
    free(s->unit_numel);
    free(s->unit_first);
    free(s);
}

long fsdp_gpt2_spec_find(const struct fsdp_gpt2_spec *s, const char *name)
{
    for (size_t i = 0; i < s->n_params; i++) {
        if (strcmp(s->params[i].name, name) == 0) {
            return (long)i;
        }
    }
    return -1;
}
