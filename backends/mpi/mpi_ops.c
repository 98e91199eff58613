/*
 * mpi_ops.c - the mpi collective backend: one MPI communicator per process
 * group, MPI nonblocking collectives behind fsdp work handles.
 *
 * Owns the communicator, the pool of work handles and the translation of
 * torch.distributed semantics onto MPI's (in-place conventions, AVG). It
 * never blocks on peers except inside create (MPI_Comm_create_group, which
 * is collective over the group's members only) and inside work_wait, which
 * polls MPI_Test until the deadline so that a dead peer is a timeout, never
 * a hang. abort() only marks the instance failed: killing the job is the
 * distribution layer's MPI_Abort.
 *
 * Cost per collective: one free-list pop, the MPI call, and on completion the
 * AVG divide. An in-place reduce-scatter on a rank other than 0 also moves
 * its block (1/size of the buffer), because MPI_IN_PLACE leaves the result at
 * the front of the buffer while torch expects it at the rank's own offset.
 */
#include "config.h"
#include "backends/mpi/mpi_priv.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

/* MPI 4 has large-count (MPI_Count) variants of every call used here; with
 * an older MPI, counts above INT_MAX are refused in mpibe_begin. */
#if MPI_VERSION >= 4
#define MPIBE_LARGE_COUNT 1
#else
#define MPIBE_LARGE_COUNT 0
#endif

/* MPI call fn for n elements: fn itself when n fits an int, else its
 * large-count form fn_c (the count arguments convert to the count type of
 * the one called); without MPI 4 such counts never get here (mpibe_begin). */
#if MPIBE_LARGE_COUNT
#define MPIBE_COUNTED(fn, n, ...) ((n) <= INT_MAX ? fn(__VA_ARGS__) : fn##_c(__VA_ARGS__))
#else
#define MPIBE_COUNTED(fn, n, ...) ((n) <= INT_MAX ? fn(__VA_ARGS__) : MPI_ERR_COUNT)
#endif

/* Point-to-point tag; collectives have their own matching context in MPI. */
#define MPIBE_P2P_TAG 7

/* work_wait polls MPI_Test (which is also what drives MPICH's progress):
 * back-to-back for the first MPIBE_SPIN_S, as MPI_Wait would; yielding the
 * core between tests until MPIBE_YIELD_S; then with short naps, so a rank
 * waiting a long time for a late peer does not starve the others. The first
 * MPIBE_FAST_TESTS tests do not even read the clock. */
#define MPIBE_FAST_TESTS 16
#define MPIBE_SPIN_S 50e-6
#define MPIBE_YIELD_S 1.0
#define MPIBE_NAP_NS 20000L

static inline struct mpibe *mpibe_of(struct fsdp_backend *b)
{
    return (struct mpibe *)(void *)b;
}

static inline struct mpibe_work *mpibe_work_of(struct fsdp_work *w)
{
    return (struct mpibe_work *)(void *)w;
}

// ----------------------------------------------------------------------------
// errors

/* Records an MPI failure: the instance is unusable from now on (sticky). */
static int mpibe_fail(struct mpibe *be, int mpirc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpirc, msg, &len) != MPI_SUCCESS) {
        len = 0;
    }
    msg[len] = '\0';
    snprintf(be->fail_msg, sizeof(be->fail_msg), "%s failed: %.200s", what, msg);
    be->failed = 1;
    return fsdp_err(FSDP_ERR_BACKEND, "mpi group %s: %s", be->name, be->fail_msg);
}

static inline int mpibe_is_aborted(const struct mpibe *be)
{
    return __atomic_load_n(&be->aborted, __ATOMIC_ACQUIRE);
}

/* The error a failed or aborted instance answers with, recorded again for
 * the caller (0 when the instance is usable). */
