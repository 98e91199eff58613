/*
 * nccl_ops.c - the nccl backend's collectives, point-to-point calls and work
 * handles, and the exported ops table fsdp_nccl_ops.
 *
 * An op is checked here (CUDA memory on this communicator's device, sizes,
 * overlap, a stream NCCL's launch thread can name), queued with NCCL on
 * attr->stream or the instance's own stream, and followed by a pooled CUDA
 * event: the work handle. Send and recv are batched: consecutive ones go to
 * NCCL together inside ncclGroupStart/End at the next collective, barrier,
 * wait or test on the instance, so that an exchange issued send-first on
 * every rank cannot deadlock.
 *
 * Waiting polls the event and ncclCommGetAsyncError; an op still pending
 * be->deadline_s after it was launched, an asynchronous NCCL error or a
 * CUDA error aborts the communicator and becomes a sticky error naming the
 * group and the op. A caller's shorter wait only reports FSDP_ERR_TIMEOUT
 * and leaves the op pending, as backend.h asks.
 *
 * It never allocates device memory per call and never blocks without a
 * deadline; the instance's state lock is never held across an enqueue.
 */
#include "config.h"
#include "backends/nccl/nccl_be.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

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
    /* everything below talks to CUDA: on this instance's device only */
    return fsdp_nccl_device_use(be);
}

/* A CUDA call that failed for a reason other than its argument: the device
 * or its context is broken (a sticky error such as an illegal address), so
 * the instance fails, naming the error rather than blaming the argument. */
static int nccl_cuda_broken(struct fsdp_backend *be, const char *op, const char *what,
                            cudaError_t ce)
{
    int rc;
    (void)cudaGetLastError();
    rc = fsdp_nccl_fail(be, FSDP_ERR_BACKEND,
                        "nccl backend: group %s: %s: CUDA error on host %s cuda:%d while "
                        "checking %s: %s; communicator aborted",
                        be->name, op, be->host, be->device, what, cudaGetErrorString(ce));
    fsdp_nccl_reap(be);
    return rc;
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
    if (ce == cudaErrorInvalidValue) {
        (void)cudaGetLastError(); /* what CUDA before 11 said of host memory */
        a.type = cudaMemoryTypeUnregistered;
    } else if (ce != cudaSuccess) {
        return nccl_cuda_broken(be, op, what, ce);
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

/*
 * The stream the op runs on. A non-blocking communicator launches from a
 * thread of NCCL's, where cudaStreamPerThread names that thread's stream,
 * not the caller's: the op would not follow the caller's work, nor would
 * the event after it cover the op. The legacy default stream is one per
 * device and fine. A stream of another device is refused here; inside NCCL
 * it would fail the whole communicator.
 */
static int nccl_pick_stream(struct fsdp_backend *be, const char *op,
                            const struct fsdp_coll_attr *attr, cudaStream_t *out)
{
    cudaStream_t s = (cudaStream_t)attr->stream;
    cudaError_t ce;
    int dev = -1;

    *out = be->stream;
    if (s == NULL) {
        return 0;
    }
    if (s == cudaStreamPerThread) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: group %s: %s: attr->stream is cudaStreamPerThread, which "
                        "NCCL's launch thread would take for its own stream (the op would not "
                        "follow this thread's work): pass a stream made with cudaStreamCreate, "
                        "or NULL for the backend's own", be->name, op);
    }
    if (s == cudaStreamLegacy) {
        *out = s;
        return 0;
    }
#if CUDART_VERSION >= 12080
    ce = cudaStreamGetDevice(s, &dev);
#else
    /* an event of this device cannot be recorded on another device's stream */
    {
        cudaEvent_t probe = NULL;
        ce = cudaEventCreateWithFlags(&probe, cudaEventDisableTiming);
        if (ce == cudaSuccess) {
            ce = cudaEventRecord(probe, s);
            dev = ce == cudaSuccess ? be->device : -1;
            if (ce == cudaErrorInvalidResourceHandle) {
                ce = cudaSuccess; /* a stream, of another device */
            }
            (void)cudaEventDestroy(probe);
        }
    }
#endif
    if (ce != cudaSuccess) {
        if (!fsdp_nccl_cuda_usage_error(ce)) {
            return nccl_cuda_broken(be, op, "attr->stream", ce);
        }
        (void)cudaGetLastError();
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: %s: attr->stream %p is not a "
                        "CUDA stream (%s)", be->name, op, (void *)s, cudaGetErrorString(ce));
    }
    if (dev != be->device) {
        char where[32] = "another device";
        if (dev >= 0) {
            snprintf(where, sizeof(where), "cuda:%d", dev);
        }
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: group %s: %s: attr->stream %p is a stream of %s, the "
                        "communicator is on cuda:%d", be->name, op, (void *)s, where, be->device);
    }
    *out = s;
    return 0;
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

