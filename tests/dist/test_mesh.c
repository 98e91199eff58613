/*
 * test_mesh.c - a device mesh across ranks: layout, group names and members,
 * the backend of every dimension, collectives on every dimension, several
 * operations outstanding on all dimensions at once, and the agreement check.
 *
 *   mpiexec -n 4 test_mesh --mesh dp=2,tp=2 --backend dp=tcp,tp=mpi
 *
 * TEST_MESH_ALT_RANK=R with TEST_MESH_ALT_MESH and/or TEST_MESH_ALT_BACKEND
 * gives rank R other specs. When fsdp_mesh_create fails, every rank prints
 * "rank R: mesh: <message>", finalizes and exits 1 (the script checks that
 * all ranks did, naming the disagreeing rank). Otherwise rank 0 prints TAP,
 * merging the failures of every rank through the store.
 */
#include "config.h"
#include "core/error.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "comm/mesh.h"
#include "rendezvous/store.h"
#include "tests/tap.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHECKS 64
#define ASYNC_PER_DIM 4
#define ASYNC_COUNT 100003

struct check {
    char desc[96];
    int fails;
    char diag[300];
};

static struct check checks[MAX_CHECKS];
static int nchecks;
static int my_rank;

static void expect(const char *desc, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void expect(const char *desc, int ok, const char *fmt, ...)
{
    struct check *c = NULL;
    for (int i = 0; i < nchecks; i++) {
        if (strcmp(checks[i].desc, desc) == 0) {
            c = &checks[i];
        }
    }
    if (!c) {
        if (nchecks == MAX_CHECKS) {
            fsdp_fatal("test_mesh: too many checks");
        }
        c = &checks[nchecks++];
        snprintf(c->desc, sizeof(c->desc), "%s", desc);
    }
    if (!ok && c->fails++ == 0) {
        int k = snprintf(c->diag, sizeof(c->diag), "rank %d: ", my_rank);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->diag + k, sizeof(c->diag) - (size_t)k, fmt, ap);
        va_end(ap);
    }
}

/* A call that must succeed; its error becomes the check's detail. */
static int call_ok(const char *desc, int rc, const char *what)
{
    expect(desc, rc == 0, "%s: %s", what, rc ? fsdp_err_msg() : "");
    fsdp_err_clear();
    return rc == 0;
}

// ----------------------------------------------------------------------------
// the layout, recomputed independently: coordinates by repeated division

static void coords_of(const struct fsdp_mesh *m, int rank, int *coord)
{
    for (int i = m->ndims - 1; i >= 0; i--) {
        coord[i] = rank % m->dims[i].size;
        rank /= m->dims[i].size;
    }
}

/* Members of rank's slice along dim, and the slice's index: slices ordered
 * by their smallest member. */
static int expected_slice(const struct fsdp_mesh *m, int world, int rank, int dim, int *members)
{
    int mine[FSDP_MESH_MAX_DIMS], other[FSDP_MESH_MAX_DIMS], n = 0, index = 0;
    coords_of(m, rank, mine);
    for (int q = 0; q < world; q++) {
        coords_of(m, q, other);
        int same = 1, is_first = other[dim] == 0;
        for (int i = 0; i < m->ndims; i++) {
            same &= i == dim || other[i] == mine[i];
        }
        if (same) {
            members[n++] = q;
        } else if (is_first && n == 0) {
            index++; /* a slice that starts before ours */
        }
    }
    return index;
}

