/*
 * debug_probe.c - drives the debug layer on a device mesh for the tests in
 * tests/debug: wrong or missing collectives under FSDPC_DEBUG=DETAIL, the
 * monitored barrier, SIGUSR2 dumps, and randomized sequences with a skip.
 *
 *   debug_probe --init mpi --mesh dp=2,tp=2 --backend tcp MODE ARGS...
 *
 *   detail FAULT RANK AT   8 x all_gather(f32, 64) on the first dimension;
 *                          on RANK the AT'th call is changed: op (a
 *                          reduce_scatter), dtype (i32), count (32), skip
 *                          (then the rank stalls), root (the AT'th call is
 *                          broadcast(f32, 64, root 0) everywhere, root 1 on
 *                          RANK), or none
 *   ahead FAULT RANK AT POLL N
 *                          N all_gather(f32, 64) issued before any is
 *                          waited for (as the engine prefetches), then
 *                          completed in order: POLL 0 waits, POLL 1 tests
 *                          until done first; FAULT as for detail (op,
 *                          count, root or none); checks the gathered data
 *   pace N AHEAD COUNT     N all_gather(f32, COUNT), each issued when fewer
 *                          than AHEAD are in flight, completed in order;
 *                          rank 0 prints the time per collective (what
 *                          DETAIL adds to a collective: run with and
 *                          without it)
 *   mbarrier RANK SLEEP TIMEOUT WAIT_ALL
 *                          monitored barrier on the first dimension, RANK
 *                          arrives SLEEP seconds late
 *   stall RANK             5 allreduces, then the others issue a 6th and
 *                          sleep without waiting for it, RANK just sleeps
 *   usr2                   a few collectives, then SIGUSR2 to itself; checks
 *                          that $FSDPC_FLIGHT_DIR/flight_<rank>.json appears
 *   fuzz SEED RANK AT      40 collectives of random dimension, op, dtype and
 *                          count (same stream on every rank); RANK skips the
 *                          AT'th
 *
 * Every rank prints "rank R: ..." lines; on an error it prints "rank R:
 * error: <message>", waits a moment so that the other ranks can report
 * theirs, and takes the job down (fsdp_die), as a program would.
 */
#include "config.h"
#include "tests/debug/probe.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "comm/debug.h"
#include "rendezvous/dist.h"
#include "comm/mesh.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROBE_MAX_COUNT 256

static float sendbuf[PROBE_MAX_COUNT * 4], recvbuf[PROBE_MAX_COUNT * 16];

static void probe_detail(struct fsdp_group *g, const char *fault, int frank, int at)
{
    int me = fsdp_log_rank();
    for (int i = 1; i <= 8; i++) {
        int faulty = me == frank && i == at;
        if (faulty && !strcmp(fault, "skip")) {
            continue;
        }
        if (faulty && !strcmp(fault, "op")) {
            PROBE_CHECK(fsdp_reduce_scatter_sync(g, recvbuf, sendbuf, 64, FSDP_F32, FSDP_SUM));
        } else if (faulty && !strcmp(fault, "dtype")) {
            PROBE_CHECK(fsdp_allgather_sync(g, sendbuf, recvbuf, 64, FSDP_I32));
        } else if (faulty && !strcmp(fault, "count")) {
            PROBE_CHECK(fsdp_allgather_sync(g, sendbuf, recvbuf, 32, FSDP_F32));
        } else if (i == at && !strcmp(fault, "root")) {
            PROBE_CHECK(fsdp_broadcast_sync(g, recvbuf, 64, FSDP_F32, faulty ? 1 : 0));
        } else {
            PROBE_CHECK(fsdp_allgather_sync(g, sendbuf, recvbuf, 64, FSDP_F32));
        }
    }
    if (me == frank && !strcmp(fault, "skip")) {
        /* stuck elsewhere: the others must name this rank, then abort us */
        printf("rank %d: skipped collective #%d, stalling\n", me, at);
        fflush(stdout);
        sleep(60);
    }
    PROBE_CHECK(fsdp_barrier_sync(g));
    printf("rank %d: detail done\n", me);
}

#define PROBE_AHEAD_MAX 64

static float ahead_send[64], ahead_recv[PROBE_AHEAD_MAX][4 * 64];

/* Issues n collectives, then completes them in order, as an engine that
 * prefetches does; the fingerprints are checked at the waits. */
