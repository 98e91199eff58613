/*
 * ckpt_cadence.c - checkpoint cadence, preemption, resume, and the
 * agreement around each save (see ckpt_cadence.h; layout in
 * doc/formats.md). The directory commit itself (renames, fsyncs, latest)
 * is io/ckpt/ckpt_commit.c's; this file decides when it runs and makes every
 * rank agree on each step of a save, so a failure anywhere fails the save
 * everywhere:
 *   1. rank 0 draws a nonce and creates D/.tmp_step_<N>_<nonce>/
 *   2. every shard writer writes and fsyncs its shard_<r>.h5, rank 0 the
 *      index.h5; the agreement that follows is the barrier
 *   3. rank 0 commits the directory as D/step_<N> and moves D/latest to it
 *      (fsdp_ckpt_commit_step), then applies --ckpt-keep to this run's
 *      lineage (cad_retain)
 * A crash at any point leaves either the previous latest or the new one,
 * and every committed step complete; rank 0 puts D back in order at the
 * next start (fsdp_ckpt_commit_recover) before anyone reads it.
 */
#include "config.h"
#include "train/ckpt_cadence.h"
#include "train/ckpt_cadence_impl.h"
#include "train/save_progress.h"
#include "train/world.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "io/ckpt/ckpt.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/util/fileutil.h"
#include "io/text/tokens.h"
#include "parallel/engine.h"
#include "compute/device.h"
#include "train/stage.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// directory plumbing (rank 0)

/* Bytes of the regular files directly under dir (a checkpoint step's
 * shards and index), for the throughput figure in the log; 0 when unreadable. */
double fsdp_cad_dir_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    double total = 0;
    if (!d) {
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[CAD_PATH_MAX];
        struct stat st;
        int n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (n > 0 && (size_t)n < sizeof(path) && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            total += (double)st.st_size;
        }
    }
    closedir(d);
    return total;
}

/* "1.40 GiB in 1.75 s, 0.86 GB/s" */
void fsdp_cad_rate_str(double bytes, double secs, char *buf, size_t n)
{
    snprintf(buf, n, "%.2f GiB in %.2f s, %.2f GB/s", bytes / (1024.0 * 1024 * 1024), secs,
             secs > 0 ? bytes / secs / 1e9 : 0.0);
}

static int cad_mkdirs(const char *dir)
{
    char buf[FSDP_TRAIN_PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
                return fsdp_err(FSDP_ERR_IO, "ckpt-dir %s: cannot create %s: %s", dir, buf,
                                strerror(errno));
            }
            *p = '/';
        }
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        return fsdp_err(FSDP_ERR_IO, "ckpt-dir %s: cannot create: %s", dir, strerror(errno));
    }
    if (access(buf, W_OK | X_OK) != 0) {
        return fsdp_err(FSDP_ERR_IO, "ckpt-dir %s: cannot write in it: %s", dir, strerror(errno));
    }
    return 0;
}

/* Puts D back in order after a crash (see fsdp_ckpt_commit_recover) and
 * says what it did. */
static int cad_recover(const char *dir)
{
    struct fsdp_ckpt_recovery rep;
    FSDP_CHECK(fsdp_ckpt_commit_recover(dir, &rep));
    for (int i = 0; i < rep.n_restored && i < 8; i++) {
        FSDP_WARN(FSDP_SUB_TRAIN, "ckpt-dir %s: step_%ld restored from the copy a save of that "
                  "step moved aside before it was interrupted", dir, rep.restored[i]);
    }
    if (rep.n_removed > 0) {
        FSDP_INFO(FSDP_SUB_TRAIN, "ckpt-dir %s: removed %d leftover%s of interrupted checkpoint "
                  "saves", dir, rep.n_removed, rep.n_removed > 1 ? "s" : "");
    }
    return 0;
}

/* Where fsdp_cad_list_steps's steps go. */
struct cad_steps {
    const char *dir;
    long *steps;
    size_t cap, *n;
};

static int cad_add_step(const char *name, long step, void *arg)
{
    struct cad_steps *a = arg;
    (void)name;
    if (*a->n == a->cap) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "ckpt-dir %s: more than %zu step directories; "
                        "ckpt-keep leaves them all (remove old ones by hand)",
                        a->dir, a->cap);
    }
    a->steps[(*a->n)++] = step;
    return 0;
}

/* Steps of D's step_<N> directories, at most cap; *n of them. */
int fsdp_cad_list_steps(const char *dir, long *steps, size_t cap, size_t *n)
{
    struct cad_steps a = {dir, steps, cap, n};
    *n = 0;
    int rc = fsdp_ckpt_step_scan(dir, 0, cad_add_step, &a);
    if (rc == FSDP_ERR_IO) { /* the scan names dir; say which flag it came from */
        char why[1024];
        fsdp_err_take(why, sizeof(why));
        return fsdp_err(rc, "ckpt-dir %s", why);
    }
    return rc;
}

