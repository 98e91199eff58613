/*
 * memory_plan.c - fsdpc-train --print-memory (memory_plan.h): the model's
 * parameter table from a file or a preset, the mesh from --mesh, and the
 * sharding engine's own sizing (over the parts a run builds, parts.h) for
 * every tensor-parallel rank and the first and last shard rank; the largest
 * of those is printed, part by part, with what the figures leave out.
 */
#include "config.h"
#include "train/memory_plan.h"
#include "train/model_source.h"
#include "train/trainer.h"
#include "parallel/fsdp.h"
#include "train/parts.h"
#include "optim/optim.h"
#include "comm/mesh_spec.h"
#include "train/mesh_check.h"
#include "compute/device.h"
#include "model/model.h"
#include "io/h5/model_file.h"
#include "rendezvous/dist.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/spec.h"
#include "core/util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The parameter table of --model: a model file or checkpoint when the path
 * exists, else a preset. *what says which. */
static int plan_spec(const char *model, struct fsdp_model_spec **out, char *what, size_t len)
{
    char path[FSDP_TRAIN_PATH_MAX];
    if (access(model, F_OK) == 0) {
        FSDP_CHECK(fsdp_model_source_resolve(model, path, sizeof(path), NULL));
        FSDP_CHECK(fsdp_model_file_read_spec(path, fsdp_arch_registered(), out));
        snprintf(what, len, "%s", path);
        return 0;
    }
    const struct fsdp_arch *arch;
    void *cfg;
    if (fsdp_arch_preset(model, &arch, &cfg) < 0) {
        char presets[768];
        snprintf(presets, sizeof(presets), "%s", fsdp_err_msg());
        fsdp_err_clear();
        const char *list = strchr(presets, '(');
        return fsdp_err(FSDP_ERR_INVALID, "model %s: no such file, and not a preset %s", model,
                        list ? list : "");
    }
    int rc = arch->spec_create(cfg, out);
    free(cfg);
    snprintf(what, len, "preset %s", model);
    return rc;
}

/* The mesh: --mesh, else dp over the ranks a launcher started (one: none). */
static int plan_mesh(const struct fsdp_train_config *c, struct fsdp_shard_shape *sh, char *spec,
                     size_t len)
{
    struct fsdp_mesh_dims d;
    char def[32];
    snprintf(def, sizeof(def), "dp=%d", fsdp_dist_launcher_size());
    FSDP_CHECK(fsdp_mesh_parse(c->mesh[0] ? c->mesh : def, &d));
    FSDP_CHECK(fsdp_trainer_mesh_check(&d));
    *sh = (struct fsdp_shard_shape){.dp = 1, .rdp = 1, .tp = 1};
    for (int i = 0; i < d.ndims; i++) {
        if (strcmp(d.name[i], "pp") == 0 && d.size[i] > 1) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED,
                            "mesh %s: --print-memory does not plan "
                            "pipeline stages yet (a pp dimension)",
                            d.spec);
        }
        if (strcmp(d.name[i], "pp") == 0) {
            continue;
        }
        int *at = strcmp(d.name[i], "dp") == 0 ? &sh->dp : strcmp(d.name[i], "rdp") == 0 ? &sh->rdp
                                                                                        : &sh->tp;
        *at = d.size[i];
    }
    snprintf(spec, len, "%s (%lld rank%s)", d.spec, d.nranks, d.nranks == 1 ? "" : "s");
    return 0;
}

/* --ckpt-async's snapshot on the largest writer (dp rank 0 of the first
 * replica, tp rank 0): its rows of every parameter (of dp x tp checkpoint
 * shards with tensor parallelism), once per state kind; 0 where the saves
 * stay in the loop (off). What fsdp_ckpt_async_bytes finds on that rank's
 * engine. */
static size_t plan_snapshot(const struct fsdp_train_config *c, const struct fsdp_model_spec *spec,
                            const struct fsdp_shard_shape *sh, int kinds)
{
    size_t floats = 0;
    if (c->ckpt_async == FSDP_CKPT_ASYNC_OFF) {
        return 0;
    }
    for (size_t i = 0; i < spec->n_params; i++) {
        const struct fsdp_param_spec *p = &spec->params[i];
        size_t row0, rows;
        fsdp_split_even(p->shape[0], (size_t)sh->dp * (size_t)sh->tp, 0, &row0, &rows);
        floats += rows * p->shape[1];
    }
    return floats * (size_t)kinds * sizeof(float);
}

