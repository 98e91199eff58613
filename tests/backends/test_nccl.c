/*
 * test_nccl.c - the nccl backend against host references.
 *
 * The plan is the same on every machine; what runs depends on the devices:
 *   no CUDA device   create() must fail with a message that says so; every
 *                    other check prints "ok N # SKIP no CUDA device".
 *   one or more      a one-rank communicator: every collective for every
 *                    dtype (in and out of place, own and caller streams),
 *                    argument checks (host memory, bad root, overlap), count
 *                    0, barrier, a short wait on a blocked stream, abort; and
 *                    in a child process, the backend deadline (5 s) on an op
 *                    held behind a host function.
 *   two or more      one thread per device (up to 4) forms a real group
 *                    through the in-process store: the collectives with
 *                    distinct data per rank, send/recv (paired, and sent
 *                    first on every rank), cudaStreamPerThread refused on
 *                    every rank, barrier; and in child processes: a thread
 *                    that never chose a device leaves no context on cuda:0,
 *                    and two groups sharing a stream, one of them stuck on
 *                    a peer that never comes, aborted by the watchdog's job
 *                    abort in the order that used to hang.
 * Values are small integers, so sums are exact in every dtype; only float
 * AVG (NCCL scales each input by 1/n first) is compared with a tolerance.
 */
#include "config.h"
#include "backends/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "comm/debug.h"
#include "comm/flight.h"
#include "core/util.h"
#include "rendezvous/store.h"
#include "tests/tap.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
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

#define MAX_RANKS 4
#define COUNT 1031 /* odd, not a multiple of any vector width */
#define DIAG_LEN 512

// ----------------------------------------------------------------------------
// data and host references

/* Element i of rank r's input: a small integer (i64 also uses the high bits). */
static double val(enum fsdp_dtype t, int r, size_t i)
{
    long long base = (long long)((i * 7 + (size_t)r * 13) % 17) - 8;
    switch (t) {
    case FSDP_U8: return (double)((i * 7 + (size_t)r * 13) % 60);
    case FSDP_I64: return (double)(base + ((long long)(i % 3) << 40));
    default: return (double)base;
    }
}

/* op over ranks 0..n-1 of element i; integer AVG truncates like C division. */
static double reduce_ref(enum fsdp_dtype t, enum fsdp_redop op, size_t i, int n)
{
    double acc = val(t, 0, i);
    for (int r = 1; r < n; r++) {
        double v = val(t, r, i);
        acc = op == FSDP_MAX ? fmax(acc, v) : op == FSDP_MIN ? fmin(acc, v) : acc + v;
    }
    if (op == FSDP_AVG) {
        /* integer sums stay below 2^53, so the double holds them exactly */
        return fsdp_dtype_is_float(t) ? acc / n : (double)((long long)acc / n);
    }
    return acc;
}

static double tolerance(enum fsdp_dtype t, enum fsdp_redop op, double ref)
{
    double scale = fmax(1.0, fabs(ref));
    if (op != FSDP_AVG || !fsdp_dtype_is_float(t)) {
        return 0.0;
    }
    return scale * (t == FSDP_F32 ? 1e-5 : t == FSDP_F16 ? 4e-3 : 5e-2);
}

/* What an output buffer must hold. */
enum expect_kind {
    EXPECT_REDUCED, /* element i: op over all ranks of val(r, i + off) */
    EXPECT_BLOCKS,  /* element i: val(i / blk, i % blk), rank blocks side by side */
    EXPECT_RANK,    /* element i: val(src, i) */
};

struct expect {
    enum fsdp_dtype t;
    enum fsdp_redop op;
    enum expect_kind kind;
    int nranks;
    size_t blk;
    size_t off;
    int src;
};

static double expected(const struct expect *e, size_t i)
{
    switch (e->kind) {
    case EXPECT_REDUCED: return reduce_ref(e->t, e->op, i + e->off, e->nranks);
    case EXPECT_BLOCKS: return val(e->t, (int)(i / e->blk), i % e->blk);
    case EXPECT_RANK: break;
    }
    return val(e->t, e->src, i);
}

/* Compares n elements; on a mismatch writes the first bad index, the count,
 * and the max abs/rel error into diag. Returns 1 when all match. */
static int compare(const void *got, size_t n, const struct expect *e, char *diag)
{
    size_t bad = 0, first = 0;
    double max_abs = 0, max_rel = 0, first_got = 0, first_want = 0;
    for (size_t i = 0; i < n; i++) {
        double want = expected(e, i), g = fsdp_dtype_get(got, e->t, i), d = fabs(g - want);
        if (!(d <= tolerance(e->t, e->op, want))) {
            if (bad++ == 0) {
                first = i;
                first_got = g;
                first_want = want;
            }
        }
        if (d > max_abs || d != d) {
            max_abs = d;
        }
        if (d / fmax(fabs(want), 1e-30) > max_rel) {
            max_rel = d / fmax(fabs(want), 1e-30);
        }
    }
    if (bad) {
        snprintf(diag, DIAG_LEN,
                 "first bad index %zu: got %.17g want %.17g; %zu of %zu bad; max abs "
                 "err %g, max rel err %g",
                 first, first_got, first_want, bad, n, max_abs, max_rel);
    }
    return bad == 0;
}

// ----------------------------------------------------------------------------
// the collective cases

enum case_kind {
    C_ALLREDUCE,
    C_ALLREDUCE_INPLACE,
    C_ALLGATHER,
    C_ALLGATHER_INPLACE,
    C_REDUCE_SCATTER,
    C_REDUCE_SCATTER_INPLACE,
    C_BROADCAST,
};

static const char *const case_names[] = {"allreduce", "allreduce in-place", "allgather",
                                         "allgather in-place", "reduce_scatter",
                                         "reduce_scatter in-place", "broadcast"};

struct tcase {
    enum case_kind kind;
    enum fsdp_dtype t;
    enum fsdp_redop op;
    size_t count; /* per rank */
};

#define MAX_CASES 96

