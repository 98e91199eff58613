/*
 * stage.c - host staging of collectives (stage.h): a pool of host buffers
 * per group, the chunk plan of a staged collective, its copies around the
 * host collectives on the group's copy stream, and the hooks the work
 * handles call when they complete or go.
 *
 * A chunked collective (the default) takes one host buffer laid out so
 * that every chunk's host collective is an ordinary contiguous one: an
 * all-reduce or broadcast as on the device (chunk i at i * chunk); an
 * all-gather's receive side and a reduce-scatter's send side chunk-major
 * (chunk i holds piece i of every rank's block, rank after rank), so chunk
 * i of an all-gather is an all-gather of the chunk's length; the other
 * side contiguous, or inside the chunk-major one when the collective is in
 * place (the host call then is in place too). The schedule:
 *
 *   issue:  copy stream waits for the collective's stream (an event)
 *           copy chunks 0..AHEAD-1 to the host, an event after each
 *           for each chunk i:
 *               wait for chunk i's event; issue its host collective
 *               copy chunk i+AHEAD to the host, an event after it
 *   wait:   for each chunk i: wait for its host collective, then copy its
 *           receive side to the device (enqueued: it runs while the host
 *           waits for chunk i+1); at the end the host waits for the last
 *           copy, so the data is the device's when the wait returns
 *
 * The device's data must be final at issue (the caller orders its writers
 * on the collective's stream before the issue, as for any collective).
 * With a stager that has no streams, each chunk's copies are to_host and
 * to_device on the collective's stream, waited for. Every chunk is a
 * collective of the group's own (numbered, recorded, fingerprinted); the
 * caller's handle is chunk 0's and holds the others. Buffers, handle
 * arrays, the stream and its events are kept per group: a steady state
 * allocates nothing.
 *
 * With chunking off (and for point-to-point) one host buffer holds the
 * send and receive sides laid out as on the device, the union of their
 * byte ranges, copied whole at issue and back at completion.
 */
#include "config.h"
#include "comm/stage.h"
#include "comm/group_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define STAGE_MAX 64                          /* host buffers per group: more than in flight */
#define STAGE_AHEAD 4                         /* chunks copied to the host ahead of their turn */
#define STAGE_MAX_CHUNKS 16384                /* chunks grow so that a collective has no more */
#define STAGE_CHUNK_DEFAULT ((size_t)4 << 20) /* FSDPC_STAGE_CHUNK_BYTES unset */

/* Where a chunked collective's pieces are. */
struct stage_plan {
    struct fsdp_stage_coll c;
    size_t es;      /* element size */
    size_t chunk;   /* elements per chunk (of each rank's block) */
    size_t n;       /* chunks; 0: a whole-buffer operation */
    size_t bytes;   /* host bytes */
    int size, rank; /* the group's */
    int in_place;
    unsigned char *hsend, *hrecv; /* regions of the host buffer (stage_place) */
};

struct fsdp_staged {
    struct fsdp_stage_pool *pool;
    unsigned char *host; /* (cap) the buffer */
    size_t cap;
    void *stream; /* the collective's stream */
    int busy;
    int copied; /* the receive side is on the device */
    /* whole-buffer */
    void *dev_recv; /* where the receive side goes back */
    void *host_recv;
    size_t recv_bytes;
    /* chunked */
    struct stage_plan plan;
    struct fsdp_work **works; /* (works_cap) chunk i's handle; works[0] is the caller's */
    size_t works_cap;
    size_t n_back; /* chunks whose receive side is on its way to the device */
};

/* The group's copy stream and its events, made at its first chunked
 * collective. */
struct stage_copier {
    int state; /* 0: not made yet, 1: ready, -1: none (copies waited for) */
    void *stream;
    void *ev_issue;              /* the collective's stream at issue */
    void *ev_ahead[STAGE_AHEAD]; /* chunk i's send side on the host (slot i % STAGE_AHEAD) */
    void *ev_back;               /* the last copy back done */
};

struct fsdp_stage_pool {
    const struct fsdp_stager *st;
    size_t chunk_bytes; /* 0: whole buffers */
    int chunk_set;      /* fsdp_group_set_stage_chunk's, over the environment's */
    struct stage_copier cp;
    struct fsdp_staged slots[STAGE_MAX];
};

