/*
 * monitored_barrier.c - a barrier that names the ranks that did not arrive.
 *
 * Through the group's store, never the backend, so it works when the
 * backend is the thing in trouble. Call k of a group uses the keys
 * "mb/<k>/in/<group rank>" (one per member) and "mb/<k>/verdict": members
 * check in and wait for the verdict; group rank 0 waits for the check-ins
 * until the deadline, then writes "ok" or the error text, so every member
 * reports the same thing. A member that arrives after the verdict reads it
 * at once. If rank 0 itself is missing, the others time out waiting for the
 * verdict and name it.
 */
#include "config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "comm/debug.h"
#include "comm/group.h"
#include "rendezvous/store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Slack for rank 0's verdict on top of the deadline: it posts it after
 * waiting the deadline itself, and may have arrived later than we did. */
#define MB_VERDICT_SLACK_S 5.0

/* Rank 0: waits for the members' check-ins and posts the verdict. */
static int mb_collect(struct fsdp_group *g, uint64_t k, double timeout_s, int wait_all,
                      char *verdict, size_t len)
{
    double deadline = fsdp_now() + timeout_s;
    char ranks[512] = "";
    size_t o = 0;
    int nmissing = 0;
    for (int r = 1; r < g->size; r++) {
        char key[64];
        snprintf(key, sizeof(key), "mb/%" PRIu64 "/in/%d", k, r);
        double left = deadline - fsdp_now();
        void *val = NULL;
        size_t vlen = 0;
        int rc = fsdp_store_get(g->store, key, &val, &vlen, left > 0 ? left : 0);
        free(val);
        if (rc == 0) {
            continue;
        }
        fsdp_err_clear();
        if (rc != FSDP_ERR_TIMEOUT) {
            return fsdp_err(rc, "monitored barrier #%" PRIu64 " on group %s: store failed while "
                            "waiting for rank %d", k, g->name, g->world_ranks[r]);
        }
        nmissing++;
        if (o + 16 < sizeof(ranks)) {
            o += (size_t)snprintf(ranks + o, sizeof(ranks) - o, "%s%d", o ? ", " : "",
                                  g->world_ranks[r]);
        }
        if (!wait_all) {
            break;
        }
    }
    if (!nmissing) {
        snprintf(verdict, len, "ok");
        return 0;
    }
    snprintf(verdict, len,
             "monitored barrier #%" PRIu64 " on group %s: rank%s %s did not arrive within %.1f s%s",
             k, g->name, nmissing > 1 ? "s" : "", ranks, timeout_s,
             wait_all ? "" : " (the first missing one; wait_all names all)");
    return FSDP_ERR_TIMEOUT;
}

int fsdp_monitored_barrier(struct fsdp_group *g, double timeout_s, int wait_all)
{
    if (!g) {
        return fsdp_err(FSDP_ERR_INVALID, "monitored barrier: NULL group");
    }
    if (timeout_s < 0) {
        timeout_s = fsdp_debug_timeout(g);
    }
    uint64_t k = ++g->monitored_barriers;
    if (g->size == 1) {
        return 0;
    }
    if (!g->store) {
        return fsdp_err(FSDP_ERR_INVALID, "monitored barrier on group %s: the group has no store",
                        g->name);
    }
    char key[64];
    if (g->rank == 0) {
        char verdict[768];
        int rc = mb_collect(g, k, timeout_s, wait_all, verdict, sizeof(verdict));
        if (rc < 0 && rc != FSDP_ERR_TIMEOUT) {
            return rc;
        }
        snprintf(key, sizeof(key), "mb/%" PRIu64 "/verdict", k);
        FSDP_CHECK(fsdp_store_set(g->store, key, verdict, strlen(verdict) + 1));
        if (rc < 0) {
            return fsdp_err(FSDP_ERR_TIMEOUT, "%s", verdict);
        }
        return 0;
    }
    snprintf(key, sizeof(key), "mb/%" PRIu64 "/in/%d", k, g->rank);
    FSDP_CHECK(fsdp_store_set(g->store, key, "1", 2));
    snprintf(key, sizeof(key), "mb/%" PRIu64 "/verdict", k);
    void *val = NULL;
    size_t len = 0;
    int rc = fsdp_store_get(g->store, key, &val, &len, timeout_s + MB_VERDICT_SLACK_S);
    if (rc == FSDP_ERR_TIMEOUT) {
        fsdp_err_clear();
        return fsdp_err(FSDP_ERR_TIMEOUT,
                        "monitored barrier #%" PRIu64 " on group %s: rank %d (the group's rank 0) "
                        "did not arrive within %.1f s",
                        k, g->name, g->world_ranks[0], timeout_s + MB_VERDICT_SLACK_S);
    }
    FSDP_CHECK(rc);
    char *v = val;
    if (len == 0 || v[len - 1] != 0) {
        free(val);
        return fsdp_err(FSDP_ERR_FORMAT, "monitored barrier #%" PRIu64 " on group %s: malformed "
                        "verdict in the store", k, g->name);
    }
    if (strcmp(v, "ok") != 0) {
        rc = fsdp_err(FSDP_ERR_TIMEOUT, "%s", v);
        free(val);
        return rc;
    }
    free(val);
    return 0;
}