/* The same list on every rank and every machine (the plan depends on it). */
static int make_cases(struct tcase *cs, int multi)
{
    int n = 0;
    for (int t = 0; t < FSDP_DTYPE_COUNT; t++) {
        enum fsdp_dtype dt = (enum fsdp_dtype)t;
        for (int op = 0; op < FSDP_REDOP_COUNT; op++) {
            cs[n++] = (struct tcase){C_ALLREDUCE, dt, (enum fsdp_redop)op, COUNT};
        }
        cs[n++] = (struct tcase){C_ALLREDUCE_INPLACE, dt, FSDP_SUM, COUNT};
        cs[n++] = (struct tcase){C_ALLGATHER, dt, FSDP_SUM, COUNT};
        cs[n++] = (struct tcase){C_ALLGATHER_INPLACE, dt, FSDP_SUM, COUNT};
        cs[n++] = (struct tcase){C_REDUCE_SCATTER, dt, FSDP_SUM, COUNT};
        if (multi) {
            cs[n++] = (struct tcase){C_REDUCE_SCATTER, dt, FSDP_MAX, COUNT};
            cs[n++] = (struct tcase){C_REDUCE_SCATTER_INPLACE, dt, FSDP_AVG, COUNT};
        }
        cs[n++] = (struct tcase){C_BROADCAST, dt, FSDP_SUM, COUNT};
    }
    cs[n++] = (struct tcase){C_ALLREDUCE, FSDP_F32, FSDP_SUM, (size_t)1 << 20};
    if (multi) {
        cs[n++] = (struct tcase){C_ALLGATHER, FSDP_BF16, FSDP_SUM, ((size_t)1 << 18) + 3};
    }
    return n;
}

static void case_name(const struct tcase *c, int size, char *buf, size_t len)
{
    int reduces = c->kind == C_ALLREDUCE || c->kind == C_ALLREDUCE_INPLACE ||
                  c->kind == C_REDUCE_SCATTER || c->kind == C_REDUCE_SCATTER_INPLACE;
    snprintf(buf, len, "%s %s%s%s n=%zu, %d rank(s)", case_names[c->kind], fsdp_dtype_name(c->t),
             reduces ? " " : "", reduces ? fsdp_redop_name(c->op) : "", c->count, size);
}

/* One rank's view: its backend, a caller stream and buffers made once. */
struct rank_ctx {
    const struct fsdp_backend_ops *ops;
    struct fsdp_backend *be;
    int rank;
    int size;
    cudaStream_t stream; /* the caller stream of half of the cases */
    char *d_a, *d_b;     /* (cap,) bytes on the device */
    char *h_a, *h_b;     /* (cap,) bytes on the host */
    size_t cap;
};

static size_t cases_bytes(const struct tcase *cs, int n, int size)
{
    size_t most = 64;
    for (int i = 0; i < n; i++) {
        size_t b = cs[i].count * fsdp_dtype_size(cs[i].t) * (size_t)size;
        most = b > most ? b : most;
    }
    return most;
}

static int ctx_buffers(struct rank_ctx *c, size_t cap, char *diag)
{
    cudaError_t ce;
    c->cap = cap;
    c->h_a = fsdp_alloc(cap);
    c->h_b = fsdp_alloc(cap);
    if (c->h_a == NULL || c->h_b == NULL) {
        snprintf(diag, DIAG_LEN, "no host memory for 2 x %zu bytes", cap);
        return 0;
    }
    ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess) {
        ce = cudaMalloc((void **)&c->d_a, cap);
    }
    if (ce == cudaSuccess) {
        ce = cudaMalloc((void **)&c->d_b, cap);
    }
    if (ce != cudaSuccess) {
        snprintf(diag, DIAG_LEN, "CUDA setup failed: %s", cudaGetErrorString(ce));
        return 0;
    }
    return 1;
}

static void ctx_release(struct rank_ctx *c)
{
    if (c->d_a) cudaFree(c->d_a);
    if (c->d_b) cudaFree(c->d_b);
    if (c->stream) cudaStreamDestroy(c->stream);
    fsdp_free(c->h_a);
    fsdp_free(c->h_b);
    memset(c, 0, sizeof(*c));
}

#define CU(call)                                                                         \
    do {                                                                                 \
        cudaError_t cu_e_ = (call);                                                      \
        if (cu_e_ != cudaSuccess) {                                                      \
            snprintf(diag, DIAG_LEN, "%s failed: %s", #call, cudaGetErrorString(cu_e_)); \
            return 0;                                                                    \
        }                                                                                \
    } while (0)

/* Issues one op, waits for it and reports the error in diag; 1 on success. */
static int finish(struct rank_ctx *c, int rc, struct fsdp_work *w, char *diag)
{
    if (rc < 0) {
        snprintf(diag, DIAG_LEN, "issue failed: %s (%s)", fsdp_err_msg(), fsdp_strerror(rc));
        fsdp_err_clear();
        return 0;
    }
    rc = c->ops->work_wait(w, 60.0);
    if (rc < 0) {
        snprintf(diag, DIAG_LEN, "wait failed: %s (%s)", fsdp_err_msg(), fsdp_strerror(rc));
        fsdp_err_clear();
        if (rc == FSDP_ERR_TIMEOUT) {
            return 0; /* still pending: the handle must not go back to the pool */
        }
    }
    c->ops->work_free(w);
    return rc == 0;
}

static int run_case(struct rank_ctx *c, const struct tcase *tc, int caller_stream, char *diag)
{
    size_t es = fsdp_dtype_size(tc->t), n = tc->count, N = (size_t)c->size, r = (size_t)c->rank;
    cudaStream_t s = caller_stream ? c->stream : 0; /* 0: the legacy default stream */
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, caller_stream ? (void *)c->stream : NULL};
    struct expect e = {tc->t, tc->op, EXPECT_REDUCED, c->size, n, 0, 0};
    struct fsdp_work *w = NULL;
    const char *out = c->d_b;
    size_t out_n = n, in_n = n;
    char *in = c->d_a;
    int root = c->size - 1, rc = 0;

    /* poison both buffers so that an op that writes nothing cannot pass */
    CU(cudaMemsetAsync(c->d_a, 0xA5, N * n * es, s));
    CU(cudaMemsetAsync(c->d_b, 0x5A, N * n * es, s));
    switch (tc->kind) {
    case C_ALLREDUCE_INPLACE:
    case C_BROADCAST:
        in = c->d_b;
        break;
    case C_ALLGATHER_INPLACE:
        in = c->d_b + r * n * es;
        break;
    case C_REDUCE_SCATTER:
        in_n = N * n;
        break;
    case C_REDUCE_SCATTER_INPLACE:
        in = c->d_b;
        in_n = N * n;
        break;
    default:
        break;
    }
    if (tc->kind != C_BROADCAST || c->rank == root) {
        for (size_t i = 0; i < in_n; i++) {
            fsdp_dtype_set(c->h_a, tc->t, i, val(tc->t, c->rank, i));
        }
        CU(cudaMemcpyAsync(in, c->h_a, in_n * es, cudaMemcpyHostToDevice, s));
    }
    if (!caller_stream) {
        /* without a stream the op follows nothing of the caller's: its
         * inputs must be ready when it is issued */
        CU(cudaStreamSynchronize(s));
    }
    switch (tc->kind) {
    case C_ALLREDUCE:
    case C_ALLREDUCE_INPLACE:
        rc = c->ops->allreduce(c->be, in, c->d_b, n, tc->t, tc->op, &attr, &w);
        break;
    case C_ALLGATHER:
    case C_ALLGATHER_INPLACE:
        rc = c->ops->allgather(c->be, in, c->d_b, n, tc->t, &attr, &w);
        e.kind = EXPECT_BLOCKS;
        out_n = N * n;
        break;
    case C_REDUCE_SCATTER:
        rc = c->ops->reduce_scatter(c->be, in, c->d_b, n, tc->t, tc->op, &attr, &w);
        e.off = r * n;
        break;
    case C_REDUCE_SCATTER_INPLACE:
        out = c->d_b + r * n * es;
        rc = c->ops->reduce_scatter(c->be, in, c->d_b + r * n * es, n, tc->t, tc->op, &attr, &w);
        e.off = r * n;
        break;
    case C_BROADCAST:
        rc = c->ops->broadcast(c->be, c->d_b, n, tc->t, root, &attr, &w);
        e.kind = EXPECT_RANK;
        e.src = root;
        break;
    }
    if (!finish(c, rc, w, diag)) {
        return 0;
    }
    CU(cudaMemcpy(c->h_b, out, out_n * es, cudaMemcpyDeviceToHost));
    return compare(c->h_b, out_n, &e, diag);
}

