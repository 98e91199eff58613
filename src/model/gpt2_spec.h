/*
 * gpt2_spec.h - GPT-2 architecture config and the table of its parameters:
 * names, shapes, which unit owns them, where they sit in the unit's
 * contiguous buffer, how they are initialised and whether weight decay
 * applies. The model file, the kernels and the sharding engine all read this
 * one table; nothing else lists parameters.
 *
 * Units (what the sharding engine gathers and reduces as one buffer):
 *   unit 0          wte.weight (V, C), wpe.weight (T, C)
 *   unit 1 + l      block l: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj
 *   unit 1 + L      ln_f (+ lm_head.weight (V, C) when embeddings are untied)
 * Weights are stored as (out_features, in_features) like torch.nn.Linear.
 */
#ifndef FSDP_MODEL_GPT2_SPEC_H
#define FSDP_MODEL_GPT2_SPEC_H

#include <stddef.h>

#define FSDP_PARAM_NAME_MAX 48

struct fsdp_gpt2_config {
    int vocab_size; /* V */
    int context;    /* maximum sequence length T */
    int n_layer;    /* L */
    int n_head;     /* NH */
    int n_embd;     /* C, divisible by NH */
    float ln_eps;   /* layer-norm epsilon (1e-5) */
    int tied;       /* 1: the LM head reuses wte.weight */
};

enum fsdp_init_kind {
    FSDP_INIT_NORMAL = 0, /* N(0, std) */
    FSDP_INIT_ZEROS,
    FSDP_INIT_ONES,
};

struct fsdp_param_spec {
    char name[FSDP_PARAM_NAME_MAX]; /* "h.3.attn.c_attn.weight" */
    int unit;                       /* owning unit */
    int ndim;                       /* 1 or 2 */
    size_t shape[2];                /* (rows, cols); cols = 1 when ndim == 1 */
    size_t numel;
    size_t offset;                  /* element offset inside the unit buffer */
    int decay;                      /* weight decay applies (2-D matmul weights only) */
    enum fsdp_init_kind init;
    float std;                      /* for FSDP_INIT_NORMAL */
};

struct fsdp_gpt2_spec {
    struct fsdp_gpt2_config cfg;
    int n_units;                     /* L + 2 */
    size_t n_params;                 /* entries in params */
    struct fsdp_param_spec *params;  /* (n_params,) in unit order */
    size_t *unit_numel;              /* (n_units,) elements per unit */
    size_t *unit_first;              /* (n_units,) index of the unit's first param */
    size_t total_numel;
};

/* Named presets: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl. */
int fsdp_gpt2_preset(const char *name, struct fsdp_gpt2_config *out);
/* Checks ranges and divisibility; error names the field. */
int fsdp_gpt2_config_validate(const struct fsdp_gpt2_config *c);
int fsdp_gpt2_spec_create(const struct fsdp_gpt2_config *c, struct fsdp_gpt2_spec **out);
void fsdp_gpt2_spec_destroy(struct fsdp_gpt2_spec *s);
/* Elements of the spec's largest parameter (at least 1): one tensor's buffer. */
size_t fsdp_gpt2_spec_largest(const struct fsdp_gpt2_spec *s);
/* Index of the parameter called name, or -1. */
long fsdp_gpt2_spec_find(const struct fsdp_gpt2_spec *s, const char *name);

#endif
