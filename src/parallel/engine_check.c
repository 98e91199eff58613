/*
 * engine_check.c - what the sharding engine checks before it builds: its
 * configuration, the parts it borrows (the model, the optimizer and the
 * tensor-parallel plan on one parameter table), the ties it can serve, the
 * offload setting and the backends that can take its memory. Each is
 * one error naming the setting; none allocates.
 */
#include "config.h"
#include "parallel/fsdp_impl.h"
#include "core/error.h"
#include "backends/backend.h"

int fsdp_shard_check_config(const struct fsdp_shard_config *ec)
{
    if (ec->B < 1 || ec->T < 1) {
        return fsdp_err(FSDP_ERR_INVALID, "micro-batch %d x %d is empty", ec->B, ec->T);
    }
    if (ec->prefetch < 0 || ec->prefetch > 64) {
        return fsdp_err(FSDP_ERR_INVALID, "prefetch %d is outside [0, 64]", ec->prefetch);
    }
    const enum fsdp_dtype ok[] = {FSDP_F32, FSDP_BF16, FSDP_F16};
    int pd = 0, rd = 0;
    for (size_t i = 0; i < 3; i++) {
        pd |= ec->param_dtype == ok[i];
        rd |= ec->reduce_dtype == ok[i];
    }
    if (!pd || !rd) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "param-dtype %s / reduce-dtype %s: each must be f32, bf16 or f16",
                        fsdp_dtype_name(ec->param_dtype), fsdp_dtype_name(ec->reduce_dtype));
    }
    if (ec->loss_scale < 0.0 || (ec->loss_scale_dynamic && ec->loss_scale <= 0.0)) {
        return fsdp_err(FSDP_ERR_INVALID, "loss scale %g must be positive", ec->loss_scale);
    }
    if (ec->offload < FSDP_OFFLOAD_NONE || ec->offload > FSDP_OFFLOAD_PARAMS_OPTIM) {
        return fsdp_err(FSDP_ERR_INVALID, "offload %d is not none, optim or params,optim",
                        (int)ec->offload);
    }
    return 0;
}

int fsdp_shard_check_backends(const struct fsdp_shard_engine *se)
{
    struct fsdp_group *gs[2 + FSDP_MAX_REP_GROUPS] = {se->shard_g, se->tp->g};
    int n = 2;
    for (int i = 0; i < se->n_rep; i++) {
        gs[n++] = se->rep_g[i];
    }
    for (int i = 0; i < n; i++) {
        struct fsdp_backend_caps caps;
        if (!gs[i]) {
            continue;
        }
        gs[i]->ops->capabilities(gs[i]->be, &caps);
        int staged = gs[i]->stager && gs[i]->stager->mem == se->dev->mem;
        if (!(caps.flags & fsdp_device_mem_cap(se->dev)) && !staged) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED,
                            "group %s: backend %s cannot take %s memory, "
                            "where this engine's buffers live (device %s)",
                            gs[i]->name, gs[i]->ops->name,
                            se->dev->mem == FSDP_MEM_CUDA ? "CUDA" : "host", se->dev->ops->name);
        }
    }
    return 0;
}

/*
 * Unit 0 is the root: its parameters stay gathered and its gradient slot
 * stays its own from the start of the backward to its reduction after its
 * own backward, as FSDP2 keeps the root module's. A unit that uses another
 * unit's parameter (a tie) is served by that alone, so the parameter must
 * be the root's.
 */
int fsdp_shard_check_ties(const struct fsdp_model_spec *spec)
{
    for (int i = 0; i < spec->n_ties; i++) {
        const struct fsdp_tie *t = &spec->ties[i];
        if (t->owner != 0) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED,
                            "%s: unit %d uses %s of unit %d; the sharding "
                            "engine keeps only unit 0's parameters across units",
                            spec->arch ? spec->arch->name : "model", t->user,
                            spec->params[t->param].name, t->owner);
        }
    }
    return 0;
}

const struct fsdp_model_spec *fsdp_shard_parts_table(const struct fsdp_shard_parts *p)
{
    return p->plan ? p->plan->local : p->spec;
}

/* The parts fit together: the model and the optimizer on the table the
 * plan cuts (or the whole one), the tp context the plan's rank. */
int fsdp_shard_check_parts(const struct fsdp_shard_parts *p)
{
    if (!p->spec || !p->model || !p->opt) {
        return fsdp_err(FSDP_ERR_INTERNAL, "fsdp: the parts lack a %s",
                        !p->spec    ? "parameter table"
                        : !p->model ? "model"
                                    : "optimizer");
    }
    const struct fsdp_model_spec *table = fsdp_shard_parts_table(p);
    const int tp = p->tp ? p->tp->size : 1, rank = p->tp ? p->tp->rank : 0;
    if (p->model->spec != table || p->opt->spec != table) {
        return fsdp_err(FSDP_ERR_INTERNAL,
                        "fsdp: the %s was made for another parameter table "
                        "than the %s one the engine shards",
                        p->model->spec != table ? "model" : "optimizer",
                        p->plan ? "tp-local" : "whole");
    }
    if (p->plan ? p->plan->full != p->spec || p->plan->size != tp || p->plan->rank != rank
                : tp != 1) {
        return fsdp_err(FSDP_ERR_INTERNAL,
                        "fsdp: tp context (rank %d of %d) and plan (%s) "
                        "disagree",
                        rank, tp, p->plan ? "another rank or table" : "none");
    }
    return 0;
}

/* Offload holds on every mesh: with tensor parallelism the pieces are
 * blocks, and the checkpoint re-layout copies their host kinds (the
 * moments; with params the master) to the device itself (shard_save.c). */
int fsdp_shard_check_offload(struct fsdp_shard_engine *se, const struct fsdp_shard_parts *p)
{
    (void)p;
    se->offload = se->ec.offload;
    return 0;
}