/* Ranks pair up (0-1, 2-3); the lower sends first, the higher receives first. */
static int run_sendrecv(struct rank_ctx *c, char *diag)
{
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct expect e = {FSDP_I32, FSDP_SUM, EXPECT_RANK, c->size, COUNT, 0, 0};
    struct fsdp_work *w = NULL;
    int peer = c->rank ^ 1, rc;
    size_t bytes = COUNT * sizeof(int32_t);

    if (peer >= c->size) {
        return 1; /* odd one out */
    }
    for (size_t i = 0; i < COUNT; i++) {
        fsdp_dtype_set(c->h_a, FSDP_I32, i, val(FSDP_I32, c->rank, i));
    }
    CU(cudaMemcpy(c->d_a, c->h_a, bytes, cudaMemcpyHostToDevice));
    CU(cudaMemset(c->d_b, 0x5A, bytes));
    for (int step = 0; step < 2; step++) {
        if ((step == 0) == (c->rank < peer)) {
            rc = c->ops->send(c->be, c->d_a, COUNT, FSDP_I32, peer, &attr, &w);
        } else {
            rc = c->ops->recv(c->be, c->d_b, COUNT, FSDP_I32, peer, &attr, &w);
        }
        if (!finish(c, rc, w, diag)) {
            return 0;
        }
    }
    CU(cudaMemcpy(c->h_b, c->d_b, bytes, cudaMemcpyDeviceToHost));
    e.src = peer;
    return compare(c->h_b, COUNT, &e, diag);
}

/* Every rank sends to its pair first, then receives, then waits: only a
 * send and a recv handed to NCCL in one group can complete. */
static int run_exchange(struct rank_ctx *c, char *diag)
{
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, c->stream};
    struct expect e = {FSDP_I32, FSDP_SUM, EXPECT_RANK, c->size, COUNT, 0, 0};
    struct fsdp_work *ws = NULL, *wr = NULL;
    int peer = c->rank ^ 1, rc;
    size_t bytes = COUNT * sizeof(int32_t);

    if (peer >= c->size) {
        return 1; /* odd one out */
    }
    for (size_t i = 0; i < COUNT; i++) {
        fsdp_dtype_set(c->h_a, FSDP_I32, i, val(FSDP_I32, c->rank, i));
    }
    CU(cudaMemcpyAsync(c->d_a, c->h_a, bytes, cudaMemcpyHostToDevice, c->stream));
    CU(cudaMemsetAsync(c->d_b, 0x5A, bytes, c->stream));
    rc = c->ops->send(c->be, c->d_a, COUNT, FSDP_I32, peer, &attr, &ws);
    if (rc == 0) {
        rc = c->ops->recv(c->be, c->d_b, COUNT, FSDP_I32, peer, &attr, &wr);
    }
    if (!finish(c, rc, ws, diag) || !finish(c, 0, wr, diag)) {
        return 0;
    }
    CU(cudaStreamSynchronize(c->stream));
    CU(cudaMemcpy(c->h_b, c->d_b, bytes, cudaMemcpyDeviceToHost));
    e.src = peer;
    return compare(c->h_b, COUNT, &e, diag);
}

/* cudaStreamPerThread would be NCCL's launch thread's stream: refused. */
static int run_per_thread_stream(struct rank_ctx *c, char *diag)
{
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, cudaStreamPerThread};
    struct fsdp_work *w = NULL;
    int rc;

    fsdp_err_clear();
    rc = c->ops->allreduce(c->be, c->d_a, c->d_b, 16, FSDP_F32, FSDP_SUM, &attr, &w);
    if (rc != FSDP_ERR_INVALID || w != NULL || strstr(fsdp_err_msg(), "cudaStreamPerThread") == NULL) {
        snprintf(diag, DIAG_LEN, "cudaStreamPerThread: rc %d (want %d): %s", rc, FSDP_ERR_INVALID,
                 fsdp_err_msg());
        fsdp_err_clear();
        if (rc == 0) {
            finish(c, 0, w, diag);
        }
        return 0;
    }
    fsdp_err_clear();
    return 1;
}

static int run_barrier(struct rank_ctx *c, char *diag)
{
    struct fsdp_work *w = NULL;
    int rc = c->ops->barrier(c->be, &w);
    return finish(c, rc, w, diag);
}

