/*
 * trainer.c - the composition root and the training loop (see trainer.h).
 * Builds the mesh, the world group, the model's table and the engine, and
 * owns the loaders, the schedule, metrics and the run's cadence; it moves
 * parameters only between files and the engine's state pieces. Every rank
 * runs the same sequence of engine calls; only rank 0 prints and writes
 * metrics.
 */
#include "config.h"
#include "train/trainer.h"
#include "train/ckpt_cadence.h"
#include "train/model_source.h"
#include "train/stop.h"
#include "train/uneven.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "comm/debug.h"
#include "comm/mesh.h"
#include "comm/mesh_spec.h"
#include "train/mesh_check.h"
#include "compute/device.h"
#include "train/stage.h"
#include "fsdp/fsdp.h"
#include "io/h5/model_file.h"
#include "io/text/tokens.h"
#include "model/model.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// setup

/* Seconds since the epoch, for the metrics file's timestamps. */
static double trainer_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int trainer_world(const struct fsdp_trainer *t)
{
    return t->dist ? t->dist->world_size : 1;
}

static int trainer_rank(const struct fsdp_trainer *t)
{
    return t->dist ? t->dist->rank : 0;
}

/*
 * This rank's place among the data-parallel ranks, from --mesh: its
 * coordinates in every dimension but tp, row-major (the order the mesh
 * lays ranks out in), so that tp peers read the same batch and the global
 * batch is batch-size x the product of the other dimensions. A mesh that
 * does not parse or cover the world is left to the mesh's own checks.
 */
static void trainer_data_place(struct fsdp_trainer *t)
{
    struct fsdp_mesh_dims d;
    const int rank = trainer_rank(t), world = trainer_world(t);
    t->tp = 1;
    t->data_rank = rank;
    t->data_world = world;
    if (!t->cfg->mesh[0]) {
        return;
    }
    if (fsdp_mesh_parse(t->cfg->mesh, &d) < 0 || d.nranks != world) {
        fsdp_err_clear();
        return;
    }
    int rem = rank, idx = 0, span = 1;
    for (int i = d.ndims - 1; i >= 0; i--) {
        int coord = rem % d.size[i];
        rem /= d.size[i];
        if (strcmp(d.name[i], "tp") == 0) {
            t->tp = d.size[i];
            continue;
        }
        idx += coord * span;
        span *= d.size[i];
    }
    t->data_rank = idx;
    t->data_world = span;
}

/* Prefixes the recorded error message with the option it concerns. */
static int trainer_blame(int rc, const char *what)
{
    char msg[1024];
    fsdp_err_take(msg, sizeof(msg));
    if (rc == FSDP_ERR_ABORTED && !msg[0]) {
        return rc; /* another rank reports it (fsdp_trainer_create) */
    }
    return fsdp_err(rc, "%s: %s", what, msg);
}

/* The error this rank brought to an agreement, put back after it (the
 * agreement's own calls may clear the thread's record). */
static int trainer_restore(int rc, const char *msg, const char *hint)
{
    fsdp_err_clear();
    rc = fsdp_err(rc, "%s", msg);
    if (hint[0]) {
        fsdp_err_hint("%s", hint);
    }
    return rc;
}

int fsdp_trainer_agree(struct fsdp_trainer *t, int rc, const char *what)
{
    /* 2: this rank has a message to report, 1: it failed and another reports */
    const int state = rc >= 0 ? 0 : fsdp_err_msg()[0] ? 2 : 1;
    char msg[900], hint[512];
    int first, n, arc;
    snprintf(msg, sizeof(msg), "%s", fsdp_err_msg());
    snprintf(hint, sizeof(hint), "%s", fsdp_err_hint_msg());
    if (t->world_ready) {
        arc = fsdp_world_agree(t->world, state, &first, &n);
    } else {
        char name[32];
        snprintf(name, sizeof(name), "setup%d", t->agree_seq++);
        arc = fsdp_world_agree_store(t->dist, name, state, &first, &n);
    }
    if (arc < 0) { /* nobody knows who failed: the job aborts on this rank's error */
        return rc < 0 ? trainer_restore(rc, msg, hint) : arc;
    }
    fsdp_err_clear();
    if (n == 0) {
        return 0;
    }
    if (first != trainer_rank(t)) {
        if (first >= 0) {
            FSDP_INFO(FSDP_SUB_TRAIN, "rank %d could not %s; it reports why", first, what);
        } else if (trainer_rank(t) == 0) {
            return fsdp_err(FSDP_ERR_ABORTED, "%d rank%s could not %s", n, n > 1 ? "s" : "", what);
        }
        return FSDP_ERR_ABORTED;
    }
    char full[1024];
    if (rc == FSDP_ERR_ABORTED) { /* agreed on before: the message has its class */
        snprintf(full, sizeof(full), "%s", msg);
    } else if (n == 1 || n == trainer_world(t)) {
        snprintf(full, sizeof(full), "%s (%s)", msg, fsdp_strerror(rc));
    } else {
        snprintf(full, sizeof(full), "%s (%s; %d of %d ranks failed here, this is the lowest)",
                 msg, fsdp_strerror(rc), n, trainer_world(t));
    }
    return trainer_restore(FSDP_ERR_ABORTED, full, hint);
}