int fsdp_cad_cmp_desc(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int cad_is_foreign(const struct fsdp_ckpt_cadence *c, long step)
{
    for (size_t i = 0; i < c->n_foreign; i++) {
        if (c->foreign[i] == step) {
            return 1;
        }
    }
    return 0;
}

/* A step this run committed is its own from now on, whoever wrote it before. */
static void cad_own(struct fsdp_ckpt_cadence *c, long step)
{
    for (size_t i = 0; i < c->n_foreign; i++) {
        if (c->foreign[i] == step) {
            c->foreign[i] = c->foreign[--c->n_foreign];
            return;
        }
    }
}

/* Rank 0 at the start: which step directories this run did not write. */
static int cad_snapshot_foreign(struct fsdp_ckpt_cadence *c)
{
    long steps[CAD_MAX_STEPS];
    size_t n;
    if (fsdp_cad_list_steps(c->dir, steps, CAD_MAX_STEPS, &n) < 0) {
        fsdp_err_clear(); /* retention, the only reader, lists again and reports it */
        n = 0;
    }
    if (n == 0) {
        return 0;
    }
    c->foreign = malloc(n * sizeof(*c->foreign));
    if (!c->foreign) {
        return fsdp_err(FSDP_ERR_NOMEM, "ckpt-dir %s: step list", c->dir);
    }
    memcpy(c->foreign, steps, n * sizeof(*c->foreign));
    c->n_foreign = n;
    return 0;
}

/* Once per run: the steps of another lineage that retention leaves alone. */
static void cad_warn_foreign(struct fsdp_ckpt_cadence *c, const long *steps, size_t n)
{
    char list[512];
    size_t used = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n && used < sizeof(list); i++) {
        int k = snprintf(list + used, sizeof(list) - used, "%sstep_%ld", i ? ", " : "", steps[i]);
        used += k > 0 ? (size_t)k : 0;
    }
    c->warned_foreign = 1;
    if (c->resumed_from >= 0) {
        FSDP_WARN(FSDP_SUB_TRAIN, "ckpt-keep: %s in %s %s newer than step_%ld, which this run "
                  "resumed from, and not written by this run (an abandoned run's); ckpt-keep "
                  "neither counts nor removes %s, so remove %s by hand when done with %s", list,
                  c->dir, n > 1 ? "are" : "is", c->resumed_from, n > 1 ? "them" : "it",
                  n > 1 ? "them" : "it", n > 1 ? "them" : "it");
    } else {
        FSDP_WARN(FSDP_SUB_TRAIN, "ckpt-keep: %s in %s %s from before this run, which did not "
                  "resume from any checkpoint; ckpt-keep neither counts nor removes %s, so "
                  "remove %s by hand when done with %s", list, c->dir, n > 1 ? "are" : "is",
                  n > 1 ? "them" : "it", n > 1 ? "them" : "it", n > 1 ? "them" : "it");
    }
}

/*
 * --ckpt-keep K over this run's lineage: the steps it wrote, the one it
 * resumed from and those below that. Of these only the newest K stay, and
 * never current (which latest names). A step above resumed_from that this
 * run did not write belongs to a run that went further before this one
 * was resumed from an older step; counting it would delete this run's own
 * checkpoints (its resume point first) to keep that abandoned run's, so it
 * is left alone, with a warning.
 */
int fsdp_cad_retain(struct fsdp_ckpt_cadence *c, long keep, long current, unsigned nonce)
{
    long steps[CAD_MAX_STEPS], other[CAD_MAX_STEPS];
    size_t n, n_line = 0, n_other = 0;
    FSDP_CHECK(fsdp_cad_list_steps(c->dir, steps, CAD_MAX_STEPS, &n));
    for (size_t i = 0; i < n; i++) {
        if (steps[i] > c->resumed_from && cad_is_foreign(c, steps[i])) {
            other[n_other++] = steps[i];
        } else {
            steps[n_line++] = steps[i];
        }
    }
    qsort(steps, n_line, sizeof(steps[0]), fsdp_cad_cmp_desc);
    for (size_t i = (size_t)keep; i < n_line; i++) {
        if (steps[i] != current) {
            FSDP_CHECK(fsdp_ckpt_commit_remove(c->dir, steps[i], nonce));
            cad_own(c, steps[i]); /* gone: no longer in the snapshot */
        }
    }
    if (n_other > 0 && !c->warned_foreign) {
        qsort(other, n_other, sizeof(other[0]), fsdp_cad_cmp_desc);
        cad_warn_foreign(c, other, n_other);
    }
    return 0;
}