static int mpibe_unusable(const struct mpibe *be)
{
    if (mpibe_is_aborted(be)) {
        return fsdp_err(FSDP_ERR_ABORTED, "mpi group %s was aborted: %s", be->name,
                        be->abort_msg);
    }
    if (be->failed) {
        return fsdp_err(FSDP_ERR_BACKEND, "mpi group %s failed earlier: %s", be->name,
                        be->fail_msg);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// work handle pool

static int mpibe_slab_add(struct mpibe *be)
{
    struct mpibe_slab *s = calloc(1, sizeof(*s));
    if (!s) {
        return fsdp_err(FSDP_ERR_NOMEM, "mpi group %s: out of memory for work handles",
                        be->name);
    }
    s->next = be->slabs;
    be->slabs = s;
    for (int i = MPIBE_WORK_SLAB - 1; i >= 0; i--) {
        struct mpibe_work *w = &s->works[i];
        w->base.ops = &fsdp_mpi_ops;
        w->be = be;
        w->req = MPI_REQUEST_NULL;
        w->next = be->free_list;
        be->free_list = w;
    }
    return 0;
}

static void mpibe_slabs_free(struct mpibe *be)
{
    while (be->slabs) {
        struct mpibe_slab *s = be->slabs;
        be->slabs = s->next;
        free(s);
    }
    be->free_list = NULL;
}

/* Takes a handle for a new operation, after checking the instance and the
 * memory space. */
static int mpibe_begin(struct mpibe *be, const struct fsdp_coll_attr *attr, size_t count,
                       struct mpibe_work **out)
{
    if (__builtin_expect(be->failed || mpibe_is_aborted(be), 0)) {
        return mpibe_unusable(be);
    }
    if (!MPIBE_LARGE_COUNT && count > INT_MAX) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "mpi group %s: %zu elements exceed this MPI's int counts (MPI 4 lifts this)",
                        be->name, count);
    }
    if (attr && attr->mem != FSDP_MEM_HOST) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "mpi group %s: buffers must be host memory (this MPI is not CUDA-aware)",
                        be->name);
    }
    if (__builtin_expect(!be->free_list, 0)) {
        FSDP_CHECK(mpibe_slab_add(be));
    }
    struct mpibe_work *w = be->free_list;
    be->free_list = w->next;
    w->next = NULL;
    w->state = MPIBE_WORK_PENDING;
    w->rc = 0;
    w->req = MPI_REQUEST_NULL;
    w->avg_buf = NULL;
    w->move_bytes = 0;
    be->outstanding++;
    *out = w;
    return 0;
}

/* Hands the started operation to the caller, or undoes begin() when the MPI
 * call failed. */
static int mpibe_issue(struct mpibe *be, struct mpibe_work *w, int mpirc, const char *what,
                       struct fsdp_work **work)
{
    w->what = what;
    if (__builtin_expect(mpirc != MPI_SUCCESS, 0)) {
        w->state = MPIBE_WORK_FREE;
        w->next = be->free_list;
        be->free_list = w;
        be->outstanding--;
        return mpibe_fail(be, mpirc, what);
    }
    *work = &w->base;
    return 0;
}

static void mpibe_set_avg(struct mpibe_work *w, void *buf, size_t count, enum fsdp_dtype dtype)
{
    w->avg_buf = buf;
    w->avg_count = count;
    w->dtype = dtype;
}

// ----------------------------------------------------------------------------
// create, destroy, abort, capabilities

/* MPI is up, on this thread, with the job's world as its own. */
static int mpibe_check_world(const struct fsdp_group_info *info)
{
    int up = 0, down = 0, main_thread = 0, wrank = -1, wsize = 0;
    MPI_Initialized(&up);
    if (up) {
        MPI_Finalized(&down);
    }
    if (!up || down) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "the mpi backend needs an MPI launch (mpiexec/srun); "
                                              "use --backend tcp with --init env://");
    }
    MPI_Is_thread_main(&main_thread);
    if (!main_thread) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "mpi group %s: must be created on the thread that initialized MPI",
                        info->name);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (wsize != info->world_size || wrank != info->world_rank) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "the mpi backend needs MPI's world to be the job's world, but MPI has "
                        "rank %d of %d and the job rank %d of %d; launch with --init mpi or use "
                        "--backend tcp",
                        wrank, wsize, info->world_rank, info->world_size);
    }
    return 0;
}