// ----------------------------------------------------------------------------
// inputs every rank checks before anything is built

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
        return trainer_blame(rc, "model");
    }
    if (c->seq_len > t->spec->context) {
        rc = fsdp_err(FSDP_ERR_INVALID, "seq-len %ld is longer than the context %d of model %s",
                      c->seq_len, t->spec->context, c->model);
        fsdp_err_hint("lower --seq-len to at most %d, or make a model with a longer context "
                      "('fsdpc-ckpt init --context N')", t->spec->context);
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
        return trainer_blame(rc, what);
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
                      "or make the model with a larger --vocab", what);
    } else if (strstr(msg, "one global batch")) {
        fsdp_err_hint("the %s file is shorter than one global batch (ranks x batch-size x seq-len "
                      "tokens, plus one): use more text, or lower --batch-size or --seq-len",
                      what);
    }
}

/* Phase 1: what each rank can check alone; the model file stays open. */
static int trainer_check_inputs(struct fsdp_trainer *t, struct fsdp_model_file **mf)
{
    const struct fsdp_train_config *c = t->cfg;
    FSDP_CHECK(trainer_check_out(c->out));
    trainer_data_place(t);
    FSDP_CHECK(fsdp_model_registry_init());
    FSDP_CHECK(trainer_open_model(t, mf));
    if (c->mesh[0]) { /* before any group is built for it */
        FSDP_CHECK(fsdp_trainer_mesh_precheck(c->mesh, t->spec, trainer_world(t)));
    }
    FSDP_CHECK(trainer_check_readable(t, c->data, "data"));
    if (c->val_data[0]) {
        FSDP_CHECK(trainer_check_readable(t, c->val_data, "val-data"));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the mesh, the world group and the engine

/* What to do about a mesh or backend that could not be built. */
static void trainer_mesh_hint(const struct fsdp_trainer *t, int rc)
{
    const int w = trainer_world(t);
    if (rc == FSDP_ERR_UNSUPPORTED) {
        fsdp_err_hint("the trainer computes on the CPU, in host memory: use --backend mpi "
                      "(under mpiexec or srun) or --backend tcp; nccl serves fsdpc-bench only");
    } else if (rc == FSDP_ERR_INVALID) {
        fsdp_err_hint("--mesh is dp=N (shard over N ranks), rdp=R,dp=N (R replicas of N-way "
                      "shards) or either with tp=T last (tensor parallel over T ranks), the sizes "
                      "multiplying to the number of ranks, %d here (--mesh dp=%d)", w, w);
    } else if (rc == FSDP_ERR_MISMATCH) {
        fsdp_err_hint("start every rank with the same --mesh and --backend");
    }
}

/* Each dimension whose backend cannot take the device's memory stages it
 * through host buffers (comm/group.h); rank 0 says which. */
static int trainer_stage_dims(struct fsdp_trainer *t)
{
    struct fsdp_mesh *m = t->mesh;
    fsdp_stage_stager(t->dev, &t->stager);
    for (int i = 0; i < m->ndims; i++) {
        int staged = fsdp_group_set_stager(m->dims[i].group, &t->stager);
        FSDP_CHECK(staged);
        if (staged && t->dist->rank == 0) {
            FSDP_INFO(FSDP_SUB_TRAIN,
                      "mesh dimension %s: backend %s takes no %s device memory: "
                      "its collectives are staged through host buffers",
                      m->dims[i].name, m->dims[i].ops->name, t->dev->ops->name);
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
    FSDP_CHECK(trainer_stage_dims(t));
    int dp = fsdp_mesh_dim_index(m, "dp"), rdp = fsdp_mesh_dim_index(m, "rdp");
    int tp = fsdp_mesh_dim_index(m, "tp");
    if (tp >= 0 && tp != m->ndims - 1 && d->rank == 0) {
        int stride = 1; /* row-major: a tp group's ranks lie this far apart */
        for (int i = tp + 1; i < m->ndims; i++) {
            stride *= m->dims[i].size;
        }
        FSDP_WARN(FSDP_SUB_TRAIN, "mesh %s: tp is not the innermost dimension, so each tp group "
                  "takes ranks %d apart (not neighbours, not one node) and the tensor-parallel "
                  "collectives of every layer cross nodes; put tp last", m->spec, stride);
    }
    if (dp >= 0 && rdp > dp && d->rank == 0) {
        /* row-major: the last dimension is the one whose groups are neighbours */
        FSDP_WARN(FSDP_SUB_TRAIN, "mesh %s: the shard dimension dp is not the innermost, so each "
                  "shard group takes every %d-th rank (not neighbours, not one node) and its "
                  "all-gathers and reduce-scatters cross nodes; --mesh rdp=%d,dp=%d keeps them "
                  "within a node", m->spec, m->dims[rdp].size, m->dims[rdp].size,
                  m->dims[dp].size);
    }
    return 0;
}

/* Room the kernel table's own workspaces take beside the plan (cuBLASLt's
 * workspace and staging, the norms' partial sums, the cast chunk). */
#define TRAINER_KERNEL_ROOM ((size_t)256 << 20)

/* A device that keeps an arena (a GPU's) takes this rank's whole plan at
 * once, as --print-memory plans it, so no step allocates from the runtime. */
static int trainer_reserve(struct fsdp_trainer *t, const struct fsdp_shard_groups *g,
                           const struct fsdp_optim_config *oc, const struct fsdp_shard_config *sc)
{
    if (!t->dev->ops->reserve) {
        return 0;
    }
    struct fsdp_shard_shape sh = {
        .dp = g->dp ? g->dp->size : 1,
        .rdp = g->rdp ? g->rdp->size : 1,
        .tp = g->tp ? g->tp->size : 1,
        .dp_rank = g->dp ? g->dp->rank : 0,
        .tp_rank = g->tp ? g->tp->rank : 0,
    };
    struct fsdp_engine_stats st;
    FSDP_CHECK(fsdp_shard_engine_plan(t->spec, &sh, t->dev, oc, sc, &st));
    size_t batch = 2 * (size_t)fsdp_train_config_step_tokens(t->cfg) * sizeof(int32_t);
    return fsdp_device_reserve(t->dev, st.peak_bytes + st.ckpt_bytes + batch +
                                           TRAINER_KERNEL_ROOM);
}

int fsdp_trainer_shard_engine(struct fsdp_trainer *t, struct fsdp_engine **out)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_optim_config oc;
    fsdp_train_config_optim(c, &oc);
    struct fsdp_shard_config sc;
    FSDP_CHECK(fsdp_train_config_shard(c, &sc));
    struct fsdp_shard_groups g = {
        .dp = t->mesh ? fsdp_mesh_group(t->mesh, "dp") : NULL,
        .rdp = t->mesh ? fsdp_mesh_group(t->mesh, "rdp") : NULL,
        .world_rank = trainer_rank(t),
        .mesh = t->mesh ? t->mesh->spec : "single rank",
        .backends = t->mesh ? t->mesh->backends : "no backend",
        .tp = t->mesh ? fsdp_mesh_group(t->mesh, "tp") : NULL,
    };
    FSDP_CHECK(trainer_reserve(t, &g, &oc, &sc));
    return fsdp_shard_engine_create(t->spec, &g, t->dev, &oc, &sc, out);
}

/* A piece of columns [col0, col0 + cols) of its rows: the rows are read
 * whole, a few at a time through buf (room for `room` floats, at least
 * one row), and the piece's columns kept. */
static int trainer_read_block(struct fsdp_stage *st, struct fsdp_model_file *mf,
                              const struct fsdp_param_spec *p, const struct fsdp_state_piece *pc,
                              size_t cols)
{
    size_t W = p->shape[1];
    FSDP_CHECK(fsdp_stage_reserve(st, W * (((size_t)4 << 20) / W + 1), p->name));
    size_t step = st->cap / W;
    for (size_t r = 0; r < pc->rows; r += step) {
        size_t n = pc->rows - r < step ? pc->rows - r : step;
        FSDP_CHECK(fsdp_model_file_read_rows(mf, p->name, pc->row0 + r, n, st->buf));
        for (size_t i = 0; i < n; i++) {
            FSDP_CHECK(fsdp_device_write(st->dev, pc->data + (r + i) * cols,
                                         st->buf + i * W + pc->col0, cols * sizeof(float)));
        }
        /* the buffer is read again by the next rows */
        FSDP_CHECK(st->dev->ops->synchronize(st->dev, st->dev->stream));
    }
    return 0;
}

/* Every rank reads its part of every parameter from the model file into
 * the engine's pieces of kind 0: rows, or blocks of a tensor-parallel cut
 * (local; the caller agrees, then tells the engine, which is collective). */
static int trainer_load_model(struct fsdp_trainer *t, struct fsdp_model_file *mf)
{
    struct fsdp_engine *e = t->engine;
    size_t n = e->ops->n_pieces(e);
    struct fsdp_stage st;
    int rc = 0;
    fsdp_stage_init(&st, t->dev);
    for (size_t k = 0; k < n && rc == 0; k++) {
        struct fsdp_state_piece pc = {0};
        e->ops->piece(e, k, &pc);
        const struct fsdp_param_spec *p = &t->spec->params[pc.param];
        size_t cols = fsdp_state_piece_cols(&pc, p->shape[1]);
        if (pc.kind != 0 || pc.rows == 0) {
            continue;
        }
        if (cols == p->shape[1]) { /* whole rows: through the stage */
            size_t floats = pc.rows * cols;
            rc = fsdp_stage_reserve(&st, floats, p->name);
            rc = rc < 0 ? rc : fsdp_model_file_read_rows(mf, p->name, pc.row0, pc.rows, st.buf);
            rc = rc < 0 ? rc : fsdp_stage_write(&st, pc.data, st.buf, floats);
            continue;
        }
        rc = trainer_read_block(&st, mf, p, &pc, cols); /* a few MiB of whole rows at a time */
    }
    fsdp_stage_free(&st);
    return rc;
}

/*
 * Phase 2: the device, the mesh, the world group (each agreed on before the
 * next, which is collective), then the engine and its parameters.
 */
static int trainer_build_engine(struct fsdp_trainer *t, fsdp_engine_factory factory,
                                struct fsdp_model_file *mf)
{
    const struct fsdp_train_config *c = t->cfg;
    int rc = fsdp_device_create(c->device, t->dist ? t->dist->local_rank : 0, &t->dev);
    if (rc < 0) {
        fsdp_err_hint("this build's devices: %s (--device cpu always works; guarded checks that "
                      "nothing outside the device touches its memory)",
                      fsdp_device_names());
        rc = trainer_blame(rc, "device");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "create its compute device"));
    if ((rc = trainer_build_mesh(t)) < 0) {
        rc = trainer_blame(rc, "sharding engine");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "build the mesh"));
    const struct fsdp_backend_ops *ops = NULL;
    if (t->mesh) { /* dp's backend (a mesh of tp alone: its own) */
        int dp = fsdp_mesh_dim_index(t->mesh, "dp");
        ops = t->mesh->dims[dp >= 0 ? dp : 0].ops;
    }
    if ((rc = fsdp_world_create(t->dist, ops, &t->world)) < 0) {
        rc = trainer_blame(rc, "world group");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "create the world group"));
    t->world_ready = 1; /* from here agreements run over the world group */

    if ((rc = (factory ? factory : fsdp_trainer_shard_engine)(t, &t->engine)) < 0) {
        rc = trainer_blame(rc, "sharding engine");
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
        rc = trainer_blame(rc, "model");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "load the model"));
    return t->engine->ops->state_changed(t->engine);
}

