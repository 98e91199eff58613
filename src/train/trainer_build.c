/*
 * trainer_build.c - building the trainer (trainer.c): the inputs checked,
 * the device, the mesh and the world group, then the parallelisms applied
 * in order (the engine factory; the default's: tensor parallelism, the
 * model, activation checkpointing and the optimizer, train/parts.h, then
 * sharding, parallel/fsdp.h) and the model file's parameters loaded into
 * the engine, the data loaders, the metrics file and the peak FLOP/s. Each
 * phase ends in an agreement of every rank.
 */
#include "config.h"
#include "train/trainer.h"
#include "train/trainer_impl.h"
#include "train/ckpt_cadence.h"
#include "train/model_source.h"
#include "train/stop.h"
#include "train/uneven.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "backends/backend.h"
#include "comm/debug.h"
#include "comm/mesh.h"
#include "comm/mesh_spec.h"
#include "train/mesh_check.h"
#include "compute/device.h"
#include "train/stage.h"
#include "parallel/fsdp.h"
#include "train/parts.h"
#include "io/h5/model_file.h"
#include "io/text/tokens.h"
#include "model/model.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Fails now, not after the run, when the final model cannot be written. */
static int trainer_check_out(const char *out)
{
    char dir[FSDP_TRAIN_PATH_MAX];
    const char *slash = strrchr(out, '/');
    if (!out[0]) {
        return 0;
    }
    if (!slash) {
        snprintf(dir, sizeof(dir), ".");
    } else {
        snprintf(dir, sizeof(dir), "%.*s", slash == out ? 1 : (int)(slash - out), out);
    }
    if (access(dir, W_OK | X_OK) != 0) {
        int rc = fsdp_err(FSDP_ERR_IO, "out %s: cannot write in directory %s: %s", out, dir,
                          strerror(errno));
        fsdp_err_hint("create %s first (mkdir -p), or give --out a path in a writable directory",
                      dir);
        return rc;
    }
    return 0;
}

/* The model file, and the parameter table of its architecture (the
 * trainer's own copy: it outlives the file). --model may name a checkpoint
 * (model_source.h). */
static int trainer_open_model(struct fsdp_trainer *t, struct fsdp_model_file **mf)
{
    const struct fsdp_train_config *c = t->cfg;
    int rc = fsdp_model_source_resolve(c->model, t->model_path, sizeof(t->model_path), NULL);
    if (rc == 0) {
        rc = fsdp_model_file_open(t->model_path, fsdp_arch_registered(), mf);
    }
    if (rc == 0) {
        const struct fsdp_model_spec *fs = fsdp_model_file_spec(*mf);
        rc = fs->arch->spec_create(fs->cfg, &t->spec);
    }
    if (rc == 0) { /* the special-token ids travel on into checkpoints and --out */
        t->spec->bos_token_id = fsdp_model_file_spec(*mf)->bos_token_id;
        t->spec->eos_token_id = fsdp_model_file_spec(*mf)->eos_token_id;
    }
    if (rc < 0) {
        if (access(t->model_path, F_OK) != 0) {
            fsdp_err_hint("check --model (or 'model =' in the config file): there is no such "
                          "file; 'fsdpc-ckpt init --preset tiny -o FILE' makes a model file, and "
                          "a checkpoint directory works too");
        }
        return fsdp_trainer_blame(rc, "model");
    }
    if (c->seq_len > t->spec->context) {
        rc = fsdp_err(FSDP_ERR_INVALID, "seq-len %ld is longer than the context %d of model %s",
                      c->seq_len, t->spec->context, c->model);
        fsdp_err_hint("lower --seq-len to at most %d, or make a model with a longer context "
                      "('fsdpc-ckpt init --context N')",
                      t->spec->context);
        return rc;
    }
    return 0;
}

/*
 * This rank's file of a data or val-data option exists and can be read, so
 * that a missing file is reported before the mesh and the engine are built.
 * The loader checks the rest (format, vocabulary, length).
 */
