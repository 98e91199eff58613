/*
 * fingerprint.c - FSDPC_DEBUG=DETAIL: the members of a group check that they
 * made the same collective call before its result is handed over.
 *
 * Right before each collective reaches the backend, every member issues an
 * allgather of a 32-byte fingerprint of the call (seq, op, dtype, count,
 * root, reduce op) on the group's own backend. Operations on one backend
 * instance complete in issue order, so the exchange pairs with the peers'
 * exchange for the same collective, and it is complete by the time the
 * collective itself is. When the collective is waited on, or tested
 * complete, the exchanges up to it are checked in order before success is
 * returned: every member compares the same table, so a mismatch is found by
 * all of them and named the same way on each, citing the lowest group rank
 * that disagrees with group rank 0. The group's backend is then aborted:
 * the group is out of step for good.
 *
 * Pipelined or strict. Checking at the wait lets the exchange travel with
 * the collectives, so ranks are never synchronized at the issue and the
 * engine's prefetch keeps overlapping with compute. It also means that a
 * mismatched collective reaches the backend. That is safe on the tcp
 * backend, which checks every frame header (collective, length) against
 * what it expects and fails cleanly, and whose hangs (two ranks that both
 * think they receive) end with the check, since the exchange before them
 * completed. Mismatched MPI collectives are undefined behaviour, so every
 * other backend gets the strict mode: the exchange is waited for and
 * checked at the issue, and a mismatched call never reaches the backend.
 * A backend without host memory (nccl) cannot exchange these fingerprints:
 * its groups are left unchecked, with a warning.
 *
 * Buffers. Each group keeps a ring of FP_RING slots (fingerprint, table,
 * exchange handle), allocated once; collective seq uses slot seq % FP_RING.
 * A slot whose check is still outstanding when its turn comes round again is
 * checked first, so at most FP_RING collectives of a group are unchecked at
 * once.
 *
 * A rank that skipped a collective leaves the others' exchange without a
 * partner. To name it, a publisher thread writes each group's last
 * fingerprint under the group's store key "fp/<world rank>" (overwritten,
 * so nothing accumulates) every FP_PUBLISH_MS when it changed: the
 * collectives themselves never touch the store, and a rank stuck anywhere,
 * in fsdpc or not, has published where it stopped. When an exchange times
 * out or fails, the waiting ranks read those keys and name the members that
 * are behind. A rank that finds a mismatch also writes the message under
 * "fp/verdict" before it aborts the backend, so that a member whose own
 * exchange was cut short by that abort reports the same mismatch.
 *
 * Threads: one thread at a time issues, waits for and frees the
 * collectives of a group (as the engine does); the publisher only reads
 * the last fingerprint, under the group's lock.
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "comm/debug.h"
#include "comm/group.h"
#include "rendezvous/store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FP_MAGIC 0x66707231u /* "fpr1" */
#define FP_RING 32           /* unchecked collectives per group, at most */
#define FP_PUBLISH_MS 200
#define FP_VERDICT_KEY "fp/verdict"

struct fp_record {
    uint64_t seq;
    uint64_t count;
    uint32_t magic;
    int32_t root;
    int32_t redop;
    uint8_t op;
    uint8_t dtype;
    uint8_t pad[2];
};

_Static_assert(sizeof(struct fp_record) == 32, "a fingerprint is 32 bytes on the wire");

struct fp_slot {
    struct fp_record mine;
    struct fp_record *all;   /* (size,) this slot's row of the table */
    struct fsdp_work *xchg;  /* the exchange until it is checked */
    struct fsdp_work *owner; /* the collective's handle, until waited or freed */
    uint64_t seq;
};

struct fsdp_fingerprint {
    struct fsdp_group *g;
    int strict;               /* check at the issue (see the header comment) */
    int failed;               /* code of the first failure, sticky; 0: none */
    uint64_t checked;         /* collectives 1..checked matched on every member */
    struct fp_slot ring[FP_RING];
    struct fp_record *table;  /* (FP_RING, size) */
    char why[1024];           /* message of the first failure */

    /* shared with the publisher */
    pthread_mutex_t mu;
    struct fp_record last;    /* the last fingerprint issued (seq 0: none) */
    uint64_t published;       /* seq of the one in the store (publisher only) */
    struct fsdp_fingerprint *next;
};