// ----------------------------------------------------------------------------
// data

/*
 * Token file for the model: vocabulary checked, one batch must fit. A
 * shared file is sliced over the ranks; with {rank} in path each rank reads
 * its own file whole (as rank 0 of 1). *per_rank: which of the two.
 */
static int trainer_open_data(struct fsdp_trainer *t, const char *path, const char *what,
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
        return trainer_blame(rc, what);
    }
    return 0;
}

static int trainer_open_val(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    if (!c->val_data[0]) {
        return 0;
    }
    int per_rank = 0;
    int rc = trainer_open_data(t, c->val_data, "val-data", &t->val, &per_rank);
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

static void trainer_close_engine(struct fsdp_trainer *t)
{
    if (t->engine) {
        t->engine->ops->destroy(t->engine);
    }
    free(t->batch_in);
    free(t->batch_tgt);
    fsdp_world_destroy(t->world);
    fsdp_mesh_destroy(t->mesh);
    fsdp_device_destroy(t->dev);
    fsdp_model_spec_destroy(t->spec);
}

/* A run id: random enough to tell runs appended to one metrics file apart. */
static void trainer_run_id(struct fsdp_trainer *t)
{
    uint64_t x = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(t->start_unix * 1e6);
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        uint64_t r;
        if (fread(&r, sizeof(r), 1, f) == 1) {
            x ^= r;
        }
        fclose(f);
    }
    snprintf(t->run_id, sizeof(t->run_id), "%016llx", (unsigned long long)x);
}

