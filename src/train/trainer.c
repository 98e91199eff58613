/*
 * trainer.c - the training loop around an engine (see trainer.h).
 * Owns the loaders, the schedule, metrics and the run's cadence; never
 * touches parameters itself. Every rank runs the same sequence of engine
 * calls; only rank 0 prints and writes metrics.
 */
#include "config.h"
#include "train/trainer.h"
#include "train/ckpt_cadence.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "dist/dist.h"
#include "dist/debug.h"
#include "fsdp/fsdp.h"
#include "io/model_file.h"
#include "io/tokens.h"
#include "model/gpt2_spec.h"

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
    return fsdp_err(rc, "%s: %s", what, msg);
}

static int trainer_open_engine(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_optim_config oc = {
        .beta1 = (float)c->beta1,
        .beta2 = (float)c->beta2,
        .eps = (float)c->eps,
        .weight_decay = (float)c->weight_decay,
        .clip = (float)c->clip,
    };
    int rc;
    const int sharded = trainer_world(t) > 1 || fsdp_train_config_wants_fsdp(c);
    if (sharded) {
        struct fsdp_engine_config ec;
        fsdp_engine_config_init(&ec);
        ec.mesh = c->mesh;
        ec.backend = c->backend;
        ec.sharding = (enum fsdp_sharding)c->sharding;
        ec.reshard_after_forward = c->reshard_after_forward == 0;
        ec.prefetch = (int)c->prefetch;
        ec.param_dtype = (enum fsdp_dtype)fsdp_train_config_dtype(c->param_dtype);
        ec.reduce_dtype = (enum fsdp_dtype)fsdp_train_config_dtype(c->reduce_dtype);
        FSDP_CHECK(fsdp_train_config_loss_scale(c, &ec.loss_scale_dynamic, &ec.loss_scale));
        ec.no_sync_accum = c->no_sync_accum;
        ec.activation_checkpointing = c->activation_checkpointing;
        rc = fsdp_shard_engine_create(t->dist, c->model, (int)c->batch_size, (int)c->seq_len, &oc,
                                      &ec, &t->engine);
    } else {
        rc = fsdp_local_engine_create(c->model, (int)c->batch_size, (int)c->seq_len, &oc,
                                      &t->engine);
    }
    return rc < 0 ? trainer_blame(rc, sharded ? "sharding engine" : "model") : 0;
}

/* Token file for the model: vocabulary checked, one global batch must fit. */
static int trainer_open_data(struct fsdp_trainer *t, const char *path, const char *what,
                             struct fsdp_dataloader **out)
{
    const struct fsdp_train_config *c = t->cfg;
    int rc = fsdp_dataloader_create(path, (size_t)c->batch_size, (size_t)c->seq_len,
                                    trainer_rank(t), trainer_world(t),
                                    t->engine->spec->cfg.vocab_size, out);
    return rc < 0 ? trainer_blame(rc, what) : 0;
}

static int trainer_open_val(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    if (!c->val_data[0]) {
        return 0;
    }
    FSDP_CHECK(trainer_open_data(t, c->val_data, "val-data", &t->val));
    /* validation reads from the start of the file each time, without wrapping */
    size_t per_batch = (size_t)c->batch_size * (size_t)c->seq_len * (size_t)trainer_world(t);
    size_t fits = (fsdp_tokens_count(t->val->tokens) - 1) / per_batch;
    t->val_batches = c->val_batches < (long)fits ? c->val_batches : (long)fits;
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

int fsdp_trainer_create(const struct fsdp_train_config *cfg, struct fsdp_dist *dist,
                        struct fsdp_trainer **out)
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

    struct fsdp_gpt2_config mc;
    FSDP_CHECK_GOTO(trainer_check_out(cfg->out), rc, err_free);
    rc = fsdp_model_file_read_config(cfg->model, &mc);
    if (rc < 0) {
        rc = trainer_blame(rc, "model");
        goto err_free;
    }
    if (cfg->seq_len > mc.context) {
        rc = fsdp_err(FSDP_ERR_INVALID, "seq-len %ld is longer than the context %d of model %s",
                      cfg->seq_len, mc.context, cfg->model);
        goto err_free;
    }
    FSDP_CHECK_GOTO(trainer_open_engine(t), rc, err_free);
    FSDP_CHECK_GOTO(trainer_open_data(t, cfg->data, "data", &t->train), rc, err_engine);
    FSDP_CHECK_GOTO(trainer_open_val(t), rc, err_train);
    FSDP_CHECK_GOTO(fsdp_ckpt_cadence_create(t, &t->ckpt), rc, err_val);
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
err_val:
    fsdp_dataloader_destroy(t->val);
err_train:
    fsdp_dataloader_destroy(t->train);
err_engine:
    t->engine->ops->destroy(t->engine);
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
    fsdp_dataloader_destroy(t->val);
    fsdp_dataloader_destroy(t->train);
    t->engine->ops->destroy(t->engine);
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
    const struct fsdp_gpt2_config *mc = &t->engine->spec->cfg;
    size_t step_tokens = trainer_step_tokens(t);
    size_t n_train = fsdp_tokens_count(t->train->tokens);
    fprintf(fp, "model: %s | gpt2 L=%d NH=%d C=%d V=%d context=%d %s | %.2fM parameters\n",
            c->model, mc->n_layer, mc->n_head, mc->n_embd, mc->vocab_size, mc->context,
            mc->tied ? "tied" : "untied", (double)t->engine->spec->total_numel / 1e6);
    fprintf(fp, "data: %s | %zu tokens | %.1f steps per epoch\n", c->data, n_train,
            (double)(n_train - 1) / (double)step_tokens);
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
    if (fsdp_shard_engine_is(t->engine)) {
        char line[512];
        fsdp_shard_engine_describe(t->engine, line, sizeof(line));
        fprintf(fp, "%s\n", line);
    }
    fflush(fp);
}