/* The groups under DETAIL and the publisher thread. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int cv_ready;
    struct fsdp_fingerprint *head;
    int running;
    int stop;
    pthread_t thread;
} fp_pub = {.mu = PTHREAD_MUTEX_INITIALIZER};

// ----------------------------------------------------------------------------
// records

static struct fp_record fp_make(uint64_t seq, const struct fsdp_debug_call *c)
{
    struct fp_record r;
    memset(&r, 0, sizeof(r));
    r.seq = seq;
    r.count = c->count;
    r.magic = FP_MAGIC;
    r.root = c->root;
    r.redop = c->redop;
    r.op = (uint8_t)c->op;
    r.dtype = (uint8_t)c->dtype;
    return r;
}

static void fp_call(const struct fp_record *r, struct fsdp_debug_call *c)
{
    *c = (struct fsdp_debug_call){
        .op = (enum fsdp_coll_op)(r->op < FSDP_COLL_OP_COUNT ? r->op : 0),
        .dtype = r->dtype < FSDP_DTYPE_COUNT ? r->dtype : 0,
        .count = (size_t)r->count,
        .root = r->root,
        .redop = r->redop >= 0 && r->redop < FSDP_REDOP_COUNT ? r->redop : -1,
    };
}

static void fp_call_str(const struct fp_record *r, char *buf, size_t len)
{
    struct fsdp_debug_call c;
    fp_call(r, &c);
    fsdp_debug_call_str(&c, buf, len);
}

static int fp_same(const struct fp_record *a, const struct fp_record *b)
{
    return a->seq == b->seq && a->count == b->count && a->magic == b->magic &&
           a->root == b->root && a->redop == b->redop && a->op == b->op && a->dtype == b->dtype;
}

/* Names the first member whose fingerprint differs from group rank 0's. */
static int fp_compare(const struct fsdp_group *g, const struct fp_record *all)
{
    for (int r = 1; r < g->size; r++) {
        if (fp_same(&all[r], &all[0])) {
            continue;
        }
        char s0[128], sr[128];
        fp_call_str(&all[0], s0, sizeof(s0));
        fp_call_str(&all[r], sr, sizeof(sr));
        if (all[r].magic != FP_MAGIC) {
            return fsdp_err(FSDP_ERR_MISMATCH,
                            "rank %d sent no fingerprint for collective #%" PRIu64 " %s on group "
                            "%s (is FSDPC_DEBUG=DETAIL set on every rank?)",
                            g->world_ranks[r], all[0].seq, s0, g->name);
        }
        return fsdp_err(FSDP_ERR_MISMATCH,
                        "rank %d called %s as collective #%" PRIu64 " on group %s while rank %d "
                        "called %s%s",
                        g->world_ranks[r], sr, all[r].seq, g->name, g->world_ranks[0], s0,
                        all[r].seq != all[0].seq ? " (the sequence numbers differ too)" : "");
    }
    return 0;
}

// ----------------------------------------------------------------------------
// failures: sticky, named once, the backend aborted

/* Records the current error as the group's failure and aborts its backend;
 * with verdict set, also publishes the message for the other members. */
static int fp_fail(struct fsdp_fingerprint *fp, int rc, int verdict)
{
    struct fsdp_group *g = fp->g;
    fp->failed = rc;
    fsdp_err_take(fp->why, sizeof(fp->why));
    if (verdict && g->store &&
        fsdp_store_set(g->store, FP_VERDICT_KEY, fp->why, strlen(fp->why) + 1) < 0) {
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        FSDP_WARN(FSDP_SUB_DIST, "group %s: cannot publish the mismatch: %s", g->name, msg);
    }
    g->ops->abort(g->be, fp->why);
    return fsdp_err(rc, "%s", fp->why);
}

static int fp_refail(const struct fsdp_fingerprint *fp)
{
    return fsdp_err(fp->failed, "%s", fp->why);
}

/* The mismatch another member found and published, as FSDP_ERR_MISMATCH
 * (the current message is replaced), or 0 when there is none. */
