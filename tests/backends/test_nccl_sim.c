/*
 * test_nccl_sim.c - the nccl backend's control logic on any machine.
 *
 * This program links the backend's sources against a small simulation of
 * the CUDA runtime and NCCL calls it uses (nccl_sim.c), not the real
 * libraries, so that the parts a GPU test rarely reaches run everywhere:
 * device choice, the non-blocking init and its deadline, ncclInProgress on
 * enqueue, dtype/op mapping, stream choice, short waits, the backend
 * deadline, asynchronous NCCL and CUDA errors, abort from another thread,
 * the work-handle pool, destroy with and without a clean finalize, and the
 * unique-id exchange through the store. Data movement is the one-rank copy;
 * the real collectives are test_nccl's job on a GPU machine.
 */
#include "config.h"
#include "backends/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "rendezvous/store.h"
#include "tests/backends/nccl_sim.h"
#include "tests/tap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIAG_LEN 512

// ----------------------------------------------------------------------------
// checks

static const struct fsdp_backend_ops *const ops = &fsdp_nccl_ops;
static const int ranks4[4] = {0, 1, 2, 3};

/* Fails the check with a message and jumps to its cleanup. */
#define EXPECT(cond, ...)                          \
    do {                                           \
        if (!(cond)) {                             \
            snprintf(diag, DIAG_LEN, __VA_ARGS__); \
            goto out;                              \
        }                                          \
    } while (0)

static struct fsdp_backend *make(int local_rank, double timeout_s, char *diag)
{
    struct fsdp_group_info info = {.name = "sim[0]", .rank = 0, .size = 1, .world_ranks = ranks4,
                                   .world_rank = 0, .world_size = 1, .timeout_s = timeout_s,
                                   .local_rank = local_rank};
    struct fsdp_backend *be = NULL;
    int rc = ops->create(&info, &be);
    if (rc < 0) {
        snprintf(diag, DIAG_LEN, "create: %s (%s)", fsdp_err_msg(), fsdp_strerror(rc));
        fsdp_err_clear();
        return NULL;
    }
    return be;
}

/* create must fail with code and a message containing want. */
static int create_fails(int local_rank, int code, const char *want, char *diag)
{
    struct fsdp_group_info info = {.name = "sim[0]", .rank = 0, .size = 1, .world_ranks = ranks4,
                                   .timeout_s = 5.0, .local_rank = local_rank};
    struct fsdp_backend *be = NULL;
    int rc;
    fsdp_err_clear();
    rc = ops->create(&info, &be);
    if (rc != code || be != NULL || strstr(fsdp_err_msg(), want) == NULL) {
        snprintf(diag, DIAG_LEN, "create: rc %d (want %d), message '%s' (want '%s')", rc, code,
                 fsdp_err_msg(), want);
        if (be) {
            ops->destroy(be);
        }
        fsdp_err_clear();
        return 0;
    }
    tap_diag("refused as expected: %s", fsdp_err_msg());
    fsdp_err_clear();
    return 1;
}

static int allreduce(struct fsdp_backend *be, void *buf, size_t n, cudaStream_t s,
                     struct fsdp_work **w)
{
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, s};
    *w = NULL;
    return ops->allreduce(be, buf, buf, n, FSDP_F32, FSDP_SUM, &attr, w);
}

static int check_no_device(char *diag)
{
    sim_ndev = 0;
    return create_fails(0, FSDP_ERR_BACKEND, "no CUDA device visible on host", diag);
}

static int check_device_choice(char *diag)
{
    struct fsdp_backend *be = NULL;
    struct fsdp_work *w = NULL;
    char *on0 = NULL;
    int dev = -1, ok = 0, rc;

    sim_ndev = 2;
    cudaMalloc((void **)&on0, 64); /* on device 0 */
    be = make(3, 5.0, diag); /* local rank 3 of 2 devices: cuda:1 */
    if (be == NULL) {
        goto out;
    }
    cudaGetDevice(&dev);
    EXPECT(dev == 1, "local rank 3 with 2 devices: current device %d, want 1", dev);
    rc = allreduce(be, on0, 16, NULL, &w);
    EXPECT(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "is on cuda:0"),
           "a cuda:0 buffer on a cuda:1 communicator: rc %d: %s", rc, fsdp_err_msg());
    fsdp_err_clear();
    ops->destroy(be);
    be = NULL;

    setenv("FSDPC_CUDA_DEVICE", "0", 1);
    sim_dev = 1;
    be = make(1, 5.0, diag);
    unsetenv("FSDPC_CUDA_DEVICE");
    cudaGetDevice(&dev);
    if (be == NULL) {
        goto out;
    }
    EXPECT(dev == 0, "FSDPC_CUDA_DEVICE=0: device %d, want 0", dev);
    ops->destroy(be);
    be = NULL;

    setenv("LOCAL_RANK", "1", 1);
    sim_dev = 0;
    be = make(-1, 5.0, diag);
    unsetenv("LOCAL_RANK");
    cudaGetDevice(&dev);
    if (be == NULL) {
        goto out;
    }
    EXPECT(dev == 1, "local rank unknown, LOCAL_RANK=1: device %d, want 1", dev);
    ok = 1;
