/*
 * stage_probe.c - drives staged collectives on the guarded device for
 * tests/debug/test_stage.sh: every collective the group layer stages
 * (all-reduce, all-gather, reduce-scatter, broadcast), in place and out of
 * place, in f32, bf16, f16 and u8, over counts 0, 1, 5, 256, 1000 and 4099,
 * with chunks of 0 (whole buffers), 64, 1000, 1024, 4096 bytes and 1 MiB
 * (so: many chunks, a short last chunk, chunks that are not a whole number
 * of elements, counts under one chunk), each against the same collective
 * run on host memory unstaged: the device's bytes after the collective
 * (the receive side, the send side, and guard bytes around them) must be
 * the host run's, bit for bit.
 *
 *   stage_probe --init mpi --mesh dp=3 --backend tcp run [nostream]
 *   stage_probe --init mpi --mesh dp=2 --backend tcp time MIB ITERS [memcpy]
 *   stage_probe --init mpi --mesh dp=2 --backend tcp flight
 *
 * The work handles are completed four ways in turn (a wait; a test loop,
 * whose done is checked against the device at once; progress and
 * fsdp_work_done, then a wait; two copies in flight, waited for in reverse
 * order). A second pass at one chunk size must allocate no host memory and
 * make no stream. nostream: the stager has no streams (chunks copied on
 * the collective's stream). Prints "rank R: staged ok N collectives, 0 host
 * allocations in the second pass"; on an error "rank R: error: <message>".
 * time (by hand, doc/performance.md): the median of ITERS (at most 64)
 * all-gathers and reduce-scatters of MIB per rank's block (f32) on host
 * memory, then staged whole and in chunks of 16 MiB down to 256 KiB;
 * memcpy: staged from host memory posing as a GPU's through a stager of
 * plain memcpy copies, without the guarded device's cost per op. flight:
 * one all-gather of 1001 f32 in chunks of 1000 bytes, for the flight
 * recorder (FSDPC_FLIGHT_DUMP_AT_EXIT).
 */
#include "config.h"
#include "tests/debug/probe.h"
#include "comm/flight.h"
#include "compute/device.h"
#include "core/dtype.h"
#include "core/util.h"
#include "train/stage.h"

#include <stdint.h>
#include <stdlib.h>

#define PAD 64 /* guard bytes each side of a collective's buffers */

// ----------------------------------------------------------------------------
// a stager that counts what it makes

static struct fsdp_stager probe_real;
static long probe_allocs, probe_streams;

static void *count_alloc(void *ctx, size_t bytes)
{
    probe_allocs++;
    return probe_real.host_alloc(ctx, bytes);
}

static int count_stream(void *ctx, void **stream)
{
    probe_streams++;
    return probe_real.stream_create(ctx, stream);
}

// ----------------------------------------------------------------------------
// one case

struct probe_case {
    enum fsdp_coll_op op;
    enum fsdp_dtype dt;
    size_t count;
    int in_place;
    int redop;
    int root;
};

/* The buffers of c in a region: send and recv offsets, recv's bytes, the
 * region's bytes (guards included). */
static void case_layout(const struct probe_case *c, int rank, int size, size_t *so, size_t *ro,
                        size_t *rb, size_t *total)
{
    size_t b = c->count * fsdp_dtype_size(c->dt), all = b * (size_t)size;
    size_t sb = c->op == FSDP_COLL_REDUCE_SCATTER ? all : b;
    *rb = c->op == FSDP_COLL_ALLGATHER ? all : b;
    *so = *ro = PAD;
    if (c->op == FSDP_COLL_BROADCAST || (c->in_place && c->op == FSDP_COLL_ALLREDUCE)) {
        *total = 2 * PAD + b;
    } else if (c->in_place && c->op == FSDP_COLL_ALLGATHER) {
        *so = PAD + (size_t)rank * b;
        *total = 2 * PAD + all;
    } else if (c->in_place) { /* reduce-scatter */
        *ro = PAD + (size_t)rank * b;
        *total = 2 * PAD + all;
    } else {
        *ro = PAD + sb;
        *total = 2 * PAD + sb + *rb;
    }
}

