/*
 * nccl_comm.c - the nccl backend's instance life cycle: which CUDA device a
 * process uses, the unique-id exchange through the rendezvous store, a
 * bounded communicator setup, the sticky failure state, abort, destroy, and
 * the pool of work handles (one CUDA event each, made once and reused).
 *
 * It owns no collective logic (nccl_ops.c) and never blocks without a
 * deadline: init, finalize and every poll loop end at be->timeout_s with an
 * error that names the group, and a failed communicator is aborted, never
 * waited on.
 */
#include "config.h"
#include "backends/nccl/nccl_be.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/store.h"

#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Used when the group gives no deadline. */
#define NCCL_DEFAULT_TIMEOUT_S 300.0
/* Work handles made at create; the pool grows when more are in flight. */
#define NCCL_POOL_INITIAL 16
/* How long abort() tries to take the lock before leaving the communicator
 * to the next lock holder (rounds of 1 ms). */
#define NCCL_ABORT_LOCK_ROUNDS 200

// ----------------------------------------------------------------------------
// small helpers

int fsdp_nccl_code(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return 0;
    case ncclInvalidArgument:
    case ncclInvalidUsage: return FSDP_ERR_INVALID;
    case ncclRemoteError: return FSDP_ERR_PEER;
    case ncclSystemError: return FSDP_ERR_SYSTEM;
    default: return FSDP_ERR_BACKEND;
    }
}

void fsdp_nccl_pause(unsigned *round)
{
    unsigned r = (*round)++;
    struct timespec ts = {0, 0};
    if (r < 128) {
        sched_yield(); /* short ops finish in microseconds: stay close */
        return;
    }
    ts.tv_nsec = r < 1024 ? 20000 : 200000;
    nanosleep(&ts, NULL);
}

int fsdp_nccl_device_enter(struct fsdp_backend *be, int *saved)
{
    int cur = -1;
    cudaError_t ce = cudaGetDevice(&cur);
    *saved = -1;
    if (ce != cudaSuccess) {
        return fsdp_err(FSDP_ERR_BACKEND, "nccl backend: group %s: cudaGetDevice failed: %s",
                        be->name, cudaGetErrorString(ce));
    }
    *saved = cur;
    if (cur != be->device) {
        ce = cudaSetDevice(be->device);
        if (ce != cudaSuccess) {
            return fsdp_err(FSDP_ERR_BACKEND,
                            "nccl backend: group %s: cudaSetDevice(%d) failed: %s", be->name,
                            be->device, cudaGetErrorString(ce));
        }
    }
    return 0;
}

void fsdp_nccl_device_leave(struct fsdp_backend *be, int saved)
{
    if (saved >= 0 && saved != be->device) {
        (void)cudaSetDevice(saved);
    }
}

// ----------------------------------------------------------------------------
// sticky failure state

__attribute__((format(printf, 3, 0))) static void nccl_vrecord(struct fsdp_backend *be, int code,
                                                               const char *fmt, va_list ap)
{
    int expect = 0;
    if (atomic_compare_exchange_strong(&be->fail_state, &expect, 1)) {
        vsnprintf(be->fail_msg, sizeof(be->fail_msg), fmt, ap);
        atomic_store(&be->fail_code, code);
        atomic_store(&be->fail_state, 2);
    }
    atomic_store(&be->abort_pending, 1);
}

__attribute__((format(printf, 3, 4))) static void nccl_record(struct fsdp_backend *be, int code,
                                                              const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    nccl_vrecord(be, code, fmt, ap);
    va_end(ap);
}

int fsdp_nccl_fail(struct fsdp_backend *be, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    nccl_vrecord(be, code, fmt, ap);
    va_end(ap);
    /* the first failure is what every caller reports, this one included */
    return fsdp_nccl_check_failed(be);
}

int fsdp_nccl_check_failed(struct fsdp_backend *be)
{
    int st = atomic_load(&be->fail_state);
    if (st == 0) {
        return 0;
    }
    /* state 1: another thread is formatting the message right now; it only
     * runs vsnprintf, so wait for it (bounded) rather than report a generic
     * reason */
    for (int spins = 0; st == 1 && spins < 100000; spins++) {
        sched_yield();
        st = atomic_load(&be->fail_state);
    }
    if (st == 2) {
        return fsdp_err(atomic_load(&be->fail_code), "%s", be->fail_msg);
    }
    return fsdp_err(FSDP_ERR_ABORTED, "nccl backend: group %s: the communicator is being aborted",
                    be->name);
}

