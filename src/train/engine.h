/*
 * engine.h - what the training loop asks of whoever holds the model state.
 *
 * The loop (trainer.c) owns the schedule, the data, the cadence of logging,
 * validation and saving. An engine owns parameters, gradients and optimizer
 * state, and runs one global optimizer step as one call: the K micro-steps
 * of forward and backward, the gradient reduction over data-parallel ranks,
 * the global-norm clip and the AdamW update. The single-rank engine
 * (engine_local.c) keeps everything whole in one process; the sharding
 * engine implements the same table over sharded state, so the loop does not
 * change when the state is sharded.
 *
 * Ops are written out longhand; members are only ever added at the end.
 * Every op is collective over the engine's ranks (all call it, in order).
 */
#ifndef FSDP_TRAIN_ENGINE_H
#define FSDP_TRAIN_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "optim/optim.h"

struct fsdp_ckpt;
struct fsdp_ckpt_meta;
struct fsdp_dataloader;
struct fsdp_model_spec;


/* What one optimizer step reports. */
struct fsdp_step_result {
    double loss;      /* mean cross-entropy over every token of the global batch */
    double grad_norm; /* global L2 norm of the averaged gradient, before clipping */
    double clip_coef; /* factor the gradient was scaled by (1: not clipped) */
    double loss_scale; /* f16 loss scale the step's backward used; 0: no loss scaling */
};

struct fsdp_train_engine;

struct fsdp_train_engine_ops {
    size_t size; /* sizeof(struct fsdp_train_engine_ops) of the implementation */
    const char *name;
    /*
     * One global step at learning rate lr: K micro-batches, each taken from
     * dl with fsdp_dataloader_next (this rank's slice), loss averaged over
     * them. Blocks until the parameters are updated. A non-finite gradient
     * norm is an error and leaves the parameters untouched.
     */
    int (*step)(struct fsdp_train_engine *e, struct fsdp_dataloader *dl, int K, double lr,
                struct fsdp_step_result *out);
    /* Mean loss of the current parameters over the global batch of dl's next batch. */
    int (*eval)(struct fsdp_train_engine *e, struct fsdp_dataloader *dl, double *loss);
    /* Writes the whole model to path as an HDF5 model file (atomic rename). */
    int (*save)(struct fsdp_train_engine *e, const char *path, const char *created_by);
    void (*destroy)(struct fsdp_train_engine *e);
    /*
     * Writes this rank's rows of every parameter and AdamW moment into
     * dir/shard_<r>.h5 (one writer per shard; replicas write nothing) and,
     * on rank 0, dir/index.h5 with meta plus the engine's own counters.
     * Files are fsynced; dir must exist. Returns this rank's status only:
     * the caller agrees on the outcome (agree_max).
     */
    int (*ckpt_save)(struct fsdp_train_engine *e, const char *dir,
                     const struct fsdp_ckpt_meta *meta);
    /* Replaces parameters, moments and optimizer / loss-scale counters with
     * those of ck, reading only this rank's rows, whatever ck's shard count. */
    int (*ckpt_load)(struct fsdp_train_engine *e, struct fsdp_ckpt *ck);
    /* Element-wise maximum of v[0..n) over every rank of the engine; blocks. */
    int (*agree_max)(struct fsdp_train_engine *e, int32_t *v, int n);
    /*
     * step() when only n_contrib (1 <= n_contrib <= the engine's ranks) of
     * the data-parallel ranks have a batch (join for uneven inputs). dl NULL:
     * this rank has none; it issues the same collectives in the same order
     * with a zero gradient and computes nothing. The loss and the gradient
     * are means over the contributing ranks' tokens only; the optimizer
     * updates every rank's shard as in step().
     */
    int (*step_join)(struct fsdp_train_engine *e, struct fsdp_dataloader *dl, int K, double lr,
                     int n_contrib, struct fsdp_step_result *out);
};

struct fsdp_train_engine {
    const struct fsdp_train_engine_ops *ops;
    const struct fsdp_model_spec *spec; /* the model's parameter table (engine-owned) */
    double flops_per_token;            /* training FLOPs per token at the engine's (B, T) */
    void *impl;
};

/*
 * The single-rank engine: loads model_path, allocates the model for
 * micro-batches of (B, T) (LM head in chunks of head_chunk rows, 0: the
 * model's default) and full-size gradients and AdamW moments.
 */
int fsdp_local_engine_create(const char *model_path, int B, int T, int head_chunk,
                             const struct fsdp_optim_config *oc, struct fsdp_train_engine **out);

/*
 * The averaged gradient of unit u from the last step, before clipping.
 * Layout as the unit's parameter buffer. For tests that compare with a
 * reference.
 */
const float *fsdp_local_engine_grads(const struct fsdp_train_engine *e, int unit);
/* The parameters of unit u. */
const float *fsdp_local_engine_params(const struct fsdp_train_engine *e, int unit);
/* The AdamW first and second moments of unit u, laid out as its parameters. */
void fsdp_local_engine_moments(const struct fsdp_train_engine *e, int unit, const float **m,
                               const float **v);
/* The model the engine drives (its units point at the engine's buffers). */
struct fsdp_gpt2 *fsdp_local_engine_model(const struct fsdp_train_engine *e);

#endif