/* The buffers of an allgather (full: recvbuf) or a reduce_scatter (full:
 * sendbuf): full holds every rank's block of `bytes`, part this rank's. part
 * is either full's block `rank` (in place) or apart from full. */
static int nccl_check_blocks(struct fsdp_backend *be, const char *op, const char *full_name,
                             const void *full, const char *part_name, const void *part,
                             size_t bytes)
{
    size_t total = bytes * (size_t)be->size;
    FSDP_CHECK(nccl_check_ptr(be, op, full_name, full, total));
    if (bytes && part != (const char *)full + bytes * (size_t)be->rank) {
        FSDP_CHECK(nccl_check_ptr(be, op, part_name, part, bytes));
        if (nccl_overlap(part, bytes, full, total)) {
            return nccl_bad_overlap(be, op);
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// launch: hand to NCCL, wait until NCCL has queued, record the events

static ncclResult_t nccl_launch(ncclComm_t comm, const struct nccl_call *c, cudaStream_t s)
{
    ncclDataType_t t = nccl_dtypes[c->dtype];
    switch (c->kind) {
    case NCCL_ALLREDUCE:
        return ncclAllReduce(c->sendbuf, c->recvbuf, c->count, t, nccl_redops[c->redop], comm, s);
    case NCCL_ALLGATHER:
        return ncclAllGather(c->sendbuf, c->recvbuf, c->count, t, comm, s);
    case NCCL_REDUCE_SCATTER:
        return ncclReduceScatter(c->sendbuf, c->recvbuf, c->count, t, nccl_redops[c->redop],
                                 comm, s);
    case NCCL_BROADCAST:
        return ncclBroadcast(c->sendbuf, c->recvbuf, c->count, t, c->peer, comm, s);
    case NCCL_SEND:
        return ncclSend(c->sendbuf, c->count, t, c->peer, comm, s);
    case NCCL_RECV:
        return ncclRecv(c->recvbuf, c->count, t, c->peer, comm, s);
    }
    return ncclInvalidArgument;
}

/* "allreduce #3 (4 x f32)", "send #5 (1031 x i32) and 1 more send/recv" */
static void nccl_what(const struct nccl_work *w, int n, char *buf, size_t len)
{
    int k = snprintf(buf, len, "%s #%llu (%zu x %s)", w->call.op, (unsigned long long)w->seq,
                     w->call.count, fsdp_dtype_name(w->call.dtype));
    if (n > 1 && k > 0 && (size_t)k < len) {
        snprintf(buf + k, len - (size_t)k, " and %d more send/recv", n - 1);
    }
}

/* With issue_mu held. A non-blocking communicator answers ncclInProgress
 * while NCCL's thread launches (and sets up connections on first use): the
 * op is on its stream only once the async state leaves it. NCCL allows no
 * other call on the communicator until then, hence issue_mu. */
static int nccl_wait_queued(struct fsdp_backend *be, ncclComm_t comm, const struct nccl_work *w,
                            int n, ncclResult_t r)
{
    double deadline = fsdp_now() + be->deadline_s;
    struct nccl_poll poll;
    char what[160];

    fsdp_nccl_poll_start(&poll);
    while (r == ncclInProgress) {
        if (atomic_load(&be->abort_pending)) {
            return fsdp_nccl_check_failed(be);
        }
        if (fsdp_now() > deadline) {
            nccl_what(w, n, what, sizeof(what));
            return fsdp_nccl_fail(
                be, FSDP_ERR_TIMEOUT,
                "nccl backend: group %s: %s was not queued within %.1f s (NCCL connection setup "
                "stuck: a peer gone or elsewhere?); communicator aborted",
                be->name, what, be->deadline_s);
        }
        fsdp_nccl_pause(&poll);
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) {
            r = ncclInternalError;
        }
    }
    if (r != ncclSuccess) {
        nccl_what(w, n, what, sizeof(what));
        return fsdp_nccl_fail(be, fsdp_nccl_code(r),
                              "nccl backend: group %s: %s failed on host %s cuda:%d: %s (%s); "
                              "communicator aborted",
                              be->name, what, be->host, be->device, ncclGetErrorString(r),
                              ncclGetLastError(comm));
    }
    return 0;
}

static int nccl_record_done(struct fsdp_backend *be, struct nccl_work *w)
{
    cudaError_t ce = cudaEventRecord(w->done_ev, w->stream);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return fsdp_nccl_fail(be, FSDP_ERR_BACKEND,
                              "nccl backend: group %s: %s #%llu: recording its completion event "
                              "on cuda:%d failed: %s; communicator aborted",
                              be->name, w->call.op, (unsigned long long)w->seq, be->device,
                              cudaGetErrorString(ce));
    }
    return 0;
}

/* The communicator for an enqueue, with issue_mu held; NULL (and the
 * sticky error) once it failed. */
static ncclComm_t nccl_comm_for_issue(struct fsdp_backend *be, int *rc)
{
    *rc = fsdp_nccl_check_failed(be);
    if (*rc == 0 && be->comm == NULL) {
        *rc = fsdp_err(FSDP_ERR_ABORTED, "nccl backend: group %s: the communicator is closed",
                       be->name);
    }
    return *rc == 0 ? be->comm : NULL;
}

static void nccl_batch_settle(struct fsdp_backend *be, struct nccl_work *head, int rc)
{
    pthread_mutex_lock(&be->mu);
    for (struct nccl_work *w = head, *next; w != NULL; w = next) {
        next = w->next;
        w->next = NULL;
        w->state = rc < 0 ? NCCL_WORK_FAILED : NCCL_WORK_PENDING;
        w->rc = rc;
        if (w->orphan) {
            w->orphan = 0;
            fsdp_nccl_work_put_locked(be, w);
        }
    }
    pthread_mutex_unlock(&be->mu);
}

/*
 * With issue_mu held: the deferred send/recv go to NCCL as one group. The
 * handles stay DEFERRED (so that work_free can still drop one) until they
 * are settled; the batch list is detached first, so a send/recv issued
 * meanwhile starts the next batch.
 */
static int nccl_flush_locked(struct fsdp_backend *be)
{
    struct nccl_work *head;
    ncclComm_t comm;
    ncclResult_t r = ncclSuccess, r_end;
    double t = fsdp_now();
    int n = 0, rc;

    pthread_mutex_lock(&be->mu);
    head = be->batch_head;
    be->batch_head = be->batch_tail = NULL;
    pthread_mutex_unlock(&be->mu);
    if (head == NULL) {
        return 0;
    }
    comm = nccl_comm_for_issue(be, &rc);
    if (comm != NULL) {
        r_end = ncclGroupStart();
        for (struct nccl_work *w = head; w != NULL && r_end == ncclSuccess; w = w->next) {
            ncclResult_t ri = nccl_launch(comm, &w->call, w->stream);
            w->t_issue = t;
            n++;
            if (r == ncclSuccess && ri != ncclSuccess && ri != ncclInProgress) {
                r = ri;
            }
        }
        if (r_end == ncclSuccess) {
            r_end = ncclGroupEnd();
        }
        rc = nccl_wait_queued(be, comm, head, n, r != ncclSuccess ? r : r_end);
        for (struct nccl_work *w = head; w != NULL && rc == 0; w = w->next) {
            rc = nccl_record_done(be, w);
        }
    }
    nccl_batch_settle(be, head, rc);
    return rc;
}

/* With issue_mu held: one collective. */
static int nccl_launch_locked(struct fsdp_backend *be, struct nccl_work *w)
{
    ncclComm_t comm;
    int rc;

    FSDP_CHECK(nccl_flush_locked(be)); /* the batch was issued first */
    comm = nccl_comm_for_issue(be, &rc);
    if (comm == NULL) {
        return rc;
    }
    w->t_issue = fsdp_now();
    if (w->call.count > 0) {
        FSDP_CHECK(nccl_wait_queued(be, comm, w, 1, nccl_launch(comm, &w->call, w->stream)));
    }
    return nccl_record_done(be, w);
}

static int nccl_work_take(struct fsdp_backend *be, const struct nccl_call *c, cudaStream_t s,
                          enum nccl_work_state state, struct nccl_work **out)
{
    struct nccl_work *w = NULL;
    int rc;

    pthread_mutex_lock(&be->mu);
    rc = fsdp_nccl_check_failed(be);
    if (rc == 0) {
        rc = fsdp_nccl_work_get_locked(be, &w);
    }
    if (rc == 0) {
        w->call = *c;
        w->stream = s;
        w->state = state;
        if (state == NCCL_WORK_DEFERRED) {
            if (be->batch_tail) {
                be->batch_tail->next = w;
            } else {
                be->batch_head = w;
            }
            be->batch_tail = w;
        }
    }
    pthread_mutex_unlock(&be->mu);
    *out = w;
    return rc;
}

static void nccl_work_drop(struct fsdp_backend *be, struct nccl_work *w)
{
    pthread_mutex_lock(&be->mu);
    fsdp_nccl_work_put_locked(be, w);
    pthread_mutex_unlock(&be->mu);
}

static int nccl_submit(struct fsdp_backend *be, const struct nccl_call *c,
                       const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_work *w = NULL;
    cudaStream_t s;
    int rc;

    FSDP_CHECK(nccl_pick_stream(be, c->op, attr, &s));
    FSDP_CHECK(nccl_work_take(be, c, s, NCCL_WORK_PENDING, &w));
    pthread_mutex_lock(&be->issue_mu);
    rc = nccl_launch_locked(be, w);
    pthread_mutex_unlock(&be->issue_mu);
    if (rc < 0) {
        nccl_work_drop(be, w);
        fsdp_nccl_reap(be);
        return rc;
    }
    *work = &w->base;
    return 0;
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
    FSDP_CHECK(nccl_check_blocks(be, c.op, "recvbuf", recvbuf, "sendbuf", sendbuf, bytes));
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
    FSDP_CHECK(nccl_check_blocks(be, c.op, "sendbuf", sendbuf, "recvbuf", recvbuf, bytes));
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

/* Checked now, handed to NCCL with the rest of the batch later. */
static int nccl_p2p(struct fsdp_backend *be, const struct nccl_call *c,
                    const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_work *w = NULL;
    cudaStream_t s;

    FSDP_CHECK(nccl_check_call(be, c, attr, work));
    if (c->peer < 0 || c->peer >= be->size || c->peer == be->rank) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: %s peer %d must be another rank "
                        "of the group (0..%d, this is %d)", be->name, c->op, c->peer, be->size - 1,
                        be->rank);
    }
    FSDP_CHECK(nccl_check_ptr(be, c->op, "buf", c->kind == NCCL_SEND ? c->sendbuf : c->recvbuf,
                              c->count * fsdp_dtype_size(c->dtype)));
    FSDP_CHECK(nccl_pick_stream(be, c->op, attr, &s));
    FSDP_CHECK(nccl_work_take(be, c, s, NCCL_WORK_DEFERRED, &w));
    *work = &w->base;
    return 0;
}