static void nccl_reap(struct fsdp_backend *be, int quiet)
{
    ncclComm_t comm = be->comm;
    if (!atomic_load(&be->abort_pending) || comm == NULL) {
        return;
    }
    be->comm = NULL;
    if (!quiet) {
        /* the failure message already names the group and says "aborted" */
        if (atomic_load(&be->fail_state) == 2) {
            FSDP_WARN(FSDP_SUB_NCCL, "%s", be->fail_msg);
        } else {
            FSDP_WARN(FSDP_SUB_NCCL, "group %s: aborting the NCCL communicator", be->name);
        }
    }
    (void)ncclCommAbort(comm);
}

void fsdp_nccl_reap_locked(struct fsdp_backend *be)
{
    nccl_reap(be, 0);
}

void fsdp_nccl_abort(struct fsdp_backend *be, const char *why)
{
    if (be == NULL) {
        return;
    }
    /* no allocation and no logging: this may run in the job-abort path */
    nccl_record(be, FSDP_ERR_ABORTED, "nccl backend: group %s: communicator aborted: %s", be->name,
                why ? why : "no reason given");
    for (int i = 0; i < NCCL_ABORT_LOCK_ROUNDS; i++) {
        if (pthread_mutex_trylock(&be->mu) == 0) {
            nccl_reap(be, 1);
            pthread_mutex_unlock(&be->mu);
            return;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    /* A lock holder is stuck (or interrupted by this very signal): it sees
     * abort_pending on its next round, and destroy() aborts in any case. */
}

// ----------------------------------------------------------------------------
// work handle pool

static int nccl_work_new(struct fsdp_backend *be, struct nccl_work **out)
{
    struct nccl_work *w;
    cudaError_t ce;

    if (be->n_works == be->cap_works) {
        size_t cap = be->cap_works ? 2 * be->cap_works : NCCL_POOL_INITIAL;
        struct nccl_work **works = realloc(be->works, cap * sizeof(*works));
        if (works == NULL) {
            return fsdp_err(FSDP_ERR_NOMEM,
                            "nccl backend: group %s: no memory for %zu work handles", be->name,
                            cap);
        }
        be->works = works;
        be->cap_works = cap;
    }
    w = calloc(1, sizeof(*w));
    if (w == NULL) {
        return fsdp_err(FSDP_ERR_NOMEM, "nccl backend: group %s: no memory for a work handle",
                        be->name);
    }
    ce = cudaEventCreateWithFlags(&w->done_ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        free(w);
        return fsdp_err(FSDP_ERR_BACKEND,
                        "nccl backend: group %s: cudaEventCreate on cuda:%d failed: %s", be->name,
                        be->device, cudaGetErrorString(ce));
    }
    w->be = be;
    w->base.ops = &fsdp_nccl_ops;
    w->state = NCCL_WORK_FREE;
    be->works[be->n_works++] = w;
    *out = w;
    return 0;
}

int fsdp_nccl_work_get_locked(struct fsdp_backend *be, struct nccl_work **out)
{
    struct nccl_work *w = be->free_list;
    if (w == NULL) {
        FSDP_CHECK(nccl_work_new(be, &w));
    } else {
        be->free_list = w->next_free;
    }
    w->next_free = NULL;
    w->state = NCCL_WORK_PENDING;
    w->rc = 0;
    *out = w;
    return 0;
}

void fsdp_nccl_work_put_locked(struct fsdp_backend *be, struct nccl_work *w)
{
    if (w->state == NCCL_WORK_FREE) {
        return; /* freed twice: keep the free list a list */
    }
    w->state = NCCL_WORK_FREE;
    w->next_free = be->free_list;
    be->free_list = w;
}

// ----------------------------------------------------------------------------
// device choice

/* The launchers' local-rank variables, most specific first. */
static int nccl_env_local_rank(int *local)
{
    static const char *const vars[] = {"LOCAL_RANK", "MPI_LOCALRANKID",
                                       "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
    *local = -1;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *s = getenv(vars[i]);
        long long v;
        if (s == NULL || *s == '\0') {
            continue;
        }
        if (fsdp_parse_long(s, &v) < 0 || v < 0 || v > 1 << 20) {
            fsdp_err_clear();
            return fsdp_err(FSDP_ERR_INVALID, "nccl backend: %s='%s' is not a local rank", vars[i],
                            s);
        }
        *local = (int)v;
        return 0;
    }
    return 0;
}

static int nccl_pick_device(struct fsdp_backend *be, const struct fsdp_group_info *info)
{
    const char *pin = getenv("FSDPC_CUDA_DEVICE");
    int n = 0, local = info->local_rank;
    cudaError_t ce = cudaGetDeviceCount(&n);

    if (ce != cudaSuccess || n <= 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        (void)cudaGetLastError();
        return fsdp_err(
            FSDP_ERR_BACKEND,
            "nccl backend: no CUDA device visible on host %s (CUDA_VISIBLE_DEVICES=%s): %s",
            be->host, vis ? vis : "<unset>",
            ce != cudaSuccess ? cudaGetErrorString(ce) : "the device count is 0");
    }
    if (pin != NULL && *pin != '\0') {
        long long d;
        if (fsdp_parse_long(pin, &d) < 0 || d < 0 || d >= n) {
            fsdp_err_clear();
            return fsdp_err(FSDP_ERR_INVALID,
                            "nccl backend: FSDPC_CUDA_DEVICE='%s' is not a device of host %s "
                            "(%d visible: 0..%d)", pin, be->host, n, n - 1);
        }
        be->device = (int)d;
        return 0;
    }
    if (local < 0) {
        FSDP_CHECK(nccl_env_local_rank(&local));
    }
    if (local < 0) {
        local = 0; /* no launcher told us: a lone process */
    }
    if (local >= n) {
        FSDP_WARN(FSDP_SUB_NCCL, "group %s: local rank %d but %d CUDA device(s) on host %s: "
                  "processes share cuda:%d", be->name, local, n, be->host, local % n);
    }
    be->device = local % n;
    return 0;
}

// ----------------------------------------------------------------------------
// communicator setup

static int nccl_make_uid(struct fsdp_backend *be, ncclUniqueId *uid)
{
    ncclResult_t r = ncclGetUniqueId(uid);
    if (r != ncclSuccess) {
        return fsdp_err(fsdp_nccl_code(r),
                        "nccl backend: group %s: ncclGetUniqueId failed on host %s: "
                        "%s (%s)",
                        be->name, be->host, ncclGetErrorString(r), ncclGetLastError(NULL));
    }
    return 0;
}

/*
 * Rank 0 makes the id and publishes it; the others fetch it. The key carries
 * a generation (every member adds 1 to a counter per creation, and a
 * creation completes on no rank before all members added), so a group made
 * again after a failure never reads the id of the earlier communicator.
 */
static int nccl_exchange_uid(struct fsdp_backend *be, struct fsdp_store *store, ncclUniqueId *uid)
{
    char key[64], why[512];
    int64_t n = 0;
    void *val = NULL;
    size_t len = 0;
    int rc;

    memset(uid, 0, sizeof(*uid));
    if (be->size == 1) {
        return nccl_make_uid(be, uid);
    }
    rc = fsdp_store_add(store, "nccl/creates", 1, &n);
    if (rc < 0) {
        fsdp_err_take(why, sizeof(why));
        return fsdp_err(rc, "nccl backend: group %s: rendezvous store: %s", be->name, why);
    }
    snprintf(key, sizeof(key), "nccl/uid/%lld", (long long)((n - 1) / be->size));
    if (be->rank == 0) {
        FSDP_CHECK(nccl_make_uid(be, uid));
        rc = fsdp_store_set(store, key, uid, sizeof(*uid));
        if (rc < 0) {
            fsdp_err_take(why, sizeof(why));
            return fsdp_err(rc, "nccl backend: group %s: publishing the NCCL unique id: %s",
                            be->name, why);
        }
        return 0;
    }
    rc = fsdp_store_get(store, key, &val, &len, be->timeout_s);
    if (rc < 0) {
        fsdp_err_take(why, sizeof(why));
        return fsdp_err(rc,
                        "nccl backend: group %s: waiting %.1f s for the NCCL unique id of group "
                        "rank 0 (world rank %d): %s",
                        be->name, be->timeout_s, be->world_rank0, why);
    }
    if (len != sizeof(*uid)) {
        free(val);
        return fsdp_err(FSDP_ERR_FORMAT,
                        "nccl backend: group %s: the NCCL unique id from group rank 0 "
                        "has %zu bytes, expected %zu (another NCCL version there?)",
                        be->name, len, sizeof(*uid));
    }
    memcpy(uid, val, sizeof(*uid));
    free(val);
    return 0;
}

/* Non-blocking init, polled, so that a missing peer is a timeout, not a hang. */
static int nccl_comm_init(struct fsdp_backend *be, const ncclUniqueId *uid)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t comm = NULL;
    ncclResult_t r, st;
    double deadline = fsdp_now() + be->timeout_s;
    unsigned round = 0;
    char last[256];

    cfg.blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 20, 0)
    cfg.commName = be->name;
#endif
    r = ncclCommInitRankConfig(&comm, be->size, *uid, be->rank, &cfg);
    st = r;
    /* even an immediate ncclSuccess is confirmed by the async state */
    while (r == ncclSuccess || r == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) {
            st = ncclInternalError;
        }
        if (st != ncclInProgress) {
            break;
        }
        if (fsdp_now() > deadline) {
            (void)ncclCommAbort(comm);
            return fsdp_err(
                FSDP_ERR_TIMEOUT,
                "nccl backend: group %s: communicator setup did not finish within %.1f s "
                "(rank %d of %d, host %s, cuda:%d); is a member missing or stuck?",
                be->name, be->timeout_s, be->rank, be->size, be->host, be->device);
        }
        fsdp_nccl_pause(&round);
    }
    if (st != ncclSuccess) {
        snprintf(last, sizeof(last), "%s", ncclGetLastError(comm));
        (void)ncclCommAbort(comm);
        return fsdp_err(fsdp_nccl_code(st), "nccl backend: group %s: communicator setup failed "
                        "(rank %d of %d, host %s, cuda:%d): %s (%s)", be->name, be->rank, be->size,
                        be->host, be->device, ncclGetErrorString(st), last);
    }
    be->comm = comm;
    return 0;
}