static int trainer_check_readable(struct fsdp_trainer *t, const char *path, const char *what)
{
    char mine[FSDP_TRAIN_PATH_MAX];
    int per_rank;
    int rc = fsdp_uneven_path(path, t->data_rank, mine, sizeof(mine), &per_rank);
    if (rc < 0) {
        return fsdp_trainer_blame(rc, what);
    }
    if (access(mine, R_OK) != 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: %s: cannot open: %s", what, mine, strerror(errno));
        if (per_rank) {
            fsdp_err_hint("with %s in --%s every data-parallel rank reads a file of its own "
                          "(tp peers share one): one is needed for each of the %d",
                          FSDP_TRAIN_RANK_FIELD, what, t->data_world);
        } else {
            fsdp_err_hint("check --%s; 'fsdpc-data tokenize TEXT -o FILE' makes a token file",
                          what);
        }
        return rc;
    }
    return 0;
}

/* Hints for the loader's refusals that a user meets (its messages, io/text/tokens.c). */
static void trainer_data_hint(const char *what)
{
    const char *msg = fsdp_err_msg();
    if (strstr(msg, "outside the vocabulary")) {
        fsdp_err_hint("the %s file holds token ids the model has no embedding for: tokenize the "
                      "text for this model's vocabulary ('fsdpc-data tokenize' makes byte-level "
                      "tokens, vocab 256; with --tokenizer tokenizer.json, that tokenizer's ids), "
                      "or make the model with a larger --vocab",
                      what);
    } else if (strstr(msg, "one global batch")) {
        fsdp_err_hint("the %s file is shorter than one global batch (ranks x batch-size x seq-len "
                      "tokens, plus one): use more text, or lower --batch-size or --seq-len",
                      what);
    }
}

/* Phase 1: what each rank can check alone; the model file stays open. */
int fsdp_trainer_check_inputs(struct fsdp_trainer *t, struct fsdp_model_file **mf)
{
    const struct fsdp_train_config *c = t->cfg;
    FSDP_CHECK(trainer_check_out(c->out));
    fsdp_trainer_data_place(t);
    FSDP_CHECK(fsdp_model_registry_init());
    FSDP_CHECK(trainer_open_model(t, mf));
    if (c->mesh[0]) { /* before any group is built for it */
        FSDP_CHECK(fsdp_trainer_mesh_precheck(c->mesh, t->spec, fsdp_trainer_world(t)));
    }
    FSDP_CHECK(trainer_check_readable(t, c->data, "data"));
    if (c->val_data[0]) {
        FSDP_CHECK(trainer_check_readable(t, c->val_data, "val-data"));
    }
    return 0;
}

/* What to do about a mesh or backend that could not be built. */
static void trainer_mesh_hint(const struct fsdp_trainer *t, int rc)
{
    const int w = fsdp_trainer_world(t);
    if (rc == FSDP_ERR_UNSUPPORTED && t->dev->mem == FSDP_MEM_HOST) {
        fsdp_err_hint("--device %s computes in host memory, which nccl cannot take: use --backend "
                      "mpi (under mpiexec or srun) or --backend tcp, or nccl with --device cuda "
                      "(a build with the CUDA kernels, on GPUs)",
                      t->dev->ops->name);
    } else if (rc == FSDP_ERR_UNSUPPORTED) {
        fsdp_err_hint("mpi and tcp take host memory (a device's is staged through host buffers); "
                      "nccl takes CUDA device memory only (--device cuda)");
    } else if (rc == FSDP_ERR_INVALID) {
        fsdp_err_hint("--mesh is dp=N (shard over N ranks), rdp=R,dp=N (R replicas of N-way "
                      "shards) or either with tp=T last (tensor parallel over T ranks), the sizes "
                      "multiplying to the number of ranks, %d here (--mesh dp=%d)",
                      w, w);
    } else if (rc == FSDP_ERR_MISMATCH) {
        fsdp_err_hint("start every rank with the same --mesh and --backend");
    }
}

/* The memory kinds a backend's collectives take (FSDP_CAP_MEM_*). */
static uint32_t trainer_mem_caps(const struct fsdp_backend_ops *o)
{
    return o->size >= offsetof(struct fsdp_backend_ops, mem_caps) + sizeof(o->mem_caps)
               ? o->mem_caps
               : FSDP_CAP_MEM_HOST;
}

