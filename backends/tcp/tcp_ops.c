/*
 * tcp_ops.c - the tcp backend's vtable: create/destroy/abort, capabilities,
 * argument checks, issuing ops to the progress engine, and work handles.
 *
 * Issue functions only validate and queue (a group of one runs at once on
 * the caller's thread: there is nobody to wait for). Work handles are plain
 * heap objects that never point back into the instance once complete, so
 * freeing one after destroy() is safe.
 */
#include "config.h"
#include "backends/tcp/tcp.h"
#include "rendezvous/netaddr.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TCP_DEFAULT_TIMEOUT_S 300.0

// ----------------------------------------------------------------------------
// create / destroy / abort

static uint64_t tcp_group_hash(const struct fsdp_group_info *info)
{
    uint64_t h = fsdp_hash64(info->name, strlen(info->name), 0x7463700000000000ull);
    h = fsdp_hash64(info->world_ranks, (size_t)info->size * sizeof(int), h);
    return h;
}

static int tcp_check_info(const struct fsdp_group_info *info)
{
    if (!info || !info->name || info->size < 1 || info->rank < 0 || info->rank >= info->size ||
        !info->world_ranks) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp backend: invalid group (rank %d of size %d)",
                        info ? info->rank : -1, info ? info->size : -1);
    }
    if (info->size > 1 && !info->store) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp backend: group %s needs a rendezvous store",
                        info->name);
    }
    if (info->world_ranks[info->rank] != info->world_rank) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp backend: group %s: world_ranks[%d] = %d but this "
                        "is world rank %d", info->name, info->rank, info->world_ranks[info->rank],
                        info->world_rank);
    }
    return 0;
}

static void tcp_free(struct tcp_backend *be)
{
    fsdp_free(be->scratch);
    free(be->pfd_peer);
    free(be->pfds);
    free(be->chans);
    free(be->peers);
    free(be->world_ranks);
    free(be);
}

static int tcp_alloc(const struct fsdp_group_info *info, struct tcp_backend **out)
{
    struct tcp_backend *be = calloc(1, sizeof(*be));
    int n = info->size;
    if (!be) {
        return fsdp_err(FSDP_ERR_NOMEM, "tcp backend: out of memory");
    }
    be->world_ranks = calloc((size_t)n, sizeof(int));
    be->peers = calloc((size_t)n, sizeof(struct tcp_peer));
    be->chans = calloc((size_t)(2 * n + 2), sizeof(struct tcp_chan));
    be->pfds = calloc((size_t)n + 1, sizeof(struct pollfd));
    be->pfd_peer = calloc((size_t)n + 1, sizeof(int));
    if (!be->world_ranks || !be->peers || !be->chans || !be->pfds || !be->pfd_peer) {
        tcp_free(be);
        return fsdp_err(FSDP_ERR_NOMEM, "tcp backend: out of memory for a group of %d", n);
    }
    snprintf(be->name, sizeof(be->name), "%s", info->name);
    memcpy(be->world_ranks, info->world_ranks, (size_t)n * sizeof(int));
    be->rank = info->rank;
    be->size = n;
    be->world_rank = info->world_rank;
    be->nonce = info->nonce;
    if (!info->auth_key) {
        tcp_free(be);
        return fsdp_err(FSDP_ERR_INVALID, "tcp backend: group %s has no job key", info->name);
    }
    be->key = *info->auth_key;
    if (info->local_addr && info->local_addr[0]) {
        snprintf(be->local_ip, sizeof(be->local_ip), "%s", info->local_addr);
        snprintf(be->local_how, sizeof(be->local_how), "the rendezvous");
    } else {
        /* created without the job's choice (tests): this host's settings */
        struct fsdp_netaddr na;
        int rc = fsdp_netaddr_choose(NULL, 1, &na);
        if (rc < 0) {
            tcp_free(be);
            return rc;
        }
        snprintf(be->local_ip, sizeof(be->local_ip), "%s", na.ip);
        snprintf(be->local_how, sizeof(be->local_how), "%s", na.how);
    }
    be->timeout_s = info->timeout_s > 0 ? info->timeout_s : TCP_DEFAULT_TIMEOUT_S;
    be->group_hash = tcp_group_hash(info);
    /* a live peer that waits says so this often; silence for 3 periods
     * after the deadline is what marks a peer as gone */
    be->ka_interval = fmin(1.0, fmax(0.02, be->timeout_s / 10));
    /* a little inside the deadline, so that the backend's diagnosis (who
     * went silent) reaches a caller whose own wait of timeout_s runs from
     * the moment it issued the op */
    be->stall_s = 0.9 * be->timeout_s;
    be->wake_fd = -1;
    atomic_init(&be->aborted, 0);
    atomic_init(&be->stop, 0);
    for (int q = 0; q < n; q++) {
        be->peers[q].fd = -1;
        be->peers[q].rank = q;
        be->peers[q].world_rank = info->world_ranks[q];
    }
    *out = be;
    return 0;
}