/* Finalize (flushes queued work) bounded by the deadline; abort otherwise. */
static void nccl_comm_close_locked(struct fsdp_backend *be)
{
    ncclComm_t comm = be->comm;
    ncclResult_t r, st;
    double deadline = fsdp_now() + be->timeout_s;
    unsigned round = 0;

    be->comm = NULL;
    r = ncclCommFinalize(comm);
    st = r;
    while (r == ncclSuccess || r == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) {
            st = ncclInternalError;
        }
        if (st != ncclInProgress || atomic_load(&be->abort_pending) || fsdp_now() > deadline) {
            break;
        }
        fsdp_nccl_pause(&round);
    }
    if (st == ncclSuccess && !atomic_load(&be->abort_pending)) {
        (void)ncclCommDestroy(comm);
        return;
    }
    FSDP_WARN(FSDP_SUB_NCCL,
              "group %s: NCCL communicator did not finalize cleanly (%s); aborting it", be->name,
              st == ncclInProgress ? "timed out" : ncclGetErrorString(st));
    (void)ncclCommAbort(comm);
}

// ----------------------------------------------------------------------------
// CUDA resources owned by the instance

static void nccl_resources_destroy(struct fsdp_backend *be)
{
    for (size_t i = 0; i < be->n_works; i++) {
        (void)cudaEventDestroy(be->works[i]->done_ev);
        free(be->works[i]);
    }
    free(be->works);
    be->works = NULL;
    be->n_works = be->cap_works = 0;
    be->free_list = NULL;
    if (be->scratch) {
        (void)cudaFree(be->scratch);
        be->scratch = NULL;
    }
    if (be->dep_ev) {
        (void)cudaEventDestroy(be->dep_ev);
        be->dep_ev = NULL;
    }
    if (be->stream) {
        (void)cudaStreamDestroy(be->stream);
        be->stream = NULL;
    }
}

