/*
 * trainer_loop.c - the training loop (trainer.c): a step and its retries,
 * validation, the stop and checkpoint agreements, the final model file, and
 * the run's reporting (the header, the step lines, the summary).
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
#include "comm/debug.h"
#include "comm/mesh.h"
#include "comm/mesh_spec.h"
#include "train/mesh_check.h"
#include "compute/device.h"
#include "train/stage.h"
#include "parallel/fsdp.h"
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
        fprintf(fp,
                "model weights: %s (the checkpoint's index.h5; its optimizer state and step "
                "are not used: --resume continues a run)\n",
                t->model_path);
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
        fsdp_uneven_describe(t->uneven, line, sizeof(line));
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
    if (t->tp > 1 || t->pp > 1) {
        snprintf(tpn, sizeof(tpn), " (of %d: %s share a batch)", fsdp_trainer_world(t),
                 t->pp > 1 ? "pipeline stages" : "tp peers");
    }
    fprintf(fp,
            "batch: %d rank%s%s x %ld seq x %ld tokens x %ld micro-steps = %zu tokens per "
            "step\n",
            t->data_world, t->data_world > 1 ? "s" : "", tpn, c->batch_size, c->seq_len,
            c->grad_accum, step_tokens);
    char staged[160] = "", how[48] = "";
    for (int i = 0; t->mesh && i < t->mesh->ndims; i++) {
        if (t->mesh->dims[i].group->stager) {
            size_t n = strlen(staged);
            snprintf(staged + n, sizeof(staged) - n, "%s%s",
                     n ? ","
                       : "; staged through host "
                         "buffers: ",
                     t->mesh->dims[i].name);
            fsdp_group_stage_describe(t->mesh->dims[i].group, how, sizeof(how));
        }
    }
    if (how[0]) {
        size_t n = strlen(staged);
        snprintf(staged + n, sizeof(staged) - n, " (%s)", how);
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
    if (t->count.resumed_from >= 0) {
        fprintf(fp, "resumed: %s | step %ld of %ld\n", t->count.resumed_dir, t->count.resumed_from,
                t->total_steps);
    }
    fflush(fp);
}

static int trainer_should_log(const struct fsdp_trainer *t)
{
    long s = t->count.step; /* 1-based number of the step just done */
    return s == 1 || s == t->total_steps || s % t->cfg->log_every == 0;
}

/* Seconds left at this run's pace: the mean step after its first (which
 * warms caches and connections up), with the validations and checkpoint
 * saves so far spread over the steps, times the steps to go; -1: unknown. */
static double trainer_eta(const struct fsdp_trainer *t, double first_step_s)
{
    long done = t->count.step - t->start_step, left = t->total_steps - t->count.step;
    if (done < 1 || left <= 0) {
        return -1.0;
    }
    double per =
        done > 1 ? (t->train_seconds - first_step_s) / (double)(done - 1) : t->train_seconds;
    return (per + t->side_seconds / (double)done) * (double)left;
}

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
    snprintf(what, sizeof(what), "step %ld", t->count.step + 1);
    const int group = rc == FSDP_ERR_INVALID && !isfinite(res->grad_norm);
    if (group) {
        fsdp_err_hint("lower --lr (or --warmup longer), keep --clip on, and look at the data "
                      "around this step; with --param-dtype f16 use --loss-scale dynamic");
    }
    rc = fsdp_trainer_blame(rc, what);
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
        FSDP_DEBUG(FSDP_SUB_TRAIN, "device buffer after the first step: %zu bytes '%s'", b[i].bytes,
                   b[i].name);
    }
    FSDP_DEBUG(FSDP_SUB_TRAIN, "device buffers after the first step: %zu, %zu bytes in all", n,
               d->stats.bytes_now);
}

