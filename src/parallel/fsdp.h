/*
 * fsdp.h - the sharding engine: PyTorch FSDP2 fully_shard semantics over the
 * units of any model's parameter table (core/spec.h), behind the engine
 * table (engine.h).
 *
 * Every parameter is sharded on dim 0 over the shard group (mesh dimension
 * "dp"): its rows are split as evenly as possible, and a rank's shard of a
 * unit is its rows of each of the unit's parameters, packed one after the
 * other and zero-padded to the longest rank's length, so that one
 * all-gather per unit brings every rank's rows. A rank keeps only its f32
 * master shard, its gradient shard and the optimizer state of that shard. A
 * unit's parameters are all-gathered before its forward and again before
 * its backward (with prefetch), its gradient is reduce-scattered right
 * after its backward, and with a replicate dimension ("rdp") the gradient
 * shard is then all-reduced over the replicas (HSDP). With tensor
 * parallelism (a tp plan, tp/tp_plan.h: the model cut Megatron-style) the
 * engine does all of this to the rank's tp-local table, each slice sharded
 * over dp (2-D sharding), sums the gradient norm over tp as well, and
 * reports its state as blocks of the whole tensors. doc/sharding.md
 * describes the schedule, the precision policy, loss scaling, tensor
 * parallelism and the memory accounting.
 *
 * The engine applies sharding and nothing else. The training layer builds
 * the mesh, the tensor-parallel plan, the model (tp applied, activation
 * checkpointing applied) and the optimizer, and hands them over as parts
 * (struct fsdp_shard_parts) with the groups; it opens no file and reads no
 * data: the parameters arrive through the engine's state pieces.
 */
#ifndef FSDP_PARALLEL_FSDP_H
#define FSDP_PARALLEL_FSDP_H

#include <stdbool.h>
#include <stddef.h>

#include "core/dtype.h"
#include "parallel/engine.h"
#include "comm/counts.h"

struct fsdp_group;
struct fsdp_device;
struct fsdp_model;
struct fsdp_optimizer;
struct fsdp_tp;
struct fsdp_tp_plan;

enum fsdp_sharding {
    FSDP_SHARD_FULL = 0, /* order matches the choice string "full|grad-op|none" */
    FSDP_SHARD_GRAD_OP,  /* params kept gathered from forward to backward (ZeRO-2) */
    FSDP_SHARD_NONE,     /* full replica on every rank, gradients all-reduced (DDP) */
};

/* Where the optimizer's state lives (FSDP2's CPUOffloadPolicy, ZeRO-Offload). */
enum fsdp_offload {
    FSDP_OFFLOAD_NONE = 0,     /* order matches the choice string "none|optim|params,optim" */
    FSDP_OFFLOAD_OPTIM,        /* AdamW moments in pinned host memory, AdamW on the host over
                                  staged copies of the gradient and master shards */
    FSDP_OFFLOAD_PARAMS_OPTIM, /* the f32 master too: the host's copy is the master, the
                                  device keeps the parameter shard the all-gathers send */
};

struct fsdp_shard_config {
    int B, T;                     /* micro-batch of this rank */
    enum fsdp_sharding sharding;
    bool reshard_after_forward;   /* free gathered params after each unit's forward */
    int prefetch;                 /* units gathered ahead of the one computing (0: no overlap) */
    enum fsdp_dtype param_dtype;  /* all-gather and compute-input dtype: f32, bf16, f16 */
    enum fsdp_dtype reduce_dtype; /* reduce-scatter dtype: f32, bf16, f16 */
    bool loss_scale_dynamic;
    double loss_scale;            /* static scale (or the initial dynamic scale); 0: none */
    bool no_sync_accum;           /* keep full gradients until the last micro-batch */
    /* Applied to the model by whoever builds the parts (the engine only
     * reports activation checkpointing in its describe line): */
    bool activation_checkpointing; /* recompute every block in its backward */
    int lm_head_chunk;            /* rows per output-head chunk (0: the model's default) */
    bool sequence_parallel;       /* with tp: norms and residuals hold 1/tp of the rows */
    enum fsdp_offload offload;    /* optimizer state (and master) in pinned host memory */
    /* A pipeline stage (pp_engine.h): the engine holds state for units
     * [unit_lo, unit_hi] only (every other unit has no rows on this rank)
     * and its micro-batch passes run over them; unit_hi 0: every unit. */
    int unit_lo, unit_hi;
    /* Interleaved stages: the units held, (n_units,) 1 each (borrowed for
     * the create); NULL: [unit_lo, unit_hi]. Passes then run over the range
     * the driver sets. */
    const unsigned char *unit_mask;
    enum fsdp_dtype act_dtype;    /* storage of saved activations: f32, bf16 (model.h) */
};

/* The defaults: full sharding, reshard after forward, prefetch 1, f32. */
void fsdp_shard_config_init(struct fsdp_shard_config *sc);

/* The groups the engine works over (from the mesh). */
struct fsdp_shard_groups {
    struct fsdp_group *dp;  /* shard dimension; NULL: one rank */
    struct fsdp_group *rdp; /* replicate dimension; NULL: none */
    int world_rank;         /* for logs: rank 0 reports */
    const char *mesh;       /* "rdp=2,dp=2" or "single rank", for describe */
    const char *backends;   /* "dp=tcp", for describe */
};

