/*
 * pipeline.c - the trainer's pipeline-parallel composition (a pp dimension
 * of size > 1 in --mesh): the stage split of the model's layers
 * (parallel/pp_plan.h: --pp-layers, else balanced by parameter state), this
 * rank's stage as a sharding engine over the stage's units and its dp and
 * rdp groups (with a tp dimension: the stage's parts cut over its tp
 * group), and the pipeline engine around it (parallel/pp_engine.h).
 *
 * Mesh order: pp is the outermost dimension (--mesh pp=2,dp=2: ranks 0, 1
 * are stage 0's data-parallel group, ranks 2, 3 stage 1's), as torchtitan
 * lays it out: a stage's dp collectives, which run every layer, stay among
 * neighbouring ranks, and only the stage boundaries' messages cross. Any
 * order works; this is the one the docs recommend.
 */
#include "config.h"
#include "train/trainer.h"
#include "train/trainer_impl.h"
#include "train/parts.h"
#include "train/pipeline.h"
#include "train/memory_plan_pp.h"
#include "comm/group.h"
#include "comm/mesh.h"
#include "compute/device.h"
#include "core/error.h"
#include "model/model.h"
#include "parallel/pp_engine.h"
#include "parallel/pp_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fsdp_train_pp_split(const struct fsdp_model_spec *spec, const struct fsdp_train_config *c,
                        int P, int V, int *first)
{
    const int L = spec->n_units - 2, S = P * V;
    if (c->pp_layers[0]) {
        return fsdp_pp_layers_parse(c->pp_layers, L, S, first);
    }
    double *param = calloc((size_t)L + 1, sizeof(double));
    double *act = calloc((size_t)L + 1, sizeof(double));
    size_t *held = calloc((size_t)S, sizeof(size_t));
    int rc = param && act && held ? 0 : fsdp_err(FSDP_ERR_NOMEM, "pipeline split");
    for (int l = 0; rc == 0 && l < L; l++) {
        param[l] = 16.0 * (double)spec->unit_numel[l + 1];
    }
    for (int s = 0; rc == 0 && s < S; s++) {
        held[s] =
            fsdp_pp_peak_bound((enum fsdp_pp_kind)c->pp_schedule, P, V, (int)c->grad_accum, s % P);
    }
    struct fsdp_pp_costs costs = {
        .L = L,
        .param = param,
        .act = act,
        .first = 16.0 * (double)spec->unit_numel[0],
        .last = 16.0 * (double)spec->unit_numel[L + 1],
    };
    if (rc == 0) {
        rc = fsdp_pp_partition(&costs, S, held, first, NULL);
    }
    free(param);
    free(act);
    free(held);
    return rc;
}

void fsdp_train_pp_units(const int *first, int P, int V, int s, int tied, int n_units,
                         unsigned char *mask, struct fsdp_shard_config *sc)
{
    memset(mask, 0, (size_t)n_units);
    mask[0] = tied && s == P - 1;
    for (int c = 0; c < V; c++) {
        int lo, hi;
        fsdp_pp_stage_units(first, P * V, c * P + s, &lo, &hi);
        for (int u = lo; u <= hi; u++) {
            mask[u] = 1;
        }
    }
    fsdp_pp_stage_units(first, P * V, s, &sc->unit_lo, &sc->unit_hi);
    sc->unit_mask = V > 1 || tied ? mask : NULL;
}

/* The model instances of rank s, chunk after chunk, most[c] of chunk c
 * (one per micro-batch it holds at once): the parts' model first, and
 * instances made like it (activation checkpointing) for the others, each
 * cut at its chunk's units; the pipeline engine reserves them. */
