/*
 * group.c - process groups and the collective calls the upper layers use.
 *
 * A group owns one backend instance, a store view prefixed "g<k>/<name>"
 * (k counts the groups this process has created; every rank creates its
 * groups in the same order, so k agrees across the members) and a
 * registration with the job abort, so that aborting the job fails every
 * pending operation at once.
 *
 * The collective calls validate what the backends rely on (dtype, op, root,
 * buffers, sizes, capabilities), number the operation (seq) and forward. They
 * are deliberately thin: a few compares on the hot path, the error text built
 * only on failure. This is where the debug layer (debug.h: fingerprints,
 * flight recorder, deadlines) hooks in. Handles carry their group, so
 * fsdp_work_wait can apply the group's deadline.
 */
#include "config.h"
#include "comm/group.h"
#include "comm/group_impl.h"
#include "comm/stage.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "comm/debug.h"
#include "rendezvous/dist.h"
#include "rendezvous/store.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Groups created by this process so far (the k in the store prefix). */
static unsigned group_created;

static void group_on_abort(void *arg, const char *why)
{
    struct fsdp_group *g = arg;
    if (g->be && g->ops->abort) {
        g->ops->abort(g->be, why);
    }
}

// ----------------------------------------------------------------------------
// create / destroy

static int group_check_ops(const struct fsdp_backend_ops *ops, const char *name)
{
    if (!ops) {
        return fsdp_err(FSDP_ERR_INVALID, "group %s: no backend given", name);
    }
    if (ops->size < offsetof(struct fsdp_backend_ops, work_free) + sizeof(ops->work_free) ||
        !ops->create || !ops->destroy || !ops->abort || !ops->capabilities || !ops->allreduce ||
        !ops->allgather || !ops->reduce_scatter || !ops->broadcast || !ops->barrier ||
        !ops->work_wait || !ops->work_test || !ops->work_free) {
        return fsdp_err(FSDP_ERR_INTERNAL, "group %s: backend %s lacks a required operation",
                        name, ops->name ? ops->name : "?");
    }
    return 0;
}

/* The caller's index in world_ranks, after checking the list. */
static int group_check_ranks(const struct fsdp_dist *d, const char *name, const int *world_ranks,
                             int size, int *rank)
{
    if (size < 1 || size > d->world_size || !world_ranks) {
        return fsdp_err(FSDP_ERR_INVALID, "group %s: size %d outside 1..%d (the world size)", name,
                        size, d->world_size);
    }
    *rank = -1;
    for (int i = 0; i < size; i++) {
        int r = world_ranks[i];
        if (r < 0 || r >= d->world_size) {
            return fsdp_err(FSDP_ERR_INVALID, "group %s: member %d is world rank %d, outside 0..%d",
                            name, i, r, d->world_size - 1);
        }
        if (i > 0 && r <= world_ranks[i - 1]) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "group %s: world ranks must ascend, but member %d is %d after %d", name,
                            i, r, world_ranks[i - 1]);
        }
        if (r == d->rank) {
            *rank = i;
        }
    }
    if (*rank < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "group %s: rank %d creates it but is not a member", name,
                        d->rank);
    }
    return 0;
}

