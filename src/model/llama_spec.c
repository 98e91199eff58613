/*
 * llama_spec.c - presets, config validation, the parameter table and the
 * registration of the Llama architecture.
 */
#include "config.h"
#include "model/llama_spec.h"
#include "model/llama.h"
#include "model/hf_json.h"
#include "core/error.h"
#include "core/util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest context a config may declare (Llama 3.1 declares 131072). */
#define LLAMA_CONTEXT_MAX (1 << 20)

int fsdp_llama_preset(const char *name, struct fsdp_llama_config *out)
{
    /* none: the scaling fields hold neutral values, ignored */
#define LLAMA_NO_SCALING(ctx) FSDP_LLAMA_ROPE_NONE, 1.0f, 1.0f, 4.0f, ctx
    static const struct {
        const char *name;
        struct fsdp_llama_config cfg;
    } presets[] = {
        /* tests: seconds on one core */
        {"llama-tiny", {256, 128, 4, 4, 2, 128, 384, 1e-5f, 10000.0f, LLAMA_NO_SCALING(128), 1, 0}},
        /* about bench-small's cost per token: same V, T, L, NH, C, and 12 C^2 per block */
        {"llama-small",
         {256, 256, 4, 4, 2, 256, 768, 1e-5f, 10000.0f, LLAMA_NO_SCALING(256), 1, 0}},
        /* Llama 3.2 1B */
        {"llama-1b", {128256, 131072, 16, 32, 8, 2048, 8192, 1e-5f, 500000.0f,
                      FSDP_LLAMA_ROPE_LLAMA3, 32.0f, 1.0f, 4.0f, 8192, 1, 0}},
        /* Llama 3.1 8B */
        {"llama-8b", {128256, 131072, 32, 32, 8, 4096, 14336, 1e-5f, 500000.0f,
                      FSDP_LLAMA_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 8192, 0, 0}},
    };
#undef LLAMA_NO_SCALING
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i].cfg;
            return 0;
        }
    }
    return fsdp_err(FSDP_ERR_INVALID,
                    "unknown preset '%s' (llama-tiny, llama-small, llama-1b, llama-8b)", name);
}

static const char *const llama_rope_names[] = {"none", "linear", "llama3"};

int fsdp_llama_rope_parse(const char *name, int *type)
{
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, llama_rope_names[i]) == 0) {
            *type = i;
            return 0;
        }
    }
    return fsdp_err(FSDP_ERR_INVALID, "rope scaling '%s' is not one of none|linear|llama3", name);
}

const char *fsdp_llama_rope_name(int type)
{
    return type >= 0 && type < 3 ? llama_rope_names[type] : "?";
}

size_t fsdp_llama_dim_size(const struct fsdp_llama_config *c, enum fsdp_llama_dim d)
{
    size_t hs = (size_t)(c->n_embd / c->n_head);
    switch (d) {
    case FSDP_LLAMA_DC: return (size_t)c->n_embd;
    case FSDP_LLAMA_DQ: return (size_t)c->n_head * hs;
    case FSDP_LLAMA_DKV: return (size_t)c->n_kv_head * hs;
    case FSDP_LLAMA_DF: return (size_t)c->ffn_hidden;
    default: return 1;
    }
}

/* The scaling fields the rope type uses. */
static int llama_validate_rope(const struct fsdp_llama_config *c)
{
    if (c->rope_scaling < FSDP_LLAMA_ROPE_NONE || c->rope_scaling > FSDP_LLAMA_ROPE_LLAMA3) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "rope_scaling %d is not one of 0 (none), 1 (linear), 2 (llama3)",
                        c->rope_scaling);
    }
    if (c->rope_scaling == FSDP_LLAMA_ROPE_NONE) {
        return 0;
    }
    if (!(c->rope_factor >= 1.0f && c->rope_factor <= 1e6f)) {
        return fsdp_err(FSDP_ERR_INVALID, "rope_factor %g out of range [1, 1e6] (rope_scaling %s)",
                        (double)c->rope_factor, fsdp_llama_rope_name(c->rope_scaling));
    }
    if (c->rope_scaling == FSDP_LLAMA_ROPE_LINEAR) {
        return 0;
    }
    if (!(c->rope_low_freq > 0.0f && c->rope_low_freq <= 1e6f)) {
        return fsdp_err(FSDP_ERR_INVALID, "rope_low_freq_factor %g out of range (0, 1e6]",
                        (double)c->rope_low_freq);
    }
    if (!(c->rope_high_freq > c->rope_low_freq && c->rope_high_freq <= 1e6f)) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "rope_high_freq_factor %g must exceed rope_low_freq_factor %g (and be at "
                        "most 1e6)", (double)c->rope_high_freq, (double)c->rope_low_freq);
    }
    if (c->rope_original < 1 || c->rope_original > LLAMA_CONTEXT_MAX) {
        return fsdp_err(FSDP_ERR_INVALID, "rope_original_context %d out of range [1, %d]",
                        c->rope_original, LLAMA_CONTEXT_MAX);
    }
    return 0;
}