static const struct fsdp_coll_attr stage_host_attr = {.mem = FSDP_MEM_HOST, .stream = NULL};

// ----------------------------------------------------------------------------
// the pool and its settings

static uint32_t stage_cap_of(enum fsdp_mem mem)
{
    return mem == FSDP_MEM_CUDA      ? FSDP_CAP_MEM_CUDA
           : mem == FSDP_MEM_GUARDED ? FSDP_CAP_MEM_GUARDED
                                     : FSDP_CAP_MEM_HOST;
}

/* $FSDPC_STAGE_CHUNK_BYTES, read once per process. */
static int stage_chunk_env(size_t *out)
{
    static int read, bad;
    static size_t bytes;
    static char text[48];
    if (!read) {
        const char *s = getenv("FSDPC_STAGE_CHUNK_BYTES");
        read = 1;
        bytes = STAGE_CHUNK_DEFAULT;
        if (s && *s && fsdp_parse_size(s, &bytes) < 0) {
            fsdp_err_clear();
            snprintf(text, sizeof(text), "%s", s);
            bad = 1;
        }
    }
    if (bad) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "FSDPC_STAGE_CHUNK_BYTES='%s' is not a size: give bytes, with K, M or G "
                        "(4M), or 0 to copy whole buffers",
                        text);
    }
    *out = bytes;
    return 0;
}

static struct fsdp_stage_pool *stage_pool(struct fsdp_group *g)
{
    if (!g->stage) {
        g->stage = calloc(1, sizeof(*g->stage));
    }
    return g->stage;
}

/* Every member must cut a collective alike: their chunk sizes compared
 * (one small host all-reduce; every member gets the same answer). */
static int stage_chunk_agree(struct fsdp_group *g, size_t bytes)
{
    int64_t v[2] = {(int64_t)bytes, -(int64_t)bytes};
    FSDP_CHECK(fsdp_allreduce_sync(g, v, v, 2, FSDP_I64, FSDP_MAX));
    if (v[0] != -v[1]) {
        return fsdp_err(FSDP_ERR_MISMATCH,
                        "group %s: FSDPC_STAGE_CHUNK_BYTES differs across its ranks (from %lld to "
                        "%lld bytes): set the same value on every rank",
                        g->name, (long long)-v[1], (long long)v[0]);
    }
    return 0;
}

int fsdp_group_set_stager(struct fsdp_group *g, const struct fsdp_stager *st)
{
    struct fsdp_backend_caps caps;
    g->ops->capabilities(g->be, &caps);
    if (!st || (caps.flags & stage_cap_of(st->mem))) {
        g->stager = NULL;
        return 0;
    }
    struct fsdp_stage_pool *p = stage_pool(g);
    if (!p) {
        return fsdp_err(FSDP_ERR_NOMEM, "group %s: staging pool", g->name);
    }
    if (!p->chunk_set) {
        FSDP_CHECK(stage_chunk_env(&p->chunk_bytes));
    }
    if (g->size > 1 && !g->stager) {
        FSDP_CHECK(stage_chunk_agree(g, p->chunk_bytes));
    }
    p->st = st;
    g->stager = st;
    return 1;
}

size_t fsdp_group_stage_chunk(const struct fsdp_group *g)
{
    size_t bytes = STAGE_CHUNK_DEFAULT;
    if (g->stage) {
        return g->stage->chunk_bytes;
    }
    if (stage_chunk_env(&bytes) < 0) {
        fsdp_err_clear(); /* set_stager reports it */
    }
    return bytes;
}

void fsdp_group_stage_describe(const struct fsdp_group *g, char *buf, size_t len)
{
    size_t b = fsdp_group_stage_chunk(g);
    if (b == 0) {
        snprintf(buf, len, "whole buffers");
    } else if (b % ((size_t)1 << 20) == 0) {
        snprintf(buf, len, "chunks of %zu MiB", b >> 20);
    } else if (b % 1024 == 0) {
        snprintf(buf, len, "chunks of %zu KiB", b >> 10);
    } else {
        snprintf(buf, len, "chunks of %zu bytes", b);
    }
}