int fsdp_group_create(struct fsdp_dist *d, const char *name, const int *world_ranks, int size,
                      const struct fsdp_backend_ops *ops, struct fsdp_group **out)
{
    int rc, rank = -1;
    if (!d || !name || !out) {
        return fsdp_err(FSDP_ERR_INVALID, "fsdp_group_create: NULL argument");
    }
    if (!name[0] || strlen(name) >= sizeof(((struct fsdp_group *)0)->name)) {
        return fsdp_err(FSDP_ERR_INVALID, "group name '%s' is empty or longer than %zu characters",
                        name, sizeof(((struct fsdp_group *)0)->name) - 1);
    }
    FSDP_CHECK(group_check_ops(ops, name));
    FSDP_CHECK(group_check_ranks(d, name, world_ranks, size, &rank));

    struct group_impl *gi = calloc(1, sizeof(*gi));
    if (!gi) {
        return fsdp_err(FSDP_ERR_NOMEM, "group %s: out of memory", name);
    }
    struct fsdp_group *g = &gi->g;
    snprintf(g->name, sizeof(g->name), "%s", name);
    g->rank = rank;
    g->size = size;
    g->ops = ops;
    g->dist = d;
    g->timeout_s = d->timeout_s;
    g->world_ranks = malloc((size_t)size * sizeof(int));
    if (!g->world_ranks) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "group %s: out of memory", name);
        goto err_free;
    }
    memcpy(g->world_ranks, world_ranks, (size_t)size * sizeof(int));

    unsigned k = group_created++;
    if (d->store) {
        char prefix[96];
        snprintf(prefix, sizeof(prefix), "g%u/%s", k, name);
        FSDP_CHECK_GOTO(fsdp_store_prefix(d->store, prefix, &g->store), rc, err_ranks);
    }

    gi->info = (struct fsdp_group_info){
        .name = g->name,
        .rank = rank,
        .size = size,
        .world_ranks = g->world_ranks,
        .world_rank = d->rank,
        .world_size = d->world_size,
        .nonce = d->nonce,
        .auth_key = &d->job_key,
        .timeout_s = d->timeout_s,
        .store = g->store,
        .local_rank = d->local_rank,
        .local_addr = d->addr.ip[0] ? d->addr.ip : NULL,
    };
    FSDP_CHECK_GOTO(ops->create(&gi->info, &g->be), rc, err_store);
    ops->capabilities(g->be, &gi->caps);
    FSDP_CHECK_GOTO(fsdp_dist_on_abort(d, group_on_abort, g), rc, err_backend);
    gi->abort_registered = 1;
    FSDP_CHECK_GOTO(fsdp_debug_group_add(g, &gi->debug_id), rc, err_abort);
    if (fsdp_debug_level() == FSDP_DEBUG_DETAIL && size > 1) {
        FSDP_CHECK_GOTO(fsdp_fingerprint_create(g, &gi->fp), rc, err_abort);
    }
    FSDP_DEBUG(FSDP_SUB_DIST, "group %s: rank %d of %d, backend %s", g->name, rank, size,
               ops->name);
    *out = g;
    return 0;

err_abort:
    fsdp_dist_off_abort(d, g);
err_backend:
    ops->destroy(g->be);
err_store:
    if (g->store) {
        fsdp_store_destroy(g->store);
    }
err_ranks:
    free(g->world_ranks);
err_free:
    free(gi);
    return rc;
}

void fsdp_group_destroy(struct fsdp_group *g)
{
    if (!g) {
        return;
    }
    struct group_impl *gi = group_impl_of(g);
    fsdp_p2p_free(g);
    fsdp_fingerprint_destroy(gi->fp);
    fsdp_stage_pool_free(g);
    if (gi->abort_registered) {
        fsdp_dist_off_abort(g->dist, g);
    }
    if (g->be) {
        g->ops->destroy(g->be);
    }
    if (g->store) {
        fsdp_store_destroy(g->store);
    }
    free(g->world_ranks);
    free(gi);
}

// ----------------------------------------------------------------------------
// argument checks: a cheap test on the hot path, the message only on failure

enum group_coll {
    COLL_ALLREDUCE,
    COLL_ALLGATHER,
    COLL_REDUCE_SCATTER,
    COLL_BROADCAST,
};

static const char *const group_coll_names[] = {"allreduce", "allgather", "reduce_scatter",
                                               "broadcast"};