/* Phase 3 on rank 0: the metrics file and its start record. */
static int trainer_open_metrics(struct fsdp_trainer *t)
{
    if (trainer_rank(t) != 0) {
        return 0;
    }
    FSDP_CHECK(fsdp_metrics_open(t->cfg->metrics, &t->metrics));
    char *config = malloc(FSDP_TRAIN_JSON_MAX);
    if (!config) {
        return fsdp_err(FSDP_ERR_NOMEM, "metrics start record");
    }
    fsdp_train_config_json(t->cfg, config, FSDP_TRAIN_JSON_MAX);
    const size_t seqs = (size_t)t->cfg->batch_size * (size_t)t->cfg->grad_accum *
                        (size_t)t->data_world;
    struct fsdp_run_start rs = {
        .run_id = t->run_id,
        .time = t->start_unix,
        .version = PACKAGE_VERSION,
        .world_size = trainer_world(t),
        .global_batch_seqs = (long)seqs,
        .global_batch_tokens = (long)(seqs * (size_t)t->cfg->seq_len),
        .steps = t->total_steps,
        .resumed_from = t->resumed_from,
        .resumed_dir = t->resumed_dir,
        .config_json = config,
    };
    int rc = fsdp_metrics_start(t->metrics, &rs);
    free(config);
    return rc;
}

static int trainer_peak(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *cfg = t->cfg;
    if (cfg->peak_flops > 0) {
        t->peak_flops = cfg->peak_flops;
        snprintf(t->peak_method, sizeof(t->peak_method), "--peak-flops");
        return 0;
    }
    return fsdp_probe_peak_flops((int)cfg->threads, &t->peak_flops, t->peak_method,
                                 sizeof(t->peak_method));
}

/* Phase 3: loaders, passes, checkpoints, resume, metrics and peak FLOP/s. */
static int trainer_open_run(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *cfg = t->cfg;
    int rc = trainer_open_data(t, cfg->data, "data", &t->train, &t->per_rank_data);
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "open its data file"));
    FSDP_CHECK(trainer_open_val(t));
    rc = fsdp_uneven_create(t, &t->uneven);
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "plan the passes over its data"));
    t->total_steps = t->uneven ? t->uneven->total_steps : cfg->steps;
    t->sched.steps = t->total_steps;
    rc = fsdp_ckpt_cadence_create(t, &t->ckpt);
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "prepare ckpt-dir"));
    if ((rc = fsdp_ckpt_resume(t)) < 0) {
        rc = trainer_blame(rc, "resume");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "resume"));
    t->start_step = t->step;
    FSDP_CHECK(fsdp_trainer_agree(t, trainer_open_metrics(t), "open the metrics file"));
    return fsdp_trainer_agree(t, trainer_peak(t), "measure its peak FLOP/s");
}

int fsdp_trainer_create(const struct fsdp_train_config *cfg, struct fsdp_dist *dist,
                        fsdp_engine_factory factory, struct fsdp_trainer **out)
{
    struct fsdp_trainer *t = calloc(1, sizeof(*t));
    struct fsdp_model_file *mf = NULL;
    int rc;
    if (!t) {
        return fsdp_err(FSDP_ERR_NOMEM, "trainer");
    }
    t->cfg = cfg;
    t->dist = dist;
    t->last_loss = NAN;
    t->last_val_loss = NAN;
    t->resumed_from = -1;
    t->start_unix = trainer_wall();
    trainer_run_id(t);
    fsdp_lr_schedule_init(&t->sched, cfg);
    openblas_set_num_threads((int)cfg->threads);

    rc = trainer_check_inputs(t, &mf);
    rc = fsdp_trainer_agree(t, rc, "read its inputs");
    if (rc == 0) {
        rc = trainer_build_engine(t, factory, mf);
    }
    fsdp_model_file_close(mf);
    if (rc == 0) {
        rc = trainer_open_run(t);
    }
    if (rc < 0) {
        fsdp_trainer_destroy(t);
        return rc;
    }
    fsdp_stop_install(trainer_rank(t));
    *out = t;
    return 0;
}

