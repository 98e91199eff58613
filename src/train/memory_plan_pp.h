/*
 * memory_plan_pp.h - --print-memory's plan of one pipeline rank
 * (memory_plan_pp.c): its sharding engine as pipeline.c builds it for its
 * stages, and what the pipeline engine adds beside it.
 */
#ifndef FSDP_TRAIN_MEMORY_PLAN_PP_H
#define FSDP_TRAIN_MEMORY_PLAN_PP_H

#include "train/trainer.h"
#include "parallel/fsdp.h"
#include "optim/optim.h"

struct fsdp_device;
struct fsdp_model_spec;

struct fsdp_plan_pp {
    int P, V, M;                 /* pipeline ranks, stages per rank, micro-batches */
    int rank, lo, hi;            /* pipeline rank; its first stage's units [lo, hi] */
    struct fsdp_shard_shape sh;  /* its dp and tp coordinates */
    struct fsdp_engine_stats st; /* its sharding engine, chunk 0's model */
    size_t act, saved;      /* the other instances (every chunk's activation sets but the parts'
                               model's): activations and workspace, of it saved */
    size_t bound;           /* forwards in flight at most (the schedule's) */
    int sets;               /* activation sets (model instances) of all its chunks */
    size_t n_held, n_grads; /* received stage inputs and output gradients held at most */
    size_t inputs, grads; /* their buffers: n x B T C f32 (1/tp of it with sequence parallelism) */
    int n_sends;          /* send slots: one per direction the rank sends in (0..2) */
    size_t sends;         /* their buffers: n_sends x B T C f32 */
    size_t tie;           /* a tied head: the other copy's gradient shard (stage 0, last) */
    size_t unit;          /* world rank 0: the largest unit whole, for --out and saves */
};

/* Pipeline rank r of P at (sh.dp_rank, sh.tp_rank) with the split first
 * (P V + 1) into *out; nothing allocated beyond bookkeeping. */
int fsdp_train_plan_pp(const struct fsdp_model_spec *spec, const struct fsdp_train_config *c,
                       const int *first, int P, int r, const struct fsdp_shard_shape *sh,
                       struct fsdp_device *dev, const struct fsdp_optim_config *oc,
                       const struct fsdp_shard_config *sc, struct fsdp_plan_pp *out);

/* Everything the rank holds from the first step on, the batches left out. */
size_t fsdp_plan_pp_total(const struct fsdp_plan_pp *p);

#endif
