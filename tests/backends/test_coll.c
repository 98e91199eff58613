/*
 * test_coll.c - the collective correctness matrix for one backend.
 *
 *   mpiexec -n N test_coll --backend mpi --init mpi
 *   RANK=r WORLD_SIZE=N MASTER_ADDR=... MASTER_PORT=... test_coll --backend tcp
 *
 * Every op (allreduce, reduce_scatter, allgather, broadcast from every root)
 * x dtype x reduce op, at counts 0, 1, 7, 1000 and (for --large dtypes)
 * 2^20+3, in place and out of place. Each rank generates every rank's input
 * from a seed, so the reference is computed locally: exact for integers,
 * max/min and data movement; for float sums within the bound of one rounding
 * per reduction step ((size-1) * u * sum|x|, u the format's unit roundoff)
 * plus the AVG divide. Out-of-place send buffers must come back untouched
 * and receive buffers start poisoned, so unwritten elements are caught.
 *
 * That bound admits results that differ in their last bits from rank to
 * rank, yet every backend promises each rank the same bytes from allreduce,
 * allgather and broadcast (replicated parameters must not drift apart), so
 * those results are also compared with rank 0's, bitwise, through the store.
 * Float inputs span several binades, so most sums round and a reduction
 * order that depended on the rank would change the bytes.
 *
 * One TAP line per (op, dtype, reduce op), and with more than one rank a
 * second ("...: same bytes on every rank") for each of those whose results
 * must be identical, printed by rank 0 after gathering every rank's failure
 * counts and first bad element through the store.
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "comm/group.h"
#include "rendezvous/store.h"
#include "tests/tap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LARGE_COUNT ((size_t)(1u << 20) + 3)
#define MAX_LINES 192
/* Results up to this size are compared byte for byte, larger ones by
 * fingerprint (the large counts: a few MB per case through the store). */
#define IDENT_BYTES ((size_t)64 << 10)

static const size_t small_counts[] = {0, 1, 7, 1000};

enum coll { ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BROADCAST };
static const char *const coll_names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};

/* One TAP line: its description, failures on this rank, the first one. */
struct line {
    char desc[96];
    int fails;
    char diag[400];
};

struct ctx {
    struct fsdp_dist *d;
    struct fsdp_group *g;
    int rank, size;
    const char *backend;
    uint32_t large_dtypes; /* bit per dtype tested at LARGE_COUNT */
    void *send, *recv;     /* (size * LARGE_COUNT * 8) bytes each */
    size_t buf_bytes;
    struct line lines[MAX_LINES];
    int nlines;
    int cur;               /* line the current cases' failures count against */
    int ident;             /* line of their identity check, -1: none */
    uint64_t case_id;
};

// ----------------------------------------------------------------------------
// deterministic inputs

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* Rank r's element i of case `seed`, as an exact double. Integer ranges keep
 * every sum exact (u8: 4 ranks x 63 < 256). Floats are scaled by 2^-4..2^3
 * (exactly: a power of two), so sums of a few of them rarely fit the
 * format and their rounding depends on the order; the largest f16 sum stays
 * far from overflow. */
static inline __attribute__((always_inline)) double gen(enum fsdp_dtype t, uint64_t seed, int r,
                                                       size_t i)
{
    uint64_t b = mix64(seed + ((uint64_t)r << 40) + i);
    float u = (float)(b >> 40) * 0x1p-23f - 1.0f; /* [-1, 1) */
    u *= (float)(1u << ((b >> 8) & 7)) * 0x1p-4f;
    switch (t) {
    case FSDP_F32: return u;
    case FSDP_F16: return fsdp_f16_to_f32(fsdp_f32_to_f16(u));
    case FSDP_BF16: return fsdp_bf16_to_f32(fsdp_f32_to_bf16(u));
    case FSDP_I32: return (double)(int64_t)(b % 2001) - 1000.0;
    case FSDP_I64: return (double)(int64_t)(b % (1ull << 41)) - (double)(1ull << 40);
    case FSDP_U8: return (double)(b % 64);
    default: return 0;
    }
}