static int fp_read_verdict(struct fsdp_group *g)
{
    void *val = NULL;
    size_t len = 0;
    int exists = 0, rc = 0;
    if (g->store && fsdp_store_check(g->store, FP_VERDICT_KEY, &exists) == 0 && exists &&
        fsdp_store_get(g->store, FP_VERDICT_KEY, &val, &len, 0) == 0 && len > 1) {
        char *msg = val;
        msg[len - 1] = '\0';
        fsdp_err_clear();
        rc = fsdp_err(FSDP_ERR_MISMATCH, "%s", msg);
    }
    free(val);
    return rc;
}

/* After a failed exchange: names the members whose last published
 * fingerprint is before seq (FSDP_ERR_TIMEOUT), or returns 0 when none is. */
static int fp_name_missing(struct fsdp_group *g, uint64_t seq, const char *mine, double waited)
{
    char missing[512];
    size_t o = 0;
    int nmissing = 0;
    missing[0] = 0;
    for (int r = 0; r < g->size; r++) {
        if (r == g->rank || o + 96 > sizeof(missing)) {
            continue;
        }
        char key[32];
        snprintf(key, sizeof(key), "fp/%d", g->world_ranks[r]);
        void *val = NULL;
        size_t len = 0;
        uint64_t last = 0;
        int exists = 0;
        if (g->store && fsdp_store_check(g->store, key, &exists) == 0 && exists &&
            fsdp_store_get(g->store, key, &val, &len, 0) == 0 && len == sizeof(struct fp_record)) {
            struct fp_record rec;
            memcpy(&rec, val, sizeof(rec));
            last = rec.seq;
        }
        fsdp_err_clear(); /* a key not there (yet) is an answer, not an error */
        free(val);
        if (last >= seq) {
            continue;
        }
        nmissing++;
        if (last) {
            o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%srank %d (last at #%" PRIu64 ")",
                                  o ? ", " : "", g->world_ranks[r], last);
        } else {
            o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%srank %d (none yet)",
                                  o ? ", " : "", g->world_ranks[r]);
        }
    }
    if (!nmissing) {
        return 0;
    }
    return fsdp_err(FSDP_ERR_TIMEOUT,
                    "collective #%" PRIu64 " %s on group %s: %s never reached it (waited %.1f s)",
                    seq, mine, g->name, missing, waited);
}

/* The exchange of slot s failed with rc (a timeout at the deadline, a peer
 * lost, the backend aborted): the news is a published mismatch, else the
 * members that never reached the collective, else the backend's error. */
static int fp_exchange_failed(struct fsdp_fingerprint *fp, const struct fp_slot *s, int rc,
                              double waited)
{
    struct fsdp_group *g = fp->g;
    char call[128], why[512];
    fsdp_err_take(why, sizeof(why));
    fp_call_str(&s->mine, call, sizeof(call));
    int named = fp_read_verdict(g);
    if (!named) {
        fsdp_err_clear(); /* a failed store lookup is not the news */
        named = fp_name_missing(g, s->seq, call, waited);
    }
    if (!named) {
        fsdp_err_clear();
        named = fsdp_err(rc, "collective #%" PRIu64 " %s on group %s: fingerprint exchange failed: %s",
                         s->seq, call, g->name, why);
    }
    return fp_fail(fp, named, 0);
}

// ----------------------------------------------------------------------------
// checks

/* Checks the exchanges of collectives checked+1..upto in issue order,
 * waiting up to timeout_s in all. A timeout that is not the deadline is the
 * caller's poll: FSDP_ERR_TIMEOUT, nothing failed. */
static int fp_check_upto(struct fsdp_fingerprint *fp, uint64_t upto, double timeout_s, int deadline)
{
    if (fp->failed) {
        return fp_refail(fp);
    }
    double t0 = fsdp_now();
    while (fp->checked < upto) {
        struct fp_slot *s = &fp->ring[(fp->checked + 1) % FP_RING];
        if (!s->xchg || s->seq != fp->checked + 1) {
            return fsdp_err(FSDP_ERR_INTERNAL, "group %s: no fingerprint exchange for collective #%" PRIu64,
                            fp->g->name, fp->checked + 1);
        }
        double left = timeout_s - (fsdp_now() - t0);
        int rc = s->xchg->ops->work_wait(s->xchg, left > 0 ? left : 0);
        if (rc == FSDP_ERR_TIMEOUT && !deadline) {
            return rc;
        }
        if (rc < 0) {
            return fp_exchange_failed(fp, s, rc, fsdp_now() - t0);
        }
        s->xchg->ops->work_free(s->xchg);
        s->xchg = NULL;
        rc = fp_compare(fp->g, s->all);
        if (rc < 0) {
            return fp_fail(fp, rc, 1);
        }
        fp->checked = s->seq;
    }
    return 0;
}

