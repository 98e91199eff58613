/*
 * p2p.c - point-to-point sends and receives on a group (group.h): the
 * messages a pipeline passes between its stages, through the same checks,
 * staging and debug layer as the collectives.
 *
 * The debug layer sees each direction of a pair as a channel of its own
 * ("dp[0]:0>1" in the flight recorder's group table, both ranks members),
 * with messages numbered 1, 2, ... on each side: a send and the receive it
 * meets carry the same number, so `fsdpc-flight merge` and the watchdog name
 * a message that never came as they name a stuck collective.
 *
 * Under FSDPC_DEBUG=DETAIL a send is preceded by a 32-byte description
 * (dtype, count, tag, number) on the same backend, which keeps a pair's
 * messages in order; the receive takes it first and compares it with its
 * own call before it waits for the data, so a stage that sends micro-batch 3
 * where the next expects micro-batch 2 (or another size) fails with both
 * calls named instead of corrupting or hanging. Off DETAIL a message costs
 * what the backend's send and receive cost.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/debug.h"
#include "comm/group.h"
#include "comm/group_impl.h"
#include "comm/stage.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#define P2P_DESC_MAGIC 0x50325044u /* "DP2P" */

/* What a send says of itself under DETAIL; 32 bytes on the wire. */
struct p2p_wire {
    uint32_t magic;
    uint32_t tag;
    uint64_t count;
    uint64_t seq;
    uint8_t dtype;
    uint8_t pad[7];
};

/* One DETAIL description in flight, tied to the data's handle. */
struct fsdp_p2p_desc {
    struct fsdp_work *w; /* the description's own send or receive */
    int recv, peer;      /* a receive's description is checked */
    int checked;
    struct p2p_wire want; /* this rank's call */
    struct p2p_wire got;  /* a receive: what the sender said */
};

/* Per peer: the channels' flight-recorder ids and message numbers. */
struct p2p_peer {
    int send_id, recv_id; /* -2: not yet registered */
    uint64_t sent, received;
};

struct fsdp_p2p {
    int detail;             /* descriptions on: DETAIL and a backend that takes host memory */
    struct p2p_peer *peers; /* (size,) */
};

static struct fsdp_p2p *p2p_state(struct fsdp_group *g)
{
    struct group_impl *gi = group_impl_of(g);
    if (gi->p2p) {
        return gi->p2p;
    }
    struct fsdp_p2p *p = calloc(1, sizeof(*p));
    struct p2p_peer *peers = calloc((size_t)g->size, sizeof(*peers));
    if (!p || !peers) {
        free(p);
        free(peers);
        return NULL;
    }
    for (int i = 0; i < g->size; i++) {
        peers[i].send_id = peers[i].recv_id = -2;
    }
    p->peers = peers;
    p->detail = fsdp_debug_level() == FSDP_DEBUG_DETAIL && (gi->caps.flags & FSDP_CAP_MEM_HOST);
    gi->p2p = p;
    return p;
}

void fsdp_p2p_free(struct fsdp_group *g)
{
    struct group_impl *gi = group_impl_of(g);
    if (gi->p2p) {
        free(gi->p2p->peers);
        free(gi->p2p);
        gi->p2p = NULL;
    }
}

// ----------------------------------------------------------------------------
// checks

static int p2p_bad_args(struct fsdp_group *g, const char *what, const void *buf, size_t count,
                        enum fsdp_dtype dtype, int peer, const struct fsdp_coll_attr *attr,
                        struct fsdp_work **work)
{
    if (!g || !work) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: NULL %s", what, g ? "work handle pointer" : "group");
    }
    const struct fsdp_backend_caps *caps = &group_impl_of(g)->caps;
    if (!(caps->flags & FSDP_CAP_SEND_RECV) || !g->ops->send || !g->ops->recv) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "%s on group %s: backend %s has no point-to-point "
                        "operations",
                        what, g->name, g->ops->name);
    }
    if (peer < 0 || peer >= g->size || peer == g->rank) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "%s on group %s: peer %d is not another member "
                        "(0..%d, this rank %d)",
                        what, g->name, peer, g->size - 1, g->rank);
    }
    if ((unsigned)dtype >= FSDP_DTYPE_COUNT || !(caps->dtypes & (1u << dtype))) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s on group %s: backend %s does not move dtype %d",
                        what, g->name, g->ops->name, (int)dtype);
    }
    uint32_t mem = attr && attr->mem == FSDP_MEM_CUDA ? FSDP_CAP_MEM_CUDA : FSDP_CAP_MEM_HOST;
    if (!(caps->flags & mem)) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s on group %s: backend %s cannot use %s memory",
                        what, g->name, g->ops->name, mem == FSDP_CAP_MEM_CUDA ? "CUDA" : "host");
    }
    if (count > 0 && !buf) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: NULL buffer for %zu elements", what,
                        g->name, count);
    }
    size_t total;
    if (__builtin_mul_overflow(count, fsdp_dtype_size(dtype), &total)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: %zu elements overflow a size_t", what,
                        g->name, count);
    }
    return 0;
}