int fsdp_trainer_step(struct fsdp_trainer *t, struct fsdp_step_stats *stats)
{
    const struct fsdp_train_config *c = t->cfg;
    const struct fsdp_uneven *u = t->uneven;
    struct fsdp_step_result res = {0};
    double lr = fsdp_lr_at(&t->sched, t->count.step);
    uint64_t epoch = t->train->epoch;
    /* with epochs the vote before this step said who has a batch (every tp
     * peer of a data-parallel rank alike) */
    int contrib = (u ? u->n_contrib : fsdp_trainer_world(t)) / (t->tp * t->pp);
    double t0 = fsdp_now();
    struct fsdp_batch b = {.K = (int)c->grad_accum, .B = (int)c->batch_size, .T = (int)c->seq_len};
    int rc = 0;
    if (!u || u->have) {
        rc = trainer_next_batch(t, &b);
        if (rc < 0) {
            char what[32];
            snprintf(what, sizeof(what), "step %ld", t->count.step + 1);
            return fsdp_trainer_blame(rc, what);
        }
    }
    const struct fsdp_device_stats ds = t->dev->stats;
    rc = t->engine->ops->step(t->engine, &b, lr, contrib, &res);
    double dt = fsdp_now() - t0;
    if (rc < 0) {
        return trainer_step_failed(t, rc, &res);
    }
    t->count.step++;
    if (t->count.step == t->start_step + 1) {
        trainer_log_buffers(t);
    }
    /* what the step made the host wait for (doc/design.md lists each) */
    FSDP_DEBUG(FSDP_SUB_TRAIN, "step %ld: device %s: %ld host waits, %ld device-to-host copies",
               t->count.step, t->dev->ops->name, t->dev->stats.host_waits - ds.host_waits,
               t->dev->stats.d2h_copies - ds.d2h_copies);
    fsdp_debug_mark_steady(); /* from now on collectives get the regular deadline */
    t->train_seconds += dt;
    if (t->count.step == t->start_step + 1) {
        t->first_step_s = dt;
    }
    t->last_loss = res.loss;
    if (t->train->epoch != epoch) {
        FSDP_INFO(FSDP_SUB_TRAIN, "step %ld: pass %llu over %s complete, starting again",
                  t->count.step, (unsigned long long)t->train->epoch, c->data);
    }

    double tokens = (double)fsdp_train_config_step_tokens(c) * (double)contrib;
    t->count.tokens_seen += tokens;
    t->run_tokens += tokens;
    memset(stats, 0, sizeof(*stats));
    stats->step = t->count.step;
    stats->steps = t->total_steps;
    stats->loss = res.loss;
    stats->grad_norm = res.grad_norm;
    stats->loss_scale = res.loss_scale;
    stats->lr = lr;
    stats->ms = dt * 1e3;
    stats->tokens_per_s = tokens / dt;
    stats->mfu = fsdp_mfu(t->engine->flops_per_token * stats->tokens_per_s / fsdp_trainer_world(t),
                          &t->peak_flops, t->cfg->peak_flops > 0, t->count.step, &t->peak_beaten);
    stats->mem_mib = fsdp_peak_rss_mib();
    stats->tokens = t->count.tokens_seen;
    stats->eta_s = trainer_eta(t, t->first_step_s);
    stats->time = fsdp_trainer_wall();
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
        FSDP_CHECK(fsdp_metrics_val(t->metrics, t->count.step, t->total_steps, *val_loss,
                                    t->val_batches, fsdp_trainer_wall()));
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
        return fsdp_uneven_vote(t->uneven, t->count.step, mine, sig);
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
    const int writer = fsdp_trainer_rank(t) == 0;
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
        rc = fsdp_trainer_blame(rc, "out");
    }
    return fsdp_trainer_agree(t, rc, "write the model file");
}

static int trainer_more(const struct fsdp_trainer *t)
{
    if (t->uneven) {
        return !t->uneven->done && (t->cfg->steps == 0 || t->count.step < t->cfg->steps);
    }
    return t->count.step < t->cfg->steps;
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
        FSDP_CHECK(fsdp_ckpt_cadence_save_now(t->ckpt));
        if (fsdp_trainer_rank(t) == 0) {
            printf("preempted: a rank received %s; checkpoint step %ld written to %s/step_%ld; "
                   "exiting with status %d (run again with --resume to continue)\n",
                   name, t->count.step, c->ckpt_dir, t->count.step, FSDP_TRAIN_EXIT_STOPPED);
        }
    } else if (c->out[0]) {
        char created_by[160];
        snprintf(created_by, sizeof(created_by),
                 "fsdpc-train %s, stopped by %s after %ld of %ld "
                 "steps",
                 PACKAGE_VERSION, name, t->count.step, t->total_steps);
        FSDP_CHECK(trainer_save_model(t, c->out, created_by));
        if (fsdp_trainer_rank(t) == 0) {
            printf("preempted: a rank received %s; stopped after step %ld of %ld with no "
                   "--ckpt-dir, so there is no checkpoint to resume from; the model so far is in "
                   "%s; exiting with status %d\n",
                   name, t->count.step, t->total_steps, c->out, FSDP_TRAIN_EXIT_STOPPED);
        }
    } else if (fsdp_trainer_rank(t) == 0) {
        printf("preempted: a rank received %s; stopped after step %ld of %ld with neither "
               "--ckpt-dir nor --out: nothing was kept; exiting with status %d\n",
               name, t->count.step, t->total_steps, FSDP_TRAIN_EXIT_STOPPED);
    }
    fflush(stdout);
    return 0;
}