/* Checks, without blocking, the exchanges up to upto that are complete. */
static int fp_check_ready(struct fsdp_fingerprint *fp, uint64_t upto)
{
    while (!fp->failed && fp->checked < upto) {
        struct fp_slot *s = &fp->ring[(fp->checked + 1) % FP_RING];
        if (s->xchg) {
            int done = 0;
            int rc = s->xchg->ops->work_test(s->xchg, &done);
            if (rc < 0) {
                return fp_exchange_failed(fp, s, rc, 0);
            }
            if (!done) {
                return 0;
            }
        }
        FSDP_CHECK(fp_check_upto(fp, fp->checked + 1, 0, 1));
    }
    return fp->failed ? fp_refail(fp) : 0;
}

/* The slot whose collective w is, or NULL when it has been checked. */
static struct fp_slot *fp_find(struct fsdp_fingerprint *fp, const struct fsdp_work *w)
{
    for (int i = 0; i < FP_RING; i++) {
        if (fp->ring[i].owner == w) {
            return &fp->ring[i];
        }
    }
    return NULL;
}

/* The backend refused an operation with rc (it failed or was aborted
 * before): the mismatch among the collectives up to upto that explains it,
 * or the one another member published (the message replaced), else rc with
 * the message left alone. */
static int fp_explain_refusal(struct fsdp_fingerprint *fp, uint64_t upto, int rc)
{
    char why[1024];
    fsdp_err_take(why, sizeof(why));
    /* the exchanges before the refusal completed or failed with the backend */
    int named = fp_check_upto(fp, upto, fsdp_debug_timeout(fp->g), 1);
    if (named == 0) {
        named = fp_read_verdict(fp->g);
        if (named < 0) {
            return fp_fail(fp, named, 0);
        }
    }
    if (named < 0) {
        return named;
    }
    fsdp_err_clear();
    return fsdp_err(rc, "%s", why);
}

int fsdp_fingerprint_issue(struct fsdp_fingerprint *fp, const struct fsdp_debug_call *c)
{
    struct fsdp_group *g = fp->g;
    if (fp->failed) {
        return fp_refail(fp);
    }
    uint64_t seq = g->seq;
    struct fp_slot *s = &fp->ring[seq % FP_RING];
    if (s->xchg) {
        /* FP_RING collectives unchecked: the oldest goes first */
        FSDP_CHECK(fp_check_upto(fp, s->seq, fsdp_debug_timeout(g), 1));
    }
    s->seq = seq;
    s->owner = NULL;
    s->mine = fp_make(seq, c);
    pthread_mutex_lock(&fp->mu);
    fp->last = s->mine;
    pthread_mutex_unlock(&fp->mu);
    int rc = g->ops->allgather(g->be, &s->mine, s->all, sizeof(s->mine), FSDP_U8, NULL, &s->xchg);
    if (rc < 0) {
        s->xchg = NULL;
        int named = fp_explain_refusal(fp, seq - 1, rc);
        if (named != rc) {
            return named;
        }
        char call[128], why[512];
        fsdp_err_take(why, sizeof(why));
        fsdp_debug_call_str(c, call, sizeof(call));
        return fp_fail(fp,
                       fsdp_err(rc, "collective #%" PRIu64 " %s on group %s: cannot issue its "
                                    "fingerprint exchange: %s",
                                seq, call, g->name, why),
                       0);
    }
    if (fp->strict) {
        FSDP_CHECK(fp_check_upto(fp, seq, fsdp_debug_timeout(g), 1));
    }
    return 0;
}