static int mpibe_create(const struct fsdp_group_info *info, struct fsdp_backend **out)
{
    int rc, mpirc;
    FSDP_CHECK(mpibe_check_world(info));
    struct mpibe *be = calloc(1, sizeof(*be));
    if (!be) {
        return fsdp_err(FSDP_ERR_NOMEM, "mpi group %s: out of memory", info->name);
    }
    snprintf(be->name, sizeof(be->name), "%s", info->name);
    be->rank = info->rank;
    be->size = info->size;
    be->comm = MPI_COMM_NULL;
    FSDP_CHECK_GOTO(fsdp_mpi_types_acquire(), rc, err_free);
    fsdp_mpi_types_fill(be->types, be->ops);
    FSDP_CHECK_GOTO(mpibe_slab_add(be), rc, err_types);

    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    mpirc = MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    if (mpirc == MPI_SUCCESS) {
        mpirc = MPI_Group_incl(world_group, info->size, info->world_ranks, &group);
    }
    if (mpirc == MPI_SUCCESS) {
        /* The tag only separates concurrent creations by other threads; a
         * hash of the name keeps unrelated groups apart all the same. */
        int tag = (int)(fsdp_hash64(info->name, strlen(info->name), 0) & 0x7fff);
        mpirc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &be->comm);
    }
    if (group != MPI_GROUP_NULL) {
        MPI_Group_free(&group);
    }
    if (world_group != MPI_GROUP_NULL) {
        MPI_Group_free(&world_group);
    }
    if (mpirc != MPI_SUCCESS) {
        rc = mpibe_fail(be, mpirc, "MPI_Comm_create_group");
        goto err_slabs;
    }
    MPI_Comm_set_errhandler(be->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_name(be->comm, info->name);

    int crank = -1;
    MPI_Comm_rank(be->comm, &crank);
    if (crank != info->rank) {
        rc = fsdp_err(FSDP_ERR_INTERNAL, "mpi group %s: communicator rank %d, group rank %d",
                      info->name, crank, info->rank);
        goto err_comm;
    }
    FSDP_DEBUG(FSDP_SUB_MPI, "group %s: communicator of %d ranks, this is rank %d", info->name,
               info->size, info->rank);
    *out = (struct fsdp_backend *)(void *)be;
    return 0;

err_comm:
    MPI_Comm_free(&be->comm);
err_slabs:
    mpibe_slabs_free(be);
err_types:
    fsdp_mpi_types_release();
err_free:
    free(be);
    return rc;
}

