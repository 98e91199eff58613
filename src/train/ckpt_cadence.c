/*
 * ckpt_cadence.c - when the loop checkpoints (see ckpt_cadence.h; layout in
 * doc/formats.md): the checkpoint directory prepared and put back in order
 * at the start, the --ckpt-every cadence, the save at the end and on a
 * signal, each after the save in flight, whether saves run in the
 * background (--ckpt-async), and --ckpt-keep over this run's lineage. A
 * save itself, and the agreement around each of its steps, is
 * ckpt_save.c's; resuming is ckpt_resume.c's.
 */
#include "config.h"
#include "train/ckpt_cadence.h"
#include "train/ckpt_cadence_impl.h"
#include "train/save_progress.h"
#include "train/ckpt_async.h"
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
int fsdp_cad_commit(struct fsdp_ckpt_cadence *c, const char *tmp, long step, unsigned nonce,
                    long keep)
{
    FSDP_CHECK(fsdp_ckpt_commit_step(c->dir, tmp, step, nonce));
    cad_own(c, step);
    return keep > 0 ? fsdp_cad_retain(c, keep, step, nonce) : 0;
}

// ----------------------------------------------------------------------------
// saves in the background or in the loop

/* Bytes of memory the host has available (MemAvailable), 0 when unknown. */
static double cad_host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kib = 0;
    while (f && fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1) {
            break;
        }
    }
    if (f) {
        fclose(f);
    }
    if (kib > 0) {
        return kib * 1024.0;
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (double)pages * (double)size : 0;
}

/*
 * --ckpt-async: on, off, or auto: on when the snapshot of every rank of a
 * host takes at most half the memory the host has available, on every
 * host (agreed). A tensor-parallel engine's snapshot is its checkpoint
 * shard's rows, re-laid out when it is taken. Collective.
 */
static int cad_choose_async(struct fsdp_ckpt_cadence *c)
{
    const struct fsdp_ckpt_run *r = &c->run;
    const int mode = r->cfg->ckpt_async;
    if (mode == FSDP_CKPT_ASYNC_OFF) {
        return 0;
    }
    const double bytes = (double)fsdp_ckpt_async_bytes(r->engine, r->spec);
    const double avail = cad_host_available();
    int32_t fits = mode == FSDP_CKPT_ASYNC_ON || bytes * r->local_ranks <= 0.5 * avail;
    FSDP_CHECK(fsdp_world_min(r->world, &fits, 1));
    if (!fits) {
        if (c->rank == 0) {
            FSDP_INFO(FSDP_SUB_TRAIN,
                      "checkpoints are saved in the loop: a snapshot of %.1f MiB "
                      "per rank, %d rank%s on a host, is over half the memory a host has "
                      "available (--ckpt-async on writes them in the background anyway)",
                      bytes / 1048576.0, r->local_ranks, r->local_ranks > 1 ? "s" : "");
        }
        return 0;
    }
    int rc = fsdp_ckpt_async_create(r->engine, r->spec, r->dev, &c->async);
    if (rc == 0 && c->rank == 0) {
        FSDP_INFO(FSDP_SUB_TRAIN,
                  "checkpoint shards are written in the background from a "
                  "snapshot of %.1f MiB of pinned host memory per rank (--ckpt-async)",
                  bytes / 1048576.0);
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
    if (rc == 0) {
        rc =
            fsdp_world_outcome(run->world, cad_choose_async(c), "allocate the checkpoint snapshot");
    }
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
        fsdp_ckpt_async_destroy(c->async); /* an uncommitted write: recovered at the next start */
        free(c->foreign);
    }
    free(c);
}

int fsdp_ckpt_cadence_wait(struct fsdp_ckpt_cadence *c)
{
    return c ? fsdp_cad_poll(c, 1) : 0;
}

int fsdp_ckpt_cadence_save_now(struct fsdp_ckpt_cadence *c)
{
    if (!c) {
        return 0;
    }
    FSDP_CHECK(fsdp_cad_poll(c, 1));
    return fsdp_cad_save(c, 0); /* the run ends after it: nothing to overlap */
}

int fsdp_ckpt_cadence_after_step(struct fsdp_ckpt_cadence *c)
{
    if (!c) {
        return 0;
    }
    FSDP_CHECK(fsdp_cad_poll(c, 0));
    const long step = c->run.count->step, every = c->run.cfg->ckpt_every;
    if (every == 0 || step % every != 0) {
        return 0;
    }
    if (c->in_flight) {
        if (c->rank == 0) {
            FSDP_INFO(FSDP_SUB_TRAIN,
                      "checkpoint step %ld waits for the save of step %ld, still "
                      "being written",
                      step, c->cur.step);
        }
        FSDP_CHECK(fsdp_cad_poll(c, 1));
    }
    return fsdp_cad_save_checked(c, 1);
}

int fsdp_ckpt_cadence_final(struct fsdp_ckpt_cadence *c)
{
    if (!c) {
        return 0;
    }
    FSDP_CHECK(fsdp_cad_poll(c, 1));
    if (c->last_tried == c->run.count->step) {
        return 0; /* saved (or, with ckpt-keep-going, tried and logged) after this step */
    }
    return fsdp_cad_save_checked(c, 0);
}
