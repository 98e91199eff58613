/*
 * ckpt_save.c - one checkpoint save (ckpt_cadence_impl.h), and the
 * agreement around each of its steps, so that a failure anywhere fails the
 * save everywhere. The directory commit itself (renames, fsyncs, latest) is
 * io/ckpt/ckpt_commit.c's:
 *   1. rank 0 draws a nonce and creates D/.tmp_step_<N>_<nonce>/; every
 *      rank records the run state of the step (fsdp_ckpt_meta) there and then
 *   2. every shard writer writes and fsyncs its shard_<r>.h5; the agreement
 *      that follows is the barrier
 *   3. rank 0 writes index.h5, commits the directory as D/step_<N> and moves
 *      D/latest to it (fsdp_ckpt_commit_step), then applies --ckpt-keep to
 *      this run's lineage (fsdp_cad_retain); everyone hears the outcome
 * A save in the background (--ckpt-async) takes a snapshot of this rank's
 * pieces at 1 and lets a thread write the shard (ckpt_async.h); the loop
 * goes on, each step boundary agrees on whether every rank's write is done
 * (one small all-reduce while one is under way), and 3 runs in the main
 * thread at the first boundary where all are. A crash at any point leaves
 * either the previous latest or the new one, and every committed step
 * complete; rank 0 puts D back in order at the next start
 * (fsdp_ckpt_commit_recover) before anyone reads it.
 */
#include "config.h"
#include "train/ckpt_cadence.h"
#include "train/ckpt_cadence_impl.h"
#include "train/ckpt_async.h"
#include "train/save_progress.h"
#include "train/stage.h"
#include "train/world.h"
#include "compute/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "io/ckpt/ckpt.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/text/tokens.h"
#include "io/util/fileutil.h"
#include "parallel/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// agreement

/* All ranks learn whether any failed: FSDP_ERR_ABORTED on every rank then,
 * the message with the lowest rank that failed (fsdp_world_outcome). */
static int cad_agree_ok(struct fsdp_ckpt_cadence *c, int rc, long step, const char *what)
{
    char why[128];
    snprintf(why, sizeof(why), "%s for checkpoint step %ld", what, step);
    return fsdp_world_outcome(c->run.world, rc, why);
}

/* What to check when a save failed here. */
static void cad_save_hint(const struct fsdp_ckpt_cadence *c)
{
    fsdp_err_hint("check free space, quotas and permissions where --ckpt-dir points (df -h %s); "
                  "--ckpt-keep K keeps fewer checkpoints, --ckpt-keep-going trains on after a "
                  "failed save",
                  c->dir);
}

// ----------------------------------------------------------------------------
// the engine's state in and out of checkpoint files, as row ranges

/* What the checkpoint keeps per parameter: the parameter (kind 0), then the
 * optimizer's state tensors by its names, kind k being the engine's. */
static int cad_kinds(const struct fsdp_engine *e, struct fsdp_ckpt_kinds *kinds)
{
    return fsdp_ckpt_kinds_init(kinds, e->n_state, e->state_names);
}

/*
 * A tensor-parallel engine's shard: its pieces are blocks, so every tensor
 * is re-laid out as this shard's whole rows first (save_rows, collective:
 * every rank takes part in the same order, the writers put the rows).
 */
static int cad_write_rows(struct fsdp_ckpt_cadence *c, const char *dir,
                          const struct fsdp_ckpt_meta *meta)
{
    struct fsdp_engine *e = c->run.engine;
    const struct fsdp_model_spec *s = c->run.spec;
    struct fsdp_ckpt_shard_writer *w = NULL;
    int rc = 0;
    float *rows = malloc(fsdp_model_spec_largest(s) * sizeof(float));
    if (!rows) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "checkpoint: %zu bytes of rows",
                      fsdp_model_spec_largest(s) * sizeof(float));
    }
    struct fsdp_ckpt_kinds kinds;
    if (rc == 0 && e->writes_state) {
        rc = cad_kinds(e, &kinds);
        rc = rc < 0 ? rc
                    : fsdp_ckpt_shard_create(dir, e->shard, e->n_shards, meta->step, s, &kinds, &w);
        fsdp_save_progress_total(&c->progress, (size_t)(e->n_state + 1) * s->n_params);
    }
    for (int k = 0; k <= e->n_state; k++) {
        for (size_t i = 0; i < s->n_params; i++) {
            /* a collective: every rank takes part after a local failure too */
            int src = e->ops->save_rows(e, k, i, rc == 0 ? rows : NULL);
            if (src < 0) {
                fsdp_ckpt_shard_destroy(w);
                free(rows);
                return src; /* a collective failed: every rank hears of it */
            }
            if (rc == 0 && w) {
                rc = fsdp_ckpt_shard_put(w, k, i, rows);
                fsdp_save_progress_tick(&c->progress);
            }
        }
    }
    if (rc == 0 && w) {
        rc = fsdp_ckpt_shard_commit(w);
    }
    fsdp_ckpt_shard_destroy(w);
    free(rows);
    return rc;
}