void fsdp_trainer_destroy(struct fsdp_trainer *t)
{
    if (!t) {
        return;
    }
    fsdp_stop_restore();
    fsdp_metrics_close(t->metrics);
    fsdp_ckpt_cadence_destroy(t->ckpt);
    fsdp_uneven_destroy(t->uneven);
    fsdp_dataloader_destroy(t->val);
    fsdp_dataloader_destroy(t->train);
    trainer_close_engine(t);
    free(t);
}

// ----------------------------------------------------------------------------
// reporting

static size_t trainer_step_tokens(const struct fsdp_trainer *t)
{
    return fsdp_train_config_step_tokens(t->cfg) * (size_t)t->data_world;
}

void fsdp_trainer_print_header(const struct fsdp_trainer *t, FILE *fp)
{
    const struct fsdp_train_config *c = t->cfg;
    const struct fsdp_model_spec *ms = t->engine->spec;
    size_t step_tokens = trainer_step_tokens(t);
    size_t n_train = fsdp_tokens_count(t->train->tokens);
    char arch[256];
    fsdp_arch_describe(ms->arch, ms->cfg, arch, sizeof(arch));
    fprintf(fp, "model: %s | %s %s | %.2fM parameters\n", c->model, ms->arch->name, arch,
            (double)ms->total_numel / 1e6);
    if (strcmp(c->model, t->model_path) != 0) {
        fprintf(fp, "model weights: %s (the checkpoint's index.h5; its optimizer state and step "
                "are not used: --resume continues a run)\n", t->model_path);
    }
    if (t->per_rank_data) {
        fprintf(fp, "data: %s, one file per rank | rank 0: %s, %zu tokens\n", c->data,
                fsdp_tokens_path(t->train->tokens), n_train);
    } else {
        fprintf(fp, "data: %s | %zu tokens | %.1f steps per epoch\n", c->data, n_train,
                (double)(n_train - 1) / (double)step_tokens);
    }
    if (t->uneven) {
        char line[256];
        fsdp_uneven_describe(t->uneven, t, line, sizeof(line));
        fprintf(fp, "%s\n", line);
    }
    if (t->val) {
        char when[64] = "at the end";
        if (c->val_every > 0) {
            snprintf(when, sizeof(when), "every %ld steps", c->val_every);
        }
        fprintf(fp, "val data: %s | %zu tokens | %ld batches per validation, %s\n", c->val_data,
                fsdp_tokens_count(t->val->tokens), t->val_batches, when);
    }
    char tpn[64] = "";
    if (t->tp > 1) {
        snprintf(tpn, sizeof(tpn), " (of %d: tp peers share a batch)", trainer_world(t));
    }
    fprintf(fp, "batch: %d rank%s%s x %ld seq x %ld tokens x %ld micro-steps = %zu tokens per "
            "step\n", t->data_world, t->data_world > 1 ? "s" : "", tpn, c->batch_size,
            c->seq_len, c->grad_accum, step_tokens);
    char staged[96] = "";
    for (int i = 0; t->mesh && i < t->mesh->ndims; i++) {
        if (t->mesh->dims[i].group->stager) {
            size_t n = strlen(staged);
            snprintf(staged + n, sizeof(staged) - n, "%s%s", n ? "," : "; staged through host "
                     "buffers: ", t->mesh->dims[i].name);
        }
    }
    fprintf(fp, "compute: %s on every rank, %s memory, %ld BLAS thread%s per rank%s\n",
            t->dev->ops->name, t->dev->mem == FSDP_MEM_HOST ? "host" : "device", c->threads,
            c->threads > 1 ? "s" : "", staged);
    fprintf(fp, "engine: %s | peak %.1f GFLOP/s per rank (%s) | %.2f MFLOP per token\n",
            t->engine->ops->name, t->peak_flops / 1e9, t->peak_method,
            t->engine->flops_per_token / 1e6);
    char line[512];
    t->engine->ops->describe(t->engine, line, sizeof(line));
    if (line[0]) {
        fprintf(fp, "%s\n", line);
    }
    if (t->resumed_from >= 0) {
        fprintf(fp, "resumed: %s | step %ld of %ld\n", t->resumed_dir, t->resumed_from,
                t->total_steps);
    }
    fflush(fp);
}

static int trainer_should_log(const struct fsdp_trainer *t)
{
    long s = t->step; /* 1-based number of the step just done */
    return s == 1 || s == t->total_steps || s % t->cfg->log_every == 0;
}

/* Seconds left at this run's pace: the mean step after its first (which
 * warms caches and connections up), with the validations and checkpoint
 * saves so far spread over the steps, times the steps to go; -1: unknown. */
static double trainer_eta(const struct fsdp_trainer *t, double first_step_s)
{
    long done = t->step - t->start_step, left = t->total_steps - t->step;
    if (done < 1 || left <= 0) {
        return -1.0;
    }
    double per = done > 1 ? (t->train_seconds - first_step_s) / (double)(done - 1)
                          : t->train_seconds;
    return (per + t->side_seconds / (double)done) * (double)left;
}

// ----------------------------------------------------------------------------
// the loop