/* n parts (named pn) of a whole w (named wn): in [1, w] and dividing it, as
 * heads split the width and key/value heads the heads. */
static int llama_validate_split(const char *pn, int n, const char *wn, int w)
{
    if (n < 1 || n > w) {
        return fsdp_err(FSDP_ERR_INVALID, "%s %d out of range [1, %s %d]", pn, n, wn, w);
    }
    if (w % n != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s %d is not divisible by %s %d", wn, w, pn, n);
    }
    return 0;
}

int fsdp_llama_config_validate(const struct fsdp_llama_config *c)
{
    if (c->vocab_size < 1 || c->vocab_size > (1 << 20)) {
        return fsdp_err(FSDP_ERR_INVALID, "vocab_size %d out of range [1, 2^20]", c->vocab_size);
    }
    if (c->context < 1 || c->context > LLAMA_CONTEXT_MAX) {
        return fsdp_err(FSDP_ERR_INVALID, "context %d out of range [1, %d]", c->context,
                        LLAMA_CONTEXT_MAX);
    }
    if (c->n_layer < 1 || c->n_layer > 1024) {
        return fsdp_err(FSDP_ERR_INVALID, "n_layer %d out of range [1, 1024]", c->n_layer);
    }
    if (c->n_embd < 1 || c->n_embd > (1 << 16)) {
        return fsdp_err(FSDP_ERR_INVALID, "n_embd %d out of range [1, 65536]", c->n_embd);
    }
    FSDP_CHECK(llama_validate_split("n_head", c->n_head, "n_embd", c->n_embd));
    if ((c->n_embd / c->n_head) % 2 != 0) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "head size n_embd / n_head = %d is odd (RoPE rotates pairs of dimensions)",
                        c->n_embd / c->n_head);
    }
    FSDP_CHECK(llama_validate_split("n_kv_head", c->n_kv_head, "n_head", c->n_head));
    if (c->ffn_hidden < 1 || c->ffn_hidden > (1 << 20)) {
        return fsdp_err(FSDP_ERR_INVALID, "ffn_hidden %d out of range [1, 2^20]", c->ffn_hidden);
    }
    if (!(c->norm_eps > 0.0f && c->norm_eps < 1.0f)) {
        return fsdp_err(FSDP_ERR_INVALID, "norm_eps %g out of range (0, 1)", (double)c->norm_eps);
    }
    if (!(c->rope_theta > 1.0f && c->rope_theta <= 1e12f)) {
        return fsdp_err(FSDP_ERR_INVALID, "rope_theta %g out of range (1, 1e12]",
                        (double)c->rope_theta);
    }
    FSDP_CHECK(llama_validate_rope(c));
    if (c->tied != 0 && c->tied != 1) {
        return fsdp_err(FSDP_ERR_INVALID, "tied_embeddings must be 0 or 1, not %d", c->tied);
    }
    if (c->attn_bias != 0 && c->attn_bias != 1) {
        return fsdp_err(FSDP_ERR_INVALID, "attn_bias must be 0 or 1, not %d", c->attn_bias);
    }
    return 0;
}

