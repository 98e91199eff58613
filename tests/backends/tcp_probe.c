/*
 * tcp_probe.c - one rank of a tcp backend fault test. Joins the job through
 * fsdp_dist_init (env:// as test_tcp_faults.sh launches it), creates the tcp
 * backend for the whole world directly, and runs a loop of allreduces whose
 * results it checks. Any failure ends the rank through fsdp_die, which
 * prints one line naming the cause and exits non-zero.
 *
 *   tcp_probe [--count N] [--iters K] [--timeout S] [--ready PATH]
 *             [--delay S] [--addr-file PATH]
 *   --iters 0      loop until the job is killed or fails
 *   --ready PATH   PATH.<rank> is created once the first allreduce completed
 *   --delay S      sleep before creating the backend (rank 0 only)
 *   --addr-file P  (rank 1) write rank 1's tcp listening address to P as
 *                  soon as it is published, for a foreign client to knock on
 */
#include "config.h"
#include "backends/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "dist/dist.h"
#include "dist/store.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct fsdp_backend_ops *ops = &fsdp_tcp_ops;

struct probe_opts {
    size_t count;
    long iters;
    double timeout_s;
    const char *ready;
    double delay_s;
    const char *addr_file;
};

static void probe_usage(void)
{
    fprintf(stderr, "usage: tcp_probe [--count N] [--iters K] [--timeout S] [--ready PATH] "
                    "[--delay S] [--addr-file PATH]\n");
    exit(2);
}

static void probe_parse(int argc, char **argv, struct probe_opts *o)
{
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        double x;
        if (!v) {
            probe_usage();
        }
        if (strcmp(a, "--count") == 0 && fsdp_parse_long(v, &n) == 0 && n >= 0) {
            o->count = (size_t)n;
        } else if (strcmp(a, "--iters") == 0 && fsdp_parse_long(v, &n) == 0 && n >= 0) {
            o->iters = (long)n;
        } else if (strcmp(a, "--timeout") == 0 && fsdp_parse_double(v, &x) == 0 && x > 0) {
            o->timeout_s = x;
        } else if (strcmp(a, "--delay") == 0 && fsdp_parse_double(v, &x) == 0 && x >= 0) {
            o->delay_s = x;
        } else if (strcmp(a, "--ready") == 0) {
            o->ready = v;
        } else if (strcmp(a, "--addr-file") == 0) {
            o->addr_file = v;
        } else {
            probe_usage();
        }
    }
}

struct addr_job {
    struct fsdp_store *store;
    const char *path;
    double timeout_s;
};

/* Publishes rank 1's listening address (the backend's first-generation key
 * in the group's store) to a file, atomically. */
static void *probe_addr_writer(void *p)
{
    struct addr_job *aj = p;
    void *val;
    size_t len;
    char tmp[1024];
    int exists = 0;
    double t0 = fsdp_now();
    /* poll: a blocking get would hold the store client that the backend's
     * own rendezvous needs (a client serializes its requests) */
    while (!exists && fsdp_now() - t0 < aj->timeout_s) {
        if (fsdp_store_check(aj->store, "tcp/0/addr/1", &exists) < 0) {
            return NULL;
        }
        if (!exists) {
            usleep(20000);
        }
    }
    if (!exists || fsdp_store_get(aj->store, "tcp/0/addr/1", &val, &len, 1.0) < 0) {
        return NULL;
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", aj->path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%.*s\n", (int)len, (char *)val);
        fclose(f);
        rename(tmp, aj->path);
    }
    free(val);
    return NULL;
}

static void probe_abort_cb(void *arg, const char *why)
{
    ops->abort(arg, why);
}

static void probe_loop(struct fsdp_backend *be, const struct probe_opts *o, int rank, int n)
{
    float *v = fsdp_alloc(o->count * sizeof(float) + 64);
    if (!v) {
        fsdp_fatal("rank %d: cannot allocate %zu floats", rank, o->count);
    }
    for (long it = 1; o->iters == 0 || it <= o->iters; it++) {
        struct fsdp_work *w;
        for (size_t i = 0; i < o->count; i++) {
            v[i] = (float)((rank + 1) * (int)(i % 7));
        }
        int rc = ops->allreduce(be, v, v, o->count, FSDP_F32, FSDP_SUM, NULL, &w);
        if (rc == 0) {
            rc = ops->work_wait(w, -1.0);
            ops->work_free(w);
        }
        if (rc < 0) {
            fsdp_die(rc, "allreduce failed", NULL);
        }
        float k = (float)(n * (n + 1) / 2);
        for (size_t i = 0; i < o->count; i++) {
            if (v[i] != k * (float)(i % 7)) {
                fsdp_fatal("rank %d: iteration %ld: element %zu is %g, expected %g", rank, it,
                           i, v[i], k * (float)(i % 7));
            }
        }
        if (it == 1 && o->ready) {
            char path[1024];
            snprintf(path, sizeof(path), "%s.%d", o->ready, rank);
            FILE *f = fopen(path, "w");
            if (f) {
                fclose(f);
            }
        }
    }
    printf("rank %d: %ld allreduces of %zu floats correct\n", rank, o->iters, o->count);
    fsdp_free(v);
}

int main(int argc, char **argv)
{
    struct probe_opts o = {.count = 1 << 20, .iters = 10, .timeout_s = 5.0};
    struct fsdp_dist *d;
    struct fsdp_store *gs;
    struct fsdp_backend *be;
    pthread_t writer;
    int have_writer = 0;
    probe_parse(argc, argv, &o);
    if (fsdp_dist_init(&argc, &argv, "env://", o.timeout_s, &d) < 0) {
        fsdp_die(FSDP_ERR_INVALID, "dist init failed", NULL);
    }
    if (fsdp_store_prefix(d->store, "world", &gs) < 0) {
        fsdp_die(FSDP_ERR_NOMEM, "store prefix", NULL);
    }
    int *world = calloc((size_t)d->world_size, sizeof(int));
    for (int q = 0; q < d->world_size; q++) {
        world[q] = q;
    }
    struct addr_job aj = {.store = gs, .path = o.addr_file, .timeout_s = o.timeout_s};
    if (o.addr_file && d->rank == 1) {
        have_writer = pthread_create(&writer, NULL, probe_addr_writer, &aj) == 0;
    }
    if (d->rank == 0 && o.delay_s > 0) {
        usleep((useconds_t)(o.delay_s * 1e6));
    }
    struct fsdp_group_info info = {
        .name = "world", .rank = d->rank, .size = d->world_size, .world_ranks = world,
        .world_rank = d->rank, .nonce = d->nonce, .timeout_s = d->timeout_s, .store = gs,
    };
    if (ops->create(&info, &be) < 0) {
        fsdp_die(FSDP_ERR_PEER, "tcp backend create failed", NULL);
    }
    fsdp_dist_on_abort(d, probe_abort_cb, be);
    if (have_writer) {
        pthread_join(writer, NULL);
    }
    probe_loop(be, &o, d->rank, d->world_size);
    fsdp_dist_off_abort(d, be);
    ops->destroy(be);
    fsdp_store_destroy(gs);
    free(world);
    fsdp_dist_finalize(d);
    return 0;
}