/* This rank's K micro-batches from the loader into the batch arrays. */
static int trainer_next_batch(struct fsdp_trainer *t, struct fsdp_batch *b)
{
    const size_t bt = (size_t)b->B * (size_t)b->T;
    for (int k = 0; k < b->K; k++) {
        FSDP_CHECK(fsdp_dataloader_next(t->train));
        memcpy(t->batch_in + k * bt, t->train->inputs, bt * sizeof(int32_t));
        memcpy(t->batch_tgt + k * bt, t->train->targets, bt * sizeof(int32_t));
    }
    b->inputs = t->batch_in;
    b->targets = t->batch_tgt;
    return 0;
}

/*
 * A step the engine refused. A non-finite gradient norm is the group's
 * decision (the engine reduces the norm before it judges it), so every rank
 * is here at once and they agree on one report; anything else may be this
 * rank's alone and goes up as it is.
 */
static int trainer_step_failed(struct fsdp_trainer *t, int rc, const struct fsdp_step_result *res)
{
    char what[32];
    snprintf(what, sizeof(what), "step %ld", t->step + 1);
    const int group = rc == FSDP_ERR_INVALID && !isfinite(res->grad_norm);
    if (group) {
        fsdp_err_hint("lower --lr (or --warmup longer), keep --clip on, and look at the data "
                      "around this step; with --param-dtype f16 use --loss-scale dynamic");
    }
    rc = trainer_blame(rc, what);
    return group ? fsdp_trainer_agree(t, rc, "finish the step") : rc;
}

/* After the first step, at debug level, the device's live buffers (a
 * device that names them): what --print-memory's plan is checked against. */
static void trainer_log_buffers(const struct fsdp_trainer *t)
{
    struct fsdp_device_buffer b[64];
    struct fsdp_device *d = t->dev;
    if (!d->ops->buffers || !fsdp_log_enabled(FSDP_LOG_DEBUG, FSDP_SUB_TRAIN)) {
        return;
    }
    size_t n = d->ops->buffers(d, b, 64);
    for (size_t i = 0; i < n && i < 64; i++) {
        FSDP_DEBUG(FSDP_SUB_TRAIN, "device buffer after the first step: %zu bytes '%s'",
                   b[i].bytes, b[i].name);
    }
    FSDP_DEBUG(FSDP_SUB_TRAIN, "device buffers after the first step: %zu, %zu bytes in all", n,
               d->stats.bytes_now);
}

int fsdp_trainer_step(struct fsdp_trainer *t, struct fsdp_step_stats *stats)
{
    const struct fsdp_train_config *c = t->cfg;
    const struct fsdp_uneven *u = t->uneven;
    struct fsdp_step_result res = {0};
    double lr = fsdp_lr_at(&t->sched, t->step);
    uint64_t epoch = t->train->epoch;
    /* with epochs the vote before this step said who has a batch (every tp
     * peer of a data-parallel rank alike) */
    int contrib = (u ? u->n_contrib : trainer_world(t)) / t->tp;
    double t0 = fsdp_now();
    struct fsdp_batch b = {.K = (int)c->grad_accum, .B = (int)c->batch_size, .T = (int)c->seq_len};
    int rc = 0;
    if (!u || u->have) {
        rc = trainer_next_batch(t, &b);
        if (rc < 0) {
            char what[32];
            snprintf(what, sizeof(what), "step %ld", t->step + 1);
            return trainer_blame(rc, what);
        }
    }
    const struct fsdp_device_stats ds = t->dev->stats;
    rc = t->engine->ops->step(t->engine, &b, lr, contrib, &res);
    double dt = fsdp_now() - t0;
    if (rc < 0) {
        return trainer_step_failed(t, rc, &res);
    }
    t->step++;
    if (t->step == t->start_step + 1) {
        trainer_log_buffers(t);
    }
    /* what the step made the host wait for (doc/design.md lists each) */
    FSDP_DEBUG(FSDP_SUB_TRAIN, "step %ld: device %s: %ld host waits, %ld device-to-host copies",
               t->step, t->dev->ops->name, t->dev->stats.host_waits - ds.host_waits,
               t->dev->stats.d2h_copies - ds.d2h_copies);
    fsdp_debug_mark_steady(); /* from now on collectives get the regular deadline */
    t->train_seconds += dt;
    if (t->step == t->start_step + 1) {
        t->first_step_s = dt;
    }
    t->last_loss = res.loss;
    if (t->train->epoch != epoch) {
        FSDP_INFO(FSDP_SUB_TRAIN, "step %ld: pass %llu over %s complete, starting again", t->step,
                  (unsigned long long)t->train->epoch, c->data);
    }

    double tokens = (double)fsdp_train_config_step_tokens(c) * (double)contrib;
    t->tokens_seen += tokens;
    t->run_tokens += tokens;
    memset(stats, 0, sizeof(*stats));
    stats->step = t->step;
    stats->steps = t->total_steps;
    stats->loss = res.loss;
    stats->grad_norm = res.grad_norm;
    stats->loss_scale = res.loss_scale;
    stats->lr = lr;
    stats->ms = dt * 1e3;
    stats->tokens_per_s = tokens / dt;
    stats->mfu = fsdp_mfu(t->engine->flops_per_token * stats->tokens_per_s / trainer_world(t),
                          &t->peak_flops, t->cfg->peak_flops > 0, t->step, &t->peak_beaten);
    stats->mem_mib = fsdp_peak_rss_mib();
    stats->tokens = t->tokens_seen;
    stats->eta_s = trainer_eta(t, t->first_step_s);
    stats->time = trainer_wall();
    if (t->metrics && trainer_should_log(t)) {
        FSDP_CHECK(fsdp_metrics_step(t->metrics, stats, 1));
    }
    return 0;
}