void fsdp_fingerprint_bind(struct fsdp_fingerprint *fp, struct fsdp_work *w)
{
    struct fp_slot *s = &fp->ring[fp->g->seq % FP_RING];
    if (s->seq == fp->g->seq && s->seq > fp->checked) {
        s->owner = w;
    }
}

int fsdp_fingerprint_wait(struct fsdp_fingerprint *fp, struct fsdp_work *w, double timeout_s,
                          int deadline)
{
    struct fp_slot *s = fp_find(fp, w);
    if (!s) {
        return 0;
    }
    FSDP_CHECK(fp_check_upto(fp, s->seq, timeout_s, deadline));
    s->owner = NULL;
    return 0;
}

int fsdp_fingerprint_test(struct fsdp_fingerprint *fp, struct fsdp_work *w, int finished)
{
    struct fp_slot *s = fp_find(fp, w);
    if (!s) {
        return 0;
    }
    if (!finished) {
        /* a collective that hangs because of a mismatch is polled forever:
         * report the mismatch as soon as the exchanges before it show it */
        return fp_check_ready(fp, s->seq);
    }
    /* the exchange completed before the collective did */
    FSDP_CHECK(fp_check_upto(fp, s->seq, fsdp_debug_timeout(fp->g), 1));
    s->owner = NULL;
    return 0;
}

int fsdp_fingerprint_refused(struct fsdp_fingerprint *fp, int rc)
{
    return fp_explain_refusal(fp, fp->g->seq - 1, rc);
}

int fsdp_fingerprint_explain(struct fsdp_fingerprint *fp, int rc)
{
    if (fp->failed) {
        fsdp_err_clear();
        return fp_refail(fp);
    }
    int named = fp_read_verdict(fp->g);
    return named ? named : rc;
}

void fsdp_fingerprint_release(struct fsdp_fingerprint *fp, const struct fsdp_work *w)
{
    struct fp_slot *s = fp_find(fp, w);
    if (s) {
        s->owner = NULL; /* still checked, in order, by a later wait or the ring */
    }
}

// ----------------------------------------------------------------------------
// the publisher

static void fp_publish(struct fsdp_fingerprint *fp)
{
    struct fsdp_group *g = fp->g;
    pthread_mutex_lock(&fp->mu);
    struct fp_record last = fp->last;
    pthread_mutex_unlock(&fp->mu);
    if (!last.seq || last.seq == fp->published) {
        return;
    }
    char key[32];
    snprintf(key, sizeof(key), "fp/%d", g->world_ranks[g->rank]);
    if (fsdp_store_set(g->store, key, &last, sizeof(last)) < 0) {
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        FSDP_DEBUG(FSDP_SUB_DIST, "group %s: fingerprint not published: %s", g->name, msg);
        return;
    }
    fp->published = last.seq;
}

static void *fp_publisher_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&fp_pub.mu);
    while (!fp_pub.stop) {
        for (struct fsdp_fingerprint *fp = fp_pub.head; fp; fp = fp->next) {
            fp_publish(fp);
        }
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += FP_PUBLISH_MS * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        while (!fp_pub.stop && pthread_cond_timedwait(&fp_pub.cv, &fp_pub.mu, &until) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&fp_pub.mu);
    return NULL;
}

/* Under fp_pub.mu. */
static int fp_publisher_start(void)
{
    if (fp_pub.running) {
        return 0;
    }
    if (!fp_pub.cv_ready) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        int err = pthread_cond_init(&fp_pub.cv, &ca);
        pthread_condattr_destroy(&ca);
        if (err) {
            return fsdp_err(FSDP_ERR_SYSTEM, "DETAIL: cannot create a condition variable: %s",
                            strerror(err));
        }
        fp_pub.cv_ready = 1;
    }
    fp_pub.stop = 0;
    int err = fsdp_thread_start(&fp_pub.thread, fp_publisher_main, NULL);
    if (err) {
        return fsdp_err(FSDP_ERR_SYSTEM, "DETAIL: cannot start the fingerprint publisher: %s",
                        strerror(err));
    }
    fp_pub.running = 1;
    return 0;
}