int fsdp_nccl_cuda_err(struct fsdp_backend *be, const char *what, cudaError_t ce)
{
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls start clean */
    return fsdp_err(FSDP_ERR_BACKEND, "nccl backend: group %s: %s on cuda:%d (host %s) failed: %s",
                    be->name, what, be->device, be->host, cudaGetErrorString(ce));
}

static int nccl_resources_create(struct fsdp_backend *be)
{
    cudaError_t ce;
    int rc;

    ce = cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        rc = fsdp_nccl_cuda_err(be, "cudaStreamCreate", ce);
        goto err;
    }
    ce = cudaEventCreateWithFlags(&be->dep_ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        rc = fsdp_nccl_cuda_err(be, "cudaEventCreate", ce);
        goto err;
    }
    ce = cudaMalloc((void **)&be->scratch, sizeof(*be->scratch));
    if (ce == cudaSuccess) {
        ce = cudaMemsetAsync(be->scratch, 0, sizeof(*be->scratch), be->stream);
    }
    if (ce != cudaSuccess) {
        rc = fsdp_nccl_cuda_err(be, "allocating the barrier scratch", ce);
        goto err;
    }
    for (int i = 0; i < NCCL_POOL_INITIAL; i++) {
        struct nccl_work *w;
        FSDP_CHECK_GOTO(nccl_work_new(be, &w), rc, err);
        w->next_free = be->free_list;
        be->free_list = w;
    }
    return 0;
err:
    nccl_resources_destroy(be);
    return rc;
}

