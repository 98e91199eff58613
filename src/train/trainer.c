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
#include "train/uneven.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "comm/debug.h"
#include "comm/mesh.h"
#include "compute/device.h"
#include "fsdp/fsdp.h"
#include "io/model_file.h"
#include "io/tokens.h"
#include "model/model.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// setup

static int trainer_world(const struct fsdp_trainer *t)
{
    return t->dist ? t->dist->world_size : 1;
}

static int trainer_rank(const struct fsdp_trainer *t)
{
    return t->dist ? t->dist->rank : 0;
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

// ----------------------------------------------------------------------------
// the mesh, the world group and the engine

/*
 * The mesh over every rank (when launched with more than one, or asked for
 * one), with the dimensions this build trains with: dp shards, rdp
 * replicates. The world group uses the dp dimension's backend.
 */
static int trainer_build_mesh(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_dist *d = t->dist;
    const struct fsdp_backend_ops *ops = NULL;
    if (d && (d->world_size > 1 || c->mesh[0])) {
        FSDP_CHECK(fsdp_mesh_create_for(d, c->mesh[0] ? c->mesh : NULL,
                                        c->backend[0] ? c->backend : NULL,
                                        fsdp_device_mem_cap(t->dev), &t->mesh));
        struct fsdp_mesh *m = t->mesh;
        for (int i = 0; i < m->ndims; i++) {
            if (strcmp(m->dims[i].name, "dp") != 0 && strcmp(m->dims[i].name, "rdp") != 0) {
                return fsdp_err(FSDP_ERR_INVALID,
                                "mesh %s: dimension '%s' is not one the sharding engine uses (dp: shard, rdp: replicate)",
                                m->spec, m->dims[i].name);
            }
        }
        int dp = fsdp_mesh_dim_index(m, "dp");
        if (dp < 0) {
            return fsdp_err(FSDP_ERR_INVALID, "mesh %s: the sharding engine needs a 'dp' dimension",
                            m->spec);
        }
        ops = m->dims[dp].ops;
    }
    return fsdp_world_create(d, ops, &t->world);
}

int fsdp_trainer_shard_engine(struct fsdp_trainer *t, struct fsdp_engine **out)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_optim_config oc;
    fsdp_train_config_optim(c, &oc);
    struct fsdp_shard_config sc;
    fsdp_shard_config_init(&sc);
    sc.B = (int)c->batch_size;
    sc.T = (int)c->seq_len;
    sc.sharding = (enum fsdp_sharding)c->sharding;
    sc.reshard_after_forward = c->reshard_after_forward != 0;
    sc.prefetch = (int)c->prefetch;
    sc.param_dtype = (enum fsdp_dtype)fsdp_train_config_dtype(c->param_dtype);
    sc.reduce_dtype = (enum fsdp_dtype)fsdp_train_config_dtype(c->reduce_dtype);
    int dynamic;
    FSDP_CHECK(fsdp_train_config_loss_scale(c, &dynamic, &sc.loss_scale));
    sc.loss_scale_dynamic = dynamic != 0;
    sc.no_sync_accum = c->no_sync_accum != 0;
    sc.activation_checkpointing = c->activation_checkpointing != 0;
    sc.lm_head_chunk = (int)c->lm_head_chunk;
    struct fsdp_shard_groups g = {
        .dp = t->mesh ? fsdp_mesh_group(t->mesh, "dp") : NULL,
        .rdp = t->mesh ? fsdp_mesh_group(t->mesh, "rdp") : NULL,
        .world_rank = trainer_rank(t),
        .mesh = t->mesh ? t->mesh->spec : "single rank",
        .backends = t->mesh ? t->mesh->backends : "no backend",
    };
    return fsdp_shard_engine_create(t->spec, &g, t->dev, &oc, &sc, out);
}

/* Every rank reads its rows of every parameter from the model file into
 * the engine's pieces of kind 0. */
static int trainer_load_model(struct fsdp_trainer *t, struct fsdp_model_file *mf)
{
    struct fsdp_engine *e = t->engine;
    size_t n = e->ops->n_pieces(e);
    for (size_t k = 0; k < n; k++) {
        struct fsdp_state_piece pc;
        e->ops->piece(e, k, &pc);
        if (pc.kind == 0 && pc.rows > 0) {
            FSDP_CHECK(fsdp_model_file_read_rows(mf, t->spec->params[pc.param].name, pc.row0,
                                                 pc.rows, pc.data));
        }
    }
    return e->ops->state_changed(e);
}

/* The model file, and the parameter table of its architecture (the
 * trainer's own copy: it outlives the file). */
