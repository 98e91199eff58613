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
#include "comm/group.h"
#include "comm/mesh.h"
#include "core/error.h"
#include "model/model.h"
#include "parallel/pp_engine.h"
#include "parallel/pp_plan.h"

#include <stdlib.h>
#include <string.h>

/* The split of L layers over P stages into first (P + 1): --pp-layers, or
 * the one whose largest stage holds the least parameter state (16 bytes an
 * element: master, gradient, two AdamW moments). */
static int pp_split(const struct fsdp_model_spec *spec, const struct fsdp_train_config *c, int P,
                    int *first)
{
    const int L = spec->n_units - 2;
    if (c->pp_layers[0]) {
        return fsdp_pp_layers_parse(c->pp_layers, L, P, first);
    }
    double *param = calloc((size_t)L + 1, sizeof(double));
    double *act = calloc((size_t)L + 1, sizeof(double));
    size_t *held = calloc((size_t)P, sizeof(size_t));
    int rc = param && act && held ? 0 : fsdp_err(FSDP_ERR_NOMEM, "pipeline split");
    for (int l = 0; rc == 0 && l < L; l++) {
        param[l] = 16.0 * (double)spec->unit_numel[l + 1];
    }
    for (int s = 0; rc == 0 && s < P; s++) {
        held[s] =
            fsdp_pp_peak_bound((enum fsdp_pp_kind)c->pp_schedule, P, 1, (int)c->grad_accum, s);
    }
    struct fsdp_pp_costs costs = {
        .L = L,
        .param = param,
        .act = act,
        .first = 16.0 * (double)spec->unit_numel[0],
        .last = 16.0 * (double)spec->unit_numel[L + 1],
    };
    if (rc == 0) {
        rc = fsdp_pp_partition(&costs, P, held, first, NULL);
    }
    free(param);
    free(act);
    free(held);
    return rc;
}

/* What a pipeline stage's model must be: untied, and able to be cut. */
static int pp_check_model(const struct fsdp_model_spec *spec, int P)
{
    const char *arch = spec->arch ? spec->arch->name : "model";
    if (spec->n_ties > 0) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "pp=%d: the %s model ties its embedding and head "
                        "(%s), which the first and last stages would both need; pipeline "
                        "parallelism takes untied models (fsdpc-ckpt init --untied)",
                        P, arch, spec->params[spec->ties[0].param].name);
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

int fsdp_trainer_pp_engine(struct fsdp_trainer *t, struct fsdp_engine **out)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_group *pp = fsdp_mesh_group(t->mesh, "pp");
    const int P = pp->size, s = pp->rank;
    int *first = calloc((size_t)P + 1, sizeof(int));
    if (!first) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline split");
    }
    int rc = pp_check_model(t->spec, P);
    rc = rc < 0 ? rc : pp_split(t->spec, c, P, first);
    rc = rc < 0 ? rc
                : fsdp_pp_check((enum fsdp_pp_kind)c->pp_schedule, P, (int)c->pp_virtual,
                                (int)c->grad_accum);
    struct fsdp_optim_config oc;
    fsdp_train_config_optim(c, &oc);
    struct fsdp_shard_config sc;
    rc = rc < 0 ? rc : fsdp_train_config_shard(c, &sc);
    struct fsdp_shard_groups g = {
        .dp = fsdp_mesh_group(t->mesh, "dp"),
        .rdp = fsdp_mesh_group(t->mesh, "rdp"),
        .world_rank = fsdp_trainer_rank(t),
        .mesh = t->mesh->spec,
        .backends = t->mesh->backends,
    };
    struct fsdp_group *tp = fsdp_mesh_group(t->mesh, "tp");
    struct fsdp_engine *inner = NULL;
    if (rc == 0) {
        fsdp_pp_stage_units(first, P, s, &sc.unit_lo, &sc.unit_hi);
        rc = fsdp_train_parts_create(t->spec, tp, t->dev, &oc, &sc, &t->parts);
    }
    if (rc == 0) {
        struct fsdp_model *m = t->parts->model;
        rc = m->ops->set_stage(m, sc.unit_lo, sc.unit_hi);
    }
    rc = rc < 0 ? rc : fsdp_shard_engine_create(&t->parts->shard, &g, t->dev, &sc, &inner);
    if (rc == 0) {
        const struct fsdp_param_spec *emb = &t->spec->params[t->spec->unit_first[0]];
        struct fsdp_pp_config pc = {
            .kind = (enum fsdp_pp_kind)c->pp_schedule,
            .V = (int)c->pp_virtual,
            .M = (int)c->grad_accum,
            .first = first,
            .C = emb->shape[1],
            .root_line = (!g.dp || g.dp->rank == 0) && (!g.rdp || g.rdp->rank == 0) &&
                         (!tp || tp->rank == 0),
        };
        rc = fsdp_pp_engine_create(inner, t->parts->model, pp, &pc, out);
    }
    free(first);
    return rc;
}