int fsdp_trainer_validate(struct fsdp_trainer *t, double *val_loss)
{
    struct fsdp_dataloader_state start = {0, 0, 0};
    double sum = 0.0;
    if (!t->val) {
        return fsdp_err(FSDP_ERR_INVALID, "validation needs val-data");
    }
    FSDP_CHECK(fsdp_dataloader_set_state(t->val, &start));
    for (long i = 0; i < t->val_batches; i++) {
        double loss;
        FSDP_CHECK(fsdp_dataloader_next(t->val));
        FSDP_CHECK(t->engine->ops->eval(t->engine, t->val->inputs, t->val->targets, &loss));
        sum += loss;
    }
    *val_loss = sum / (double)t->val_batches;
    t->last_val_loss = *val_loss;
    if (t->metrics) {
        FSDP_CHECK(fsdp_metrics_val(t->metrics, t->step, t->total_steps, *val_loss,
                                    t->val_batches, trainer_wall()));
    }
    return 0;
}

/*
 * The agreement between two steps: with epochs, who has a batch for the next
 * step, folded with the stop signal into one collective; otherwise the
 * signal alone (one small all-reduce; nothing with one rank). *sig is the
 * highest signal number any rank received, 0: none.
 */
static int trainer_agree(struct fsdp_trainer *t, int *sig)
{
    int mine = fsdp_stop_signal();
    *sig = 0;
    if (t->uneven) {
        return fsdp_uneven_vote(t->uneven, t, mine, sig);
    }
    int32_t v = mine;
    FSDP_CHECK(fsdp_world_max(t->world, &v, 1));
    *sig = v;
    return 0;
}

/* The whole model into path: the engine gathers unit by unit, rank 0
 * writes, and every rank learns whether the file was written. */
static int trainer_save_model(struct fsdp_trainer *t, const char *path, const char *created_by)
{
    struct fsdp_model_write_opts opts = {.created_by = created_by, .dtype = FSDP_F32};
    struct fsdp_model_writer *w = NULL;
    const int writer = trainer_rank(t) == 0;
    int rc = writer ? fsdp_model_writer_create(path, t->spec, &opts, &w) : 0;
    struct fsdp_stage st;
    fsdp_stage_init(&st, t->dev);
    for (int u = 0; u < t->spec->n_units; u++) {
        const float *full, *host;
        int grc = t->engine->ops->gather_unit(t->engine, u, &full);
        if (grc < 0) {
            fsdp_stage_free(&st);
            fsdp_model_writer_destroy(w);
            return grc; /* a collective failed: every rank hears of it */
        }
        if (writer && rc == 0) {
            rc = fsdp_stage_read(&st, full, t->spec->unit_numel[u], &host);
            rc = rc < 0 ? rc : fsdp_model_writer_put_unit(w, u, host);
        }
    }
    fsdp_stage_free(&st);
    if (writer && rc == 0) {
        rc = fsdp_model_writer_commit(w);
    }
    fsdp_model_writer_destroy(w);
    FSDP_CHECK(t->engine->ops->state_changed(t->engine));
    if (rc < 0) {
        fsdp_err_hint("check the space and permissions where --out points");
        rc = trainer_blame(rc, "out");
    }
    return fsdp_trainer_agree(t, rc, "write the model file");
}

static int trainer_more(const struct fsdp_trainer *t)
{
    if (t->uneven) {
        return !t->uneven->done && (t->cfg->steps == 0 || t->step < t->cfg->steps);
    }
    return t->step < t->cfg->steps;
}

/*
 * Stopped by sig after the step just done: a checkpoint of it when there is
 * a ckpt-dir, else the --out model when one is asked for; rank 0 says what
 * was kept and how to go on.
 */
static int trainer_stop(struct fsdp_trainer *t, int sig)
{
    const struct fsdp_train_config *c = t->cfg;
    const char *name = fsdp_stop_signal_name(sig);
    t->stopped_by = sig;
    if (t->ckpt) {
        FSDP_CHECK(fsdp_ckpt_cadence_save_now(t->ckpt, t));
        if (trainer_rank(t) == 0) {
            printf("preempted: a rank received %s; checkpoint step %ld written to %s/step_%ld; "
                   "exiting with status %d (run again with --resume to continue)\n", name,
                   t->step, c->ckpt_dir, t->step, FSDP_TRAIN_EXIT_STOPPED);
        }
    } else if (c->out[0]) {
        char created_by[160];
        snprintf(created_by, sizeof(created_by), "fsdpc-train %s, stopped by %s after %ld of %ld "
                 "steps", PACKAGE_VERSION, name, t->step, t->total_steps);
        FSDP_CHECK(trainer_save_model(t, c->out, created_by));
        if (trainer_rank(t) == 0) {
            printf("preempted: a rank received %s; stopped after step %ld of %ld with no "
                   "--ckpt-dir, so there is no checkpoint to resume from; the model so far is in "
                   "%s; exiting with status %d\n", name, t->step, t->total_steps, c->out,
                   FSDP_TRAIN_EXIT_STOPPED);
        }
    } else if (trainer_rank(t) == 0) {
        printf("preempted: a rank received %s; stopped after step %ld of %ld with neither "
               "--ckpt-dir nor --out: nothing was kept; exiting with status %d\n", name, t->step,
               t->total_steps, FSDP_TRAIN_EXIT_STOPPED);
    }
    fflush(stdout);
    return 0;
}

/* The bytes each rank put on the wire per step (ring volumes, counted by
 * the engine and the tp operators): doc/performance.md compares them with
 * the analytical volumes. */
