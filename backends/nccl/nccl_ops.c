/*
 * nccl_ops.c - the nccl backend's collectives, point-to-point calls and work
 * handles, and the exported ops table fsdp_nccl_ops.
 *
 * An op is checked here (CUDA memory on this communicator's device, sizes,
 * overlap), queued with NCCL on attr->stream or the instance's own stream,
 * and followed by a pooled CUDA event: the work handle. Waiting polls that
 * event and ncclCommGetAsyncError; an op still pending be->timeout_s after it
 * was issued, an asynchronous NCCL error or a CUDA error aborts the
 * communicator and becomes a sticky error naming the group and the op. A
 * caller's shorter wait only reports FSDP_ERR_TIMEOUT and leaves the op
 * pending, as backend.h asks.
 *
 * It never allocates device memory per call and never blocks without a
 * deadline.
 */
#include "config.h"
#include "backends/nccl/nccl_be.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <stdint.h>
#include <string.h>

enum nccl_kind {
    NCCL_ALLREDUCE,
    NCCL_ALLGATHER,
    NCCL_REDUCE_SCATTER,
    NCCL_BROADCAST,
    NCCL_SEND,
    NCCL_RECV,
};

/* One op as the submit path sees it. */
struct nccl_call {
    enum nccl_kind kind;
    const char *op;        /* name for messages */
    const void *sendbuf;
    void *recvbuf;
    size_t count;          /* elements, per rank for allgather/reduce_scatter */
    enum fsdp_dtype dtype;
    enum fsdp_redop redop;
    int peer;              /* broadcast root, or send/recv peer (group ranks) */
};

static const ncclDataType_t nccl_dtypes[FSDP_DTYPE_COUNT] = {
    [FSDP_F32] = ncclFloat32, [FSDP_F16] = ncclFloat16, [FSDP_BF16] = ncclBfloat16,
    [FSDP_I32] = ncclInt32,   [FSDP_I64] = ncclInt64,   [FSDP_U8] = ncclUint8,
};

static const ncclRedOp_t nccl_redops[FSDP_REDOP_COUNT] = {
    [FSDP_SUM] = ncclSum, [FSDP_AVG] = ncclAvg, [FSDP_MAX] = ncclMax, [FSDP_MIN] = ncclMin,
};

// ----------------------------------------------------------------------------
// argument checks

static int nccl_check_call(struct fsdp_backend *be, const struct nccl_call *c,
                           const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    if (be == NULL || work == NULL) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: %s needs a backend and a work pointer",
                        c->op);
    }
    *work = NULL;
    if ((unsigned)c->dtype >= FSDP_DTYPE_COUNT) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: %s: dtype %d is not a dtype",
                        be->name, c->op, (int)c->dtype);
    }
    if ((unsigned)c->redop >= FSDP_REDOP_COUNT) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: %s: op %d is not a reduce op",
                        be->name, c->op, (int)c->redop);
    }
    if (attr == NULL || attr->mem != FSDP_MEM_CUDA) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: group %s: %s needs CUDA device buffers (attr->mem = "
                        "FSDP_MEM_CUDA), got %s", be->name, c->op,
                        attr == NULL ? "no attributes (host memory)" : "host memory");
    }
    if (c->count > SIZE_MAX / fsdp_dtype_size(c->dtype) / (size_t)be->size) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: %s of %zu %s elements overflows",
                        be->name, c->op, c->count, fsdp_dtype_name(c->dtype));
    }
    return 0;
}

/* A buffer NCCL can use: device memory of this communicator's device, or
 * managed memory. Host memory mislabelled as CUDA would fault inside NCCL. */
static int nccl_check_ptr(struct fsdp_backend *be, const char *op, const char *what, const void *p,
                          size_t bytes)
{
    struct cudaPointerAttributes a;
    cudaError_t ce;

    if (bytes == 0) {
        return 0;
    }
    if (p == NULL) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: %s: %s is NULL for %zu bytes",
                        be->name, op, what, bytes);
    }
    memset(&a, 0, sizeof(a));
    ce = cudaPointerGetAttributes(&a, p);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: group %s: %s: %s %p is not CUDA memory (%s)", be->name, op,
                        what, p, cudaGetErrorString(ce));
    }
    switch (a.type) {
    case cudaMemoryTypeDevice:
        if (a.device != be->device) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "nccl backend: group %s: %s: %s %p is on cuda:%d, the "
                            "communicator on cuda:%d",
                            be->name, op, what, p, a.device, be->device);
        }
        return 0;
    case cudaMemoryTypeManaged:
        return 0;
    case cudaMemoryTypeHost:
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: group %s: %s: %s %p is pinned host memory; "
                        "the nccl backend needs CUDA device memory",
                        be->name, op, what, p);
    default:
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: group %s: %s: %s %p is host memory, not CUDA "
                        "device memory",
                        be->name, op, what, p);
    }
}