/*
 * This rank's shard file (when it writes one: the first replica's ranks)
 * from the engine's pieces, straight from its shards (no gather). Returns
 * this rank's status only: the caller agrees on the outcome.
 */
static int cad_write_state(struct fsdp_ckpt_cadence *c, const char *dir,
                           const struct fsdp_ckpt_meta *meta)
{
    struct fsdp_engine *e = c->run.engine;
    const struct fsdp_model_spec *spec = c->run.spec;
    FSDP_CHECK(e->ops->state_changed(e));
    if (e->blocks) {
        return cad_write_rows(c, dir, meta);
    }
    if (e->writes_state) {
        struct fsdp_ckpt_shard_writer *w = NULL;
        struct fsdp_ckpt_kinds kinds;
        FSDP_CHECK(cad_kinds(e, &kinds));
        FSDP_CHECK(
            fsdp_ckpt_shard_create(dir, e->shard, e->n_shards, meta->step, spec, &kinds, &w));
        int rc = 0;
        size_t n = e->ops->n_pieces(e);
        struct fsdp_stage st;
        fsdp_stage_init(&st, c->run.dev);
        fsdp_save_progress_total(&c->progress, n);
        for (size_t k = 0; k < n && rc == 0; k++) {
            struct fsdp_state_piece pc = {0};
            const float *host;
            e->ops->piece(e, k, &pc);
            size_t cols = fsdp_state_piece_cols(&pc, spec->params[pc.param].shape[1]);
            rc = fsdp_stage_read_piece(&st, &pc, pc.rows * cols, &host);
            rc = rc < 0 ? rc : fsdp_ckpt_shard_put(w, pc.kind, pc.param, host);
            fsdp_save_progress_tick(&c->progress);
        }
        fsdp_stage_free(&st);
        if (rc == 0) {
            rc = fsdp_ckpt_shard_commit(w);
        }
        fsdp_ckpt_shard_destroy(w);
        FSDP_CHECK(rc);
    }
    return 0;
}

/* On rank 0, once every shard is written: the index with meta (it records
 * the checksums of every shard). */
static int cad_write_index(struct fsdp_ckpt_cadence *c, const char *dir,
                           const struct fsdp_ckpt_meta *meta)
{
    struct fsdp_ckpt_kinds kinds;
    FSDP_CHECK(cad_kinds(c->run.engine, &kinds));
    return fsdp_ckpt_index_write(dir, c->run.spec, &kinds, meta);
}

/* The resolved config as 'key = value' lines. */
static int cad_config_text(const struct fsdp_train_config *cfg, char *buf, size_t len)
{
    /* the option table comes with a config to point at; cfg's values are read */
    struct fsdp_train_config *scratch = malloc(sizeof(*scratch));
    struct fsdp_optset set;
    char value[1024];
    size_t used = 0;
    if (!scratch) {
        return fsdp_err(FSDP_ERR_NOMEM, "checkpoint config text");
    }
    fsdp_train_config_init(scratch, &set);
    set.base = (void *)cfg;
    buf[0] = '\0';
    for (size_t i = 0; i < set.n && used < len; i++) {
        if (set.opts[i].flags & FSDP_OPT_HIDDEN) {
            continue;
        }
        fsdp_opt_format_value(&set, i, value, sizeof(value));
        int n = snprintf(buf + used, len - used, "%s = %s\n", set.opts[i].name, value);
        used += n > 0 ? (size_t)n : 0;
    }
    free(scratch);
    return 0;
}

/* What index.h5 records besides the tensors, as of the step just done: a
 * save in the background writes it steps later. */
static int cad_meta(const struct fsdp_ckpt_run *r, long step, struct fsdp_ckpt_meta *meta)
{
    struct fsdp_engine *e = r->engine;
    struct fsdp_dataloader_state ds;
    struct fsdp_engine_counters cn;
    meta->step = step;
    meta->tokens_seen = r->count->tokens_seen;
    meta->seed = r->cfg->seed;
    fsdp_dataloader_get_state(r->train, &ds);
    meta->data_position = ds.position;
    meta->data_epoch = ds.epoch;
    meta->data_n_tokens = ds.n_tokens;
    snprintf(meta->created_by, sizeof(meta->created_by), "fsdpc-train %s, step %ld",
             PACKAGE_VERSION, step);
    e->ops->get_counters(e, &cn);
    meta->n_shards = e->n_shards;
    meta->world_size = r->world->size;
    snprintf(meta->mesh, sizeof(meta->mesh), "%s", r->mesh);
    snprintf(meta->backends, sizeof(meta->backends), "%s", r->backends);
    meta->adam_step = cn.opt_step;
    meta->loss_scale = cn.loss_scale;
    meta->scale_good_steps = cn.scale_good_steps;
    meta->skipped_steps = cn.skipped_steps;
    return cad_config_text(r->cfg, meta->config, sizeof(meta->config));
}