/* The region before the collective: guards, rank's input, junk to receive
 * into. Reductions get small integers (exact in every dtype, whatever the
 * order of the sum); moves get arbitrary values. */
static void case_image(const struct probe_case *c, int rank, int size, unsigned char *img,
                       size_t total, size_t so, size_t ro, size_t rb)
{
    size_t es = fsdp_dtype_size(c->dt);
    size_t sn = c->count * (c->op == FSDP_COLL_REDUCE_SCATTER ? (size_t)size : 1);
    uint32_t x = 2654435761u * (uint32_t)(rank + 1) + (uint32_t)c->count * 97u + (uint32_t)c->op;
    memset(img, 0xa5, total);
    memset(img + ro, 0x5a, rb);
    for (size_t i = 0; i < sn; i++) {
        x = x * 1664525u + 1013904223u;
        double v = (double)((x >> 16) % 17) - 8.0;
        if (c->op == FSDP_COLL_ALLGATHER || c->op == FSDP_COLL_BROADCAST) {
            v = c->dt == FSDP_U8 ? (double)(x >> 24) : ((double)(x >> 8) - 8388608.0) / 4099.0;
        }
        if (c->dt == FSDP_U8 && v < 0) {
            v = -v;
        }
        fsdp_dtype_set(img + so + i * es, c->dt, 0, v);
    }
}

/* Issues c on the region at base. */
static int case_issue(struct fsdp_group *g, const struct probe_case *c, unsigned char *base,
                      size_t so, size_t ro, const struct fsdp_coll_attr *at, struct fsdp_work **w)
{
    switch (c->op) {
    case FSDP_COLL_ALLGATHER:
        return fsdp_allgather(g, base + so, base + ro, c->count, c->dt, at, w);
    case FSDP_COLL_REDUCE_SCATTER:
        return fsdp_reduce_scatter(g, base + so, base + ro, c->count, c->dt,
                                   (enum fsdp_redop)c->redop, at, w);
    case FSDP_COLL_BROADCAST:
        return fsdp_broadcast(g, base + ro, c->count, c->dt, c->root, at, w);
    default:
        return fsdp_allreduce(g, base + so, base + ro, c->count, c->dt, (enum fsdp_redop)c->redop,
                              at, w);
    }
}

/* Completes w the way number k says; the test loop's done is the moment
 * the data must be on the device. */
static void case_complete(struct fsdp_group *g, struct fsdp_work *w, int k)
{
    int done = 0;
    if (k == 1) {
        while (!done) {
            PROBE_CHECK(fsdp_work_test(w, &done));
        }
        return;
    }
    if (k == 2) {
        while (!fsdp_work_done(w)) {
            fsdp_group_progress(g);
        }
    }
    PROBE_CHECK(fsdp_work_wait(w, -1));
}

static void case_name(const struct probe_case *c, size_t chunk, char *buf, size_t len)
{
    snprintf(buf, len, "%s(%s, %zu%s%s) in chunks of %zu bytes", fsdp_coll_op_name(c->op),
             fsdp_dtype_name(c->dt), c->count, c->in_place ? ", in place" : "",
             c->redop >= 0 ? (c->redop == FSDP_MAX ? ", max" : ", sum") : "", chunk);
}