static void trainer_print_comm(const struct fsdp_trainer *t, const struct fsdp_engine_stats *st)
{
    const struct fsdp_tp_counts *c[3] = {&st->fsdp_comm, &st->tp_comm, &st->model_comm};
    long steps = t->step - t->start_step;
    double any = 0;
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < FSDP_TP_NCOLL; k++) {
            any += c[i]->wire[k];
        }
    }
    if (steps < 1 || any == 0) {
        return;
    }
    static const char *const what[3] = {"fsdp", "tp", "unit 0 exchanges"};
    const double n = (double)steps;
    const char *sep = "";
    printf("comm per rank per step (bytes sent, ring volumes%s):",
           t->val ? ", validations included" : "");
    for (int i = 0; i < 3; i++) { /* the groups that moved anything */
        const double *x = c[i]->wire;
        if (x[FSDP_TP_ALLGATHER] + x[FSDP_TP_REDUCE_SCATTER] + x[FSDP_TP_ALLREDUCE] > 0) {
            printf("%s %s all-gather %.0f, reduce-scatter %.0f, all-reduce %.0f", sep, what[i],
                   x[FSDP_TP_ALLGATHER] / n, x[FSDP_TP_REDUCE_SCATTER] / n,
                   x[FSDP_TP_ALLREDUCE] / n);
            sep = " |";
        }
    }
    printf("\n");
}

/* "done: 93 steps (108 -> 200) in 12.3 s ..." and the engine's summary. */
static void trainer_print_done(const struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    long made = t->step - t->start_step;
    printf("done: %ld step%s", made, made == 1 ? "" : "s");
    if (t->start_step > 0) {
        printf(" (%ld -> %ld)", t->start_step, t->step);
    }
    printf(" in %.1f s (%.0f tok/s) | final loss %.4f", t->train_seconds,
           t->train_seconds > 0 ? t->run_tokens / t->train_seconds : 0.0, t->last_loss);
    if (!isnan(t->last_val_loss)) {
        printf(" | val loss %.4f", t->last_val_loss);
    }
    if (c->out[0]) {
        printf(" | model written to %s", c->out);
    }
    printf("\n");
    struct fsdp_engine_stats st;
    if (fsdp_shard_engine_is(t->engine)) {
        fsdp_shard_engine_stats(t->engine, &st);
    }
    if (fsdp_shard_engine_is(t->engine) && (st.comm_total_s > 0.0 || st.skipped_steps > 0)) {
        double hidden = st.comm_total_s > 0.0
                            ? 100.0 * (1.0 - st.comm_exposed_s / st.comm_total_s) : 100.0;
        printf("fsdp: comm exposed %.3f s (compute waited for it) | comm busy %.3f s, summed over "
               "collectives that overlap each other and compute (%.0f%% of it hidden) | engine "
               "memory %.2f MiB per rank", st.comm_exposed_s, st.comm_total_s, hidden,
               (double)st.peak_bytes / 1048576.0);
        if (st.skipped_steps > 0) {
            printf(" | %ld steps skipped, loss scale %g", st.skipped_steps, st.loss_scale);
        }
        printf("\n");
    }
    if (fsdp_shard_engine_is(t->engine)) {
        trainer_print_comm(t, &st);
    }
    fflush(stdout);
}

int fsdp_trainer_run(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_step_stats stats;
    double val_loss;
    int sig = 0;
    if (t->uneven) { /* who has a batch for the first step (a signal waits for a step) */
        FSDP_CHECK(fsdp_uneven_vote(t->uneven, t, 0, &sig));
    }
    if (t->resumed_from >= 0 && !trainer_more(t)) {
        if (trainer_rank(t) == 0) {
            printf("fsdpc-train: already at step %ld of %ld (resumed from %s): nothing to do\n",
                   t->step, t->total_steps, t->resumed_dir);
            fflush(stdout);
        }
        return 0;
    }
    if (trainer_rank(t) == 0 && !c->out[0] && !c->ckpt_dir[0]) {
        FSDP_WARN(FSDP_SUB_TRAIN, "neither --out nor --ckpt-dir is set: the trained weights are "
                  "discarded when the run ends");
    }
    while (trainer_more(t)) {
        FSDP_CHECK(fsdp_trainer_step(t, &stats));
        double t0 = fsdp_now();
        if (t->val && c->val_every > 0 && t->step % c->val_every == 0) {
            FSDP_CHECK(fsdp_trainer_validate(t, &val_loss));
        }
        t->side_seconds += fsdp_now() - t0;
        FSDP_CHECK(trainer_agree(t, &sig));
        if (sig && trainer_more(t)) { /* after the last step the run just ends */
            return trainer_stop(t, sig);
        }
        t0 = fsdp_now();
        FSDP_CHECK(fsdp_ckpt_cadence_after_step(t->ckpt, t));
        t->side_seconds += fsdp_now() - t0;
    }
    if (t->val && (c->val_every == 0 || t->step % c->val_every != 0)) {
        FSDP_CHECK(fsdp_trainer_validate(t, &val_loss));
    }
    if (c->out[0]) {
        char created_by[128];
        snprintf(created_by, sizeof(created_by), "fsdpc-train %s, %ld steps", PACKAGE_VERSION,
                 t->step);
        FSDP_CHECK(trainer_save_model(t, c->out, created_by));
    }
    FSDP_CHECK(fsdp_ckpt_cadence_final(t->ckpt, t));
    if (trainer_rank(t) == 0) {
        trainer_print_done(t);
    }
    return 0;
}
