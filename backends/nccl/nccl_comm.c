/*
 * nccl_comm.c - the nccl backend's instance life cycle: which CUDA device a
 * process uses, the unique-id exchange through the rendezvous store, a
 * bounded communicator setup, the sticky failure state, the abort thread,
 * destroy, the pool of work handles (one CUDA event each, made once and
 * reused), and the polling back-off.
 *
 * It owns no collective logic (nccl_ops.c) and never blocks without a
 * deadline: init, finalize and every poll loop end at the instance's
 * deadline with an error that names the group. A failed communicator is
 * aborted on a thread of its own (ncclCommAbort may wait for kernels of
 * other groups), never waited on by a caller.
 */
#include "config.h"
#include "backends/nccl/nccl_be.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/store.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Used when the group gives no deadline. */
#define NCCL_DEFAULT_TIMEOUT_S 300.0
/* The group layer's deadline until the first step (FSDPC_INIT_TIMEOUT unset). */
#define NCCL_DEFAULT_INIT_TIMEOUT_S 600.0
/* Work handles made at create; the pool grows when more are in flight. */
#define NCCL_POOL_INITIAL 16
/* Polling: spin this long, then yield until NCCL_YIELD_S, then sleep from
 * NCCL_SLEEP_MIN_NS doubling up to NCCL_SLEEP_MAX_NS. */
#define NCCL_SPIN_S 50e-6
#define NCCL_YIELD_S 1e-3
#define NCCL_SLEEP_MIN_NS 20000L
#define NCCL_SLEEP_MAX_NS 500000L
/* How long destroy waits for a running abort before leaving it to finish
 * on its own thread (it may wait for another group's kernels). */
#define NCCL_ABORT_WAIT_S 10.0

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

int fsdp_nccl_cuda_usage_error(cudaError_t ce)
{
    switch (ce) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
        return 1;
    default:
        return 0;
    }
}

static void nccl_cpu_relax(void)
{
    for (int i = 0; i < 32; i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#else
        __asm__ __volatile__("" ::: "memory");
#endif
    }
}

void fsdp_nccl_poll_start(struct nccl_poll *p)
{
    p->t0 = fsdp_now();
    p->sleep_ns = NCCL_SLEEP_MIN_NS;
}

enum nccl_pause fsdp_nccl_pause_plan(struct nccl_poll *p, double elapsed, long *sleep_ns)
{
    *sleep_ns = 0;
    if (elapsed < NCCL_SPIN_S) {
        return NCCL_PAUSE_SPIN; /* a small op ends here: no system call at all */
    }
    if (elapsed < NCCL_YIELD_S) {
        return NCCL_PAUSE_YIELD;
    }
    *sleep_ns = p->sleep_ns;
    p->sleep_ns = p->sleep_ns >= NCCL_SLEEP_MAX_NS / 2 ? NCCL_SLEEP_MAX_NS : 2 * p->sleep_ns;
    return NCCL_PAUSE_SLEEP;
}

void fsdp_nccl_pause(struct nccl_poll *p)
{
    long ns = 0;
    switch (fsdp_nccl_pause_plan(p, fsdp_now() - p->t0, &ns)) {
    case NCCL_PAUSE_SPIN: nccl_cpu_relax(); break;
    case NCCL_PAUSE_YIELD: sched_yield(); break;
    case NCCL_PAUSE_SLEEP: {
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        break;
    }
    }
}

int fsdp_nccl_device_use(struct fsdp_backend *be)
{
    int cur = -1;
    cudaError_t ce = cudaGetDevice(&cur);
    if (ce == cudaSuccess && cur == be->device) {
        return 0;
    }
    ce = cudaSetDevice(be->device);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return fsdp_err(FSDP_ERR_BACKEND, "nccl backend: group %s: cudaSetDevice(%d) failed: %s",
                        be->name, be->device, cudaGetErrorString(ce));
    }
    return 0;
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

// ----------------------------------------------------------------------------
// the abort thread

/* Shared by the instance and its abort thread; the last one out frees it,
 * so destroy can leave an abort that waits for another group's kernels. */
