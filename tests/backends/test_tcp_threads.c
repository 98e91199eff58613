/*
 * test_tcp_threads.c - the tcp backend with every rank a thread of this
 * process, rendezvousing through an in-process store.
 *
 * Matrix: allreduce, reduce_scatter, allgather, broadcast (two roots) x
 * dtype x reduce op, world sizes 1-4, counts 0, 1, 7, 1000, 2^20+3, in and
 * out of place, under automatic algorithm choice, ring only (16 KiB chunks)
 * and small-message algorithms only (recursive doubling, chains, socket
 * buffers smaller than the messages); references exact for integers, to a
 * rounding bound for floats, results bitwise equal across ranks. Then queued
 * async ops, progress without waiting, send/recv, barrier, two groups at
 * once; and failures: intruders in setup, mismatched counts, a silent peer,
 * abort, destroy with an op pending.
 */
#include "config.h"
#include "backends/backend.h"
#include "backends/tcp/tcp.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "rendezvous/store.h"
#include "tests/tap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define NMAX 4
#define LARGE ((size_t)(1u << 20) + 3)
#define NONCE 0x5eed5eed12345678ull

/* The job key every rank holds (a wrong one where a test says so). */
static const struct fsdp_auth_key job_key = {.k = {0x5e, 0xed, 0x5e, 0xed, 1, 2, 3, 4, 5, 6, 7}};

static const struct fsdp_backend_ops *ops = &fsdp_tcp_ops;

// ----------------------------------------------------------------------------
// results: every rank records the same sequence of checks; main prints them

#define MAXCHECK 1024

struct result {
    char name[128];
    int ranks;             /* ranks that recorded it */
    int fail;
    char diag[512];
    int hashed;            /* hash[] must agree across ranks */
    uint64_t hash[NMAX];
};

static struct result results[MAXCHECK];
static int nresults;
static pthread_mutex_t results_mu = PTHREAD_MUTEX_INITIALIZER;

struct rank_ctx {
    int rank, n;
    int next;           /* index of this rank's next check */
    struct fsdp_backend *be;
    struct fsdp_store *store;
    char *a, *b, *c;    /* buffers of cap bytes */
    size_t cap;
    void *arg;
};

__attribute__((format(printf, 6, 7))) static void record(struct rank_ctx *x, int ok,
                                                         const char *diag, int hashed,
                                                         uint64_t hash, const char *fmt, ...)
{
    pthread_mutex_lock(&results_mu);
    int i = x->next++;
    struct result *r = &results[i];
    if (i >= nresults) {
        nresults = i + 1;
    }
    if (!r->ranks) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->name, sizeof(r->name), fmt, ap);
        va_end(ap);
    }
    r->ranks++;
    if (!ok && !r->fail) {
        snprintf(r->diag, sizeof(r->diag), "rank %d: %s", x->rank, diag ? diag : "");
    }
    r->fail |= !ok;
    r->hashed |= hashed;
    r->hash[x->rank] = hash;
    pthread_mutex_unlock(&results_mu);
}

static void flush_results(int expect_ranks)
{
    for (int i = 0; i < nresults; i++) {
        struct result *r = &results[i];
        int agree = 1;
        for (int q = 1; r->hashed && q < expect_ranks; q++) {
            agree &= r->hash[q] == r->hash[0];
        }
        if (r->ranks != expect_ranks) {
            tap_diag("%d of %d ranks ran this check", r->ranks, expect_ranks);
        } else if (r->fail) {
            tap_diag("%s", r->diag);
        } else if (!agree) {
            tap_diag("results differ bitwise across ranks");
        }
        tap_ok(r->ranks == expect_ranks && !r->fail && agree, "%s", r->name);
    }
    memset(results, 0, sizeof(results));
    nresults = 0;
}

// ----------------------------------------------------------------------------
// inputs and references

static uint32_t mix(uint32_t q, size_t i)
{
    uint32_t h = (uint32_t)i * 2654435761u ^ (q + 1) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return h;
}

/* Input of rank q at element i. The first elements are inexact in every
 * float type (rounding differences show); beyond them, multiples of 1/8 in
 * [-4, 4] whose sums are exact, which keeps the large checks cheap. */
#define INEXACT 2048

static double in_f(int q, size_t i)
{
    uint32_t h = mix((uint32_t)q, i);
    if (i < INEXACT) {
        return ((double)(h & 0xffff) / 65536.0 - 0.5) * 8.0;
    }
    return (double)((int)(h >> 26) - 32) / 8.0;
}

static int64_t in_i(int q, size_t i, enum fsdp_dtype t)
{
    uint32_t h = mix((uint32_t)q, i);
    return t == FSDP_U8 ? (int64_t)(h & 0xff) : (int64_t)(h >> 21) - 1024;
}

static void put(void *buf, enum fsdp_dtype t, size_t k, int q, size_t i)
{
    switch (t) {
    case FSDP_F32: ((float *)buf)[k] = (float)in_f(q, i); break;
    case FSDP_F16: ((uint16_t *)buf)[k] = fsdp_f32_to_f16((float)in_f(q, i)); break;
    case FSDP_BF16: ((uint16_t *)buf)[k] = fsdp_f32_to_bf16((float)in_f(q, i)); break;
    case FSDP_I32: ((int32_t *)buf)[k] = (int32_t)in_i(q, i, t); break;
    case FSDP_I64: ((int64_t *)buf)[k] = in_i(q, i, t); break;
    case FSDP_U8: ((uint8_t *)buf)[k] = (uint8_t)in_i(q, i, t); break;
    default: break;
    }
}