/* Runs c staged on dev (completion k) against c on the host. */
static void probe_case(struct fsdp_group *g, struct fsdp_device *dev, const struct probe_case *c,
                       size_t chunk, int k)
{
    size_t so, ro, rb, total;
    case_layout(c, g->rank, g->size, &so, &ro, &rb, &total);
    unsigned char *img = malloc(total), *want = malloc(total), *got = malloc(total);
    case_image(c, g->rank, g->size, img, total, so, ro, rb);
    memcpy(want, img, total);
    struct fsdp_work *w, *w2 = NULL;
    PROBE_CHECK(case_issue(g, c, want, so, ro, NULL, &w));
    PROBE_CHECK(fsdp_work_wait(w, -1));
    fsdp_work_free(w);
    if (c->op == FSDP_COLL_REDUCE_SCATTER && c->in_place) { /* only recv is the result */
        memcpy(got, want + ro, rb);
        memcpy(want, img, total);
        memcpy(want + ro, got, rb);
    }
    struct fsdp_coll_attr at = {.mem = dev->mem, .stream = dev->stream};
    void *base, *base2 = NULL;
    PROBE_CHECK(fsdp_device_alloc(dev, total, "probe region", &base));
    PROBE_CHECK(fsdp_device_write(dev, base, img, total));
    if (k == 3) {
        PROBE_CHECK(fsdp_device_alloc(dev, total, "probe region 2", &base2));
        PROBE_CHECK(fsdp_device_write(dev, base2, img, total));
    }
    PROBE_CHECK(case_issue(g, c, base, so, ro, &at, &w));
    if (base2) {
        PROBE_CHECK(case_issue(g, c, base2, so, ro, &at, &w2));
        case_complete(g, w2, 0);
    }
    case_complete(g, w, k);
    for (int pass = 0; pass < (base2 ? 2 : 1); pass++) {
        PROBE_CHECK(fsdp_device_read(dev, got, pass ? base2 : base, total));
        size_t bad = 0;
        while (bad < total && got[bad] == want[bad]) {
            bad++;
        }
        if (bad < total) {
            char name[160];
            case_name(c, chunk, name, sizeof(name));
            fsdp_err(FSDP_ERR_INTERNAL,
                     "%s%s: byte %zu of %zu is %#x, the host run's %#x (recv at %zu, %zu bytes)",
                     name, pass ? " (second in flight)" : "", bad, total, got[bad], want[bad], ro,
                     rb);
            probe_fail(FSDP_ERR_INTERNAL);
        }
    }
    fsdp_work_free(w);
    fsdp_work_free(w2);
    dev->ops->free(dev, base);
    if (base2) {
        dev->ops->free(dev, base2);
    }
    free(img);
    free(want);
    free(got);
}

/* Every case at one chunk size; returns how many. */
static long probe_pass(struct fsdp_group *g, struct fsdp_device *dev, size_t chunk)
{
    static const enum fsdp_coll_op ops[] = {FSDP_COLL_ALLREDUCE, FSDP_COLL_ALLGATHER,
                                            FSDP_COLL_REDUCE_SCATTER, FSDP_COLL_BROADCAST};
    static const enum fsdp_dtype dts[] = {FSDP_F32, FSDP_BF16, FSDP_F16, FSDP_U8};
    static const size_t counts[] = {0, 1, 5, 256, 1000, 4099};
    long n = 0;
    fsdp_group_set_stage_chunk(g, chunk);
    for (int o = 0; o < 4; o++) {
        for (int d = 0; d < 4; d++) {
            for (int ci = 0; ci < 6; ci++) {
                for (int ip = 0; ip < 2; ip++) {
                    struct probe_case c = {ops[o], dts[d], counts[ci], ip, -1, 0};
                    if (c.op == FSDP_COLL_BROADCAST && !ip) {
                        continue;
                    }
                    if (c.op == FSDP_COLL_ALLREDUCE || c.op == FSDP_COLL_REDUCE_SCATTER) {
                        c.redop = ci % 2 && c.dt == FSDP_F32 ? FSDP_MAX : FSDP_SUM;
                    }
                    c.root = (int)(counts[ci] % (size_t)g->size);
                    probe_case(g, dev, &c, chunk, (int)(n % 4));
                    n++;
                }
            }
        }
    }
    return n;
}