/* Each dimension whose backend cannot take the device's memory stages it
 * through host buffers (comm/group.h); rank 0 says which. */
static int trainer_stage_dims(struct fsdp_trainer *t)
{
    struct fsdp_mesh *m = t->mesh;
    fsdp_stage_stager(t->dev, &t->stager);
    for (int i = 0; i < m->ndims; i++) {
        uint32_t caps = trainer_mem_caps(m->dims[i].ops);
        if (!(caps & (fsdp_device_mem_cap(t->dev) | FSDP_CAP_MEM_HOST))) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED,
                            "--backend %s: backend %s (dimension %s) takes neither --device %s's "
                            "memory nor host memory to stage it through",
                            t->cfg->backend[0] ? t->cfg->backend : m->dims[i].ops->name,
                            m->dims[i].ops->name, m->dims[i].name, t->dev->ops->name);
        }
        int staged = fsdp_group_set_stager(m->dims[i].group, &t->stager);
        FSDP_CHECK(staged);
        if (staged && t->dist->rank == 0) {
            char how[48];
            fsdp_group_stage_describe(m->dims[i].group, how, sizeof(how));
            FSDP_INFO(FSDP_SUB_TRAIN,
                      "mesh dimension %s: backend %s takes no %s device memory: "
                      "its collectives are staged through host buffers, in %s "
                      "(FSDPC_STAGE_CHUNK_BYTES)",
                      m->dims[i].name, m->dims[i].ops->name, t->dev->ops->name, how);
        }
    }
    return 0;
}

/*
 * The mesh over every rank (when launched with more than one, or asked for
 * one), with the dimensions this build trains with: dp shards, rdp
 * replicates. The world group comes after the ranks agree on the mesh.
 */
static int trainer_build_mesh(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_dist *d = t->dist;
    if (!d || (d->world_size <= 1 && !c->mesh[0])) {
        return 0;
    }
    /* host memory: every backend must take it; device memory: a backend
     * that cannot take it is staged through host buffers */
    uint32_t need = t->dev->mem == FSDP_MEM_HOST ? FSDP_CAP_MEM_HOST : 0;
    int rc = fsdp_mesh_create_for(d, c->mesh[0] ? c->mesh : NULL, c->backend[0] ? c->backend : NULL,
                                  need, &t->mesh);
    if (rc < 0) {
        trainer_mesh_hint(t, rc);
        return rc;
    }
    struct fsdp_mesh *m = t->mesh;
    struct fsdp_mesh_dims dims;
    if ((rc = fsdp_mesh_parse(m->spec, &dims)) == 0) {
        rc = fsdp_trainer_mesh_check(&dims);
    }
    if (rc < 0) {
        trainer_mesh_hint(t, rc);
        return rc;
    }
    if ((rc = trainer_stage_dims(t)) < 0) {
        trainer_mesh_hint(t, rc);
        return rc;
    }
    int dp = fsdp_mesh_dim_index(m, "dp"), rdp = fsdp_mesh_dim_index(m, "rdp");
    int tp = fsdp_mesh_dim_index(m, "tp");
    if (tp >= 0 && tp != m->ndims - 1 && d->rank == 0) {
        int stride = 1; /* row-major: a tp group's ranks lie this far apart */
        for (int i = tp + 1; i < m->ndims; i++) {
            stride *= m->dims[i].size;
        }
        FSDP_WARN(FSDP_SUB_TRAIN,
                  "mesh %s: tp is not the innermost dimension, so each tp group "
                  "takes ranks %d apart (not neighbours, not one node) and the tensor-parallel "
                  "collectives of every layer cross nodes; put tp last",
                  m->spec, stride);
    }
    if (dp >= 0 && rdp > dp && d->rank == 0) {
        /* row-major: the last dimension is the one whose groups are neighbours */
        FSDP_WARN(FSDP_SUB_TRAIN,
                  "mesh %s: the shard dimension dp is not the innermost, so each "
                  "shard group takes every %d-th rank (not neighbours, not one node) and its "
                  "all-gathers and reduce-scatters cross nodes; --mesh rdp=%d,dp=%d keeps them "
                  "within a node",
                  m->spec, m->dims[rdp].size, m->dims[rdp].size, m->dims[dp].size);
    }
    return 0;
}