void fsdp_group_set_stage_chunk(struct fsdp_group *g, size_t bytes)
{
    struct fsdp_stage_pool *p = stage_pool(g);
    if (p) {
        p->chunk_bytes = bytes;
        p->chunk_set = 1;
    }
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
    fit->plan.n = 0;
    fit->n_back = 0;
    *out = fit;
    return 0;
}

void fsdp_stage_pool_free(struct fsdp_group *g)
{
    struct fsdp_stage_pool *p = g->stage;
    if (!p) {
        return;
    }
    for (int i = 0; p->st && i < STAGE_MAX; i++) {
        if (p->slots[i].host) {
            p->st->host_free(p->st->ctx, p->slots[i].host);
        }
        free(p->slots[i].works);
    }
    struct stage_copier *cp = &p->cp;
    if (cp->state > 0) {
        for (int i = 0; i < STAGE_AHEAD; i++) {
            p->st->event_destroy(p->st->ctx, cp->ev_ahead[i]);
        }
        p->st->event_destroy(p->st->ctx, cp->ev_issue);
        p->st->event_destroy(p->st->ctx, cp->ev_back);
        p->st->stream_destroy(p->st->ctx, cp->stream);
    }
    free(p);
    g->stage = NULL;
}

/* The copy stream and its events; without them (a stager without streams,
 * or none to be had) chunks are copied on the collective's stream. */
static void stage_copier_init(struct fsdp_group *g, struct stage_copier *cp)
{
    const struct fsdp_stager *sg = g->stager;
    cp->state = -1;
    if (!sg->stream_create) {
        return;
    }
    int rc = sg->stream_create(sg->ctx, &cp->stream);
    if (rc < 0) {
        FSDP_WARN(FSDP_SUB_DIST,
                  "group %s: no copy stream (%s): staged chunks are copied on "
                  "the collective's stream, without overlap",
                  g->name, fsdp_err_msg());
        fsdp_err_clear();
        return;
    }
    int made = 0;
    void **evs[STAGE_AHEAD + 2] = {&cp->ev_issue, &cp->ev_back};
    for (int i = 0; i < STAGE_AHEAD; i++) {
        evs[i + 2] = &cp->ev_ahead[i];
    }
    for (; made < STAGE_AHEAD + 2 && rc == 0; made++) {
        rc = sg->event_create(sg->ctx, evs[made]);
    }
    if (rc < 0) {
        FSDP_WARN(FSDP_SUB_DIST,
                  "group %s: no copy stream events (%s): staged chunks are "
                  "copied on the collective's stream",
                  g->name, fsdp_err_msg());
        fsdp_err_clear();
        for (int i = 0; i < made - 1; i++) {
            sg->event_destroy(sg->ctx, *evs[i]);
        }
        sg->stream_destroy(sg->ctx, cp->stream);
        return;
    }
    cp->state = 1;
}

// ----------------------------------------------------------------------------
// the chunk plan

/* True when [a, a+alen) and [b, b+blen) share a byte. */
static int stage_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

/* c's plan on g, after the checks that the group call makes before a
 * backend sees its buffers (the host collectives check the rest). */