static int nccl_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return na && nb && a0 < b0 + nb && b0 < a0 + na;
}

static int nccl_bad_overlap(struct fsdp_backend *be, const char *op)
{
    return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: %s: sendbuf and recvbuf overlap but "
                    "are not the in-place layout (see backend.h)", be->name, op);
}

// ----------------------------------------------------------------------------
// submit: queue on the stream, wait until NCCL has queued, record the event

static ncclResult_t nccl_launch(struct fsdp_backend *be, const struct nccl_call *c, cudaStream_t s)
{
    ncclDataType_t t = nccl_dtypes[c->dtype];
    switch (c->kind) {
    case NCCL_ALLREDUCE:
        return ncclAllReduce(c->sendbuf, c->recvbuf, c->count, t, nccl_redops[c->redop], be->comm,
                             s);
    case NCCL_ALLGATHER:
        return ncclAllGather(c->sendbuf, c->recvbuf, c->count, t, be->comm, s);
    case NCCL_REDUCE_SCATTER:
        return ncclReduceScatter(c->sendbuf, c->recvbuf, c->count, t, nccl_redops[c->redop],
                                 be->comm, s);
    case NCCL_BROADCAST:
        return ncclBroadcast(c->sendbuf, c->recvbuf, c->count, t, c->peer, be->comm, s);
    case NCCL_SEND:
        return ncclSend(c->sendbuf, c->count, t, c->peer, be->comm, s);
    case NCCL_RECV:
        return ncclRecv(c->recvbuf, c->count, t, c->peer, be->comm, s);
    }
    return ncclInvalidArgument;
}

/* A non-blocking communicator may answer ncclInProgress (connection setup):
 * the op is on the stream only once the async state leaves it. */
static int nccl_wait_queued_locked(struct fsdp_backend *be, const struct nccl_call *c, uint64_t seq,
                                   ncclResult_t r)
{
    double deadline = fsdp_now() + be->timeout_s;
    unsigned round = 0;

    while (r == ncclInProgress) {
        if (atomic_load(&be->abort_pending)) {
            return fsdp_nccl_check_failed(be);
        }
        if (fsdp_now() > deadline) {
            return fsdp_nccl_fail(
                be, FSDP_ERR_TIMEOUT,
                "nccl backend: group %s: %s #%llu (%zu x %s) was not queued within "
                "%.1f s (NCCL connection setup stuck: a peer gone or elsewhere?); "
                "communicator aborted",
                be->name, c->op, (unsigned long long)seq, c->count, fsdp_dtype_name(c->dtype),
                be->timeout_s);
        }
        fsdp_nccl_pause(&round);
        if (ncclCommGetAsyncError(be->comm, &r) != ncclSuccess) {
            r = ncclInternalError;
        }
    }
    if (r != ncclSuccess) {
        return fsdp_nccl_fail(
            be, fsdp_nccl_code(r),
            "nccl backend: group %s: %s #%llu (%zu x %s) failed on host %s cuda:%d: "
            "%s (%s); communicator aborted",
            be->name, c->op, (unsigned long long)seq, c->count, fsdp_dtype_name(c->dtype), be->host,
            be->device, ncclGetErrorString(r), ncclGetLastError(be->comm));
    }
    return 0;
}

