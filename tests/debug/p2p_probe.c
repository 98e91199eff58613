/*
 * p2p_probe.c - drives point-to-point messages on a device mesh for
 * tests/debug/test_p2p.sh, as a pipeline passes activations from stage to
 * stage: every rank sends to the next rank of the first dimension and
 * receives from the one before it.
 *
 *   p2p_probe --init mpi --mesh dp=3 --backend tcp MODE ARGS...
 *
 *   ring ROUNDS           ROUNDS messages per rank of sizes 0, 1, 7, 4096
 *                         and 300007 elements in turn (f32, then i32 and
 *                         bf16), tag = the round, even ranks sending
 *                         first, odd ranks receiving first (so that every
 *                         send meets a receive on a backend that runs a
 *                         group's operations in turn), the receive waited
 *                         or polled to its end;
 *                         every element checked; prints "rank R: ring ok N"
 *   staged ROUNDS         the same through the group's host staging, with
 *                         the buffers declared CUDA memory of a stand-in
 *                         device (copies by memcpy), so the backend never
 *                         sees them
 *   fault KIND RANK AT    6 rounds of 64 f32; on RANK the AT'th send is
 *                         changed: count (32), tag (AT + 1), dtype (i32), or
 *                         skip (RANK never sends it, and sleeps)
 *
 * Every rank prints "rank R: ..." lines; on an error it prints "rank R:
 * error: <message>", waits a moment so that the other ranks can report
 * theirs, and takes the job down (fsdp_die), as a program would.
 */
#include "config.h"
#include "tests/debug/probe.h"
#include "comm/debug.h"
#include "comm/mesh.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "rendezvous/dist.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// a stand-in device: "CUDA" memory that is host memory, copied by memcpy

static void *fake_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return calloc(1, bytes ? bytes : 1);
}

static void fake_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static int fake_copy(void *ctx, void *stream, void *dst, const void *src, size_t bytes)
{
    int *copies = ctx;
    (void)stream;
    memcpy(dst, src, bytes);
    (*copies)++;
    return 0;
}

// ----------------------------------------------------------------------------
// ring

/* The value element i of round k from rank src holds (exact in bf16). */
static float ring_value(int src, int k, size_t i)
{
    return (float)((src * 37 + k * 11 + (int)(i % 101)) % 127) - 63.0f;
}

static void ring_fill(void *buf, enum fsdp_dtype dt, size_t n, int src, int k)
{
    for (size_t i = 0; i < n; i++) {
        float v = ring_value(src, k, i);
        if (dt == FSDP_F32) {
            ((float *)buf)[i] = v;
        } else if (dt == FSDP_I32) {
            ((int32_t *)buf)[i] = (int32_t)v;
        } else {
            ((uint16_t *)buf)[i] = fsdp_f32_to_bf16(v);
        }
    }
}

/* The index of the first wrong element, or n. */
static size_t ring_check(const void *buf, enum fsdp_dtype dt, size_t n, int src, int k)
{
    for (size_t i = 0; i < n; i++) {
        float v = ring_value(src, k, i), got;
        if (dt == FSDP_F32) {
            got = ((const float *)buf)[i];
        } else if (dt == FSDP_I32) {
            got = (float)((const int32_t *)buf)[i];
        } else {
            got = fsdp_bf16_to_f32(((const uint16_t *)buf)[i]);
        }
        if (got != v) {
            return i;
        }
    }
    return n;
}

