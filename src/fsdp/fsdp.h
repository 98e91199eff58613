/*
 * fsdp.h - the sharding engine: PyTorch FSDP2 fully_shard semantics over
 * the GPT-2 units of gpt2_spec.h, behind the training loop's engine table
 * (train/engine.h).
 *
 * Every parameter is sharded on dim 0 over the shard group (mesh dimension
 * "dp"): its rows are split as evenly as possible, and a rank's shard of a
 * unit is its rows of each of the unit's parameters, packed one after the
 * other and zero-padded to the longest rank's length, so that one
 * all-gather per unit brings every rank's rows. A rank keeps only its f32
 * master shard, its gradient shard and the AdamW moments of that shard. A
 * unit's parameters
 * are all-gathered before its forward and again before its backward (with
 * prefetch), its gradient is reduce-scattered right after its backward, and
 * with a replicate dimension ("rdp") the gradient shard is then all-reduced
 * over the replicas (HSDP). doc/sharding.md describes the schedule, the
 * precision policy, loss scaling and the memory accounting.
 */
#ifndef FSDP_FSDP_FSDP_H
#define FSDP_FSDP_FSDP_H

#include <stddef.h>

#include "core/dtype.h"
#include "train/engine.h"

struct fsdp_dist;

enum fsdp_sharding {
    FSDP_SHARD_FULL = 0, /* order matches the choice string "full|grad-op|none" */
    FSDP_SHARD_GRAD_OP,  /* params kept gathered from forward to backward (ZeRO-2) */
    FSDP_SHARD_NONE,     /* full replica on every rank, gradients all-reduced (DDP) */
};

struct fsdp_engine_config {
    const char *mesh;          /* "dp=4", "rdp=2,dp=2"; NULL or "": dp=<world size> */
    const char *backend;       /* mesh.h backend spec; NULL or "": the default */
    enum fsdp_sharding sharding;
    int reshard_after_forward; /* 1: free gathered params after each unit's forward */
    int prefetch;              /* units gathered ahead of the one computing (0: no overlap) */
    enum fsdp_dtype param_dtype;  /* all-gather and compute-input dtype: f32, bf16, f16 */
    enum fsdp_dtype reduce_dtype; /* reduce-scatter dtype: f32, bf16, f16 */
    int loss_scale_dynamic;    /* 1: dynamic loss scaling */
    double loss_scale;         /* static scale (or the initial dynamic scale); 0: none */
    int no_sync_accum;         /* 1: keep full gradients until the last micro-batch */
    int activation_checkpointing; /* 1: recompute every block in its backward */
    int lm_head_chunk;         /* rows per LM-head chunk (0: the model's default) */
};

/* The defaults: full sharding, reshard after forward, prefetch 1, f32. */
void fsdp_engine_config_init(struct fsdp_engine_config *ec);

/*
 * Creates the sharding engine over the ranks of d: builds the mesh, reads
 * this rank's shard of every unit from model_path, allocates every buffer
 * the steps will use. Collective over the world.
 */
int fsdp_shard_engine_create(struct fsdp_dist *d, const char *model_path, int B, int T,
                             const struct fsdp_optim_config *oc,
                             const struct fsdp_engine_config *ec, struct fsdp_train_engine **out);

/* One line for the run header: mesh, backends, sharding, prefetch, dtypes. */
void fsdp_shard_engine_describe(const struct fsdp_train_engine *e, char *buf, size_t len);

/* True when e is a sharding engine. */
int fsdp_shard_engine_is(const struct fsdp_train_engine *e);

/* What the engine measured and holds, for reports. */
struct fsdp_engine_stats {
    double comm_total_s;   /* sum over collectives of issue-to-completion time */
    double comm_exposed_s; /* time the compute thread spent blocked waiting */
    size_t state_bytes;    /* master, gradient and AdamW shards: 16 bytes per element */
    size_t gathered_bytes; /* gathered parameter buffers (root + prefetch ring) */
    size_t model_bytes;    /* model states: state_bytes + gathered_bytes */
    size_t grad_bytes;     /* unsharded gradient buffers (reduce-scatter inputs) */
    size_t comm_bytes;     /* packing scratch and the slots' padding for the collectives */
    size_t act_bytes;      /* activations and activation gradients */
    size_t peak_bytes;     /* all of the above: allocated once, held throughout */
    long skipped_steps;    /* steps skipped by loss scaling */
    double loss_scale;     /* current loss scale (1 when off) */
};
void fsdp_shard_engine_stats(const struct fsdp_train_engine *e, struct fsdp_engine_stats *st);

#endif