// ----------------------------------------------------------------------------
// vtable entries: create, destroy, capabilities

static int nccl_check_info(const struct fsdp_group_info *info, struct fsdp_backend **out)
{
    if (info == NULL || out == NULL) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: create needs group info and an out pointer");
    }
    if (info->size < 1 || info->rank < 0 || info->rank >= info->size) {
        return fsdp_err(FSDP_ERR_INVALID, "nccl backend: group %s: rank %d is not in a group of %d",
                        info->name ? info->name : "?", info->rank, info->size);
    }
    if (info->size > 1 && info->store == NULL) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: group %s: a group of %d needs a rendezvous store",
                        info->name ? info->name : "?", info->size);
    }
    return 0;
}

int fsdp_nccl_create(const struct fsdp_group_info *info, struct fsdp_backend **out)
{
    struct fsdp_backend *be;
    ncclUniqueId uid;
    int saved = -1, version = 0, rc;

    FSDP_CHECK(nccl_check_info(info, out));
    *out = NULL;
    be = calloc(1, sizeof(*be));
    if (be == NULL) {
        return fsdp_err(FSDP_ERR_NOMEM, "nccl backend: no memory for a backend instance");
    }
    snprintf(be->name, sizeof(be->name), "%s", info->name ? info->name : "world");
    be->rank = info->rank;
    be->size = info->size;
    be->world_rank = info->world_rank;
    be->world_rank0 = info->world_ranks ? info->world_ranks[0] : 0;
    be->timeout_s = info->timeout_s > 0 ? info->timeout_s : NCCL_DEFAULT_TIMEOUT_S;
    if (gethostname(be->host, sizeof(be->host) - 1) != 0) {
        snprintf(be->host, sizeof(be->host), "?");
    }
    atomic_init(&be->fail_state, 0);
    atomic_init(&be->fail_code, 0);
    atomic_init(&be->abort_pending, 0);

    FSDP_CHECK_GOTO(nccl_pick_device(be, info), rc, err_0);
    if (pthread_mutex_init(&be->mu, NULL) != 0) {
        rc = fsdp_err(FSDP_ERR_SYSTEM, "nccl backend: group %s: pthread_mutex_init failed",
                      be->name);
        goto err_0;
    }
    FSDP_CHECK_GOTO(fsdp_nccl_device_enter(be, &saved), rc, err_1);
    FSDP_CHECK_GOTO(nccl_resources_create(be), rc, err_2);
    FSDP_CHECK_GOTO(nccl_exchange_uid(be, info->store, &uid), rc, err_3);
    FSDP_CHECK_GOTO(nccl_comm_init(be, &uid), rc, err_3);

    /* the chosen device stays current: the caller's allocations land on it */
    (void)ncclGetVersion(&version);
    FSDP_INFO(FSDP_SUB_NCCL, "group %s: rank %d of %d on host %s cuda:%d, NCCL %d.%d.%d",
              be->name, be->rank, be->size, be->host, be->device, version / 10000,
              version / 100 % 100, version % 100);
    *out = be;
    return 0;

err_3:
    nccl_resources_destroy(be);
err_2:
    fsdp_nccl_device_leave(be, saved);
err_1:
    pthread_mutex_destroy(&be->mu);
err_0:
    free(be);
    return rc;
}

void fsdp_nccl_destroy(struct fsdp_backend *be)
{
    int saved = -1;

    if (be == NULL) {
        return;
    }
    pthread_mutex_lock(&be->mu);
    if (fsdp_nccl_device_enter(be, &saved) < 0) {
        fsdp_err_clear(); /* nothing to report to: go on releasing */
    }
    nccl_reap(be, 0);
    if (be->comm != NULL) {
        nccl_comm_close_locked(be);
    }
    nccl_resources_destroy(be);
    fsdp_nccl_device_leave(be, saved);
    pthread_mutex_unlock(&be->mu);
    pthread_mutex_destroy(&be->mu);
    free(be);
}

void fsdp_nccl_capabilities(struct fsdp_backend *be, struct fsdp_backend_caps *caps)
{
    (void)be;
    caps->flags = FSDP_CAP_MEM_CUDA | FSDP_CAP_SEND_RECV | FSDP_CAP_ASYNC_PROGRESS;
    caps->dtypes = (1u << FSDP_F32) | (1u << FSDP_F16) | (1u << FSDP_BF16) | (1u << FSDP_I32) |
                   (1u << FSDP_I64) | (1u << FSDP_U8);
    caps->redops = (1u << FSDP_SUM) | (1u << FSDP_AVG) | (1u << FSDP_MAX) | (1u << FSDP_MIN);
}