/* The value rank q contributes at element i, after rounding to t. */
static double stored(int q, size_t i, enum fsdp_dtype t)
{
    if (i >= INEXACT) {
        return in_f(q, i);
    }
    uint64_t cell = 0;
    put(&cell, t, 0, q, i);
    return fsdp_dtype_get(&cell, t, 0);
}

static double unit_roundoff(enum fsdp_dtype t)
{
    return t == FSDP_F32 ? 0x1p-23 : t == FSDP_F16 ? 0x1p-10 : 0x1p-7;
}

/* Reference for global element i: the reduction of all n ranks' inputs;
 * *mag receives the magnitude that bounds float rounding errors. */
static double reference(size_t i, enum fsdp_dtype t, enum fsdp_redop op, int n, double *mag)
{
    if (!fsdp_dtype_is_float(t)) {
        int64_t acc = in_i(0, i, t);
        for (int q = 1; q < n; q++) {
            int64_t x = in_i(q, i, t);
            acc = op == FSDP_MAX ? (x > acc ? x : acc) : op == FSDP_MIN ? (x < acc ? x : acc)
                                                                        : acc + x;
        }
        if (t == FSDP_U8) {
            acc &= 0xff;
        }
        *mag = 0;
        return (double)(op == FSDP_AVG ? acc / n : acc);
    }
    double acc = stored(0, i, t), m = acc < 0 ? -acc : acc;
    for (int q = 1; q < n; q++) {
        double x = stored(q, i, t);
        acc = op == FSDP_MAX ? (x > acc ? x : acc) : op == FSDP_MIN ? (x < acc ? x : acc)
                                                                    : acc + x;
        m += x < 0 ? -x : x;
    }
    *mag = op == FSDP_AVG ? m / n : op == FSDP_SUM ? m : 0;
    return op == FSDP_AVG ? acc / n : acc;
}

/* Checks len elements of got (starting at its element k0, global element
 * i0) against the reference: exact for integers, max and min; sums and
 * averages within (n + 1) roundings. Returns the first bad offset, or -1;
 * *gv, *want and *err describe it. */
static long check_range(const void *got, size_t k0, size_t i0, size_t len, enum fsdp_dtype t,
                        enum fsdp_redop op, int n, double *gv, double *want, double *err)
{
    double u = fsdp_dtype_is_float(t) ? unit_roundoff(t) * (n + 1) : 0;
    for (size_t j = 0; j < len; j++) {
        double mag, r = reference(i0 + j, t, op, n, &mag);
        double g = fsdp_dtype_get(got, t, k0 + j), e = g > r ? g - r : r - g;
        if (!(e <= u * mag)) {
            *gv = g;
            *want = r;
            *err = e;
            return (long)j;
        }
    }
    return -1;
}