int fsdp_llama_spec_create(const struct fsdp_llama_config *c, struct fsdp_model_spec **out)
{
    FSDP_CHECK(fsdp_llama_config_validate(c));
    size_t L = (size_t)c->n_layer, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    struct fsdp_model_spec *s;
    FSDP_CHECK(fsdp_model_spec_alloc(&fsdp_llama_arch, c->n_layer + 2,
                                     1 + FSDP_LLAMA_BLK_COUNT * L + 2, &s));
    memcpy(s->cfg, c, sizeof(*c));
    s->vocab_size = c->vocab_size;
    s->context = c->context;
    const float STD = FSDP_LLAMA_INIT_STD;
    char name[FSDP_PARAM_NAME_MAX];
    int rc = 0;
    rc |= fsdp_model_spec_add(s, 0, "embed_tokens.weight", V, C, 2, FSDP_INIT_NORMAL, STD, 0,
                              FSDP_TP_VOCAB);
    for (size_t l = 0; l < L; l++) {
#define FSDP_LLAMA_X(id, field, suffix, rows, cols, init, decay, tp, bias)                         \
        if (!(bias) || c->attn_bias) {                                                             \
            snprintf(name, sizeof(name), "layers.%zu.%s", l, suffix);                              \
            rc |= fsdp_model_spec_add(s, 1 + (int)l, name,                                         \
                                      fsdp_llama_dim_size(c, FSDP_LLAMA_##rows),                   \
                                      fsdp_llama_dim_size(c, FSDP_LLAMA_##cols),                   \
                                      FSDP_LLAMA_##cols == FSDP_LLAMA_D1 ? 1 : 2, init,            \
                                      (init) == FSDP_INIT_NORMAL ? STD : 0.0f, decay, tp);         \
        }
        FSDP_LLAMA_BLOCK_TENSORS(FSDP_LLAMA_X)
#undef FSDP_LLAMA_X
    }
    int last = c->n_layer + 1;
    rc |= fsdp_model_spec_add(s, last, "norm.weight", C, 1, 1, FSDP_INIT_ONES, 0.0f, 0,
                              FSDP_TP_REPLICATE);
    rc |= fsdp_model_spec_add_head(s, last, c->tied, "embed_tokens.weight", V, C, STD);
    return fsdp_model_spec_finish(s, rc, out);
}

static int llama_validate(const void *cfg)
{
    return fsdp_llama_config_validate(cfg);
}

static int llama_spec_create(const void *cfg, struct fsdp_model_spec **out)
{
    return fsdp_llama_spec_create(cfg, out);
}

static int llama_preset(const char *name, void *cfg)
{
    return fsdp_llama_preset(name, cfg);
}

/* Which config fields a parameter's shape follows. */
static void llama_shape_reason(const void *cfg, const char *name, char *buf, size_t len)
{
    const struct fsdp_llama_config *c = cfg;
    if (strncmp(name, "embed_tokens.", 13) == 0 || strncmp(name, "lm_head.", 8) == 0) {
        snprintf(buf, len, "vocab_size=%d, n_embd=%d", c->vocab_size, c->n_embd);
    } else if (strstr(name, ".k_proj.") || strstr(name, ".v_proj.")) {
        snprintf(buf, len, "n_kv_head=%d, n_embd=%d, n_head=%d", c->n_kv_head, c->n_embd,
                 c->n_head);
    } else if (strstr(name, ".mlp.")) {
        snprintf(buf, len, "ffn_hidden=%d, n_embd=%d", c->ffn_hidden, c->n_embd);
    } else {
        snprintf(buf, len, "n_embd=%d", c->n_embd);
    }
}

static void llama_describe(const void *cfg, char *buf, size_t len)
{
    const struct fsdp_llama_config *c = cfg;
    char rope[64];
    if (c->rope_scaling == FSDP_LLAMA_ROPE_NONE) {
        snprintf(rope, sizeof(rope), "theta=%g", (double)c->rope_theta);
    } else {
        snprintf(rope, sizeof(rope), "theta=%g %s x%g", (double)c->rope_theta,
                 fsdp_llama_rope_name(c->rope_scaling), (double)c->rope_factor);
    }
    snprintf(buf, len, "L=%d NH=%d NKV=%d C=%d F=%d V=%d context=%d %s %s%s", c->n_layer,
             c->n_head, c->n_kv_head, c->n_embd, c->ffn_hidden, c->vocab_size, c->context, rope,
             c->tied ? "tied" : "untied", c->attn_bias ? " qkv-bias" : "");
}

// ----------------------------------------------------------------------------
// registration

#define LLAMA_ATTR(field, name, type) {name, type, offsetof(struct fsdp_llama_config, field)}
static const struct fsdp_attr_desc llama_attrs[] = {
    LLAMA_ATTR(vocab_size, "vocab_size", FSDP_ATTR_INT),
    LLAMA_ATTR(context, "context", FSDP_ATTR_INT),
    LLAMA_ATTR(n_layer, "n_layer", FSDP_ATTR_INT),
    LLAMA_ATTR(n_head, "n_head", FSDP_ATTR_INT),
    LLAMA_ATTR(n_kv_head, "n_kv_head", FSDP_ATTR_INT),
    LLAMA_ATTR(n_embd, "n_embd", FSDP_ATTR_INT),
    LLAMA_ATTR(ffn_hidden, "ffn_hidden", FSDP_ATTR_INT),
    LLAMA_ATTR(norm_eps, "norm_eps", FSDP_ATTR_FLOAT),
    LLAMA_ATTR(rope_theta, "rope_theta", FSDP_ATTR_FLOAT),
    LLAMA_ATTR(rope_scaling, "rope_scaling", FSDP_ATTR_INT),
    LLAMA_ATTR(rope_factor, "rope_factor", FSDP_ATTR_FLOAT),
    LLAMA_ATTR(rope_low_freq, "rope_low_freq_factor", FSDP_ATTR_FLOAT),
    LLAMA_ATTR(rope_high_freq, "rope_high_freq_factor", FSDP_ATTR_FLOAT),
    LLAMA_ATTR(rope_original, "rope_original_context", FSDP_ATTR_INT),
    LLAMA_ATTR(tied, "tied_embeddings", FSDP_ATTR_BOOL),
    LLAMA_ATTR(attn_bias, "attn_bias", FSDP_ATTR_BOOL),
};
#undef LLAMA_ATTR

// ----------------------------------------------------------------------------
// Hugging Face: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
// ("model." + name, every weight as torch.nn.Linear stores it); the defaults
// of optional config.json members are transformers 4.38's

#define LLAMA_HF_SHOW 64

/* rope_scaling: null/absent, {"type" or "rope_type": "linear", "factor"} or
 * Llama 3.1's {"rope_type": "llama3", "factor", "low_freq_factor",
 * "high_freq_factor", "original_max_position_embeddings"}. */
static int llama_hf_rope(const struct fsdp_json_obj *j, struct fsdp_llama_config *c)
{
    struct fsdp_json_obj r;
    const char *type;
    c->rope_scaling = FSDP_LLAMA_ROPE_NONE;
    c->rope_factor = 1.0f;
    c->rope_low_freq = 1.0f;
    c->rope_high_freq = 4.0f;
    c->rope_original = c->context;
    int rc = fsdp_json_obj(j, "rope_scaling", &r);
    if (rc != 0) {
        return rc < 0 ? rc : 0;
    }
    const char *key = fsdp_json_has(&r, "rope_type") ? "rope_type" : "type";
    FSDP_CHECK(fsdp_json_str(&r, key, NULL, &type));
    if (strcmp(type, "default") == 0) {
        return 0;
    }
    int t;
    if (strcmp(type, "linear") == 0) {
        t = FSDP_LLAMA_ROPE_LINEAR;
    } else if (strcmp(type, "llama3") == 0) {
        t = FSDP_LLAMA_ROPE_LLAMA3;
    } else {
        char show[LLAMA_HF_SHOW];
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: 'rope_scaling.%s' is \"%s\"; fsdpc has "
                        "\"linear\" and \"llama3\" (or null: none)", j->file, key,
                        fsdp_str_printable(show, sizeof(show), type, 0));
    }
    double f;
    FSDP_CHECK(fsdp_json_num(&r, "factor", NULL, &f));
    c->rope_scaling = t;
    c->rope_factor = (float)f;
    if (t == FSDP_LLAMA_ROPE_LLAMA3) {
        double lo, hi;
        long long orig;
        FSDP_CHECK(fsdp_json_num(&r, "low_freq_factor", NULL, &lo));
        FSDP_CHECK(fsdp_json_num(&r, "high_freq_factor", NULL, &hi));
        FSDP_CHECK(fsdp_json_int(&r, "original_max_position_embeddings", 1, 1 << 20, NULL, &orig));
        c->rope_low_freq = (float)lo;
        c->rope_high_freq = (float)hi;
        c->rope_original = (int)orig;
    }
    return 0;
}

/* A sliding window: fine when absent from the computation (null) or at
 * least the context, since then no token ever falls out of it. */
static int llama_hf_window(const struct fsdp_json_obj *j, const char *why, long long context)
{
    long long w, dflt = 4096; /* MistralConfig's and Qwen2Config's default */
    if (fsdp_json_is_null(j, "sliding_window")) {
        return 0;
    }
    FSDP_CHECK(fsdp_json_int(j, "sliding_window", 1, 1LL << 40, &dflt, &w));
    if (w < context) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: 'sliding_window' is %lld%s, below "
                        "max_position_embeddings %lld: fsdpc attends to the whole context (a "
                        "window of null or at least the context is accepted)", j->file, w,
                        fsdp_json_has(j, "sliding_window") ? "" : why, context);
    }
    return 0;
}