static int make_backend(struct rank_ctx *c, int rank, int size, const int *world_ranks,
                        struct fsdp_store *store, double timeout_s, char *diag)
{
    struct fsdp_group_info info = {
        .name = "test",
        .rank = rank,
        .size = size,
        .world_ranks = world_ranks,
        .world_rank = rank,
        .world_size = size,
        .nonce = 42,
        .timeout_s = timeout_s,
        .store = store,
        .local_rank = rank,
    };
    int rc;
    c->ops = &fsdp_nccl_ops;
    c->rank = rank;
    c->size = size;
    rc = c->ops->create(&info, &c->be);
    if (rc < 0) {
        snprintf(diag, DIAG_LEN, "create failed: %s (%s)", fsdp_err_msg(), fsdp_strerror(rc));
        fsdp_err_clear();
        return 0;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// a stream held by a host function: ops queued behind it stay pending

struct gate {
    atomic_int open;
    double max_s; /* opens by itself after this long */
};

static void gate_hold(void *arg)
{
    struct gate *g = arg;
    double t0 = fsdp_now();
    struct timespec ts = {0, 1000000};
    while (!atomic_load(&g->open) && fsdp_now() - t0 < g->max_s) {
        nanosleep(&ts, NULL);
    }
}

static int check_short_wait(struct rank_ctx *c, char *diag)
{
    struct gate g = {0, 20.0};
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, c->stream};
    struct fsdp_work *w = NULL;
    struct expect e = {FSDP_F32, FSDP_SUM, EXPECT_RANK, 1, 0, 0, 0};
    int done = -1, rc, rc_short, ok;

    for (size_t i = 0; i < COUNT; i++) {
        fsdp_dtype_set(c->h_a, FSDP_F32, i, val(FSDP_F32, 0, i));
    }
    CU(cudaMemcpy(c->d_a, c->h_a, COUNT * 4, cudaMemcpyHostToDevice));
    CU(cudaLaunchHostFunc(c->stream, gate_hold, &g));
    rc = c->ops->allreduce(c->be, c->d_a, c->d_b, COUNT, FSDP_F32, FSDP_SUM, &attr, &w);
    if (rc < 0) {
        atomic_store(&g.open, 1);
        cudaStreamSynchronize(c->stream);
        return finish(c, rc, w, diag);
    }
    rc = c->ops->work_test(w, &done);
    rc_short = c->ops->work_wait(w, 0.05);
    fsdp_err_clear();
    atomic_store(&g.open, 1);
    ok = rc == 0 && done == 0 && rc_short == FSDP_ERR_TIMEOUT;
    if (!ok) {
        snprintf(diag, DIAG_LEN, "behind a held stream: test rc %d done %d, 50 ms wait rc %d (want "
                 "0, 0, %d)", rc, done, rc_short, FSDP_ERR_TIMEOUT);
        cudaStreamSynchronize(c->stream);
        return 0;
    }
    if (!finish(c, 0, w, diag)) {
        return 0;
    }
    CU(cudaMemcpy(c->h_b, c->d_b, COUNT * 4, cudaMemcpyDeviceToHost));
    return compare(c->h_b, COUNT, &e, diag);
}

/* In a child process (the communicator is aborted with work queued): an op
 * stuck past the backend deadline fails with a sticky timeout. */
#define CHILD_DEADLINE_S 5.0 /* long enough for NCCL's first init */
#define CHILD_GATE_S 10.0    /* the held stream frees itself after this */

static int deadline_child(void)
{
    static struct gate g = {0, CHILD_GATE_S};
    struct rank_ctx c = {0};
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct fsdp_work *w = NULL;
    char diag[DIAG_LEN], msg[DIAG_LEN];
    int rc, rc2, ok;
    double t0, dt;

    setenv("FSDPC_INIT_TIMEOUT", "1", 1); /* the group deadline is the longer one */
    if (!make_backend(&c, 0, 1, (const int[]){0}, NULL, CHILD_DEADLINE_S, diag) ||
        !ctx_buffers(&c, 4096, diag)) {
        printf("# child: %s\n", diag);
        return 1;
    }
    attr.stream = c.stream;
    if (cudaLaunchHostFunc(c.stream, gate_hold, &g) != cudaSuccess) {
        printf("# child: cudaLaunchHostFunc failed\n");
        return 1;
    }
    rc = c.ops->allreduce(c.be, c.d_a, c.d_b, 16, FSDP_F32, FSDP_SUM, &attr, &w);
    if (rc < 0) {
        printf("# child: issue failed: %s\n", fsdp_err_msg());
        return 1;
    }
    t0 = fsdp_now();
    rc = c.ops->work_wait(w, 30.0);
    dt = fsdp_now() - t0;
    snprintf(msg, sizeof(msg), "%s", fsdp_err_msg());
    fsdp_err_clear();
    w = NULL;
    rc2 = c.ops->allreduce(c.be, c.d_a, c.d_b, 16, FSDP_F32, FSDP_SUM, &attr, &w);
    /* ncclCommAbort may wait for the held stream: up to CHILD_GATE_S */
    ok = rc == FSDP_ERR_TIMEOUT && dt > CHILD_DEADLINE_S - 1.0 && dt < CHILD_GATE_S + 5.0 &&
         strstr(msg, "did not complete within") &&
         strstr(msg, "aborted") && rc2 == FSDP_ERR_TIMEOUT && w == NULL;
    printf("# child: wait rc %d after %.2f s (%s); next op rc %d\n", rc, dt, msg, rc2);
    fflush(stdout);
    /* no teardown: work of the aborted communicator may still sit on the
     * held stream, and only this check's verdict matters */
    _exit(ok ? 0 : 1);
}

/* Runs this program with `flag` in a child: its exit status, or -1 when
 * it could not start, was killed by a signal or ran past limit_s (diag
 * says which). */
static int run_child(const char *flag, double limit_s, char *diag)
{
    char exe[4096];
    char *argv[] = {exe, (char *)flag, NULL};
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    pid_t pid;
    int status = 0;
    double t0 = fsdp_now();

    if (n <= 0) {
        snprintf(diag, DIAG_LEN, "cannot find this program's path");
        return -1;
    }
    exe[n] = '\0';
    fflush(stdout);
    if (posix_spawn(&pid, exe, NULL, NULL, argv, environ) != 0) {
        snprintf(diag, DIAG_LEN, "posix_spawn %.200s failed", exe);
        return -1;
    }
    while (waitpid(pid, &status, WNOHANG) == 0) {
        struct timespec ts = {0, 20000000};
        if (fsdp_now() - t0 > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            snprintf(diag, DIAG_LEN, "the child %s hung for %.0f s (killed)", flag, limit_s);
            return -1;
        }
        nanosleep(&ts, NULL);
    }
    if (!WIFEXITED(status)) {
        snprintf(diag, DIAG_LEN, "the child %s died (status 0x%x)", flag, status);
        return -1;
    }
    if (WEXITSTATUS(status) != 0) {
        snprintf(diag, DIAG_LEN, "the child %s exited with %d", flag, WEXITSTATUS(status));
    }
    return WEXITSTATUS(status);
}

static int check_deadline(char *diag)
{
    return run_child("--deadline-child", 60.0, diag) == 0;
}

// ----------------------------------------------------------------------------
// two or more devices, in child processes

/* Whether the primary context of device dev is active in this process,
 * asked of the driver (libcuda) directly; -1 when it cannot be asked. */
static int primary_ctx_active(int dev)
{
    typedef int (*cu_init_fn)(unsigned int);
    typedef int (*cu_device_get_fn)(int *, int);
    typedef int (*cu_ctx_state_fn)(int, unsigned int *, int *);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    cu_init_fn init;
    cu_device_get_fn get;
    cu_ctx_state_fn state;
    unsigned int flags = 0;
    int d = -1, active = -1;

    if (lib == NULL) {
        lib = dlopen("libcuda.so.1", RTLD_NOW);
    }
    if (lib == NULL) {
        return -1;
    }
    init = (cu_init_fn)dlsym(lib, "cuInit");
    get = (cu_device_get_fn)dlsym(lib, "cuDeviceGet");
    state = (cu_ctx_state_fn)dlsym(lib, "cuDevicePrimaryCtxGetState");
    if (init == NULL || get == NULL || state == NULL || init(0) != 0 || get(&d, dev) != 0 ||
        state(d, &flags, &active) != 0) {
        return -1;
    }
    return active;
}

struct ctx_thread {
    struct rank_ctx *c;
    int ok;
    char diag[DIAG_LEN];
};

/* A thread that never chose a device: issue, test, wait, free. */
static void *ctx_thread_main(void *arg)
{
    struct ctx_thread *t = arg;
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, t->c->stream};
    struct fsdp_work *w = NULL;
    int done = 0, rc;