out:
    if (be) {
        ops->destroy(be);
    }
    cudaFree(on0);
    fsdp_err_clear();
    return ok;
}

static int check_bad_env(char *diag)
{
    int ok;
    sim_ndev = 2;
    setenv("FSDPC_CUDA_DEVICE", "7", 1);
    ok = create_fails(0, FSDP_ERR_INVALID, "FSDPC_CUDA_DEVICE='7'", diag);
    setenv("FSDPC_CUDA_DEVICE", "one", 1);
    ok = ok && create_fails(0, FSDP_ERR_INVALID, "FSDPC_CUDA_DEVICE='one'", diag);
    unsetenv("FSDPC_CUDA_DEVICE");
    setenv("LOCAL_RANK", "x1", 1);
    ok = ok && create_fails(-1, FSDP_ERR_INVALID, "LOCAL_RANK='x1'", diag);
    unsetenv("LOCAL_RANK");
    return ok;
}

static int check_init_nonblocking(char *diag)
{
    struct fsdp_backend *be;
    int base = sim_live(), ok = 0;

    sim_init_polls = 5;
    be = make(0, 5.0, diag);
    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    EXPECT(sim_blocking == 0, "config.blocking = %d, want 0 (non-blocking)", sim_blocking);
    ok = 1;
out:
    if (be) {
        ops->destroy(be);
    }
    if (ok && sim_live() != base) {
        snprintf(diag, DIAG_LEN, "%d simulated objects leaked", sim_live() - base);
        ok = 0;
    }
    return ok;
}

static int check_init_deadline(char *diag)
{
    int base = sim_live(), aborts = sim_aborts, ok;
    double t0 = fsdp_now(), dt;
    struct fsdp_group_info info = {.name = "sim[0]", .rank = 0, .size = 1, .world_ranks = ranks4,
                                   .timeout_s = 0.2, .local_rank = 0};
    struct fsdp_backend *be = NULL;
    int rc;

    sim_init_polls = -1;
    rc = ops->create(&info, &be);
    dt = fsdp_now() - t0;
    ok = rc == FSDP_ERR_TIMEOUT && be == NULL && strstr(fsdp_err_msg(), "did not finish within") &&
         sim_aborts == aborts + 1 && sim_live() == base && dt < 2.0;
    if (!ok) {
        snprintf(diag, DIAG_LEN, "rc %d after %.2f s, aborts %d, leaked %d: %s", rc, dt,
                 sim_aborts - aborts, sim_live() - base, fsdp_err_msg());
    } else {
        tap_diag("%s", fsdp_err_msg());
    }
    fsdp_err_clear();
    return ok;
}