static int nccl_submit(struct fsdp_backend *be, const struct nccl_call *c,
                       const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_work *w = NULL;
    cudaStream_t s = (attr && attr->stream) ? (cudaStream_t)attr->stream : be->stream;
    cudaError_t ce;
    int saved = -1, rc;

    pthread_mutex_lock(&be->mu);
    FSDP_CHECK_GOTO(fsdp_nccl_check_failed(be), rc, out);
    FSDP_CHECK_GOTO(fsdp_nccl_device_enter(be, &saved), rc, out);
    FSDP_CHECK_GOTO(fsdp_nccl_work_get_locked(be, &w), rc, out);
    if (s == be->stream) {
        /* no stream given: run after everything queued so far on the legacy
         * default stream, where such a caller produced its data */
        ce = cudaEventRecord(be->dep_ev, cudaStreamLegacy);
        if (ce == cudaSuccess) {
            ce = cudaStreamWaitEvent(be->stream, be->dep_ev, 0);
        }
        if (ce != cudaSuccess) {
            rc = fsdp_nccl_cuda_err(be, "ordering after the default stream", ce);
            goto out;
        }
    }
    w->seq = ++be->seq;
    w->t_issue = fsdp_now();
    w->op = c->op;
    w->count = c->count;
    w->dtype = c->dtype;
    if (c->count > 0) {
        ncclResult_t r = nccl_launch(be, c, s);
        FSDP_CHECK_GOTO(nccl_wait_queued_locked(be, c, w->seq, r), rc, out);
    }
    ce = cudaEventRecord(w->done_ev, s);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        rc = fsdp_nccl_fail(be, FSDP_ERR_BACKEND,
                            "nccl backend: group %s: %s #%llu: recording its "
                            "completion event on cuda:%d failed: %s; communicator aborted",
                            be->name, c->op, (unsigned long long)w->seq, be->device,
                            cudaGetErrorString(ce));
        goto out;
    }
    *work = &w->base;
    rc = 0;
out:
    if (rc < 0) {
        if (w != NULL) {
            fsdp_nccl_work_put_locked(be, w);
        }
        fsdp_nccl_reap_locked(be);
    }
    fsdp_nccl_device_leave(be, saved);
    pthread_mutex_unlock(&be->mu);
    return rc;
}

// ----------------------------------------------------------------------------
// collectives and point-to-point

static int nccl_allreduce(struct fsdp_backend *be, const void *sendbuf, void *recvbuf, size_t count,
                          enum fsdp_dtype dtype, enum fsdp_redop op,
                          const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_call c = {NCCL_ALLREDUCE, "allreduce", sendbuf, recvbuf, count, dtype, op, 0};
    size_t bytes;

    FSDP_CHECK(nccl_check_call(be, &c, attr, work));
    bytes = count * fsdp_dtype_size(dtype);
    FSDP_CHECK(nccl_check_ptr(be, c.op, "recvbuf", recvbuf, bytes));
    if (sendbuf != recvbuf) {
        FSDP_CHECK(nccl_check_ptr(be, c.op, "sendbuf", sendbuf, bytes));
        if (nccl_overlap(sendbuf, bytes, recvbuf, bytes)) {
            return nccl_bad_overlap(be, c.op);
        }
    }
    return nccl_submit(be, &c, attr, work);
}

static int nccl_allgather(struct fsdp_backend *be, const void *sendbuf, void *recvbuf, size_t count,
                          enum fsdp_dtype dtype, const struct fsdp_coll_attr *attr,
                          struct fsdp_work **work)
{
    struct nccl_call c = {NCCL_ALLGATHER, "allgather", sendbuf, recvbuf, count, dtype, FSDP_SUM, 0};
    size_t bytes;

    FSDP_CHECK(nccl_check_call(be, &c, attr, work));
    bytes = count * fsdp_dtype_size(dtype);
    FSDP_CHECK(nccl_check_ptr(be, c.op, "recvbuf", recvbuf, bytes * (size_t)be->size));
    if (bytes && sendbuf != (const char *)recvbuf + bytes * (size_t)be->rank) {
        FSDP_CHECK(nccl_check_ptr(be, c.op, "sendbuf", sendbuf, bytes));
        if (nccl_overlap(sendbuf, bytes, recvbuf, bytes * (size_t)be->size)) {
            return nccl_bad_overlap(be, c.op);
        }
    }
    return nccl_submit(be, &c, attr, work);
}

static int nccl_reduce_scatter(struct fsdp_backend *be, const void *sendbuf, void *recvbuf,
                               size_t count, enum fsdp_dtype dtype, enum fsdp_redop op,
                               const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_call c = {NCCL_REDUCE_SCATTER, "reduce_scatter", sendbuf, recvbuf, count, dtype, op,
                          0};
    size_t bytes;

    FSDP_CHECK(nccl_check_call(be, &c, attr, work));
    bytes = count * fsdp_dtype_size(dtype);
    FSDP_CHECK(nccl_check_ptr(be, c.op, "sendbuf", sendbuf, bytes * (size_t)be->size));
    if (bytes && recvbuf != (const char *)sendbuf + bytes * (size_t)be->rank) {
        FSDP_CHECK(nccl_check_ptr(be, c.op, "recvbuf", recvbuf, bytes));
        if (nccl_overlap(sendbuf, bytes * (size_t)be->size, recvbuf, bytes)) {
            return nccl_bad_overlap(be, c.op);
        }
    }
    return nccl_submit(be, &c, attr, work);
}