static void mpibe_destroy(struct fsdp_backend *b)
{
    struct mpibe *be = mpibe_of(b);
    if (!be) {
        return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    /* MPI_Comm_free only marks the communicator: it neither waits for peers
     * nor for operations still in flight. */
    if (be->comm != MPI_COMM_NULL && !finalized) {
        MPI_Comm_free(&be->comm);
    }
    be->comm = MPI_COMM_NULL;
    fsdp_mpi_types_release();
    if (be->outstanding > 0) {
        /* Keep the handles valid: the last work_free releases the rest. */
        FSDP_WARN(FSDP_SUB_MPI, "group %s destroyed with %zu work handles not freed",
                  be->name, be->outstanding);
        be->destroyed = 1;
        return;
    }
    mpibe_slabs_free(be);
    free(be);
}

static void mpibe_abort(struct fsdp_backend *b, const char *why)
{
    struct mpibe *be = mpibe_of(b);
    if (mpibe_is_aborted(be)) {
        return;
    }
    /* no allocation, no MPI: this runs on the job-abort path */
    size_t n = 0;
    if (why) {
        while (why[n] && n + 1 < sizeof(be->abort_msg)) {
            be->abort_msg[n] = why[n];
            n++;
        }
    }
    be->abort_msg[n] = '\0';
    __atomic_store_n(&be->aborted, 1, __ATOMIC_RELEASE);
}

static void mpibe_capabilities(struct fsdp_backend *b, struct fsdp_backend_caps *caps)
{
    (void)b;
    caps->flags = FSDP_CAP_MEM_HOST | FSDP_CAP_SEND_RECV;
    caps->dtypes = (1u << FSDP_DTYPE_COUNT) - 1;
    caps->redops = (1u << FSDP_REDOP_COUNT) - 1;
}

// ----------------------------------------------------------------------------
// collectives

static int mpibe_allreduce(struct fsdp_backend *b, const void *sendbuf, void *recvbuf,
                           size_t count, enum fsdp_dtype dtype, enum fsdp_redop op,
                           const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct mpibe *be = mpibe_of(b);
    struct mpibe_work *w = NULL;
    FSDP_CHECK(mpibe_begin(be, attr, count, &w));
    const void *src = sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf;
    MPI_Datatype t = be->types[dtype];
    MPI_Op mop = be->ops[dtype][op];
    int mpirc =
        MPIBE_COUNTED(MPI_Iallreduce, count, src, recvbuf, count, t, mop, be->comm, &w->req);
    if (op == FSDP_AVG) {
        mpibe_set_avg(w, recvbuf, count, dtype);
    }
    return mpibe_issue(be, w, mpirc, "MPI_Iallreduce", work);
}

static int mpibe_allgather(struct fsdp_backend *b, const void *sendbuf, void *recvbuf,
                           size_t count, enum fsdp_dtype dtype, const struct fsdp_coll_attr *attr,
                           struct fsdp_work **work)
{
    struct mpibe *be = mpibe_of(b);
    struct mpibe_work *w = NULL;
    FSDP_CHECK(mpibe_begin(be, attr, count, &w));
    size_t esize = fsdp_dtype_size(dtype);
    int in_place = sendbuf == (const char *)recvbuf + (size_t)be->rank * count * esize;
    MPI_Datatype t = be->types[dtype];
    int mpirc;
    if (in_place) {
        mpirc = MPIBE_COUNTED(MPI_Iallgather, count, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recvbuf,
                              count, t, be->comm, &w->req);
    } else {
        mpirc = MPIBE_COUNTED(MPI_Iallgather, count, sendbuf, count, t, recvbuf, count, t, be->comm,
                              &w->req);
    }
    return mpibe_issue(be, w, mpirc, "MPI_Iallgather", work);
}

static int mpibe_reduce_scatter(struct fsdp_backend *b, const void *sendbuf, void *recvbuf,
                                size_t count, enum fsdp_dtype dtype, enum fsdp_redop op,
                                const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct mpibe *be = mpibe_of(b);
    struct mpibe_work *w = NULL;
    FSDP_CHECK(mpibe_begin(be, attr, count, &w));
    size_t bytes = count * fsdp_dtype_size(dtype);
    int in_place = recvbuf == (const char *)sendbuf + (size_t)be->rank * bytes;
    /* MPI_IN_PLACE reads size*count elements from recvbuf and leaves block
     * `rank` at its front; torch's in-place recvbuf is already that block. */
    void *mpi_recv = in_place ? (char *)recvbuf - (size_t)be->rank * bytes : recvbuf;
    const void *src = in_place ? MPI_IN_PLACE : sendbuf;
    MPI_Datatype t = be->types[dtype];
    MPI_Op mop = be->ops[dtype][op];
    int mpirc = MPIBE_COUNTED(MPI_Ireduce_scatter_block, count, src, mpi_recv, count, t, mop,
                              be->comm, &w->req);
    if (mpi_recv != recvbuf && bytes > 0) {
        w->move_dst = recvbuf;
        w->move_src = mpi_recv;
        w->move_bytes = bytes;
    }
    if (op == FSDP_AVG) {
        mpibe_set_avg(w, recvbuf, count, dtype);
    }
    return mpibe_issue(be, w, mpirc, "MPI_Ireduce_scatter_block", work);
}

static int mpibe_broadcast(struct fsdp_backend *b, void *buf, size_t count, enum fsdp_dtype dtype,
                           int root, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    struct mpibe *be = mpibe_of(b);
    struct mpibe_work *w = NULL;
    FSDP_CHECK(mpibe_begin(be, attr, count, &w));
    MPI_Datatype t = be->types[dtype];
    int mpirc = MPIBE_COUNTED(MPI_Ibcast, count, buf, count, t, root, be->comm, &w->req);
    return mpibe_issue(be, w, mpirc, "MPI_Ibcast", work);
}

static int mpibe_barrier(struct fsdp_backend *b, struct fsdp_work **work)
{
    struct mpibe *be = mpibe_of(b);
    struct mpibe_work *w = NULL;
    FSDP_CHECK(mpibe_begin(be, NULL, 0, &w));
    return mpibe_issue(be, w, MPI_Ibarrier(be->comm, &w->req), "MPI_Ibarrier", work);
}

/* One message to or from peer: MPI_Isend of sbuf when send is set, MPI_Irecv
 * into rbuf otherwise. */
static int mpibe_p2p(struct fsdp_backend *b, int send, const void *sbuf, void *rbuf, size_t count,
                     enum fsdp_dtype dtype, int peer, const struct fsdp_coll_attr *attr,
                     struct fsdp_work **work)
{
    struct mpibe *be = mpibe_of(b);
    struct mpibe_work *w = NULL;
    FSDP_CHECK(mpibe_begin(be, attr, count, &w));
    MPI_Datatype t = be->types[dtype];
    int mpirc = send ? MPIBE_COUNTED(MPI_Isend, count, sbuf, count, t, peer, MPIBE_P2P_TAG,
                                     be->comm, &w->req)
                     : MPIBE_COUNTED(MPI_Irecv, count, rbuf, count, t, peer, MPIBE_P2P_TAG,
                                     be->comm, &w->req);
    return mpibe_issue(be, w, mpirc, send ? "MPI_Isend" : "MPI_Irecv", work);
}

static int mpibe_send(struct fsdp_backend *b, const void *buf, size_t count, enum fsdp_dtype dtype,
                      int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    return mpibe_p2p(b, 1, buf, NULL, count, dtype, peer, attr, work);
}

static int mpibe_recv(struct fsdp_backend *b, void *buf, size_t count, enum fsdp_dtype dtype,
                      int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work)
{
    return mpibe_p2p(b, 0, NULL, buf, count, dtype, peer, attr, work);
}

// ----------------------------------------------------------------------------
// work handles

/* Applies the completion fix-ups once: the block move, then the AVG divide. */
static void mpibe_complete(struct mpibe_work *w)
{
    if (w->move_bytes) {
        memmove(w->move_dst, w->move_src, w->move_bytes);
    }
    if (w->avg_buf) {
        fsdp_scale_div(w->avg_buf, w->avg_count, w->dtype, w->be->size);
    }
    w->state = MPIBE_WORK_DONE;
    w->rc = 0;
}

/* The stored outcome of a finished handle, its message recorded again. */
static int mpibe_outcome(struct mpibe_work *w)
{
    if (w->rc == 0) {
        return 0;
    }
    if (w->rc == FSDP_ERR_ABORTED) {
        return fsdp_err(w->rc, "mpi group %s: %s aborted: %s", w->be->name, w->what,
                        w->be->abort_msg);
    }
    return fsdp_err(w->rc, "mpi group %s: %s", w->be->name, w->be->fail_msg);
}

/* One MPI_Test; *done once the handle has finished (successfully or not). */
static int mpibe_poll(struct mpibe_work *w, int *done)
{
    int flag = 0;
    int mpirc = MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE);
    if (__builtin_expect(mpirc != MPI_SUCCESS, 0)) {
        w->state = MPIBE_WORK_DONE;
        w->rc = mpibe_fail(w->be, mpirc, w->what);
        *done = 1;
        return w->rc;
    }
    if (flag) {
        mpibe_complete(w);
        *done = 1;
        return 0;
    }
    if (mpibe_is_aborted(w->be)) {
        /* The request stays with MPI (a collective request cannot be freed);
         * the job is going down and the handle may be reused. */
        w->state = MPIBE_WORK_DONE;
        w->rc = FSDP_ERR_ABORTED;
        *done = 1;
        return mpibe_outcome(w);
    }
    *done = 0;
    return 0;
}