static void probe_ring(struct fsdp_group *g, int rounds, int staged)
{
    static const size_t sizes[] = {0, 1, 7, 4096, 300007};
    static const enum fsdp_dtype dts[] = {FSDP_F32, FSDP_I32, FSDP_BF16};
    int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
    static int copies;
    /* borrowed by the group until it is destroyed (its pool is freed through it) */
    static struct fsdp_stager st = {.mem = FSDP_MEM_CUDA,
                                    .ctx = &copies,
                                    .host_alloc = fake_alloc,
                                    .host_free = fake_free,
                                    .to_host = fake_copy,
                                    .to_device = fake_copy};
    struct fsdp_coll_attr cuda = {.mem = FSDP_MEM_CUDA, .stream = NULL};
    if (staged && fsdp_group_set_stager(g, &st) != 1) {
        fsdp_err(FSDP_ERR_INTERNAL, "the group does not stage CUDA memory");
        probe_fail(FSDP_ERR_INTERNAL);
    }
    size_t max = 300007 * 4;
    char *out = malloc(max), *in = malloc(max);
    for (int k = 0; k < rounds; k++) {
        size_t n = sizes[k % 5];
        enum fsdp_dtype dt = dts[(k / 5) % 3];
        struct fsdp_work *ws, *wr;
        ring_fill(out, dt, n, g->rank, k);
        memset(in, 0x7f, max);
        const struct fsdp_coll_attr *at = staged ? &cuda : NULL;
        if (g->rank % 2 == 0) { /* every send meets a receive at the head (see group.h) */
            PROBE_CHECK(fsdp_send(g, out, n, dt, next, (uint32_t)k, at, &ws));
            PROBE_CHECK(fsdp_recv(g, in, n, dt, prev, (uint32_t)k, at, &wr));
        } else {
            PROBE_CHECK(fsdp_recv(g, in, n, dt, prev, (uint32_t)k, at, &wr));
            PROBE_CHECK(fsdp_send(g, out, n, dt, next, (uint32_t)k, at, &ws));
        }
        if (k % 2) { /* poll the receive to its end, as a schedule would */
            int done = 0;
            while (!done) {
                PROBE_CHECK(fsdp_work_test(wr, &done));
            }
        } else {
            PROBE_CHECK(fsdp_work_wait(wr, -1));
        }
        PROBE_CHECK(fsdp_work_wait(ws, -1));
        fsdp_work_free(wr);
        fsdp_work_free(ws);
        size_t bad = ring_check(in, dt, n, prev, k);
        if (bad != n) {
            fsdp_err(FSDP_ERR_INTERNAL, "round %d (%zu x %s from rank %d): element %zu wrong", k, n,
                     fsdp_dtype_name(dt), prev, bad);
            probe_fail(FSDP_ERR_INTERNAL);
        }
    }
    printf("rank %d: ring ok %d%s\n", probe_rank, rounds, staged && copies ? " staged" : "");
    free(out);
    free(in);
}

// ----------------------------------------------------------------------------
// faults

static void probe_fault(struct fsdp_group *g, const char *kind, int frank, int at)
{
    int next = (g->rank + 1) % g->size, prev = (g->rank + g->size - 1) % g->size;
    float out[64] = {0}, in[64];
    for (int k = 1; k <= 6; k++) {
        struct fsdp_work *ws = NULL, *wr;
        size_t n = 64;
        enum fsdp_dtype dt = FSDP_F32;
        uint32_t tag = (uint32_t)k;
        int skip = 0;
        if (g->rank == frank && k == at) {
            n = !strcmp(kind, "count") ? 32 : n;
            tag = !strcmp(kind, "tag") ? tag + 1 : tag;
            dt = !strcmp(kind, "dtype") ? FSDP_I32 : dt;
            skip = !strcmp(kind, "skip");
        }
        if (skip) {
            printf("rank %d: skips message %d and sleeps\n", probe_rank, k);
            fflush(stdout);
            sleep(30);
            break;
        }
        if (g->rank % 2 == 0) {
            PROBE_CHECK(fsdp_send(g, out, n, dt, next, tag, NULL, &ws));
            PROBE_CHECK(fsdp_recv(g, in, 64, FSDP_F32, prev, (uint32_t)k, NULL, &wr));
        } else {
            PROBE_CHECK(fsdp_recv(g, in, 64, FSDP_F32, prev, (uint32_t)k, NULL, &wr));
            PROBE_CHECK(fsdp_send(g, out, n, dt, next, tag, NULL, &ws));
        }
        PROBE_CHECK(fsdp_work_wait(wr, -1));
        PROBE_CHECK(fsdp_work_wait(ws, -1));
        fsdp_work_free(wr);
        fsdp_work_free(ws);
    }
    printf("rank %d: 6 messages\n", probe_rank);
}

int main(int argc, char **argv)
{
    const char *mode;
    char **a;
    int na;
    struct fsdp_dist *d;
    struct fsdp_mesh *m;
    probe_start(argc, argv, "p2p_probe", "ring, staged, fault", &mode, &a, &na, &d, &m);
    struct fsdp_group *g0 = m->dims[0].group;
    if (!strcmp(mode, "ring") && na == 1) {
        probe_ring(g0, atoi(a[0]), 0);
    } else if (!strcmp(mode, "staged") && na == 1) {
        probe_ring(g0, atoi(a[0]), 1);
    } else if (!strcmp(mode, "fault") && na == 3) {
        probe_fault(g0, a[0], atoi(a[1]), atoi(a[2]));
    } else {
        fsdp_fatal("p2p_probe: bad mode or arguments: %s", mode);
    }
    fflush(stdout);
    fsdp_mesh_destroy(m);
    fsdp_dist_finalize(d);
    return 0;
}