/* Bitwise fingerprint of a result (word-wise, so it costs little). */
static uint64_t fingerprint(const void *buf, size_t bytes, uint64_t h)
{
    const unsigned char *p = buf;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    for (size_t i = bytes & ~(size_t)7; i < bytes; i++) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

// ----------------------------------------------------------------------------
// running ops

/* Waits for and frees the op just issued (the rc is evaluated
 * before *w is read, as the argument order of a call is unspecified). */
static int run(int rc, struct fsdp_work **w, char *msg, size_t len)
{
    if (rc == 0) {
        rc = ops->work_wait(*w, 30.0);
        ops->work_free(*w);
    }
    if (rc < 0) {
        snprintf(msg, len, "%s (%s)", fsdp_err_msg(), fsdp_strerror(rc));
        fsdp_err_clear();
    }
    return rc;
}

static const size_t counts_auto[] = {0, 1, 7, 1000, LARGE};
static const size_t counts_ring[] = {0, 1, 7, 1000, 100003};
static const size_t counts_small[] = {0, 1, 7, 1000, 100003};

/* FSDPC_TCP_* settings of a run; small socket buffers make messages larger
 * than what the kernel can hold, which is where gating mistakes deadlock.
 * (Tiny buffers with tiny chunks make the kernel prune receive queues and
 * retransmit after timeouts: correct, but slow; the ring run avoids that.) */
struct scenario {
    const char *label;
    const char *algo, *chunk, *direct, *sockbuf;
    const size_t *counts;
    int ncounts;
};

static const struct scenario scenarios[] = {
    {"auto", NULL, NULL, NULL, NULL, counts_auto, 5},
    {"ring", "ring", "16K", NULL, NULL, counts_ring, 5},
    {"small", "small", NULL, "1", "64K", counts_small, 5},
};

static void test_allreduce(struct rank_ctx *x, const struct scenario *sc, enum fsdp_dtype t,
                           enum fsdp_redop op)
{
    size_t es = fsdp_dtype_size(t);
    char diag[400] = "";
    int ok = 1;
    uint64_t h = 0;
    for (int ci = 0; ci < sc->ncounts && ok; ci++) {
        size_t count = sc->counts[ci];
        for (int inplace = 0; inplace < 2 && ok; inplace++) {
            char *src = x->a, *dst = inplace ? x->a : x->b;
            memcpy(src, x->c, count * es);
            struct fsdp_work *w = NULL;
            char msg[300];
            int rc = run(ops->allreduce(x->be, src, dst, count, t, op, NULL, &w), &w, msg,
                         sizeof(msg));
            if (rc < 0) {
                snprintf(diag, sizeof(diag), "count %zu %s: %s", count,
                         inplace ? "in place" : "out of place", msg);
                ok = 0;
                break;
            }
            /* each rank checks its slice; equal hashes extend it to all */
            size_t lo, len;
            fsdp_split_even(count, (size_t)x->n, (size_t)x->rank, &lo, &len);
            double g, want, err;
            long bad = check_range(dst, lo, lo, len, t, op, x->n, &g, &want, &err);
            if (bad >= 0) {
                snprintf(diag, sizeof(diag), "count %zu %s: first bad index %zu: got %.9g "
                         "want %.9g (error %.3g)", count, inplace ? "in place" : "out of place",
                         lo + (size_t)bad, g, want, err);
                ok = 0;
            }
            h = fingerprint(dst, count * es, h);
        }
    }
    record(x, ok, diag, 1, h, "n=%d %s allreduce %s %s", x->n, sc->label, fsdp_dtype_name(t),
           fsdp_redop_name(op));
}

static void test_reduce_scatter(struct rank_ctx *x, const struct scenario *sc, enum fsdp_dtype t,
                                enum fsdp_redop op)
{
    size_t es = fsdp_dtype_size(t);
    char diag[400] = "";
    int ok = 1;
    for (int ci = 0; ci < sc->ncounts && ok; ci++) {
        size_t count = sc->counts[ci];
        for (int inplace = 0; inplace < 2 && ok; inplace++) {
            size_t total = count * (size_t)x->n;
            char *src = x->a;
            char *dst = inplace ? x->a + (size_t)x->rank * count * es : x->b;
            memcpy(src, x->c, total * es);
            struct fsdp_work *w = NULL;
            char msg[300];
            int rc = run(ops->reduce_scatter(x->be, src, dst, count, t, op, NULL, &w), &w, msg,
                         sizeof(msg));
            if (rc < 0) {
                snprintf(diag, sizeof(diag), "count %zu %s: %s", count,
                         inplace ? "in place" : "out of place", msg);
                ok = 0;
                break;
            }
            size_t base = (size_t)x->rank * count;
            double g, want, err;
            long bad = check_range(dst, 0, base, count, t, op, x->n, &g, &want, &err);
            if (bad >= 0) {
                snprintf(diag, sizeof(diag), "count %zu %s: first bad index %ld: got %.9g "
                         "want %.9g (error %.3g)", count, inplace ? "in place" : "out of place",
                         bad, g, want, err);
                ok = 0;
            }
        }
    }
    record(x, ok, diag, 0, 0, "n=%d %s reduce_scatter %s %s", x->n, sc->label,
           fsdp_dtype_name(t), fsdp_redop_name(op));
}

static void test_allgather(struct rank_ctx *x, const struct scenario *sc, enum fsdp_dtype t)
{
    size_t es = fsdp_dtype_size(t);
    char diag[400] = "";
    int ok = 1;
    uint64_t h = 0;
    for (int ci = 0; ci < sc->ncounts && ok; ci++) {
        size_t count = sc->counts[ci];
        for (int inplace = 0; inplace < 2 && ok; inplace++) {
            char *dst = x->b;
            char *src = inplace ? x->b + (size_t)x->rank * count * es : x->a;
            memset(dst, 0xa5, count * es * (size_t)x->n);
            memcpy(src, x->c, count * es);
            struct fsdp_work *w = NULL;
            char msg[300];
            int rc = run(ops->allgather(x->be, src, dst, count, t, NULL, &w), &w, msg,
                         sizeof(msg));
            if (rc < 0) {
                snprintf(diag, sizeof(diag), "count %zu: %s", count, msg);
                ok = 0;
                break;
            }
            h = fingerprint(dst, count * es * (size_t)x->n, h);
            size_t lo, len;
            fsdp_split_even(count * (size_t)x->n, (size_t)x->n, (size_t)x->rank, &lo, &len);
            for (int q = 0; q < x->n && ok; q++) {
                for (size_t i = 0; i < count; i++) {
                    uint64_t cell = 0;
                    if ((size_t)q * count + i < lo || (size_t)q * count + i >= lo + len) {
                        continue;
                    }
                    put(&cell, t, 0, q, i);
                    if (memcmp(dst + ((size_t)q * count + i) * es, &cell, es) != 0) {
                        snprintf(diag, sizeof(diag), "count %zu %s: first bad index %zu (block "
                                 "%d element %zu)", count, inplace ? "in place" : "out of place",
                                 (size_t)q * count + i, q, i);
                        ok = 0;
                        break;
                    }
                }
            }
        }
    }
    record(x, ok, diag, 1, h, "n=%d %s allgather %s", x->n, sc->label, fsdp_dtype_name(t));
}

static void test_broadcast(struct rank_ctx *x, const struct scenario *sc, enum fsdp_dtype t)
{
    size_t es = fsdp_dtype_size(t);
    char diag[400] = "";
    int ok = 1;
    uint64_t h = 0;
    for (int ci = 0; ci < sc->ncounts && ok; ci++) {
        size_t count = sc->counts[ci];
        for (int root = 0; root < x->n && ok; root += x->n > 1 ? x->n - 1 : 1) {
            for (size_t i = 0; i < count; i++) {
                put(x->a, t, i, x->rank == root ? root : root + 1, i);
            }
            struct fsdp_work *w = NULL;
            char msg[300];
            int rc = run(ops->broadcast(x->be, x->a, count, t, root, NULL, &w), &w, msg,
                         sizeof(msg));
            if (rc < 0) {
                snprintf(diag, sizeof(diag), "count %zu root %d: %s", count, root, msg);
                ok = 0;
                break;
            }
            h = fingerprint(x->a, count * es, h);
            size_t lo, len;
            fsdp_split_even(count, (size_t)x->n, (size_t)x->rank, &lo, &len);
            for (size_t i = lo; i < lo + len; i++) {
                uint64_t cell = 0;
                put(&cell, t, 0, root, i);
                if (memcmp(x->a + i * es, &cell, es) != 0) {
                    snprintf(diag, sizeof(diag), "count %zu root %d: first bad index %zu", count,
                             root, i);
                    ok = 0;
                    break;
                }
            }
        }
    }
    record(x, ok, diag, 1, h, "n=%d %s broadcast %s", x->n, sc->label, fsdp_dtype_name(t));
}

// ----------------------------------------------------------------------------
// queued ops, progress, point-to-point, barrier

static void test_async(struct rank_ctx *x)
{
    enum { K = 6 };
    size_t count = 300000;
    struct fsdp_work *w[K];
    char msg[300] = "";
    int ok = 1;
    float *v = (float *)x->a; /* (K, count) */
    for (int k = 0; k < K; k++) {
        for (size_t i = 0; i < count; i++) {
            v[(size_t)k * count + i] = (float)(k + 1) * (float)(x->rank + 1);
        }
    }
    /* issue everything first, then wait in reverse order */
    for (int k = 0; k < K; k++) {
        if (ops->allreduce(x->be, v + (size_t)k * count, v + (size_t)k * count, count, FSDP_F32,
                           FSDP_SUM, NULL, &w[k]) < 0) {
            snprintf(msg, sizeof(msg), "issue %d: %s", k, fsdp_err_msg());
            record(x, 0, msg, 0, 0, "n=%d queued async allreduces complete", x->n);
            return;
        }
    }
    for (int k = K - 1; k >= 0; k--) {
        if (ops->work_wait(w[k], 30.0) < 0 && ok) {
            snprintf(msg, sizeof(msg), "op %d: %s", k, fsdp_err_msg());
            ok = 0;
        }
        ops->work_free(w[k]);
    }
    float want1 = (float)(x->n * (x->n + 1) / 2);
    for (int k = 0; k < K && ok; k++) {
        for (size_t i = 0; i < count; i++) {
            if (v[(size_t)k * count + i] != want1 * (float)(k + 1)) {
                snprintf(msg, sizeof(msg), "op %d: first bad index %zu: got %g want %g", k, i,
                         v[(size_t)k * count + i], want1 * (float)(k + 1));
                ok = 0;
                break;
            }
        }
    }
    record(x, ok, msg, 0, 0, "n=%d queued async allreduces complete in issue order", x->n);

    /* progress without waiting: test() alone must see the op finish */
    struct fsdp_work *pw;
    int done = 0, rc = ops->allgather(x->be, x->a, x->b, count, FSDP_F32, NULL, &pw);
    double t0 = fsdp_now();
    while (rc == 0 && !done && fsdp_now() - t0 < 30.0) {
        rc = ops->work_test(pw, &done);
        usleep(1000);
    }
    snprintf(msg, sizeof(msg), "rc %d done %d: %s", rc, done, fsdp_err_msg());
    record(x, rc == 0 && done, msg, 0, 0, "n=%d op completes while the caller only tests", x->n);
    if (rc == 0 || done) {
        ops->work_free(pw);
    }
}

static void test_p2p_barrier(struct rank_ctx *x)
{
    char msg[300] = "";
    int ok = 1;
    if (x->n > 1) {
        /* pass a token around the ring: rank 0 first sends, others first receive */
        int32_t *tok = (int32_t *)x->a;
        size_t count = 70000;
        int right = (x->rank + 1) % x->n, left = (x->rank + x->n - 1) % x->n;
        struct fsdp_work *w = NULL;
        if (x->rank == 0) {
            for (size_t i = 0; i < count; i++) {
                tok[i] = (int32_t)i;
            }
            ok &= run(ops->send(x->be, tok, count, FSDP_I32, right, NULL, &w), &w, msg,
                      sizeof(msg)) == 0;
            ok &= ok && run(ops->recv(x->be, tok, count, FSDP_I32, left, NULL, &w), &w, msg,
                            sizeof(msg)) == 0;
        } else {
            ok &= run(ops->recv(x->be, tok, count, FSDP_I32, left, NULL, &w), &w, msg,
                      sizeof(msg)) == 0;
            for (size_t i = 0; ok && i < count; i++) {
                tok[i] += 1;
            }
            ok &= ok && run(ops->send(x->be, tok, count, FSDP_I32, right, NULL, &w), &w, msg,
                            sizeof(msg)) == 0;
        }
        for (size_t i = 0; ok && x->rank == 0 && i < count; i++) {
            if (tok[i] != (int32_t)i + x->n - 1) {
                snprintf(msg, sizeof(msg), "token element %zu: got %d want %d", i, tok[i],
                         (int)i + x->n - 1);
                ok = 0;
            }
        }
        record(x, ok, msg, 0, 0, "n=%d send/recv around the ring", x->n);
    }
    struct fsdp_work *bw = NULL;
    ok = 1;
    for (int k = 0; k < 5 && ok; k++) {
        ok = run(ops->barrier(x->be, &bw), &bw, msg, sizeof(msg)) == 0;
    }
    record(x, ok, msg, 0, 0, "n=%d barrier x5", x->n);
}

// ----------------------------------------------------------------------------
// thread harness

typedef void (*rank_fn)(struct rank_ctx *x);

struct job {
    int n;
    const char *name;
    double timeout_s;
    struct fsdp_store *store;
    rank_fn body;
    const struct scenario *sc;
    size_t cap;
    int create_failed[NMAX];
    char create_msg[NMAX][300];
    void *arg;
    void (*before_create)(struct job *j, int rank);
    struct fsdp_store *store2; /* a second group's view of the store */
    const struct fsdp_auth_key *key_of[NMAX]; /* a rank's own key; NULL: job_key */
};

struct thread_arg {
    struct job *job;
    int rank;
};

/* The group info of rank `rank` of n: world ranks 0..n-1. */
static struct fsdp_group_info group_info(const char *name, int rank, int n, double timeout_s,
                                         struct fsdp_store *store)
{
    static const int world[NMAX] = {0, 1, 2, 3};
    return (struct fsdp_group_info){.name = name, .rank = rank, .size = n, .world_ranks = world,
                                    .world_rank = rank, .nonce = NONCE, .auth_key = &job_key,
                                    .timeout_s = timeout_s, .store = store};
}

static void *rank_main(void *p)
{
    struct thread_arg *ta = p;
    struct job *j = ta->job;
    struct rank_ctx x = {.rank = ta->rank, .n = j->n, .store = j->store, .cap = j->cap,
                         .arg = j->arg};
    if (j->before_create) {
        j->before_create(j, ta->rank);
    }
    struct fsdp_group_info info = group_info(j->name, ta->rank, j->n, j->timeout_s, j->store);
    if (j->key_of[ta->rank]) {
        info.auth_key = j->key_of[ta->rank];
    }
    if (ops->create(&info, &x.be) < 0) {
        j->create_failed[ta->rank] = 1;
        snprintf(j->create_msg[ta->rank], sizeof(j->create_msg[0]), "%s", fsdp_err_msg());
        return NULL;
    }
    if (j->cap) {
        x.a = fsdp_alloc(j->cap);
        x.b = fsdp_alloc(j->cap);
        x.c = fsdp_alloc(j->cap);
    }
    j->body(&x);
    ops->destroy(x.be);
    fsdp_free(x.a);
    fsdp_free(x.b);
    fsdp_free(x.c);
    return NULL;
}

static void run_job(struct job *j)
{
    pthread_t th[NMAX];
    struct thread_arg ta[NMAX];
    struct fsdp_store *base;
    double t0 = fsdp_now();
    if (fsdp_store_mem_create(20.0, &base) < 0 || fsdp_store_prefix(base, j->name, &j->store) < 0 ||
        fsdp_store_prefix(base, "second", &j->store2) < 0) {
        tap_ok(0, "store for %s: %s", j->name, fsdp_err_msg());
        return;
    }
    for (int r = 0; r < j->n; r++) {
        ta[r].job = j;
        ta[r].rank = r;
        pthread_create(&th[r], NULL, rank_main, &ta[r]);
    }
    for (int r = 0; r < j->n; r++) {
        pthread_join(th[r], NULL);
    }
    int failed = 0;
    for (int r = 0; r < j->n; r++) {
        if (j->create_failed[r]) {
            tap_diag("rank %d: %s", r, j->create_msg[r]);
            failed = 1;
        }
    }
    tap_diag("%s: %.2f s", j->name, fsdp_now() - t0);
    tap_ok(!failed, "%s: create on %d ranks", j->name, j->n);
    flush_results(j->n);
    fsdp_store_destroy(j->store);
    fsdp_store_destroy(j->store2);
    fsdp_store_destroy(base);
}

static void matrix_body(struct rank_ctx *x)
{
    struct job *j = x->arg;
    const struct scenario *sc = j->sc;
    size_t total = sc->counts[sc->ncounts - 1] * (size_t)x->n;
    for (int t = 0; t < FSDP_DTYPE_COUNT; t++) {
        /* this rank's inputs, copied into place before every op */
        for (size_t i = 0; i < total; i++) {
            put(x->c, (enum fsdp_dtype)t, i, x->rank, i);
        }
        for (int op = 0; op < FSDP_REDOP_COUNT; op++) {
            test_allreduce(x, sc, (enum fsdp_dtype)t, (enum fsdp_redop)op);
            test_reduce_scatter(x, sc, (enum fsdp_dtype)t, (enum fsdp_redop)op);
        }
        test_allgather(x, sc, (enum fsdp_dtype)t);
        test_broadcast(x, sc, (enum fsdp_dtype)t);
    }
    test_async(x);
    test_p2p_barrier(x);
}

static void set_scenario_env(const struct scenario *sc)
{
    unsetenv("FSDPC_TCP_ALGO");
    unsetenv("FSDPC_TCP_CHUNK_BYTES");
    unsetenv("FSDPC_TCP_DIRECT_MAX");
    unsetenv("FSDPC_TCP_SOCKBUF");
    if (sc && sc->sockbuf) {
        setenv("FSDPC_TCP_SOCKBUF", sc->sockbuf, 1);
    }
    if (sc && sc->algo) {
        setenv("FSDPC_TCP_ALGO", sc->algo, 1);
    }
    if (sc && sc->chunk) {
        setenv("FSDPC_TCP_CHUNK_BYTES", sc->chunk, 1);
    }
    if (sc && sc->direct) {
        setenv("FSDPC_TCP_DIRECT_MAX", sc->direct, 1);
    }
}

static void run_matrix(void)
{
    for (size_t s = 0; s < sizeof(scenarios) / sizeof(scenarios[0]); s++) {
        const struct scenario *sc = &scenarios[s];
        size_t maxc = sc->counts[sc->ncounts - 1];
        for (int n = s == 0 ? 1 : 2; n <= NMAX; n++) {
            char name[64];
            struct job j = {.n = n, .timeout_s = 20.0, .body = matrix_body, .sc = sc};
            snprintf(name, sizeof(name), "%s%d", sc->label, n);
            j.name = name;
            j.arg = &j;
            j.cap = (maxc > 1800000 ? maxc : 1800000) * 8 * (size_t)n + 4096;
            set_scenario_env(sc);
            run_job(&j);
        }
    }
    set_scenario_env(NULL);
}

// ----------------------------------------------------------------------------
// failures

/* Intruders knock on rank 1's listening port before rank 0 dials it. */
struct intruder {
    struct fsdp_store *store;
    int kind;     /* 0 garbage, 1 wrong nonce, 2 impostor rank, 3 silent, 4 right nonce
                     and a genuine hello but no key */
    int refused;  /* the backend closed the connection */
    int answered; /* kind 4: the backend answered its hello (it got that far) */
    pthread_t th;
};

#define NINTRUDERS 5
static struct intruder intruders[NINTRUDERS];
static atomic_int intruders_done;

static void *intruder_main(void *p)
{
    struct intruder *in = p;
    void *val;
    size_t len;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char addr[64];
    if (fsdp_store_get(in->store, "tcp/0/addr/1", &val, &len, 10.0) < 0) {
        return NULL;
    }
    snprintf(addr, sizeof(addr), "%.*s", (int)len, (char *)val);
    free(val);
    char *colon = strrchr(addr, ':');
    *colon = '\0';
    inet_pton(AF_INET, addr, &sa.sin_addr);
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return NULL;
    }
    struct tcp_hello h = {.magic = TCP_HELLO_MAGIC, .version = TCP_PROTO_VERSION,
                          .nonce = NONCE, .size = 2, .rank = 0};
    static const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    if (in->kind == 0) {
        (void)!write(fd, garbage, sizeof(garbage) - 1);
    } else if (in->kind == 1) {
        h.nonce = NONCE + 1;
        (void)!write(fd, &h, sizeof(h));
    } else if (in->kind == 2) {
        h.rank = 5;
        (void)!write(fd, &h, sizeof(h));
    }
    struct timeval tv = {.tv_sec = 15};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[256];
    ssize_t n;
    if (in->kind == 4) {
        /* rank 0's hello as the backend makes it: everything a process
         * that read the store could know */
        static const int world[2] = {0, 1};
        struct tcp_config cfg;
        fsdp_tcp_config_read(&cfg);
        h.group_hash = fsdp_hash64("intruders", strlen("intruders"), 0x7463700000000000ull);
        h.group_hash = fsdp_hash64(world, sizeof(world), h.group_hash);
        h.direct_max = cfg.direct_max;
        h.small_bytes = cfg.small_bytes;
        h.chunk_bytes = cfg.chunk_bytes;
        h.algo = cfg.algo;
        snprintf(h.addr, sizeof(h.addr), "127.0.0.1:9");
        (void)!write(fd, &h, sizeof(h));
        size_t got = 0, want = sizeof(h) + FSDP_AUTH_MAC_BYTES;
        while (got < want && (n = read(fd, buf, want - got < sizeof(buf) ? want - got : sizeof(buf))) > 0) {
            got += (size_t)n;
        }
        in->answered = got == want;
        static const unsigned char zero_mac[FSDP_AUTH_MAC_BYTES];
        (void)!write(fd, zero_mac, sizeof(zero_mac));
    }
    atomic_fetch_add(&intruders_done, 1);
    n = read(fd, buf, sizeof(buf));
    in->refused = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    close(fd);
    return NULL;
}