static int trainer_open_model(struct fsdp_trainer *t, struct fsdp_model_file **mf)
{
    const struct fsdp_train_config *c = t->cfg;
    int rc = fsdp_model_file_open(c->model, mf);
    if (rc == 0) {
        const struct fsdp_model_spec *fs = fsdp_model_file_spec(*mf);
        rc = fs->arch->spec_create(fs->cfg, &t->spec);
    }
    if (rc < 0) {
        return trainer_blame(rc, "model");
    }
    if (c->seq_len > t->spec->context) {
        return fsdp_err(FSDP_ERR_INVALID, "seq-len %ld is longer than the context %d of model %s",
                        c->seq_len, t->spec->context, c->model);
    }
    return 0;
}

/* The device, the mesh, the engine and the batch arrays. */
static int trainer_build_engine(struct fsdp_trainer *t, fsdp_engine_factory factory)
{
    const struct fsdp_train_config *c = t->cfg;
    int rc;
    if ((rc = fsdp_device_create("cpu", t->dist ? t->dist->local_rank : 0, &t->dev)) < 0) {
        return trainer_blame(rc, "device");
    }
    if ((rc = trainer_build_mesh(t)) < 0) {
        return trainer_blame(rc, "sharding engine");
    }
    if ((rc = (factory ? factory : fsdp_trainer_shard_engine)(t, &t->engine)) < 0) {
        return trainer_blame(rc, "sharding engine");
    }
    size_t n = (size_t)c->grad_accum * (size_t)c->batch_size * (size_t)c->seq_len;
    t->batch_in = malloc(n * sizeof(int32_t));
    t->batch_tgt = malloc(n * sizeof(int32_t));
    if (!t->batch_in || !t->batch_tgt) {
        return fsdp_err(FSDP_ERR_NOMEM, "batch of %zu tokens", n);
    }
    return 0;
}

/* The model's table, the mesh and the engine, its parameters loaded. The
 * model file is opened (and validated, which reads it through) once. */
static int trainer_open_engine(struct fsdp_trainer *t, fsdp_engine_factory factory)
{
    struct fsdp_model_file *mf = NULL;
    int rc = trainer_open_model(t, &mf);
    if (rc == 0) {
        rc = trainer_build_engine(t, factory);
    }
    if (rc == 0 && (rc = trainer_load_model(t, mf)) < 0) {
        rc = trainer_blame(rc, "model");
    }
    fsdp_model_file_close(mf);
    return rc;
}

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
    int rc = fsdp_uneven_path(path, trainer_rank(t), mine, sizeof(mine), per_rank);
    if (rc == 0) {
        rc = fsdp_dataloader_create(mine, (size_t)c->batch_size, (size_t)c->seq_len,
                                    *per_rank ? 0 : trainer_rank(t), *per_rank ? 1 : trainer_world(t),
                                    t->spec->vocab_size, out);
    }
    return rc < 0 ? trainer_blame(rc, what) : 0;
}

/*
 * Setup that can fail on some ranks only (each opens its own data file),
 * rc being this rank's outcome: every rank learns which failed, so that all
 * end together instead of leaving the others in the next collective, and
 * the lowest failing rank alone keeps its message (one line, not one per
 * rank). Any failure comes back as FSDP_ERR_ABORTED on every rank (see
 * fsdp_trainer_create).
 */
static int trainer_agree_setup(struct fsdp_trainer *t, int rc, const char *what)
{
    const int world = trainer_world(t);
    int32_t *failed = calloc((size_t)world, sizeof(*failed));
    if (!failed) {
        return rc < 0 ? rc : fsdp_err(FSDP_ERR_NOMEM, "agreement on %s", what);
    }
    int arc = fsdp_world_allgather(t->world, rc < 0, failed);
    int first = -1, n = 0;
    for (int r = 0; arc == 0 && r < world; r++) {
        first = failed[r] && first < 0 ? r : first;
        n += failed[r] != 0;
    }
    free(failed);
    if (arc < 0) { /* nobody knows who failed: the job aborts on this rank's error */
        return rc < 0 ? rc : arc;
    }
    if (n == 0) {
        return 0;
    }
    if (first != trainer_rank(t)) {
        fsdp_err_clear();
        FSDP_INFO(FSDP_SUB_TRAIN, "rank %d could not %s; it reports why", first, what);
        return FSDP_ERR_ABORTED;
    }
    char msg[900];
    fsdp_err_take(msg, sizeof(msg));
    if (n == 1) {
        return fsdp_err(FSDP_ERR_ABORTED, "%s (%s)", msg, fsdp_strerror(rc));
    }
    return fsdp_err(FSDP_ERR_ABORTED, "%s (%s; %d of %d ranks failed here, this is the lowest)",
                    msg, fsdp_strerror(rc), n, world);
}