static int stage_plan_make(struct fsdp_group *g, const struct fsdp_stage_coll *c,
                           size_t chunk_bytes, struct stage_plan *p)
{
    const char *what = fsdp_coll_op_name(c->op);
    size_t es = fsdp_dtype_size(c->dtype), total;
    *p = (struct stage_plan){.c = *c, .es = es, .size = g->size, .rank = g->rank};
    if (!es) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: dtype %d is not a dtype", what, g->name,
                        (int)c->dtype);
    }
    if (c->root < 0 || c->root >= g->size) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: root %d outside 0..%d", what, g->name,
                        c->root, g->size - 1);
    }
    if (__builtin_mul_overflow(c->count, es * (size_t)g->size, &total)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: %zu elements of %s overflow a size_t",
                        what, g->name, c->count, fsdp_dtype_name(c->dtype));
    }
    if (c->count > 0 && (!c->send || !c->recv)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: NULL buffer for %zu elements", what,
                        g->name, c->count);
    }
    const unsigned char *s = c->send, *r = c->recv;
    size_t bytes = c->count * es, sb = bytes, rb = bytes;
    if (c->op == FSDP_COLL_ALLGATHER) {
        rb = total;
        p->in_place = s == r + (size_t)g->rank * bytes;
    } else if (c->op == FSDP_COLL_REDUCE_SCATTER) {
        sb = total;
        p->in_place = r == s + (size_t)g->rank * bytes;
    } else {
        p->in_place = s == r;
    }
    if (!p->in_place && stage_overlap(s, sb, r, rb)) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "%s on group %s: the buffers overlap but are not in place (see "
                        "backend.h)",
                        what, g->name);
    }
    size_t want = chunk_bytes / es ? chunk_bytes / es : 1;
    size_t least = (c->count + STAGE_MAX_CHUNKS - 1) / STAGE_MAX_CHUNKS;
    p->chunk = want > least ? want : least;
    p->n = c->count ? (c->count + p->chunk - 1) / p->chunk : 1;
    p->bytes = p->in_place ? (sb > rb ? sb : rb) : sb + rb;
    return 0;
}

/* The plan's regions in host buffer h. */
static void stage_place(struct stage_plan *p, unsigned char *h)
{
    size_t whole = p->c.count * p->es * (size_t)p->size;
    p->hsend = p->hrecv = h;
    if (p->in_place) {
        return;
    }
    if (p->c.op == FSDP_COLL_ALLGATHER) {
        p->hsend = h + whole;
    } else if (p->c.op == FSDP_COLL_REDUCE_SCATTER) {
        p->hrecv = h + whole;
    } else {
        p->hrecv = h + p->c.count * p->es;
    }
}

/* Elements of chunk i (of each rank's block). */
static size_t stage_len(const struct stage_plan *p, size_t i)
{
    size_t left = p->c.count - i * p->chunk;
    return left < p->chunk ? left : p->chunk;
}

/* Chunk i's host collective's send and receive buffers. */
static void stage_host_pair(const struct stage_plan *p, size_t i, unsigned char **hs,
                            unsigned char **hr)
{
    size_t len = stage_len(p, i) * p->es, off = i * p->chunk * p->es;
    size_t major = off * (size_t)p->size; /* chunk i of a chunk-major region */
    if (p->c.op == FSDP_COLL_ALLGATHER) {
        *hr = p->hrecv + major;
        *hs = p->in_place ? *hr + (size_t)p->rank * len : p->hsend + off;
    } else if (p->c.op == FSDP_COLL_REDUCE_SCATTER) {
        *hs = p->hsend + major;
        *hr = p->in_place ? *hs + (size_t)p->rank * len : p->hrecv + off;
    } else {
        *hs = p->hsend + off;
        *hr = p->hrecv + off;
    }
}

/* Issues chunk i's host collective. */
static int stage_host_coll(struct fsdp_group *g, const struct stage_plan *p, size_t i,
                           struct fsdp_work **w)
{
    const struct fsdp_stage_coll *c = &p->c;
    unsigned char *hs, *hr;
    size_t n = stage_len(p, i);
    stage_host_pair(p, i, &hs, &hr);
    switch (c->op) {
    case FSDP_COLL_ALLGATHER:
        return fsdp_allgather(g, hs, hr, n, c->dtype, &stage_host_attr, w);
    case FSDP_COLL_REDUCE_SCATTER:
        return fsdp_reduce_scatter(g, hs, hr, n, c->dtype, (enum fsdp_redop)c->redop,
                                   &stage_host_attr, w);
    case FSDP_COLL_BROADCAST:
        return fsdp_broadcast(g, hr, n, c->dtype, c->root, &stage_host_attr, w);
    default:
        return fsdp_allreduce(g, hs, hr, n, c->dtype, (enum fsdp_redop)c->redop, &stage_host_attr,
                              w);
    }
}

// ----------------------------------------------------------------------------
// the copies of a chunk

/* One copy: on the copy stream (enqueued), else on the collective's
 * stream, waited for. */