static int check_mapping(char *diag)
{
    static const ncclDataType_t want_t[FSDP_DTYPE_COUNT] = {
        [FSDP_F32] = ncclFloat32, [FSDP_F16] = ncclFloat16, [FSDP_BF16] = ncclBfloat16,
        [FSDP_I32] = ncclInt32,   [FSDP_I64] = ncclInt64,   [FSDP_U8] = ncclUint8};
    static const ncclRedOp_t want_op[FSDP_REDOP_COUNT] = {
        [FSDP_SUM] = ncclSum, [FSDP_AVG] = ncclAvg, [FSDP_MAX] = ncclMax, [FSDP_MIN] = ncclMin};
    struct fsdp_backend *be = make(0, 5.0, diag);
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct fsdp_work *w = NULL;
    char *buf = NULL;
    int ok = 0, rc;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 1024);
    for (int t = 0; t < FSDP_DTYPE_COUNT; t++) {
        for (int op = 0; op < FSDP_REDOP_COUNT; op++) {
            rc = ops->allreduce(be, buf, buf + 512, 7, (enum fsdp_dtype)t, (enum fsdp_redop)op,
                                &attr, &w);
            EXPECT(rc == 0, "%s %s: %s", fsdp_dtype_name((enum fsdp_dtype)t),
                   fsdp_redop_name((enum fsdp_redop)op), fsdp_err_msg());
            EXPECT(sim_last.func == SIM_ALLREDUCE && sim_last.t == want_t[t] &&
                       sim_last.op == want_op[op] && sim_last.count == 7 && sim_last.send == buf &&
                       sim_last.recv == buf + 512,
                   "%s %s reached NCCL as type %d op %d count %zu",
                   fsdp_dtype_name((enum fsdp_dtype)t), fsdp_redop_name((enum fsdp_redop)op),
                   (int)sim_last.t, (int)sim_last.op, sim_last.count);
            EXPECT(ops->work_wait(w, 1.0) == 0, "wait: %s", fsdp_err_msg());
            ops->work_free(w);
        }
    }
    ok = 1;
out:
    fsdp_err_clear();
    cudaFree(buf);
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

static int check_collective_args(char *diag)
{
    struct fsdp_backend *be = make(0, 5.0, diag);
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct fsdp_work *w = NULL;
    int32_t *buf = NULL, host[8];
    int ok = 0, rc;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 256);
    for (int i = 0; i < 8; i++) {
        buf[i] = i + 1;
    }
    rc = ops->allgather(be, buf, buf + 8, 8, FSDP_I32, &attr, &w);
    EXPECT(rc == 0 && sim_last.func == SIM_ALLGATHER && sim_last.count == 8 &&
           sim_last.recv == buf + 8 && buf[15] == 8, "allgather: rc %d", rc);
    ops->work_free(w);
    rc = ops->allgather(be, buf, buf, 8, FSDP_I32, &attr, &w); /* in place, rank 0 */
    EXPECT(rc == 0 && sim_last.send == buf && sim_last.recv == buf, "in-place allgather: rc %d",
           rc);
    ops->work_free(w);
    rc = ops->reduce_scatter(be, buf, buf + 16, 8, FSDP_I32, FSDP_MAX, &attr, &w);
    EXPECT(rc == 0 && sim_last.func == SIM_REDUCE_SCATTER && sim_last.op == ncclMax &&
           sim_last.recv == buf + 16 && buf[16] == 1, "reduce_scatter: rc %d", rc);
    ops->work_free(w);
    rc = ops->broadcast(be, buf, 8, FSDP_I32, 0, &attr, &w);
    EXPECT(rc == 0 && sim_last.func == SIM_BROADCAST && sim_last.root == 0 &&
           sim_last.send == buf && sim_last.recv == buf, "broadcast: rc %d", rc);
    ops->work_free(w);

    rc = ops->allgather(be, buf + 4, buf, 8, FSDP_I32, &attr, &w);
    EXPECT(rc == FSDP_ERR_INVALID && w == NULL, "allgather from inside its output: rc %d", rc);
    fsdp_err_clear();
    rc = ops->reduce_scatter(be, buf, buf + 3, 8, FSDP_I32, FSDP_SUM, &attr, &w);
    EXPECT(rc == FSDP_ERR_INVALID, "reduce_scatter into its input: rc %d", rc);
    fsdp_err_clear();
    rc = ops->send(be, buf, 8, FSDP_I32, 0, &attr, &w);
    EXPECT(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "another rank"),
           "send to self: rc %d", rc);
    fsdp_err_clear();
    rc = ops->recv(be, buf, 8, FSDP_I32, 3, &attr, &w);
    EXPECT(rc == FSDP_ERR_INVALID, "recv from rank 3 of 1: rc %d", rc);
    fsdp_err_clear();
    rc = ops->allreduce(be, host, host, 8, FSDP_I32, FSDP_SUM, &attr, &w);
    EXPECT(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "host memory"),
           "stack buffer labelled CUDA: rc %d", rc);
    fsdp_err_clear();
    rc = ops->allreduce(be, buf, buf, 8, FSDP_I32, (enum fsdp_redop)9, &attr, &w);
    EXPECT(rc == FSDP_ERR_INVALID, "op 9: rc %d", rc);
    ok = 1;
out:
    fsdp_err_clear();
    cudaFree(buf);
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