static int trainer_open_val(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    if (!c->val_data[0]) {
        return 0;
    }
    int per_rank = 0;
    int rc = trainer_open_data(t, c->val_data, "val-data", &t->val, &per_rank);
    FSDP_CHECK(trainer_agree_setup(t, rc, "open its val-data file"));
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
        return fsdp_err(FSDP_ERR_IO, "out %s: cannot write in directory %s: %s", out, dir,
                        strerror(errno));
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

int fsdp_trainer_create(const struct fsdp_train_config *cfg, struct fsdp_dist *dist,
                        fsdp_engine_factory factory, struct fsdp_trainer **out)
{
    struct fsdp_trainer *t = calloc(1, sizeof(*t));
    int rc;
    if (!t) {
        return fsdp_err(FSDP_ERR_NOMEM, "trainer");
    }
    t->cfg = cfg;
    t->dist = dist;
    t->last_loss = NAN;
    t->last_val_loss = NAN;
    fsdp_lr_schedule_init(&t->sched, cfg);
    openblas_set_num_threads((int)cfg->threads);

    FSDP_CHECK_GOTO(trainer_check_out(cfg->out), rc, err_free);
    FSDP_CHECK_GOTO(fsdp_model_registry_init(), rc, err_free);
    FSDP_CHECK_GOTO(trainer_open_engine(t, factory), rc, err_engine);
    rc = trainer_open_data(t, cfg->data, "data", &t->train, &t->per_rank_data);
    FSDP_CHECK_GOTO(trainer_agree_setup(t, rc, "open its data file"), rc, err_train);
    FSDP_CHECK_GOTO(trainer_open_val(t), rc, err_val);
    FSDP_CHECK_GOTO(fsdp_uneven_create(t, &t->uneven), rc, err_val);
    t->total_steps = t->uneven ? t->uneven->total_steps : cfg->steps;
    t->sched.steps = t->total_steps;
    FSDP_CHECK_GOTO(fsdp_ckpt_cadence_create(t, &t->ckpt), rc, err_uneven);
    if ((rc = fsdp_ckpt_resume(t)) < 0) {
        rc = trainer_blame(rc, "resume");
        goto err_ckpt;
    }
    if (trainer_rank(t) == 0) {
        FSDP_CHECK_GOTO(fsdp_metrics_open(cfg->metrics, &t->metrics), rc, err_ckpt);
    }
    if (cfg->peak_flops > 0) {
        t->peak_flops = cfg->peak_flops;
        snprintf(t->peak_method, sizeof(t->peak_method), "--peak-flops");
    } else {
        FSDP_CHECK_GOTO(fsdp_probe_peak_flops((int)cfg->threads, &t->peak_flops, t->peak_method,
                                              sizeof(t->peak_method)),
                        rc, err_metrics);
    }
    *out = t;
    return 0;

err_metrics:
    fsdp_metrics_close(t->metrics);
err_ckpt:
    fsdp_ckpt_cadence_destroy(t->ckpt);
err_uneven:
    fsdp_uneven_destroy(t->uneven);
err_val:
    fsdp_dataloader_destroy(t->val);
err_train:
    fsdp_dataloader_destroy(t->train);
err_engine:
    trainer_close_engine(t);
err_free:
    free(t);
    return rc;
}

void fsdp_trainer_destroy(struct fsdp_trainer *t)
{
    if (!t) {
        return;
    }
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
    return fsdp_train_config_step_tokens(t->cfg) * (size_t)trainer_world(t);
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
    fprintf(fp, "batch: %d rank%s x %ld seq x %ld tokens x %ld micro-steps = %zu tokens per step\n",
            trainer_world(t), trainer_world(t) > 1 ? "s" : "", c->batch_size, c->seq_len,
            c->grad_accum, step_tokens);
    fprintf(fp, "engine: %s | peak %.1f GFLOP/s per rank (%s) | %.2f MFLOP per token\n",
            t->engine->ops->name, t->peak_flops / 1e9, t->peak_method,
            t->engine->flops_per_token / 1e6);
    char line[512];
    t->engine->ops->describe(t->engine, line, sizeof(line));
    if (line[0]) {
        fprintf(fp, "%s\n", line);
    }
    fflush(fp);
}

static int trainer_should_log(const struct fsdp_trainer *t)
{
    long s = t->step; /* 1-based number of the step just done */
    return s == 1 || s == t->total_steps || s % t->cfg->log_every == 0;
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

int fsdp_trainer_step(struct fsdp_trainer *t, struct fsdp_step_stats *stats)
{
    const struct fsdp_train_config *c = t->cfg;
    const struct fsdp_uneven *u = t->uneven;
    struct fsdp_step_result res = {0};
    double lr = fsdp_lr_at(&t->sched, t->step);
    uint64_t epoch = t->train->epoch;
    /* with epochs the vote before this step said who has a batch */
    int contrib = u ? u->n_contrib : trainer_world(t);
    double t0 = fsdp_now();
    struct fsdp_batch b = {.K = (int)c->grad_accum, .B = (int)c->batch_size, .T = (int)c->seq_len};
    int rc = 0;
    if (!u || u->have) {
        rc = trainer_next_batch(t, &b);
    }
    if (rc == 0) {
        rc = t->engine->ops->step(t->engine, &b, lr, contrib, &res);
    }
    double dt = fsdp_now() - t0;
    if (rc < 0) {
        char what[32];
        snprintf(what, sizeof(what), "step %ld", t->step + 1);
        return trainer_blame(rc, what);
    }
    t->step++;
    fsdp_debug_mark_steady(); /* from now on collectives get the regular deadline */
    t->train_seconds += dt;
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
    stats->mfu = t->peak_flops > 0 ? 100.0 * t->engine->flops_per_token * stats->tokens_per_s /
                                         ((double)trainer_world(t) * t->peak_flops)
                                   : -1.0;
    stats->mem_mib = fsdp_peak_rss_mib();
    stats->tokens = t->tokens_seen;
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
                                    t->val_batches));
    }
    return 0;
}

