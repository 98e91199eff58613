/*
 * mlp_model.h - "mlp", a small residual-MLP language model that lives only
 * in the tests: a second architecture behind the model interface
 * (src/model/model.h), registered at run time, so that io, the sharding
 * engine and the trainers can be checked on a model that is not GPT-2.
 *
 *   x_0     = wte[token] + wpe[t]                                 unit 0
 *   x_{l+1} = x_l + fc2_l relu(fc1_l x_l + b1_l) + b2_l           unit 1 + l
 *   logits  = x_L lm_head^T + lm_head.bias                        unit L + 1
 *
 * Tied, the head reads wte (a tie on unit 0) and keeps only its bias, so
 * no unit is ever empty. Loss: cross-entropy, mean over targets != -1.
 * Plain C, sums in double; nothing here may be used by the library. On a
 * device (opts.dev) the unit buffers are device memory: a unit's
 * parameters (and gradients) are copied to host copies before it computes
 * and its gradients back after, so the guarded device trains it too.
 */
#ifndef FSDP_TESTS_MLP_MODEL_H
#define FSDP_TESTS_MLP_MODEL_H

#include "core/hf_map.h"
#include "core/spec.h"

#define FSDP_TEST_MLP_ARCH "mlp"

struct fsdp_test_mlp_config {
    int vocab_size; /* V */
    int context;    /* T: longest sequence, rows of wpe */
    int n_embd;     /* C */
    int n_hidden;   /* H: width of each block's hidden layer */
    int n_layer;    /* L: residual blocks */
    int tied;       /* 1: the head is wte */
};

extern const struct fsdp_arch fsdp_test_mlp_arch;
/* Its Hugging Face-style map (mlp_hf.c): model_type "mlp_lm". */
extern const struct fsdp_hf_map fsdp_test_mlp_hf;

/* Registers "mlp" with fsdp_model_register; again is a no-op. */
int fsdp_test_mlp_register(void);

#endif