// ----------------------------------------------------------------------------
// time: staged all-gather and reduce-scatter against the same on the host

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median ms of iters runs of op (f32, count per rank) on send/recv with at
 * (NULL: host memory), after 2 warm-ups; every rank starts together. */
static double time_op(struct fsdp_group *g, enum fsdp_coll_op op, void *send, void *recv,
                      size_t count, const struct fsdp_coll_attr *at, int iters)
{
    double t[64];
    iters = iters < 1 ? 1 : iters > 64 ? 64 : iters;
    struct probe_case c = {op, FSDP_F32, count, 0, FSDP_SUM, 0};
    for (int i = -2; i < iters; i++) {
        struct fsdp_work *w;
        PROBE_CHECK(fsdp_barrier_sync(g));
        double t0 = fsdp_now();
        PROBE_CHECK(case_issue(g, &c, send, 0,
                               (size_t)((unsigned char *)recv - (unsigned char *)send), at, &w));
        PROBE_CHECK(fsdp_work_wait(w, -1));
        fsdp_work_free(w);
        if (i >= 0) {
            t[i] = (fsdp_now() - t0) * 1e3;
        }
    }
    qsort(t, (size_t)iters, sizeof(double), dbl_cmp);
    return t[iters / 2];
}

/* memcpy: "CUDA" memory that is host memory, copied by memcpy (a stager
 * without streams), to time the staging itself without the guarded
 * device's cost per op. */
static void *plain_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return calloc(1, bytes ? bytes : 1);
}

static void plain_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

static int plain_copy(void *ctx, void *stream, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    (void)stream;
    memcpy(dst, src, bytes);
    return 0;
}

/* MiB per rank's block, iters: a table of median ms. */
static void probe_time(struct fsdp_group *g, struct fsdp_device *dev, size_t mib, int iters,
                       int plain)
{
    static const size_t chunks[] = {0, (size_t)16 << 20, (size_t)4 << 20, (size_t)1 << 20,
                                    (size_t)256 << 10};
    static const enum fsdp_coll_op ops[] = {FSDP_COLL_ALLGATHER, FSDP_COLL_REDUCE_SCATTER};
    size_t count = (mib << 20) / 4, all = (mib << 20) * (size_t)g->size;
    struct fsdp_coll_attr at = {.mem = plain ? FSDP_MEM_CUDA : dev->mem, .stream = dev->stream};
    static const struct fsdp_stager ps = {.mem = FSDP_MEM_CUDA,
                                          .host_alloc = plain_alloc,
                                          .host_free = plain_free,
                                          .to_host = plain_copy,
                                          .to_device = plain_copy};
    unsigned char *h = fsdp_alloc(2 * all);
    void *d = NULL;
    memset(h, 0, 2 * all);
    if (plain) {
        PROBE_CHECK(fsdp_group_set_stager(g, &ps));
        d = fsdp_alloc(2 * all);
        memset(d, 0, 2 * all);
    } else {
        PROBE_CHECK(fsdp_device_alloc(dev, 2 * all, "probe timing", &d));
    }
    for (int o = 0; o < 2; o++) {
        double host = time_op(g, ops[o], h, h + all, count, NULL, iters);
        if (g->rank == 0) {
            printf("%s %zu MiB per rank, %d ranks: host %.2f ms", fsdp_coll_op_name(ops[o]), mib,
                   g->size, host);
        }
        for (int k = 0; k < 5; k++) {
            fsdp_group_set_stage_chunk(g, chunks[k]);
            double ms = time_op(g, ops[o], d, (unsigned char *)d + all, count, &at, iters);
            if (g->rank == 0) {
                printf(" | chunk %zu KiB %.2f ms", chunks[k] >> 10, ms);
            }
        }
        if (g->rank == 0) {
            printf("\n");
        }
    }
    if (plain) {
        fsdp_free(d);
    } else {
        dev->ops->free(dev, d);
    }
    fsdp_free(h);
}