static void probe_ahead(struct fsdp_group *g, const char *fault, int frank, int at, int poll, int n)
{
    int me = fsdp_log_rank();
    struct fsdp_work *w[PROBE_AHEAD_MAX];
    if (n < 1 || n > PROBE_AHEAD_MAX || g->size > 4) {
        fsdp_fatal("debug_probe: ahead: N must be 1..%d on at most 4 ranks", PROBE_AHEAD_MAX);
    }
    for (int k = 0; k < 64; k++) {
        ahead_send[k] = (float)(g->rank * 1000 + k);
    }
    for (int i = 1; i <= n; i++) {
        int faulty = me == frank && i == at;
        float *out = ahead_recv[i - 1];
        if (faulty && !strcmp(fault, "op")) {
            PROBE_CHECK(fsdp_reduce_scatter(g, out, out + (size_t)g->rank * 64, 64, FSDP_F32, FSDP_SUM,
                                            NULL, &w[i - 1]));
        } else if (faulty && !strcmp(fault, "count")) {
            PROBE_CHECK(fsdp_allgather(g, ahead_send, out, 32, FSDP_F32, NULL, &w[i - 1]));
        } else if (i == at && !strcmp(fault, "root")) {
            PROBE_CHECK(fsdp_broadcast(g, out, 64, FSDP_F32, faulty ? 1 : 0, NULL, &w[i - 1]));
        } else {
            PROBE_CHECK(fsdp_allgather(g, ahead_send, out, 64, FSDP_F32, NULL, &w[i - 1]));
        }
    }
    int bad = 0;
    for (int i = 1; i <= n; i++) {
        int done = 0;
        while (poll && !done) {
            PROBE_CHECK(fsdp_work_test(w[i - 1], &done));
            if (!done) {
                usleep(200);
            }
        }
        PROBE_CHECK(fsdp_work_wait(w[i - 1], -1));
        fsdp_work_free(w[i - 1]);
        for (int r = 0; r < g->size; r++) {
            for (int k = 0; k < 64; k++) {
                bad += ahead_recv[i - 1][r * 64 + k] != (float)(r * 1000 + k);
            }
        }
    }
    PROBE_CHECK(fsdp_barrier_sync(g));
    printf("rank %d: ahead done, %d wrong values\n", me, bad);
}

static void probe_pace(struct fsdp_group *g, int n, int ahead, size_t count)
{
    struct fsdp_work *w[PROBE_AHEAD_MAX];
    if (n < 1 || ahead < 1 || ahead > PROBE_AHEAD_MAX || count < 1 || count > 64 ||
        g->size > 4) {
        fsdp_fatal("debug_probe: pace: N >= 1, AHEAD 1..%d, COUNT 1..64, at most 4 ranks",
                   PROBE_AHEAD_MAX);
    }
    PROBE_CHECK(fsdp_barrier_sync(g));
    double t0 = fsdp_now();
    for (int i = 0; i < n + ahead; i++) {
        if (i >= ahead) {
            PROBE_CHECK(fsdp_work_wait(w[i % ahead], -1));
            fsdp_work_free(w[i % ahead]);
        }
        if (i < n) {
            PROBE_CHECK(fsdp_allgather(g, ahead_send, ahead_recv[i % ahead], count, FSDP_F32,
                                       NULL, &w[i % ahead]));
        }
    }
    double us = (fsdp_now() - t0) * 1e6 / n;
    PROBE_CHECK(fsdp_barrier_sync(g));
    if (fsdp_log_rank() == 0) {
        printf("pace: %s %d all_gather(f32, %zu), %d in flight: %.1f us each\n", g->ops->name, n,
               count, ahead, us);
    }
}

static void probe_mbarrier(struct fsdp_group *g, int srank, double sleep_s, double timeout,
                           int wait_all)
{
    int me = fsdp_log_rank();
    if (me == srank) {
        usleep((useconds_t)(sleep_s * 1e6));
    }
    double t0 = fsdp_now();
    int rc = fsdp_monitored_barrier(g, timeout, wait_all);
    if (rc < 0) {
        printf("rank %d: mbarrier: %s (after %.1f s)\n", me, fsdp_err_msg(), fsdp_now() - t0);
        fsdp_err_clear();
    } else {
        printf("rank %d: mbarrier: ok\n", me);
    }
}

static void probe_usr2(struct fsdp_group *g)
{
    int me = fsdp_log_rank();
    for (int i = 0; i < 5; i++) {
        PROBE_CHECK(fsdp_allreduce_sync(g, sendbuf, recvbuf, 16, FSDP_F32, FSDP_SUM));
    }
    const char *dir = getenv("FSDPC_FLIGHT_DIR");
    char path[1024];
    snprintf(path, sizeof(path), "%s/flight_%d.json", dir ? dir : FSDP_FLIGHT_DEFAULT_DIR, me);
    unlink(path);
    kill(getpid(), SIGUSR2);
    struct stat st;
    int ok = 0;
    for (int i = 0; i < 100 && !ok; i++) {
        ok = stat(path, &st) == 0;
        usleep(50000);
    }
    printf("rank %d: usr2 dump %s\n", me, ok ? "written" : "missing");
    PROBE_CHECK(fsdp_barrier_sync(g));
}