static void intruders_before_create(struct job *j, int rank)
{
    if (rank != 0) {
        return;
    }
    atomic_store(&intruders_done, 0);
    for (int k = 0; k < NINTRUDERS; k++) {
        intruders[k].store = j->store;
        intruders[k].kind = k;
        pthread_create(&intruders[k].th, NULL, intruder_main, &intruders[k]);
    }
    double t0 = fsdp_now();
    while (atomic_load(&intruders_done) < NINTRUDERS && fsdp_now() - t0 < 10.0) {
        usleep(1000);
    }
    usleep(50000); /* let rank 1 read the intruders first */
}

static void correct_allreduce(struct rank_ctx *x, struct fsdp_backend *be, const char *what)
{
    int32_t v[1000];
    char msg[300] = "";
    struct fsdp_work *w = NULL;
    for (int i = 0; i < 1000; i++) {
        v[i] = i * (x->rank + 1);
    }
    int ok = run(ops->allreduce(be, v, v, 1000, FSDP_I32, FSDP_SUM, NULL, &w), &w, msg,
                 sizeof(msg)) == 0;
    for (int i = 0; ok && i < 1000; i++) {
        if (v[i] != i * x->n * (x->n + 1) / 2) {
            snprintf(msg, sizeof(msg), "first bad index %d: got %d", i, v[i]);
            ok = 0;
        }
    }
    record(x, ok, msg, 0, 0, "%s", what);
}