/* flight: one staged all-gather of 1001 f32 in chunks of 1000 bytes (250
 * elements: four whole chunks and one of 1), for the flight recorder's
 * dump at exit. */
static void probe_flight(struct fsdp_group *g, struct fsdp_device *dev)
{
    size_t count = 1001, all = count * 4 * (size_t)g->size;
    struct fsdp_coll_attr at = {.mem = dev->mem, .stream = dev->stream};
    struct fsdp_work *w;
    void *d;
    fsdp_group_set_stage_chunk(g, 1000);
    PROBE_CHECK(fsdp_device_alloc(dev, count * 4 + all, "probe flight", &d));
    PROBE_CHECK(fsdp_allgather(g, d, (unsigned char *)d + count * 4, count, FSDP_F32, &at, &w));
    PROBE_CHECK(fsdp_work_wait(w, -1));
    fsdp_work_free(w);
    dev->ops->free(dev, d);
    printf("rank %d: flight all_gather(f32, %zu) staged\n", probe_rank, count);
}

int main(int argc, char **argv)
{
    const char *mode;
    char **a;
    int na;
    struct fsdp_dist *d;
    struct fsdp_mesh *m;
    struct fsdp_device *dev;
    probe_start(argc, argv, "stage_probe", "run [nostream]", &mode, &a, &na, &d, &m);
    struct fsdp_group *g = m->dims[0].group;
    int timing = !strcmp(mode, "time") && (na == 2 || (na == 3 && !strcmp(a[2], "memcpy")));
    int flight = !strcmp(mode, "flight") && na == 0;
    if (!timing && !flight &&
        (strcmp(mode, "run") || na > 1 || (na == 1 && strcmp(a[0], "nostream")))) {
        fsdp_fatal("stage_probe: bad mode or arguments: %s", mode);
    }
    PROBE_CHECK(fsdp_device_create("guarded", 0, &dev));
    /* borrowed by the group until it is destroyed (its pool is freed through it) */
    static struct fsdp_stager st;
    fsdp_stage_stager(dev, &probe_real);
    st = probe_real;
    st.host_alloc = count_alloc;
    st.stream_create = na == 1 && !timing ? NULL : count_stream;
    int rc = fsdp_group_set_stager(g, &st);
    PROBE_CHECK(rc);
    if (rc != 1) {
        fsdp_err(FSDP_ERR_INTERNAL, "the group does not stage the guarded device's memory");
        probe_fail(FSDP_ERR_INTERNAL);
    }
    if (timing || flight) {
        if (flight) {
            probe_flight(g, dev);
        } else {
            probe_time(g, dev, (size_t)atol(a[0]), atoi(a[1]), na == 3);
        }
        fflush(stdout);
        fsdp_mesh_destroy(m);
        fsdp_device_destroy(dev);
        fsdp_dist_finalize(d);
        return 0;
    }
    static const size_t chunks[] = {0, 64, 1000, 1024, 4096, (size_t)1 << 20};
    long n = 0;
    for (int i = 0; i < 6; i++) {
        n += probe_pass(g, dev, chunks[i]);
    }
    long allocs = probe_allocs, streams = probe_streams;
    n += probe_pass(g, dev, 1000);
    if (probe_allocs != allocs || probe_streams != streams || streams != (na == 1 ? 0 : 1)) {
        fsdp_err(FSDP_ERR_INTERNAL,
                 "the second pass made %ld host allocations and %ld streams (%ld streams in all)",
                 probe_allocs - allocs, probe_streams - streams, probe_streams);
        probe_fail(FSDP_ERR_INTERNAL);
    }
    printf("rank %d: staged ok %ld collectives, 0 host allocations in the second pass\n",
           probe_rank, n);
    fflush(stdout);
    fsdp_mesh_destroy(m);
    fsdp_device_destroy(dev);
    fsdp_dist_finalize(d);
    return 0;
}