static int stage_copy(struct fsdp_staged *st, void *dst, const void *src, size_t bytes, int back)
{
    const struct fsdp_stager *sg = st->pool->st;
    const struct stage_copier *cp = &st->pool->cp;
    if (cp->state > 0) {
        return sg->copy(sg->ctx, cp->stream, dst, src, bytes, back);
    }
    return back ? sg->to_device(sg->ctx, st->stream, dst, src, bytes)
                : sg->to_host(sg->ctx, st->stream, dst, src, bytes);
}

/* Chunk i's send side to the host (back 0) or its receive side to the
 * device (back 1): one piece, or one per rank where the device holds the
 * chunk's pieces a block apart. */
static int stage_move(struct fsdp_staged *st, size_t i, int back)
{
    const struct stage_plan *p = &st->plan;
    const struct fsdp_stage_coll *c = &p->c;
    size_t len = stage_len(p, i) * p->es, off = i * p->chunk * p->es, block = c->count * p->es;
    const unsigned char *ds = c->send;
    unsigned char *dr = c->recv, *hs, *hr;
    if (len == 0 || (!back && c->op == FSDP_COLL_BROADCAST && p->rank != c->root)) {
        return 0; /* a broadcast overwrites the receivers' bytes */
    }
    stage_host_pair(p, i, &hs, &hr);
    int per_rank = back ? c->op == FSDP_COLL_ALLGATHER : c->op == FSDP_COLL_REDUCE_SCATTER;
    if (!per_rank) {
        return back ? stage_copy(st, dr + off, hr, len, 1) : stage_copy(st, hs, ds + off, len, 0);
    }
    for (int r = 0; r < p->size; r++) {
        size_t d = (size_t)r * block + off, h = (size_t)r * len;
        if (back && p->in_place && r == p->rank) {
            continue; /* an in-place all-gather's own piece is already there */
        }
        FSDP_CHECK(back ? stage_copy(st, dr + d, hr + h, len, 1)
                        : stage_copy(st, hs + h, ds + d, len, 0));
    }
    return 0;
}

/* Chunk i's send side on its way to the host, an event after it. */
static int stage_fetch(struct fsdp_staged *st, size_t i)
{
    const struct fsdp_stager *sg = st->pool->st;
    const struct stage_copier *cp = &st->pool->cp;
    FSDP_CHECK(stage_move(st, i, 0));
    return cp->state > 0 ? sg->event_record(sg->ctx, cp->ev_ahead[i % STAGE_AHEAD], cp->stream) : 0;
}

/* Waits for chunk i's send side on the host. */
static int stage_fetched(struct fsdp_staged *st, size_t i)
{
    const struct fsdp_stager *sg = st->pool->st;
    const struct stage_copier *cp = &st->pool->cp;
    return cp->state > 0 ? sg->event_synchronize(sg->ctx, cp->ev_ahead[i % STAGE_AHEAD]) : 0;
}

/* The copies back enqueued so far are done (the host waits for them). */
static int stage_drain(struct fsdp_staged *st)
{
    const struct fsdp_stager *sg = st->pool->st;
    const struct stage_copier *cp = &st->pool->cp;
    if (cp->state <= 0 || st->n_back == 0) {
        return 0;
    }
    FSDP_CHECK(sg->event_record(sg->ctx, cp->ev_back, cp->stream));
    return sg->event_synchronize(sg->ctx, cp->ev_back);
}

// ----------------------------------------------------------------------------
// issue

/*
 * The first `issued` chunks are in flight and chunk `issued` failed with
 * rc: the group is out of step with its peers (they issued that chunk),
 * so it is aborted, as after a timeout, and the chunks in flight go.
 */
static int stage_unwind(struct fsdp_group *g, struct fsdp_staged *st, size_t issued, int rc)
{
    char why[512];
    if (issued == 0) {
        return rc;
    }
    fsdp_err_take(why, sizeof(why));
    g->ops->abort(g->be, why);
    for (size_t i = 0; i < issued; i++) {
        (void)fsdp_work_wait(st->works[i], 0);
        fsdp_work_free(st->works[i]);
        st->works[i] = NULL;
    }
    return fsdp_err(rc, "%s (group %s aborted: a staged %s was issued in part)", why, g->name,
                    fsdp_coll_op_name(st->plan.c.op));
}