/* The per-element helpers are inlined into one loop per dtype (the switch
 * below), so the large cases cost little beyond the hashing. */
#define DTYPE_DISPATCH(t, CALL)                                               \
    do {                                                                      \
        switch (t) {                                                          \
        case FSDP_F32: { const enum fsdp_dtype T_ = FSDP_F32; CALL; } break;   \
        case FSDP_F16: { const enum fsdp_dtype T_ = FSDP_F16; CALL; } break;   \
        case FSDP_BF16: { const enum fsdp_dtype T_ = FSDP_BF16; CALL; } break; \
        case FSDP_I32: { const enum fsdp_dtype T_ = FSDP_I32; CALL; } break;   \
        case FSDP_I64: { const enum fsdp_dtype T_ = FSDP_I64; CALL; } break;   \
        case FSDP_U8: { const enum fsdp_dtype T_ = FSDP_U8; CALL; } break;     \
        default: break;                                                       \
        }                                                                     \
    } while (0)

static inline __attribute__((always_inline)) void fill_impl(void *buf, size_t n, enum fsdp_dtype t,
                                                            uint64_t seed, int r, size_t first)
{
    for (size_t i = 0; i < n; i++) {
        fsdp_dtype_set(buf, t, i, gen(t, seed, r, first + i));
    }
}

/* Fills n elements of rank r's input starting at element `first`. */
static void fill(void *buf, size_t n, enum fsdp_dtype t, uint64_t seed, int r, size_t first)
{
    DTYPE_DISPATCH(t, fill_impl(buf, n, T_, seed, r, first));
}

static double unit_roundoff(enum fsdp_dtype t)
{
    switch (t) {
    case FSDP_F32: return 0x1p-24;
    case FSDP_F16: return 0x1p-11;
    case FSDP_BF16: return 0x1p-8;
    default: return 0;
    }
}

// ----------------------------------------------------------------------------
// checking

/* Records one failure of a line (the first one with its detail). */
static void vfail_at(struct ctx *c, int line, const char *fmt, va_list ap)
{
    struct line *l = &c->lines[line];
    if (l->fails++ == 0) {
        vsnprintf(l->diag, sizeof(l->diag), fmt, ap);
    }
}

/* ... of the current line */
static void fail(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(c, c->cur, fmt, ap);
    va_end(ap);
}