/* "send(f32, 64, tag 3)" of a description. */
static void p2p_call_str(const struct p2p_wire *d, int recv, char *buf, size_t len)
{
    struct fsdp_debug_call c = {.op = recv ? FSDP_COLL_RECV : FSDP_COLL_SEND,
                                .dtype = d->dtype,
                                .count = (size_t)d->count,
                                .redop = -1,
                                .tag = d->tag};
    fsdp_debug_call_str(&c, buf, len);
}

/* A receive's description against its own call. */
static int p2p_compare(struct fsdp_work *w)
{
    struct fsdp_p2p_desc *d = w->p2p;
    struct fsdp_group *g = w->group;
    d->checked = 1;
    const struct p2p_wire *a = &d->want, *b = &d->got;
    if (b->magic == P2P_DESC_MAGIC && a->dtype == b->dtype && a->count == b->count &&
        a->tag == b->tag && a->seq == b->seq) {
        return 0;
    }
    char mine[96], theirs[96] = "a message that is not a description";
    p2p_call_str(a, 1, mine, sizeof(mine));
    if (b->magic == P2P_DESC_MAGIC) {
        p2p_call_str(b, 0, theirs, sizeof(theirs));
    }
    int rc = fsdp_err(FSDP_ERR_MISMATCH,
                      "message #%" PRIu64 " from rank %d on group %s: this "
                      "rank (%d) called %s, rank %d sent %s as its message #%" PRIu64,
                      a->seq, d->peer, g->name, g->rank, mine, d->peer, theirs, b->seq);
    /* the data behind it may never match: free every rank waiting on g */
    g->ops->abort(g->be, fsdp_err_msg());
    return rc;
}

// ----------------------------------------------------------------------------
// hooks from group.c

int fsdp_p2p_wait(struct fsdp_work *w, double timeout_s, int deadline)
{
    struct fsdp_p2p_desc *d = w->p2p;
    if (!d->recv || d->checked) {
        return 0;
    }
    int rc = d->w->ops->work_wait(d->w, timeout_s);
    if (rc == FSDP_ERR_TIMEOUT && !deadline) {
        return rc; /* the caller's poll */
    }
    FSDP_CHECK(rc);
    return p2p_compare(w);
}

int fsdp_p2p_test(struct fsdp_work *w, int finished)
{
    struct fsdp_p2p_desc *d = w->p2p;
    if (!d->recv || d->checked) {
        return 0;
    }
    int done = 0;
    int rc = d->w->ops->work_test(d->w, &done);
    if (rc == 0 && !done && finished) {
        /* sent ahead of the data: complete by now, or the peer is gone */
        rc = d->w->ops->work_wait(d->w, fsdp_debug_timeout(w->group));
        done = rc == 0;
    }
    FSDP_CHECK(rc);
    return done ? p2p_compare(w) : 0;
}

void fsdp_p2p_release(struct fsdp_work *w)
{
    struct fsdp_p2p_desc *d = w->p2p;
    if (!d) {
        return;
    }
    if (d->w) {
        /* a send's description left the host when its data did */
        if (!d->recv) {
            d->w->ops->work_wait(d->w, 0);
            fsdp_err_clear();
        }
        d->w->ops->work_free(d->w);
    }
    free(d);
    w->p2p = NULL;
}

// ----------------------------------------------------------------------------
// send and receive

/* The DETAIL description ahead of the data (host memory, the backend's own
 * send or receive: not recorded, not staged). */