static void intruders_body(struct rank_ctx *x)
{
    correct_allreduce(x, x->be, "setup refused intruders; the group computes correctly");
}

/* Ranks issue different ops; every rank must fail, naming the disagreement. */
static void mismatch_body(struct rank_ctx *x)
{
    char msg[300] = "";
    struct fsdp_work *w = NULL;
    float *v = (float *)x->a;
    size_t count = x->rank == 0 ? 100 : 200;
    int rc = run(ops->allreduce(x->be, v, v, count, FSDP_F32, FSDP_SUM, NULL, &w), &w, msg,
                 sizeof(msg));
    record(x, rc == FSDP_ERR_MISMATCH || (rc == FSDP_ERR_PEER && strstr(msg, "failed:")), msg,
           0, 0, "different counts fail on every rank");
    record(x, strstr(msg, "differ") != NULL, msg, 0, 0, "the message says counts differ");
    rc = run(ops->barrier(x->be, &w), &w, msg, sizeof(msg));
    record(x, rc < 0, msg, 0, 0, "the error is sticky: a later barrier fails at once");
}

static void kind_mismatch_body(struct rank_ctx *x)
{
    char msg[300] = "";
    struct fsdp_work *w = NULL;
    float *v = (float *)x->a;
    int rc = x->rank == 0 ? ops->allreduce(x->be, v, v, 64, FSDP_F32, FSDP_SUM, NULL, &w)
                          : ops->allgather(x->be, v, x->b, 32, FSDP_F32, NULL, &w);
    rc = run(rc, &w, msg, sizeof(msg));
    record(x, rc < 0 && strstr(msg, "different collectives"), msg, 0, 0,
           "allreduce against allgather fails naming different collectives");
}

