/*
 * hf_map.c - fsdpc's architectures in Hugging Face's terms (see hf_map.h):
 * parameter names and layouts, and config.json in both directions. The
 * defaults of optional config members are transformers 4.38's.
 */
#include "config.h"
#include "programs/hf_map.h"
#include "model/gpt2_spec.h"
#include "model/llama_spec.h"
#include "core/error.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HF_SHOW 64

// ----------------------------------------------------------------------------
// names and layouts

const char *fsdp_hf_prefix(const struct fsdp_arch *a)
{
    if (a == &fsdp_gpt2_arch) {
        return "transformer.";
    }
    return a == &fsdp_llama_arch ? "model." : NULL;
}

void fsdp_hf_param_name(const struct fsdp_arch *a, const struct fsdp_param_spec *p, char *buf,
                        size_t len)
{
    const char *prefix = fsdp_hf_prefix(a);
    snprintf(buf, len, "%s%s", strcmp(p->name, "lm_head.weight") == 0 || !prefix ? "" : prefix,
             p->name);
}

int fsdp_hf_param_transposed(const struct fsdp_arch *a, const struct fsdp_param_spec *p)
{
    return a == &fsdp_gpt2_arch && p->ndim == 2 &&
           (strstr(p->name, ".c_attn.weight") || strstr(p->name, ".c_proj.weight") ||
            strstr(p->name, ".c_fc.weight"));
}

static int hf_ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n > t && strcmp(s + n - t, tail) == 0;
}

int fsdp_hf_is_buffer(const struct fsdp_arch *a, const char *bare)
{
    if (a == &fsdp_gpt2_arch) {
        return hf_ends_with(bare, ".attn.bias") || hf_ends_with(bare, ".attn.masked_bias");
    }
    return a == &fsdp_llama_arch && hf_ends_with(bare, ".rotary_emb.inv_freq");
}

// ----------------------------------------------------------------------------
// config.json in

/* A member that must hold one value (if present) for fsdpc to compute what
 * transformers computes. */
static int hf_require_str(const struct fsdp_json_obj *j, const char *key, const char *dflt,
                          const char *want1, const char *want2, const char *why)
{
    const char *v;
    FSDP_CHECK(fsdp_json_str(j, key, dflt, &v));
    if (strcmp(v, want1) != 0 && (!want2 || strcmp(v, want2) != 0)) {
        char show[HF_SHOW], want[128];
        if (want2) {
            snprintf(want, sizeof(want), "\"%s\" or \"%s\"", want1, want2);
        } else {
            snprintf(want, sizeof(want), "\"%s\"", want1);
        }
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: '%s' is \"%s\"; fsdpc reads only %s (%s)",
                        j->file, key, fsdp_str_printable(show, sizeof(show), v, 0), want, why);
    }
    return 0;
}

static int hf_require_bool(const struct fsdp_json_obj *j, const char *key, int want,
                           const char *why)
{
    int v;
    FSDP_CHECK(fsdp_json_bool(j, key, &want, &v));
    if (v != want) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: '%s' is %s; fsdpc reads only %s (%s)",
                        j->file, key, v ? "true" : "false", want ? "true" : "false", why);
    }
    return 0;
}

