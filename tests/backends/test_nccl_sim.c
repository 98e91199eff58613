/*
 * test_nccl_sim.c - the nccl backend's control logic on any machine.
 *
 * This program links the backend's sources against a simulation of the
 * CUDA runtime and NCCL calls it uses (nccl_sim.c), not the real libraries,
 * so that the parts a GPU test rarely reaches run everywhere: device choice
 * and per-thread device hygiene, the environment the backend refuses
 * (NCCL_COMM_BLOCKING=1) or honours (FSDPC_INIT_TIMEOUT), the non-blocking
 * init and its deadline, ncclInProgress on enqueue with NCCL's launch
 * thread, stream choice (cudaStreamPerThread, a stream of another device),
 * sticky CUDA errors, dtype/op mapping, short waits, the backend deadline,
 * asynchronous NCCL and CUDA errors, abort from another thread and of two
 * groups sharing a stuck stream, a destroy that never synchronises the
 * device, the work-handle pool, send/recv batched into NCCL groups across
 * two ranks, the unique-id exchange, fsdpc-bench's device choice, and the
 * watchdog's hard exit when an abort callback hangs (in a child process).
 *
 * Every check also fails when the simulation saw NCCL misused (a call on a
 * communicator whose last launch was still in progress, a call on a dead
 * one) or a call that would have blocked for ever.
 *
 * The same program is built a second time against an older nccl.h
 * (tests/backends/nccl_api/nccl.h), so that the backend's version guards
 * are compiled both ways.
 */
#include "config.h"
#include "backends/backend.h"
#include "backends/nccl/nccl_be.h"
#include "comm/debug.h"
#include "comm/flight.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "programs/bench/bench.h"
#include "rendezvous/store.h"
#include "tests/backends/nccl_sim.h"
#include "tests/tap.h"

#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define DIAG_LEN 512
/* FSDPC_INIT_TIMEOUT for every check that does not set its own: shorter
 * than any group deadline here, so the group's deadline is the backend's */
#define SHORT_INIT_TIMEOUT "0.01"

// ----------------------------------------------------------------------------
// helpers

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

static struct fsdp_backend *make_group(const char *name, int rank, int size,
                                       struct fsdp_store *store, int local_rank, double timeout_s,
                                       char *diag)
{
    struct fsdp_group_info info = {.name = name, .rank = rank, .size = size, .world_ranks = ranks4,
                                   .world_rank = rank, .world_size = size, .timeout_s = timeout_s,
                                   .store = store, .local_rank = local_rank};
    struct fsdp_backend *be = NULL;
    int rc = ops->create(&info, &be);
    if (rc < 0) {
        snprintf(diag, DIAG_LEN, "create %s: %s (%s)", name, fsdp_err_msg(), fsdp_strerror(rc));
        fsdp_err_clear();
        return NULL;
    }
    return be;
}

static struct fsdp_backend *make(int local_rank, double timeout_s, char *diag)
{
    return make_group("sim[0]", 0, 1, NULL, local_rank, timeout_s, diag);
}

/* Rank 0 of a group of 2 whose peer never takes part: its collectives
 * never complete (a stuck kernel). */
static struct fsdp_backend *make_stuck(struct fsdp_store **store, double timeout_s, char *diag)
{
    sim_ghost_peers = 1;
    if (fsdp_store_mem_create(5.0, store) < 0) {
        snprintf(diag, DIAG_LEN, "mem store: %s", fsdp_err_msg());
        fsdp_err_clear();
        return NULL;
    }
    return make_group("stuck[0]", 0, 2, *store, 0, timeout_s, diag);
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

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

// ----------------------------------------------------------------------------
// device choice and environment

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
    setenv("FSDPC_INIT_TIMEOUT", "-5", 1);
    ok = ok && create_fails(0, FSDP_ERR_INVALID, "FSDPC_INIT_TIMEOUT", diag);
    setenv("FSDPC_INIT_TIMEOUT", SHORT_INIT_TIMEOUT, 1);
    return ok;
}

/* NCCL_COMM_BLOCKING=1 would make the communicator blocking behind the
 * backend's back: refused in one line. 0 (NCCL's own default here) is fine. */