int fsdp_trainer_reserve(struct fsdp_trainer *t, size_t plan)
{
    if (!t->dev->ops->reserve) {
        return 0;
    }
    size_t batch = 2 * (size_t)fsdp_train_config_step_tokens(t->cfg) * sizeof(int32_t);
    FSDP_DEBUG(FSDP_SUB_TRAIN, "device reserve: %zu bytes of plan and batches, %zu for kernels",
               plan + batch, FSDP_TRAINER_KERNEL_ROOM);
    return fsdp_device_reserve(t->dev, plan + batch + FSDP_TRAINER_KERNEL_ROOM);
}

struct fsdp_shard_shape fsdp_trainer_shard_shape(const struct fsdp_trainer *t)
{
    struct fsdp_group *dp = t->mesh ? fsdp_mesh_group(t->mesh, "dp") : NULL;
    struct fsdp_group *rdp = t->mesh ? fsdp_mesh_group(t->mesh, "rdp") : NULL;
    struct fsdp_group *tp = t->mesh ? fsdp_mesh_group(t->mesh, "tp") : NULL;
    struct fsdp_shard_shape sh = {
        .dp = dp ? dp->size : 1,
        .rdp = rdp ? rdp->size : 1,
        .tp = tp ? tp->size : 1,
        .dp_rank = dp ? dp->rank : 0,
        .tp_rank = tp ? tp->rank : 0,
    };
    return sh;
}

/* This rank's engine as --print-memory plans it, reserved. */
static int trainer_reserve(struct fsdp_trainer *t, const struct fsdp_optim_config *oc,
                           const struct fsdp_shard_config *sc)
{
    if (!t->dev->ops->reserve) {
        return 0;
    }
    struct fsdp_shard_shape sh = fsdp_trainer_shard_shape(t);
    struct fsdp_engine_stats st;
    FSDP_CHECK(fsdp_train_parts_plan(t->spec, &sh, t->dev, oc, sc, &st));
    return fsdp_trainer_reserve(t, st.peak_bytes + st.ckpt_bytes);
}

/*
 * The parallelisms applied to the model, in order, each through its own
 * layer: tensor parallelism over the mesh's tp group, the model on its
 * tp-local table, activation checkpointing and the optimizer (the parts,
 * which t keeps and destroys after the engine), then sharding over dp and
 * rdp (the engine).
 */
int fsdp_trainer_shard_engine(struct fsdp_trainer *t, struct fsdp_engine **out)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_group *pp = t->mesh ? fsdp_mesh_group(t->mesh, "pp") : NULL;
    if (pp && pp->size > 1) {
        return fsdp_trainer_pp_engine(t, out);
    }
    struct fsdp_optim_config oc;
    fsdp_train_config_optim(c, &oc);
    struct fsdp_shard_config sc;
    FSDP_CHECK(fsdp_train_config_shard(c, &sc));
    struct fsdp_shard_groups g = {
        .dp = t->mesh ? fsdp_mesh_group(t->mesh, "dp") : NULL,
        .rdp = t->mesh ? fsdp_mesh_group(t->mesh, "rdp") : NULL,
        .world_rank = fsdp_trainer_rank(t),
        .mesh = t->mesh ? t->mesh->spec : "single rank",
        .backends = t->mesh ? t->mesh->backends : "no backend",
    };
    struct fsdp_group *tp = t->mesh ? fsdp_mesh_group(t->mesh, "tp") : NULL;
    FSDP_CHECK(trainer_reserve(t, &oc, &sc));
    FSDP_CHECK(fsdp_train_parts_create(t->spec, tp, t->dev, &oc, &sc, &t->parts));
    return fsdp_shard_engine_create(&t->parts->shard, &g, t->dev, &sc, out);
}