/* Rank 0: tmp -> step_<N>, latest -> step_<N>, then retention. */
static int cad_commit(struct fsdp_ckpt_cadence *c, const char *tmp, long step, unsigned nonce,
                      long keep)
{
    FSDP_CHECK(fsdp_ckpt_commit_step(c->dir, tmp, step, nonce));
    cad_own(c, step);
    return keep > 0 ? fsdp_cad_retain(c, keep, step, nonce) : 0;
}

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
                  "failed save", c->dir);
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
            rc = fsdp_stage_read(&st, pc.data, pc.rows * cols, &host);
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

/* On rank 0, once every shard is written: the index with meta and the
 * engine's counters (it records the checksums of every shard). */
static int cad_write_index(struct fsdp_ckpt_cadence *c, const char *dir,
                           const struct fsdp_ckpt_meta *meta)
{
    const struct fsdp_ckpt_run *r = &c->run;
    struct fsdp_engine *e = r->engine;
    struct fsdp_ckpt_meta m = *meta;
    struct fsdp_ckpt_kinds kinds;
    struct fsdp_engine_counters cn;
    FSDP_CHECK(cad_kinds(e, &kinds));
    e->ops->get_counters(e, &cn);
    m.n_shards = e->n_shards;
    m.world_size = r->world->size;
    snprintf(m.mesh, sizeof(m.mesh), "%s", r->mesh);
    snprintf(m.backends, sizeof(m.backends), "%s", r->backends);
    m.adam_step = cn.opt_step;
    m.loss_scale = cn.loss_scale;
    m.scale_good_steps = cn.scale_good_steps;
    m.skipped_steps = cn.skipped_steps;
    return fsdp_ckpt_index_write(dir, r->spec, &kinds, &m);
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

/* What index.h5 records besides the tensors and the engine's counters. */
static int cad_meta(const struct fsdp_ckpt_run *r, long step, struct fsdp_ckpt_meta *meta)
{
    struct fsdp_dataloader_state ds;
    meta->step = step;
    meta->tokens_seen = r->count->tokens_seen;
    meta->seed = r->cfg->seed;
    fsdp_dataloader_get_state(r->train, &ds);
    meta->data_position = ds.position;
    meta->data_epoch = ds.epoch;
    meta->data_n_tokens = ds.n_tokens;
    snprintf(meta->created_by, sizeof(meta->created_by), "fsdpc-train %s, step %ld",
             PACKAGE_VERSION, step);
    return cad_config_text(r->cfg, meta->config, sizeof(meta->config));
}

static int cad_save(struct fsdp_ckpt_cadence *c)
{
    const struct fsdp_ckpt_run *r = &c->run;
    const long step = r->count->step;
    char tmp[CAD_PATH_MAX];
    int32_t nonce = 0;
    int rc = 0;
    c->last_tried = step;
    fsdp_save_progress_start(&c->progress, c->rank, step, c->dir);
    if (c->rank == 0) {
        nonce = (int32_t)(((unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL) ^
                           (unsigned)step * 40503u) & 0x7fffffffu);
    }
    FSDP_CHECK(fsdp_world_broadcast(r->world, &nonce, 0));
    rc = fsdp_ckpt_commit_tmp_path(tmp, sizeof(tmp), c->dir, step, (unsigned)nonce);
    if (rc == 0 && c->rank == 0 && mkdir(tmp, 0755) != 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    }
    FSDP_CHECK(cad_agree_ok(c, rc, step, "create the temporary directory"));

    struct fsdp_ckpt_meta *meta = calloc(1, sizeof(*meta));
    rc = meta ? cad_meta(r, step, meta) : fsdp_err(FSDP_ERR_NOMEM, "checkpoint metadata");
    const double t_save = fsdp_now();
    if (rc == 0) {
        rc = cad_write_state(c, tmp, meta);
    }
    if (rc < 0) {
        cad_save_hint(c);
    }
    rc = cad_agree_ok(c, rc, step, "write its shard");
    if (rc == 0 && c->rank == 0) {
        rc = cad_write_index(c, tmp, meta);
    }
    free(meta);
    if (rc == 0 && c->rank == 0) {
        rc = cad_commit(c, tmp, step, (unsigned)nonce, r->cfg->ckpt_keep);
    }
    if (rc < 0 && c->rank == 0) {
        cad_save_hint(c);
    }
    rc = cad_agree_ok(c, rc, step, "commit the checkpoint");
    if (rc < 0) {
        if (c->rank == 0) {
            char msg[1024], hint[512];
            fsdp_err_take(msg, sizeof(msg));
            snprintf(hint, sizeof(hint), "%s", fsdp_err_hint_msg());
            fsdp_file_rmtree(tmp);
            fsdp_err_clear();
            if (msg[0]) { /* rank 0 is the one that reports it */
                rc = fsdp_err(rc, "%s", msg);
                if (hint[0]) {
                    fsdp_err_hint("%s", hint);
                }
            }
        }
        return rc;
    }
    c->last_saved = step;
    if (c->rank == 0) {
        char final[CAD_PATH_MAX], rate[96];
        snprintf(final, sizeof(final), "%s/step_%ld", c->dir, step);
        fsdp_cad_rate_str(fsdp_cad_dir_bytes(final), fsdp_now() - t_save, rate, sizeof(rate));
        FSDP_INFO(FSDP_SUB_TRAIN, "checkpoint step %ld written to %s (%s, all ranks, fsync "
                  "and commit included)", step, final, rate);
    }
    return 0;
}

/* A failed save: the error, or with ckpt-keep-going a warning. */
static int cad_save_checked(struct fsdp_ckpt_cadence *c)
{
    int rc = cad_save(c);
    if (rc < 0 && c->run.cfg->ckpt_keep_going) {
        char msg[1024];
        fsdp_err_take(msg, sizeof(msg));
        fsdp_err_clear();
        if (msg[0]) { /* the rank that reports it; the others were told */
            FSDP_WARN(FSDP_SUB_TRAIN,
                      "checkpoint step %ld failed: %s; training continues "
                      "(ckpt-keep-going)",
                      c->run.count->step, msg);
        }
        return 0;
    }
    return rc;
}

// ----------------------------------------------------------------------------
// API

int fsdp_ckpt_cadence_create(const struct fsdp_ckpt_run *run, struct fsdp_ckpt_cadence **out)
{
    const struct fsdp_train_config *cfg = run->cfg;
    *out = NULL;
    if (!cfg->ckpt_dir[0]) {
        return 0;
    }
    struct fsdp_ckpt_cadence *c = calloc(1, sizeof(*c));
    if (!c) {
        return fsdp_err(FSDP_ERR_NOMEM, "checkpoint cadence");
    }
    c->run = *run;
    snprintf(c->dir, sizeof(c->dir), "%s", cfg->ckpt_dir);
    c->rank = run->world->rank;
    c->last_saved = -1;
    c->last_tried = -1;
    c->resumed_from = -1;
    int rc = 0;
    if (c->rank == 0) {
        struct stat st;
        char link[FSDP_TRAIN_PATH_MAX + 16];
        c->existed = stat(c->dir, &st) == 0;
        snprintf(link, sizeof(link), "%s/%s", c->dir, FSDP_CKPT_LATEST);
        if (strcmp(cfg->resume, "required") == 0 && lstat(link, &st) != 0) {
            rc = fsdp_err(FSDP_ERR_INVALID, "resume required: ckpt-dir %s %s", c->dir,
                          c->existed ? "holds no checkpoint (no 'latest' in it)"
                                     : "does not exist");
            fsdp_err_hint("check --ckpt-dir (a typo starts a new run there); --resume latest "
                          "starts from --model when there is no checkpoint yet");
        }
    }
    if (rc == 0 && c->rank == 0) {
        rc = cad_mkdirs(c->dir);
        if (rc == 0) {
            rc = cad_recover(c->dir);
        }
        if (rc == 0) {
            rc = cad_snapshot_foreign(c);
        }
    }
    rc = fsdp_world_outcome(run->world, rc, "prepare ckpt-dir");
    if (rc < 0) {
        fsdp_ckpt_cadence_destroy(c);
        return rc;
    }
    /* a file-size limit must fail the write (EFBIG), not kill the rank */
    signal(SIGXFSZ, SIG_IGN);
    *out = c;
    return 0;
}

void fsdp_ckpt_cadence_destroy(struct fsdp_ckpt_cadence *c)
{
    if (c) {
        free(c->foreign);
    }
    free(c);
}

int fsdp_ckpt_cadence_save_now(struct fsdp_ckpt_cadence *c)
{
    return c ? cad_save(c) : 0;
}

int fsdp_ckpt_cadence_after_step(struct fsdp_ckpt_cadence *c)
{
    if (c && c->run.cfg->ckpt_every > 0 && c->run.count->step % c->run.cfg->ckpt_every == 0) {
        return cad_save_checked(c);
    }
    return 0;
}

int fsdp_ckpt_cadence_final(struct fsdp_ckpt_cadence *c)
{
    if (!c || c->last_tried == c->run.count->step) {
        return 0; /* saved (or, with ckpt-keep-going, tried and logged) after this step */
    }
    return cad_save_checked(c);
}