/* The members that shape the model, for every family. */
static int llama_hf_shape(const struct fsdp_json_obj *j, struct fsdp_llama_config *c)
{
    long long v[6], kv;
    static const char *const keys[] = {"vocab_size", "hidden_size", "intermediate_size",
                                       "num_hidden_layers", "num_attention_heads",
                                       "max_position_embeddings"};
    static const long long hi[] = {1 << 20, 1 << 16, 1 << 20, 1024, 1 << 16, 1 << 20};
    for (int k = 0; k < 6; k++) {
        FSDP_CHECK(fsdp_json_int(j, keys[k], 1, hi[k], NULL, &v[k]));
    }
    FSDP_CHECK(fsdp_json_int(j, "num_key_value_heads", 1, 1 << 16, &v[4], &kv));
    if (fsdp_json_has(j, "head_dim") && !fsdp_json_is_null(j, "head_dim")) {
        long long hd;
        FSDP_CHECK(fsdp_json_int(j, "head_dim", 1, 1 << 16, NULL, &hd));
        if (hd * v[4] != v[1]) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: 'head_dim' is %lld; fsdpc's heads are "
                            "hidden_size / num_attention_heads = %lld wide", j->file, hd,
                            v[1] / v[4]);
        }
    }
    double eps, theta, eps_dflt = 1e-6, theta_dflt = 10000.0;
    FSDP_CHECK(fsdp_json_num(j, "rms_norm_eps", &eps_dflt, &eps));
    FSDP_CHECK(fsdp_json_num(j, "rope_theta", &theta_dflt, &theta));
    *c = (struct fsdp_llama_config){.vocab_size = (int)v[0], .n_embd = (int)v[1],
                                    .ffn_hidden = (int)v[2], .n_layer = (int)v[3],
                                    .n_head = (int)v[4], .context = (int)v[5], .n_kv_head = (int)kv,
                                    .norm_eps = (float)eps, .rope_theta = (float)theta};
    FSDP_CHECK(fsdp_hf_require_str(j, "hidden_act", "silu", "silu", NULL, "SwiGLU"));
    FSDP_CHECK(fsdp_hf_require_bool(j, "mlp_bias", 0, "the MLP projections have no biases"));
    return llama_hf_rope(j, c);
}

