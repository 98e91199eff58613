/*
 * memory_plan.c - fsdpc-train --print-memory (memory_plan.h): the model's
 * parameter table from a file or a preset, the mesh from --mesh, and the
 * sharding engine's own sizing (over the parts a run builds, parts.h) for
 * every tensor-parallel rank and the first and last shard rank; the largest
 * of those is printed, part by part, with what the figures leave out. With
 * a pp dimension every pipeline rank is planned as pipeline.c builds it
 * (its stages' units, its chunks' models cut at their stages) with what the
 * pipeline engine adds (the received stage inputs and output gradients at
 * the most its message order holds, a tied embedding's gradient, the unit
 * buffer of world rank 0), and each rank's total is listed.
 */
#include "config.h"
#include "train/memory_plan.h"
#include "train/model_source.h"
#include "train/trainer.h"
#include "train/trainer_impl.h"
#include "parallel/fsdp.h"
#include "train/parts.h"
#include "train/memory_plan_pp.h"
#include "train/pipeline.h"
#include "parallel/pp_schedule.h"
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
static int plan_mesh(const struct fsdp_train_config *c, struct fsdp_shard_shape *sh,
                     struct fsdp_mesh_dims *dims, char *spec, size_t len)
{
    struct fsdp_mesh_dims d;
    char def[32];
    snprintf(def, sizeof(def), "dp=%d", fsdp_dist_launcher_size());
    FSDP_CHECK(fsdp_mesh_parse(c->mesh[0] ? c->mesh : def, &d));
    FSDP_CHECK(fsdp_trainer_mesh_check(&d));
    *dims = d;
    *sh = (struct fsdp_shard_shape){.dp = 1, .rdp = 1, .tp = 1};
    for (int i = 0; i < d.ndims; i++) {
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

static void plan_pp_rows(const struct fsdp_plan_pp *pp, FILE *fp);

/* The plan's head: the model, the mesh, the device and the settings. */
static void plan_print_head(const struct fsdp_train_config *c, const struct fsdp_model_spec *spec,
                            const char *model, const char *mesh, const struct fsdp_shard_shape *w,
                            const struct fsdp_engine_stats *st, struct fsdp_device *dev, FILE *fp)
{
    static const char *const shard[] = {"full", "grad-op", "none"}; /* enum fsdp_sharding */
    char desc[256];
    fsdp_arch_describe(spec->arch, spec->cfg, desc, sizeof(desc));
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
            "%ld, reshard-after-forward %s; param-dtype %s, reduce-dtype %s; activation-dtype "
            "%s; activation checkpointing %s%s%s%s\n",
            c->batch_size, c->seq_len, c->grad_accum, shard[c->sharding], c->prefetch,
            c->reshard_after_forward ? "on" : "off",
            fsdp_dtype_name(fsdp_train_config_dtype(c->param_dtype)),
            fsdp_dtype_name(fsdp_train_config_dtype(c->reduce_dtype)),
            c->activation_dtype ? "bf16" : "f32", c->activation_checkpointing ? "on" : "off",
            w->tp > 1 ? "; sequence parallel " : "",
            w->tp > 1 ? (c->sequence_parallel ? "on" : "off") : "",
            st->offload == FSDP_OFFLOAD_OPTIM          ? "; offload optim"
            : st->offload == FSDP_OFFLOAD_PARAMS_OPTIM ? "; offload params,optim"
                                                       : "");
}

static void plan_print(const struct fsdp_train_config *c, const struct fsdp_model_spec *spec,
                       const char *model, const char *mesh, const struct fsdp_shard_shape *w,
                       const struct fsdp_engine_stats *st, const struct fsdp_plan_pp *pp,
                       size_t snapshot, struct fsdp_device *dev, FILE *fp)
{
    char line[512];
    /* the trainer's two arrays of a step's micro-batches */
    size_t batch = 2 * (size_t)fsdp_train_config_step_tokens(c) * sizeof(int32_t);
    plan_print_head(c, spec, model, mesh, w, st, dev, fp);
    char head[96];
    if (pp) {
        snprintf(head, sizeof(head), "per rank (the largest: pp rank %d, dp rank %d, tp rank %d)",
                 pp->rank, w->dp_rank, w->tp_rank);
    } else {
        snprintf(head, sizeof(head), "per rank (the largest: dp rank %d, tp rank %d)", w->dp_rank,
                 w->tp_rank);
    }
    fprintf(fp, "%-54s %16s  %14s\n", head, "bytes", "");
    /* elements of this rank's shards: 16 bytes each; with offload 16 on the
     * host, and on the device the gradient (f32) and the parameters: the f32
     * master, or under params,optim what the all-gathers send, 2 bytes in a
     * 16-bit param dtype */
    const size_t elems = st->host_bytes ? st->host_bytes / 16 : st->state_bytes / 16;
    const size_t pbytes = st->host_bytes ? st->state_bytes - elems * 4 : elems * 4;
    plan_row(fp,
             st->offload != FSDP_OFFLOAD_PARAMS_OPTIM ? "parameter shards (f32 master)"
             : pbytes < elems * 4 ? "parameter shards (16-bit, the all-gathers' send)"
                                  : "parameter shards (f32: the send, or 1 rank's input)",
             pbytes);
    plan_row(fp, "gradient shards (f32)", elems * 4);
    plan_row(fp,
             st->host_bytes ? "AdamW moments (offloaded: on the host)" : "AdamW moments (2 x f32)",
             st->host_bytes ? 0 : elems * 8);
    plan_row(fp, "gathered parameters (root unit + prefetch ring)", st->gathered_bytes);
    plan_row(fp, "unsharded gradients (reduce-scatter buffers)", st->grad_bytes);
    plan_row(fp, "communication (packing scratch, padding)", st->comm_bytes);
    const size_t ppact = pp ? pp->act : 0, ppsaved = pp ? pp->saved : 0;
    plan_row(fp, "activations saved for the backward", st->act_saved_bytes + ppsaved);
    plan_row(fp, "activation gradients and workspace",
             st->act_bytes - st->act_saved_bytes + ppact - ppsaved);
    if (pp) {
        plan_pp_rows(pp, fp);
    }
    plan_row(fp, "batches (tokens and targets, int32)", batch);
    plan_row(fp, "total, held from the first step",
             (pp ? fsdp_plan_pp_total(pp) : st->peak_bytes) + batch);
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
    if (dev->ops
            ->reserve) { /* a device's arena takes this beside the plan (fsdp_trainer_reserve) */
        plan_row(fp, "+ kernel workspaces (reserved with the plan)", FSDP_TRAINER_KERNEL_ROOM);
    }
    fprintf(fp,
            "not counted: the process itself (code, MPI and HDF5 buffers: tens of MiB), the "
            "data loader's read-ahead, checkpoint and model-file I/O staging (a few MiB), %s"
            "allocator overhead and fragmentation\n",
            dev->ops->reserve ? ""
                              : "the kernels' own workspaces (on the CPU, f32 copies of a "
                                "product's bf16 operands), ");
    fsdp_shard_memory_line(st, line, sizeof(line));
    fprintf(fp, "engine line: %s\n", line);
}

/* What the pipeline engine adds on the rank beside its sharding engine. */
static void plan_pp_rows(const struct fsdp_plan_pp *pp, FILE *fp)
{
    char what[96];
    snprintf(what, sizeof(what), "pipeline stage inputs received (%zu x B T C f32)", pp->n_held);
    plan_row(fp, what, pp->inputs);
    snprintf(what, sizeof(what), "pipeline output gradients received (%zu x B T C)", pp->n_grads);
    plan_row(fp, what, pp->grads);
    if (pp->sends) {
        snprintf(what, sizeof(what), "pipeline sends in flight (%d x B T C, one per direction)",
                 pp->n_sends);
        plan_row(fp, what, pp->sends);
    }
    if (pp->tie) {
        plan_row(fp, "pipeline tied embedding gradient (the copy's shard)", pp->tie);
    }
    if (pp->unit) {
        plan_row(fp, "pipeline unit for saving (world rank 0: the largest)", pp->unit);
    }
}

/* Each pipeline rank (its largest dp and tp rank), and the engine line of
 * its dp rank 0, tp rank 0 (the one it logs at create). */
static void plan_pp_ranks(const struct fsdp_train_config *c, const struct fsdp_plan_pp *most,
                          const struct fsdp_plan_pp *first, FILE *fp)
{
    const int P = most[0].P, V = most[0].V;
    char line[512];
    fprintf(fp,
            "pipeline: %d ranks x %d stage%s each, schedule %s, %d micro-batches; each rank "
            "(its largest dp and tp rank), bytes:\n",
            P, V, V == 1 ? "" : "s", fsdp_pp_kind_name((enum fsdp_pp_kind)c->pp_schedule),
            most[0].M);
    for (int r = 0; r < P; r++) {
        const struct fsdp_plan_pp *q = &most[r];
        fprintf(fp,
                "  pp rank %d (units %d-%d%s): in flight at most %zu micro-batches, %d activation "
                "sets; state %zu, "
                "activations and workspace %zu, boundary buffers %zu, total %zu\n",
                r, q->lo, q->hi, V > 1 ? " and its later chunks'" : "", q->bound, q->sets,
                q->st.state_bytes, q->st.act_bytes + q->act,
                q->inputs + q->grads + q->sends + q->tie, fsdp_plan_pp_total(q));
    }
    for (int r = 0; r < P; r++) {
        fsdp_shard_memory_line(&first[r].st, line, sizeof(line));
        fprintf(fp, "engine line, pp rank %d: %s\n", r, line);
    }
}

/* Every pipeline rank's plan at every tp rank and the first and last dp
 * rank: most[r] the largest of rank r, first[r] its dp 0, tp 0. */
static int plan_largest_pp(const struct fsdp_model_spec *spec, const struct fsdp_train_config *c,
                           int P, struct fsdp_shard_shape sh, struct fsdp_device *dev,
                           const struct fsdp_optim_config *oc, const struct fsdp_shard_config *sc,
                           struct fsdp_plan_pp *most, struct fsdp_plan_pp *first)
{
    const int V = (int)c->pp_virtual > 0 ? (int)c->pp_virtual : 1;
    int *split = calloc((size_t)(P * V) + 1, sizeof(int));
    int rc = split ? 0 : fsdp_err(FSDP_ERR_NOMEM, "pipeline split");
    rc = rc < 0 ? rc : fsdp_train_pp_split(spec, c, P, V, split);
    const int dps[2] = {0, sh.dp - 1};
    for (int r = 0; r < P && rc == 0; r++) {
        for (int t = 0; t < sh.tp && rc == 0; t++) {
            for (int k = 0; k < (sh.dp > 1 ? 2 : 1) && rc == 0; k++) {
                struct fsdp_plan_pp q;
                sh.tp_rank = t;
                sh.dp_rank = dps[k];
                rc = fsdp_train_plan_pp(spec, c, split, P, r, &sh, dev, oc, sc, &q);
                if (rc == 0 && t == 0 && k == 0) {
                    first[r] = most[r] = q;
                } else if (rc == 0 && fsdp_plan_pp_total(&q) + q.st.ckpt_bytes >
                                          fsdp_plan_pp_total(&most[r]) + most[r].st.ckpt_bytes) {
                    most[r] = q;
                }
            }
        }
    }
    free(split);
    return rc;
}

/* A pipeline's plan: every rank's, the largest printed part by part. */
static int plan_pp(const struct fsdp_train_config *c, const struct fsdp_model_spec *spec, int P,
                   const struct fsdp_shard_shape *sh, struct fsdp_device *dev,
                   const struct fsdp_optim_config *oc, const struct fsdp_shard_config *sc,
                   const char *model, const char *mesh, size_t snapshot, FILE *fp)
{
    FSDP_CHECK(fsdp_train_pp_check_model(spec, P));
    struct fsdp_plan_pp *most = calloc((size_t)P, sizeof(*most));
    struct fsdp_plan_pp *first = calloc((size_t)P, sizeof(*first));
    int rc = most && first ? 0 : fsdp_err(FSDP_ERR_NOMEM, "pipeline plan");
    rc = rc < 0 ? rc : plan_largest_pp(spec, c, P, *sh, dev, oc, sc, most, first);
    if (rc == 0) {
        int w = 0;
        for (int r = 1; r < P; r++) {
            w = fsdp_plan_pp_total(&most[r]) + most[r].st.ckpt_bytes >
                        fsdp_plan_pp_total(&most[w]) + most[w].st.ckpt_bytes
                    ? r
                    : w;
        }
        plan_print(c, spec, model, mesh, &most[w].sh, &most[w].st, &most[w], snapshot, dev, fp);
        plan_pp_ranks(c, most, first, fp);
    }
    free(most);
    free(first);
    return rc;
}

int fsdp_train_print_memory(const struct fsdp_train_config *c, FILE *fp)
{
    struct fsdp_model_spec *spec = NULL;
    struct fsdp_device *dev = NULL;
    struct fsdp_shard_shape sh, where = {0};
    struct fsdp_shard_config sc;
    struct fsdp_optim_config oc;
    struct fsdp_engine_stats st;
    struct fsdp_mesh_dims d;
    char model[FSDP_TRAIN_PATH_MAX + 16], mesh[160];
    int rc;
    FSDP_CHECK(fsdp_model_registry_init());
    FSDP_CHECK(plan_spec(c->model, &spec, model, sizeof(model)));
    if (c->seq_len > spec->context) {
        rc = fsdp_err(FSDP_ERR_INVALID, "seq-len %ld is longer than the context %d of model %s",
                      c->seq_len, spec->context, c->model);
        goto out;
    }
    FSDP_CHECK_GOTO(plan_mesh(c, &sh, &d, mesh, sizeof(mesh)), rc, out);
    int P = 1;
    for (int i = 0; i < d.ndims; i++) {
        P = strcmp(d.name[i], "pp") == 0 ? d.size[i] : P;
    }
    if (c->mesh[0]) { /* a tp the model does not split by: the sizes that do */
        FSDP_CHECK_GOTO(fsdp_trainer_mesh_precheck(c->mesh, spec, P * sh.dp * sh.rdp * sh.tp), rc,
                        out);
    }
    FSDP_CHECK_GOTO(fsdp_train_config_shard(c, &sc), rc, out);
    fsdp_train_config_optim(c, &oc);
    FSDP_CHECK_GOTO(fsdp_device_create(c->device, 0, &dev), rc, out);
    struct fsdp_optimizer opt;
    fsdp_adamw_init(&opt, &oc, spec, dev);
    const size_t snap = plan_snapshot(c, spec, &sh, 1 + opt.n_state);
    if (P > 1) {
        FSDP_CHECK_GOTO(plan_pp(c, spec, P, &sh, dev, &oc, &sc, model, mesh, snap, fp), rc, out);
    } else {
        FSDP_CHECK_GOTO(plan_largest(spec, sh, dev, &oc, &sc, &st, &where), rc, out);
        plan_print(c, spec, model, mesh, &where, &st, NULL, snap, dev, fp);
    }
    fflush(fp);
out:
    fsdp_device_destroy(dev);
    fsdp_model_spec_destroy(spec);
    return rc;
}