static int tcp_sync_init(struct tcp_backend *be)
{
    pthread_condattr_t ca;
    if (pthread_mutex_init(&be->mu, NULL) != 0) {
        return fsdp_err(FSDP_ERR_SYSTEM, "tcp backend: mutex init failed");
    }
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&be->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        pthread_mutex_destroy(&be->mu);
        return fsdp_err(FSDP_ERR_SYSTEM, "tcp backend: condition variable init failed");
    }
    return 0;
}

static int tcp_create(const struct fsdp_group_info *info, struct fsdp_backend **out)
{
    struct tcp_backend *be = NULL;
    int rc;
    double t0 = fsdp_now();
    FSDP_CHECK(tcp_check_info(info));
    FSDP_CHECK(tcp_alloc(info, &be));
    FSDP_CHECK_GOTO(fsdp_tcp_config_read(&be->cfg), rc, err_0);
    FSDP_CHECK_GOTO(tcp_sync_init(be), rc, err_0);
    if (be->size > 1) {
        be->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (be->wake_fd < 0) {
            rc = fsdp_err(FSDP_ERR_SYSTEM, "group %s: eventfd: %s", be->name, strerror(errno));
            goto err_1;
        }
        FSDP_CHECK_GOTO(fsdp_tcp_conn_mesh(be, info->store), rc, err_2);
        FSDP_CHECK_GOTO(fsdp_tcp_engine_start(be), rc, err_3);
    }
    FSDP_INFO(FSDP_SUB_TCP, "group %s: tcp backend ready, rank %d of %d, %s, in %.3f s "
              "(small %zu B, chunk %zu B, socket buffers %s)", be->name, be->rank, be->size,
              be->peers[be->rank].addr[0] ? be->peers[be->rank].addr : "no connections",
              fsdp_now() - t0, be->cfg.small_bytes, be->cfg.chunk_bytes,
              be->cfg.sockbuf ? "fixed" : "autotuned");
    *out = (struct fsdp_backend *)be;
    return 0;

err_3:
    fsdp_tcp_conn_close(be);
err_2:
    close(be->wake_fd);
err_1:
    pthread_cond_destroy(&be->cv);
    pthread_mutex_destroy(&be->mu);
err_0:
    tcp_free(be);
    return rc;
}

static void tcp_destroy(struct fsdp_backend *b)
{
    struct tcp_backend *be = (struct tcp_backend *)b;
    if (!be) {
        return;
    }
    fsdp_tcp_engine_stop(be);
    fsdp_tcp_conn_close(be);
    if (be->wake_fd >= 0) {
        close(be->wake_fd);
    }
    pthread_cond_destroy(&be->cv);
    pthread_mutex_destroy(&be->mu);
    tcp_free(be);
}

/* Runs on the job-abort path, possibly in a signal handler: no locks, no
 * allocation; shutting the sockets down makes every peer notice at once. */
static void tcp_abort(struct fsdp_backend *b, const char *why)
{
    struct tcp_backend *be = (struct tcp_backend *)b;
    if (!be || atomic_load(&be->aborted)) {
        return;
    }
    size_t i = 0;
    for (; why && why[i] && i < sizeof(be->abort_why) - 1; i++) {
        be->abort_why[i] = why[i];
    }
    be->abort_why[i] = '\0';
    atomic_store(&be->aborted, 1);
    for (int q = 0; q < be->size; q++) {
        if (be->peers[q].fd >= 0) {
            shutdown(be->peers[q].fd, SHUT_RDWR);
        }
    }
    fsdp_tcp_engine_wake(be);
}