static int mpibe_work_test(struct fsdp_work *work, int *done)
{
    struct mpibe_work *w = mpibe_work_of(work);
    if (w->state != MPIBE_WORK_PENDING) {
        *done = 1;
        return mpibe_outcome(w);
    }
    return mpibe_poll(w, done);
}

static int mpibe_work_wait(struct fsdp_work *work, double timeout_s)
{
    struct mpibe_work *w = mpibe_work_of(work);
    if (w->state != MPIBE_WORK_PENDING) {
        return mpibe_outcome(w);
    }
    /* a few tests before the clock is read: small operations finish here */
    int done = 0, rc;
    for (int i = 0; i < MPIBE_FAST_TESTS; i++) {
        rc = mpibe_poll(w, &done);
        if (done) {
            return rc;
        }
    }
    double t0 = fsdp_now();
    for (;;) {
        rc = mpibe_poll(w, &done);
        if (done) {
            return rc;
        }
        double waited = fsdp_now() - t0;
        if (waited >= timeout_s) {
            return fsdp_err(FSDP_ERR_TIMEOUT,
                            "mpi group %s: %s not complete after %.1f s (a peer is late, stuck "
                            "or gone)",
                            w->be->name, w->what, waited);
        }
        if (waited < MPIBE_SPIN_S) {
            continue;
        }
        if (waited < MPIBE_YIELD_S) {
            sched_yield();
        } else {
            struct timespec nap = {0, MPIBE_NAP_NS};
            nanosleep(&nap, NULL);
        }
    }
}