/* Rank 1 never joins the collective: the others time out naming it, even
 * where they wait on a live rank that waits on rank 1 (ring, 3 ranks). */
static void silent_body(struct rank_ctx *x)
{
    char msg[300] = "";
    struct fsdp_work *w = NULL;
    if (x->rank == 1) {
        usleep(2000000);
        record(x, 1, NULL, 0, 0, "a silent rank is blamed by every waiting rank");
        record(x, 1, NULL, 0, 0, "the timeout fires within 2x the deadline");
        return;
    }
    float *v = (float *)x->a;
    size_t count = 1 << 20;
    double t0 = fsdp_now();
    int rc = run(ops->allreduce(x->be, v, v, count, FSDP_F32, FSDP_SUM, NULL, &w), &w, msg,
                 sizeof(msg));
    double dt = fsdp_now() - t0;
    record(x, rc < 0 && strstr(msg, "rank 1 (world rank 1") != NULL, msg, 0, 0,
           "a silent rank is blamed by every waiting rank");
    snprintf(msg, sizeof(msg), "took %.2f s", dt);
    record(x, dt < 2.0, msg, 0, 0, "the timeout fires within 2x the deadline");
}

static void abort_body(struct rank_ctx *x)
{
    char msg[300] = "";
    struct fsdp_work *w = NULL;
    float *v = (float *)x->a;
    if (x->rank == 0) {
        int rc = ops->allreduce(x->be, v, v, 1000, FSDP_F32, FSDP_SUM, NULL, &w);
        usleep(200000);
        double t0 = fsdp_now();
        ops->abort(x->be, "test abort");
        rc = run(rc, &w, msg, sizeof(msg));
        double dt = fsdp_now() - t0;
        record(x, rc == FSDP_ERR_ABORTED && strstr(msg, "test abort") && dt < 1.0, msg, 0, 0,
               "abort fails the pending op at once with its reason");
        rc = ops->barrier(x->be, &w);
        record(x, rc == FSDP_ERR_ABORTED, fsdp_err_msg(), 0, 0, "ops after abort fail");
        fsdp_err_clear();
        return;
    }
    usleep(400000);
    /* the first op may still complete from data rank 0 sent before it aborted */
    double t0 = fsdp_now();
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        rc = run(ops->allreduce(x->be, v, v, 1000, FSDP_F32, FSDP_SUM, NULL, &w), &w, msg,
                 sizeof(msg));
    }
    double dt = fsdp_now() - t0;
    record(x, rc == FSDP_ERR_PEER && dt < 1.0 && strstr(msg, "rank 0 (world rank 0"), msg, 0, 0,
           "abort fails the pending op at once with its reason");
    snprintf(msg, sizeof(msg), "rc %d after %.2f s", rc, dt);
    record(x, 1, msg, 0, 0, "ops after abort fail");
}