/* ... of the current identity line */
static void fail_ident(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_ident(struct ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_at(c, c->ident, fmt, ap);
    va_end(ap);
}

/*
 * Compares n elements of buf with the reduction over all ranks of elements
 * first..first+n-1 (op < 0: rank `src`'s input, a pure copy).
 */
static inline __attribute__((always_inline)) void
check_impl(struct ctx *c, const char *what, const void *buf, size_t n, enum fsdp_dtype t, int op,
           int src, uint64_t seed, size_t first)
{
    int N = c->size;
    double u = unit_roundoff(t), max_abs = 0, max_rel = 0;
    size_t bad = 0, first_bad = SIZE_MAX;
    double bad_got = 0, bad_want = 0, bad_tol = 0;
    int is_float = fsdp_dtype_is_float(t);
    for (size_t i = 0; i < n; i++) {
        double want, tol = 0;
        if (op < 0) {
            want = gen(t, seed, src, first + i);
        } else if (!is_float) {
            int64_t acc = (int64_t)gen(t, seed, 0, first + i);
            for (int r = 1; r < N; r++) {
                int64_t x = (int64_t)gen(t, seed, r, first + i);
                acc = op == FSDP_MAX ? (x > acc ? x : acc) : op == FSDP_MIN ? (x < acc ? x : acc)
                                                                            : acc + x;
            }
            want = (double)(op == FSDP_AVG ? acc / N : acc);
        } else {
            double acc = gen(t, seed, 0, first + i), mag = fabs(acc);
            for (int r = 1; r < N; r++) {
                double x = gen(t, seed, r, first + i);
                acc = op == FSDP_MAX ? fmax(x, acc) : op == FSDP_MIN ? fmin(x, acc) : acc + x;
                mag += fabs(x);
            }
            if (op == FSDP_AVG) {
                acc /= N;
            }
            want = acc;
            if (op == FSDP_SUM || op == FSDP_AVG) {
                /* one rounding per step, then the divide (x 1/N in f32) */
                tol = 1.01 * (N - 1) * u * mag / (op == FSDP_AVG ? N : 1) + 3 * u * fabs(want) +
                      (t == FSDP_F16 ? N * 0x1p-24 : 1e-30);
            }
        }
        double got = fsdp_dtype_get(buf, t, i);
        double err = fabs(got - want);
        if (!(err <= tol)) {
            if (bad++ == 0) {
                first_bad = i;
                bad_got = got;
                bad_want = want;
                bad_tol = tol;
            }
        }
        if (err > max_abs || err != err) {
            max_abs = err;
        }
        if (want != 0 && err / fabs(want) > max_rel) {
            max_rel = err / fabs(want);
        }
    }
    if (bad) {
        fail(c, "rank %d %s: %zu of %zu wrong, first at index %zu: got %.9g want %.9g (tol %.3g); "
                "max abs err %.3g, max rel err %.3g",
             c->rank, what, bad, n, first + first_bad, bad_got, bad_want, bad_tol, max_abs,
             max_rel);
    }
}

static void check(struct ctx *c, const char *what, const void *buf, size_t n, enum fsdp_dtype t,
                  int op, int src, uint64_t seed, size_t first)
{
    DTYPE_DISPATCH(t, check_impl(c, what, buf, n, T_, op, src, seed, first));
}

/* Bitwise fingerprint (word-wise, so the large counts cost little). */
static uint64_t fingerprint(const void *buf, size_t bytes)
{
    const unsigned char *p = buf;
    uint64_t h = 0xcbf29ce484222325ull;
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

/* Element i's bits, for a diff that shows a last-bit difference. */
static unsigned long long elem_bits(const void *buf, size_t i, size_t es)
{
    const char *p = (const char *)buf + i * es;
    uint8_t b1;
    uint16_t b2;
    uint32_t b4;
    uint64_t b8;
    switch (es) {
    case 1: memcpy(&b1, p, 1); return b1;
    case 2: memcpy(&b2, p, 2); return b2;
    case 4: memcpy(&b4, p, 4); return b4;
    default: memcpy(&b8, p, 8); return b8;
    }
}

/*
 * Rank 0 publishes the n elements of its result (or their fingerprint),
 * the others compare theirs with it. The store, not the backend under test,
 * carries them; every rank takes part in every case even after an error, so
 * keys stay in step.
 */
static void check_identical(struct ctx *c, const char *what, const void *buf, size_t n,
                            enum fsdp_dtype t)
{
    size_t es = fsdp_dtype_size(t), bytes = n * es;
    int whole = bytes <= IDENT_BYTES;
    if (c->ident < 0 || c->size == 1 || n == 0) {
        return;
    }
    uint64_t h = fingerprint(buf, bytes);
    char key[96];
    snprintf(key, sizeof(key), "test_coll/%s/ident/%llu", c->backend,
             (unsigned long long)c->case_id);
    if (c->rank == 0) {
        int rc = fsdp_store_set(c->d->store, key, whole ? buf : (const void *)&h,
                                whole ? bytes : sizeof(h));
        if (rc < 0) {
            fsdp_die(rc, "publishing rank 0's result", key);
        }
        return;
    }
    void *val;
    size_t len;
    int rc = fsdp_store_get(c->d->store, key, &val, &len, -1);
    if (rc < 0) {
        fsdp_die(rc, "reading rank 0's result", key);
    }
    if (len != (whole ? bytes : sizeof(h))) {
        fail_ident(c, "rank %d %s: rank 0 published %zu bytes, want %zu", c->rank, what, len,
                   whole ? bytes : sizeof(h));
    } else if (whole && memcmp(val, buf, bytes) != 0) {
        size_t bad = 0, first = SIZE_MAX;
        for (size_t i = 0; i < n; i++) {
            if (memcmp((char *)val + i * es, (const char *)buf + i * es, es) != 0 &&
                bad++ == 0) {
                first = i;
            }
        }
        fail_ident(c, "rank %d %s: %zu of %zu elements differ bitwise from rank 0's, first at "
                      "index %zu: %.9g (0x%0*llx) vs rank 0's %.9g (0x%0*llx)",
                   c->rank, what, bad, n, first, fsdp_dtype_get(buf, t, first), (int)(2 * es),
                   elem_bits(buf, first, es), fsdp_dtype_get(val, t, first), (int)(2 * es),
                   elem_bits(val, first, es));
    } else if (!whole && memcmp(val, &h, sizeof(h)) != 0) {
        uint64_t h0;
        memcpy(&h0, val, sizeof(h0));
        fail_ident(c, "rank %d %s: differs bitwise from rank 0's (fingerprint %016llx vs "
                      "%016llx over %zu elements)",
                   c->rank, what, (unsigned long long)h, (unsigned long long)h0, n);
    }
    free(val);
}

/* Issues through the async API, waits with the group deadline, frees. */
static void finish(struct ctx *c, const char *what, int rc, struct fsdp_work **wp)
{
    struct fsdp_work *w = *wp;
    if (rc == 0) {
        rc = fsdp_work_wait(w, -1);
        if (rc == FSDP_ERR_TIMEOUT) {
            fsdp_die(rc, what, "a collective timed out; the group is out of step");
        }
        fsdp_work_free(w);
    }
    if (rc < 0) {
        fail(c, "rank %d %s: error %s: %s", c->rank, what, fsdp_strerror(rc), fsdp_err_msg());
        fsdp_err_clear();
    }
}

static void poison(void *buf, size_t bytes, uint64_t seed)
{
    memset(buf, 0xa0 | (int)(seed & 0x0f), bytes);
}

// ----------------------------------------------------------------------------
// one case per collective

static void run_reduction(struct ctx *c, enum coll coll, enum fsdp_dtype t, enum fsdp_redop op,
                          size_t n, int in_place)
{
    int N = c->size, R = c->rank;
    size_t es = fsdp_dtype_size(t);
    uint64_t seed = mix64(++c->case_id);
    size_t total = coll == ALLREDUCE ? n : n * (size_t)N; /* elements each rank contributes */
    char what[96];
    snprintf(what, sizeof(what), "%s %s %s n=%zu %s", coll_names[coll], fsdp_dtype_name(t),
             fsdp_redop_name(op), n, in_place ? "in-place" : "out-of-place");

    void *send = n ? c->send : NULL, *recv = n ? c->recv : NULL;
    struct fsdp_work *w = NULL;
    int rc;
    if (in_place) {
        send = n ? c->recv : NULL;
        fill(send, total, t, seed, R, 0);
        recv = coll == ALLREDUCE ? send : (n ? (char *)send + (size_t)R * n * es : NULL);
    } else if (n) {
        fill(send, total, t, seed, R, 0);
        poison(recv, n * es, seed);
    }
    if (coll == ALLREDUCE) {
        rc = fsdp_allreduce(c->g, send, recv, n, t, op, NULL, &w);
    } else {
        rc = fsdp_reduce_scatter(c->g, send, recv, n, t, op, NULL, &w);
    }
    finish(c, what, rc, &w);
    size_t first = coll == ALLREDUCE ? 0 : (size_t)R * n;
    check(c, what, recv, n, t, (int)op, 0, seed, first);
    if (coll == ALLREDUCE) {
        check_identical(c, what, recv, n, t);
    }
    if (!in_place && n && n < LARGE_COUNT) {
        char w2[128];
        snprintf(w2, sizeof(w2), "%s (send buffer changed)", what);
        check(c, w2, send, total, t, -1, R, seed, 0);
    }
}

static void run_allgather(struct ctx *c, enum fsdp_dtype t, size_t n, int in_place)
{
    int N = c->size, R = c->rank;
    size_t es = fsdp_dtype_size(t);
    uint64_t seed = mix64(++c->case_id);
    char what[96];
    snprintf(what, sizeof(what), "allgather %s n=%zu %s", fsdp_dtype_name(t), n,
             in_place ? "in-place" : "out-of-place");
    void *recv = n ? c->recv : NULL;
    void *send = n ? c->send : NULL;
    if (n) {
        poison(recv, n * (size_t)N * es, seed);
    }
    if (in_place) {
        send = n ? (char *)recv + (size_t)R * n * es : NULL;
    }
    if (n) {
        fill(send, n, t, seed, R, 0);
    }
    struct fsdp_work *w = NULL;
    int rc = fsdp_allgather(c->g, send, recv, n, t, NULL, &w);
    finish(c, what, rc, &w);
    for (int r = 0; r < N && n; r++) {
        char w2[128];
        snprintf(w2, sizeof(w2), "%s block %d", what, r);
        check(c, w2, (char *)recv + (size_t)r * n * es, n, t, -1, r, seed, 0);
    }
    check_identical(c, what, recv, n * (size_t)N, t);
    if (!in_place && n && n < LARGE_COUNT) {
        char w2[128];
        snprintf(w2, sizeof(w2), "%s (send buffer changed)", what);
        check(c, w2, send, n, t, -1, R, seed, 0);
    }
}

static void run_broadcast(struct ctx *c, enum fsdp_dtype t, size_t n, int root)
{
    size_t es = fsdp_dtype_size(t);
    uint64_t seed = mix64(++c->case_id);
    char what[96];
    snprintf(what, sizeof(what), "broadcast %s n=%zu root=%d", fsdp_dtype_name(t), n, root);
    void *buf = n ? c->recv : NULL;
    if (n && c->rank == root) {
        fill(buf, n, t, seed, root, 0);
    } else if (n) {
        poison(buf, n * es, seed);
    }
    struct fsdp_work *w = NULL;
    int rc = fsdp_broadcast(c->g, buf, n, t, root, NULL, &w);
    finish(c, what, rc, &w);
    check(c, what, buf, n, t, -1, root, seed, 0);
    check_identical(c, what, buf, n, t);
}

static void vnew_line(struct ctx *c, const char *suffix, const char *fmt, va_list ap)
{
    if (c->nlines == MAX_LINES) {
        fsdp_fatal("test_coll: more than %d lines", MAX_LINES);
    }
    struct line *l = &c->lines[c->nlines++];
    size_t k = (size_t)snprintf(l->desc, sizeof(l->desc), "%s n=%d init=%s ", c->backend,
                                c->size, fsdp_dist_method_name(c->d));
    k += (size_t)vsnprintf(l->desc + k, sizeof(l->desc) - k, fmt, ap);
    if (k < sizeof(l->desc)) {
        snprintf(l->desc + k, sizeof(l->desc) - k, "%s", suffix);
    }
    l->fails = 0;
    l->diag[0] = '\0';
}

/* Starts the line the following cases' failures count against; ends the
 * identity line of earlier cases. */
static void new_line(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void new_line(struct ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnew_line(c, "", fmt, ap);
    va_end(ap);
    c->cur = c->nlines - 1;
    c->ident = -1;
}

/* After new_line: the same cases' results must also be bitwise identical on
 * every rank (a separate line, so a rank-dependent rounding inside the bound
 * is named as such). Nothing to compare with one rank. */
static void new_ident_line(struct ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void new_ident_line(struct ctx *c, const char *fmt, ...)
{
    if (c->size == 1) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vnew_line(c, ": same bytes on every rank", fmt, ap);
    va_end(ap);
    c->ident = c->nlines - 1;
}

static size_t ncounts(const struct ctx *c, enum fsdp_dtype t)
{
    return sizeof(small_counts) / sizeof(small_counts[0]) + ((c->large_dtypes >> t) & 1);
}

static size_t count_at(size_t k)
{
    return k < sizeof(small_counts) / sizeof(small_counts[0]) ? small_counts[k] : LARGE_COUNT;
}

static void run_matrix(struct ctx *c)
{
    for (int coll = ALLREDUCE; coll <= REDUCE_SCATTER; coll++) {
        for (int t = 0; t < FSDP_DTYPE_COUNT; t++) {
            for (int op = 0; op < FSDP_REDOP_COUNT; op++) {
                const char *tn = fsdp_dtype_name((enum fsdp_dtype)t);
                const char *on = fsdp_redop_name((enum fsdp_redop)op);
                new_line(c, "%s %s %s", coll_names[coll], tn, on);
                if (coll == ALLREDUCE) {
                    new_ident_line(c, "%s %s %s", coll_names[coll], tn, on);
                }
                for (size_t k = 0; k < ncounts(c, (enum fsdp_dtype)t); k++) {
                    for (int ip = 0; ip < 2; ip++) {
                        run_reduction(c, (enum coll)coll, (enum fsdp_dtype)t,
                                      (enum fsdp_redop)op, count_at(k), ip);
                    }
                }
            }
        }
    }
    for (int t = 0; t < FSDP_DTYPE_COUNT; t++) {
        new_line(c, "allgather %s", fsdp_dtype_name((enum fsdp_dtype)t));
        new_ident_line(c, "allgather %s", fsdp_dtype_name((enum fsdp_dtype)t));
        for (size_t k = 0; k < ncounts(c, (enum fsdp_dtype)t); k++) {
            for (int ip = 0; ip < 2; ip++) {
                run_allgather(c, (enum fsdp_dtype)t, count_at(k), ip);
            }
        }
    }
    for (int t = 0; t < FSDP_DTYPE_COUNT; t++) {
        new_line(c, "broadcast %s (every root)", fsdp_dtype_name((enum fsdp_dtype)t));
        new_ident_line(c, "broadcast %s (every root)", fsdp_dtype_name((enum fsdp_dtype)t));
        for (size_t k = 0; k < ncounts(c, (enum fsdp_dtype)t); k++) {
            for (int root = 0; root < c->size; root++) {
                run_broadcast(c, (enum fsdp_dtype)t, count_at(k), root);
            }
        }
    }
}

// ----------------------------------------------------------------------------
// argument checks (local: every rank makes the same bad call)

static void expect_err(struct ctx *c, const char *what, int rc, int want, const char *needle)
{
    if (rc != want || !strstr(fsdp_err_msg(), needle)) {
        fail(c, "rank %d %s: got %d '%s', want %d with '%s'", c->rank, what, rc, fsdp_err_msg(),
             want, needle);
    }
    fsdp_err_clear();
}

static void run_arg_checks(struct ctx *c)
{
    struct fsdp_work *w = NULL;
    float *a = c->send, *b = c->recv;
    new_line(c, "argument checks");
    expect_err(c, "bad dtype", fsdp_allreduce(c->g, a, b, 4, (enum fsdp_dtype)99, FSDP_SUM, NULL, &w),
               FSDP_ERR_INVALID, "dtype 99");
    expect_err(c, "bad op", fsdp_allreduce(c->g, a, b, 4, FSDP_F32, (enum fsdp_redop)9, NULL, &w),
               FSDP_ERR_INVALID, "reduce op 9");
    expect_err(c, "bad root", fsdp_broadcast(c->g, a, 4, FSDP_F32, c->size, NULL, &w),
               FSDP_ERR_INVALID, "root");
    expect_err(c, "NULL buffer", fsdp_allreduce(c->g, NULL, b, 4, FSDP_F32, FSDP_SUM, NULL, &w),
               FSDP_ERR_INVALID, "NULL buffer");
    expect_err(c, "overflow", fsdp_allgather(c->g, a, b, SIZE_MAX / 2, FSDP_F32, NULL, &w),
               FSDP_ERR_INVALID, "overflow");
    expect_err(c, "partial overlap", fsdp_allreduce(c->g, a, a + 1, 4, FSDP_F32, FSDP_SUM, NULL, &w),
               FSDP_ERR_INVALID, "overlap");
    struct fsdp_coll_attr bad_mem = {.mem = (enum fsdp_mem)7, .stream = NULL};
    expect_err(c, "bad memory space", fsdp_allreduce(c->g, a, b, 4, FSDP_F32, FSDP_SUM, &bad_mem, &w),
               FSDP_ERR_INVALID, "memory space");
}

// ----------------------------------------------------------------------------
// deadlines and abort (last: an aborted group takes no more operations)

/* Rank 1 joins an allreduce late: the others' short wait times out, the
 * handle stays valid, and a second wait completes it with the right sum.
 * Then every rank aborts its group: new operations fail with the reason. */
static void run_deadline_abort(struct ctx *c)
{
    new_line(c, "deadline: a wait that times out leaves the operation pending");
    int64_t v = c->rank + 1, want = (int64_t)c->size * (c->size + 1) / 2;
    struct fsdp_work *w = NULL;
    int rc = fsdp_store_barrier(c->d->store, "test_coll/late", c->size, -1);
    if (rc == 0 && c->rank == 1) {
        struct timespec late = {0, 400 * 1000 * 1000};
        nanosleep(&late, NULL);
    }
    if (rc == 0) {
        rc = fsdp_allreduce(c->g, &v, &v, 1, FSDP_I64, FSDP_SUM, NULL, &w);
    }
    if (rc == 0 && c->rank != 1) {
        rc = fsdp_work_wait(w, 0.05);
        if (rc != FSDP_ERR_TIMEOUT) {
            fail(c, "rank %d: wait(0.05 s) for a late peer returned %d (%s), want a timeout",
                 c->rank, rc, fsdp_err_msg());
        }
        fsdp_err_clear();
        rc = 0;
    }
    if (rc == 0) {
        rc = fsdp_work_wait(w, -1);
        fsdp_work_free(w);
    }
    if (rc < 0) {
        fail(c, "rank %d: %s", c->rank, fsdp_err_msg());
        fsdp_err_clear();
    } else if (v != want) {
        fail(c, "rank %d: after the second wait the sum is %lld, want %lld", c->rank,
             (long long)v, (long long)want);
    }

    new_line(c, "abort: later operations fail at once with the reason");
    c->g->ops->abort(c->g->be, "aborted by test_coll");
    rc = fsdp_allreduce(c->g, &v, &v, 1, FSDP_I64, FSDP_SUM, NULL, &w);
    if (rc == 0) {
        fsdp_work_wait(w, 1.0);
        fsdp_work_free(w);
    }
    expect_err(c, "allreduce after abort", rc, FSDP_ERR_ABORTED, "abort");
    rc = fsdp_barrier(c->g, &w);
    if (rc == 0) {
        fsdp_work_wait(w, 1.0);
        fsdp_work_free(w);
    }
    expect_err(c, "barrier after abort", rc, FSDP_ERR_ABORTED, "abort");
}

// ----------------------------------------------------------------------------
// results: every rank publishes its lines, rank 0 merges and prints TAP

static int report(struct ctx *c)
{
    char key[64], *text;
    size_t cap = (size_t)c->nlines * (sizeof(c->lines[0].diag) + 16) + 1, len = 0;
    if (!(text = malloc(cap))) {
        fsdp_fatal("test_coll: out of memory");
    }
    for (int i = 0; i < c->nlines; i++) {
        len += (size_t)snprintf(text + len, cap - len, "%d\t%s\n", c->lines[i].fails,
                                c->lines[i].diag);
    }
    snprintf(key, sizeof(key), "test_coll/%s/%d", c->backend, c->rank);
    int rc = fsdp_store_set(c->d->store, key, text, len);
    free(text);
    if (rc < 0) {
        fsdp_die(rc, "publishing results", NULL);
    }
    if (c->rank != 0) {
        return 0;
    }
    for (int r = 1; r < c->size; r++) {
        void *val;
        size_t n;
        snprintf(key, sizeof(key), "test_coll/%s/%d", c->backend, r);
        if ((rc = fsdp_store_get(c->d->store, key, &val, &n, -1)) < 0) {
            fsdp_die(rc, "gathering results", NULL);
        }
        char *s = val, *end = s + n;
        for (int i = 0; i < c->nlines && s < end; i++) {
            char *nl = memchr(s, '\n', (size_t)(end - s));
            if (!nl) {
                break;
            }
            *nl = '\0';
            int fails = atoi(s);
            char *tab = strchr(s, '\t');
            if (fails && c->lines[i].fails == 0 && tab) {
                snprintf(c->lines[i].diag, sizeof(c->lines[i].diag), "%s", tab + 1);
            }
            c->lines[i].fails += fails;
            s = nl + 1;
        }
        free(val);
    }
    for (int i = 0; i < c->nlines; i++) {
        if (c->lines[i].fails) {
            tap_diag("%d failures; first: %s", c->lines[i].fails, c->lines[i].diag);
        }
        tap_ok(c->lines[i].fails == 0, "%s", c->lines[i].desc);
    }
    return tap_done();
}

// ----------------------------------------------------------------------------

static void usage(void)
{
    fprintf(stderr, "usage: test_coll --backend NAME [--init METHOD] [--timeout S] "
                    "[--large DTYPE,...|none]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *backend = NULL, *init = NULL, *large = "f32,bf16";
    double timeout = 60;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--backend") == 0) {
            backend = argv[++i];
        } else if (i + 1 < argc && strcmp(argv[i], "--init") == 0) {
            init = argv[++i];
        } else if (i + 1 < argc && strcmp(argv[i], "--timeout") == 0) {
            timeout = atof(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--large") == 0) {
            large = argv[++i];
        } else {
            usage();
        }
    }
    if (!backend) {
        usage();
    }
    struct ctx *c = calloc(1, sizeof(*c));
    if (!c) {
        return 1;
    }
    c->backend = backend;
    if (strcmp(large, "none") != 0) {
        char tmp[128], *save = NULL;
        snprintf(tmp, sizeof(tmp), "%s", large);
        for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            enum fsdp_dtype t;
            if (fsdp_dtype_parse(tok, &t) < 0) {
                fprintf(stderr, "test_coll: %s\n", fsdp_err_msg());
                return 2;
            }
            c->large_dtypes |= 1u << t;
        }
    }

    int rc = fsdp_dist_init(&argc, &argv, init, timeout, &c->d);
    if (rc < 0) {
        fsdp_die(rc, "init", NULL);
    }
    c->rank = c->d->rank;
    c->size = c->d->world_size;
    const struct fsdp_backend_ops *ops = fsdp_backend_find(backend);
    if (!ops) {
        fsdp_fatal("unknown backend '%s' (have %s)", backend, fsdp_backend_names());
    }
    int *ranks = malloc((size_t)c->size * sizeof(int));
    for (int r = 0; r < c->size; r++) {
        ranks[r] = r;
    }
    if ((rc = fsdp_group_create(c->d, "world", ranks, c->size, ops, &c->g)) < 0) {
        fsdp_die(rc, "creating the group", NULL);
    }
    free(ranks);
    size_t max_es = c->large_dtypes & ((1u << FSDP_I64)) ? 8 : 4;
    size_t max_n = c->large_dtypes ? LARGE_COUNT : 1000;
    c->buf_bytes = (size_t)c->size * max_n * (c->large_dtypes ? max_es : 8);
    c->send = fsdp_alloc(c->buf_bytes);
    c->recv = fsdp_alloc(c->buf_bytes);
    if (!c->send || !c->recv) {
        fsdp_fatal("test_coll: out of memory for %zu-byte buffers", c->buf_bytes);
    }

    double t0 = fsdp_now();
    run_matrix(c);
    run_arg_checks(c);
    if (c->size > 1) {
        run_deadline_abort(c);
    }
    if (c->rank == 0) {
        tap_diag("%s n=%d: matrix ran in %.2f s", backend, c->size, fsdp_now() - t0);
    }
    rc = report(c);

    fsdp_group_destroy(c->g);
    fsdp_free(c->send);
    fsdp_free(c->recv);
    fsdp_dist_finalize(c->d);
    free(c);
    return rc;
}