/*
 * What the training layer built before sharding, handed to the engine.
 * Everything is borrowed: the caller created it, keeps it until the engine
 * is destroyed, and destroys it after the engine, in the reverse order of
 * its creation. The model's table (`table`) is the tp-local one with a
 * plan, else spec; the optimizer is over the same table.
 *
 * The engine applies sharding to the model: it asks it to take unit 0 by
 * rows over the shard group (set_unit_rows, before anything is reserved),
 * reserves its activations and binds its units to the engine's slots; from
 * then on the model is used only through the engine. The optimizer's step
 * count and state names become the engine's (counters, state pieces).
 */
struct fsdp_shard_parts {
    const struct fsdp_model_spec *spec; /* the whole parameter table: files and checkpoints */
    const struct fsdp_tp_plan *plan;    /* tensor parallelism; NULL: none */
    struct fsdp_tp *tp;                 /* the tp operators' context the model was created
                                           with (its group is the engine's tp group); NULL:
                                           one rank, no tensor parallelism */
    struct fsdp_model *model;           /* on `table`, sized for (B, T) of the shard config, not
                                           yet reserved */
    struct fsdp_optimizer *opt;         /* over `table` */
};

/* The table the parts compute: the plan's tp-local one, else the whole one. */
const struct fsdp_model_spec *fsdp_shard_parts_table(const struct fsdp_shard_parts *p);

/*
 * The sharding engine for the parts p over g's groups (and p->tp's group),
 * on device dev (borrowed; the one the parts were made on). Every group's
 * backend must take the device's memory (refused with one line naming the
 * backend otherwise). Allocates every buffer the steps will use; the
 * parameters are zero until the caller writes the pieces of kind 0 and
 * calls state_changed. Collective over the groups' ranks. The parts are not
 * the engine's: destroy them after it (fsdp_shard_parts above).
 */
int fsdp_shard_engine_create(const struct fsdp_shard_parts *p, const struct fsdp_shard_groups *g,
                             struct fsdp_device *dev, const struct fsdp_shard_config *sc,
                             struct fsdp_engine **out);

/* True when e is a sharding engine. */
int fsdp_shard_engine_is(const struct fsdp_engine *e);

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
    /* What each rank's collectives moved since creation (tp/tp_ops.h:
     * calls, payload, ring wire bytes per kind): the units' all-gathers and
     * reduce-scatters over dp and all-reduces over the replicas; the tp
     * operators; the model's own exchanges (unit 0 by rows). */
    struct fsdp_comm_counts fsdp_comm, tp_comm, model_comm;
    size_t act_saved_bytes; /* of act_bytes, the activations saved for the backward (the rest:
                               activation gradients and scratch) */
    size_t ckpt_bytes;     /* allocated at the first checkpoint and held from then on (with
                              tensor parallelism: a whole tensor re-laid out as rows); 0: none */
    size_t gather_bytes;   /* allocated while the final model file is written, one unit at a
                              time (the largest unit gathered whole); 0: none */
    int shards, replicas;  /* the shard group's size and the number of replicas */
    /* With offload (fsdp_shard_config.offload) state_bytes counts the
     * device's shards only (parameter and gradient: 8 bytes per element;
     * 6 under params,optim with a 16-bit param dtype, the parameters
     * being the all-gathers' send in that dtype)
     * and host_bytes the pinned host memory: AdamW moments and the staged
     * gradient and master shards (16 bytes per element); 0 without. */
    size_t host_bytes;
    int offload; /* enum fsdp_offload */
};
void fsdp_shard_engine_stats(const struct fsdp_engine *e, struct fsdp_engine_stats *st);
/* The memory line the engine logs at create (FSDPC_LOG=info), from st. */
void fsdp_shard_memory_line(const struct fsdp_engine_stats *st, char *buf, size_t len);

/* The shape of one rank's place in a mesh, for planning: the sizes of the
 * engine's dimensions (1: absent) and the rank's coordinates in dp and tp
 * (tp and tp_rank: the parts' plan's, checked). */
struct fsdp_shard_shape {
    int dp, rdp, tp;
    int dp_rank, tp_rank;
};

/*
 * What fsdp_shard_engine_create would hold for the parts p on the rank of
 * shape sh, without allocating it, communicating or needing any other rank:
 * the byte fields of *out (the timings and counters zero), sized exactly as
 * the engine sizes them, so that a model of any size can be planned for a
 * mesh of any size on one process (fsdpc-train --print-memory). The parts
 * are made for sh's tp rank (their tp group may be a shape only: a struct
 * fsdp_group with its size and rank, never called); their model is sized,
 * never reserved. dev supplies the memory kind and kernels only.
 */
int fsdp_shard_engine_plan(const struct fsdp_shard_parts *p, const struct fsdp_shard_shape *sh,
                           struct fsdp_device *dev, const struct fsdp_shard_config *sc,
                           struct fsdp_engine_stats *out);

#endif
