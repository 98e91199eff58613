/*
 * parts.h - what the trainer builds on the mesh and the device before it
 * shards anything, and hands the sharding engine (parallel/fsdp.h, struct
 * fsdp_shard_parts), each step through its own layer's interface, in order:
 *
 *   1. tensor parallelism   the plan that cuts the parameter table over the
 *                           tp group (tp/tp_plan.h; tp > 1 only) and the
 *                           operators' context on that group (tp/tp_ops.h)
 *   2. the model            an instance on the tp-local table (the whole one
 *                           without tp), with the operators' context
 *                           (model.h), sized for the micro-batch
 *   3. activation           every block recomputed in its backward
 *      checkpointing        (set_checkpoint), when asked for
 *   4. the optimizer        AdamW over the same table (optim/optim.h)
 *
 * Sharding comes next (fsdp_shard_engine_create on parts->shard). The
 * trainer, the memory plan (--print-memory) and the device's reservation
 * build them here, so that every one sizes what a run holds. Whoever
 * creates the parts destroys them after the engine made from them;
 * fsdp_train_parts_destroy undoes the steps in reverse.
 */
#ifndef FSDP_TRAIN_PARTS_H
#define FSDP_TRAIN_PARTS_H

#include "parallel/fsdp.h"
#include "tp/tp_ops.h"
#include "tp/tp_plan.h"
#include "optim/optim.h"

struct fsdp_group;
struct fsdp_device;
struct fsdp_model;

struct fsdp_train_parts {
    struct fsdp_tp_plan *plan;     /* NULL without tensor parallelism */
    struct fsdp_tp tp;             /* the operators' context: one rank without a plan */
    struct fsdp_model *model;      /* on the plan's tp-local table, else the whole one */
    struct fsdp_optimizer opt;     /* over the model's table */
    struct fsdp_shard_parts shard; /* the above, as the sharding engine takes them */
};

/*
 * The parts for spec (borrowed: it must outlive them) on dev, with tensor
 * parallelism over tp (NULL or size 1: none; when sizing, a group that is
 * only a shape), the micro-batch, head chunk, sequence parallelism and
 * activation checkpointing of sc and the AdamW settings oc. A seq-len that
 * sequence parallelism cannot split, or a tp the architecture cannot be cut
 * into, is one error naming the option.
 */
int fsdp_train_parts_create(const struct fsdp_model_spec *spec, struct fsdp_group *tp,
                            struct fsdp_device *dev, const struct fsdp_optim_config *oc,
                            const struct fsdp_shard_config *sc, struct fsdp_train_parts **out);
void fsdp_train_parts_destroy(struct fsdp_train_parts *p);

/* What a model of p is made with: the micro-batch, head chunk and
 * activation dtype of sc, on dev, with p's tp context. A pipeline rank's
 * further stage models are made with the same. */
struct fsdp_model_opts fsdp_train_parts_model_opts(struct fsdp_train_parts *p,
                                                   const struct fsdp_shard_config *sc,
                                                   struct fsdp_device *dev);

/*
 * What the sharding engine would hold on the rank of shape sh
 * (fsdp_shard_engine_plan), with the parts built for that rank's tp
 * coordinate as a run builds them: nothing allocated beyond the parts'
 * bookkeeping, nothing communicated.
 */
int fsdp_train_parts_plan(const struct fsdp_model_spec *spec, const struct fsdp_shard_shape *sh,
                          struct fsdp_device *dev, const struct fsdp_optim_config *oc,
                          const struct fsdp_shard_config *sc, struct fsdp_engine_stats *out);

#endif