/* Every chunk's send side to the host and its host collective issued. */
static int stage_issue(struct fsdp_group *g, struct fsdp_staged *st)
{
    const struct fsdp_stager *sg = st->pool->st;
    const struct stage_copier *cp = &st->pool->cp;
    size_t n = st->plan.n;
    if (cp->state > 0) { /* the copies come after the data's writers */
        FSDP_CHECK(sg->event_record(sg->ctx, cp->ev_issue, st->stream));
        FSDP_CHECK(sg->stream_wait(sg->ctx, cp->stream, cp->ev_issue));
    }
    for (size_t i = 0; i < n && i < STAGE_AHEAD; i++) {
        FSDP_CHECK(stage_fetch(st, i));
    }
    for (size_t i = 0; i < n; i++) {
        /* the chunks before it move while the host waits (no progress thread: mpi) */
        fsdp_group_progress(g);
        int rc = stage_fetched(st, i);
        rc = rc < 0 ? rc : stage_host_coll(g, &st->plan, i, &st->works[i]);
        if (rc < 0) {
            return stage_unwind(g, st, i, rc);
        }
        if (i > 0) { /* progress reaches it through chunk 0 */
            fsdp_group_untrack(st->works[i]);
        }
        rc = i + STAGE_AHEAD < n ? stage_fetch(st, i + STAGE_AHEAD) : 0;
        if (rc < 0) {
            return stage_unwind(g, st, i + 1, rc);
        }
    }
    return 0;
}

/* Room for n chunks' handles (grown only past the most seen). */
static int stage_works_reserve(struct fsdp_staged *st, size_t n)
{
    if (n <= st->works_cap) {
        return 0;
    }
    struct fsdp_work **w = realloc(st->works, n * sizeof(*w));
    if (!w) {
        return fsdp_err(FSDP_ERR_NOMEM, "%zu chunk handles of a staged collective", n);
    }
    st->works = w;
    st->works_cap = n;
    return 0;
}

/* Chunking off: one copy of each side, around the whole host collective. */
static int stage_whole(struct fsdp_group *g, struct stage_plan *p, void *stream,
                       struct fsdp_work **work)
{
    size_t bytes = p->c.count * p->es, all = bytes * (size_t)p->size;
    size_t sb = p->c.op == FSDP_COLL_REDUCE_SCATTER ? all : bytes;
    size_t rb = p->c.op == FSDP_COLL_ALLGATHER ? all : bytes;
    const void *hs;
    void *hr;
    struct fsdp_staged *st;
    FSDP_CHECK(fsdp_stage_begin(g, stream, p->c.send, sb, p->c.recv, rb, &hs, &hr, &st));
    p->hsend = (unsigned char *)hs;
    p->hrecv = hr;
    p->chunk = p->c.count;
    int rc = stage_host_coll(g, p, 0, work);
    return fsdp_stage_bind(g, st, rc, rc < 0 ? NULL : *work);
}

int fsdp_stage_collective(struct fsdp_group *g, const struct fsdp_stage_coll *c, void *stream,
                          struct fsdp_work **work)
{
    struct fsdp_stage_pool *pool = g->stage;
    struct stage_plan plan;
    struct fsdp_staged *st;
    if (!work) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: NULL work handle pointer",
                        fsdp_coll_op_name(c->op), g->name);
    }
    FSDP_CHECK(stage_plan_make(g, c, pool->chunk_bytes, &plan));
    if (pool->chunk_bytes == 0) {
        return stage_whole(g, &plan, stream, work);
    }
    if (pool->cp.state == 0) {
        stage_copier_init(g, &pool->cp);
    }
    FSDP_CHECK(stage_take(g, plan.bytes, &st));
    int rc = stage_works_reserve(st, plan.n);
    if (rc == 0) {
        stage_place(&plan, st->host);
        st->plan = plan;
        st->stream = stream;
        rc = stage_issue(g, st);
    }
    if (rc < 0) {
        st->plan.n = 0;
        st->busy = 0;
        return rc;
    }
    *work = st->works[0];
    (*work)->staged = st;
    return 0;
}