/* The model file as a row source: its parameters (kind 0). */
static int trainer_file_rows(void *arg, int kind, size_t param, const struct fsdp_param_spec *p,
                             size_t row0, size_t rows, float *dst)
{
    (void)kind;
    (void)param;
    return fsdp_model_file_read_rows(arg, p->name, row0, rows, dst);
}

/* Every rank reads its part of every parameter from the model file into
 * the engine's pieces of kind 0: rows, or blocks of a tensor-parallel cut
 * (local; the caller agrees, then tells the engine, which is collective). */
static int trainer_load_model(struct fsdp_trainer *t, struct fsdp_model_file *mf)
{
    return fsdp_stage_fill_pieces(t->engine, t->spec, t->dev, 1, trainer_file_rows, mf);
}

/* The world group's backend: dp's (a mesh of tp alone: its own) when it
 * takes host memory, which the world's agreements are in; else the first
 * dimension's that does (nccl's dp beside mpi's rdp), else this launch's
 * default (mpi under mpiexec, else tcp). NULL: the group layer's default. */
static const struct fsdp_backend_ops *trainer_world_ops(const struct fsdp_trainer *t)
{
    const struct fsdp_mesh *m = t->mesh;
    if (!m) {
        return NULL;
    }
    int dp = fsdp_mesh_dim_index(m, "dp");
    const struct fsdp_backend_ops *ops = m->dims[dp >= 0 ? dp : 0].ops;
    for (int i = -1; i < m->ndims; i++) {
        const struct fsdp_backend_ops *o = i < 0 ? ops : m->dims[i].ops;
        if (trainer_mem_caps(o) & FSDP_CAP_MEM_HOST) {
            return o;
        }
    }
    const struct fsdp_backend_ops *dflt =
        fsdp_backend_find(fsdp_dist_mpi_available() ? "mpi" : "tcp");
    return dflt ? dflt : ops;
}

/*
 * Phase 2: the device, the mesh, the world group (each agreed on before the
 * next, which is collective), then the engine and its parameters.
 */
int fsdp_trainer_build_engine(struct fsdp_trainer *t, fsdp_engine_factory factory,
                              struct fsdp_model_file *mf)
{
    const struct fsdp_train_config *c = t->cfg;
    int rc = fsdp_device_create(c->device, t->dist ? t->dist->local_rank : 0, &t->dev);
    if (rc < 0) {
        fsdp_err_hint("this build's devices: %s (--device cpu always works; guarded checks that "
                      "nothing outside the device touches its memory)",
                      fsdp_device_names());
        rc = fsdp_trainer_blame(rc, "device");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "create its compute device"));
    if ((rc = trainer_build_mesh(t)) < 0) {
        rc = fsdp_trainer_blame(rc, "sharding engine");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "build the mesh"));
    if ((rc = fsdp_world_create(t->dist, trainer_world_ops(t), &t->world)) < 0) {
        rc = fsdp_trainer_blame(rc, "world group");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "create the world group"));
    t->world_ready = 1; /* from here agreements run over the world group */

    if ((rc = (factory ? factory : fsdp_trainer_shard_engine)(t, &t->engine)) < 0) {
        rc = fsdp_trainer_blame(rc, "sharding engine");
    }
    size_t n = (size_t)c->grad_accum * (size_t)c->batch_size * (size_t)c->seq_len;
    if (rc == 0) {
        t->batch_in = malloc(n * sizeof(int32_t));
        t->batch_tgt = malloc(n * sizeof(int32_t));
        if (!t->batch_in || !t->batch_tgt) {
            rc = fsdp_err(FSDP_ERR_NOMEM, "batch of %zu tokens", n);
        }
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "create the engine"));
    if ((rc = trainer_load_model(t, mf)) < 0) {
        rc = fsdp_trainer_blame(rc, "model");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "load the model"));
    return t->engine->ops->state_changed(t->engine);
}

/*
 * Token file for the model: vocabulary checked, one batch must fit. A
 * shared file is sliced over the ranks; with {rank} in path each rank reads
 * its own file whole (as rank 0 of 1). *per_rank: which of the two.
 */