static void check_layout(struct fsdp_mesh *m, struct fsdp_dist *d, const char *backend_spec)
{
    int coord[FSDP_MESH_MAX_DIMS], members[1024];
    coords_of(m, d->rank, coord);
    for (int i = 0; i < m->ndims; i++) {
        struct fsdp_mesh_dim *dim = &m->dims[i];
        struct fsdp_group *g = dim->group;
        int slice = expected_slice(m, d->world_size, d->rank, i, members);
        char name[64];
        snprintf(name, sizeof(name), "%s[%d]", dim->name, slice);
        expect("layout: coordinates, group names and members", dim->coord == coord[i],
               "dim %s: coord %d, want %d", dim->name, dim->coord, coord[i]);
        expect("layout: coordinates, group names and members", g && strcmp(g->name, name) == 0,
               "dim %s: group '%s', want '%s'", dim->name, g ? g->name : "(none)", name);
        if (!g) {
            continue;
        }
        int same = g->size == dim->size && g->rank == coord[i];
        for (int j = 0; same && j < g->size; j++) {
            same = g->world_ranks[j] == members[j];
        }
        expect("layout: coordinates, group names and members", same,
               "group %s: size %d rank %d, members differ from the row-major layout", g->name,
               g->size, g->rank);
        expect("fsdp_mesh_group and fsdp_mesh_dim_index find every dimension",
               fsdp_mesh_group(m, dim->name) == g && fsdp_mesh_dim_index(m, dim->name) == i,
               "dim %s", dim->name);
        /* the backend named for the dim, else the default (a bare name) */
        char want[32] = "";
        const char *p = backend_spec;
        while (p && *p) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            const char *eq = memchr(p, '=', len);
            if (!eq && !want[0]) {
                snprintf(want, sizeof(want), "%.*s", (int)len, p);
            } else if (eq && (size_t)(eq - p) == strlen(dim->name) &&
                       strncmp(p, dim->name, strlen(dim->name)) == 0) {
                snprintf(want, sizeof(want), "%.*s", (int)(len - (size_t)(eq - p) - 1), eq + 1);
                break;
            }
            p = e ? e + 1 : NULL;
        }
        if (want[0]) {
            expect("every dimension runs the backend it was given",
                   strcmp(g->ops->name, want) == 0, "dim %s: backend %s, want %s", dim->name,
                   g->ops->name, want);
        }
    }
    expect("fsdp_mesh_group and fsdp_mesh_dim_index find every dimension",
           !fsdp_mesh_group(m, "nosuchdim") && fsdp_mesh_dim_index(m, "nosuchdim") == -1,
           "an unknown dimension was found");
}

// ----------------------------------------------------------------------------
// collectives per dimension

static void check_collectives(struct fsdp_mesh *m, int rank)
{
    for (int i = 0; i < m->ndims; i++) {
        struct fsdp_group *g = m->dims[i].group;
        int n = g->size;
        char desc[96];
        snprintf(desc, sizeof(desc), "collectives on dim %s (%s)", m->dims[i].name, g->ops->name);

        /* allreduce: sum of the members' world ranks */
        int64_t v = rank, sum = 0;
        for (int j = 0; j < n; j++) {
            sum += g->world_ranks[j];
        }
        if (call_ok(desc, fsdp_allreduce_sync(g, &v, &v, 1, FSDP_I64, FSDP_SUM), "allreduce")) {
            expect(desc, v == sum, "allreduce on %s: %lld, want %lld", g->name, (long long)v,
                   (long long)sum);
        }
        /* allgather: the member list */
        int32_t mine = rank, all[1024];
        if (call_ok(desc, fsdp_allgather_sync(g, &mine, all, 1, FSDP_I32), "allgather")) {
            for (int j = 0; j < n; j++) {
                expect(desc, all[j] == g->world_ranks[j], "allgather on %s: [%d] = %d, want %d",
                       g->name, j, all[j], g->world_ranks[j]);
            }
        }
        /* reduce_scatter: block j of every member holds 100*j + member's rank */
        float in[1024], out = -1;
        for (int j = 0; j < n; j++) {
            in[j] = (float)(100 * j + g->rank);
        }
        if (call_ok(desc, fsdp_reduce_scatter_sync(g, in, &out, 1, FSDP_F32, FSDP_SUM),
                    "reduce_scatter")) {
            float want = (float)(100 * g->rank * n + n * (n - 1) / 2);
            expect(desc, out == want, "reduce_scatter on %s: %g, want %g", g->name, out, want);
        }
        /* broadcast from every root */
        for (int root = 0; root < n; root++) {
            int32_t b = g->rank == root ? 1000 + root : -1;
            if (call_ok(desc, fsdp_broadcast_sync(g, &b, 1, FSDP_I32, root), "broadcast")) {
                expect(desc, b == 1000 + root, "broadcast on %s from %d: %d", g->name, root, b);
            }
        }
        call_ok(desc, fsdp_barrier_sync(g), "barrier");
    }
}

/* One operation of the async check: which collective, on which dim. */
enum { A_ALLREDUCE, A_ALLGATHER, A_REDUCE_SCATTER, A_BROADCAST };
static const char *const async_names[] = {"allreduce", "allgather", "reduce_scatter", "broadcast"};

