/*
 * parts.c - the parts the parallelisms apply to (parts.h): the
 * tensor-parallel plan and context, the model on its table, activation
 * checkpointing and the optimizer, built in that order and destroyed in
 * reverse; and the sharding engine's plan over parts built for one rank.
 */
#include "config.h"
#include "train/parts.h"
#include "comm/group.h"
#include "model/model.h"
#include "core/error.h"

#include <stdlib.h>

/* Step 1: the plan over tp (more than one rank) and the operators' context. */
static int parts_apply_tp(struct fsdp_train_parts *p, const struct fsdp_model_spec *spec,
                          struct fsdp_group *tp, struct fsdp_device *dev,
                          const struct fsdp_shard_config *sc)
{
    if (tp && tp->size > 1) {
        FSDP_CHECK(
            fsdp_tp_plan_create(spec, tp->size, tp->rank, fsdp_model_tp_cut_of(spec), &p->plan));
    }
    fsdp_tp_init(&p->tp, p->plan ? tp : NULL, sc->sequence_parallel, dev);
    if (p->tp.sp && sc->T % p->tp.size != 0) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "seq-len %d is not divisible by tp %d: with sequence "
                        "parallelism each tp rank holds 1/%d of every sequence "
                        "(--sequence-parallel off keeps them whole)",
                        sc->T, p->tp.size, p->tp.size);
    }
    return 0;
}

int fsdp_train_parts_create(const struct fsdp_model_spec *spec, struct fsdp_group *tp,
                            struct fsdp_device *dev, const struct fsdp_optim_config *oc,
                            const struct fsdp_shard_config *sc, struct fsdp_train_parts **out)
{
    int rc = 0;
    *out = NULL;
    struct fsdp_train_parts *p = calloc(1, sizeof(*p));
    if (!p) {
        return fsdp_err(FSDP_ERR_NOMEM, "the model's parts");
    }
    FSDP_CHECK_GOTO(parts_apply_tp(p, spec, tp, dev, sc), rc, err);
    const struct fsdp_model_spec *table = p->plan ? p->plan->local : spec;
    /* 2. the model on its table, with the tp operators' context */
    struct fsdp_model_opts mo = fsdp_train_parts_model_opts(p, sc, dev);
    FSDP_CHECK_GOTO(fsdp_model_create(table, &mo, &p->model), rc, err);
    /* 3. activation checkpointing: every block */
    if (sc->activation_checkpointing) {
        FSDP_CHECK_GOTO(p->model->ops->set_checkpoint(p->model, -1, 1), rc, err);
    }
    /* 4. the optimizer over the same table */
    fsdp_adamw_init(&p->opt, oc, table, dev);
    p->shard = (struct fsdp_shard_parts){
        .spec = spec, .plan = p->plan, .tp = &p->tp, .model = p->model, .opt = &p->opt};
    *out = p;
    return 0;
err:
    fsdp_train_parts_destroy(p);
    return rc;
}

void fsdp_train_parts_destroy(struct fsdp_train_parts *p)
{
    if (!p) {
        return;
    }
    /* the optimizer and the tp context hold nothing to free */
    fsdp_model_destroy(p->model);
    fsdp_tp_plan_destroy(p->plan);
    free(p);
}

int fsdp_train_parts_plan(const struct fsdp_model_spec *spec, const struct fsdp_shard_shape *sh,
                          struct fsdp_device *dev, const struct fsdp_optim_config *oc,
                          const struct fsdp_shard_config *sc, struct fsdp_engine_stats *out)
{
    /* a tp group that is only a shape: the plan reads its size and rank */
    struct fsdp_group tp = {.name = "tp", .size = sh->tp, .rank = sh->tp_rank};
    struct fsdp_train_parts *p;
    FSDP_CHECK(fsdp_train_parts_create(spec, &tp, dev, oc, sc, &p));
    int rc = fsdp_shard_engine_plan(&p->shard, sh, dev, sc, out);
    fsdp_train_parts_destroy(p);
    return rc;
}

struct fsdp_model_opts fsdp_train_parts_model_opts(struct fsdp_train_parts *p,
                                                   const struct fsdp_shard_config *sc,
                                                   struct fsdp_device *dev)
{
    struct fsdp_model_opts mo = {.max_B = sc->B,
                                 .max_T = sc->T,
                                 .head_chunk = sc->lm_head_chunk,
                                 .dev = dev,
                                 .tp = p->plan ? &p->tp : NULL,
                                 .act_dtype = sc->act_dtype};
    return mo;
}