// ----------------------------------------------------------------------------
// one save: begin, write (here or in the background), finish

/* A failure of this rank's part, kept until the agreement on it (the loop
 * clears the thread's record in between). */
static void cad_keep_error(struct cad_pending *p, int rc)
{
    p->rc = rc;
    snprintf(p->msg, sizeof(p->msg), "%s", fsdp_err_msg());
    snprintf(p->hint, sizeof(p->hint), "%s", fsdp_err_hint_msg());
    fsdp_err_clear();
}

static int cad_kept_error(const struct cad_pending *p)
{
    if (p->rc >= 0 || !p->msg[0]) {
        return p->rc < 0 ? p->rc : 0; /* without a message: another rank reports it */
    }
    fsdp_err_clear();
    int rc = fsdp_err(p->rc, "%s", p->msg);
    if (p->hint[0]) {
        fsdp_err_hint("%s", p->hint);
    }
    return rc;
}

/* Step 1: the nonce and the temporary directory (agreed), and the run state
 * of the step just done (a failure to record it is this rank's, in p->rc). */
static int cad_begin(struct fsdp_ckpt_cadence *c, long step)
{
    struct cad_pending *p = &c->cur;
    int32_t nonce = 0;
    int rc = 0;
    memset(p, 0, sizeof(*p));
    c->last_tried = step;
    p->step = step;
    p->t0 = fsdp_now();
    fsdp_save_progress_start(&c->progress, c->rank, step, c->dir);
    if (c->rank == 0) {
        nonce = (int32_t)(((unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL) ^
                           (unsigned)step * 40503u) &
                          0x7fffffffu);
    }
    FSDP_CHECK(fsdp_world_broadcast(c->run.world, &nonce, 0));
    p->nonce = (unsigned)nonce;
    rc = fsdp_ckpt_commit_tmp_path(p->tmp, sizeof(p->tmp), c->dir, step, p->nonce);
    if (rc == 0 && c->rank == 0 && mkdir(p->tmp, 0755) != 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", p->tmp, strerror(errno));
    }
    FSDP_CHECK(cad_agree_ok(c, rc, step, "create the temporary directory"));
    memset(&c->meta, 0, sizeof(c->meta));
    if ((rc = cad_meta(&c->run, step, &c->meta)) < 0) {
        cad_keep_error(p, rc);
    }
    return 0;
}

/* After a failed commit: rank 0 removes the temporary directory, keeping
 * the message it reports. */
static int cad_discard(struct fsdp_ckpt_cadence *c, int rc)
{
    if (c->rank != 0) {
        return rc;
    }
    char msg[1024], hint[512];
    fsdp_err_take(msg, sizeof(msg));
    snprintf(hint, sizeof(hint), "%s", fsdp_err_hint_msg());
    fsdp_file_rmtree(c->cur.tmp);
    fsdp_err_clear();
    if (msg[0]) { /* rank 0 is the one that reports it */
        rc = fsdp_err(rc, "%s", msg);
        if (hint[0]) {
            fsdp_err_hint("%s", hint);
        }
    }
    return rc;
}

/* Rank 0: what a committed save says. */
static void cad_log_done(const struct fsdp_ckpt_cadence *c, double t_write, double write_s)
{
    const struct cad_pending *p = &c->cur;
    char final[CAD_PATH_MAX];
    snprintf(final, sizeof(final), "%s/step_%ld", c->dir, p->step);
    if (!p->background) {
        char rate[96];
        fsdp_cad_rate_str(fsdp_file_dir_bytes(final, NULL), fsdp_now() - t_write, rate,
                          sizeof(rate));
        FSDP_INFO(FSDP_SUB_TRAIN,
                  "checkpoint step %ld written to %s (%s, all ranks, fsync "
                  "and commit included)",
                  p->step, final, rate);
        return;
    }
    FSDP_INFO(FSDP_SUB_TRAIN,
              "checkpoint step %ld written to %s in the background (%.2f GiB, "
              "all ranks; rank 0 wrote its shard in %.2f s; committed %.2f s after the save "
              "began; the loop stopped %.3f s for it)",
              p->step, final, fsdp_file_dir_bytes(final, NULL) / (1024.0 * 1024 * 1024), write_s,
              fsdp_now() - p->t0, p->stall_s);
}