    rc = t->c->ops->allreduce(t->c->be, t->c->d_a, t->c->d_b, COUNT, FSDP_F32, FSDP_SUM, &attr,
                              &w);
    if (rc == 0) {
        rc = t->c->ops->work_test(w, &done);
    }
    t->ok = finish(t->c, rc, w, t->diag);
    return NULL;
}

/* Child: the backend on cuda:1 (FSDPC_CUDA_DEVICE), used from a second
 * thread that never chose a device; cuda:0 must have no context in this
 * process afterwards. Nothing here touches cuda:0 itself. */
static int ctx_child(void)
{
    struct rank_ctx c = {0};
    struct ctx_thread t = {0};
    pthread_t tid;
    char diag[DIAG_LEN] = "";
    int active, ok;

    setenv("FSDPC_CUDA_DEVICE", "1", 1);
    if (!make_backend(&c, 0, 1, (const int[]){0}, NULL, 60.0, diag) ||
        !ctx_buffers(&c, COUNT * sizeof(float), diag)) {
        printf("# ctx child: %s\n", diag);
        return 1;
    }
    t.c = &c;
    if (pthread_create(&tid, NULL, ctx_thread_main, &t) != 0) {
        printf("# ctx child: pthread_create failed\n");
        return 1;
    }
    pthread_join(tid, NULL);
    active = primary_ctx_active(0);
    ok = t.ok && active == 0;
    printf("# ctx child: ops from a second thread %s%s; cuda:0 primary context %s\n",
           t.ok ? "passed" : "failed: ", t.ok ? "" : t.diag,
           active < 0 ? "unknown (no libcuda)" : active ? "ACTIVE" : "inactive");
    fflush(stdout);
    c.ops->destroy(c.be);
    ctx_release(&c);
    return active < 0 ? 77 : ok ? 0 : 1;
}

/* The abort child's state, for its abort hook. */
static struct {
    struct rank_ctx stuck;   /* rank 0 of "stuck", whose rank 1 never joins a collective */
    struct rank_ctx other;   /* a 1-rank group on the same device */
    struct fsdp_work *ws, *wo;
    struct fsdp_store *store;
    atomic_int peer_made;
} ab;

struct peer_thread {
    struct rank_ctx c;
    char diag[DIAG_LEN];
};

/* Rank 1 of "stuck": takes part in one allreduce (NCCL connects on first
 * use, which needs both ranks), then in none. */
static void *stuck_peer_main(void *arg)
{
    struct peer_thread *p = arg;
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct fsdp_work *w = NULL;
    int ok = make_backend(&p->c, 1, 2, (const int[]){0, 1}, ab.store, 30.0, p->diag) &&
             ctx_buffers(&p->c, 4096, p->diag);
    attr.stream = p->c.stream;
    ok = ok && finish(&p->c, p->c.ops->allreduce(p->c.be, p->c.d_a, p->c.d_a, 16, FSDP_F32,
                                                  FSDP_SUM, &attr, &w), w, p->diag);
    atomic_store(&ab.peer_made, ok ? 1 : -1);
    for (;;) {
        pause(); /* present, never in a collective */
    }
    return NULL;
}

/* The job abort as the dist layer runs it: every group's abort callback in
 * registration order (the healthy group first), then the end of the
 * process. Exit 3 when both communicators were aborted within 20 s. */
static void abort_hook_two_groups(int exit_code, void *arg)
{
    double t0 = fsdp_now(), dt;
    (void)exit_code;
    (void)arg;
    ab.other.ops->abort(ab.other.be, "watchdog");
    ab.stuck.ops->abort(ab.stuck.be, "watchdog");
    /* destroy waits up to 10 s for its communicator's abort to return */
    ab.other.ops->destroy(ab.other.be);
    ab.stuck.ops->destroy(ab.stuck.be);
    dt = fsdp_now() - t0;
    printf("# abort child: both groups aborted and destroyed in %.2f s\n", dt);
    fflush(stdout);
    _exit(dt < 20.0 ? 3 : 5);
}

/* Child: two groups queue on one stream, the first stuck; the watchdog
 * fires on it and aborts the job. */