static int nccl_broadcast(struct fsdp_backend *be, void *buf, size_t count, enum fsdp_dtype dtype,
                          int root, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_call c = {NCCL_BROADCAST, "broadcast", buf, buf, count, dtype, FSDP_SUM, root};

    FSDP_CHECK(nccl_check_call(be, &c, attr, work));
    if (root < 0 || root >= be->size) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: broadcast root %d is not in a "
                        "group of %d", be->name, root, be->size);
    }
    FSDP_CHECK(nccl_check_ptr(be, c.op, "buf", buf, count * fsdp_dtype_size(dtype)));
    return nccl_submit(be, &c, attr, work);
}

/* A one-element allreduce on the instance's scratch, on its own stream. */
static int nccl_barrier(struct fsdp_backend *be, struct fsdp_work **work)
{
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct nccl_call c = {NCCL_ALLREDUCE, "barrier", NULL, NULL, 1, FSDP_F32, FSDP_SUM, 0};

    if (be != NULL) {
        c.sendbuf = be->scratch;
        c.recvbuf = be->scratch;
    }
    FSDP_CHECK(nccl_check_call(be, &c, &attr, work));
    return nccl_submit(be, &c, &attr, work);
}

static int nccl_p2p(struct fsdp_backend *be, struct nccl_call *c, const struct fsdp_coll_attr *attr,
                    struct fsdp_work **work)
{
    FSDP_CHECK(nccl_check_call(be, c, attr, work));
    if (c->peer < 0 || c->peer >= be->size || c->peer == be->rank) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: %s peer %d must be another rank "
                        "of the group (0..%d, this is %d)", be->name, c->op, c->peer, be->size - 1,
                        be->rank);
    }
    return nccl_check_ptr(be, c->op, "buf", c->kind == NCCL_SEND ? c->sendbuf : c->recvbuf,
                          c->count * fsdp_dtype_size(c->dtype));
}

static int nccl_send(struct fsdp_backend *be, const void *buf, size_t count, enum fsdp_dtype dtype,
                     int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_call c = {NCCL_SEND, "send", buf, NULL, count, dtype, FSDP_SUM, peer};
    FSDP_CHECK(nccl_p2p(be, &c, attr, work));
    return nccl_submit(be, &c, attr, work);
}

static int nccl_recv(struct fsdp_backend *be, void *buf, size_t count, enum fsdp_dtype dtype,
                     int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_call c = {NCCL_RECV, "recv", NULL, buf, count, dtype, FSDP_SUM, peer};
    FSDP_CHECK(nccl_p2p(be, &c, attr, work));
    return nccl_submit(be, &c, attr, work);
}

// ----------------------------------------------------------------------------
// work handles

static int nccl_work_failed_locked(struct nccl_work *w, int rc)
{
    w->state = NCCL_WORK_FAILED;
    w->rc = rc;
    fsdp_nccl_reap_locked(w->be);
    return rc;
}

/* One look at the op, with mu held: *done = 1 once it has completed or failed. */
static int nccl_work_poll_locked(struct nccl_work *w, int *done)
{
    struct fsdp_backend *be = w->be;
    ncclResult_t st = ncclSuccess;
    cudaError_t ce;

    *done = 1;
    switch (w->state) {
    case NCCL_WORK_DONE:
        return 0;
    case NCCL_WORK_FAILED:
        return fsdp_nccl_check_failed(be);
    case NCCL_WORK_FREE:
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: work handle used after free",
                        be->name);
    case NCCL_WORK_PENDING:
        break;
    }
    /* after a failure nothing still pending can be trusted */
    if (atomic_load(&be->fail_state) != 0) {
        return nccl_work_failed_locked(w, fsdp_nccl_check_failed(be));
    }
    ce = cudaEventQuery(w->done_ev);
    if (ce == cudaSuccess) {
        w->state = NCCL_WORK_DONE;
        return 0;
    }
    if (ce != cudaErrorNotReady) {
        (void)cudaGetLastError();
        return nccl_work_failed_locked(
            w, fsdp_nccl_fail(be, FSDP_ERR_BACKEND,
                              "nccl backend: group %s: CUDA error on host %s "
                              "cuda:%d while %s #%llu was pending: %s; communicator aborted",
                              be->name, be->host, be->device, w->op, (unsigned long long)w->seq,
                              cudaGetErrorString(ce)));
    }
    if (be->comm != NULL && ncclCommGetAsyncError(be->comm, &st) != ncclSuccess) {
        st = ncclInternalError;
    }
    if (st != ncclSuccess && st != ncclInProgress) {
        return nccl_work_failed_locked(
            w, fsdp_nccl_fail(be, fsdp_nccl_code(st),
                              "nccl backend: group %s: NCCL error while %s "
                              "#%llu (%zu x %s) was pending: %s (%s); communicator aborted",
                              be->name, w->op, (unsigned long long)w->seq, w->count,
                              fsdp_dtype_name(w->dtype), ncclGetErrorString(st),
                              ncclGetLastError(be->comm)));
    }
    if (fsdp_now() - w->t_issue > be->timeout_s) {
        return nccl_work_failed_locked(
            w, fsdp_nccl_fail(be, FSDP_ERR_TIMEOUT,
                              "nccl backend: group %s: %s #%llu (%zu x %s) did "
                              "not complete within %.1f s of being issued (rank %d of %d, host %s "
                              "cuda:%d; a member gone, stuck, or in another collective?); "
                              "communicator aborted",
                              be->name, w->op, (unsigned long long)w->seq, w->count,
                              fsdp_dtype_name(w->dtype), be->timeout_s, be->rank, be->size,
                              be->host, be->device));
    }
    *done = 0;
    return 0;
}