static void async_issue(const char *desc, struct fsdp_group *g, int kind, int root, float *send,
                        float *recv, struct fsdp_work **w)
{
    size_t C = ASYNC_COUNT;
    int wr = g->world_ranks[g->rank], rc = 0;
    for (size_t e = 0; e < C * (size_t)g->size; e++) {
        send[e] = kind == A_REDUCE_SCATTER ? (float)((int)(e / C) * 10 + wr + (int)(e % C % 5))
                                           : (float)(wr * 1000 + (int)(e % C % 7));
        recv[e] = -1;
    }
    switch (kind) {
    case A_ALLREDUCE:
        memcpy(recv, send, C * sizeof(float));
        rc = fsdp_allreduce(g, recv, recv, C, FSDP_F32, FSDP_SUM, NULL, w);
        break;
    case A_ALLGATHER: rc = fsdp_allgather(g, send, recv, C, FSDP_F32, NULL, w); break;
    case A_REDUCE_SCATTER:
        rc = fsdp_reduce_scatter(g, send, recv, C, FSDP_F32, FSDP_SUM, NULL, w);
        break;
    default:
        if (g->rank == root) {
            memcpy(recv, send, C * sizeof(float));
        }
        rc = fsdp_broadcast(g, recv, C, FSDP_F32, root, NULL, w);
        break;
    }
    call_ok(desc, rc, async_names[kind]);
}

static void async_check(const char *desc, struct fsdp_group *g, int kind, int root,
                        const float *recv)
{
    size_t C = ASYNC_COUNT, n = kind == A_ALLGATHER ? C * (size_t)g->size : C, bad = 0, first = 0;
    double sum_ranks = 0;
    for (int j = 0; j < g->size; j++) {
        sum_ranks += g->world_ranks[j];
    }
    for (size_t e = 0; e < n; e++) {
        double want;
        switch (kind) {
        case A_ALLREDUCE: want = 1000 * sum_ranks + g->size * (double)(e % 7); break;
        case A_ALLGATHER: want = g->world_ranks[e / C] * 1000 + (double)(e % C % 7); break;
        case A_REDUCE_SCATTER:
            want = g->size * 10.0 * g->rank + sum_ranks + g->size * (double)(e % 5);
            break;
        default: want = g->world_ranks[root] * 1000 + (double)(e % 7); break;
        }
        if (recv[e] != (float)want && bad++ == 0) {
            first = e;
        }
    }
    expect(desc, bad == 0, "%s on %s: %zu of %zu wrong, first at %zu: %g", async_names[kind],
           g->name, bad, n, first, bad ? recv[first] : 0.0);
}

/* On every dimension at once, ASYNC_PER_DIM different collectives are
 * issued (interleaved across dimensions) before any is waited for; they are
 * then waited for in reverse order. */
static void check_async(struct fsdp_mesh *m)
{
    const char *desc = "outstanding allreduce, allgather, reduce_scatter and broadcast on every "
                       "dimension at once";
    int nd = m->ndims, nops = nd * ASYNC_PER_DIM, maxsize = 1;
    for (int i = 0; i < nd; i++) {
        maxsize = m->dims[i].size > maxsize ? m->dims[i].size : maxsize;
    }
    size_t per = (size_t)maxsize * ASYNC_COUNT;
    float *bufs = fsdp_alloc(2 * (size_t)nops * per * sizeof(float));
    struct fsdp_work *work[FSDP_MESH_MAX_DIMS * ASYNC_PER_DIM] = {NULL};
    for (int k = 0; k < ASYNC_PER_DIM; k++) {
        for (int i = 0; i < nd; i++) {
            int op = k * nd + i;
            struct fsdp_group *g = m->dims[i].group;
            async_issue(desc, g, k, (k + i) % g->size, bufs + 2 * (size_t)op * per,
                        bufs + (2 * (size_t)op + 1) * per, &work[op]);
        }
    }
    for (int op = nops - 1; op >= 0; op--) {
        if (work[op]) {
            call_ok(desc, fsdp_work_wait(work[op], -1), "wait");
            fsdp_work_free(work[op]);
        }
    }
    for (int k = 0; k < ASYNC_PER_DIM; k++) {
        for (int i = 0; i < nd; i++) {
            int op = k * nd + i;
            struct fsdp_group *g = m->dims[i].group;
            async_check(desc, g, k, (k + i) % g->size, bufs + (2 * (size_t)op + 1) * per);
        }
    }
    fsdp_free(bufs);
}

// ----------------------------------------------------------------------------