static void tcp_capabilities(struct fsdp_backend *b, struct fsdp_backend_caps *caps)
{
    (void)b;
    caps->flags = FSDP_CAP_MEM_HOST | FSDP_CAP_SEND_RECV | FSDP_CAP_ASYNC_PROGRESS;
    caps->dtypes = (1u << FSDP_DTYPE_COUNT) - 1;
    caps->redops = (1u << FSDP_REDOP_COUNT) - 1;
}

// ----------------------------------------------------------------------------
// issuing

static int tcp_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    const char *x = a, *y = b;
    return alen && blen && x < y + blen && y < x + alen;
}

/* Checks what every op shares; *bytes receives count * element size. */
static int tcp_check_op(const struct tcp_backend *be, const char *what, size_t count,
                        enum fsdp_dtype dtype, int redop, size_t mult,
                        const struct fsdp_coll_attr *attr, size_t *bytes)
{
    if ((unsigned)dtype >= FSDP_DTYPE_COUNT) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp %s on group %s: invalid dtype %d", what,
                        be->name, (int)dtype);
    }
    if (redop >= 0 && redop >= FSDP_REDOP_COUNT) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp %s on group %s: invalid reduce op %d", what,
                        be->name, redop);
    }
    if (attr && attr->mem != FSDP_MEM_HOST) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "tcp %s on group %s: the tcp backend takes host "
                        "memory only", what, be->name);
    }
    size_t es = fsdp_dtype_size(dtype);
    if (count > SIZE_MAX / es / mult) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp %s on group %s: count %zu overflows", what,
                        be->name, count);
    }
    *bytes = count * es;
    return 0;
}

static int tcp_issue(struct tcp_backend *be, const struct tcp_op *op, struct fsdp_work **out)
{
    struct tcp_work *w = calloc(1, sizeof(*w));
    if (!w) {
        return fsdp_err(FSDP_ERR_NOMEM, "tcp %s on group %s: out of memory",
                        fsdp_tcp_coll_name(op->coll), be->name);
    }
    w->base.ops = &fsdp_tcp_ops;
    w->be = be;
    w->op = *op;
    atomic_init(&w->done, 0);
    if (be->size == 1) {
        w->rc = fsdp_tcp_engine_run_op(be, &w->op);
        if (w->rc < 0) {
            snprintf(w->msg, sizeof(w->msg), "%s", be->errmsg);
        }
        atomic_store(&w->done, 1);
    } else {
        int rc = fsdp_tcp_engine_submit(be, w);
        if (rc < 0) {
            free(w);
            return rc;
        }
    }
    *out = &w->base;
    return 0;
}

static int tcp_allreduce(struct fsdp_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                         enum fsdp_dtype dtype, enum fsdp_redop op,
                         const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct tcp_backend *be = (struct tcp_backend *)b;
    size_t bytes = 0;
    FSDP_CHECK(tcp_check_op(be, "allreduce", count, dtype, (int)op, 1, attr, &bytes));
    if (bytes && (!sendbuf || !recvbuf)) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp allreduce on group %s: NULL buffer", be->name);
    }
    if (sendbuf != recvbuf && tcp_overlap(sendbuf, bytes, recvbuf, bytes)) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp allreduce on group %s: send and receive buffers "
                        "overlap without being the same (in place)", be->name);
    }
    struct tcp_op o = {.coll = TCP_COLL_ALLREDUCE, .sendbuf = sendbuf, .recvbuf = recvbuf,
                       .count = count, .dtype = dtype, .redop = op};
    return tcp_issue(be, &o, work);
}