// ----------------------------------------------------------------------------
// whole-buffer operations

int fsdp_stage_begin(struct fsdp_group *g, void *stream, const void *send, size_t send_bytes,
                     void *recv, size_t recv_bytes, const void **hsend, void **hrecv,
                     struct fsdp_staged **out)
{
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    int overlap = stage_overlap(send, send_bytes, recv, recv_bytes);
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

// ----------------------------------------------------------------------------
// completion: the work handle's hooks

/*
 * The chunks from st->n_back on go back to the device in order, each once
 * its host collective is complete: waited for up to timeout_s (block), or
 * tested (*done = 0 at the first still in flight). After the last the
 * host waits for the copies.
 */
static int stage_back(struct fsdp_staged *st, int block, double timeout_s, int deadline, int *done)
{
    double t0 = block ? fsdp_now() : 0;
    *done = 0;
    for (; st->n_back < st->plan.n; st->n_back++) {
        size_t i = st->n_back;
        if (i > 0 && block) {
            double left = timeout_s - (fsdp_now() - t0);
            FSDP_CHECK(fsdp_group_wait_one(st->works[i], left > 0 ? left : 0, deadline));
        } else if (i > 0) {
            int fin = 0;
            FSDP_CHECK(fsdp_work_test(st->works[i], &fin));
            if (!fin) {
                return 0;
            }
        }
        FSDP_CHECK(stage_move(st, i, 1));
    }
    FSDP_CHECK(stage_drain(st));
    st->copied = 1;
    *done = 1;
    return 0;
}

/* The whole-buffer receive side back. */
static int stage_back_whole(struct fsdp_staged *st)
{
    const struct fsdp_stager *sg = st->pool->st;
    st->copied = 1;
    return st->recv_bytes
               ? sg->to_device(sg->ctx, st->stream, st->dev_recv, st->host_recv, st->recv_bytes)
               : 0;
}

int fsdp_stage_end(struct fsdp_work *w, double timeout_s, int deadline)
{
    struct fsdp_staged *st = w->staged;
    int done;
    if (!st || st->copied) {
        return 0;
    }
    return st->plan.n ? stage_back(st, 1, timeout_s, deadline, &done) : stage_back_whole(st);
}

int fsdp_stage_test(struct fsdp_work *w, int *done)
{
    struct fsdp_staged *st = w->staged;
    if (!st || st->copied) {
        return 0;
    }
    if (!st->plan.n) {
        return stage_back_whole(st);
    }
    return stage_back(st, 0, 0, 0, done);
}

void fsdp_stage_progress(struct fsdp_work *w)
{
    struct fsdp_staged *st = w->staged;
    for (size_t i = st->n_back > 1 ? st->n_back : 1; i < st->plan.n; i++) {
        struct fsdp_work *c = st->works[i];
        int fin = 0;
        if (!c->done && c->ops->work_test(c, &fin) < 0) {
            fsdp_err_clear(); /* the wait reports it */
            fin = 1;
        }
        c->done |= fin;
        if (!c->done) {
            return;
        }
    }
}

int fsdp_stage_done(struct fsdp_work *w)
{
    struct fsdp_staged *st = w->staged;
    for (size_t i = st->n_back > 1 ? st->n_back : 1; i < st->plan.n; i++) {
        if (!fsdp_work_done(st->works[i])) {
            return 0;
        }
    }
    return 1;
}

void fsdp_stage_release(struct fsdp_work *w)
{
    struct fsdp_staged *st = w->staged;
    if (!st) {
        return;
    }
    w->staged = NULL;
    for (size_t i = 1; i < st->plan.n; i++) {
        fsdp_work_free(st->works[i]);
        st->works[i] = NULL;
    }
    if (st->plan.n && !st->copied && stage_drain(st) < 0) {
        fsdp_err_clear(); /* freed without its wait: the copies back may not read a reused buffer */
    }
    st->plan.n = 0;
    st->busy = 0;
}