static int report(struct fsdp_dist *d, const char *label)
{
    char key[64], text[MAX_CHECKS * 320];
    size_t len = 0;
    for (int i = 0; i < nchecks; i++) {
        len += (size_t)snprintf(text + len, sizeof(text) - len, "%d\t%s\n", checks[i].fails,
                                checks[i].diag);
    }
    snprintf(key, sizeof(key), "test_mesh/%d", d->rank);
    int rc = fsdp_store_set(d->store, key, text, len);
    if (rc < 0) {
        fsdp_die(rc, "publishing results", NULL);
    }
    if (d->rank != 0) {
        return 0;
    }
    for (int r = 1; r < d->world_size; r++) {
        void *val;
        size_t n;
        snprintf(key, sizeof(key), "test_mesh/%d", r);
        if ((rc = fsdp_store_get(d->store, key, &val, &n, -1)) < 0) {
            fsdp_die(rc, "gathering results", NULL);
        }
        char *s = val, *end = s + n;
        for (int i = 0; i < nchecks && s < end; i++) {
            char *nl = memchr(s, '\n', (size_t)(end - s));
            if (!nl) {
                break;
            }
            *nl = '\0';
            int fails = atoi(s);
            char *tab = strchr(s, '\t');
            if (fails && !checks[i].fails && tab) {
                snprintf(checks[i].diag, sizeof(checks[i].diag), "%s", tab + 1);
            }
            checks[i].fails += fails;
            s = nl + 1;
        }
        free(val);
    }
    for (int i = 0; i < nchecks; i++) {
        if (checks[i].fails) {
            tap_diag("%d failures; first: %s", checks[i].fails, checks[i].diag);
        }
        tap_ok(checks[i].fails == 0, "%s: %s", label, checks[i].desc);
    }
    return tap_done();
}

int main(int argc, char **argv)
{
    const char *mesh_spec = NULL, *backend_spec = NULL, *init = NULL;
    double timeout = 30;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--mesh") == 0) {
            mesh_spec = argv[i + 1];
        } else if (strcmp(argv[i], "--backend") == 0) {
            backend_spec = argv[i + 1];
        } else if (strcmp(argv[i], "--init") == 0) {
            init = argv[i + 1];
        } else if (strcmp(argv[i], "--timeout") == 0) {
            timeout = atof(argv[i + 1]);
        } else {
            fprintf(stderr, "usage: test_mesh [--mesh SPEC] [--backend SPEC] [--init M] "
                            "[--timeout S]\n");
            return 2;
        }
    }
    struct fsdp_dist *d;
    int rc = fsdp_dist_init(&argc, &argv, init, timeout, &d);
    if (rc < 0) {
        fsdp_die(rc, "init", NULL);
    }
    my_rank = d->rank;
    const char *alt = getenv("TEST_MESH_ALT_RANK");
    if (alt && atoi(alt) == d->rank) {
        mesh_spec = fsdp_env_str("TEST_MESH_ALT_MESH", mesh_spec);
        backend_spec = fsdp_env_str("TEST_MESH_ALT_BACKEND", backend_spec);
    }

    struct fsdp_mesh *m;
    double t0 = fsdp_now();
    rc = fsdp_mesh_create(d, mesh_spec, backend_spec, &m);
    if (rc < 0) {
        printf("rank %d: mesh: %s (%s) after %.1f s\n", d->rank, fsdp_err_msg(),
               fsdp_strerror(rc), fsdp_now() - t0);
        fflush(stdout);
        fsdp_err_clear();
        fsdp_dist_finalize(d);
        return 1;
    }
    char label[300];
    snprintf(label, sizeof(label), "n=%d mesh %s backend %s", d->world_size, m->spec, m->backends);
    check_layout(m, d, backend_spec ? backend_spec : m->backends);
    check_collectives(m, d->rank);
    check_async(m);
    t0 = fsdp_now();
    fsdp_mesh_destroy(m);
    expect("destroy is fast", fsdp_now() - t0 < 1.0, "fsdp_mesh_destroy took %.2f s",
           fsdp_now() - t0);
    /* a long job creates groups over and over: more than the flight
     * recorder's table of group names must never be refused */
    int many = (int)fsdp_env_int("TEST_MESH_MANY", 0), made = 0;
    for (int i = 0; i < many; i++, made++) {
        struct fsdp_mesh *mi;
        if (fsdp_mesh_create(d, mesh_spec, backend_spec, &mi) < 0) {
            break;
        }
        fsdp_mesh_destroy(mi);
    }
    if (many) {
        expect("meshes created one after another", made == many,
               "%d of %d meshes created: %s", made, many, fsdp_err_msg());
        fsdp_err_clear();
    }
    rc = report(d, label);
    fsdp_dist_finalize(d);
    return rc;
}