static void plan_row(FILE *fp, const char *what, size_t bytes)
{
    fprintf(fp, "  %-52s %16zu  %10.2f MiB\n", what, bytes, (double)bytes / 1048576.0);
}

/* The plan of the largest rank: every tp rank, the first and the last dp
 * rank (rows split unevenly go to the first ranks). */
static int plan_largest(const struct fsdp_model_spec *spec, struct fsdp_shard_shape sh,
                        struct fsdp_device *dev, const struct fsdp_optim_config *oc,
                        const struct fsdp_shard_config *sc, struct fsdp_engine_stats *best,
                        struct fsdp_shard_shape *where)
{
    int dps[2] = {0, sh.dp - 1};
    memset(best, 0, sizeof(*best));
    for (int t = 0; t < sh.tp; t++) {
        for (int k = 0; k < (sh.dp > 1 ? 2 : 1); k++) {
            struct fsdp_engine_stats st;
            sh.tp_rank = t;
            sh.dp_rank = dps[k];
            FSDP_CHECK(fsdp_train_parts_plan(spec, &sh, dev, oc, sc, &st));
            if (st.peak_bytes + st.ckpt_bytes > best->peak_bytes + best->ckpt_bytes ||
                (t == 0 && k == 0)) {
                *best = st;
                *where = sh;
            }
        }
    }
    return 0;
}

static void plan_print(const struct fsdp_train_config *c, const struct fsdp_model_spec *spec,
                       const char *model, const char *mesh, const struct fsdp_shard_shape *w,
                       const struct fsdp_engine_stats *st, size_t snapshot, struct fsdp_device *dev,
                       FILE *fp)
{
    static const char *const shard[] = {"full", "grad-op", "none"}; /* enum fsdp_sharding */
    char desc[256], line[512];
    fsdp_arch_describe(spec->arch, spec->cfg, desc, sizeof(desc));
    /* the trainer's two arrays of a step's micro-batches */
    size_t batch = 2 * (size_t)fsdp_train_config_step_tokens(c) * sizeof(int32_t);
    fprintf(fp, "# fsdpc-train --print-memory: planned, nothing allocated\n");
    fprintf(fp, "model: %s: %s %s, %zu parameters\n", model, spec->arch->name, desc,
            spec->total_numel);
    fprintf(fp, "mesh: %s\n", mesh);
    size_t free_b = 0, total_b = 0;
    if (dev->ops->mem_info(dev, &free_b, &total_b) == 0 && total_b > 0) {
        fprintf(fp, "device: %s (this process's), %.2f GiB free of %.2f GiB\n", dev->ops->name,
                (double)free_b / 1073741824.0, (double)total_b / 1073741824.0);
    }
    fprintf(fp,
            "batch: %ld x %ld per data-parallel rank, grad-accum %ld; sharding %s, prefetch "
            "%ld, reshard-after-forward %s; param-dtype %s, reduce-dtype %s; activation "
            "checkpointing %s%s%s%s\n",
            c->batch_size, c->seq_len, c->grad_accum, shard[c->sharding], c->prefetch,
            c->reshard_after_forward ? "on" : "off",
            fsdp_dtype_name(fsdp_train_config_dtype(c->param_dtype)),
            fsdp_dtype_name(fsdp_train_config_dtype(c->reduce_dtype)),
            c->activation_checkpointing ? "on" : "off", w->tp > 1 ? "; sequence parallel " : "",
            w->tp > 1 ? (c->sequence_parallel ? "on" : "off") : "",
            st->offload == FSDP_OFFLOAD_OPTIM          ? "; offload optim"
            : st->offload == FSDP_OFFLOAD_PARAMS_OPTIM ? "; offload params,optim"
                                                       : "");
    char head[96];
    snprintf(head, sizeof(head), "per rank (the largest: dp rank %d, tp rank %d)", w->dp_rank,
             w->tp_rank);
    fprintf(fp, "%-54s %16s  %14s\n", head, "bytes", "");
    /* elements of this rank's shards: 16 bytes each, 8 of them on the host with offload */
    const size_t elems = st->state_bytes / (st->host_bytes ? 8 : 16);
    plan_row(fp,
             st->offload == FSDP_OFFLOAD_PARAMS_OPTIM ? "parameter shards (f32, the master's copy)"
                                                      : "parameter shards (f32 master)",
             elems * 4);
    plan_row(fp, "gradient shards (f32)", elems * 4);
    plan_row(fp,
             st->host_bytes ? "AdamW moments (offloaded: on the host)" : "AdamW moments (2 x f32)",
             st->host_bytes ? 0 : elems * 8);
    plan_row(fp, "gathered parameters (root unit + prefetch ring)", st->gathered_bytes);
    plan_row(fp, "unsharded gradients (reduce-scatter buffers)", st->grad_bytes);
    plan_row(fp, "communication (packing scratch, padding)", st->comm_bytes);
    plan_row(fp, "activations saved for the backward", st->act_saved_bytes);
    plan_row(fp, "activation gradients and workspace", st->act_bytes - st->act_saved_bytes);
    plan_row(fp, "batches (tokens and targets, int32)", batch);
    plan_row(fp, "total, held from the first step", st->peak_bytes + batch);
    if (st->ckpt_bytes) {
        plan_row(fp, "+ from the first checkpoint on (tensor re-layout)", st->ckpt_bytes);
    }
    if (st->host_bytes) { /* --offload: moments, staged gradient, master (or its staging) */
        plan_row(fp, "+ host, pinned: AdamW moments (2 x f32, --offload)", elems * 8);
        plan_row(fp,
                 st->offload == FSDP_OFFLOAD_PARAMS_OPTIM
                     ? "+ host, pinned: f32 master and gradient staging"
                     : "+ host, pinned: gradient and master staging (f32)",
                 st->host_bytes - elems * 8);
    }
    if (snapshot) {
        plan_row(fp, "+ host, pinned: checkpoint snapshot (--ckpt-async)", snapshot);
    }
    if (st->gather_bytes && c->out[0]) {
        plan_row(fp, "+ while --out is written (one unit gathered whole)", st->gather_bytes);
    }
    fprintf(fp, "not counted: the process itself (code, MPI and HDF5 buffers: tens of MiB), the "
            "data loader's read-ahead, checkpoint and model-file I/O staging (a few MiB), "
            "allocator overhead and fragmentation\n");
    fsdp_shard_memory_line(st, line, sizeof(line));
    fprintf(fp, "engine line: %s\n", line);
}

