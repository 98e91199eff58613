/*
 * llama_spec.h - the Llama family as an architecture ("llama"): its config,
 * the one listing of a block's tensors (from which the parameter table, the
 * model's tensor views and offsets are all generated), presets, and its
 * registration (fsdp_llama_arch). Covers Llama 2/3, Mistral without a
 * sliding window, and Qwen2's biased q/k/v projections (attn_bias).
 *
 * Parameter names are Hugging Face's without the "model." prefix. Units:
 *   unit 0          embed_tokens.weight (V, C)
 *   unit 1 + l      layers.l.*: input_layernorm, self_attn.{q,k,v}_proj
 *                   (+ their biases with attn_bias), self_attn.o_proj,
 *                   post_attention_layernorm, mlp.{gate,up,down}_proj
 *   unit 1 + L      norm.weight (+ lm_head.weight (V, C) when untied)
 * With tied embeddings unit 1 + L uses embed_tokens.weight (a tie).
 * q, k and v (weights, then biases) sit one after the other in a block's
 * unit, so that one product makes the packed [q | k | v] rows.
 * Weights are stored as (out_features, in_features) like torch.nn.Linear.
 */
#ifndef FSDP_MODEL_LLAMA_SPEC_H
#define FSDP_MODEL_LLAMA_SPEC_H

#include <stddef.h>

#include "core/spec.h"

#define FSDP_MODEL_ARCH_LLAMA "llama"

/* rope_scaling: Hugging Face's rope_scaling "type" as an integer attribute */
enum fsdp_llama_rope {
    FSDP_LLAMA_ROPE_NONE = 0,
    FSDP_LLAMA_ROPE_LINEAR = 1, /* positions / factor */
    FSDP_LLAMA_ROPE_LLAMA3 = 2, /* Llama 3.1's frequency-dependent scaling */
};

struct fsdp_llama_config {
    int vocab_size;       /* V */
    int context;          /* max_position_embeddings: the longest sequence */
    int n_layer;          /* L */
    int n_head;           /* NH query heads */
    int n_kv_head;        /* NKV key/value heads, dividing NH (1: multi-query) */
    int n_embd;           /* C = NH * hs, hs even */
    int ffn_hidden;       /* F: intermediate_size */
    float norm_eps;       /* rms_norm_eps */
    float rope_theta;     /* RoPE base */
    int rope_scaling;     /* enum fsdp_llama_rope */
    float rope_factor;    /* linear and llama3 */
    float rope_low_freq;  /* llama3: low_freq_factor */
    float rope_high_freq; /* llama3: high_freq_factor (> low) */
    int rope_original;    /* llama3: original_max_position_embeddings */
    int tied;             /* 1: the LM head reuses embed_tokens.weight */
    int attn_bias;        /* 1: q/k/v projections have biases (Qwen2); o_proj never */
};

/* The sizes a block's tensor shapes are made of (D1: a 1-D tensor's cols). */
enum fsdp_llama_dim {
    FSDP_LLAMA_D1 = 0, /* 1 */
    FSDP_LLAMA_DC,     /* C */
    FSDP_LLAMA_DQ,     /* NH * hs (= C) */
    FSDP_LLAMA_DKV,    /* NKV * hs */
    FSDP_LLAMA_DF,     /* F */
};

/*
 * A block's tensors, in unit order: X(ID, field, "name suffix", rows, cols,
 * init, decay, tp, bias). rows/cols are enum fsdp_llama_dim (cols D1: 1-D);
 * bias 1 marks the tensors present only with attn_bias. Normal inits use
 * the initializer range (0.02) as Hugging Face does for every Linear.
 */
#define FSDP_LLAMA_BLOCK_TENSORS(X)                                                                \
    X(ATTN_NORM, attn_norm, "input_layernorm.weight", DC, D1, FSDP_INIT_ONES, 0,                   \
      FSDP_TP_REPLICATE, 0)                                                                        \
    X(QW, qw, "self_attn.q_proj.weight", DQ, DC, FSDP_INIT_NORMAL, 1, FSDP_TP_COLWISE, 0)          \
    X(KW, kw, "self_attn.k_proj.weight", DKV, DC, FSDP_INIT_NORMAL, 1, FSDP_TP_COLWISE, 0)         \
    X(VW, vw, "self_attn.v_proj.weight", DKV, DC, FSDP_INIT_NORMAL, 1, FSDP_TP_COLWISE, 0)         \
    X(QB, qb, "self_attn.q_proj.bias", DQ, D1, FSDP_INIT_ZEROS, 0, FSDP_TP_COLWISE, 1)             \
    X(KB, kb, "self_attn.k_proj.bias", DKV, D1, FSDP_INIT_ZEROS, 0, FSDP_TP_COLWISE, 1)            \
    X(VB, vb, "self_attn.v_proj.bias", DKV, D1, FSDP_INIT_ZEROS, 0, FSDP_TP_COLWISE, 1)            \
    X(OW, ow, "self_attn.o_proj.weight", DC, DQ, FSDP_INIT_NORMAL, 1, FSDP_TP_ROWWISE, 0)          \
    X(MLP_NORM, mlp_norm, "post_attention_layernorm.weight", DC, D1, FSDP_INIT_ONES, 0,            \
      FSDP_TP_REPLICATE, 0)                                                                        \
    X(GATEW, gatew, "mlp.gate_proj.weight", DF, DC, FSDP_INIT_NORMAL, 1, FSDP_TP_COLWISE, 0)       \
    X(UPW, upw, "mlp.up_proj.weight", DF, DC, FSDP_INIT_NORMAL, 1, FSDP_TP_COLWISE, 0)             \
    X(DOWNW, downw, "mlp.down_proj.weight", DC, DF, FSDP_INIT_NORMAL, 1, FSDP_TP_ROWWISE, 0)

enum fsdp_llama_block_tensor {
#define FSDP_LLAMA_X(id, field, suffix, rows, cols, init, decay, tp, bias) FSDP_LLAMA_BLK_##id,
    FSDP_LLAMA_BLOCK_TENSORS(FSDP_LLAMA_X)
#undef FSDP_LLAMA_X
    FSDP_LLAMA_BLK_COUNT,
};

/* Hugging Face's initializer_range: N(0, 0.02) for every Linear and the embedding. */
#define FSDP_LLAMA_INIT_STD 0.02f

/* The registration: name "llama", the config attributes, presets, ops. */
extern const struct fsdp_arch fsdp_llama_arch;

/* The config of a Llama spec (spec->arch must be fsdp_llama_arch). */
static inline const struct fsdp_llama_config *fsdp_llama_cfg(const struct fsdp_model_spec *s)
{
    return (const struct fsdp_llama_config *)s->cfg;
}

/* Size of dimension d of config c (head size C / NH). */
size_t fsdp_llama_dim_size(const struct fsdp_llama_config *c, enum fsdp_llama_dim d);

/* Named presets: llama-tiny, llama-small, llama-1b, llama-8b. */
int fsdp_llama_preset(const char *name, struct fsdp_llama_config *out);
/* "none", "linear" or "llama3" into *type; an error naming the choices otherwise. */
int fsdp_llama_rope_parse(const char *name, int *type);
/* "none", "linear", "llama3" (or "?" for a value out of range). */
const char *fsdp_llama_rope_name(int type);
/* Checks ranges and divisibility; the error names the field. */
int fsdp_llama_config_validate(const struct fsdp_llama_config *c);
int fsdp_llama_spec_create(const struct fsdp_llama_config *c, struct fsdp_model_spec **out);

#endif