static void destroy_pending_body(struct rank_ctx *x)
{
    char msg[300] = "";
    struct fsdp_work *w = NULL;
    float *v = (float *)x->a;
    if (x->rank == 0) {
        int rc = ops->allreduce(x->be, v, v, 1 << 20, FSDP_F32, FSDP_SUM, NULL, &w);
        usleep(100000);
        double t0 = fsdp_now();
        ops->destroy(x->be);
        double dt = fsdp_now() - t0;
        if (rc == 0) {
            ops->work_free(w);
        }
        snprintf(msg, sizeof(msg), "destroy took %.3f s", dt);
        record(x, rc == 0 && dt < 0.5, msg, 0, 0, "destroy with an op pending returns at once");
        x->be = NULL;
        return;
    }
    usleep(300000);
    int rc = run(ops->allreduce(x->be, v, v, 1 << 20, FSDP_F32, FSDP_SUM, NULL, &w), &w, msg,
                 sizeof(msg));
    record(x, rc == FSDP_ERR_PEER, msg, 0, 0, "destroy with an op pending returns at once");
}

/* Two groups of the same ranks: one stalls while the other completes. */
static void two_groups_body(struct rank_ctx *x)
{
    struct job *j = x->arg;
    struct fsdp_group_info info = group_info("second", x->rank, x->n, 20.0, j->store2);
    struct fsdp_backend *b2;
    if (ops->create(&info, &b2) < 0) {
        record(x, 0, fsdp_err_msg(), 0, 0, "a second group progresses while the first waits");
        return;
    }
    float *v = (float *)x->a;
    size_t count = 1 << 20;
    struct fsdp_work *w1 = NULL;
    int rc = 0, ok = 1;
    char msg[300] = "";
    for (size_t i = 0; i < count; i++) {
        v[i] = 1.0f;
    }
    if (x->rank == 0) {
        rc = ops->allreduce(x->be, v, v, count, FSDP_F32, FSDP_SUM, NULL, &w1);
    }
    correct_allreduce(x, b2, "a second group progresses while the first waits");
    if (x->rank != 0) {
        rc = ops->allreduce(x->be, v, v, count, FSDP_F32, FSDP_SUM, NULL, &w1);
    }
    rc = run(rc, &w1, msg, sizeof(msg));
    for (size_t i = 0; rc == 0 && ok && i < count; i++) {
        ok = v[i] == (float)x->n;
    }
    record(x, rc == 0 && ok, msg, 0, 0, "the first group completes afterwards");
    ops->destroy(b2);
}