int fsdp_trainer_open_data(struct fsdp_trainer *t, const char *path, const char *what,
                           struct fsdp_dataloader **out, int *per_rank)
{
    const struct fsdp_train_config *c = t->cfg;
    char mine[FSDP_TRAIN_PATH_MAX];
    int rc = fsdp_uneven_path(path, t->data_rank, mine, sizeof(mine), per_rank);
    if (rc == 0) {
        rc = fsdp_dataloader_create(mine, (size_t)c->batch_size, (size_t)c->seq_len,
                                    *per_rank ? 0 : t->data_rank, *per_rank ? 1 : t->data_world,
                                    t->spec->vocab_size, out);
    }
    if (rc < 0) {
        trainer_data_hint(what);
        return fsdp_trainer_blame(rc, what);
    }
    return 0;
}

int fsdp_trainer_open_val(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    if (!c->val_data[0]) {
        return 0;
    }
    int per_rank = 0;
    int rc = fsdp_trainer_open_data(t, c->val_data, "val-data", &t->val, &per_rank);
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "open its val-data file"));
    /* validation reads from the start of the file each time, without wrapping */
    size_t fits = (fsdp_tokens_count(t->val->tokens) - 1) / t->val->step_tokens;
    t->val_batches = c->val_batches < (long)fits ? c->val_batches : (long)fits;
    if (per_rank) { /* every rank runs as many as the shortest file holds */
        int32_t n = (int32_t)(t->val_batches < INT32_MAX ? t->val_batches : INT32_MAX);
        FSDP_CHECK(fsdp_world_min(t->world, &n, 1));
        t->val_batches = n;
    }
    return 0;
}

void fsdp_trainer_close_engine(struct fsdp_trainer *t)
{
    if (t->engine) {
        t->engine->ops->destroy(t->engine);
    }
    fsdp_train_parts_destroy(t->parts);
    free(t->batch_in);
    free(t->batch_tgt);
    fsdp_world_destroy(t->world);
    fsdp_mesh_destroy(t->mesh);
    fsdp_device_destroy(t->dev);
    fsdp_model_spec_destroy(t->spec);
}

/* Phase 3 on rank 0: the metrics file and its start record. */
int fsdp_trainer_open_metrics(struct fsdp_trainer *t)
{
    if (fsdp_trainer_rank(t) != 0) {
        return 0;
    }
    FSDP_CHECK(fsdp_metrics_open(t->cfg->metrics, &t->metrics));
    char *config = malloc(FSDP_TRAIN_JSON_MAX);
    if (!config) {
        return fsdp_err(FSDP_ERR_NOMEM, "metrics start record");
    }
    fsdp_train_config_json(t->cfg, config, FSDP_TRAIN_JSON_MAX);
    const size_t seqs =
        (size_t)t->cfg->batch_size * (size_t)t->cfg->grad_accum * (size_t)t->data_world;
    struct fsdp_run_start rs = {
        .run_id = t->run_id,
        .time = t->start_unix,
        .version = PACKAGE_VERSION,
        .world_size = fsdp_trainer_world(t),
        .global_batch_seqs = (long)seqs,
        .global_batch_tokens = (long)(seqs * (size_t)t->cfg->seq_len),
        .steps = t->total_steps,
        .resumed_from = t->count.resumed_from,
        .resumed_dir = t->count.resumed_dir,
        .config_json = config,
    };
    int rc = fsdp_metrics_start(t->metrics, &rs);
    free(config);
    return rc;
}

int fsdp_trainer_peak(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *cfg = t->cfg;
    if (cfg->peak_flops > 0) {
        t->peak_flops = cfg->peak_flops;
        snprintf(t->peak_method, sizeof(t->peak_method), "--peak-flops");
        return 0;
    }
    return fsdp_peak_flops(t->dev, (enum fsdp_dtype)fsdp_train_config_dtype(cfg->param_dtype),
                           (int)cfg->threads, &t->peak_flops, t->peak_method,
                           sizeof(t->peak_method));
}