static int nccl_work_test(struct fsdp_work *base, int *done)
{
    struct nccl_work *w = (struct nccl_work *)base;
    int rc;

    if (w == NULL || done == NULL) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: work_test needs a handle and a flag");
    }
    pthread_mutex_lock(&w->be->mu);
    rc = nccl_work_poll_locked(w, done);
    pthread_mutex_unlock(&w->be->mu);
    return rc;
}

static int nccl_work_wait(struct fsdp_work *base, double timeout_s)
{
    struct nccl_work *w = (struct nccl_work *)base;
    double t0 = fsdp_now(), limit;
    unsigned round = 0;

    if (w == NULL) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: work_wait needs a handle");
    }
    limit = timeout_s < 0 ? w->be->timeout_s : timeout_s;
    for (;;) {
        int done = 0;
        FSDP_CHECK(nccl_work_test(base, &done));
        if (done) {
            return 0;
        }
        if (fsdp_now() - t0 >= limit) {
            return fsdp_err(FSDP_ERR_TIMEOUT, "nccl backend: group %s: %s #%llu (%zu x %s) not "
                            "complete after a %.3f s wait; still pending", w->be->name, w->op,
                            (unsigned long long)w->seq, w->count, fsdp_dtype_name(w->dtype), limit);
        }
        fsdp_nccl_pause(&round);
    }
}

static void nccl_work_free(struct fsdp_work *base)
{
    struct nccl_work *w = (struct nccl_work *)base;
    if (w == NULL) {
        return;
    }
    pthread_mutex_lock(&w->be->mu);
    fsdp_nccl_work_put_locked(w->be, w);
    pthread_mutex_unlock(&w->be->mu);
}

// ----------------------------------------------------------------------------
// the table

const struct fsdp_backend_ops fsdp_nccl_ops = {
    .size = sizeof(struct fsdp_backend_ops),
    .name = "nccl",
    .create = fsdp_nccl_create,         /* collective; bounded by info->timeout_s */
    .destroy = fsdp_nccl_destroy,       /* finalize bounded by the timeout, else abort */
    .abort = fsdp_nccl_abort,           /* no allocation; ncclCommAbort */
    .capabilities = fsdp_nccl_capabilities,
    .allreduce = nccl_allreduce,        /* CUDA memory; in place when recvbuf == sendbuf */
    .allgather = nccl_allgather,        /* in place when sendbuf == recvbuf + rank*count */
    .reduce_scatter = nccl_reduce_scatter, /* in place when recvbuf == sendbuf + rank*count */
    .broadcast = nccl_broadcast,        /* in place */
    .barrier = nccl_barrier,            /* one-element allreduce on the instance's scratch */
    .send = nccl_send,                  /* pairs must be issued in an order that cannot deadlock */
    .recv = nccl_recv,
    .work_wait = nccl_work_wait,        /* polls event + async error; never past the deadline */
    .work_test = nccl_work_test,        /* non-blocking */
    .work_free = nccl_work_free,        /* back to the pool */
    .mem_caps = FSDP_CAP_MEM_CUDA,      /* device memory only */
};