int fsdp_train_print_memory(const struct fsdp_train_config *c, FILE *fp)
{
    struct fsdp_model_spec *spec = NULL;
    struct fsdp_device *dev = NULL;
    struct fsdp_shard_shape sh, where = {0};
    struct fsdp_shard_config sc;
    struct fsdp_optim_config oc;
    struct fsdp_engine_stats st;
    char model[FSDP_TRAIN_PATH_MAX + 16], mesh[160];
    int rc;
    FSDP_CHECK(fsdp_model_registry_init());
    FSDP_CHECK(plan_spec(c->model, &spec, model, sizeof(model)));
    if (c->seq_len > spec->context) {
        rc = fsdp_err(FSDP_ERR_INVALID, "seq-len %ld is longer than the context %d of model %s",
                      c->seq_len, spec->context, c->model);
        goto out;
    }
    FSDP_CHECK_GOTO(plan_mesh(c, &sh, mesh, sizeof(mesh)), rc, out);
    if (c->mesh[0]) { /* a tp the model does not split by: the sizes that do */
        FSDP_CHECK_GOTO(fsdp_trainer_mesh_precheck(c->mesh, spec, sh.dp * sh.rdp * sh.tp), rc,
                        out);
    }
    FSDP_CHECK_GOTO(fsdp_train_config_shard(c, &sc), rc, out);
    fsdp_train_config_optim(c, &oc);
    FSDP_CHECK_GOTO(fsdp_device_create(c->device, 0, &dev), rc, out);
    FSDP_CHECK_GOTO(plan_largest(spec, sh, dev, &oc, &sc, &st, &where), rc, out);
    struct fsdp_optimizer opt;
    fsdp_adamw_init(&opt, &oc, spec, dev);
    plan_print(c, spec, model, mesh, &where, &st, plan_snapshot(c, spec, &sh, 1 + opt.n_state), dev,
               fp);
    fflush(fp);
out:
    fsdp_device_destroy(dev);
    fsdp_model_spec_destroy(spec);
    return rc;
}