static int abort_child(void)
{
    static const int pair[2] = {0, 1};
    static struct peer_thread peer;
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct fsdp_flight_entry e = {.seq = 1, .count = 16, .op = FSDP_COLL_ALLREDUCE,
                                  .redop = FSDP_SUM, .dtype = FSDP_F32};
    struct fsdp_flight *f = NULL;
    struct fsdp_watchdog *wd = NULL;
    pthread_t tid;
    char diag[DIAG_LEN] = "";
    int rc;

    setenv("FSDPC_INIT_TIMEOUT", "1", 1);
    setenv("FSDPC_ABORT_TIMEOUT", "40", 1);
    unsetenv("FSDPC_CUDA_DEVICE");
    atomic_init(&ab.peer_made, 0);
    if (fsdp_store_mem_create(30.0, &ab.store) < 0 ||
        pthread_create(&tid, NULL, stuck_peer_main, &peer) != 0) {
        printf("# abort child: setup failed\n");
        return 1;
    }
    if (!make_backend(&ab.stuck, 0, 2, pair, ab.store, 30.0, diag) ||
        !make_backend(&ab.other, 0, 1, pair, NULL, 30.0, diag) ||
        !ctx_buffers(&ab.stuck, 4096, diag)) {
        printf("# abort child: %s\n", diag);
        return 1;
    }
    attr.stream = ab.stuck.stream; /* the one stream both groups use */
    if (!finish(&ab.stuck, ab.stuck.ops->allreduce(ab.stuck.be, ab.stuck.d_a, ab.stuck.d_a, 16,
                                                   FSDP_F32, FSDP_SUM, &attr, &ab.ws),
                ab.ws, diag)) {
        printf("# abort child: first allreduce of the pair: %s\n", diag);
        return 1;
    }
    ab.ws = NULL;
    while (atomic_load(&ab.peer_made) == 0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (atomic_load(&ab.peer_made) < 0) {
        printf("# abort child: peer: %s\n", peer.diag);
        return 1;
    }
    rc = ab.stuck.ops->allreduce(ab.stuck.be, ab.stuck.d_a, ab.stuck.d_a, 16, FSDP_F32, FSDP_SUM,
                                 &attr, &ab.ws);
    if (rc == 0) {
        rc = ab.other.ops->allreduce(ab.other.be, ab.stuck.d_b, ab.stuck.d_b, 16, FSDP_F32,
                                     FSDP_SUM, &attr, &ab.wo);
    }
    if (rc < 0) {
        printf("# abort child: issue: %s\n", fsdp_err_msg());
        return 1;
    }
    if (fsdp_flight_create(16, 0, 2, "gpu", &f) < 0 ||
        fsdp_flight_add_group(f, "stuck", pair, 2) < 0) {
        printf("# abort child: flight recorder: %s\n", fsdp_err_msg());
        return 1;
    }
    e.group = 0;
    e.t_issue = fsdp_now();
    e.deadline_s = 1.0;
    fsdp_flight_issue(f, &e);
    fsdp_set_abort_hook(abort_hook_two_groups, NULL);
    if (fsdp_watchdog_start(f, &wd) < 0) {
        printf("# abort child: watchdog: %s\n", fsdp_err_msg());
        return 1;
    }
    for (int i = 0; i < 120; i++) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL); /* the watchdog fires after about 2 s */
    }
    printf("# abort child: the watchdog never fired\n");
    return 4;
}

// ----------------------------------------------------------------------------
// sections

/* Prints diag (when failing) before the TAP line, as tap.h asks. */
static void report(int ok, const char *diag, const char *name)
{
    if (!ok && diag[0]) {
        tap_diag("%s", diag);
    }
    tap_ok(ok, "%s", name);
}

static void skip_n(int n, const char *why)
{
    for (int i = 0; i < n; i++) {
        tap_skip("%s", why);
    }
}

static void section_nodev(int ndev)
{
    struct fsdp_backend *be = NULL;
    struct fsdp_group_info info = {.name = "nodev", .rank = 0, .size = 1, .timeout_s = 5.0,
                                   .local_rank = 0};
    const int ranks[1] = {0};
    int rc, ok;

    if (ndev > 0) {
        tap_skip("a CUDA device is present");
        return;
    }
    info.world_ranks = ranks;
    fsdp_err_clear();
    rc = fsdp_nccl_ops.create(&info, &be);
    ok = rc == FSDP_ERR_BACKEND && be == NULL &&
         strstr(fsdp_err_msg(), "no CUDA device visible on host") != NULL &&
         strstr(fsdp_err_msg(), "CUDA_VISIBLE_DEVICES=") != NULL;
    tap_diag("create without a device: rc %d: %s", rc, fsdp_err_msg());
    fsdp_err_clear();
    tap_ok(ok, "create without a CUDA device fails and says so");
}

#define SINGLE_FIRST 6 /* create, capabilities, host memory, mislabelled host memory, bad args,
                          cudaStreamPerThread */
#define SINGLE_LAST 5  /* count 0, barrier, short wait, abort, deadline */

static int single_args(struct rank_ctx *c, char *diag)
{
    struct fsdp_coll_attr host = {FSDP_MEM_HOST, NULL}, cuda = {FSDP_MEM_CUDA, NULL};
    struct fsdp_work *w = NULL;
    int rc;

    fsdp_err_clear();
    rc = c->ops->broadcast(c->be, c->d_a, 16, FSDP_F32, 1, &cuda, &w);
    if (rc != FSDP_ERR_INVALID || w != NULL) {
        snprintf(diag, DIAG_LEN, "broadcast root 1 in a group of 1: rc %d", rc);
        return 0;
    }
    fsdp_err_clear();
    rc = c->ops->allreduce(c->be, c->d_a, c->d_a + 4, 16, FSDP_F32, FSDP_SUM, &cuda, &w);
    if (rc != FSDP_ERR_INVALID || strstr(fsdp_err_msg(), "overlap") == NULL) {
        snprintf(diag, DIAG_LEN, "partly overlapping allreduce: rc %d: %s", rc, fsdp_err_msg());
        return 0;
    }
    fsdp_err_clear();
    rc = c->ops->allreduce(c->be, c->d_a, c->d_b, 16, (enum fsdp_dtype)99, FSDP_SUM, &cuda, &w);
    if (rc != FSDP_ERR_INVALID) {
        snprintf(diag, DIAG_LEN, "dtype 99: rc %d", rc);
        return 0;
    }
    fsdp_err_clear();
    rc = c->ops->allgather(c->be, c->d_a, c->d_b, 16, FSDP_F32, NULL, &w);
    if (rc != FSDP_ERR_INVALID || strstr(fsdp_err_msg(), "needs CUDA device buffers") == NULL) {
        snprintf(diag, DIAG_LEN, "allgather without attributes: rc %d: %s", rc, fsdp_err_msg());
        return 0;
    }
    fsdp_err_clear();
    (void)host;
    return 1;
}