struct nccl_reaper {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int taken; /* the thread has taken the communicator: it no longer touches the instance */
    int done;  /* ncclCommAbort returned */
    int device;
    struct fsdp_backend *be;
};

static void nccl_reaper_put(struct nccl_reaper *r)
{
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) {
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
    }
}

static void nccl_reaper_mark(struct nccl_reaper *r, int *flag)
{
    pthread_mutex_lock(&r->mu);
    *flag = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void *nccl_reaper_main(void *arg)
{
    struct nccl_reaper *r = arg;
    struct fsdp_backend *be = r->be;
    ncclComm_t comm;
    char msg[sizeof(be->fail_msg)] = "";
    int quiet;

    (void)cudaSetDevice(r->device); /* this thread's only device */
    /* issuers drop issue_mu within one poll once abort_pending is set */
    pthread_mutex_lock(&be->issue_mu);
    pthread_mutex_lock(&be->mu);
    comm = be->comm;
    be->comm = NULL;
    pthread_mutex_unlock(&be->mu);
    pthread_mutex_unlock(&be->issue_mu);
    quiet = atomic_load(&be->fail_state) == 2 && atomic_load(&be->fail_code) == FSDP_ERR_ABORTED;
    if (atomic_load(&be->fail_state) == 2) {
        snprintf(msg, sizeof(msg), "%s", be->fail_msg);
    } else {
        snprintf(msg, sizeof(msg), "group %s: aborting the NCCL communicator", be->name);
    }
    nccl_reaper_mark(r, &r->taken);
    /* an abort asked for by the caller is the caller's to report; a failure
     * the backend found itself is reported here, once */
    if (comm != NULL && !quiet) {
        FSDP_WARN(FSDP_SUB_NCCL, "%s", msg);
    }
    if (comm != NULL) {
        (void)ncclCommAbort(comm);
    }
    nccl_reaper_mark(r, &r->done);
    nccl_reaper_put(r);
    return NULL;
}

void fsdp_nccl_reap(struct fsdp_backend *be)
{
    struct nccl_reaper *r;
    pthread_t tid;

    if (!atomic_load(&be->abort_pending) || atomic_exchange(&be->reaper_started, 1)) {
        return;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL || pthread_mutex_init(&r->mu, NULL) != 0) {
        free(r);
        r = NULL;
    } else if (pthread_cond_init(&r->cv, NULL) != 0) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        r = NULL;
    }
    if (r == NULL) {
        /* no memory for the thread's state: abort here, which may wait */
        struct nccl_reaper local = {.device = be->device, .be = be, .refs = 2};
        pthread_mutex_init(&local.mu, NULL);
        pthread_cond_init(&local.cv, NULL);
        nccl_reaper_main(&local);
        pthread_cond_destroy(&local.cv);
        pthread_mutex_destroy(&local.mu);
        return;
    }
    r->refs = 2;
    r->device = be->device;
    r->be = be;
    pthread_mutex_lock(&be->mu);
    be->reaper = r;
    pthread_mutex_unlock(&be->mu);
    if (fsdp_thread_start(&tid, nccl_reaper_main, r) != 0) {
        nccl_reaper_main(r); /* no thread: abort here, which may wait */
        return;
    }
    pthread_detach(tid);
}

void fsdp_nccl_abort(struct fsdp_backend *be, const char *why)
{
    if (be == NULL) {
        return;
    }
    nccl_record(be, FSDP_ERR_ABORTED, "nccl backend: group %s: communicator aborted: %s", be->name,
                why ? why : "no reason given");
    fsdp_nccl_reap(be);
}

/* destroy: wait until the abort thread has left the instance, then at most
 * NCCL_ABORT_WAIT_S for ncclCommAbort to return. */