static int pp_models(struct fsdp_trainer *t, const struct fsdp_shard_config *sc, const int *first,
                     int P, int V, int s, const int *most, struct fsdp_model **models)
{
    struct fsdp_train_parts *p = t->parts;
    struct fsdp_model_opts mo = fsdp_train_parts_model_opts(p, sc, t->dev);
    int rc = 0, i = 0;
    models[0] = p->model;
    for (int c = 0; c < V && rc == 0; c++) {
        int lo, hi;
        fsdp_pp_stage_units(first, P * V, c * P + s, &lo, &hi);
        for (int k = 0; k < most[c] && rc == 0; k++, i++) {
            if (i > 0) {
                rc = fsdp_model_create(fsdp_shard_parts_table(&p->shard), &mo, &models[i]);
                if (rc == 0 && sc->activation_checkpointing) {
                    rc = models[i]->ops->set_checkpoint(models[i], -1, 1);
                }
            }
            rc = rc < 0 ? rc : models[i]->ops->set_stage(models[i], lo, hi);
        }
    }
    return rc;
}

/* What a pipeline stage's model must be: able to be cut; a tie only of
 * the head to the embedding (Megatron's: the last stage holds a copy). */
int fsdp_train_pp_check_model(const struct fsdp_model_spec *spec, int P)
{
    const char *arch = spec->arch ? spec->arch->name : "model";
    for (int i = 0; i < spec->n_ties; i++) {
        if (spec->ties[i].owner != 0 || spec->ties[i].user != spec->n_units - 1) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED,
                            "pp=%d: the %s model ties %s of unit %d to "
                            "unit %d; a pipeline takes only the head tied to the embedding",
                            P, arch, spec->params[spec->ties[i].param].name, spec->ties[i].owner,
                            spec->ties[i].user);
        }
    }
    const struct fsdp_model_ops *ops = fsdp_model_ops_of(spec);
    if (ops->size < offsetof(struct fsdp_model_ops, set_stage) + sizeof(ops->set_stage) ||
        !ops->set_stage) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "pp=%d: the %s architecture cannot be cut into "
                        "pipeline stages",
                        P, arch);
    }
    return 0;
}

/* The sharding engine over rank s's stages (units [unit_lo, unit_hi], or
 * the mask of its V stages) and its chunks' instances (most[c] of chunk
 * c), into *inner and models (the caller frees models[1 ..] on failure). */
static int pp_stage_engine(struct fsdp_trainer *t, const int *first, int P, int V, int s,
                           const int *most, struct fsdp_engine **inner, struct fsdp_model **models)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_optim_config oc;
    fsdp_train_config_optim(c, &oc);
    struct fsdp_shard_config sc;
    FSDP_CHECK(fsdp_train_config_shard(c, &sc));
    struct fsdp_shard_groups g = {
        .dp = fsdp_mesh_group(t->mesh, "dp"),
        .rdp = fsdp_mesh_group(t->mesh, "rdp"),
        .world_rank = fsdp_trainer_rank(t),
        .mesh = t->mesh->spec,
        .backends = t->mesh->backends,
    };
    unsigned char *mask = malloc((size_t)t->spec->n_units);
    if (!mask) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline units");
    }
    fsdp_train_pp_units(first, P, V, s, t->spec->n_ties > 0, t->spec->n_units, mask, &sc);
    int rc = fsdp_train_parts_create(t->spec, fsdp_mesh_group(t->mesh, "tp"), t->dev, &oc, &sc,
                                     &t->parts);
    rc = rc < 0 ? rc : pp_models(t, &sc, first, P, V, s, most, models);
    rc = rc < 0 ? rc : fsdp_shard_engine_create(&t->parts->shard, &g, t->dev, &sc, inner);
    free(mask);
    return rc;
}

/* The gradients' group: the pipeline group's ranks and backend again, its
 * staging too, so that a gradient never waits in the activations' queue
 * (pp_comm.h). Collective over pp. */
static int pp_grad_group(struct fsdp_group *pp, struct fsdp_group **out)
{
    char name[64];
    snprintf(name, sizeof(name), "%.50s.grad", pp->name);
    FSDP_CHECK(fsdp_group_create(pp->dist, name, pp->world_ranks, pp->size, pp->ops, out));
    if (pp->stager) {
        int rc = fsdp_group_set_stager(*out, pp->stager);
        if (rc < 0) {
            fsdp_group_destroy(*out);
            *out = NULL;
            return rc;
        }
        fsdp_group_set_stage_chunk(*out, fsdp_group_stage_chunk(pp));
    }
    return 0;
}