static int hf_gpt2_config(const struct fsdp_json_obj *j, struct fsdp_gpt2_config *c)
{
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
    FSDP_CHECK(hf_require_str(j, "activation_function", "gelu_new", "gelu_new",
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
    FSDP_CHECK(hf_require_bool(j, "scale_attn_weights", 1, "scores are scaled by 1/sqrt(head size)"));
    FSDP_CHECK(hf_require_bool(j, "scale_attn_by_inverse_layer_idx", 0,
                               "scores are not scaled by layer"));
    FSDP_CHECK(hf_require_bool(j, "add_cross_attention", 0, "a decoder without cross-attention"));
    *c = (struct fsdp_gpt2_config){.vocab_size = (int)v[0], .context = (int)v[1],
                                   .n_layer = (int)v[2], .n_head = (int)v[3], .n_embd = (int)v[4],
                                   .ln_eps = (float)eps, .tied = tied};
    return 0;
}

/* rope_scaling: null/absent, {"type" or "rope_type": "linear", "factor"} or
 * Llama 3.1's {"rope_type": "llama3", "factor", "low_freq_factor",
 * "high_freq_factor", "original_max_position_embeddings"}. */
static int hf_rope_scaling(const struct fsdp_json_obj *j, struct fsdp_llama_config *c)
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
        char show[HF_SHOW];
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
static int hf_window(const struct fsdp_json_obj *j, const char *why, long long context)
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
static int hf_llama_shape(const struct fsdp_json_obj *j, struct fsdp_llama_config *c)
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
    FSDP_CHECK(hf_require_str(j, "hidden_act", "silu", "silu", NULL, "SwiGLU"));
    FSDP_CHECK(hf_require_bool(j, "mlp_bias", 0, "the MLP projections have no biases"));
    return hf_rope_scaling(j, c);
}

static int hf_llama_config(const struct fsdp_json_obj *j, const char *type,
                           struct fsdp_llama_config *c)
{
    int tied, no = 0;
    FSDP_CHECK(hf_llama_shape(j, c));
    FSDP_CHECK(fsdp_json_bool(j, "tie_word_embeddings", &no, &tied));
    c->tied = tied;
    if (strcmp(type, "llama") == 0) {
        /* LlamaConfig's attention_bias gives o_proj a bias too */
        return hf_require_bool(j, "attention_bias", 0,
                               "it would give o_proj a bias, which fsdpc's llama lacks");
    }
    if (strcmp(type, "mistral") == 0) {
        return hf_window(j, " (MistralConfig's default)", c->context);
    }
    int use_window;
    c->attn_bias = 1; /* Qwen2: q, k and v always have biases */
    FSDP_CHECK(fsdp_json_bool(j, "use_sliding_window", &no, &use_window));
    return use_window ? hf_window(j, " (Qwen2Config's default)", c->context) : 0;
}

int fsdp_hf_config_read(const struct fsdp_json_obj *j, struct fsdp_hf_model *out)
{
    static const char *const types[] = {"gpt2", "llama", "mistral", "qwen2"};
    const char *type;
    FSDP_CHECK(fsdp_json_str(j, "model_type", NULL, &type));
    size_t k = 0;
    while (k < 4 && strcmp(type, types[k]) != 0) {
        k++;
    }
    if (k == 4) {
        char show[HF_SHOW];
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not one fsdpc reads "
                        "(gpt2, llama, mistral, qwen2)", j->file,
                        fsdp_str_printable(show, sizeof(show), type, 0));
    }
    out->model_type = types[k];
    out->arch = k == 0 ? &fsdp_gpt2_arch : &fsdp_llama_arch;
    out->cfg = calloc(1, out->arch->cfg_size);
    if (!out->cfg) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: config", j->file);
    }
    int rc = k == 0 ? hf_gpt2_config(j, out->cfg) : hf_llama_config(j, types[k], out->cfg);
    if (rc == 0 && (rc = out->arch->validate(out->cfg)) < 0) {
        /* the message names fsdpc's field; say where it came from */
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        rc = fsdp_err(rc, "%s: a model fsdpc cannot build: %s", j->file, msg);
    }
    if (rc < 0) {
        free(out->cfg);
        out->cfg = NULL;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// config.json out (members sorted by name, as transformers writes them)

static const char *hf_torch_dtype(enum fsdp_dtype t)
{
    return t == FSDP_BF16 ? "bfloat16" : t == FSDP_F16 ? "float16" : "float32";
}

static void hf_write_gpt2(struct fsdp_json_writer *w, const struct fsdp_model_spec *s,
                          enum fsdp_dtype dtype)
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
    fsdp_json_put_str(w, "torch_dtype", hf_torch_dtype(dtype));
    fsdp_json_put_int(w, "vocab_size", c->vocab_size);
}

/* linear as transformers 4.38 wants it (exactly "type" and "factor"),
 * llama3 as Llama 3.1's config.json has it. */
static void hf_write_rope(struct fsdp_json_writer *w, const struct fsdp_llama_config *c)
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
static void hf_write_llama(struct fsdp_json_writer *w, const struct fsdp_model_spec *s,
                           enum fsdp_dtype dtype)
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
    hf_write_rope(w, c);
    fsdp_json_put_f32(w, "rope_theta", c->rope_theta);
    if (qwen) {
        fsdp_json_put_null(w, "sliding_window");
    }
    fsdp_json_put_bool(w, "tie_word_embeddings", c->tied);
    fsdp_json_put_str(w, "torch_dtype", hf_torch_dtype(dtype));
    if (qwen) {
        fsdp_json_put_bool(w, "use_sliding_window", 0);
    }
    fsdp_json_put_int(w, "vocab_size", c->vocab_size);
}

int fsdp_hf_config_write(const struct fsdp_model_spec *s, enum fsdp_dtype dtype, char **text,
                         size_t *len)
{
    struct fsdp_json_writer w;
    if (!fsdp_hf_prefix(s->arch)) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "a %s model has no Hugging Face counterpart "
                        "(gpt2 and llama do)", s->arch->name);
    }
    FSDP_CHECK(fsdp_json_writer_init(&w));
    fsdp_json_begin_obj(&w, NULL);
    if (s->arch == &fsdp_gpt2_arch) {
        hf_write_gpt2(&w, s, dtype);
    } else {
        hf_write_llama(&w, s, dtype);
    }
    fsdp_json_end(&w);
    return fsdp_json_writer_finish(&w, text, len);
}