static int check_streams(char *diag)
{
    struct fsdp_backend *be = make(0, 5.0, diag);
    struct fsdp_work *w = NULL;
    cudaStream_t mine = NULL;
    char *buf = NULL;
    int ok = 0, waits = sim_legacy_waits;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 64);
    cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking);
    EXPECT(allreduce(be, buf, 4, mine, &w) == 0 && sim_last.s == mine, "caller stream not used");
    ops->work_free(w);
    EXPECT(sim_legacy_waits == waits, "a caller stream must not wait on the default stream");
    EXPECT(allreduce(be, buf, 4, NULL, &w) == 0, "no stream: %s", fsdp_err_msg());
    EXPECT(sim_last.s != &sim_legacy && sim_last.s != mine,
           "without a stream the op must run on the backend's own stream");
    EXPECT(sim_legacy_waits == waits + 1,
           "the backend stream must wait for the legacy default stream");
    ops->work_free(w);
    ok = 1;
out:
    fsdp_err_clear();
    cudaFree(buf);
    if (mine) {
        cudaStreamDestroy(mine);
    }
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

static int check_enqueue_in_progress(char *diag)
{
    struct fsdp_backend *be = make(0, 5.0, diag);
    struct fsdp_work *w = NULL;
    char *buf = NULL;
    int ok = 0, rc;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 64);
    sim_coll_polls = 3;
    rc = allreduce(be, buf, 4, NULL, &w);
    EXPECT(rc == 0 && w != NULL, "issue: rc %d: %s", rc, fsdp_err_msg());
    EXPECT(sim_record_early == 0, "the completion event was recorded before NCCL queued the op");
    EXPECT(ops->work_wait(w, 1.0) == 0, "wait: %s", fsdp_err_msg());
    ops->work_free(w);
    ok = 1;
out:
    sim_coll_polls = 0;
    fsdp_err_clear();
    cudaFree(buf);
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

static int check_enqueue_stuck(char *diag)
{
    struct fsdp_backend *be = make(0, 0.2, diag);
    struct fsdp_work *w = NULL;
    char *buf = NULL;
    int ok = 0, rc, aborts = sim_aborts;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 64);
    sim_coll_polls = -1;
    rc = allreduce(be, buf, 4, NULL, &w);
    EXPECT(rc == FSDP_ERR_TIMEOUT && w == NULL && strstr(fsdp_err_msg(), "was not queued"),
           "stuck enqueue: rc %d: %s", rc, fsdp_err_msg());
    tap_diag("%s", fsdp_err_msg());
    EXPECT(sim_aborts == aborts + 1, "communicator not aborted");
    fsdp_err_clear();
    sim_coll_polls = 0;
    rc = allreduce(be, buf, 4, NULL, &w);
    EXPECT(rc == FSDP_ERR_TIMEOUT && strstr(fsdp_err_msg(), "was not queued"),
           "the next op must fail with the first error: rc %d: %s", rc, fsdp_err_msg());
    ok = 1;
out:
    sim_coll_polls = 0;
    fsdp_err_clear();
    cudaFree(buf);
    if (be) {
        ops->destroy(be);
    }
    EXPECT(!ok || sim_aborts == aborts + 1, "destroy aborted a second time");
    return ok;
}

static int check_short_wait(char *diag)
{
    struct fsdp_backend *be = make(0, 30.0, diag);
    struct fsdp_work *w = NULL;
    cudaStream_t s = NULL;
    char *buf = NULL;
    int ok = 0, done = -1, rc;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 64);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    sim_hold(s, 1);
    EXPECT(allreduce(be, buf, 4, s, &w) == 0, "issue: %s", fsdp_err_msg());
    EXPECT(ops->work_test(w, &done) == 0 && done == 0, "test on a held stream: done %d", done);
    rc = ops->work_wait(w, 0.05);
    EXPECT(rc == FSDP_ERR_TIMEOUT && strstr(fsdp_err_msg(), "still pending"),
           "50 ms wait: rc %d: %s", rc, fsdp_err_msg());
    fsdp_err_clear();
    sim_hold(s, 0);
    EXPECT(ops->work_wait(w, 1.0) == 0, "wait after release: %s", fsdp_err_msg());
    EXPECT(ops->work_test(w, &done) == 0 && done == 1, "test after completion: done %d", done);
    ops->work_free(w);
    ok = 1;
out:
    fsdp_err_clear();
    cudaFree(buf);
    if (s) {
        cudaStreamDestroy(s);
    }
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