static int llama_hf_read(const struct fsdp_json_obj *j, const char *type, void *cfg)
{
    struct fsdp_llama_config *c = cfg;
    int tied, no = 0;
    FSDP_CHECK(llama_hf_shape(j, c));
    FSDP_CHECK(fsdp_json_bool(j, "tie_word_embeddings", &no, &tied));
    c->tied = tied;
    if (strcmp(type, "llama") == 0) {
        /* LlamaConfig's attention_bias gives o_proj a bias too */
        return fsdp_hf_require_bool(j, "attention_bias", 0,
                               "it would give o_proj a bias, which fsdpc's llama lacks");
    }
    if (strcmp(type, "mistral") == 0) {
        return llama_hf_window(j, " (MistralConfig's default)", c->context);
    }
    int use_window;
    c->attn_bias = 1; /* Qwen2: q, k and v always have biases */
    FSDP_CHECK(fsdp_json_bool(j, "use_sliding_window", &no, &use_window));
    return use_window ? llama_hf_window(j, " (Qwen2Config's default)", c->context) : 0;
}

/* linear as transformers 4.38 wants it (exactly "type" and "factor"),
 * llama3 as Llama 3.1's config.json has it. */
static void llama_hf_write_rope(struct fsdp_json_writer *w, const struct fsdp_llama_config *c)
{
    if (c->rope_scaling == FSDP_LLAMA_ROPE_NONE) {
        fsdp_json_put_null(w, "rope_scaling");
        return;
    }
    fsdp_json_begin_obj(w, "rope_scaling");
    fsdp_json_put_f32(w, "factor", c->rope_factor);
    if (c->rope_scaling == FSDP_LLAMA_ROPE_LINEAR) {
        fsdp_json_put_str(w, "type", "linear");
    } else {
        fsdp_json_put_f32(w, "high_freq_factor", c->rope_high_freq);
        fsdp_json_put_f32(w, "low_freq_factor", c->rope_low_freq);
        fsdp_json_put_int(w, "original_max_position_embeddings", c->rope_original);
        fsdp_json_put_str(w, "rope_type", "llama3");
    }
    fsdp_json_end(w);
}

