/*
 * stage.c - host staging of collectives (stage.h): a pool of host buffers
 * per group, the copies around a host collective, and the hooks the work
 * handles call when they complete or go.
 *
 * A staged collective takes one host buffer that holds its send and
 * receive sides laid out as on the device: the union of the two byte
 * ranges, so an in-place collective stays in place on the host. The send
 * side is copied at issue (the device's data must be final then: the
 * caller orders its writers before the issue, as for any collective); the
 * receive side is copied back at completion. Buffers are reused, so a
 * steady state allocates nothing.
 */
#include "config.h"
#include "comm/stage.h"
#include "core/error.h"

#include <stdint.h>
#include <stdlib.h>

#define STAGE_MAX 64 /* host buffers per group: more than collectives in flight */

struct fsdp_staged {
    struct fsdp_stage_pool *pool;
    unsigned char *host; /* the buffer */
    size_t cap;
    void *dev_recv; /* where the receive side goes back */
    void *stream;   /* the collective's stream */
    void *host_recv;
    size_t recv_bytes;
    int copied;
    int busy;
};

struct fsdp_stage_pool {
    const struct fsdp_stager *st;
    struct fsdp_staged slots[STAGE_MAX];
};

static uint32_t stage_cap_of(enum fsdp_mem mem)
{
    return mem == FSDP_MEM_CUDA      ? FSDP_CAP_MEM_CUDA
           : mem == FSDP_MEM_GUARDED ? FSDP_CAP_MEM_GUARDED
                                     : FSDP_CAP_MEM_HOST;
}

int fsdp_group_set_stager(struct fsdp_group *g, const struct fsdp_stager *st)
{
    struct fsdp_backend_caps caps;
    g->ops->capabilities(g->be, &caps);
    if (!st || (caps.flags & stage_cap_of(st->mem))) {
        g->stager = NULL;
        return 0;
    }
    if (!g->stage) {
        g->stage = calloc(1, sizeof(*g->stage));
        if (!g->stage) {
            return fsdp_err(FSDP_ERR_NOMEM, "group %s: staging pool", g->name);
        }
    }
    g->stage->st = st;
    g->stager = st;
    return 1;
}

int fsdp_stage_needed(const struct fsdp_group *g, const struct fsdp_coll_attr *attr)
{
    return g && attr && g->stager && attr->mem == g->stager->mem;
}

/* A free buffer of at least bytes: the smallest that fits, else the free
 * one grown, else a new one. */
static int stage_take(struct fsdp_group *g, size_t bytes, struct fsdp_staged **out)
{
    struct fsdp_stage_pool *p = g->stage;
    struct fsdp_staged *fit = NULL, *any = NULL;
    for (int i = 0; i < STAGE_MAX; i++) {
        struct fsdp_staged *s = &p->slots[i];
        if (s->busy) {
            continue;
        }
        if (s->cap >= bytes && (!fit || s->cap < fit->cap)) {
            fit = s;
        }
        if (!any || (any->host && !s->host)) {
            any = s;
        }
    }
    if (!fit && !any) {
        return fsdp_err(FSDP_ERR_INTERNAL, "group %s: more than %d staged collectives in flight",
                        g->name, STAGE_MAX);
    }
    if (!fit) {
        fit = any;
        if (fit->host) {
            p->st->host_free(p->st->ctx, fit->host);
        }
        fit->cap = 0;
        fit->host = p->st->host_alloc(p->st->ctx, bytes ? bytes : 1);
        if (!fit->host) {
            return fsdp_err(FSDP_ERR_NOMEM,
                            "group %s: %zu bytes of host memory to stage a "
                            "collective",
                            g->name, bytes);
        }
        fit->cap = bytes;
    }
    fit->pool = p;
    fit->busy = 1;
    fit->copied = 0;
    *out = fit;
    return 0;
}

int fsdp_stage_begin(struct fsdp_group *g, void *stream, const void *send, size_t send_bytes,
                     void *recv, size_t recv_bytes, const void **hsend, void **hrecv,
                     struct fsdp_staged **out)
{
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    int overlap = send_bytes && recv_bytes && s < r + recv_bytes && r < s + send_bytes;
    uintptr_t lo = overlap ? (s < r ? s : r) : 0;
    uintptr_t hi =
        overlap ? (s + send_bytes > r + recv_bytes ? s + send_bytes : r + recv_bytes) : 0;
    size_t bytes = overlap ? (size_t)(hi - lo) : send_bytes + recv_bytes;
    struct fsdp_staged *st = NULL;
    FSDP_CHECK(stage_take(g, bytes, &st));
    unsigned char *h = st->host;
    unsigned char *hs = overlap ? h + (s - lo) : h;
    unsigned char *hr = overlap ? h + (r - lo) : h + send_bytes;
    int rc = 0;
    if (overlap) { /* the union: the receive side's bytes outside the send are kept */
        rc = g->stager->to_host(g->stager->ctx, stream, h, (const void *)lo, bytes);
    } else if (send_bytes > 0) {
        rc = g->stager->to_host(g->stager->ctx, stream, hs, send, send_bytes);
    }
    if (rc < 0) {
        st->busy = 0;
        return rc;
    }
    st->dev_recv = recv;
    st->stream = stream;
    st->host_recv = hr;
    st->recv_bytes = recv_bytes;
    *hsend = hs;
    *hrecv = hr;
    *out = st;
    return 0;
}

int fsdp_stage_bind(struct fsdp_group *g, struct fsdp_staged *st, int rc, struct fsdp_work *work)
{
    (void)g;
    if (rc < 0) {
        st->busy = 0;
        return rc;
    }
    work->staged = st;
    return 0;
}

int fsdp_stage_end(struct fsdp_work *w)
{
    struct fsdp_staged *st = w->staged;
    if (!st || st->copied) {
        return 0;
    }
    st->copied = 1;
    const struct fsdp_stager *sg = st->pool->st;
    return st->recv_bytes
               ? sg->to_device(sg->ctx, st->stream, st->dev_recv, st->host_recv, st->recv_bytes)
               : 0;
}

void fsdp_stage_release(struct fsdp_work *w)
{
    if (w->staged) {
        w->staged->busy = 0;
        w->staged = NULL;
    }
}

void fsdp_stage_pool_free(struct fsdp_group *g)
{
    struct fsdp_stage_pool *p = g->stage;
    if (!p) {
        return;
    }
    for (int i = 0; i < STAGE_MAX; i++) {
        if (p->slots[i].host) {
            p->st->host_free(p->st->ctx, p->slots[i].host);
        }
    }
    free(p);
    g->stage = NULL;
}