/* A pending op that meets a failure: kind 0 deadline, 1 NCCL async error, 2 CUDA error. */
static int check_pending_failure(int kind, char *diag)
{
    static const char *const want[] = {"did not complete within", "NCCL error while",
                                       "CUDA error on host"};
    static const int code[] = {FSDP_ERR_TIMEOUT, FSDP_ERR_PEER, FSDP_ERR_BACKEND};
    struct fsdp_backend *be = make(0, kind == 0 ? 0.2 : 30.0, diag);
    struct fsdp_work *w = NULL, *w2 = NULL;
    cudaStream_t s = NULL;
    char *buf = NULL;
    int ok = 0, rc, done = 0, aborts = sim_aborts;
    double t0, dt;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 64);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    sim_hold(s, 1);
    EXPECT(allreduce(be, buf, 4, s, &w) == 0, "issue: %s", fsdp_err_msg());
    if (kind == 1) {
        sim_async = ncclRemoteError;
    } else if (kind == 2) {
        sim_event_error = cudaErrorIllegalAddress;
    }
    t0 = fsdp_now();
    rc = ops->work_wait(w, 5.0);
    dt = fsdp_now() - t0;
    EXPECT(rc == code[kind] && strstr(fsdp_err_msg(), want[kind]) &&
           strstr(fsdp_err_msg(), "aborted") && dt < 2.0,
           "wait: rc %d (want %d) after %.2f s: %s", rc, code[kind], dt, fsdp_err_msg());
    tap_diag("%s", fsdp_err_msg());
    EXPECT(sim_aborts == aborts + 1, "communicator not aborted");
    fsdp_err_clear();
    rc = ops->work_test(w, &done);
    EXPECT(rc == code[kind] && done == 1, "test of the failed handle: rc %d done %d", rc, done);
    fsdp_err_clear();
    sim_async = ncclSuccess;
    sim_event_error = cudaSuccess;
    rc = allreduce(be, buf, 4, NULL, &w2);
    EXPECT(rc == code[kind] && w2 == NULL && strstr(fsdp_err_msg(), want[kind]),
           "next op: rc %d: %s", rc, fsdp_err_msg());
    ops->work_free(w);
    ok = 1;
out:
    sim_async = ncclSuccess;
    sim_event_error = cudaSuccess;
    fsdp_err_clear();
    cudaFree(buf);
    if (s) {
        cudaStreamDestroy(s);
    }
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

struct aborter {
    struct fsdp_backend *be;
    double delay_s;
};

static void *abort_later(void *arg)
{
    struct aborter *a = arg;
    struct timespec ts = {0, (long)(a->delay_s * 1e9)};
    nanosleep(&ts, NULL);
    ops->abort(a->be, "operator pressed stop");
    return NULL;
}

static int check_abort_thread(char *diag)
{
    struct fsdp_backend *be = make(0, 30.0, diag);
    struct fsdp_work *w = NULL;
    struct aborter a;
    pthread_t tid;
    cudaStream_t s = NULL;
    char *buf = NULL;
    int ok = 0, rc, aborts = sim_aborts, started = 0;
    double t0, dt;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 64);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    sim_hold(s, 1);
    EXPECT(allreduce(be, buf, 4, s, &w) == 0, "issue: %s", fsdp_err_msg());
    a.be = be;
    a.delay_s = 0.05;
    EXPECT(pthread_create(&tid, NULL, abort_later, &a) == 0, "pthread_create failed");
    started = 1;
    t0 = fsdp_now();
    rc = ops->work_wait(w, 10.0);
    dt = fsdp_now() - t0;
    EXPECT(rc == FSDP_ERR_ABORTED && strstr(fsdp_err_msg(), "operator pressed stop") && dt < 2.0,
           "wait during abort: rc %d after %.2f s: %s", rc, dt, fsdp_err_msg());
    pthread_join(tid, NULL);
    started = 0;
    EXPECT(sim_aborts == aborts + 1, "ncclCommAbort called %d times", sim_aborts - aborts);
    ops->work_free(w);
    ok = 1;
out:
    if (started) {
        pthread_join(tid, NULL);
    }
    fsdp_err_clear();
    cudaFree(buf);
    if (s) {
        cudaStreamDestroy(s);
    }
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

#define POOL_OPS 40