/* The bytes each rank put on the wire per step (ring volumes, counted by
 * the engine and the tp operators): doc/performance.md compares them with
 * the analytical volumes. */
static void trainer_print_comm(const struct fsdp_trainer *t, const struct fsdp_engine_stats *st)
{
    const struct fsdp_comm_counts *c[3] = {&st->fsdp_comm, &st->tp_comm, &st->model_comm};
    long steps = t->count.step - t->start_step;
    double any = 0;
    for (int i = 0; i < 3; i++) {
        for (int k = 0; k < FSDP_COLL_OP_COUNT; k++) {
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
        if (x[FSDP_COLL_ALLGATHER] + x[FSDP_COLL_REDUCE_SCATTER] + x[FSDP_COLL_ALLREDUCE] > 0) {
            printf("%s %s all-gather %.0f, reduce-scatter %.0f, all-reduce %.0f", sep, what[i],
                   x[FSDP_COLL_ALLGATHER] / n, x[FSDP_COLL_REDUCE_SCATTER] / n,
                   x[FSDP_COLL_ALLREDUCE] / n);
            sep = " |";
        }
    }
    printf("\n");
}

/* "done: 93 steps (108 -> 200) in 12.3 s ..." and the engine's summary. */
static void trainer_print_done(const struct fsdp_trainer *t)
{
    const struct fsdp_train_config *c = t->cfg;
    long made = t->count.step - t->start_step;
    printf("done: %ld step%s", made, made == 1 ? "" : "s");
    if (t->start_step > 0) {
        printf(" (%ld -> %ld)", t->start_step, t->count.step);
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
        double hidden =
            st.comm_total_s > 0.0 ? 100.0 * (1.0 - st.comm_exposed_s / st.comm_total_s) : 100.0;
        printf("fsdp: comm exposed %.3f s (compute waited for it) | comm busy %.3f s, summed over "
               "collectives that overlap each other and compute (%.0f%% of it hidden) | engine "
               "memory %.2f MiB per rank",
               st.comm_exposed_s, st.comm_total_s, hidden, (double)st.peak_bytes / 1048576.0);
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
        FSDP_CHECK(fsdp_uneven_vote(t->uneven, t->count.step, 0, &sig));
    }
    if (t->count.resumed_from >= 0 && !trainer_more(t)) {
        if (fsdp_trainer_rank(t) == 0) {
            printf("fsdpc-train: already at step %ld of %ld (resumed from %s): nothing to do\n",
                   t->count.step, t->total_steps, t->count.resumed_dir);
            fflush(stdout);
        }
        return 0;
    }
    if (fsdp_trainer_rank(t) == 0 && !c->out[0] && !c->ckpt_dir[0]) {
        FSDP_WARN(FSDP_SUB_TRAIN, "neither --out nor --ckpt-dir is set: the trained weights are "
                                  "discarded when the run ends");
    }
    while (trainer_more(t)) {
        FSDP_CHECK(fsdp_trainer_step(t, &stats));
        double t0 = fsdp_now();
        if (t->val && c->val_every > 0 && t->count.step % c->val_every == 0) {
            FSDP_CHECK(fsdp_trainer_validate(t, &val_loss));
        }
        t->side_seconds += fsdp_now() - t0;
        FSDP_CHECK(trainer_agree(t, &sig));
        if (sig && trainer_more(t)) { /* after the last step the run just ends */
            return trainer_stop(t, sig);
        }
        t0 = fsdp_now();
        FSDP_CHECK(fsdp_ckpt_cadence_after_step(t->ckpt));
        t->side_seconds += fsdp_now() - t0;
    }
    if (t->val && (c->val_every == 0 || t->count.step % c->val_every != 0)) {
        FSDP_CHECK(fsdp_trainer_validate(t, &val_loss));
    }
    /* the save in flight is committed first: the model file is HDF5 too, which one
     * thread at a time may call */
    FSDP_CHECK(fsdp_ckpt_cadence_wait(t->ckpt));
    if (c->out[0]) {
        char created_by[128];
        snprintf(created_by, sizeof(created_by), "fsdpc-train %s, %ld steps", PACKAGE_VERSION,
                 t->count.step);
        FSDP_CHECK(trainer_save_model(t, c->out, created_by));
    }
    FSDP_CHECK(fsdp_ckpt_cadence_final(t->ckpt));
    if (fsdp_trainer_rank(t) == 0) {
        trainer_print_done(t);
    }
    return 0;
}
