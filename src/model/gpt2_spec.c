/*
 * gpt2_spec.c - presets, config validation, the parameter table and the
 * registration of the architecture.
 */
#include "config.h"
#include "model/gpt2_spec.h"
#include "model/gpt2.h"
#include "model/hf_json.h"
#include "core/error.h"
#include "core/util.h"

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
    rc |= fsdp_model_spec_add_head(s, last, c->tied, "wte.weight", V, C, STD);
    return fsdp_model_spec_finish(s, rc, out);
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

// ----------------------------------------------------------------------------
// Hugging Face: GPT2LMHeadModel ("transformer." + name, Conv1D weights (in,
// out), the tied lm_head left out); the defaults of optional config.json
// members are transformers 4.38's

static int gpt2_hf_read(const struct fsdp_json_obj *j, const char *model_type, void *cfg)
{
    (void)model_type;
    long long v[5];
    static const char *const keys[] = {"vocab_size", "n_positions", "n_layer", "n_head", "n_embd"};
    static const long long hi[] = {1 << 20, 1 << 16, 1024, 1 << 16, 1 << 16};
    for (int k = 0; k < 5; k++) {
        FSDP_CHECK(fsdp_json_int(j, keys[k], 1, hi[k], NULL, &v[k]));
    }
    double eps, eps_dflt = 1e-5;
    int tied, tied_dflt = 1;
    FSDP_CHECK(fsdp_json_num(j, "layer_norm_epsilon", &eps_dflt, &eps));
    FSDP_CHECK(fsdp_json_bool(j, "tie_word_embeddings", &tied_dflt, &tied));
    FSDP_CHECK(fsdp_hf_require_str(j, "activation_function", "gelu_new", "gelu_new",
                                   "gelu_pytorch_tanh", "fsdpc's GELU is the tanh form"));
    if (!fsdp_json_is_null(j, "n_inner") && fsdp_json_has(j, "n_inner")) {
        long long inner;
        FSDP_CHECK(fsdp_json_int(j, "n_inner", 1, 1LL << 30, NULL, &inner));
        if (inner != 4 * v[4]) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: 'n_inner' is %lld; fsdpc's GPT-2 MLP is "
                            "4 * n_embd = %lld wide (null also means that)", j->file, inner,
                            4 * v[4]);
        }
    }
    FSDP_CHECK(fsdp_hf_require_bool(j, "scale_attn_weights", 1,
                                    "scores are scaled by 1/sqrt(head size)"));
    FSDP_CHECK(fsdp_hf_require_bool(j, "scale_attn_by_inverse_layer_idx", 0,
                                    "scores are not scaled by layer"));
    FSDP_CHECK(fsdp_hf_require_bool(j, "add_cross_attention", 0,
                                    "a decoder without cross-attention"));
    *(struct fsdp_gpt2_config *)cfg = (struct fsdp_gpt2_config){
        .vocab_size = (int)v[0], .context = (int)v[1], .n_layer = (int)v[2], .n_head = (int)v[3],
        .n_embd = (int)v[4], .ln_eps = (float)eps, .tied = tied};
    return 0;
}

static void gpt2_hf_write(struct fsdp_json_writer *w, const struct fsdp_model_spec *s,
                          const char *torch_dtype)
{
    const struct fsdp_gpt2_config *c = fsdp_gpt2_cfg(s);
    fsdp_json_put_str(w, "activation_function", "gelu_new");
    fsdp_json_begin_arr(w, "architectures");
    fsdp_json_put_str(w, NULL, "GPT2LMHeadModel");
    fsdp_json_end(w);
    fsdp_hf_tokens_put(w, s);
    fsdp_json_put_f32(w, "layer_norm_epsilon", c->ln_eps);
    fsdp_json_put_str(w, "model_type", "gpt2");
    fsdp_json_put_int(w, "n_embd", c->n_embd);
    fsdp_json_put_int(w, "n_head", c->n_head);
    fsdp_json_put_null(w, "n_inner");
    fsdp_json_put_int(w, "n_layer", c->n_layer);
    fsdp_json_put_int(w, "n_positions", c->context);
    fsdp_json_put_bool(w, "scale_attn_by_inverse_layer_idx", 0);
    fsdp_json_put_bool(w, "scale_attn_weights", 1);
    fsdp_json_put_bool(w, "tie_word_embeddings", c->tied);
    fsdp_json_put_str(w, "torch_dtype", torch_dtype);
    fsdp_json_put_int(w, "vocab_size", c->vocab_size);
}

/* n_head and ln_eps, which shapes do not give, from the metadata an export
 * writes (or the command line's --heads and --ln-eps). */
static int gpt2_hf_meta(const struct fsdp_hf_tensors *t, struct fsdp_gpt2_config *c)
{
    const char *mh = t->meta(t->ctx, "fsdpc_n_head"), *me = t->meta(t->ctx, "fsdpc_ln_eps");
    long long v;
    if (!mh || fsdp_parse_long(mh, &v) < 0 || v <= 0 || v >= 65536) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: n_head is not in the file: pass --heads N "
                        "(GPT-2 small: 12)", t->file);
    }
    c->n_head = (int)v;
    double eps = 1e-5;
    if (me) {
        char *end;
        eps = strtod(me, &end);
        if (end == me || *end || !(eps > 0.0 && eps < 1.0)) {
            char show[80];
            return fsdp_err(FSDP_ERR_FORMAT, "%s: metadata fsdpc_ln_eps '%s' is not a number "
                            "in (0, 1); pass --ln-eps X", t->file,
                            fsdp_str_printable(show, sizeof(show), me, 0));
        }
    }
    c->ln_eps = (float)eps;
    return 0;
}

/* The config from the shapes: V and C from wte, the context from wpe, L
 * from the blocks present. */
static int gpt2_hf_infer(const struct fsdp_hf_tensors *t, int tied, void *cfg)
{
    size_t wte[2], wpe[2], sh[2];
    if (t->shape(t->ctx, "wte.weight", wte) != 2 || t->shape(t->ctx, "wpe.weight", wpe) != 2) {
        return 1;
    }
    char name[64];
    int L = 0;
    for (;; L++) {
        snprintf(name, sizeof(name), "h.%d.ln_1.weight", L);
        if (t->shape(t->ctx, name, sh) < 0) {
            break;
        }
    }
    struct fsdp_gpt2_config *c = cfg;
    FSDP_CHECK(gpt2_hf_meta(t, c));
    c->vocab_size = (int)wte[0];
    c->n_embd = (int)wte[1];
    c->context = (int)wpe[0];
    c->n_layer = L;
    c->tied = tied;
    return 0;
}

static const char *const gpt2_hf_types[] = {"gpt2", NULL};
static const char *const gpt2_hf_conv1d[] = {".c_attn.weight", ".c_proj.weight", ".c_fc.weight",
                                             NULL};
static const char *const gpt2_hf_buffers[] = {".attn.bias", ".attn.masked_bias", NULL};

static const struct fsdp_hf_map gpt2_hf = {
    .size = sizeof(struct fsdp_hf_map),
    .model_types = gpt2_hf_types,
    .prefix = "transformer.",
    .head = "lm_head.weight",
    .transposed = gpt2_hf_conv1d,
    .buffers = gpt2_hf_buffers,
    .config_read = gpt2_hf_read,
    .config_write = gpt2_hf_write,
    .config_infer = gpt2_hf_infer,
    .embedding = "wte.weight",
};

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
    .hf = &gpt2_hf,
};