/* Step 3, once this rank's shard is written (rc: how that went here):
 * agreed, then rank 0 writes the index and commits, and everyone hears. */
static int cad_finish(struct fsdp_ckpt_cadence *c, int rc, double t_write, double write_s)
{
    const long step = c->cur.step;
    if (rc < 0) {
        cad_save_hint(c);
    }
    rc = cad_agree_ok(c, rc, step, "write its shard");
    if (rc == 0 && c->rank == 0) {
        rc = cad_write_index(c, c->cur.tmp, &c->meta);
    }
    if (rc == 0 && c->rank == 0) {
        rc = fsdp_cad_commit(c, c->cur.tmp, step, c->cur.nonce, c->run.cfg->ckpt_keep);
    }
    if (rc < 0 && c->rank == 0) {
        cad_save_hint(c);
    }
    rc = cad_agree_ok(c, rc, step, "commit the checkpoint");
    if (rc < 0) {
        return cad_discard(c, rc);
    }
    c->last_saved = step;
    if (c->rank == 0) {
        cad_log_done(c, t_write, write_s);
    }
    return 0;
}

/*
 * Step 2 in the background: the snapshot (the loop's stall) and the
 * writer thread. A failure here is this rank's, agreed on when the save is
 * polled as done, so every rank has the save in flight from here on.
 */
static int cad_start_background(struct fsdp_ckpt_cadence *c)
{
    struct cad_pending *p = &c->cur;
    struct fsdp_engine *e = c->run.engine;
    /* collective: every rank takes part after a local failure too */
    FSDP_CHECK(e->ops->state_changed(e));
    const double t_snap = fsdp_now();
    /* a rank that could not record the step's state (p->rc) writes nothing,
     * but takes part in a tensor-parallel snapshot's re-layout (collective) */
    int rc = p->rc;
    if (rc == 0 || e->blocks) {
        int src = fsdp_ckpt_async_snapshot(c->async);
        rc = rc < 0 ? rc : src;
    }
    const double snap_s = fsdp_now() - t_snap;
    rc = rc < 0 ? rc : fsdp_ckpt_async_start(c->async, p->tmp, p->step, &c->progress);
    if (rc < 0 && p->rc >= 0) {
        cad_keep_error(p, rc);
    }
    p->background = 1;
    c->in_flight = 1;
    p->stall_s = fsdp_now() - p->t0;
    FSDP_DEBUG(FSDP_SUB_TRAIN,
               "checkpoint step %ld: snapshot of %zu bytes taken in %.4f s; the loop stopped "
               "%.4f s for the save",
               p->step, fsdp_ckpt_async_bytes(e, c->run.spec), snap_s, p->stall_s);
    return 0;
}

int fsdp_cad_save(struct fsdp_ckpt_cadence *c, int background)
{
    FSDP_CHECK(cad_begin(c, c->run.count->step));
    if (background && c->async) {
        return cad_start_background(c);
    }
    const double t_write = fsdp_now();
    int rc = cad_kept_error(&c->cur);
    if (rc == 0) {
        rc = cad_write_state(c, c->cur.tmp, &c->meta);
    }
    return cad_finish(c, rc, t_write, 0);
}

/* A failed save: the error, or with ckpt-keep-going a warning. */
static int cad_checked(struct fsdp_ckpt_cadence *c, int rc, long step)
{
    if (rc < 0 && c->run.cfg->ckpt_keep_going) {
        char msg[1024];
        fsdp_err_take(msg, sizeof(msg));
        fsdp_err_clear();
        if (msg[0]) { /* the rank that reports it; the others were told */
            FSDP_WARN(FSDP_SUB_TRAIN,
                      "checkpoint step %ld failed: %s; training continues "
                      "(ckpt-keep-going)",
                      step, msg);
        }
        return 0;
    }
    return rc;
}

int fsdp_cad_save_checked(struct fsdp_ckpt_cadence *c, int background)
{
    return cad_checked(c, fsdp_cad_save(c, background), c->run.count->step);
}

int fsdp_cad_poll(struct fsdp_ckpt_cadence *c, int wait)
{
    if (!c->in_flight) {
        return 0;
    }
    if (!wait) { /* every rank polls at the same boundary: one small all-reduce */
        int32_t done = fsdp_ckpt_async_done(c->async);
        FSDP_CHECK(fsdp_world_min(c->run.world, &done, 1));
        if (!done) {
            return 0;
        }
    }
    double write_s = 0;
    /* a rank whose snapshot failed started no write: its own error is the outcome */
    int rc = c->cur.rc < 0 ? cad_kept_error(&c->cur) : fsdp_ckpt_async_wait(c->async, &write_s);
    c->in_flight = 0;
    return cad_checked(c, cad_finish(c, rc, 0, write_s), c->cur.step);
}
