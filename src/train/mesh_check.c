/*
 * mesh_check.c - a --mesh refused before any group exists, with a way out:
 * a dimension name that is not the trainer's names the nearest that is
 * ("pt" -> "tp") and the --mesh with it; sizes that do not multiply to the
 * world give a mesh that does; a tp that the model cannot be split by (its
 * heads, key/value heads or MLP) lists the tp sizes that split it.
 */
#include "config.h"
#include "train/mesh_check.h"
#include "core/options.h"
#include "model/model.h"
#include "core/error.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const char *const mc_names[] = {"dp", "rdp", "tp", "pp"};

/* spec with dimension k named `name` instead. */
static void mc_respell(const struct fsdp_mesh_dims *d, int k, const char *name, char *buf,
                      size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->ndims && used < len; i++) {
        used += (size_t)snprintf(buf + used, len - used, "%s%s=%d", i ? "," : "",
                                 i == k ? name : d->name[i], d->size[i]);
    }
}

int fsdp_trainer_mesh_check(const struct fsdp_mesh_dims *d)
{
    int shard = 0;
    for (int i = 0; i < d->ndims; i++) {
        if (fsdp_opt_nearest(d->name[i], mc_names, 4, 0)) {
            shard |= strcmp(d->name[i], "rdp") != 0;
            continue;
        }
        const char *near = fsdp_opt_nearest(d->name[i], mc_names, 4, 2);
        char fixed[160], mean[32] = "";
        if (near) {
            snprintf(mean, sizeof(mean), " (did you mean '%s'?)", near);
        }
        int rc = fsdp_err(FSDP_ERR_INVALID,
                          "mesh %s: dimension '%s' is not one the trainer "
                          "uses%s: dp shards, rdp replicates, tp is tensor parallel, pp pipelines",
                          d->spec, d->name[i], mean);
        mc_respell(d, i, near ? near : "dp", fixed, sizeof(fixed));
        fsdp_err_hint("--mesh %s", fixed);
        return rc;
    }
    if (!shard) {
        int rc = fsdp_err(FSDP_ERR_INVALID, "mesh %s: the sharding engine needs a 'dp' "
                          "dimension", d->spec);
        fsdp_err_hint("add dp=1 (no sharding) or move ranks from rdp to dp: --mesh %s,dp=1",
                      d->spec);
        return rc;
    }
    return 0;
}

/* 0 when spec's architecture splits over tp ranks (every parameter cut). */
static int mc_tp_splits(const struct fsdp_model_spec *spec, int tp)
{
    fsdp_tp_cut_fn cut = fsdp_model_tp_cut_of(spec);
    if (!cut) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "architecture %s has no tensor-parallel layout",
                        spec->arch->name);
    }
    for (size_t i = 0; i < spec->n_params; i++) {
        struct fsdp_tp_cut c = {.dim = -1, .chunks = 1};
        FSDP_CHECK(cut(spec, tp, i, &c));
    }
    return 0;
}

/* The refusal of a tp the model does not split by, with the sizes that do. */
static int mc_check_tp(const struct fsdp_mesh_dims *d, int k, const struct fsdp_model_spec *spec,
                       int world)
{
    int rc = mc_tp_splits(spec, d->size[k]);
    if (rc == 0) {
        return 0;
    }
    char msg[600], ok[160] = "1", mesh[160];
    int best = 1;
    fsdp_err_take(msg, sizeof(msg));
    fsdp_err_clear();
    for (int t = 2; t <= world && t <= 1024; t++) {
        if (world % t == 0 && mc_tp_splits(spec, t) == 0) {
            size_t used = strlen(ok);
            snprintf(ok + used, sizeof(ok) - used, ", %d", t);
            best = t <= d->size[k] ? t : best;
        }
        fsdp_err_clear();
    }
    rc = fsdp_err(rc, "mesh %s: %s", d->spec, msg);
    if (best > 1) {
        snprintf(mesh, sizeof(mesh), "dp=%d,tp=%d", world / best, best);
    } else {
        snprintf(mesh, sizeof(mesh), "dp=%d", world);
    }
    fsdp_err_hint("tp sizes that split this model on %d ranks: %s; --mesh %s", world, ok, mesh);
    return rc;
}

int fsdp_trainer_mesh_precheck(const char *mesh, const struct fsdp_model_spec *spec, int world)
{
    struct fsdp_mesh_dims d;
    FSDP_CHECK(fsdp_mesh_parse(mesh, &d));
    FSDP_CHECK(fsdp_trainer_mesh_check(&d));
    if (fsdp_mesh_check_world(mesh, &d, world) < 0) {
        fsdp_err_hint("the sizes multiply to the number of ranks, %d here: --mesh dp=%d (shard "
                      "over all), or rdp=R,dp=N with R x N = %d", world, world, world);
        return FSDP_ERR_INVALID;
    }
    for (int k = 0; k < d.ndims; k++) {
        if (strcmp(d.name[k], "tp") == 0 && d.size[k] > 1) {
            FSDP_CHECK(mc_check_tp(&d, k, spec, world));
        }
    }
    return 0;
}
