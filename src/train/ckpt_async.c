/*
 * ckpt_async.c - the snapshot of this rank's state pieces and the thread
 * that writes a checkpoint shard from it (ckpt_async.h). The snapshot lays
 * the pieces end to end in enumeration order, each (rows, cols) row-major
 * as the engine holds it (a tensor-parallel engine's: every tensor's rows
 * of its checkpoint shard, as save_rows re-lays them out); the thread puts
 * them in that order, as the synchronous save does, so the shard file is
 * the same.
 */
#include "config.h"
#include "train/ckpt_async.h"
#include "train/save_progress.h"
#include "compute/device.h"
#include "core/error.h"
#include "core/spec.h"
#include "core/util.h"
#include "io/ckpt/ckpt.h"
#include "parallel/engine.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where one piece sits in the snapshot. */
struct async_piece {
    int kind;
    size_t param;
    size_t off;    /* floats from the snapshot's start */
    size_t floats; /* rows x cols */
};

struct fsdp_ckpt_async {
    struct fsdp_engine *e;
    const struct fsdp_model_spec *spec;
    struct fsdp_device *dev;
    struct fsdp_ckpt_kinds kinds;
    struct async_piece *pieces; /* (n) */
    size_t n;
    float *snap; /* (floats) pinned host memory of dev */
    size_t floats;
    /* the write under way: set by start, read by the thread */
    char dir[4096];
    long step;
    struct fsdp_save_progress *progress;
    pthread_t thread;
    int running; /* a thread was started and not yet joined */
    /* written by the thread under mu when it ends */
    pthread_mutex_t mu;
    int done;
    int rc;
    double write_s;
    char msg[1024], hint[512];
};

/* The snapshot's pieces of a tensor-parallel engine: every tensor's rows
 * of this checkpoint shard, every column, in (kind, parameter) order. */
static size_t async_layout_rows(struct fsdp_engine *e, const struct fsdp_model_spec *spec,
                                struct async_piece *out, size_t *n)
{
    size_t off = 0;
    *n = 0;
    for (int k = 0; e->writes_state && k <= e->n_state; k++) {
        for (size_t i = 0; i < spec->n_params; i++, (*n)++) {
            const struct fsdp_param_spec *p = &spec->params[i];
            size_t row0, rows;
            fsdp_split_even(p->shape[0], (size_t)e->n_shards, (size_t)e->shard, &row0, &rows);
            if (out) {
                out[*n] = (struct async_piece){k, i, off, rows * p->shape[1]};
            }
            off += rows * p->shape[1];
        }
    }
    return off;
}

/* Pieces of e's snapshot on this rank. */
static size_t async_n_pieces(struct fsdp_engine *e, const struct fsdp_model_spec *spec)
{
    size_t n = 0;
    if (e->blocks) {
        (void)async_layout_rows(e, spec, NULL, &n);
        return n;
    }
    return e->writes_state ? e->ops->n_pieces(e) : 0;
}

/* The layout of e's pieces; *floats their sum. out NULL: counted only. */
static size_t async_layout(struct fsdp_engine *e, const struct fsdp_model_spec *spec,
                           struct async_piece *out)
{
    size_t n = e->writes_state ? e->ops->n_pieces(e) : 0, off = 0;
    if (e->blocks) {
        return async_layout_rows(e, spec, out, &n);
    }
    for (size_t k = 0; k < n; k++) {
        struct fsdp_state_piece pc = {0};
        e->ops->piece(e, k, &pc);
        size_t floats = pc.rows * fsdp_state_piece_cols(&pc, spec->params[pc.param].shape[1]);
        if (out) {
            out[k] = (struct async_piece){pc.kind, pc.param, off, floats};
        }
        off += floats;
    }
    return off;
}

size_t fsdp_ckpt_async_bytes(struct fsdp_engine *e, const struct fsdp_model_spec *spec)
{
    return async_layout(e, spec, NULL) * sizeof(float);
}

int fsdp_ckpt_async_create(struct fsdp_engine *e, const struct fsdp_model_spec *spec,
                           struct fsdp_device *dev, struct fsdp_ckpt_async **out)
{
    struct fsdp_ckpt_async *a = calloc(1, sizeof(*a));
    if (!a) {
        return fsdp_err(FSDP_ERR_NOMEM, "checkpoint snapshot");
    }
    pthread_mutex_init(&a->mu, NULL);
    a->e = e;
    a->spec = spec;
    a->dev = dev;
    a->done = 1;
    int rc = fsdp_ckpt_kinds_init(&a->kinds, e->n_state, e->state_names);
    a->n = async_n_pieces(e, spec);
    a->pieces = calloc(a->n ? a->n : 1, sizeof(*a->pieces));
    if (rc == 0 && !a->pieces) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "checkpoint snapshot: %zu pieces", a->n);
    }
    if (rc == 0) {
        a->floats = async_layout(e, spec, a->pieces);
    }
    if (rc == 0 && a->floats > 0) {
        a->snap = dev->ops->host_alloc(dev, a->floats * sizeof(float));
        if (!a->snap) {
            rc = fsdp_err(FSDP_ERR_NOMEM,
                          "%zu bytes of pinned host memory for the checkpoint "
                          "snapshot",
                          a->floats * sizeof(float));
            fsdp_err_hint("--ckpt-async off writes checkpoints without a snapshot");
        }
    }
    if (rc < 0) {
        fsdp_ckpt_async_destroy(a);
        return rc;
    }
    *out = a;
    return 0;
}