static void nccl_reaper_release(struct fsdp_backend *be)
{
    struct nccl_reaper *r;
    struct timespec until;
    double wait_s = be->timeout_s < NCCL_ABORT_WAIT_S ? be->timeout_s : NCCL_ABORT_WAIT_S;
    int timed_out = 0;

    pthread_mutex_lock(&be->mu);
    r = be->reaper;
    be->reaper = NULL;
    pthread_mutex_unlock(&be->mu);
    if (r == NULL) {
        return;
    }
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)wait_s;
    until.tv_nsec += (long)((wait_s - (double)(time_t)wait_s) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    while (!r->taken) {
        pthread_cond_wait(&r->cv, &r->mu); /* the lock holders it waits for are bounded */
    }
    while (!r->done && !timed_out) {
        timed_out = pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT;
    }
    pthread_mutex_unlock(&r->mu);
    if (timed_out) {
        FSDP_WARN(FSDP_SUB_NCCL, "group %s: ncclCommAbort still running after %.1f s (waiting for "
                  "kernels queued behind another group's?); leaving it to finish on its own thread",
                  be->name, wait_s);
    }
    nccl_reaper_put(r);
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
        return fsdp_nccl_cuda_err(be, "cudaEventCreate", ce);
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
        be->free_list = w->next;
    }
    w->next = NULL;
    w->state = NCCL_WORK_PENDING;
    w->orphan = 0;
    w->rc = 0;
    w->seq = ++be->seq;
    w->t_issue = fsdp_now();
    *out = w;
    return 0;
}

void fsdp_nccl_work_put_locked(struct fsdp_backend *be, struct nccl_work *w)
{
    if (w->state == NCCL_WORK_FREE) {
        return; /* freed twice: keep the free list a list */
    }
    w->state = NCCL_WORK_FREE;
    w->next = be->free_list;
    be->free_list = w;
}

// ----------------------------------------------------------------------------
// environment and device choice

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
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0, local = info->local_rank;
    cudaError_t ce = cudaGetDeviceCount(&n);

    if (ce != cudaSuccess || n <= 0) {
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
    if (local >= n && n == 1 && vis != NULL && *vis != '\0') {
        /* the launcher gave each process its own GPU (--gpus-per-task=1 and
         * the like): cuda:0 is a different device in every process */
        FSDP_DEBUG(FSDP_SUB_NCCL, "group %s: local rank %d sees one device "
                   "(CUDA_VISIBLE_DEVICES=%s): cuda:0", be->name, local, vis);
    } else if (local >= n) {
        FSDP_WARN(FSDP_SUB_NCCL, "group %s: local rank %d but %d CUDA device(s) on host %s: "
                  "processes share cuda:%d", be->name, local, n, be->host, local % n);
    }
    be->device = local % n;
    return 0;
}

/* NCCL_COMM_BLOCKING=1 overrides config.blocking = 0: init and every enqueue
 * would then block inside NCCL with no deadline. NCCL reads it as a C
 * integer (strtoll, base 0). */
static int nccl_check_blocking_env(struct fsdp_backend *be, const char *when)
{
    const char *s = getenv("NCCL_COMM_BLOCKING");
    char *end = NULL;
    long long v;

    if (s == NULL || *s == '\0') {
        return 0;
    }
    errno = 0;
    v = strtoll(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || v != 1) {
        return 0; /* NCCL ignores it */
    }
    return fsdp_err(FSDP_ERR_INVALID,
                    "nccl backend: group %s: NCCL_COMM_BLOCKING='%s'%s makes NCCL block without "
                    "a deadline (a missing peer hangs the job, and abort cannot reach it); "
                    "unset it: the nccl backend needs non-blocking communicators",
                    be->name, s, when);
}

/* The group layer allows FSDPC_INIT_TIMEOUT (default 600 s) until the first
 * step: the backend must not give up earlier. */