/* Describes and returns the first problem with a collective's arguments. */
static __attribute__((noinline, cold)) int
group_bad_args(struct fsdp_group *g, enum group_coll coll, const void *sendbuf, const void *recvbuf,
               size_t count, enum fsdp_dtype dtype, int op, int root,
               const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    const char *what = group_coll_names[coll];
    if (!g) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: NULL group", what);
    }
    const struct fsdp_backend_caps *caps = &group_impl_of(g)->caps;
    const char *be = g->ops->name;
    if (!work) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: NULL work handle pointer", what,
                        g->name);
    }
    if ((unsigned)dtype >= FSDP_DTYPE_COUNT) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: dtype %d is not a dtype", what, g->name,
                        (int)dtype);
    }
    if (!(caps->dtypes & (1u << dtype))) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s on group %s: backend %s does not support %s",
                        what, g->name, be, fsdp_dtype_name(dtype));
    }
    if (op >= 0 && op >= FSDP_REDOP_COUNT) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: reduce op %d is not an op", what,
                        g->name, op);
    }
    if (op >= 0 && !(caps->redops & (1u << op))) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s on group %s: backend %s does not support %s",
                        what, g->name, be, fsdp_redop_name((enum fsdp_redop)op));
    }
    if (root < 0 || root >= g->size) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: root %d outside 0..%d", what, g->name,
                        root, g->size - 1);
    }
    if (attr && attr->mem != FSDP_MEM_HOST && attr->mem != FSDP_MEM_CUDA) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: memory space %d is not one", what,
                        g->name, (int)attr->mem);
    }
    if (attr && attr->mem == FSDP_MEM_CUDA && !(caps->flags & FSDP_CAP_MEM_CUDA)) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s on group %s: backend %s cannot use CUDA memory",
                        what, g->name, be);
    }
    if ((!attr || attr->mem == FSDP_MEM_HOST) && !(caps->flags & FSDP_CAP_MEM_HOST)) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s on group %s: backend %s cannot use host memory",
                        what, g->name, be);
    }
    size_t total;
    if (__builtin_mul_overflow(count, fsdp_dtype_size(dtype) * (size_t)g->size, &total)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: %zu elements of %s overflow a size_t",
                        what, g->name, count, fsdp_dtype_name(dtype));
    }
    if (count > 0 && (!sendbuf || !recvbuf)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s on group %s: NULL buffer for %zu elements", what,
                        g->name, count);
    }
    return fsdp_err(FSDP_ERR_INVALID,
                    "%s on group %s: the buffers overlap but are not in place (see backend.h)",
                    what, g->name);
}

/* True when [a, a+alen) and [b, b+blen) share a byte. */
static inline int group_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

/*
 * The common checks; sendbuf/recvbuf with their byte lengths, and in_place
 * telling whether their alignment is the collective's in-place one (any other
 * overlap is an error). es is the element size (0: not a dtype), op < 0 for
 * collectives without one. No divisions: this runs on every collective.
 */
static inline int group_args_ok(const struct fsdp_group *g, const void *sendbuf, size_t send_bytes,
                                const void *recvbuf, size_t recv_bytes, int in_place,
                                size_t count, size_t es, enum fsdp_dtype dtype, int op, int root,
                                const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    if (!g || !work || !es || root < 0 || root >= g->size) {
        return 0;
    }
    const struct fsdp_backend_caps *caps = &((const struct group_impl *)(const void *)g)->caps;
    uint32_t mem_cap = attr && attr->mem == FSDP_MEM_CUDA ? FSDP_CAP_MEM_CUDA
                       : !attr || attr->mem == FSDP_MEM_HOST ? FSDP_CAP_MEM_HOST
                                                             : 0;
    if (!(caps->dtypes & (1u << dtype)) || !(caps->flags & mem_cap)) {
        return 0;
    }
    if (op >= 0 && (op >= FSDP_REDOP_COUNT || !(caps->redops & (1u << op)))) {
        return 0;
    }
    size_t total;
    if (__builtin_mul_overflow(count, es * (size_t)g->size, &total)) {
        return 0;
    }
    if (count > 0 && (!sendbuf || !recvbuf)) {
        return 0;
    }
    return in_place || !group_overlap(sendbuf, send_bytes, recvbuf, recv_bytes);
}

/*
 * The debug layer's share of a collective: number it, record it in the
 * flight recorder, issue its fingerprint exchange (DETAIL); after the
 * backend call, tie the record and the fingerprint to the handle. With the
 * recorder on (the default) that is a clock read and an uncontended lock;
 * DETAIL adds a 32-byte allgather queued ahead of the collective, checked
 * when the collective is waited on (fingerprint.c).
 */
static inline int group_enter(struct fsdp_group *g, enum fsdp_coll_op op, enum fsdp_dtype dtype,
                              size_t count, int root, int redop, uint64_t *fid)
{
    struct fsdp_debug_call c = {
        .op = op, .dtype = (int)dtype, .count = count, .root = root, .redop = redop};
    struct group_impl *gi = group_impl_of(g);
    g->seq++;
    *fid = fsdp_debug_issued(g, gi->debug_id, &c);
    if (__builtin_expect(gi->fp != NULL, 0)) {
        int rc = fsdp_fingerprint_issue(gi->fp, &c);
        if (rc < 0) {
            fsdp_debug_refused(*fid);
            FSDP_CHECK(rc);
        }
    }
    return 0;
}