static int single_memory(struct rank_ctx *c, enum fsdp_mem mem, const char *want, char *diag)
{
    struct fsdp_coll_attr attr = {mem, NULL};
    struct fsdp_work *w = NULL;
    int rc;

    fsdp_err_clear();
    rc = c->ops->allreduce(c->be, c->h_a, c->h_b, 16, FSDP_F32, FSDP_SUM, &attr, &w);
    if (rc != FSDP_ERR_INVALID || w != NULL || strstr(fsdp_err_msg(), want) == NULL) {
        snprintf(diag, DIAG_LEN, "host buffers, attr->mem %d: rc %d, message '%s' (want '%s')",
                 (int)mem, rc, fsdp_err_msg(), want);
        fsdp_err_clear();
        return 0;
    }
    tap_diag("host buffers, attr->mem %d: %s", (int)mem, fsdp_err_msg());
    fsdp_err_clear();
    return 1;
}

static int single_abort(struct rank_ctx *c, char *diag)
{
    struct rank_ctx c2 = {0};
    struct fsdp_coll_attr attr = {FSDP_MEM_CUDA, NULL};
    struct fsdp_work *w = NULL;
    int rc, ok;

    if (!make_backend(&c2, 0, 1, (const int[]){0}, NULL, 60.0, diag)) {
        return 0;
    }
    c2.ops->abort(c2.be, "test abort");
    fsdp_err_clear();
    rc = c2.ops->allreduce(c2.be, c->d_a, c->d_b, 16, FSDP_F32, FSDP_SUM, &attr, &w);
    ok = rc == FSDP_ERR_ABORTED && w == NULL && strstr(fsdp_err_msg(), "test abort") != NULL;
    if (!ok) {
        snprintf(diag, DIAG_LEN, "allreduce after abort: rc %d: %s", rc, fsdp_err_msg());
    }
    fsdp_err_clear();
    c2.ops->destroy(c2.be);
    return ok;
}

static void section_single(int ndev)
{
    static struct tcase cs[MAX_CASES];
    int ncs = make_cases(cs, 0), total = SINGLE_FIRST + ncs + SINGLE_LAST;
    struct rank_ctx c = {0};
    struct fsdp_coll_attr zattr = {FSDP_MEM_CUDA, NULL};
    struct fsdp_backend_caps caps = {0};
    struct fsdp_work *w = NULL;
    char diag[DIAG_LEN] = "", name[128];
    int ok;

    if (ndev == 0) {
        skip_n(total, "no CUDA device");
        return;
    }
    ok = make_backend(&c, 0, 1, (const int[]){0}, NULL, 60.0, diag) &&
         ctx_buffers(&c, cases_bytes(cs, ncs, 1), diag);
    report(ok, diag, "create a 1-rank communicator");
    if (!ok) {
        if (c.be) {
            c.ops->destroy(c.be);
        }
        ctx_release(&c);
        skip_n(total - 1, "no communicator");
        return;
    }

    c.ops->capabilities(c.be, &caps);
    tap_ok(c.ops->size == sizeof(struct fsdp_backend_ops) && strcmp(c.ops->name, "nccl") == 0 &&
           (caps.flags & (FSDP_CAP_MEM_CUDA | FSDP_CAP_SEND_RECV | FSDP_CAP_ASYNC_PROGRESS)) ==
               (FSDP_CAP_MEM_CUDA | FSDP_CAP_SEND_RECV | FSDP_CAP_ASYNC_PROGRESS) &&
           !(caps.flags & FSDP_CAP_MEM_HOST) && caps.dtypes == (1u << FSDP_DTYPE_COUNT) - 1 &&
           caps.redops == (1u << FSDP_REDOP_COUNT) - 1,
           "capabilities: CUDA memory, send/recv, async, every dtype and op");
    diag[0] = '\0';
    report(single_memory(&c, FSDP_MEM_HOST, "needs CUDA device buffers", diag), diag,
           "host memory is refused with a clear error");
    diag[0] = '\0';
    report(single_memory(&c, FSDP_MEM_CUDA, "host memory", diag), diag,
           "host buffers labelled CUDA are refused");
    diag[0] = '\0';
    report(single_args(&c, diag), diag, "bad root, overlap, dtype and missing attributes refused");
    diag[0] = '\0';
    report(run_per_thread_stream(&c, diag), diag, "cudaStreamPerThread refused (NCCL's launch "
           "thread would take it for its own)");

    for (int k = 0; k < ncs; k++) {
        diag[0] = '\0';
        case_name(&cs[k], 1, name, sizeof(name));
        ok = run_case(&c, &cs[k], k & 1, diag);
        snprintf(name + strlen(name), sizeof(name) - strlen(name), ", %s stream",
                 (k & 1) ? "caller" : "backend");
        report(ok, diag, name);
    }

    diag[0] = '\0';
    ok = finish(&c, c.ops->allreduce(c.be, NULL, NULL, 0, FSDP_F32, FSDP_SUM, &zattr, &w), w,
                diag);
    report(ok, diag, "allreduce of 0 elements completes");
    diag[0] = '\0';
    report(run_barrier(&c, diag), diag, "barrier, 1 rank");
    diag[0] = '\0';
    report(check_short_wait(&c, diag), diag,
           "a short wait on a held stream times out, the op completes later");
    diag[0] = '\0';
    report(single_abort(&c, diag), diag, "abort fails later ops with the reason");
    c.ops->destroy(c.be);
    ctx_release(&c);
    diag[0] = '\0';
    report(check_deadline(diag), diag,
           "an op stuck past the backend deadline aborts the communicator (child process)");
}

#define MULTI_EXTRA 5 /* create, send/recv, send-first exchange, cudaStreamPerThread, barrier */