static int tcp_allgather(struct fsdp_backend *b, const void *sendbuf, void *recvbuf, size_t count,
                         enum fsdp_dtype dtype, const struct fsdp_coll_attr *attr,
                         struct fsdp_work **work)
{
    struct tcp_backend *be = (struct tcp_backend *)b;
    size_t bytes = 0;
    FSDP_CHECK(tcp_check_op(be, "allgather", count, dtype, -1, (size_t)be->size, attr, &bytes));
    if (bytes && (!sendbuf || !recvbuf)) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp allgather on group %s: NULL buffer", be->name);
    }
    const char *mine = bytes ? (const char *)recvbuf + (size_t)be->rank * bytes : NULL;
    if (sendbuf != mine && tcp_overlap(sendbuf, bytes, recvbuf, bytes * (size_t)be->size)) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp allgather on group %s: the send buffer overlaps "
                        "the receive buffer but is not its block %d (in place)", be->name,
                        be->rank);
    }
    struct tcp_op o = {.coll = TCP_COLL_ALLGATHER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                       .count = count, .dtype = dtype};
    return tcp_issue(be, &o, work);
}

static int tcp_reduce_scatter(struct fsdp_backend *b, const void *sendbuf, void *recvbuf,
                              size_t count, enum fsdp_dtype dtype, enum fsdp_redop op,
                              const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct tcp_backend *be = (struct tcp_backend *)b;
    size_t bytes = 0;
    FSDP_CHECK(tcp_check_op(be, "reduce_scatter", count, dtype, (int)op, (size_t)be->size, attr,
                            &bytes));
    if (bytes && (!sendbuf || !recvbuf)) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp reduce_scatter on group %s: NULL buffer",
                        be->name);
    }
    const char *mine = bytes ? (const char *)sendbuf + (size_t)be->rank * bytes : NULL;
    if (recvbuf != mine && tcp_overlap(sendbuf, bytes * (size_t)be->size, recvbuf, bytes)) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp reduce_scatter on group %s: the receive buffer "
                        "overlaps the send buffer but is not its block %d (in place)", be->name,
                        be->rank);
    }
    struct tcp_op o = {.coll = TCP_COLL_REDUCE_SCATTER, .sendbuf = sendbuf, .recvbuf = recvbuf,
                       .count = count, .dtype = dtype, .redop = op};
    return tcp_issue(be, &o, work);
}

static int tcp_broadcast(struct fsdp_backend *b, void *buf, size_t count, enum fsdp_dtype dtype,
                         int root, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct tcp_backend *be = (struct tcp_backend *)b;
    size_t bytes = 0;
    FSDP_CHECK(tcp_check_op(be, "broadcast", count, dtype, -1, 1, attr, &bytes));
    if (root < 0 || root >= be->size) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp broadcast on group %s: root %d is not a rank of "
                        "the group (size %d)", be->name, root, be->size);
    }
    if (bytes && !buf) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp broadcast on group %s: NULL buffer", be->name);
    }
    struct tcp_op o = {.coll = TCP_COLL_BROADCAST, .sendbuf = buf, .recvbuf = buf,
                       .count = count, .dtype = dtype, .root = root};
    return tcp_issue(be, &o, work);
}

static int tcp_barrier(struct fsdp_backend *b, struct fsdp_work **work)
{
    struct tcp_backend *be = (struct tcp_backend *)b;
    struct tcp_op o = {.coll = TCP_COLL_BARRIER, .dtype = FSDP_U8};
    return tcp_issue(be, &o, work);
}

static int tcp_p2p(struct tcp_backend *be, int coll, void *buf, size_t count,
                   enum fsdp_dtype dtype, int peer, const struct fsdp_coll_attr *attr,
                   struct fsdp_work **work)
{
    size_t bytes = 0;
    const char *what = fsdp_tcp_coll_name(coll);
    FSDP_CHECK(tcp_check_op(be, what, count, dtype, -1, 1, attr, &bytes));
    if (peer < 0 || peer >= be->size || peer == be->rank) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp %s on group %s: peer %d is not another rank of "
                        "the group (rank %d of %d)", what, be->name, peer, be->rank, be->size);
    }
    if (bytes && !buf) {
        return fsdp_err(FSDP_ERR_INVALID, "tcp %s on group %s: NULL buffer", what, be->name);
    }
    struct tcp_op o = {.coll = (enum tcp_coll)coll, .sendbuf = buf, .recvbuf = buf,
                       .count = count, .dtype = dtype, .peer = peer};
    return tcp_issue(be, &o, work);
}

static int tcp_send(struct fsdp_backend *b, const void *buf, size_t count, enum fsdp_dtype dtype,
                    int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    return tcp_p2p((struct tcp_backend *)b, TCP_COLL_SEND, (void *)buf, count, dtype, peer, attr,
                   work);
}