static int p2p_describe(struct fsdp_group *g, int recv, int peer, const struct p2p_wire *want,
                        struct fsdp_p2p_desc **out)
{
    struct fsdp_p2p_desc *d = calloc(1, sizeof(*d));
    if (!d) {
        return fsdp_err(FSDP_ERR_NOMEM, "group %s: a message's description", g->name);
    }
    d->recv = recv;
    d->peer = peer;
    d->want = *want;
    int rc = recv ? g->ops->recv(g->be, &d->got, sizeof(d->got), FSDP_U8, peer, NULL, &d->w)
                  : g->ops->send(g->be, &d->want, sizeof(d->want), FSDP_U8, peer, NULL, &d->w);
    if (rc < 0) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

static int p2p_issue(struct fsdp_group *g, int recv, void *buf, size_t count, enum fsdp_dtype dtype,
                     int peer, uint32_t tag, const struct fsdp_coll_attr *attr,
                     struct fsdp_work **work)
{
    const char *what = recv ? "recv" : "send";
    FSDP_CHECK(p2p_bad_args(g, what, buf, count, dtype, peer, attr, work));
    struct fsdp_p2p *p = p2p_state(g);
    if (!p) {
        return fsdp_err(FSDP_ERR_NOMEM, "group %s: point-to-point state", g->name);
    }
    struct p2p_peer *pp = &p->peers[peer];
    int *id = recv ? &pp->recv_id : &pp->send_id;
    if (*id == -2) {
        fsdp_debug_channel_add(g, recv ? peer : g->rank, recv ? g->rank : peer, id);
    }
    uint64_t seq = recv ? ++pp->received : ++pp->sent;
    struct p2p_wire want = {
        .magic = P2P_DESC_MAGIC, .tag = tag, .count = count, .seq = seq, .dtype = (uint8_t)dtype};
    struct fsdp_p2p_desc *d = NULL;
    if (p->detail) {
        FSDP_CHECK(p2p_describe(g, recv, peer, &want, &d));
    }
    struct fsdp_debug_call c = {.op = recv ? FSDP_COLL_RECV : FSDP_COLL_SEND,
                                .dtype = (int)dtype,
                                .count = count,
                                .root = 0,
                                .redop = -1,
                                .tag = tag};
    uint64_t fid = fsdp_debug_issued_p2p(g, *id, seq, &c);
    int rc = recv ? g->ops->recv(g->be, buf, count, dtype, peer, attr, work)
                  : g->ops->send(g->be, buf, count, dtype, peer, attr, work);
    if (rc < 0) {
        if (d) {
            struct fsdp_work tmp = {.p2p = d};
            fsdp_p2p_release(&tmp);
        }
        return fsdp_debug_finished(fid, rc, 0);
    }
    struct fsdp_work *w = *work;
    w->group = g;
    w->flight_id = fid;
    w->done = 0;
    w->staged = NULL;
    w->p2p = d;
    fsdp_group_track(g, w);
    return 0;
}

static const struct fsdp_coll_attr p2p_host_attr = {.mem = FSDP_MEM_HOST, .stream = NULL};

/* Staged through host memory when g's backend cannot take attr's: a
 * send's bytes go to the host now, a receive's come back at its wait. */
static int p2p_staged(struct fsdp_group *g, int recv, void *buf, size_t count,
                      enum fsdp_dtype dtype, int peer, uint32_t tag,
                      const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    if (!g || !work || !fsdp_stage_needed(g, attr)) {
        return p2p_issue(g, recv, buf, count, dtype, peer, tag, attr, work);
    }
    const void *hs;
    void *hr;
    struct fsdp_staged *st;
    size_t bytes = count * fsdp_dtype_size(dtype);
    FSDP_CHECK(fsdp_stage_begin(g, attr->stream, recv ? NULL : buf, recv ? 0 : bytes,
                                recv ? buf : NULL, recv ? bytes : 0, &hs, &hr, &st));
    int rc =
        p2p_issue(g, recv, recv ? hr : (void *)hs, count, dtype, peer, tag, &p2p_host_attr, work);
    return fsdp_stage_bind(g, st, rc, rc < 0 ? NULL : *work);
}

int fsdp_send(struct fsdp_group *g, const void *buf, size_t count, enum fsdp_dtype dtype, int peer,
              uint32_t tag, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    return p2p_staged(g, 0, (void *)buf, count, dtype, peer, tag, attr, work);
}

int fsdp_recv(struct fsdp_group *g, void *buf, size_t count, enum fsdp_dtype dtype, int peer,
              uint32_t tag, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    return p2p_staged(g, 1, buf, count, dtype, peer, tag, attr, work);
}