static int check_blocking_env(char *diag)
{
    struct fsdp_backend *be = NULL;
    int ok = 0;

    setenv("NCCL_COMM_BLOCKING", "1", 1);
    if (!create_fails(0, FSDP_ERR_INVALID, "NCCL_COMM_BLOCKING='1'", diag)) {
        goto out;
    }
    setenv("NCCL_COMM_BLOCKING", "0", 1);
    be = make(0, 5.0, diag);
    if (be == NULL) {
        goto out;
    }
    EXPECT(sim_blocking == 0, "NCCL_COMM_BLOCKING=0: blocking %d", sim_blocking);
    ok = 1;
out:
    unsetenv("NCCL_COMM_BLOCKING");
    if (be) {
        ops->destroy(be);
    }
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
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    EXPECT(sim_comm_name != NULL && strcmp(sim_comm_name, "sim[0]") == 0,
           "config.commName is '%s', want the group name", sim_comm_name ? sim_comm_name : "NULL");
#endif
    tap_diag("built against nccl.h %d.%d.%d", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
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

// ----------------------------------------------------------------------------
// arguments, streams, CUDA errors

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
           sim_last.recv == buf + 8 && ops->work_wait(w, 1.0) == 0 && buf[15] == 8,
           "allgather: rc %d", rc);
    ops->work_free(w);
    rc = ops->allgather(be, buf, buf, 8, FSDP_I32, &attr, &w); /* in place, rank 0 */
    EXPECT(rc == 0 && sim_last.send == buf && sim_last.recv == buf, "in-place allgather: rc %d",
           rc);
    ops->work_free(w);
    rc = ops->reduce_scatter(be, buf, buf + 16, 8, FSDP_I32, FSDP_MAX, &attr, &w);
    EXPECT(rc == 0 && sim_last.func == SIM_REDUCE_SCATTER && sim_last.op == ncclMax &&
           sim_last.recv == buf + 16 && ops->work_wait(w, 1.0) == 0 && buf[16] == 1,
           "reduce_scatter: rc %d", rc);
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

/* A caller stream is used as given; without one the op runs on the
 * backend's own stream and waits for nothing else (the legacy default
 * stream would make it wait for every blocking stream of the device). */
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
    EXPECT(allreduce(be, buf, 4, NULL, &w) == 0, "no stream: %s", fsdp_err_msg());
    EXPECT(sim_last.s != NULL && sim_last.s != cudaStreamLegacy && sim_last.s != mine,
           "without a stream the op must run on the backend's own stream");
    ops->work_free(w);
    EXPECT(sim_legacy_waits == waits,
           "%d stream wait(s) on the legacy default stream: the no-stream path must use the "
           "backend's stream alone", sim_legacy_waits - waits);
    EXPECT(allreduce(be, buf, 4, cudaStreamLegacy, &w) == 0 && sim_last.s == cudaStreamLegacy,
           "cudaStreamLegacy given explicitly: %s", fsdp_err_msg());
    EXPECT(ops->work_wait(w, 1.0) == 0, "wait: %s", fsdp_err_msg());
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

static int check_per_thread_stream(char *diag)
{
    struct fsdp_backend *be = make(0, 5.0, diag);
    struct fsdp_work *w = NULL;
    char *buf = NULL;
    int ok = 0, rc, calls = sim_calls;

    if (be == NULL) {
        goto out;
    }
    cudaMalloc((void **)&buf, 64);
    rc = allreduce(be, buf, 4, cudaStreamPerThread, &w);
    EXPECT(rc == FSDP_ERR_INVALID && w == NULL && strstr(fsdp_err_msg(), "cudaStreamPerThread") &&
           sim_calls == calls, "cudaStreamPerThread: rc %d (want %d), NCCL called %d time(s): %s",
           rc, FSDP_ERR_INVALID, sim_calls - calls, fsdp_err_msg());
    tap_diag("%s", fsdp_err_msg());
    fsdp_err_clear();
    EXPECT(allreduce(be, buf, 4, NULL, &w) == 0 && ops->work_wait(w, 1.0) == 0,
           "the instance must stay usable: %s", fsdp_err_msg());
    ops->work_free(w);
    ok = 1;
out:
    fsdp_err_clear();
    cudaFree(buf);
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

static int check_foreign_stream(char *diag)
{
    struct fsdp_backend *be;
    struct fsdp_work *w = NULL;
    cudaStream_t on1 = NULL;
    char *buf = NULL;
    int ok = 0, rc;

    sim_ndev = 2;
    be = make(0, 5.0, diag);
    if (be == NULL) {
        goto out;
    }
    cudaMalloc((void **)&buf, 64);
    sim_dev = 1;
    cudaStreamCreateWithFlags(&on1, cudaStreamNonBlocking);
    sim_dev = 0;
    rc = allreduce(be, buf, 4, on1, &w);
    EXPECT(rc == FSDP_ERR_INVALID && w == NULL && strstr(fsdp_err_msg(), "stream of cuda:1"),
           "a stream of cuda:1: rc %d: %s", rc, fsdp_err_msg());
    tap_diag("%s", fsdp_err_msg());
    fsdp_err_clear();
    rc = allreduce(be, buf, 4, NULL, &w);
    EXPECT(rc == 0 && ops->work_wait(w, 1.0) == 0,
           "the communicator must survive a refused stream: rc %d: %s", rc, fsdp_err_msg());
    ops->work_free(w);
    ok = 1;
out:
    fsdp_err_clear();
    cudaFree(buf);
    if (on1) {
        cudaStreamDestroy(on1);
    }
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

/* After a sticky error every CUDA call fails: the pointer check must say
 * so, not blame the buffer. */
static int check_sticky_error(char *diag)
{
    struct fsdp_backend *be = make(0, 5.0, diag);
    struct fsdp_work *w = NULL;
    char *buf = NULL;
    int ok = 0, rc, aborted = sim_aborts_done;

    if (be == NULL) {
        goto out;
    }
    cudaMalloc((void **)&buf, 64);
    sim_sticky = cudaErrorIllegalAddress;
    rc = allreduce(be, buf, 4, NULL, &w);
    EXPECT(rc == FSDP_ERR_BACKEND && strstr(fsdp_err_msg(), "illegal memory access") &&
           !strstr(fsdp_err_msg(), "not CUDA memory"),
           "after a sticky error: rc %d (want %d): %s", rc, FSDP_ERR_BACKEND, fsdp_err_msg());
    tap_diag("%s", fsdp_err_msg());
    EXPECT(sim_wait_aborts_done(aborted + 1, 5.0), "the failed communicator was not aborted");
    ok = 1;
out:
    sim_sticky = cudaSuccess;
    fsdp_err_clear();
    cudaFree(buf);
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

// ----------------------------------------------------------------------------
// enqueue and polling

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
    int ok = 0, rc, aborts = sim_aborts_done;

    if (be == NULL) {
        goto out; /* make() wrote diag */
    }
    cudaMalloc((void **)&buf, 64);
    sim_coll_polls = -1;
    rc = allreduce(be, buf, 4, NULL, &w);
    EXPECT(rc == FSDP_ERR_TIMEOUT && w == NULL && strstr(fsdp_err_msg(), "was not queued"),
           "stuck enqueue: rc %d: %s", rc, fsdp_err_msg());
    tap_diag("%s", fsdp_err_msg());
    EXPECT(sim_wait_aborts_done(aborts + 1, 5.0), "communicator not aborted");
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
    EXPECT(!ok || sim_aborts_done == aborts + 1, "aborted %d times", sim_aborts_done - aborts);
    return ok;
}

struct issuer {
    struct fsdp_backend *be;
    void *buf;
    struct fsdp_work *w;
    int rc;
    atomic_int done;
};

static void *issue_thread(void *arg)
{
    struct issuer *is = arg;
    is->rc = allreduce(is->be, is->buf, 4, NULL, &is->w);
    fsdp_err_clear();
    atomic_store(&is->done, 1);
    return NULL;
}

struct gate_opener {
    atomic_int stop;
    atomic_int opened; /* the gate opened by itself */
};

/* Opens the launch gate after 10 s at the latest, so that a backend that
 * waits for the gate under its lock fails this check instead of hanging. */
static void *open_gate_later(void *arg)
{
    struct gate_opener *g = arg;
    for (int i = 0; i < 1000 && !atomic_load(&g->stop); i++) {
        sleep_s(0.01);
    }
    if (!atomic_load(&g->stop)) {
        atomic_store(&g->opened, 1);
    }
    sim_set_gate(0);
    return NULL;
}

/* While one thread's enqueue waits for NCCL's launch thread, another
 * thread's test of an earlier op must not wait for it. */
static int check_issue_unlocked(char *diag)
{
    struct fsdp_store *store = NULL;
    struct fsdp_backend *be = make_stuck(&store, 30.0, diag);
    struct issuer is = {0};
    struct gate_opener g;
    struct fsdp_work *w1 = NULL;
    pthread_t tid, gid;
    char *buf = NULL;
    int ok = 0, started = 0, rc, done = -1, calls;

    atomic_init(&is.done, 0);
    atomic_init(&g.stop, 0);
    atomic_init(&g.opened, 0);
    if (be == NULL) {
        goto out;
    }
    cudaMalloc((void **)&buf, 64);
    EXPECT(allreduce(be, buf, 4, NULL, &w1) == 0, "first op: %s", fsdp_err_msg());
    calls = sim_calls;
    sim_set_gate(1);
    is.be = be;
    is.buf = buf;
    EXPECT(pthread_create(&tid, NULL, issue_thread, &is) == 0 &&
           pthread_create(&gid, NULL, open_gate_later, &g) == 0, "pthread_create failed");
    started = 1;
    for (int i = 0; i < 5000 && sim_calls == calls; i++) {
        sleep_s(0.001);
    }
    EXPECT(sim_calls == calls + 1, "the second op never reached NCCL");
    rc = ops->work_test(w1, &done);
    EXPECT(rc == 0 && done == 0 && !atomic_load(&g.opened),
           "work_test of an earlier op waited for another thread's enqueue (rc %d, done %d)", rc,
           done);
    EXPECT(!atomic_load(&is.done), "the second op returned before NCCL's thread queued it");
    ok = 1;
out:
    atomic_store(&g.stop, 1);
    sim_set_gate(0);
    if (started) {
        pthread_join(tid, NULL);
        pthread_join(gid, NULL);
        if (ok && is.rc != 0) {
            snprintf(diag, DIAG_LEN, "the second op failed once the gate opened: rc %d", is.rc);
            ok = 0;
        }
    }
    if (be) {
        ops->abort(be, "end of check");
    }
    if (w1) {
        ops->work_free(w1);
    }
    if (is.w) {
        ops->work_free(is.w);
    }
    fsdp_err_clear();
    if (be) {
        ops->destroy(be);
    }
    cudaFree(buf);
    fsdp_store_destroy(store);
    return ok;
}

/* The polling policy: no system call for the first tens of microseconds
 * (where small ops end), then yields, then sleeps that grow to a cap. */
static int check_poll_plan(char *diag)
{
    struct nccl_poll p;
    long ns = -1, prev = 0;
    int ok = 0;

    fsdp_nccl_poll_start(&p);
    EXPECT(fsdp_nccl_pause_plan(&p, 0.0, &ns) == NCCL_PAUSE_SPIN && ns == 0,
           "the first pause must spin, not yield or sleep");
    EXPECT(fsdp_nccl_pause_plan(&p, 20e-6, &ns) == NCCL_PAUSE_SPIN, "20 us in: must still spin");
    EXPECT(fsdp_nccl_pause_plan(&p, 300e-6, &ns) == NCCL_PAUSE_YIELD, "300 us in: must yield");
    for (int i = 0; i < 12; i++) {
        EXPECT(fsdp_nccl_pause_plan(&p, 5e-3 + i * 1e-3, &ns) == NCCL_PAUSE_SLEEP && ns > 0 &&
               ns >= prev && ns <= 1000000, "sleep %d: %ld ns after %ld", i, ns, prev);
        prev = ns;
    }
    EXPECT(prev >= 100000, "sleeps must grow (last %ld ns)", prev);
    ok = 1;
out:
    return ok;
}

// ----------------------------------------------------------------------------
// waits, deadlines, failures

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
    if (s) {
        sim_hold(s, 0);
    }
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
    int ok = 0, rc, done = 0, aborts = sim_aborts, aborted = sim_aborts_done;
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
    fsdp_err_clear();
    rc = ops->work_test(w, &done);
    EXPECT(rc == code[kind] && done == 1, "test of the failed handle: rc %d done %d", rc, done);
    fsdp_err_clear();
    sim_async = ncclSuccess;
    sim_event_error = cudaSuccess;
    rc = allreduce(be, buf, 4, NULL, &w2);
    EXPECT(rc == code[kind] && w2 == NULL && strstr(fsdp_err_msg(), want[kind]),
           "next op: rc %d: %s", rc, fsdp_err_msg());
    /* the abort waits for the op queued on the held stream, as NCCL's does */
    sim_hold(s, 0);
    EXPECT(sim_wait_aborts_done(aborted + 1, 5.0) && sim_aborts == aborts + 1,
           "communicator aborted %d times", sim_aborts - aborts);
    ops->work_free(w);
    ok = 1;
out:
    sim_async = ncclSuccess;
    sim_event_error = cudaSuccess;
    fsdp_err_clear();
    if (s) {
        sim_hold(s, 0);
    }
    cudaFree(buf);
    if (s) {
        cudaStreamDestroy(s);
    }
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

/* The group layer allows FSDPC_INIT_TIMEOUT until the first step: the
 * backend must not abort before the longer of the two deadlines. */
static int check_init_timeout(char *diag)
{
    struct fsdp_backend *be = NULL;
    struct fsdp_work *w = NULL;
    cudaStream_t s = NULL;
    char *buf = NULL;
    int ok = 0, rc, aborts = sim_aborts;

    setenv("FSDPC_INIT_TIMEOUT", "60", 1);
    be = make(0, 0.2, diag);
    if (be == NULL) {
        goto out;
    }
    cudaMalloc((void **)&buf, 64);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    sim_hold(s, 1);
    EXPECT(allreduce(be, buf, 4, s, &w) == 0, "issue: %s", fsdp_err_msg());
    rc = ops->work_wait(w, 0.6);
    EXPECT(rc == FSDP_ERR_TIMEOUT && strstr(fsdp_err_msg(), "still pending") &&
           sim_aborts == aborts,
           "an op pending 0.6 s with FSDPC_TIMEOUT 0.2 s and FSDPC_INIT_TIMEOUT 60 s: rc %d, "
           "%d abort(s): %s", rc, sim_aborts - aborts, fsdp_err_msg());
    fsdp_err_clear();
    sim_hold(s, 0);
    EXPECT(ops->work_wait(w, 1.0) == 0, "after release: %s", fsdp_err_msg());
    ops->work_free(w);
    w = NULL;
    ops->destroy(be);

    setenv("FSDPC_INIT_TIMEOUT", "0.4", 1);
    be = make(0, 0.1, diag);
    if (be == NULL) {
        goto out;
    }
    sim_hold(s, 1);
    EXPECT(allreduce(be, buf, 4, s, &w) == 0, "issue: %s", fsdp_err_msg());
    rc = ops->work_wait(w, 5.0);
    EXPECT(rc == FSDP_ERR_TIMEOUT && strstr(fsdp_err_msg(), "within 0.4 s"),
           "FSDPC_INIT_TIMEOUT 0.4 s: rc %d: %s", rc, fsdp_err_msg());
    tap_diag("%s", fsdp_err_msg());
    ok = 1;
out:
    setenv("FSDPC_INIT_TIMEOUT", SHORT_INIT_TIMEOUT, 1);
    fsdp_err_clear();
    if (s) {
        sim_hold(s, 0);
    }
    if (w) {
        ops->work_free(w);
    }
    if (be) {
        ops->destroy(be);
    }
    cudaFree(buf);
    if (s) {
        cudaStreamDestroy(s);
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
    sleep_s(a->delay_s);
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
    int ok = 0, rc, aborts = sim_aborts, aborted = sim_aborts_done, started = 0;
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
    sim_hold(s, 0);
    EXPECT(sim_wait_aborts_done(aborted + 1, 5.0) && sim_aborts == aborts + 1,
           "ncclCommAbort called %d times", sim_aborts - aborts);
    ops->work_free(w);
    ok = 1;
out:
    if (started) {
        pthread_join(tid, NULL);
    }
    fsdp_err_clear();
    if (s) {
        sim_hold(s, 0);
    }
    cudaFree(buf);
    if (s) {
        cudaStreamDestroy(s);
    }
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

/*
 * Two groups queue on one caller stream, the first of them stuck (a peer
 * that never joins); the job abort then runs the groups' abort callbacks in
 * the other order, as the dist layer's table does. The second group's
 * ncclCommAbort waits for its op, queued behind the stuck one: done in the
 * caller's thread it would never return, and the stuck group would never
 * be reached.
 */
static int check_abort_two_groups(char *diag)
{
    struct fsdp_store *store = NULL;
    struct fsdp_backend *stuck = make_stuck(&store, 30.0, diag), *other = NULL;
    struct fsdp_work *ws = NULL, *wo = NULL;
    cudaStream_t s = NULL;
    char *buf = NULL;
    int ok = 0, rc, aborted = sim_aborts_done;

    if (stuck == NULL) {
        goto out;
    }
    other = make(0, 30.0, diag);
    if (other == NULL) {
        goto out;
    }
    cudaMalloc((void **)&buf, 64);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    EXPECT(allreduce(stuck, buf, 4, s, &ws) == 0, "stuck group: %s", fsdp_err_msg());
    EXPECT(allreduce(other, buf + 32, 4, s, &wo) == 0, "other group: %s", fsdp_err_msg());
    ops->abort(other, "watchdog: collective #1 on group stuck[0] not complete");
    ops->abort(stuck, "watchdog: collective #1 on group stuck[0] not complete");
    EXPECT(sim_wait_aborts_done(aborted + 2, 10.0), "%d of 2 communicators aborted after 10 s",
           sim_aborts_done - aborted);
    EXPECT(sim_hangs == 0, "an abort waited for the other group's stuck op");
    rc = ops->work_wait(wo, 1.0);
    EXPECT(rc == FSDP_ERR_ABORTED && strstr(fsdp_err_msg(), "watchdog"),
           "wait on the aborted group: rc %d: %s", rc, fsdp_err_msg());
    fsdp_err_clear();
    ok = 1;
out:
    fsdp_err_clear();
    if (ws) {
        ops->work_free(ws);
    }
    if (wo) {
        ops->work_free(wo);
    }
    if (other) {
        ops->destroy(other);
    }
    if (stuck) {
        ops->destroy(stuck);
    }
    cudaFree(buf);
    if (s) {
        cudaStreamDestroy(s);
    }
    fsdp_store_destroy(store);
    return ok;
}

/* A kernel of another group stuck on the device must not stop destroy:
 * cudaFree would synchronise the device and wait for it for ever. */
static int check_destroy_no_sync(char *diag)
{
    struct fsdp_store *store = NULL;
    struct fsdp_backend *stuck = make_stuck(&store, 30.0, diag), *be = NULL;
    struct fsdp_work *ws = NULL, *w = NULL;
    char *buf = NULL;
    int ok = 0;

    if (stuck == NULL) {
        goto out;
    }
    cudaMalloc((void **)&buf, 64);
    EXPECT(allreduce(stuck, buf, 4, NULL, &ws) == 0, "stuck group: %s", fsdp_err_msg());
    for (int pools = 1; pools >= 0; pools--) {
        sim_pools = pools;
        be = make(0, 30.0, diag);
        if (be == NULL) {
            goto out;
        }
        EXPECT(ops->barrier(be, &w) == 0 && ops->work_wait(w, 1.0) == 0, "barrier: %s",
               fsdp_err_msg());
        ops->work_free(w);
        ops->destroy(be);
        be = NULL;
        EXPECT(sim_hangs == 0, "destroy (memory pools %s) waited for another group's kernel",
               pools ? "supported" : "unsupported");
    }
    ok = 1;
out:
    fsdp_err_clear();
    if (be) {
        ops->destroy(be);
    }
    if (stuck) {
        ops->abort(stuck, "end of check");
    }
    if (ws) {
        ops->work_free(ws);
    }
    if (stuck) {
        ops->destroy(stuck);
    }
    sim_pools = 1;
    cudaFree(buf);
    fsdp_store_destroy(store);
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
    if (s) {
        sim_hold(s, 0);
    }
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
           pa.type == cudaMemoryTypeDevice && sim_last.s != NULL &&
           sim_last.s != cudaStreamLegacy,
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

// ----------------------------------------------------------------------------
// more than one rank: one thread per rank

struct rank_thread {
    pthread_t tid;
    struct fsdp_store *store;
    int rank;
    int rc;
    char msg[DIAG_LEN];
    struct fsdp_backend *be;
    int32_t *a, *b; /* (16,) each, on the rank's device */
};

static void *create_rank(void *arg)
{
    struct rank_thread *c = arg;
    struct fsdp_group_info info = {.name = "pair", .rank = c->rank, .size = 2,
                                   .world_ranks = ranks4, .world_rank = c->rank, .world_size = 2,
                                   .timeout_s = 3.0, .store = c->store, .local_rank = c->rank};
    c->rc = ops->create(&info, &c->be);
    snprintf(c->msg, sizeof(c->msg), "%s", fsdp_err_msg());
    fsdp_err_clear();
    return NULL;
}

static int check_uid_exchange(char *diag)
{
    struct fsdp_store *store = NULL;
    struct rank_thread cr[2];
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
            pthread_create(&cr[r].tid, NULL, create_rank, &cr[r]);
        }
        for (int r = 0; r < 2; r++) {
            pthread_join(cr[r].tid, NULL);
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

/* Both ranks send first, then receive, then wait: only a send and a recv
 * handed to NCCL in one group can complete. Then a barrier, which must
 * follow the exchange. */
static void *exchange_rank(void *arg)
{
    struct rank_thread *c = arg;
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct fsdp_work *ws = NULL, *wr = NULL, *wb = NULL;
    int peer = 1 - c->rank, rc;

    create_rank(c);
    if (c->rc < 0) {
        return NULL;
    }
    cudaMalloc((void **)&c->a, 16 * sizeof(int32_t));
    cudaMalloc((void **)&c->b, 16 * sizeof(int32_t));
    for (int i = 0; i < 16; i++) {
        c->a[i] = 100 * c->rank + i;
        c->b[i] = -1;
    }
    rc = ops->send(c->be, c->a, 16, FSDP_I32, peer, &attr, &ws);
    if (rc == 0) {
        rc = ops->recv(c->be, c->b, 16, FSDP_I32, peer, &attr, &wr);
    }
    if (rc == 0) {
        rc = ops->work_wait(ws, 10.0);
    }
    if (rc == 0) {
        rc = ops->work_wait(wr, 10.0);
    }
    if (rc == 0) {
        rc = ops->barrier(c->be, &wb);
    }
    if (rc == 0) {
        rc = ops->work_wait(wb, 10.0);
    }
    c->rc = rc;
    snprintf(c->msg, sizeof(c->msg), "%s", fsdp_err_msg());
    fsdp_err_clear();
    if (rc < 0) {
        ops->abort(c->be, "exchange failed");
    }
    ops->work_free(ws);
    ops->work_free(wr);
    ops->work_free(wb);
    return NULL;
}

static int check_exchange(char *diag)
{
    struct fsdp_store *store = NULL;
    struct rank_thread cr[2];
    int ok = 0, groups = sim_group_launches;

    memset(cr, 0, sizeof(cr));
    sim_ndev = 2;
    EXPECT(fsdp_store_mem_create(5.0, &store) == 0, "mem store: %s", fsdp_err_msg());
    for (int r = 0; r < 2; r++) {
        cr[r].store = store;
        cr[r].rank = r;
        pthread_create(&cr[r].tid, NULL, exchange_rank, &cr[r]);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(cr[r].tid, NULL);
    }
    for (int r = 0; r < 2; r++) {
        EXPECT(cr[r].rc == 0, "rank %d: rc %d: %s", r, cr[r].rc, cr[r].msg);
        for (int i = 0; i < 16; i++) {
            int32_t want = 100 * (1 - r) + i;
            EXPECT(cr[r].b[i] == want, "rank %d: element %d is %d, want %d", r, i,
                   (int)cr[r].b[i], (int)want);
        }
    }
    EXPECT(sim_group_launches >= groups + 2, "the exchanges reached NCCL in %d group(s), want 2",
           sim_group_launches - groups);
    ok = 1;
out:
    for (int r = 0; r < 2; r++) {
        if (cr[r].be) {
            ops->destroy(cr[r].be);
        }
        cudaFree(cr[r].a);
        cudaFree(cr[r].b);
    }
    fsdp_store_destroy(store);
    return ok;
}

// ----------------------------------------------------------------------------
// per-thread device hygiene

struct other_thread {
    struct fsdp_backend *be;
    void *buf;
    int rc;
    int dev;
    char msg[DIAG_LEN];
};

/* A thread that never chose a device issues, tests, waits and frees. */
static void *other_thread_main(void *arg)
{
    struct other_thread *o = arg;
    struct fsdp_work *w = NULL;
    int done = 0;
    for (int k = 0; k < 3 && o->rc == 0; k++) {
        o->rc = allreduce(o->be, o->buf, 4, NULL, &w);
        if (o->rc == 0) {
            o->rc = ops->work_test(w, &done);
        }
        if (o->rc == 0) {
            o->rc = ops->work_wait(w, 1.0);
        }
        if (w) {
            ops->work_free(w);
            w = NULL;
        }
    }
    if (o->rc == 0) {
        o->rc = ops->barrier(o->be, &w);
    }
    if (o->rc == 0) {
        o->rc = ops->work_wait(w, 1.0);
        ops->work_free(w);
    }
    snprintf(o->msg, sizeof(o->msg), "%s", fsdp_err_msg());
    fsdp_err_clear();
    cudaGetDevice(&o->dev);
    return NULL;
}

static int check_thread_device(char *diag)
{
    struct fsdp_backend *be;
    struct other_thread o = {0};
    pthread_t tid;
    char *buf = NULL;
    int ok = 0, sets;

    sim_ndev = 2;
    be = make(1, 5.0, diag); /* cuda:1 */
    if (be == NULL) {
        goto out;
    }
    cudaMalloc((void **)&buf, 64);
    EXPECT(sim_ctx[0] == 0, "creating the instance on cuda:1 made a context on cuda:0");
    sets = sim_set_devices;
    o.be = be;
    o.buf = buf;
    EXPECT(pthread_create(&tid, NULL, other_thread_main, &o) == 0, "pthread_create failed");
    pthread_join(tid, NULL);
    EXPECT(o.rc == 0, "ops from a second thread: rc %d: %.400s", o.rc, o.msg);
    EXPECT(sim_ctx[0] == 0, "a thread that never chose a device made a context on cuda:0");
    EXPECT(o.dev == 1, "the thread's device after the ops: %d, want 1", o.dev);
    EXPECT(sim_set_devices - sets == 1, "the thread's device was set %d times for 4 ops, want once",
           sim_set_devices - sets);
    ok = 1;
out:
    fsdp_err_clear();
    cudaFree(buf);
    if (be) {
        ops->destroy(be);
    }
    return ok;
}

/* stderr of fn(arg) in buf. */
static void capture_stderr(void (*fn)(void *), void *arg, char *buf, size_t len)
{
    FILE *tmp = tmpfile();
    int saved;
    size_t n = 0;
    buf[0] = '\0';
    if (tmp == NULL) {
        fn(arg);
        return;
    }
    fflush(stderr);
    saved = dup(2);
    dup2(fileno(tmp), 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    n = fread(buf, 1, len - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
}

struct make_args {
    int local_rank;
    char *diag;
    struct fsdp_backend *be;
};

static void make_quietly(void *arg)
{
    struct make_args *m = arg;
    m->be = make(m->local_rank, 5.0, m->diag);
}

static int check_share_warning(char *diag)
{
    struct make_args m = {3, diag, NULL};
    char err[2048];
    int ok = 0;

    sim_ndev = 1;
    setenv("CUDA_VISIBLE_DEVICES", "3", 1); /* the launcher gave this rank its own GPU */
    capture_stderr(make_quietly, &m, err, sizeof(err));
    if (m.be == NULL) {
        goto out;
    }
    EXPECT(strstr(err, "share") == NULL, "one GPU per rank (CUDA_VISIBLE_DEVICES=3, local rank "
           "3): warned '%.300s'", err);
    ops->destroy(m.be);
    m.be = NULL;
    unsetenv("CUDA_VISIBLE_DEVICES");
    m.local_rank = 1;
    capture_stderr(make_quietly, &m, err, sizeof(err));
    if (m.be == NULL) {
        goto out;
    }
    EXPECT(strstr(err, "processes share cuda:0") != NULL,
           "two local ranks on a host with one GPU must still warn (got '%.300s')", err);
    ok = 1;
out:
    unsetenv("CUDA_VISIBLE_DEVICES");
    if (m.be) {
        ops->destroy(m.be);
    }
    return ok;
}

/* fsdpc-bench puts its buffers on the device the backend uses. */
static int check_bench_device(char *diag)
{
    void *s = NULL;
    int ok = 0, rc;

    sim_ndev = 2;
    setenv("FSDPC_CUDA_DEVICE", "1", 1);
    rc = fsdp_bench_mem_stream_create(FSDP_MEM_CUDA, 0, &s);
    EXPECT(rc == 0 && sim_dev == 1, "FSDPC_CUDA_DEVICE=1, local rank 0: rc %d, device %d", rc,
           sim_dev);
    fsdp_bench_mem_stream_destroy(FSDP_MEM_CUDA, s);
    s = NULL;
    setenv("FSDPC_CUDA_DEVICE", "5", 1);
    rc = fsdp_bench_mem_stream_create(FSDP_MEM_CUDA, 0, &s);
    EXPECT(rc == FSDP_ERR_INVALID && s == NULL && strstr(fsdp_err_msg(), "FSDPC_CUDA_DEVICE='5'"),
           "FSDPC_CUDA_DEVICE=5 of 2 devices: rc %d: %s", rc, fsdp_err_msg());
    fsdp_err_clear();
    unsetenv("FSDPC_CUDA_DEVICE");
    sim_dev = 0;
    rc = fsdp_bench_mem_stream_create(FSDP_MEM_CUDA, 3, &s);
    EXPECT(rc == 0 && sim_dev == 1, "local rank 3 of 2 devices: rc %d, device %d", rc, sim_dev);
    ok = 1;
out:
    unsetenv("FSDPC_CUDA_DEVICE");
    fsdp_err_clear();
    fsdp_bench_mem_stream_destroy(FSDP_MEM_CUDA, s);
    return ok;
}

// ----------------------------------------------------------------------------
// the watchdog's hard exit, in a child process

/* An abort callback that never returns (a communicator abort stuck behind
 * another group's kernel, an MPI_Abort waiting for a dead peer). */
static void hang_hook(int exit_code, void *arg)
{
    (void)exit_code;
    (void)arg;
    for (;;) {
        pause();
    }
}

static int watchdog_child(void)
{
    static const int ranks[1] = {0};
    struct fsdp_flight *f = NULL;
    struct fsdp_watchdog *wd = NULL;
    struct fsdp_flight_entry e = {.seq = 1, .count = 4, .op = FSDP_COLL_ALLREDUCE,
                                  .redop = FSDP_SUM, .dtype = FSDP_F32};

    setenv("FSDPC_ABORT_TIMEOUT", "1", 1);
    if (fsdp_flight_create(16, 0, 1, "sim", &f) < 0 || fsdp_flight_add_group(f, "dp[0]", ranks, 1) < 0 ||
        fsdp_watchdog_start(f, &wd) < 0) {
        fprintf(stderr, "watchdog child: %s\n", fsdp_err_msg());
        return 3;
    }
    fsdp_set_abort_hook(hang_hook, NULL);
    e.group = 0;
    e.t_issue = fsdp_now();
    e.deadline_s = 0.01;
    fsdp_flight_issue(f, &e);
    sleep_s(60.0); /* the watchdog fires after its grace; the timer ends this */
    return 4;
}

static int check_watchdog_exit(char *diag)
{
    char exe[4096];
    char *argv[] = {exe, (char *)"--watchdog-child", NULL};
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int status = 0, ok = 0;
    double t0 = fsdp_now();
    char errpath[] = "/tmp/fsdpc-nccl-sim-XXXXXX", err[2048] = "";
    int fd = mkstemp(errpath);
    FILE *fe;

    EXPECT(n > 0 && fd >= 0, "cannot find this program's path or make a temporary file");
    exe[n] = '\0';
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 2);
    fflush(stdout);
    EXPECT(posix_spawn(&pid, exe, &fa, NULL, argv, environ) == 0, "posix_spawn %.200s failed",
           exe);
    posix_spawn_file_actions_destroy(&fa);
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (fsdp_now() - t0 > 20.0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            EXPECT(0, "the job abort hung in an abort callback for 20 s (child killed)");
        }
        sleep_s(0.02);
    }
    fe = fopen(errpath, "r");
    if (fe) {
        size_t k = fread(err, 1, sizeof(err) - 1, fe);
        err[k] = '\0';
        fclose(fe);
    }
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(err, "FSDPC_ABORT_TIMEOUT"),
           "child status 0x%x, stderr '%.300s'", status, err);
    tap_diag("child exited with status 1 after %.1f s", fsdp_now() - t0);
    ok = 1;
out:
    if (fd >= 0) {
        close(fd);
        unlink(errpath);
    }
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
    {"bad FSDPC_CUDA_DEVICE, LOCAL_RANK and FSDPC_INIT_TIMEOUT values refused", check_bad_env},
    {"NCCL_COMM_BLOCKING=1 refused in one line, 0 accepted", check_blocking_env},
    {"non-blocking init polled to completion, group name as commName (2.27+), nothing leaked",
     check_init_nonblocking},
    {"init that never completes times out, is aborted, leaks nothing", check_init_deadline},
    {"every dtype and op reaches NCCL with the right type and op", check_mapping},
    {"allgather, reduce_scatter, broadcast arguments; bad layouts, peers, memory refused",
     check_collective_args},
    {"caller stream used; without one the backend's own stream, no legacy-stream wait",
     check_streams},
    {"cudaStreamPerThread refused before NCCL (its launch thread would misread it)",
     check_per_thread_stream},
    {"a stream of another device is refused; the communicator stays usable",
     check_foreign_stream},
    {"after a sticky CUDA error the pointer check names the error", check_sticky_error},
    {"ncclInProgress on enqueue: the event is recorded only once queued",
     check_enqueue_in_progress},
    {"enqueue stuck past the deadline: sticky timeout, communicator aborted once",
     check_enqueue_stuck},
    {"an enqueue waiting for NCCL's launch thread does not block another thread's test",
     check_issue_unlocked},
    {"polling spins first, then yields, then sleeps with a growing interval", check_poll_plan},
    {"a short wait on a held stream times out and leaves the op pending", check_short_wait},
    {"op pending past the backend deadline: sticky timeout, communicator aborted", check_deadline},
    {"asynchronous NCCL error while pending: sticky peer error, aborted", check_async_error},
    {"CUDA error while pending: sticky backend error, aborted", check_cuda_error},
    {"the backend deadline is the longer of FSDPC_TIMEOUT and FSDPC_INIT_TIMEOUT",
     check_init_timeout},
    {"abort from another thread ends a wait with the reason", check_abort_thread},
    {"two groups on one stream, one stuck: aborting them in either order cannot hang",
     check_abort_two_groups},
    {"destroy never synchronises the device (another group's kernel stuck)",
     check_destroy_no_sync},
    {"work handles are pooled: no new events once warm", check_pool},
    {"count 0 skips NCCL; barrier is a 1-element device allreduce", check_zero_and_barrier},
    {"destroy finalizes and destroys cleanly, leaks nothing", check_destroy_clean},
    {"destroy with a stuck finalize aborts within the deadline", check_destroy_stuck},
    {"unique id exchanged through the store, fresh for each creation", check_uid_exchange},
    {"send-first exchange on 2 ranks: send/recv go to NCCL in one group, data right",
     check_exchange},
    {"a second thread makes no context on cuda:0 and sets the device once", check_thread_device},
    {"'processes share' warned only when they do (not with one GPU per rank)",
     check_share_warning},
    {"fsdpc-bench uses FSDPC_CUDA_DEVICE like the backend", check_bench_device},
    {"the watchdog's job abort exits even when an abort callback hangs (child process)",
     check_watchdog_exit},
};

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--watchdog-child") == 0) {
        return watchdog_child();
    }
    unsetenv("FSDPC_CUDA_DEVICE");
    unsetenv("LOCAL_RANK");
    unsetenv("MPI_LOCALRANKID");
    unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
    unsetenv("SLURM_LOCALID");
    unsetenv("NCCL_COMM_BLOCKING");
    unsetenv("CUDA_VISIBLE_DEVICES");
    setenv("FSDPC_INIT_TIMEOUT", SHORT_INIT_TIMEOUT, 1);
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
        char diag[DIAG_LEN] = "";
        int ok;
        sim_reset();
        ok = checks[i].fn(diag);
        if (ok && sim_misuse != 0) {
            snprintf(diag, DIAG_LEN, "NCCL misused %d time(s) (a call on a communicator in "
                     "progress or destroyed)", sim_misuse);
            ok = 0;
        }
        if (ok && sim_hangs != 0) {
            snprintf(diag, DIAG_LEN, "%d call(s) would have blocked for ever", sim_hangs);
            ok = 0;
        }
        if (!ok) {
            tap_diag("%s", diag);
        }
        tap_ok(ok, "%s", checks[i].name);
    }
    return tap_done();
}