void fsdp_group_track(struct fsdp_group *g, struct fsdp_work *w)
{
    struct group_impl *gi = group_impl_of(g);
    if (gi->n_inflight < GROUP_MAX_INFLIGHT) {
        gi->inflight[gi->n_inflight++] = w;
    }
}

/* rc is the backend's answer to the issue. */
static inline int group_issued(struct fsdp_group *g, int rc, uint64_t fid, struct fsdp_work *w)
{
    if (rc < 0) {
        struct fsdp_fingerprint *fp = group_impl_of(g)->fp;
        int why = fp ? fsdp_fingerprint_refused(fp, rc) : rc;
        if (why != rc) {
            fsdp_debug_refused(fid);
            return why;
        }
        return fsdp_debug_finished(fid, rc, 0);
    }
    w->group = g;
    w->flight_id = fid;
    w->done = 0;
    w->staged = NULL; /* a staged collective's caller binds it after this */
    w->p2p = NULL;
    fsdp_group_track(g, w);
    if (__builtin_expect(group_impl_of(g)->fp != NULL, 0)) {
        fsdp_fingerprint_bind(group_impl_of(g)->fp, w);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// collectives

int fsdp_allreduce(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                   enum fsdp_dtype dtype, enum fsdp_redop op, const struct fsdp_coll_attr *attr,
                   struct fsdp_work **work)
{
    size_t es = fsdp_dtype_size(dtype), bytes = count * es;
    if (__builtin_expect(fsdp_stage_needed(g, attr), 0)) {
        struct fsdp_stage_coll c = {
            FSDP_COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, (int)op, 0};
        return fsdp_stage_collective(g, &c, attr->stream, work);
    }
    if (__builtin_expect(!group_args_ok(g, sendbuf, bytes, recvbuf, bytes, sendbuf == recvbuf,
                                        count, es, dtype, (int)op, 0, attr, work),
                         0)) {
        return group_bad_args(g, COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, (int)op, 0, attr,
                              work);
    }
    uint64_t fid;
    FSDP_CHECK(group_enter(g, FSDP_COLL_ALLREDUCE, dtype, count, 0, (int)op, &fid));
    int rc = g->ops->allreduce(g->be, sendbuf, recvbuf, count, dtype, op, attr, work);
    FSDP_CHECK(group_issued(g, rc, fid, *work));
    return 0;
}

int fsdp_allgather(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                   enum fsdp_dtype dtype, const struct fsdp_coll_attr *attr,
                   struct fsdp_work **work)
{
    size_t es = fsdp_dtype_size(dtype), bytes = count * es;
    if (__builtin_expect(fsdp_stage_needed(g, attr), 0)) {
        struct fsdp_stage_coll c = {FSDP_COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, -1, 0};
        return fsdp_stage_collective(g, &c, attr->stream, work);
    }
    int in_place = g && (const char *)sendbuf == (const char *)recvbuf + (size_t)g->rank * bytes;
    if (__builtin_expect(!group_args_ok(g, sendbuf, bytes, recvbuf, g ? bytes * (size_t)g->size : 0,
                                        in_place, count, es, dtype, -1, 0, attr, work),
                         0)) {
        return group_bad_args(g, COLL_ALLGATHER, sendbuf, recvbuf, count, dtype, -1, 0, attr,
                              work);
    }
    uint64_t fid;
    FSDP_CHECK(group_enter(g, FSDP_COLL_ALLGATHER, dtype, count, 0, -1, &fid));
    int rc = g->ops->allgather(g->be, sendbuf, recvbuf, count, dtype, attr, work);
    FSDP_CHECK(group_issued(g, rc, fid, *work));
    return 0;
}

int fsdp_reduce_scatter(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                        enum fsdp_dtype dtype, enum fsdp_redop op,
                        const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    size_t es = fsdp_dtype_size(dtype), bytes = count * es;
    if (__builtin_expect(fsdp_stage_needed(g, attr), 0)) {
        struct fsdp_stage_coll c = {
            FSDP_COLL_REDUCE_SCATTER, sendbuf, recvbuf, count, dtype, (int)op, 0};
        return fsdp_stage_collective(g, &c, attr->stream, work);
    }
    int in_place = g && (const char *)recvbuf == (const char *)sendbuf + (size_t)g->rank * bytes;
    if (__builtin_expect(!group_args_ok(g, sendbuf, g ? bytes * (size_t)g->size : 0, recvbuf, bytes,
                                        in_place, count, es, dtype, (int)op, 0, attr, work),
                         0)) {
        return group_bad_args(g, COLL_REDUCE_SCATTER, sendbuf, recvbuf, count, dtype, (int)op, 0,
                              attr, work);
    }
    uint64_t fid;
    FSDP_CHECK(group_enter(g, FSDP_COLL_REDUCE_SCATTER, dtype, count, 0, (int)op, &fid));
    int rc = g->ops->reduce_scatter(g->be, sendbuf, recvbuf, count, dtype, op, attr, work);
    FSDP_CHECK(group_issued(g, rc, fid, *work));
    return 0;
}

int fsdp_broadcast(struct fsdp_group *g, void *buf, size_t count, enum fsdp_dtype dtype, int root,
                   const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    if (__builtin_expect(fsdp_stage_needed(g, attr), 0)) {
        struct fsdp_stage_coll c = {FSDP_COLL_BROADCAST, buf, buf, count, dtype, -1, root};
        return fsdp_stage_collective(g, &c, attr->stream, work);
    }
    if (__builtin_expect(!group_args_ok(g, buf, 0, buf, 0, 1, count, fsdp_dtype_size(dtype), dtype,
                                        -1, root, attr, work),
                         0)) {
        return group_bad_args(g, COLL_BROADCAST, buf, buf, count, dtype, -1, root, attr, work);
    }
    uint64_t fid;
    FSDP_CHECK(group_enter(g, FSDP_COLL_BROADCAST, dtype, count, root, -1, &fid));
    int rc = g->ops->broadcast(g->be, buf, count, dtype, root, attr, work);
    FSDP_CHECK(group_issued(g, rc, fid, *work));
    return 0;
}

int fsdp_barrier(struct fsdp_group *g, struct fsdp_work **work)
{
    if (!g || !work) {
        return fsdp_err(FSDP_ERR_INVALID, "barrier: NULL %s", g ? "work handle pointer" : "group");
    }
    uint64_t fid;
    FSDP_CHECK(group_enter(g, FSDP_COLL_BARRIER, FSDP_U8, 0, 0, -1, &fid));
    int rc = g->ops->barrier(g->be, work);
    FSDP_CHECK(group_issued(g, rc, fid, *work));
    return 0;
}

// ----------------------------------------------------------------------------
// work handles

static inline struct fsdp_fingerprint *group_fp(const struct fsdp_work *w)
{
    return w->group ? group_impl_of(w->group)->fp : NULL;
}

/* Ends w's flight record with rc; named: the DETAIL check already wrote a
 * message that names the collective. */
static int group_finished(struct fsdp_work *w, int rc, int named, double waited_s)
{
    if (w->flight_id) {
        if (named) {
            fsdp_debug_refused(w->flight_id);
        } else {
            rc = fsdp_debug_finished(w->flight_id, rc, waited_s);
        }
        w->flight_id = 0;
    }
    return rc;
}

/*
 * Waits up to timeout_s (deadline: that is the group's deadline). Under
 * DETAIL the fingerprints up to w's collective are checked first, so that a
 * mismatched collective never returns success, and one that hangs because
 * of the mismatch still ends with it named: its exchange, issued before it
 * on the same backend, has completed.
 */
static int group_wait(struct fsdp_work *w, double timeout_s, int deadline)
{
    struct fsdp_fingerprint *fp = group_fp(w);
    double t0 = w->flight_id || fp ? fsdp_now() : 0;
    int rc = 0, named = 0;
    if (__builtin_expect(fp != NULL, 0)) {
        rc = fsdp_fingerprint_wait(fp, w, timeout_s, deadline);
        named = rc < 0;
        timeout_s -= fsdp_now() - t0;
        timeout_s = timeout_s > 0 ? timeout_s : 0;
    }
    if (rc == 0 && __builtin_expect(w->p2p != NULL, 0)) {
        rc = fsdp_p2p_wait(w, timeout_s, deadline);
        named = rc < 0 && rc != FSDP_ERR_TIMEOUT;
    }
    if (rc == 0) {
        rc = w->ops->work_wait(w, timeout_s);
        if (fp && (rc == FSDP_ERR_PEER || rc == FSDP_ERR_ABORTED)) {
            int why = fsdp_fingerprint_explain(fp, rc);
            named = why != rc;
            rc = why;
        }
    }
    /* a timeout shorter than the deadline is the caller's poll, not a failure */
    if (rc == FSDP_ERR_TIMEOUT && !deadline) {
        return rc;
    }
    /* the time waited only names a failure */
    return group_finished(w, rc, named, rc < 0 ? fsdp_now() - t0 : 0);
}

int fsdp_group_wait_one(struct fsdp_work *w, double timeout_s, int deadline)
{
    return group_wait(w, timeout_s, deadline);
}

int fsdp_work_wait(struct fsdp_work *w, double timeout_s)
{
    int deadline = 0;
    if (!w) {
        return fsdp_err(FSDP_ERR_INVALID, "fsdp_work_wait: NULL work handle");
    }
    if (timeout_s < 0) {
        if (!w->group) {
            return fsdp_err(FSDP_ERR_INVALID, "fsdp_work_wait: a negative timeout means the "
                                              "group's, but this handle has no group");
        }
        timeout_s = fsdp_debug_timeout(w->group);
        deadline = 1;
    }
    double t0 = w->staged ? fsdp_now() : 0;
    FSDP_CHECK(group_wait(w, timeout_s, deadline));
    if (w->staged) { /* its other chunks in what is left of the time */
        FSDP_CHECK(fsdp_stage_end(w, timeout_s - (fsdp_now() - t0), deadline));
    }
    return 0;
}

int fsdp_work_test(struct fsdp_work *w, int *done)
{
    if (!w || !done) {
        return fsdp_err(FSDP_ERR_INVALID, "fsdp_work_test: NULL argument");
    }
    int rc = w->ops->work_test(w, done);
    int named = 0;
    struct fsdp_fingerprint *fp = group_fp(w);
    if (__builtin_expect(fp != NULL, 0)) {
        /* the backend's message gives way to a mismatch found now */
        char why[1024];
        if (rc < 0) {
            fsdp_err_take(why, sizeof(why));
        }
        int frc = fsdp_fingerprint_test(fp, w, rc < 0 || *done);
        if (frc < 0) {
            rc = frc;
            named = 1;
        } else if (rc < 0) {
            fsdp_err(rc, "%s", why);
        }
        if (!named && (rc == FSDP_ERR_PEER || rc == FSDP_ERR_ABORTED)) {
            frc = fsdp_fingerprint_explain(fp, rc);
            named = frc != rc;
            rc = frc;
        }
    }
    if (!named && __builtin_expect(w->p2p != NULL, 0)) {
        int prc = fsdp_p2p_test(w, rc < 0 || *done);
        if (prc < 0) {
            rc = prc;
            named = 1;
        }
    }
    if (rc < 0 || *done) {
        rc = group_finished(w, rc, named, 0);
    }
    FSDP_CHECK(rc);
    if (*done) { /* a staged collective is done once its last chunk is back */
        FSDP_CHECK(fsdp_stage_test(w, done));
    }
    return 0;
}

/* w leaves its group's in-flight list (freed, or about to be). */
void fsdp_group_untrack(struct fsdp_work *w)
{
    if (!w->group) {
        return;
    }
    struct group_impl *gi = group_impl_of(w->group);
    for (int i = 0; i < gi->n_inflight; i++) {
        if (gi->inflight[i] == w) {
            gi->inflight[i] = gi->inflight[--gi->n_inflight];
            return;
        }
    }
}

void fsdp_group_progress(struct fsdp_group *g)
{
    struct group_impl *gi = g ? group_impl_of(g) : NULL;
    if (!gi || (gi->caps.flags & FSDP_CAP_ASYNC_PROGRESS)) {
        return;
    }
    for (int i = 0; i < gi->n_inflight; i++) {
        struct fsdp_work *w = gi->inflight[i];
        int fin = 0;
        if (!w->done && w->ops->work_test(w, &fin) < 0) {
            fsdp_err_clear(); /* the wait reports it */
            fin = 1;
        }
        w->done |= fin;
        if (w->staged) { /* its other chunks */
            fsdp_stage_progress(w);
        }
    }
}

static int group_work_done(struct fsdp_work *w)
{
    if (!w || w->done) {
        return 1;
    }
    const struct group_impl *gi = w->group ? group_impl_of(w->group) : NULL;
    if (gi && !(gi->caps.flags & FSDP_CAP_ASYNC_PROGRESS)) {
        return 0; /* only fsdp_group_progress moves it */
    }
    int fin = 0;
    if (w->ops->work_test(w, &fin) < 0) {
        fsdp_err_clear(); /* the wait reports it */
        fin = 1;
    }
    w->done = fin;
    return fin;
}

int fsdp_work_done(struct fsdp_work *w)
{
    int fin = group_work_done(w);
    return fin && w && w->staged ? fsdp_stage_done(w) : fin;
}

void fsdp_work_free(struct fsdp_work *w)
{
    if (w) {
        fsdp_stage_release(w);
        fsdp_p2p_release(w);
        fsdp_group_untrack(w);
        fsdp_debug_abandoned(w->flight_id);
        struct fsdp_fingerprint *fp = group_fp(w);
        if (fp) {
            fsdp_fingerprint_release(fp, w);
        }
        w->ops->work_free(w);
    }
}

/*
 * Waits with the group deadline and frees. A collective that times out
 * leaves the group out of step with its peers, so the group is aborted: its
 * pending operations fail and later ones fail at once with the reason.
 */
static int group_finish(struct fsdp_group *g, struct fsdp_work *w)
{
    double t0 = fsdp_now(), timeout_s = fsdp_debug_timeout(g);
    int rc = group_wait(w, timeout_s, 1);
    if (rc == 0) {
        rc = fsdp_stage_end(w, timeout_s - (fsdp_now() - t0), 1);
    }
    if (rc == FSDP_ERR_TIMEOUT) {
        g->ops->abort(g->be, fsdp_err_msg());
    }
    fsdp_work_free(w);
    FSDP_CHECK(rc);
    return 0;
}

int fsdp_allreduce_sync(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                        enum fsdp_dtype dtype, enum fsdp_redop op)
{
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_allreduce(g, sendbuf, recvbuf, count, dtype, op, NULL, &w));
    return group_finish(g, w);
}

int fsdp_allgather_sync(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                        enum fsdp_dtype dtype)
{
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_allgather(g, sendbuf, recvbuf, count, dtype, NULL, &w));
    return group_finish(g, w);
}

int fsdp_reduce_scatter_sync(struct fsdp_group *g, const void *sendbuf, void *recvbuf,
                             size_t count, enum fsdp_dtype dtype, enum fsdp_redop op)
{
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_reduce_scatter(g, sendbuf, recvbuf, count, dtype, op, NULL, &w));
    return group_finish(g, w);
}

int fsdp_broadcast_sync(struct fsdp_group *g, void *buf, size_t count, enum fsdp_dtype dtype,
                        int root)
{
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_broadcast(g, buf, count, dtype, root, NULL, &w));
    return group_finish(g, w);
}

int fsdp_barrier_sync(struct fsdp_group *g)
{
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_barrier(g, &w));
    return group_finish(g, w);
}

int fsdp_send_sync(struct fsdp_group *g, const void *buf, size_t count, enum fsdp_dtype dtype,
                   int peer, uint32_t tag)
{
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_send(g, buf, count, dtype, peer, tag, NULL, &w));
    return group_finish(g, w);
}

int fsdp_recv_sync(struct fsdp_group *g, void *buf, size_t count, enum fsdp_dtype dtype, int peer,
                   uint32_t tag)
{
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_recv(g, buf, count, dtype, peer, tag, NULL, &w));
    return group_finish(g, w);
}
