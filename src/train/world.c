/*
 * world.c - the loop's collectives over every rank (world.h), on a group of
 * their own.
 */
#include "config.h"
#include "train/world.h"
#include "comm/group.h"
#include "core/error.h"
#include "core/log.h"
#include "rendezvous/dist.h"
#include "rendezvous/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fsdp_world_create(struct fsdp_dist *d, const struct fsdp_backend_ops *ops,
                      struct fsdp_world **out)
{
    struct fsdp_world *w = calloc(1, sizeof(*w));
    int n = d ? d->world_size : 1;
    int *ranks = calloc((size_t)n, sizeof(int));
    int rc = 0;
    if (!w || !ranks) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "world group");
        goto out;
    }
    w->rank = d ? d->rank : 0;
    w->size = n;
    for (int r = 0; r < n; r++) {
        ranks[r] = r;
    }
    if (n > 1) {
        rc = fsdp_group_create(d, "world", ranks, n, ops, &w->g);
    }
out:
    free(ranks);
    if (rc < 0) {
        fsdp_world_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

void fsdp_world_destroy(struct fsdp_world *w)
{
    if (!w) {
        return;
    }
    fsdp_group_destroy(w->g);
    free(w);
}

int fsdp_world_max(struct fsdp_world *w, int32_t *v, int n)
{
    return w->g ? fsdp_allreduce_sync(w->g, v, v, (size_t)n, FSDP_I32, FSDP_MAX) : 0;
}

int fsdp_world_min(struct fsdp_world *w, int32_t *v, int n)
{
    return w->g ? fsdp_allreduce_sync(w->g, v, v, (size_t)n, FSDP_I32, FSDP_MIN) : 0;
}

int fsdp_world_allgather(struct fsdp_world *w, int32_t x, int32_t *v)
{
    if (!w->g) {
        v[0] = x;
        return 0;
    }
    return fsdp_allgather_sync(w->g, &x, v, 1, FSDP_I32);
}

int fsdp_world_broadcast(struct fsdp_world *w, int32_t *x, int root)
{
    return w->g ? fsdp_broadcast_sync(w->g, x, 1, FSDP_I32, root) : 0;
}

int fsdp_world_barrier(struct fsdp_world *w)
{
    return w->g ? fsdp_barrier_sync(w->g) : 0;
}

int fsdp_world_any_failed(struct fsdp_world *w, int rc, int *any)
{
    int32_t f = rc < 0;
    FSDP_CHECK(fsdp_world_max(w, &f, 1));
    *any = f != 0;
    return 0;
}

int fsdp_world_agree(struct fsdp_world *w, int state, int *first, int *n)
{
    int32_t *st = calloc((size_t)w->size, sizeof(*st));
    *first = -1;
    *n = 0;
    if (!st) {
        return fsdp_err(FSDP_ERR_NOMEM, "agreement over %d ranks", w->size);
    }
    int arc = fsdp_world_allgather(w, state, st);
    for (int r = 0; arc == 0 && r < w->size; r++) {
        *first = st[r] == 2 && *first < 0 ? r : *first;
        *n += st[r] != 0;
    }
    free(st);
    return arc;
}

/*
 * Each failed rank counts itself, and one with a message leaves a key of its
 * own; after a barrier every rank reads the count and, when it is not zero,
 * looks for the lowest key. A failure on every rank (the usual case: the same
 * flags, the same files) finds rank 0's key at the first look.
 */
int fsdp_world_agree_store(struct fsdp_dist *d, const char *name, int state, int *first, int *n)
{
    *first = -1;
    *n = 0;
    if (!d || d->world_size <= 1 || !d->store) {
        *first = state == 2 ? 0 : -1;
        *n = state != 0;
        return 0;
    }
    char key[160], count[160];
    int64_t total = 0;
    snprintf(count, sizeof(count), "fsdpc/agree/%s/n", name);
    if (state == 2) {
        snprintf(key, sizeof(key), "fsdpc/agree/%s/f%d", name, d->rank);
        FSDP_CHECK(fsdp_store_set(d->store, key, "1", 1));
    }
    FSDP_CHECK(fsdp_store_add(d->store, count, state != 0, &total));
    snprintf(key, sizeof(key), "fsdpc/agree/%s/b", name);
    FSDP_CHECK(fsdp_store_barrier(d->store, key, d->world_size, -1.0));
    FSDP_CHECK(fsdp_store_add(d->store, count, 0, &total));
    *n = (int)total;
    for (int r = 0; total > 0 && r < d->world_size; r++) {
        int exists = 0;
        snprintf(key, sizeof(key), "fsdpc/agree/%s/f%d", name, r);
        FSDP_CHECK(fsdp_store_check(d->store, key, &exists));
        if (exists) {
            *first = r;
            break;
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the outcome of a step every rank took

/* The error this rank brought to an agreement, put back after it (the
 * agreement's own calls may clear the thread's record). */
static int world_restore(int rc, const char *msg, const char *hint)
{
    fsdp_err_clear();
    rc = fsdp_err(rc, "%s", msg);
    if (hint[0]) {
        fsdp_err_hint("%s", hint);
    }
    return rc;
}

/* Who reports what, once the states are known (arc: the agreement's own code). */
static int world_settle(int rank, int size, int rc, int arc, int first, int n, const char *msg,
                        const char *hint, const char *what)
{
    if (arc < 0) { /* nobody knows who failed: the job aborts on this rank's error */
        return rc < 0 ? world_restore(rc, msg, hint) : arc;
    }
    fsdp_err_clear();
    if (n == 0) {
        return 0;
    }
    if (first != rank) {
        if (first >= 0) {
            FSDP_INFO(FSDP_SUB_TRAIN, "rank %d could not %s; it reports why", first, what);
        } else if (rank == 0) {
            return fsdp_err(FSDP_ERR_ABORTED, "%d rank%s could not %s", n, n > 1 ? "s" : "", what);
        }
        return FSDP_ERR_ABORTED;
    }
    char full[1024];
    if (rc == FSDP_ERR_ABORTED) { /* agreed on before: the message has its class */
        snprintf(full, sizeof(full), "%s", msg);
    } else if (n == 1 || n == size) {
        snprintf(full, sizeof(full), "%s (%s)", msg, fsdp_strerror(rc));
    } else {
        snprintf(full, sizeof(full), "%s (%s; %d of %d ranks failed here, this is the lowest)", msg,
                 fsdp_strerror(rc), n, size);
    }
    return world_restore(FSDP_ERR_ABORTED, full, hint);
}

/* 2: this rank has a message to report, 1: it failed and another reports, 0: fine. */
static int world_state(int rc)
{
    return rc >= 0 ? 0 : fsdp_err_msg()[0] ? 2 : 1;
}

int fsdp_world_outcome(struct fsdp_world *w, int rc, const char *what)
{
    char msg[900], hint[512];
    int first, n;
    snprintf(msg, sizeof(msg), "%s", fsdp_err_msg());
    snprintf(hint, sizeof(hint), "%s", fsdp_err_hint_msg());
    int arc = fsdp_world_agree(w, world_state(rc), &first, &n);
    return world_settle(w->rank, w->size, rc, arc, first, n, msg, hint, what);
}

int fsdp_world_outcome_store(struct fsdp_dist *d, const char *name, int rc, const char *what)
{
    char msg[900], hint[512];
    int first, n;
    snprintf(msg, sizeof(msg), "%s", fsdp_err_msg());
    snprintf(hint, sizeof(hint), "%s", fsdp_err_hint_msg());
    int arc = fsdp_world_agree_store(d, name, world_state(rc), &first, &n);
    return world_settle(d ? d->rank : 0, d ? d->world_size : 1, rc, arc, first, n, msg, hint, what);
}
