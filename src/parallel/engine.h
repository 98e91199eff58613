/*
 * engine.h - what the training loop asks of whoever holds the model state.
 *
 * An engine owns parameters, gradients and optimizer state (whole or
 * sharded) and runs one global optimizer step as one call: K micro-batches
 * of forward and backward, the gradient reduction over data-parallel ranks,
 * the global-norm clip and the optimizer update. It sees batch arrays, never
 * a data loader, and never opens a file: the training layer reads and
 * writes its state through row ranges (pieces), so model files and
 * checkpoints stay io's business. The sharding engine (fsdp.h) is the
 * production engine; with a pp dimension the pipeline engine (pp_engine.h)
 * drives one per rank's stages behind the same table; tests/ holds a
 * single-rank oracle with the same table.
 *
 * Ops are written out longhand; members are only ever added at the end.
 * Every op marked collective is called by every rank of the engine, in order.
 */
#ifndef FSDP_PARALLEL_ENGINE_H
#define FSDP_PARALLEL_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/spec.h"

/* K micro-batches of this rank's slice of the global batch. */
struct fsdp_batch {
    int K, B, T;
    const int32_t *inputs;  /* (K, B, T) token ids; NULL: no batch on this rank */
    const int32_t *targets; /* (K, B, T) next-token ids */
};

/* What one optimizer step reports. */
struct fsdp_step_result {
    double loss;       /* mean cross-entropy over every token of the global batch */
    double grad_norm;  /* global L2 norm of the averaged gradient, before clipping; NaN: skipped */
    double clip_coef;  /* factor the gradient was scaled by (1: not clipped) */
    double loss_scale; /* f16 loss scale the step's backward used; 0: no loss scaling */
};

/*
 * A block of one tensor of the state this rank holds: kind 0 is the
 * parameter itself (f32 master), kind 1 .. n_state the optimizer's state
 * (AdamW: exp_avg, exp_avg_sq). Rows [row0, row0 + rows) and columns
 * [col0, col0 + cols) of parameter `param` (an index of the engine's spec,
 * the whole table), rows * cols floats at data, row-major. Without tensor
 * parallelism a piece is whole rows (col0 0, cols shape[1]); with it a
 * column-parallel weight's pieces are 2-D blocks. cols 0 means shape[1]
 * (engines that never cut columns may leave col0 and cols zero).
 */
struct fsdp_state_piece {
    int kind;
    size_t param;
    size_t row0, rows;
    float *data;
    size_t col0, cols;
    int copy; /* 1: another rank holds and writes the same block (a parameter that
                 tensor parallelism replicates, on tp ranks other than 0) */
    int host; /* 1: data is pinned host memory (state an engine offloads), 0: device
                 memory; either way the device's copies reach it (device.h copy) */
};

/* The columns a piece covers (cols 0: every column of shape[1]). */
static inline size_t fsdp_state_piece_cols(const struct fsdp_state_piece *pc, size_t shape1)
{
    return pc->cols ? pc->cols : shape1;
}

/* Optimizer and loss-scaler counters, saved with checkpoints. */
struct fsdp_engine_counters {
    long opt_step;         /* optimizer updates taken */
    double loss_scale;     /* current loss scale (1: off) */
    long scale_good_steps; /* finite steps since the scale last changed */
    long skipped_steps;    /* steps skipped on overflow */
};

struct fsdp_engine;

struct fsdp_engine_ops {
    size_t size; /* sizeof(struct fsdp_engine_ops) of the implementation */
    const char *name;
    /*
     * Collective. One global step at learning rate lr over b (b->inputs NULL:
     * this rank has no batch this step and only takes part in the
     * collectives, as a joined rank does). n_contrib of the engine's data-parallel ranks have
     * a batch; the loss and the gradient are means over their tokens.
     * A non-finite gradient norm without dynamic loss scaling is an error
     * and leaves the parameters untouched.
     */
    int (*step)(struct fsdp_engine *e, const struct fsdp_batch *b, double lr, int n_contrib,
                struct fsdp_step_result *out);
    /* Collective. Mean loss of the current parameters over every rank's
     * (B, T) batch. */
    int (*eval)(struct fsdp_engine *e, const int32_t *inputs, const int32_t *targets,
                double *loss);
    /* The pieces of state this rank holds, enumerated 0 .. n_pieces-1 in
     * (kind, parameter) order; a piece's data may be written (load), after
     * which state_changed must be called before the next step. */
    size_t (*n_pieces)(const struct fsdp_engine *e);
    void (*piece)(struct fsdp_engine *e, size_t k, struct fsdp_state_piece *out);
    /* Collective. Drops whatever was derived from the state (gathered copies). */
    int (*state_changed)(struct fsdp_engine *e);
    /* Collective. Unit u's parameters, whole, in its layout (spec offsets);
     * valid until the next call of any op. */
    int (*gather_unit)(struct fsdp_engine *e, int u, const float **full);
    void (*get_counters)(const struct fsdp_engine *e, struct fsdp_engine_counters *c);
    void (*set_counters)(struct fsdp_engine *e, const struct fsdp_engine_counters *c);
    /* One line for the run header. */
    void (*describe)(const struct fsdp_engine *e, char *buf, size_t len);
    void (*destroy)(struct fsdp_engine *e);
    /*
     * Optional (NULL: the pieces are whole rows, shard `shard`'s of a
     * checkpoint of n_shards). Collective. Tensor `kind` of parameter
     * `param`, rows fsdp_split_even(shape[0], n_shards, shard), every
     * column, into out: the state of an engine whose pieces are not whole
     * rows (tensor parallelism's blocks) re-laid out as the rows a
     * checkpoint shard holds. Every rank calls it for every tensor in the
     * same order; out (room for the rows) may be NULL on a rank that does
     * not write (only takes part).
     */
    int (*save_rows)(struct fsdp_engine *e, int kind, size_t param, float *out);
};

struct fsdp_engine {
    const struct fsdp_engine_ops *ops;
    const struct fsdp_model_spec *spec; /* borrowed: outlives the engine */
    double flops_per_token;             /* training FLOPs per token at the engine's (B, T) */
    int n_state;                        /* optimizer state tensors per parameter */
    const char *const *state_names;     /* (n_state,) "exp_avg", "exp_avg_sq" */
    int shard, n_shards;                /* this rank's row shard, of how many (checkpoints) */
    int writes_state;                   /* this rank writes its shard (first replica) */
    void *impl;
    int blocks;                         /* 1: pieces are blocks that are not whole rows
                                           (tensor parallelism): checkpoint shards are
                                           written through save_rows */
};

#endif