static int nccl_send(struct fsdp_backend *be, const void *buf, size_t count, enum fsdp_dtype dtype,
                     int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_call c = {NCCL_SEND, "send", buf, NULL, count, dtype, FSDP_SUM, peer};
    return nccl_p2p(be, &c, attr, work);
}

static int nccl_recv(struct fsdp_backend *be, void *buf, size_t count, enum fsdp_dtype dtype,
                     int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct nccl_call c = {NCCL_RECV, "recv", NULL, buf, count, dtype, FSDP_SUM, peer};
    return nccl_p2p(be, &c, attr, work);
}

// ----------------------------------------------------------------------------
// work handles

static int nccl_work_failed_locked(struct nccl_work *w, int rc)
{
    w->state = NCCL_WORK_FAILED;
    w->rc = rc;
    return rc;
}

/* One look at the op, with mu held: *done = 1 once it has completed or failed. */
static int nccl_work_poll_locked(struct nccl_work *w, int *done)
{
    struct fsdp_backend *be = w->be;
    ncclResult_t st = ncclSuccess;
    char what[160];
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
    case NCCL_WORK_DEFERRED:
        /* its batch is being launched by another thread right now */
        *done = 0;
        return fsdp_nccl_check_failed(be);
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
                              be->name, be->host, be->device, w->call.op,
                              (unsigned long long)w->seq, cudaGetErrorString(ce)));
    }
    if (be->comm != NULL && ncclCommGetAsyncError(be->comm, &st) != ncclSuccess) {
        st = ncclInternalError;
    }
    if (st != ncclSuccess && st != ncclInProgress) {
        nccl_what(w, 1, what, sizeof(what));
        return nccl_work_failed_locked(
            w, fsdp_nccl_fail(be, fsdp_nccl_code(st),
                              "nccl backend: group %s: NCCL error while %s was pending: %s (%s); "
                              "communicator aborted",
                              be->name, what, ncclGetErrorString(st),
                              ncclGetLastError(be->comm)));
    }
    if (fsdp_now() - w->t_issue > be->deadline_s) {
        nccl_what(w, 1, what, sizeof(what));
        return nccl_work_failed_locked(
            w, fsdp_nccl_fail(be, FSDP_ERR_TIMEOUT,
                              "nccl backend: group %s: %s did not complete within %.1f s of being "
                              "issued (rank %d of %d, host %s cuda:%d; a member gone, stuck, or "
                              "in another collective?); communicator aborted",
                              be->name, what, be->deadline_s, be->rank, be->size, be->host,
                              be->device));
    }
    *done = 0;
    return 0;
}