/*
 * The agreement between two steps: with epochs, who has a batch for the next
 * step, folded with the preemption signal into one collective; otherwise
 * the signal alone when checkpoints are on, and nothing when they are off.
 */
static int trainer_agree(struct fsdp_trainer *t, int *preempt)
{
    int sig = fsdp_ckpt_cadence_signalled();
    *preempt = 0;
    if (t->uneven) {
        return fsdp_uneven_vote(t->uneven, t, sig, preempt);
    }
    if (t->ckpt) {
        int32_t v = sig;
        FSDP_CHECK(fsdp_world_max(t->world, &v, 1));
        *preempt = v != 0;
    }
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
    for (int u = 0; u < t->spec->n_units; u++) {
        const float *full;
        int grc = t->engine->ops->gather_unit(t->engine, u, &full);
        if (grc < 0) {
            fsdp_model_writer_destroy(w);
            return grc; /* a collective failed: every rank hears of it */
        }
        if (writer && rc == 0) {
            rc = fsdp_model_writer_put_unit(w, u, full);
        }
    }
    if (writer && rc == 0) {
        rc = fsdp_model_writer_commit(w);
    }
    fsdp_model_writer_destroy(w);
    FSDP_CHECK(t->engine->ops->state_changed(t->engine));
    int any;
    FSDP_CHECK(fsdp_world_any_failed(t->world, rc, &any));
    if (rc == 0 && any) {
        rc = fsdp_err(FSDP_ERR_IO, "model %s: rank 0 could not write it (see its error)", path);
    }
    return rc;
}

static int trainer_more(const struct fsdp_trainer *t)
{
    if (t->uneven) {
        return !t->uneven->done && (t->cfg->steps == 0 || t->step < t->cfg->steps);
    }
    return t->step < t->cfg->steps;
}

int fsdp_trainer_run(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_step_stats stats;
    double val_loss;
    int preempt = 0;
    if (t->uneven) { /* who has a batch for the first step (a signal waits for a step) */
        FSDP_CHECK(fsdp_uneven_vote(t->uneven, t, 0, &preempt));
    }
    while (trainer_more(t)) {
        FSDP_CHECK(fsdp_trainer_step(t, &stats));
        if (t->val && c->val_every > 0 && t->step % c->val_every == 0) {
            FSDP_CHECK(fsdp_trainer_validate(t, &val_loss));
        }
        int stop;
        FSDP_CHECK(trainer_agree(t, &preempt));
        FSDP_CHECK(fsdp_ckpt_cadence_after_step(t->ckpt, t, preempt, &stop));
        if (stop) {
            return 0;
        }
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
        printf("done: %ld steps in %.1f s (%.0f tok/s) | final loss %.4f", t->step,
               t->train_seconds, t->train_seconds > 0 ? t->run_tokens / t->train_seconds : 0.0,
               t->last_loss);
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
            printf("fsdp: comm %.3f s total, %.3f s exposed (%.0f%% hidden behind compute) | "
                   "engine memory %.2f MiB per rank",
                   st.comm_total_s, st.comm_exposed_s, hidden, (double)st.peak_bytes / 1048576.0);
            if (st.skipped_steps > 0) {
                printf(" | %ld steps skipped, loss scale %g", st.skipped_steps, st.loss_scale);
            }
            printf("\n");
        }
        fflush(stdout);
    }
    return 0;
}