static int tcp_recv(struct fsdp_backend *b, void *buf, size_t count, enum fsdp_dtype dtype,
                    int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    return tcp_p2p((struct tcp_backend *)b, TCP_COLL_RECV, buf, count, dtype, peer, attr, work);
}

// ----------------------------------------------------------------------------
// work handles

static int tcp_work_result(struct tcp_work *w)
{
    if (w->rc < 0) {
        return fsdp_err(w->rc, "%s", w->msg);
    }
    return 0;
}

static int tcp_work_wait(struct fsdp_work *fw, double timeout_s)
{
    struct tcp_work *w = (struct tcp_work *)fw;
    struct tcp_backend *be = w->be;
    if (atomic_load(&w->done)) {
        return tcp_work_result(w);
    }
    if (timeout_s < 0) {
        timeout_s = be->timeout_s;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double whole = floor(fmin(timeout_s, 1e9));
    ts.tv_sec += (time_t)whole;
    ts.tv_nsec += (long)((fmin(timeout_s, 1e9) - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&be->mu);
    while (!atomic_load(&w->done)) {
        if (pthread_cond_timedwait(&be->cv, &be->mu, &ts) == ETIMEDOUT &&
            !atomic_load(&w->done)) {
            char why[TCP_ERRMSG_MAX];
            if (be->head != w) {
                snprintf(why, sizeof(why), "queued behind earlier operations");
            } else {
                snprintf(why, sizeof(why), "%s", be->status[0] ? be->status : "in progress");
            }
            pthread_mutex_unlock(&be->mu);
            return fsdp_err(FSDP_ERR_TIMEOUT, "group %s: %s still pending after %.1f s: %s",
                            be->name, fsdp_tcp_coll_name(w->op.coll), timeout_s, why);
        }
    }
    pthread_mutex_unlock(&be->mu);
    return tcp_work_result(w);
}

static int tcp_work_test(struct fsdp_work *fw, int *done)
{
    struct tcp_work *w = (struct tcp_work *)fw;
    *done = atomic_load(&w->done);
    return *done ? tcp_work_result(w) : 0;
}

static void tcp_work_free(struct fsdp_work *fw)
{
    struct tcp_work *w = (struct tcp_work *)fw;
    if (!w) {
        return;
    }
    if (!atomic_load(&w->done)) {
        /* still queued or running: the engine frees it when it completes */
        struct tcp_backend *be = w->be;
        pthread_mutex_lock(&be->mu);
        int pending = !atomic_load(&w->done);
        if (pending) {
            w->orphaned = 1;
        }
        pthread_mutex_unlock(&be->mu);
        if (pending) {
            return;
        }
    }
    free(w);
}

const struct fsdp_backend_ops fsdp_tcp_ops = {
    .size = sizeof(struct fsdp_backend_ops),
    .name = "tcp",
    /* blocks until every member is connected, at most the group's timeout */
    .create = tcp_create,
    /* never waits on a peer: pending ops fail with FSDP_ERR_ABORTED */
    .destroy = tcp_destroy,
    /* signal-safe: no lock, no allocation; shuts the sockets down */
    .abort = tcp_abort,
    /* host memory, every dtype and reduce op, send/recv, async progress */
    .capabilities = tcp_capabilities,
    /* the collectives: non-blocking, host memory only, in place allowed as
     * backend.h defines it; any other overlap is FSDP_ERR_INVALID */
    .allreduce = tcp_allreduce,
    .allgather = tcp_allgather,
    .reduce_scatter = tcp_reduce_scatter,
    .broadcast = tcp_broadcast,
    .barrier = tcp_barrier,
    /* non-blocking, one message; the receiver's count must match */
    .send = tcp_send,
    .recv = tcp_recv,
    /* blocks on a condition variable up to timeout_s (< 0: the group's) */
    .work_wait = tcp_work_wait,
    /* never blocks */
    .work_test = tcp_work_test,
    /* any time, also after destroy(); a pending op is freed when it ends */
    .work_free = tcp_work_free,
    .mem_caps = FSDP_CAP_MEM_HOST,
};