static int nccl_work_test(struct fsdp_work *base, int *done)
{
    struct nccl_work *w = (struct nccl_work *)base;
    struct fsdp_backend *be;
    int rc, deferred;

    if (w == NULL || done == NULL) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: work_test needs a handle and a flag");
    }
    be = w->be;
    FSDP_CHECK(fsdp_nccl_device_use(be));
    pthread_mutex_lock(&be->mu);
    deferred = w->state == NCCL_WORK_DEFERRED;
    pthread_mutex_unlock(&be->mu);
    if (deferred) {
        pthread_mutex_lock(&be->issue_mu);
        (void)nccl_flush_locked(be); /* a failure lands in the handle's state */
        pthread_mutex_unlock(&be->issue_mu);
        fsdp_err_clear();
    }
    pthread_mutex_lock(&be->mu);
    rc = nccl_work_poll_locked(w, done);
    pthread_mutex_unlock(&be->mu);
    fsdp_nccl_reap(be);
    return rc;
}

static int nccl_work_wait(struct fsdp_work *base, double timeout_s)
{
    struct nccl_work *w = (struct nccl_work *)base;
    struct nccl_poll poll;
    double limit;

    if (w == NULL) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: work_wait needs a handle");
    }
    limit = timeout_s < 0 ? w->be->deadline_s : timeout_s;
    fsdp_nccl_poll_start(&poll);
    for (;;) {
        int done = 0;
        FSDP_CHECK(nccl_work_test(base, &done));
        if (done) {
            return 0;
        }
        if (fsdp_now() - poll.t0 >= limit) {
            char what[160];
            nccl_what(w, 1, what, sizeof(what));
            return fsdp_err(FSDP_ERR_TIMEOUT, "nccl backend: group %s: %s not complete after a "
                            "%.3f s wait; still pending", w->be->name, what, limit);
        }
        fsdp_nccl_pause(&poll);
    }
}