void fsdp_fingerprint_shutdown(void)
{
    pthread_mutex_lock(&fp_pub.mu);
    if (!fp_pub.running) {
        pthread_mutex_unlock(&fp_pub.mu);
        return;
    }
    fp_pub.stop = 1;
    pthread_cond_signal(&fp_pub.cv);
    pthread_mutex_unlock(&fp_pub.mu);
    pthread_join(fp_pub.thread, NULL);
    pthread_mutex_lock(&fp_pub.mu);
    fp_pub.running = 0;
    pthread_mutex_unlock(&fp_pub.mu);
}

// ----------------------------------------------------------------------------
// create / destroy

int fsdp_fingerprint_create(struct fsdp_group *g, struct fsdp_fingerprint **out)
{
    int rc;
    *out = NULL;
    struct fsdp_backend_caps caps;
    g->ops->capabilities(g->be, &caps);
    if (!(caps.flags & FSDP_CAP_MEM_HOST)) {
        FSDP_WARN(FSDP_SUB_DIST,
                  "FSDPC_DEBUG=DETAIL: backend %s cannot exchange fingerprints in host memory; "
                  "the collectives of group %s are not checked",
                  g->ops->name, g->name);
        return 0;
    }
    struct fsdp_fingerprint *fp = calloc(1, sizeof(*fp));
    if (!fp) {
        return fsdp_err(FSDP_ERR_NOMEM, "group %s: out of memory for fingerprints", g->name);
    }
    fp->g = g;
    fp->strict = strcmp(g->ops->name, "tcp") != 0;
    fp->table = fsdp_alloc((size_t)FP_RING * (size_t)g->size * sizeof(struct fp_record));
    if (!fp->table) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "group %s: out of memory for fingerprints", g->name);
        goto err_free;
    }
    for (int i = 0; i < FP_RING; i++) {
        fp->ring[i].all = fp->table + (size_t)i * (size_t)g->size;
    }
    int err = pthread_mutex_init(&fp->mu, NULL);
    if (err) {
        rc = fsdp_err(FSDP_ERR_SYSTEM, "group %s: mutex: %s", g->name, strerror(err));
        goto err_table;
    }
    if (g->store) {
        pthread_mutex_lock(&fp_pub.mu);
        rc = fp_publisher_start();
        if (rc == 0) {
            fp->next = fp_pub.head;
            fp_pub.head = fp;
        }
        pthread_mutex_unlock(&fp_pub.mu);
        FSDP_CHECK_GOTO(rc, rc, err_mutex);
    }
    FSDP_DEBUG(FSDP_SUB_DIST, "group %s: DETAIL fingerprints %s", g->name,
               fp->strict ? "checked at the issue (strict)" : "checked at the wait (pipelined)");
    *out = fp;
    return 0;

err_mutex:
    pthread_mutex_destroy(&fp->mu);
err_table:
    fsdp_free(fp->table);
err_free:
    free(fp);
    return rc;
}

void fsdp_fingerprint_destroy(struct fsdp_fingerprint *fp)
{
    if (!fp) {
        return;
    }
    pthread_mutex_lock(&fp_pub.mu);
    for (struct fsdp_fingerprint **p = &fp_pub.head; *p; p = &(*p)->next) {
        if (*p == fp) {
            *p = fp->next;
            break;
        }
    }
    pthread_mutex_unlock(&fp_pub.mu);
    /* exchanges nobody waited for: complete ones are freed, and pending
     * ones (the job is failing) end with the backend's abort */
    int pending = 0;
    for (int i = 0; i < FP_RING; i++) {
        struct fp_slot *s = &fp->ring[i];
        int done = 0;
        if (s->xchg && s->xchg->ops->work_test(s->xchg, &done) == 0 && done) {
            s->xchg->ops->work_free(s->xchg);
            s->xchg = NULL;
        }
        pending += s->xchg != NULL;
    }
    fsdp_err_clear();
    if (pending) {
        fp->g->ops->abort(fp->g->be, "group destroyed with fingerprint exchanges pending");
        for (int i = 0; i < FP_RING; i++) {
            struct fp_slot *s = &fp->ring[i];
            if (s->xchg) {
                s->xchg->ops->work_wait(s->xchg, 1.0);
                s->xchg->ops->work_free(s->xchg);
            }
        }
        fsdp_err_clear();
    }
    pthread_mutex_destroy(&fp->mu);
    fsdp_free(fp->table);
    free(fp);
}