static int nccl_set_deadline(struct fsdp_backend *be, double timeout_s)
{
    double init = fsdp_env_double("FSDPC_INIT_TIMEOUT", 0);
    if (init < 0) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "nccl backend: FSDPC_INIT_TIMEOUT=%g: expected seconds > 0", init);
    }
    be->timeout_s = timeout_s > 0 ? timeout_s : NCCL_DEFAULT_TIMEOUT_S;
    if (init == 0) {
        init = NCCL_DEFAULT_INIT_TIMEOUT_S;
    }
    be->deadline_s = init > be->timeout_s ? init : be->timeout_s;
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
    rc = fsdp_store_get(store, key, &val, &len, be->deadline_s);
    if (rc < 0) {
        fsdp_err_take(why, sizeof(why));
        return fsdp_err(rc,
                        "nccl backend: group %s: waiting %.1f s for the NCCL unique id of group "
                        "rank 0 (world rank %d): %s",
                        be->name, be->deadline_s, be->world_rank0, why);
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
    double deadline = fsdp_now() + be->deadline_s;
    struct nccl_poll poll;
    char last[256];

    cfg.blocking = 0;
#if NCCL_HAVE_COMM_NAME
    cfg.commName = be->name;
#endif
    fsdp_nccl_poll_start(&poll);
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
                be->name, be->deadline_s, be->rank, be->size, be->host, be->device);
        }
        fsdp_nccl_pause(&poll);
    }
    if (st != ncclSuccess) {
        snprintf(last, sizeof(last), "%s", ncclGetLastError(comm));
        (void)ncclCommAbort(comm);
        return fsdp_err(fsdp_nccl_code(st), "nccl backend: group %s: communicator setup failed "
                        "(rank %d of %d, host %s, cuda:%d): %s (%s)", be->name, be->rank, be->size,
                        be->host, be->device, ncclGetErrorString(st), last);
    }
    /* NCCL has read its configuration file into the environment by now */
    if (nccl_check_blocking_env(be, " (from the NCCL configuration file)") < 0) {
        (void)ncclCommAbort(comm);
        return FSDP_ERR_INVALID;
    }
    be->comm = comm;
    return 0;
}

/* With issue_mu held, on a healthy communicator: finalize (flushes queued
 * work) bounded by the group deadline, then destroy. On failure the
 * communicator stays for the abort thread. */
static void nccl_comm_close_locked(struct fsdp_backend *be)
{
    ncclComm_t comm = be->comm;
    ncclResult_t r, st;
    double deadline = fsdp_now() + be->timeout_s;
    struct nccl_poll poll;

    fsdp_nccl_poll_start(&poll);
    r = ncclCommFinalize(comm);
    st = r;
    while (r == ncclSuccess || r == ncclInProgress) {
        if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) {
            st = ncclInternalError;
        }
        if (st != ncclInProgress || atomic_load(&be->abort_pending) || fsdp_now() > deadline) {
            break;
        }
        fsdp_nccl_pause(&poll);
    }
    if (st == ncclSuccess && !atomic_load(&be->abort_pending)) {
        pthread_mutex_lock(&be->mu);
        be->comm = NULL;
        pthread_mutex_unlock(&be->mu);
        (void)ncclCommDestroy(comm);
        return;
    }
    nccl_record(be, st == ncclInProgress ? FSDP_ERR_TIMEOUT : fsdp_nccl_code(st),
                "nccl backend: group %s: NCCL communicator did not finalize cleanly (%s); "
                "aborting it", be->name,
                st == ncclInProgress ? "timed out" : ncclGetErrorString(st));
}

// ----------------------------------------------------------------------------
// CUDA resources owned by the instance

/* Never synchronises the device: a kernel of another group stuck on it
 * would make destroy wait for ever. Events and streams are released by
 * CUDA once their work is done; the scratch goes back to the stream-ordered
 * pool, or, on a device without one, stays allocated until the process
 * ends (4 bytes: cudaFree would synchronise the device). */
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
    be->batch_head = be->batch_tail = NULL;
    if (be->scratch != NULL && be->scratch_pooled) {
        (void)cudaFreeAsync(be->scratch, be->stream);
    }
    be->scratch = NULL;
    if (be->stream) {
        (void)cudaStreamDestroy(be->stream);
        be->stream = NULL;
    }
    (void)cudaGetLastError();
}

int fsdp_nccl_cuda_err(struct fsdp_backend *be, const char *what, cudaError_t ce)
{
    (void)cudaGetLastError(); /* clear a non-sticky error so later calls start clean */
    return fsdp_err(FSDP_ERR_BACKEND, "nccl backend: group %s: %s on cuda:%d (host %s) failed: %s",
                    be->name, what, be->device, be->host, cudaGetErrorString(ce));
}