static void nccl_work_free(struct fsdp_work *base)
{
    struct nccl_work *w = (struct nccl_work *)base;
    struct fsdp_backend *be;

    if (w == NULL) {
        return;
    }
    be = w->be;
    pthread_mutex_lock(&be->mu);
    if (w->state == NCCL_WORK_DEFERRED) {
        /* never launched: leave the batch; one whose batch is being
         * launched right now goes back to the pool when the launch ends */
        struct nccl_work **pp = &be->batch_head, *prev = NULL;
        while (*pp != NULL && *pp != w) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp == w) {
            *pp = w->next;
            if (be->batch_tail == w) {
                be->batch_tail = prev;
            }
            w->next = NULL;
        } else {
            w->orphan = 1; /* nccl_batch_settle puts it back */
            pthread_mutex_unlock(&be->mu);
            return;
        }
    }
    fsdp_nccl_work_put_locked(be, w);
    pthread_mutex_unlock(&be->mu);
}

// ----------------------------------------------------------------------------
// the table

const struct fsdp_backend_ops fsdp_nccl_ops = {
    .size = sizeof(struct fsdp_backend_ops),
    .name = "nccl",
    .create = fsdp_nccl_create,         /* collective; bounded by the deadline */
    .destroy = fsdp_nccl_destroy,       /* finalize bounded by the timeout, else abort */
    .abort = fsdp_nccl_abort,           /* records the reason; ncclCommAbort on its own thread */
    .capabilities = fsdp_nccl_capabilities,
    .allreduce = nccl_allreduce,        /* CUDA memory; in place when recvbuf == sendbuf */
    .allgather = nccl_allgather,        /* in place when sendbuf == recvbuf + rank*count */
    .reduce_scatter = nccl_reduce_scatter, /* in place when recvbuf == sendbuf + rank*count */
    .broadcast = nccl_broadcast,        /* in place */
    .barrier = nccl_barrier,            /* one-element allreduce on the instance's scratch */
    .send = nccl_send,                  /* batched with recv; launched at the next */
    .recv = nccl_recv,                  /* collective, barrier, wait or test */
    .work_wait = nccl_work_wait,        /* polls event + async error; never past the deadline */
    .work_test = nccl_work_test,        /* non-blocking once launched */
    .work_free = nccl_work_free,        /* back to the pool */
    .mem_caps = FSDP_CAP_MEM_CUDA,      /* device memory only */
};