struct rank_thread {
    pthread_t tid;
    int rank;
    int size;
    const int *world_ranks;
    struct fsdp_store *store;
    const struct tcase *cs;
    int ncs;
    int created;
    char create_diag[DIAG_LEN];
    int pass[MAX_CASES + 4];
    char diag[MAX_CASES + 4][DIAG_LEN];
};

static void *rank_main(void *arg)
{
    struct rank_thread *th = arg;
    struct rank_ctx c = {0};

    th->created = make_backend(&c, th->rank, th->size, th->world_ranks, th->store, 30.0,
                               th->create_diag) &&
                  ctx_buffers(&c, cases_bytes(th->cs, th->ncs, th->size), th->create_diag);
    if (th->created) {
        for (int k = 0; k < th->ncs; k++) {
            th->pass[k] = run_case(&c, &th->cs[k], k & 1, th->diag[k]);
        }
        th->pass[th->ncs] = run_sendrecv(&c, th->diag[th->ncs]);
        th->pass[th->ncs + 1] = run_exchange(&c, th->diag[th->ncs + 1]);
        th->pass[th->ncs + 2] = run_per_thread_stream(&c, th->diag[th->ncs + 2]);
        th->pass[th->ncs + 3] = run_barrier(&c, th->diag[th->ncs + 3]);
    }
    if (c.be) {
        c.ops->destroy(c.be);
    }
    ctx_release(&c);
    return NULL;
}

/* One TAP line for check k: passes when every rank passed. */
static void report_ranks(struct rank_thread *th, int size, int k, const char *name)
{
    char diag[DIAG_LEN + 32] = "";
    int ok = 1;
    for (int r = 0; r < size; r++) {
        if (!th[r].pass[k]) {
            if (ok) {
                snprintf(diag, sizeof(diag), "rank %d: %s", r, th[r].diag[k]);
            }
            ok = 0;
        }
    }
    report(ok, diag, name);
}

static void section_multi(int ndev)
{
    static struct tcase cs[MAX_CASES];
    static struct rank_thread th[MAX_RANKS];
    static const int ranks[MAX_RANKS] = {0, 1, 2, 3};
    int ncs = make_cases(cs, 1), size = ndev < MAX_RANKS ? ndev : MAX_RANKS, ok = 1;
    char diag[DIAG_LEN + 32] = "", name[128], why[96];
    struct fsdp_store *store;

    if (ndev < 2 || getenv("FSDPC_CUDA_DEVICE") != NULL) {
        if (ndev == 0) {
            snprintf(why, sizeof(why), "no CUDA device");
        } else if (ndev == 1) {
            snprintf(why, sizeof(why), "needs 2 CUDA devices, 1 visible");
        } else {
            snprintf(why, sizeof(why), "FSDPC_CUDA_DEVICE pins every rank to one device");
        }
        skip_n(ncs + MULTI_EXTRA, why);
        return;
    }
    if (fsdp_store_mem_create(30.0, &store) < 0) {
        fprintf(stderr, "test_nccl: in-process store: %s\n", fsdp_err_msg());
        exit(1);
    }
    for (int r = 0; r < size; r++) {
        th[r].rank = r;
        th[r].size = size;
        th[r].world_ranks = ranks;
        th[r].store = store;
        th[r].cs = cs;
        th[r].ncs = ncs;
        if (pthread_create(&th[r].tid, NULL, rank_main, &th[r]) != 0) {
            fprintf(stderr, "test_nccl: pthread_create failed\n");
            exit(1);
        }
    }
    for (int r = 0; r < size; r++) {
        pthread_join(th[r].tid, NULL);
        if (!th[r].created && ok) {
            snprintf(diag, sizeof(diag), "rank %d: %s", r, th[r].create_diag);
            ok = 0;
        }
    }
    snprintf(name, sizeof(name), "create a %d-rank communicator, one thread per device", size);
    report(ok, diag, name);
    if (!ok) {
        skip_n(ncs + MULTI_EXTRA - 1, "no communicator");
    } else {
        for (int k = 0; k < ncs; k++) {
            case_name(&cs[k], size, name, sizeof(name));
            snprintf(name + strlen(name), sizeof(name) - strlen(name), ", %s stream",
                     (k & 1) ? "caller" : "backend");
            report_ranks(th, size, k, name);
        }
        report_ranks(th, size, ncs, "send/recv between rank pairs");
        report_ranks(th, size, ncs + 1, "send-first exchange between rank pairs (one NCCL group)");
        report_ranks(th, size, ncs + 2, "cudaStreamPerThread refused on every rank");
        snprintf(name, sizeof(name), "barrier, %d ranks", size);
        report_ranks(th, size, ncs + 3, name);
    }
    fsdp_store_destroy(store);
}

/* Two or more devices, each check in a child process of its own. */
static void section_children(int ndev)
{
    char diag[DIAG_LEN] = "";
    int rc;

    if (ndev < 2 || getenv("FSDPC_CUDA_DEVICE") != NULL) {
        skip_n(2, ndev < 2 ? "needs 2 CUDA devices" : "FSDPC_CUDA_DEVICE pins the device");
        return;
    }
    rc = run_child("--ctx-child", 120.0, diag);
    if (rc == 77) {
        tap_skip("libcuda cannot be asked about contexts");
    } else {
        report(rc == 0, diag, "a second thread using the cuda:1 backend leaves no context on "
               "cuda:0 (child process)");
    }
    diag[0] = '\0';
    rc = run_child("--abort-child", 120.0, diag);
    if (rc == 1) {
        snprintf(diag, DIAG_LEN, "the hard-exit timer (or a setup failure) ended the child: "
                 "see its lines above");
    }
    report(rc == 3, diag, "two groups on one stream, one stuck: the watchdog's job abort aborts "
           "both and ends (child process)");
}

int main(int argc, char **argv)
{
    int ndev = 0;

    if (argc > 1 && strcmp(argv[1], "--deadline-child") == 0) {
        return deadline_child();
    }
    if (argc > 1 && strcmp(argv[1], "--ctx-child") == 0) {
        return ctx_child();
    }
    if (argc > 1 && strcmp(argv[1], "--abort-child") == 0) {
        return abort_child();
    }
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 0) {
        (void)cudaGetLastError();
        ndev = 0;
    }
    tap_diag("%d CUDA device(s) visible", ndev);
    section_nodev(ndev);
    section_single(ndev);
    section_multi(ndev);
    section_children(ndev);
    return tap_done();
}
