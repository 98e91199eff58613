/*
 * gpt2_spec.h - the GPT-2 architecture: its config, the one listing of its
 * parameters (from which the parameter table, the model's tensor views and
 * offsets are all generated), presets, and its registration (fsdp_gpt2_arch).
 *
 * Units (what the sharding engine gathers and reduces as one buffer):
 *   unit 0          wte.weight (V, C), wpe.weight (T, C)
 *   unit 1 + l      block l: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj
 *   unit 1 + L      ln_f (+ lm_head.weight (V, C) when embeddings are untied)
 * With tied embeddings unit 1 + L uses wte.weight (a tie, core/spec.h).
 * Weights are stored as (out_features, in_features) like torch.nn.Linear.
 */
#ifndef FSDP_MODEL_GPT2_SPEC_H
#define FSDP_MODEL_GPT2_SPEC_H

#include <stddef.h>

#include "core/spec.h"

#define FSDP_MODEL_ARCH_GPT2 "gpt2"

struct fsdp_gpt2_config {
    int vocab_size; /* V */
    int context;    /* maximum sequence length T */
    int n_layer;    /* L */
    int n_head;     /* NH */
    int n_embd;     /* C, divisible by NH */
    float ln_eps;   /* layer-norm epsilon (1e-5) */
    int tied;       /* 1: the LM head reuses wte.weight */
};

/*
 * A block's tensors, in unit order: X(ID, field, "name suffix", rows, cols,
 * init, std, decay, tp), rows and cols in units of C (cols 0: 1-D), std
 * RES for the residual projections (0.02 / sqrt(2L)), STD for 0.02.
 */
#define FSDP_GPT2_BLOCK_TENSORS(X)                                                            \
    X(LN1W, ln1w, "ln_1.weight", 1, 0, FSDP_INIT_ONES, 0, 0, FSDP_TP_REPLICATE)                \
    X(LN1B, ln1b, "ln_1.bias", 1, 0, FSDP_INIT_ZEROS, 0, 0, FSDP_TP_REPLICATE)                 \
    X(QKVW, qkvw, "attn.c_attn.weight", 3, 1, FSDP_INIT_NORMAL, STD, 1, FSDP_TP_COLWISE)       \
    X(QKVB, qkvb, "attn.c_attn.bias", 3, 0, FSDP_INIT_ZEROS, 0, 0, FSDP_TP_COLWISE)            \
    X(ATTPROJW, attprojw, "attn.c_proj.weight", 1, 1, FSDP_INIT_NORMAL, RES, 1, FSDP_TP_ROWWISE) \
    X(ATTPROJB, attprojb, "attn.c_proj.bias", 1, 0, FSDP_INIT_ZEROS, 0, 0, FSDP_TP_REPLICATE)  \
    X(LN2W, ln2w, "ln_2.weight", 1, 0, FSDP_INIT_ONES, 0, 0, FSDP_TP_REPLICATE)                \
    X(LN2B, ln2b, "ln_2.bias", 1, 0, FSDP_INIT_ZEROS, 0, 0, FSDP_TP_REPLICATE)                 \
    X(FCW, fcw, "mlp.c_fc.weight", 4, 1, FSDP_INIT_NORMAL, STD, 1, FSDP_TP_COLWISE)            \
    X(FCB, fcb, "mlp.c_fc.bias", 4, 0, FSDP_INIT_ZEROS, 0, 0, FSDP_TP_COLWISE)                 \
    X(FCPROJW, fcprojw, "mlp.c_proj.weight", 1, 4, FSDP_INIT_NORMAL, RES, 1, FSDP_TP_ROWWISE)  \
    X(FCPROJB, fcprojb, "mlp.c_proj.bias", 1, 0, FSDP_INIT_ZEROS, 0, 0, FSDP_TP_REPLICATE)

enum fsdp_gpt2_block_tensor {
#define FSDP_GPT2_X(id, field, suffix, rows, cols, init, std, decay, tp) FSDP_GPT2_BLK_##id,
    FSDP_GPT2_BLOCK_TENSORS(FSDP_GPT2_X)
#undef FSDP_GPT2_X
    FSDP_GPT2_BLK_COUNT,
};

/* The registration: name "gpt2", the config attributes, presets, ops. */
extern const struct fsdp_arch fsdp_gpt2_arch;

/* The config of a GPT-2 spec (spec->arch must be fsdp_gpt2_arch). */
static inline const struct fsdp_gpt2_config *fsdp_gpt2_cfg(const struct fsdp_model_spec *s)
{
    return (const struct fsdp_gpt2_config *)s->cfg;
}

/* Named presets: tiny, bench-small, gpt2, gpt2-medium, gpt2-large, gpt2-xl. */
int fsdp_gpt2_preset(const char *name, struct fsdp_gpt2_config *out);
/* Checks ranges and divisibility; error names the field. */
int fsdp_gpt2_config_validate(const struct fsdp_gpt2_config *c);
int fsdp_gpt2_spec_create(const struct fsdp_gpt2_config *c, struct fsdp_model_spec **out);

#endif