static void mpibe_work_free(struct fsdp_work *work)
{
    struct mpibe_work *w = mpibe_work_of(work);
    if (!w || w->state == MPIBE_WORK_FREE) {
        return;
    }
    struct mpibe *be = w->be;
    if (w->state == MPIBE_WORK_PENDING && !mpibe_is_aborted(be)) {
        /* MPI forbids freeing a collective's request; it completes on its
         * own, into buffers the caller must keep. */
        FSDP_WARN(FSDP_SUB_MPI, "group %s: freeing a pending %s handle", be->name, w->what);
    }
    w->state = MPIBE_WORK_FREE;
    w->req = MPI_REQUEST_NULL;
    w->next = be->free_list;
    be->free_list = w;
    be->outstanding--;
    if (be->destroyed && be->outstanding == 0) {
        mpibe_slabs_free(be);
        free(be);
    }
}

// ----------------------------------------------------------------------------

const struct fsdp_backend_ops fsdp_mpi_ops = {
    .size = sizeof(struct fsdp_backend_ops),
    .name = "mpi",
    .create = mpibe_create,
    .destroy = mpibe_destroy,
    .abort = mpibe_abort,
    .capabilities = mpibe_capabilities,
    .allreduce = mpibe_allreduce,
    .allgather = mpibe_allgather,
    .reduce_scatter = mpibe_reduce_scatter,
    .broadcast = mpibe_broadcast,
    .barrier = mpibe_barrier,
    .send = mpibe_send,
    .recv = mpibe_recv,
    .work_wait = mpibe_work_wait,
    .work_test = mpibe_work_test,
    .work_free = mpibe_work_free,
    .mem_caps = FSDP_CAP_MEM_HOST,
};