static int trainer_should_log(const struct fsdp_trainer *t)
{
    long s = t->step; /* 1-based number of the step just done */
    return s == 1 || s == t->cfg->steps || s % t->cfg->log_every == 0;
}

// ----------------------------------------------------------------------------
// the loop

int fsdp_trainer_step(struct fsdp_trainer *t, struct fsdp_step_stats *stats)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_step_result res;
    double lr = fsdp_lr_at(&t->sched, t->step);
    uint64_t epoch = t->train->epoch;
    double t0 = fsdp_now();
    int rc = t->engine->ops->step(t->engine, t->train, (int)c->grad_accum, lr, &res);
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

    double tokens = (double)trainer_step_tokens(t);
    memset(stats, 0, sizeof(*stats));
    stats->step = t->step;
    stats->steps = c->steps;
    stats->loss = res.loss;
    stats->grad_norm = res.grad_norm;
    stats->lr = lr;
    stats->ms = dt * 1e3;
    stats->tokens_per_s = tokens / dt;
    stats->mfu = t->peak_flops > 0 ? 100.0 * t->engine->flops_per_token * stats->tokens_per_s /
                                         ((double)trainer_world(t) * t->peak_flops)
                                   : -1.0;
    stats->mem_mib = fsdp_peak_rss_mib();
    stats->tokens = tokens * (double)t->step;
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
        FSDP_CHECK(t->engine->ops->eval(t->engine, t->val, &loss));
        sum += loss;
    }
    *val_loss = sum / (double)t->val_batches;
    t->last_val_loss = *val_loss;
    if (t->metrics) {
        FSDP_CHECK(fsdp_metrics_val(t->metrics, t->step, t->cfg->steps, *val_loss,
                                    t->val_batches));
    }
    return 0;
}

int fsdp_trainer_run(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_step_stats stats;
    double val_loss;
    while (t->step < c->steps) {
        FSDP_CHECK(fsdp_trainer_step(t, &stats));
        if (t->val && c->val_every > 0 && t->step % c->val_every == 0) {
            FSDP_CHECK(fsdp_trainer_validate(t, &val_loss));
        }
        int preempted;
        FSDP_CHECK(fsdp_ckpt_cadence_after_step(t->ckpt, t, &preempted));
        if (preempted) {
            return 0;
        }
    }
    if (t->val && (c->val_every == 0 || c->steps % c->val_every != 0)) {
        FSDP_CHECK(fsdp_trainer_validate(t, &val_loss));
    }
    if (c->out[0]) {
        char created_by[128];
        snprintf(created_by, sizeof(created_by), "fsdpc-train %s, %ld steps", PACKAGE_VERSION,
                 t->step);
        FSDP_CHECK(t->engine->ops->save(t->engine, c->out, created_by));
    }
    FSDP_CHECK(fsdp_ckpt_cadence_final(t->ckpt, t));
    if (trainer_rank(t) == 0) {
        printf("done: %ld steps in %.1f s (%.0f tok/s) | final loss %.4f", t->step,
               t->train_seconds,
               (double)trainer_step_tokens(t) * (double)t->step / t->train_seconds, t->last_loss);
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