static void run_fault(int n, const char *name, double timeout_s, rank_fn body,
                      void (*before)(struct job *, int))
{
    struct job j = {.n = n, .name = name, .timeout_s = timeout_s, .body = body,
                    .cap = (size_t)8 << 20, .before_create = before};
    j.arg = &j;
    run_job(&j);
}

/* Rank 1 holds another key: rank 0, the dialer, finds that the process at
 * rank 1's address cannot prove the job key, and fails at once naming it. */
static void run_wrong_key(void)
{
    static const struct fsdp_auth_key other = {.k = {0x5e, 0xed, 0x5e, 0xed, 1, 2, 3, 4, 5, 6, 8}};
    struct job j = {.n = 2, .name = "wrongkey", .timeout_s = 2.0, .body = intruders_body,
                    .cap = (size_t)1 << 20};
    j.key_of[1] = &other;
    j.arg = &j;
    pthread_t th[2];
    struct thread_arg ta[2];
    struct fsdp_store *base;
    if (fsdp_store_mem_create(20.0, &base) < 0 || fsdp_store_prefix(base, j.name, &j.store) < 0) {
        tap_ok(0, "store for %s: %s", j.name, fsdp_err_msg());
        return;
    }
    double t0 = fsdp_now();
    for (int r = 0; r < 2; r++) {
        ta[r] = (struct thread_arg){.job = &j, .rank = r};
        pthread_create(&th[r], NULL, rank_main, &ta[r]);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
    }
    tap_diag("rank 0: %s", j.create_msg[0]);
    tap_diag("rank 1: %s", j.create_msg[1]);
    tap_ok(j.create_failed[0] && strstr(j.create_msg[0], "failed to prove that it holds"),
           "a peer with another key: the dialer refuses it at its MAC (%.2f s)", fsdp_now() - t0);
    tap_ok(j.create_failed[1], "a peer with another key: it does not get in either");
    fsdp_store_destroy(j.store);
    fsdp_store_destroy(base);
}

static void run_faults(void)
{
    run_fault(2, "intruders", 10.0, intruders_body, intruders_before_create);
    for (int k = 0; k < NINTRUDERS; k++) {
        pthread_join(intruders[k].th, NULL);
        tap_ok(intruders[k].refused, "intruder %d (%s) was refused", k,
               (const char *[]){"garbage", "wrong nonce", "impostor rank", "silent",
                                "right nonce and hello, no key"}[k]);
    }
    tap_ok(intruders[4].answered, "the intruder with the right nonce got as far as the MAC "
           "(so the refusal above is the MAC's)");
    run_wrong_key();
    run_fault(2, "mismatch", 10.0, mismatch_body, NULL);
    run_fault(3, "kinds", 10.0, kind_mismatch_body, NULL);
    run_fault(2, "silent2", 1.0, silent_body, NULL);
    run_fault(3, "silent3", 1.0, silent_body, NULL);
    run_fault(2, "abort", 10.0, abort_body, NULL);
    run_fault(2, "destroy", 10.0, destroy_pending_body, NULL);
    run_fault(3, "groups", 20.0, two_groups_body, NULL);
}

/* With an argument, runs only that part: "matrix" or "faults". */
int main(int argc, char **argv)
{
    double t0 = fsdp_now();
    if (argc < 2 || strcmp(argv[1], "matrix") == 0) {
        run_matrix();
    }
    if (argc < 2 || strcmp(argv[1], "faults") == 0) {
        run_faults();
    }
    tap_diag("total %.1f s", fsdp_now() - t0);
    return tap_done();
}