void fsdp_ckpt_async_destroy(struct fsdp_ckpt_async *a)
{
    if (!a) {
        return;
    }
    if (a->running) {
        fsdp_ckpt_async_wait(a, NULL);
        fsdp_err_clear(); /* its outcome is nobody's now */
    }
    if (a->snap) {
        a->dev->ops->host_free(a->dev, a->snap);
    }
    pthread_mutex_destroy(&a->mu);
    free(a->pieces);
    free(a);
}

int fsdp_ckpt_async_snapshot(struct fsdp_ckpt_async *a)
{
    struct fsdp_engine *e = a->e;
    if (a->running) {
        return fsdp_err(FSDP_ERR_INVALID, "checkpoint snapshot taken while its write runs");
    }
    if (e->blocks) { /* collective: every rank re-lays out every tensor */
        size_t k = 0;
        for (int kind = 0; kind <= e->n_state; kind++) {
            for (size_t i = 0; i < a->spec->n_params; i++) {
                float *out = k < a->n ? a->snap + a->pieces[k++].off : NULL;
                FSDP_CHECK(e->ops->save_rows(e, kind, i, out));
            }
        }
        return 0;
    }
    for (size_t k = 0; k < a->n; k++) {
        struct fsdp_state_piece pc = {0};
        e->ops->piece(e, k, &pc);
        if (pc.host) { /* offloaded state: host memory already */
            memcpy(a->snap + a->pieces[k].off, pc.data, a->pieces[k].floats * sizeof(float));
            continue;
        }
        FSDP_CHECK(a->dev->ops->copy(a->dev, a->snap + a->pieces[k].off, pc.data,
                                     a->pieces[k].floats * sizeof(float), FSDP_COPY_D2H,
                                     a->dev->stream));
    }
    return a->n ? a->dev->ops->synchronize(a->dev, a->dev->stream) : 0;
}

/* The shard from the snapshot: what the synchronous save writes, in its order. */
static int async_write(struct fsdp_ckpt_async *a)
{
    struct fsdp_engine *e = a->e;
    struct fsdp_ckpt_shard_writer *w = NULL;
    FSDP_CHECK(
        fsdp_ckpt_shard_create(a->dir, e->shard, e->n_shards, a->step, a->spec, &a->kinds, &w));
    int rc = 0;
    fsdp_save_progress_total(a->progress, a->n);
    for (size_t k = 0; k < a->n && rc == 0; k++) {
        const struct async_piece *p = &a->pieces[k];
        rc = fsdp_ckpt_shard_put(w, p->kind, p->param, a->snap + p->off);
        fsdp_save_progress_tick(a->progress);
    }
    if (rc == 0) {
        rc = fsdp_ckpt_shard_commit(w);
    }
    fsdp_ckpt_shard_destroy(w);
    return rc;
}

static void *async_main(void *arg)
{
    struct fsdp_ckpt_async *a = arg;
    const double t0 = fsdp_now();
    int rc = async_write(a);
    pthread_mutex_lock(&a->mu);
    a->rc = rc;
    a->write_s = fsdp_now() - t0;
    snprintf(a->msg, sizeof(a->msg), "%s", rc < 0 ? fsdp_err_msg() : "");
    snprintf(a->hint, sizeof(a->hint), "%s", rc < 0 ? fsdp_err_hint_msg() : "");
    a->done = 1;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

int fsdp_ckpt_async_start(struct fsdp_ckpt_async *a, const char *dir, long step,
                          struct fsdp_save_progress *p)
{
    if (a->running) {
        return fsdp_err(FSDP_ERR_INVALID, "checkpoint write started while another runs");
    }
    snprintf(a->dir, sizeof(a->dir), "%s", dir);
    a->step = step;
    a->progress = p;
    a->rc = 0;
    a->write_s = 0;
    a->msg[0] = a->hint[0] = '\0';
    if (a->n == 0) { /* no shard here: done at once */
        a->done = 1;
        return 0;
    }
    a->done = 0;
    /* the thread takes no signal: the stop signals reach the main thread,
     * which folds them into the step's agreement (stop.h) */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&a->thread, NULL, async_main, a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) {
        a->done = 1;
        return fsdp_err(FSDP_ERR_IO, "checkpoint step %ld: cannot start the writer thread: %s",
                        step, strerror(err));
    }
    a->running = 1;
    return 0;
}

int fsdp_ckpt_async_done(struct fsdp_ckpt_async *a)
{
    pthread_mutex_lock(&a->mu);
    int done = a->done;
    pthread_mutex_unlock(&a->mu);
    return done;
}

int fsdp_ckpt_async_wait(struct fsdp_ckpt_async *a, double *write_s)
{
    if (a->running) {
        pthread_join(a->thread, NULL);
        a->running = 0;
    }
    if (write_s) {
        *write_s = a->write_s;
    }
    if (a->rc < 0 && !a->msg[0]) {
        return a->rc;
    }
    if (a->rc < 0) {
        int rc = fsdp_err(a->rc, "%s", a->msg);
        if (a->hint[0]) {
            fsdp_err_hint("%s", a->hint);
        }
        return rc;
    }
    return 0;
}
