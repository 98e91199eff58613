/*
 * debug.c - the process-wide debug layer behind the group hooks: the level,
 * deadlines, the flight recorder instance, error naming and dumps.
 *
 * State is one static block: the layer is process-wide like the abort hook
 * (one job per process), and the hooks must cost a load and a branch when
 * it is off. It is set up by the first group and lives until
 * fsdp_dist_finalize (which calls fsdp_debug_finalize through its finalize
 * hook). The DETAIL fingerprint check lives in fingerprint.c,
 * the watchdog thread in watchdog.c.
 */
#include "config.h"
#include "comm/debug.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "comm/group.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEBUG_DEFAULT_FLIGHT 2048
#define DEBUG_INFO_MIN_FLIGHT 256 /* INFO's totals need records to finish */
#define DEBUG_DEFAULT_INIT_TIMEOUT_S 600.0

static struct {
    pthread_mutex_t mu;
    int ready;
    enum fsdp_debug_level level;
    struct fsdp_flight *flight;
    struct fsdp_watchdog *watchdog;
    double init_timeout_s;
    volatile int steady;
    int dumped; /* the error dump happened (only the first error's is kept) */
    double t_error; /* fsdp_now() of that first error; 0: none */
    int dump_at_exit;
    char dir[1024];
} dbg = {.mu = PTHREAD_MUTEX_INITIALIZER};

enum fsdp_debug_level fsdp_debug_level(void)
{
    return dbg.level;
}

static int debug_parse_level(const char *s, enum fsdp_debug_level *out)
{
    if (!s || !s[0] || !strcasecmp(s, "OFF") || !strcmp(s, "0")) {
        *out = FSDP_DEBUG_OFF;
    } else if (!strcasecmp(s, "INFO")) {
        *out = FSDP_DEBUG_INFO;
    } else if (!strcasecmp(s, "DETAIL")) {
        *out = FSDP_DEBUG_DETAIL;
    } else {
        return fsdp_err(FSDP_ERR_INVALID, "FSDPC_DEBUG=%s: expected OFF, INFO or DETAIL", s);
    }
    return 0;
}

/* Reads the environment and starts the recorder and watchdog; under dbg.mu. */
static int debug_setup(const struct fsdp_dist *d)
{
    FSDP_CHECK(debug_parse_level(fsdp_env_str("FSDPC_DEBUG", "OFF"), &dbg.level));
    long long n = fsdp_env_int("FSDPC_FLIGHT_RECORDER", DEBUG_DEFAULT_FLIGHT);
    if (n < 0 || n > (1 << 24)) {
        return fsdp_err(FSDP_ERR_INVALID, "FSDPC_FLIGHT_RECORDER=%lld: expected 0..%d entries", n,
                        1 << 24);
    }
    if (dbg.level >= FSDP_DEBUG_INFO && n < DEBUG_INFO_MIN_FLIGHT) {
        n = DEBUG_INFO_MIN_FLIGHT;
    }
    double init = fsdp_env_double("FSDPC_INIT_TIMEOUT", 0);
    if (init < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "FSDPC_INIT_TIMEOUT=%g: expected seconds > 0", init);
    }
    dbg.init_timeout_s = init > 0 ? init : DEBUG_DEFAULT_INIT_TIMEOUT_S;
    snprintf(dbg.dir, sizeof(dbg.dir), "%s", fsdp_env_str("FSDPC_FLIGHT_DIR", FSDP_FLIGHT_DEFAULT_DIR));
    dbg.dump_at_exit = fsdp_env_int("FSDPC_FLIGHT_DUMP_AT_EXIT", 0) != 0;
    if (n > 0) {
        FSDP_CHECK(fsdp_flight_create((size_t)n, d->rank, d->world_size, d->host, &dbg.flight));
        int rc = fsdp_watchdog_start(dbg.flight, &dbg.watchdog);
        if (rc < 0) {
            fsdp_flight_destroy(dbg.flight);
            dbg.flight = NULL;
            FSDP_CHECK(rc);
        }
    }
    if (dbg.level >= FSDP_DEBUG_INFO) {
        FSDP_INFO(FSDP_SUB_DIST,
                  "debug %s: flight recorder %lld entries (dumps to %s), deadline %.1f s, "
                  "%.1f s until the first step",
                  dbg.level == FSDP_DEBUG_DETAIL ? "DETAIL" : "INFO", n, dbg.dir, d->timeout_s,
                  dbg.init_timeout_s > d->timeout_s ? dbg.init_timeout_s : d->timeout_s);
    }
    return 0;
}

static void debug_finalize_cb(void *arg)
{
    (void)arg;
    fsdp_debug_finalize();
}