/* LlamaForCausalLM, or Qwen2ForCausalLM when q/k/v have biases (Llama's
 * attention_bias would give o_proj one as well). */
static void llama_hf_write(struct fsdp_json_writer *w, const struct fsdp_model_spec *s,
                           const char *torch_dtype)
{
    const struct fsdp_llama_config *c = fsdp_llama_cfg(s);
    int qwen = c->attn_bias;
    fsdp_json_begin_arr(w, "architectures");
    fsdp_json_put_str(w, NULL, qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM");
    fsdp_json_end(w);
    if (!qwen) {
        fsdp_json_put_bool(w, "attention_bias", 0);
    }
    fsdp_hf_tokens_put(w, s);
    fsdp_json_put_str(w, "hidden_act", "silu");
    fsdp_json_put_int(w, "hidden_size", c->n_embd);
    fsdp_json_put_int(w, "intermediate_size", c->ffn_hidden);
    fsdp_json_put_int(w, "max_position_embeddings", c->context);
    fsdp_json_put_str(w, "model_type", qwen ? "qwen2" : "llama");
    fsdp_json_put_int(w, "num_attention_heads", c->n_head);
    fsdp_json_put_int(w, "num_hidden_layers", c->n_layer);
    fsdp_json_put_int(w, "num_key_value_heads", c->n_kv_head);
    fsdp_json_put_f32(w, "rms_norm_eps", c->norm_eps);
    llama_hf_write_rope(w, c);
    fsdp_json_put_f32(w, "rope_theta", c->rope_theta);
    if (qwen) {
        fsdp_json_put_null(w, "sliding_window");
    }
    fsdp_json_put_bool(w, "tie_word_embeddings", c->tied);
    fsdp_json_put_str(w, "torch_dtype", torch_dtype);
    if (qwen) {
        fsdp_json_put_bool(w, "use_sliding_window", 0);
    }
    fsdp_json_put_int(w, "vocab_size", c->vocab_size);
}

static const char *const llama_hf_types[] = {"llama", "mistral", "qwen2", NULL};
static const char *const llama_hf_buffers[] = {".rotary_emb.inv_freq", NULL};

static const struct fsdp_hf_map llama_hf = {
    .size = sizeof(struct fsdp_hf_map),
    .model_types = llama_hf_types,
    .prefix = "model.",
    .head = "lm_head.weight",
    .buffers = llama_hf_buffers,
    .config_read = llama_hf_read,
    .config_write = llama_hf_write,
    .embedding = "embed_tokens.weight",
};

const struct fsdp_arch fsdp_llama_arch = {
    .size = sizeof(struct fsdp_arch),
    .name = FSDP_MODEL_ARCH_LLAMA,
    .cfg_size = sizeof(struct fsdp_llama_config),
    .attrs = llama_attrs,
    .n_attrs = sizeof(llama_attrs) / sizeof(llama_attrs[0]),
    .validate = llama_validate,
    .spec_create = llama_spec_create,
    .preset = llama_preset,
    .ops = &fsdp_llama_ops,
    .shape_reason = llama_shape_reason,
    .describe = llama_describe,
    .hf = &llama_hf,
};