static int check_pool(char *diag)
{
    struct fsdp_backend *be = make(0, 30.0, diag);
    struct fsdp_work *w[POOL_OPS];
    cudaStream_t s = NULL;
    char *buf = NULL;
    int ok = 0, made = 0;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 64);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int round = 0; round < 2; round++) {
        sim_hold(s, 1);
        for (int i = 0; i < POOL_OPS; i++) {
            EXPECT(allreduce(be, buf, 4, s, &w[i]) == 0, "issue %d: %s", i, fsdp_err_msg());
        }
        sim_hold(s, 0);
        for (int i = 0; i < POOL_OPS; i++) {
            EXPECT(ops->work_wait(w[i], 1.0) == 0, "wait %d: %s", i, fsdp_err_msg());
            ops->work_free(w[i]);
        }
        if (round == 0) {
            made = sim_events_made;
        }
    }
    EXPECT(sim_events_made == made, "the second round made %d new events", sim_events_made - made);
    ok = 1;
out:
    fsdp_err_clear();
    cudaFree(buf);
    if (s) {
        cudaStreamDestroy(s);
    }
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

static int check_zero_and_barrier(char *diag)
{
    struct fsdp_backend *be = make(0, 5.0, diag);
    struct fsdp_work *w = NULL;
    struct cudaPointerAttributes pa;
    int ok = 0, calls;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    calls = sim_calls;
    EXPECT(allreduce(be, NULL, 0, NULL, &w) == 0, "count 0: %s", fsdp_err_msg());
    EXPECT(sim_calls == calls, "count 0 reached NCCL");
    EXPECT(ops->work_wait(w, 1.0) == 0, "count 0 wait: %s", fsdp_err_msg());
    ops->work_free(w);
    EXPECT(ops->barrier(be, &w) == 0, "barrier: %s", fsdp_err_msg());
    cudaPointerGetAttributes(&pa, sim_last.send);
    EXPECT(sim_calls == calls + 1 && sim_last.func == SIM_ALLREDUCE && sim_last.count == 1 &&
           sim_last.t == ncclFloat32 && sim_last.send == sim_last.recv &&
           pa.type == cudaMemoryTypeDevice && sim_last.s != &sim_legacy,
           "barrier reached NCCL as func %d count %zu type %d", (int)sim_last.func, sim_last.count,
           (int)sim_last.t);
    EXPECT(ops->work_wait(w, 1.0) == 0, "barrier wait: %s", fsdp_err_msg());
    ops->work_free(w);
    ok = 1;
out:
    fsdp_err_clear();
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

static int check_destroy(int finalize_polls, char *diag)
{
    int base = sim_live(), aborts = sim_aborts, destroys = sim_destroys, ok = 0;
    struct fsdp_backend *be = make(0, 0.2, diag);
    double t0, dt;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    sim_final_polls = finalize_polls;
    t0 = fsdp_now();
    ops->destroy(be);
    dt = fsdp_now() - t0;
    if (finalize_polls >= 0) {
        EXPECT(sim_destroys == destroys + 1 && sim_aborts == aborts,
               "clean finalize: %d destroy, %d abort", sim_destroys - destroys,
               sim_aborts - aborts);
    } else {
        EXPECT(sim_aborts == aborts + 1 && sim_destroys == destroys && dt < 2.0,
               "stuck finalize: %d abort, %d destroy after %.2f s", sim_aborts - aborts,
               sim_destroys - destroys, dt);
    }
    EXPECT(sim_live() == base, "%d simulated objects leaked", sim_live() - base);
    ok = 1;
out:
    sim_final_polls = 0;
    fsdp_err_clear();
    return ok;
}

struct creator {
    struct fsdp_store *store;
    int rank;
    int rc;
    char msg[DIAG_LEN];
    struct fsdp_backend *be;
};

static void *create_rank(void *arg)
{
    struct creator *c = arg;
    struct fsdp_group_info info = {.name = "pair", .rank = c->rank, .size = 2,
                                   .world_ranks = ranks4, .world_rank = c->rank, .world_size = 2,
                                   .timeout_s = 5.0, .store = c->store, .local_rank = c->rank};
    c->rc = ops->create(&info, &c->be);
    snprintf(c->msg, sizeof(c->msg), "%s", fsdp_err_msg());
    fsdp_err_clear();
    return NULL;
}

static int check_uid_exchange(char *diag)
{
    struct fsdp_store *store = NULL;
    struct creator cr[2];
    pthread_t tid[2];
    char first[sizeof(ncclUniqueId)];
    int ok = 0;

    sim_ndev = 2;
    EXPECT(fsdp_store_mem_create(5.0, &store) == 0, "mem store: %s", fsdp_err_msg());
    for (int gen = 0; gen < 2; gen++) {
        memset(cr, 0, sizeof(cr));
        memset(sim_uid_seen, 0, sizeof(sim_uid_seen));
        for (int r = 0; r < 2; r++) {
            cr[r].store = store;
            cr[r].rank = r;
            pthread_create(&tid[r], NULL, create_rank, &cr[r]);
        }
        for (int r = 0; r < 2; r++) {
            pthread_join(tid[r], NULL);
        }
        for (int r = 0; r < 2; r++) {
            if (cr[r].be) {
                ops->destroy(cr[r].be);
            }
        }
        EXPECT(cr[0].rc == 0 && cr[1].rc == 0,
               "creation %d: rank 0 rc %d (%.200s), rank 1 rc %d (%.200s)", gen, cr[0].rc,
               cr[0].msg, cr[1].rc, cr[1].msg);
        EXPECT(memcmp(&sim_uid_seen[0], &sim_uid_seen[1], sizeof(ncclUniqueId)) == 0 &&
               sim_uid_seen[0].internal[0] != 0, "creation %d: the ranks used different ids", gen);
        if (gen == 0) {
            memcpy(first, &sim_uid_seen[0], sizeof(first));
        } else {
            EXPECT(memcmp(first, &sim_uid_seen[0], sizeof(first)) != 0,
                   "the second creation reused the first communicator's id");
        }
    }
    ok = 1;
out:
    fsdp_store_destroy(store);
    return ok;
}

// ----------------------------------------------------------------------------

struct check {
    const char *name;
    int (*fn)(char *diag);
};

static int check_deadline(char *diag) { return check_pending_failure(0, diag); }
static int check_async_error(char *diag) { return check_pending_failure(1, diag); }
static int check_cuda_error(char *diag) { return check_pending_failure(2, diag); }
static int check_destroy_clean(char *diag) { return check_destroy(3, diag); }
static int check_destroy_stuck(char *diag) { return check_destroy(-1, diag); }

static const struct check checks[] = {
    {"no device: create fails naming the host and CUDA_VISIBLE_DEVICES", check_no_device},
    {"device from local rank, FSDPC_CUDA_DEVICE, LOCAL_RANK; foreign-device buffer refused",
     check_device_choice},
    {"bad FSDPC_CUDA_DEVICE and LOCAL_RANK values refused", check_bad_env},
    {"non-blocking init polled to completion, nothing leaked", check_init_nonblocking},
    {"init that never completes times out, is aborted, leaks nothing", check_init_deadline},
    {"every dtype and op reaches NCCL with the right type and op", check_mapping},
    {"allgather, reduce_scatter, broadcast arguments; bad layouts, peers, memory refused",
     check_collective_args},
    {"caller stream used; otherwise own stream ordered after the default stream", check_streams},
    {"ncclInProgress on enqueue: the event is recorded only once queued",
     check_enqueue_in_progress},
    {"enqueue stuck past the deadline: sticky timeout, communicator aborted once",
     check_enqueue_stuck},
    {"a short wait on a held stream times out and leaves the op pending", check_short_wait},
    {"op pending past the backend deadline: sticky timeout, communicator aborted", check_deadline},
    {"asynchronous NCCL error while pending: sticky peer error, aborted", check_async_error},
    {"CUDA error while pending: sticky backend error, aborted", check_cuda_error},
    {"abort from another thread ends a wait with the reason", check_abort_thread},
    {"work handles are pooled: no new events once warm", check_pool},
    {"count 0 skips NCCL; barrier is a 1-element device allreduce", check_zero_and_barrier},
    {"destroy finalizes and destroys cleanly, leaks nothing", check_destroy_clean},
    {"destroy with a stuck finalize aborts within the deadline", check_destroy_stuck},
    {"unique id exchanged through the store, fresh for each creation", check_uid_exchange},
};

int main(void)
{
    unsetenv("FSDPC_CUDA_DEVICE");
    unsetenv("LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("SLURM_LOCALID");
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
        char diag[DIAG_LEN] = "";
        int ok;
        sim_reset();
        ok = checks[i].fn(diag);
        if (!ok) {
            tap_diag("%s", diag);
        }
        tap_ok(ok, "%s", checks[i].name);
    }
    return tap_done();
}
