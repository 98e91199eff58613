/*
 * fingerprint.c - FSDPC_DEBUG=DETAIL: before every collective the members
 * of the group compare what they are about to call.
 *
 * Each rank allgathers a 32-byte fingerprint (seq, op, dtype, count, root,
 * reduce op) on the group's own backend, so the check follows the real
 * collectives' order and every rank compares the same table: a mismatch is
 * found by all ranks at once and named the same way on each, citing the
 * lowest group rank that disagrees with group rank 0. A rank that skipped a
 * collective leaves the others' fingerprint exchange waiting; to name it,
 * every rank also keeps its last fingerprint under one store key
 * ("fp/<world rank>", overwritten, so nothing accumulates), which the
 * waiting ranks read when the exchange times out.
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "dist/debug.h"
#include "dist/group.h"
#include "dist/store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP_MAGIC 0x66707231u /* "fpr1" */

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

static int fp_same(const struct fp_record *a, const struct fp_record *b)
{
    return a->seq == b->seq && a->count == b->count && a->magic == b->magic &&
           a->root == b->root && a->redop == b->redop && a->op == b->op && a->dtype == b->dtype;
}

/* Names the first member whose fingerprint differs from group rank 0's. */
static int fp_compare(struct fsdp_group *g, const struct fp_record *all)
{
    for (int r = 1; r < g->size; r++) {
        if (fp_same(&all[r], &all[0])) {
            continue;
        }
        struct fsdp_debug_call c0, cr;
        char s0[128], sr[128];
        fp_call(&all[0], &c0);
        fp_call(&all[r], &cr);
        fsdp_debug_call_str(&c0, s0, sizeof(s0));
        fsdp_debug_call_str(&cr, sr, sizeof(sr));
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

/* After a failed exchange: names the members that never reached collective
 * seq (FSDP_ERR_TIMEOUT), or returns 0 when all of them did. */
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
        fsdp_err_clear();
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

int fsdp_debug_fingerprint(struct fsdp_group *g, const struct fsdp_debug_call *c)
{
    if (g->size < 2) {
        return 0;
    }
    struct fp_record mine = fp_make(g->seq, c);
    if (g->store) {
        char key[32];
        snprintf(key, sizeof(key), "fp/%d", g->world_ranks[g->rank]);
        FSDP_CHECK(fsdp_store_set(g->store, key, &mine, sizeof(mine)));
    }
    struct fp_record *all = calloc((size_t)g->size, sizeof(*all));
    if (!all) {
        return fsdp_err(FSDP_ERR_NOMEM, "group %s: out of memory for fingerprints", g->name);
    }
    struct fsdp_work *w = NULL;
    int rc = g->ops->allgather(g->be, &mine, all, sizeof(mine), FSDP_U8, NULL, &w);
    if (rc < 0) {
        free(all);
        FSDP_CHECK(rc);
    }
    double timeout = fsdp_debug_timeout(g), t0 = fsdp_now();
    rc = w->ops->work_wait(w, timeout);
    if (rc == FSDP_ERR_TIMEOUT || rc == FSDP_ERR_PEER || rc == FSDP_ERR_ABORTED) {
        /* a peer's backend may have given up first and told us; either way
         * the member that is behind is the news */
        char call[128], why[512];
        fsdp_err_take(why, sizeof(why));
        fsdp_debug_call_str(c, call, sizeof(call));
        int named = fp_name_missing(g, g->seq, call, fsdp_now() - t0);
        if (!named) {
            fsdp_err(rc, "collective #%" PRIu64 " %s on group %s: fingerprint exchange failed: %s",
                     g->seq, call, g->name, why);
        } else {
            rc = named;
        }
        /* the exchange stays pending: the group is out of step for good */
        g->ops->abort(g->be, fsdp_err_msg());
    }
    w->ops->work_free(w);
    if (rc == 0) {
        rc = fp_compare(g, all);
    }
    free(all);
    FSDP_CHECK(rc);
    return 0;
}