/* Every rank but srank issues an allreduce and then "computes" without
 * waiting for it: only the watchdog can notice. */
static void probe_stall(struct fsdp_group *g, int srank)
{
    int me = fsdp_log_rank();
    for (int i = 0; i < 5; i++) {
        PROBE_CHECK(fsdp_allreduce_sync(g, sendbuf, recvbuf, 16, FSDP_F32, FSDP_SUM));
    }
    if (me != srank) {
        struct fsdp_work *w;
        PROBE_CHECK(fsdp_allreduce(g, sendbuf, recvbuf, 16, FSDP_F32, FSDP_SUM, NULL, &w));
    }
    printf("rank %d: stalling\n", me);
    fflush(stdout);
    sleep(60);
    printf("rank %d: the watchdog did not fire\n", me);
}

/* xorshift: the same stream on every rank. */
static uint64_t probe_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void probe_fuzz(struct fsdp_mesh *m, uint64_t seed, int frank, int at)
{
    int me = fsdp_log_rank();
    uint64_t s = seed * 2654435761u + 88172645463325252ull;
    static const enum fsdp_dtype dts[] = {FSDP_F32, FSDP_BF16, FSDP_I32};
    for (int i = 1; i <= 40; i++) {
        struct fsdp_group *g = m->dims[probe_next(&s) % (uint64_t)m->ndims].group;
        int op = (int)(probe_next(&s) % 4);
        enum fsdp_dtype dt = dts[probe_next(&s) % 3];
        size_t count = 1 + probe_next(&s) % PROBE_MAX_COUNT;
        if (me == frank && i == at) {
            printf("rank %d: skipping collective %d (on %s)\n", me, i, g->name);
            fflush(stdout);
            continue;
        }
        switch (op) {
        case 0: PROBE_CHECK(fsdp_allreduce_sync(g, sendbuf, recvbuf, count, dt, FSDP_SUM)); break;
        case 1: PROBE_CHECK(fsdp_allgather_sync(g, sendbuf, recvbuf, count, dt)); break;
        case 2:
            PROBE_CHECK(fsdp_reduce_scatter_sync(g, recvbuf, sendbuf, count, dt, FSDP_SUM));
            break;
        default: PROBE_CHECK(fsdp_broadcast_sync(g, sendbuf, count, dt, 0)); break;
        }
    }
    /* a rank that finished early must not leave before the others fail */
    PROBE_CHECK(fsdp_barrier_sync(m->dims[0].group));
    if (m->ndims > 1) {
        PROBE_CHECK(fsdp_barrier_sync(m->dims[1].group));
    }
    printf("rank %d: fuzz done\n", me);
}

int main(int argc, char **argv)
{
    const char *mode;
    char **a;
    int na;
    struct fsdp_dist *d;
    struct fsdp_mesh *m;
    probe_start(argc, argv, "debug_probe", "detail, ahead, pace, mbarrier, stall, usr2, fuzz",
                &mode, &a, &na, &d, &m);
    for (size_t k = 0; k < sizeof(sendbuf) / sizeof(sendbuf[0]); k++) {
        sendbuf[k] = (float)(k % 7);
    }
    struct fsdp_group *g0 = m->dims[0].group;
    if (!strcmp(mode, "detail") && na == 3) {
        probe_detail(g0, a[0], atoi(a[1]), atoi(a[2]));
    } else if (!strcmp(mode, "ahead") && na == 5) {
        probe_ahead(g0, a[0], atoi(a[1]), atoi(a[2]), atoi(a[3]), atoi(a[4]));
    } else if (!strcmp(mode, "pace") && na == 3) {
        probe_pace(g0, atoi(a[0]), atoi(a[1]), (size_t)atol(a[2]));
    } else if (!strcmp(mode, "mbarrier") && na == 4) {
        probe_mbarrier(g0, atoi(a[0]), atof(a[1]), atof(a[2]), atoi(a[3]));
    } else if (!strcmp(mode, "stall") && na == 1) {
        probe_stall(g0, atoi(a[0]));
    } else if (!strcmp(mode, "usr2") && na == 0) {
        probe_usr2(g0);
    } else if (!strcmp(mode, "fuzz") && na == 3) {
        probe_fuzz(m, (uint64_t)atoll(a[0]), atoi(a[1]), atoi(a[2]));
    } else {
        fsdp_fatal("debug_probe: bad mode or arguments: %s", mode);
    }
    fflush(stdout);
    fsdp_mesh_destroy(m);
    fsdp_dist_finalize(d);
    return 0;
}