/* This pipeline rank's plan as --print-memory makes it (memory_plan_pp.h),
 * reserved where the device keeps an arena (fsdp_trainer_reserve). */
static int pp_reserve(struct fsdp_trainer *t, const int *first, int P, int s)
{
    if (!t->dev->ops->reserve) {
        return 0;
    }
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_shard_shape sh = fsdp_trainer_shard_shape(t);
    struct fsdp_optim_config oc;
    fsdp_train_config_optim(c, &oc);
    struct fsdp_shard_config sc;
    FSDP_CHECK(fsdp_train_config_shard(c, &sc));
    struct fsdp_plan_pp plan;
    FSDP_CHECK(fsdp_train_plan_pp(t->spec, c, first, P, s, &sh, t->dev, &oc, &sc, &plan));
    return fsdp_trainer_reserve(t, fsdp_plan_pp_total(&plan) + plan.st.ckpt_bytes);
}

int fsdp_trainer_pp_engine(struct fsdp_trainer *t, struct fsdp_engine **out)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_group *pp = fsdp_mesh_group(t->mesh, "pp");
    struct fsdp_group *dp = fsdp_mesh_group(t->mesh, "dp"), *rdp = fsdp_mesh_group(t->mesh, "rdp");
    struct fsdp_group *tp = fsdp_mesh_group(t->mesh, "tp");
    const int P = pp->size, s = pp->rank, V = (int)c->pp_virtual;
    int *first = calloc((size_t)(P * V) + 1, sizeof(int));
    int *most = calloc((size_t)V, sizeof(int));
    int rc = first && most ? 0 : fsdp_err(FSDP_ERR_NOMEM, "pipeline split");
    rc = rc < 0 ? rc : fsdp_train_pp_check_model(t->spec, P);
    const int n = rc < 0 ? rc
                         : fsdp_pp_chunk_holds_of((enum fsdp_pp_kind)c->pp_schedule, P, V,
                                                  (int)c->grad_accum, s, most);
    rc = n < 0 ? n : rc;
    struct fsdp_model **models = rc < 0 ? NULL : calloc((size_t)n, sizeof(*models));
    rc = rc < 0 || models ? rc : fsdp_err(FSDP_ERR_NOMEM, "pipeline model instances");
    rc = rc < 0 ? rc : fsdp_train_pp_split(t->spec, c, P, V, first);
    rc = rc < 0 ? rc : pp_reserve(t, first, P, s);
    struct fsdp_engine *inner = NULL;
    rc = rc < 0 ? rc : pp_stage_engine(t, first, P, V, s, most, &inner, models);
    struct fsdp_group *grad = NULL;
    rc = rc < 0 ? rc : pp_grad_group(pp, &grad);
    if (rc == 0) {
        const struct fsdp_param_spec *emb = &t->spec->params[t->spec->unit_first[0]];
        struct fsdp_pp_config pc = {
            .kind = (enum fsdp_pp_kind)c->pp_schedule,
            .V = V,
            .M = (int)c->grad_accum,
            .first = first,
            .C = emb->shape[1],
            .root_line =
                (!dp || dp->rank == 0) && (!rdp || rdp->rank == 0) && (!tp || tp->rank == 0),
            .tied = t->spec->n_ties > 0,
            .n_models = n,
            .grad = grad,
        };
        rc = fsdp_pp_engine_create(inner, models, pp, &pc, out); /* takes models[1 ..] */
    } else {
        if (inner) {
            inner->ops->destroy(inner);
        }
        for (int k = 1; models && k < n; k++) {
            fsdp_model_destroy(models[k]);
        }
    }
    free(models);
    free(most);
    free(first);
    return rc;
}