int fsdp_debug_group_add(struct fsdp_group *g, int *id)
{
    *id = -1;
    pthread_mutex_lock(&dbg.mu);
    if (!dbg.ready) {
        int rc = debug_setup(g->dist);
        if (rc == 0) {
            /* summary and exit dump while the job is still whole */
            rc = fsdp_dist_on_finalize(g->dist, debug_finalize_cb, NULL);
        }
        if (rc < 0) {
            pthread_mutex_unlock(&dbg.mu);
            return rc;
        }
        dbg.ready = 1;
    }
    pthread_mutex_unlock(&dbg.mu);
    if (dbg.flight) {
        int k = fsdp_flight_add_group(dbg.flight, g->name, g->world_ranks, g->size);
        if (k < 0) {
            /* the table only names groups in dumps: the group's collectives
             * are still recorded, under "?" */
            char why[256];
            fsdp_err_take(why, sizeof(why));
            FSDP_WARN(FSDP_SUB_DIST, "group %s: flight-recorder dumps will not name it: %s",
                      g->name, why);
        } else {
            *id = k;
        }
    }
    if (dbg.level >= FSDP_DEBUG_INFO) {
        char ranks[256];
        size_t o = 0;
        for (int i = 0; i < g->size && o + 16 < sizeof(ranks); i++) {
            o += (size_t)snprintf(ranks + o, sizeof(ranks) - o, "%s%d", i ? "," : "",
                                  g->world_ranks[i]);
        }
        FSDP_INFO(FSDP_SUB_DIST, "group %s: world ranks [%s], this rank %d of %d, backend %s",
                  g->name, ranks, g->rank, g->size, g->ops->name);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// deadlines

double fsdp_debug_timeout(const struct fsdp_group *g)
{
    if (!dbg.steady && dbg.init_timeout_s > g->timeout_s) {
        return dbg.init_timeout_s;
    }
    return g->timeout_s;
}

void fsdp_debug_mark_steady(void)
{
    dbg.steady = 1;
}

// ----------------------------------------------------------------------------
// records

const char *fsdp_debug_op_kind(enum fsdp_coll_op op)
{
    return op == FSDP_COLL_SEND || op == FSDP_COLL_RECV ? "message" : "collective";
}

void fsdp_debug_call_str(const struct fsdp_debug_call *c, char *buf, size_t len)
{
    const char *op = fsdp_coll_op_name(c->op);
    const char *dt = fsdp_dtype_name((enum fsdp_dtype)c->dtype);
    switch (c->op) {
    case FSDP_COLL_BARRIER: snprintf(buf, len, "%s()", op); break;
    case FSDP_COLL_BROADCAST:
        snprintf(buf, len, "%s(%s, %zu, root %d)", op, dt, c->count, c->root);
        break;
    case FSDP_COLL_SEND:
    case FSDP_COLL_RECV:
        snprintf(buf, len, "%s(%s, %zu, tag %u)", op, dt, c->count, (unsigned)c->tag);
        break;
    case FSDP_COLL_ALLREDUCE:
    case FSDP_COLL_REDUCE_SCATTER:
        snprintf(buf, len, "%s(%s, %zu, %s)", op, dt, c->count,
                 c->redop >= 0 ? fsdp_redop_name((enum fsdp_redop)c->redop) : "?");
        break;
    default: snprintf(buf, len, "%s(%s, %zu)", op, dt, c->count); break;
    }
}

uint64_t fsdp_debug_issued(struct fsdp_group *g, int id, const struct fsdp_debug_call *c)
{
    return fsdp_debug_issued_p2p(g, id, g->seq, c);
}

void fsdp_debug_channel_add(struct fsdp_group *g, int src, int dst, int *id)
{
    *id = -1;
    if (!dbg.flight) {
        return;
    }
    char name[96];
    int w[2] = {g->world_ranks[src], g->world_ranks[dst]};
    if (w[0] > w[1]) {
        int t = w[0];
        w[0] = w[1], w[1] = t;
    }
    snprintf(name, sizeof(name), "%s:%d>%d", g->name, src, dst);
    int k = fsdp_flight_add_group(dbg.flight, name, w, 2);
    if (k < 0) {
        char why[256];
        fsdp_err_take(why, sizeof(why));
        FSDP_WARN(FSDP_SUB_DIST, "group %s: flight-recorder dumps will not name channel %s: %s",
                  g->name, name, why);
        return;
    }
    *id = k;
}

uint64_t fsdp_debug_issued_p2p(struct fsdp_group *g, int id, uint64_t seq,
                               const struct fsdp_debug_call *c)
{
    if (!dbg.flight) {
        return 0;
    }
    struct fsdp_flight_entry e = {
        .seq = seq,
        .count = c->count,
        .t_issue = fsdp_now(),
        .deadline_s = fsdp_debug_timeout(g),
        .group = (int16_t)id,
        .root = (int16_t)c->root,
        .op = (uint8_t)c->op,
        .dtype = (uint8_t)c->dtype,
        .redop = c->redop < 0 ? FSDP_FLIGHT_NO_REDOP : (uint8_t)c->redop,
        .tag = c->tag,
    };
    return fsdp_flight_issue(dbg.flight, &e);
}

void fsdp_debug_entry_call(const struct fsdp_flight_entry *e, struct fsdp_debug_call *c)
{
    *c = (struct fsdp_debug_call){
        .op = (enum fsdp_coll_op)e->op,
        .dtype = e->dtype,
        .count = e->count,
        .root = e->root,
        .redop = e->redop == FSDP_FLIGHT_NO_REDOP ? -1 : e->redop,
        .tag = e->tag,
    };
}

int fsdp_debug_finished(uint64_t id, int rc, double waited_s)
{
    if (!dbg.flight || !id) {
        return rc;
    }
    fsdp_flight_finish(dbg.flight, id, rc < 0 ? FSDP_FLIGHT_FAILED : FSDP_FLIGHT_COMPLETED);
    if (rc >= 0) {
        return rc;
    }
    struct fsdp_flight_entry e;
    if (fsdp_flight_get(dbg.flight, id, &e)) {
        char why[768], call[128];
        struct fsdp_debug_call c;
        fsdp_err_take(why, sizeof(why));
        fsdp_debug_entry_call(&e, &c);
        fsdp_debug_call_str(&c, call, sizeof(call));
        if (rc == FSDP_ERR_TIMEOUT) {
            rc = fsdp_err(rc, "%s #%" PRIu64 " %s on group %s not complete after %.1f s (%s)",
                          fsdp_debug_op_kind(c.op), e.seq, call,
                          fsdp_flight_group_name(dbg.flight, e.group), waited_s, why);
        } else {
            rc = fsdp_err(rc, "%s #%" PRIu64 " %s on group %s failed: %s", fsdp_debug_op_kind(c.op),
                          e.seq, call, fsdp_flight_group_name(dbg.flight, e.group), why);
        }
    }
    fsdp_debug_dump(fsdp_err_msg());
    return rc;
}

void fsdp_debug_refused(uint64_t id)
{
    if (dbg.flight && id) {
        fsdp_flight_finish(dbg.flight, id, FSDP_FLIGHT_FAILED);
        fsdp_debug_dump(fsdp_err_msg());
    }
}

void fsdp_debug_abandoned(uint64_t id)
{
    if (dbg.flight && id) {
        fsdp_flight_finish(dbg.flight, id, FSDP_FLIGHT_ABANDONED);
    }
}

/* Only the first error's dump is kept: later ones describe the fallout. */
void fsdp_debug_dump(const char *reason)
{
    if (!dbg.flight || __atomic_exchange_n(&dbg.dumped, 1, __ATOMIC_ACQ_REL)) {
        return;
    }
    dbg.t_error = fsdp_now();
    /* the caller's error message is the root cause: it must survive a
     * failing dump (reason may point into it) */
    char why[1024], saved[1024];
    snprintf(why, sizeof(why), "%s", reason ? reason : "");
    int had = fsdp_err_msg()[0] != 0;
    fsdp_err_take(saved, sizeof(saved));
    if (fsdp_flight_dump(dbg.flight, dbg.dir, why) < 0) {
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        FSDP_WARN(FSDP_SUB_DIST, "%s", msg);
    }
    if (had) {
        fsdp_err(FSDP_ERR_INTERNAL, "%s", saved); /* restores the message; the code is the caller's */
    }
}

double fsdp_debug_error_time(void)
{
    return __atomic_load_n(&dbg.dumped, __ATOMIC_ACQUIRE) ? dbg.t_error : 0;
}

void fsdp_debug_finalize(void)
{
    pthread_mutex_lock(&dbg.mu);
    if (!dbg.ready) {
        pthread_mutex_unlock(&dbg.mu);
        return;
    }
    fsdp_watchdog_stop(dbg.watchdog);
    dbg.watchdog = NULL;
    fsdp_fingerprint_shutdown();
    if (dbg.flight) {
        if (dbg.level >= FSDP_DEBUG_INFO) {
            fsdp_flight_log_summary(dbg.flight);
        }
        if (dbg.dump_at_exit && fsdp_flight_dump(dbg.flight, dbg.dir, "exit") < 0) {
            char msg[512];
            fsdp_err_take(msg, sizeof(msg));
            FSDP_WARN(FSDP_SUB_DIST, "%s", msg);
        }
        fsdp_flight_destroy(dbg.flight);
        dbg.flight = NULL;
    }
    dbg.ready = 0;
    dbg.steady = 0;
    dbg.dumped = 0;
    dbg.t_error = 0;
    dbg.level = FSDP_DEBUG_OFF;
    pthread_mutex_unlock(&dbg.mu);
}