static int nccl_scratch_create(struct fsdp_backend *be)
{
    int pools = 0;
    cudaError_t ce;

    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, be->device) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        pools = 0;
    }
    if (pools) {
        ce = cudaMallocAsync((void **)&be->scratch, sizeof(*be->scratch), be->stream);
        be->scratch_pooled = ce == cudaSuccess;
    } else {
        ce = cudaMalloc((void **)&be->scratch, sizeof(*be->scratch));
    }
    if (ce == cudaSuccess) {
        ce = cudaMemsetAsync(be->scratch, 0, sizeof(*be->scratch), be->stream);
    }
    if (ce != cudaSuccess) {
        return fsdp_nccl_cuda_err(be, "allocating the barrier scratch", ce);
    }
    return 0;
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
    FSDP_CHECK_GOTO(nccl_scratch_create(be), rc, err);
    for (int i = 0; i < NCCL_POOL_INITIAL; i++) {
        struct nccl_work *w;
        FSDP_CHECK_GOTO(nccl_work_new(be, &w), rc, err);
        w->next = be->free_list;
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
    int version = 0, rc;

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
    if (gethostname(be->host, sizeof(be->host) - 1) != 0) {
        snprintf(be->host, sizeof(be->host), "?");
    }
    atomic_init(&be->fail_state, 0);
    atomic_init(&be->fail_code, 0);
    atomic_init(&be->abort_pending, 0);
    atomic_init(&be->reaper_started, 0);

    FSDP_CHECK_GOTO(nccl_set_deadline(be, info->timeout_s), rc, err_0);
    FSDP_CHECK_GOTO(nccl_check_blocking_env(be, ""), rc, err_0);
    FSDP_CHECK_GOTO(nccl_pick_device(be, info), rc, err_0);
    if (pthread_mutex_init(&be->mu, NULL) != 0) {
        rc = fsdp_err(FSDP_ERR_SYSTEM, "nccl backend: group %s: pthread_mutex_init failed",
                      be->name);
        goto err_0;
    }
    if (pthread_mutex_init(&be->issue_mu, NULL) != 0) {
        rc = fsdp_err(FSDP_ERR_SYSTEM, "nccl backend: group %s: pthread_mutex_init failed",
                      be->name);
        goto err_1;
    }
    /* the chosen device stays current: the caller's allocations land on it */
    FSDP_CHECK_GOTO(fsdp_nccl_device_use(be), rc, err_2);
    FSDP_CHECK_GOTO(nccl_resources_create(be), rc, err_2);
    FSDP_CHECK_GOTO(nccl_exchange_uid(be, info->store, &uid), rc, err_3);
    FSDP_CHECK_GOTO(nccl_comm_init(be, &uid), rc, err_3);

    (void)ncclGetVersion(&version);
    FSDP_INFO(FSDP_SUB_NCCL, "group %s: rank %d of %d on host %s cuda:%d, NCCL %d.%d.%d",
              be->name, be->rank, be->size, be->host, be->device, version / 10000,
              version / 100 % 100, version % 100);
    *out = be;
    return 0;

err_3:
    nccl_resources_destroy(be);
err_2:
    pthread_mutex_destroy(&be->issue_mu);
err_1:
    pthread_mutex_destroy(&be->mu);
err_0:
    free(be);
    return rc;
}

void fsdp_nccl_destroy(struct fsdp_backend *be)
{
    if (be == NULL) {
        return;
    }
    if (fsdp_nccl_device_use(be) < 0) {
        fsdp_err_clear(); /* nothing to report to: go on releasing */
    }
    pthread_mutex_lock(&be->issue_mu);
    pthread_mutex_lock(&be->mu);
    be->batch_head = be->batch_tail = NULL; /* send/recv never launched: nothing to flush */
    pthread_mutex_unlock(&be->mu);
    if (be->comm != NULL && !atomic_load(&be->abort_pending)) {
        nccl_comm_close_locked(be);
    }
    pthread_mutex_unlock(&be->issue_mu);
    fsdp_nccl_reap(be);
    nccl_reaper_release(be);
    nccl_resources_destroy(be);
    pthread_mutex_destroy(&be->issue_mu);
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
