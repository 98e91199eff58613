/*
 * bench_main.c - fsdpc-bench, the collective benchmark (nccl-tests columns).
 *
 *   mpiexec.mpich -n 4 fsdpc-bench --op allreduce --backend tcp --min 4 --max 256M
 *
 * For each collective and size: warm-up iterations, a barrier, timed
 * iterations (each issued and waited for on its own, so every iteration has
 * its own time), then one checked iteration whose result is compared with
 * values derived from (seed, rank, index). Out-of-place first, then in place.
 * The time reported is the per-iteration mean on each rank, max over ranks
 * (nccl-tests' default statistic is the mean; the max makes the slowest rank
 * count); --stat median reports the median instead, which a noisy machine
 * disturbs less; the CSV holds mean, median and min.
 *
 * Buffers are allocated once, at --max, pre-faulted, and reused. This file
 * owns flags, setup, timing, statistics and printing; what each collective
 * does lives in bench_<collective>.c. Errors abort the job with fsdp_die;
 * bad flags print one line and a hint and exit 2 on every rank.
 */
#include "config.h"
#include "programs/bench/bench.h"
#include "core/error.h"
#include "core/options.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "comm/group.h"
#include "comm/mesh.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_MAX_SIZES 256

static const struct fsdp_bench_coll *const bench_colls[] = {
    &fsdp_bench_allreduce,
    &fsdp_bench_allgather,
    &fsdp_bench_reduce_scatter,
    &fsdp_bench_broadcast,
};
#define BENCH_NCOLLS (sizeof(bench_colls) / sizeof(bench_colls[0]))

enum bench_stat {
    BENCH_STAT_AVG = 0,
    BENCH_STAT_MEDIAN,
};

/* The flags as given, what the option table fills. */
struct bench_flags {
    char op[256];
    char backend[256];
    char mesh[256];
    char dim[64];
    char init[1024];
    enum fsdp_dtype dtype;
    int redop; /* index into bench_redops */
    long root;
    size_t min_bytes, max_bytes;
    long step_factor;
    char sizes[2048];
    long iters, warmup;
    int stat; /* enum bench_stat */
    long check;
    int insecure;
    double timeout_s; /* 0: the job's default */
    char csv[4096];
};

struct bench_opts {
    struct bench_flags f; /* what the strings below point into */
    unsigned ops;        /* bit i selects bench_colls[i] */
    const char *backend; /* NULL: the mesh's default */
    const char *mesh;    /* NULL: dp=<world size> */
    const char *dim;     /* NULL: the only dimension */
    const char *init;    /* NULL: auto */
    enum fsdp_dtype dtype;
    enum fsdp_redop redop;
    int root;
    size_t min_bytes;
    size_t max_bytes; /* the largest size, listed or not: the buffer size */
    long long step_factor;
    size_t sizes[BENCH_MAX_SIZES]; /* the sizes to run, ascending */
    int nsizes;
    int sizes_listed; /* --sizes given */
    long long iters;
    long long warmup;
    double timeout_s;
    int check;
    enum bench_stat stat;
    const char *csv;
};

struct bench {
    struct bench_opts o;
    struct fsdp_dist *dist;
    struct fsdp_mesh *mesh;
    struct fsdp_group *group;     /* the dimension's slice being measured */
    struct fsdp_group *world;     /* barriers and statistics (host memory) */
    struct fsdp_group *own_world; /* created here when group cannot serve */
    enum fsdp_mem mem;
    void *stream;
    void *send;     /* (max_bytes,) in mem */
    void *recv;     /* (max_bytes,) in mem */
    void *hsend;    /* (max_bytes,) host image of send */
    void *hrecv;    /* (max_bytes,) host image of recv */
    double *samples; /* (iters,) seconds per timed iteration */
    FILE *csv;
    int64_t wrong_total; /* over every checked iteration and rank */
};

/* One placement's outcome, already reduced over ranks. */
struct bench_result {
    double avg_s, median_s, min_s;
    int64_t wrong; /* -1: not checked */
};

// ----------------------------------------------------------------------------
// flags

#define F(field) offsetof(struct bench_flags, field)
#define S(field) sizeof(((struct bench_flags *)0)->field)
static const struct fsdp_opt bench_table[] = {
    {"op", FSDP_OPT_STR, F(op), S(op), 0, 0, NULL, "NAME", 0,
     "allreduce, allgather, reduce_scatter, broadcast, a comma list, or all", 0},
    {"backend", FSDP_OPT_STR, F(backend), S(backend), 0, 0, NULL, "SPEC", 0,
     "tcp, mpi, nccl, or per dimension: dp=tcp,tp=mpi (default: mpi when launched by MPI, else "
     "tcp)",
     0},
    {"mesh", FSDP_OPT_STR, F(mesh), S(mesh), 0, 0, NULL, "SPEC", 0,
     "device mesh, e.g. dp=2,tp=2 (default dp=<world size>)", 0},
    {"dim", FSDP_OPT_STR, F(dim), S(dim), 0, 0, NULL, "NAME", 0,
     "mesh dimension to measure (needed when the mesh has several)", 0},
    {"dtype", FSDP_OPT_DTYPE, F(dtype), 0, 0, 0, "f32|f16|bf16|i32|i64|u8", "T", 0,
     "f32 f16 bf16 i32 i64 u8", 0},
    {"redop", FSDP_OPT_CHOICE, F(redop), 0, 0, 0, "sum|avg|max|min", "OP", 0, "sum avg max min", 0},
    {"root", FSDP_OPT_INT, F(root), 0, 0, 1 << 30, NULL, "R", 0,
     "broadcast root, a rank of the group", 0},
    {"min", FSDP_OPT_SIZE, F(min_bytes), 0, 1, 1e15, NULL, "BYTES", 0,
     "smallest size, total bytes, K/M/G suffixes", 0},
    {"max", FSDP_OPT_SIZE, F(max_bytes), 0, 1, 1e15, NULL, "BYTES", 0, "largest size", 0},
    {"step-factor", FSDP_OPT_INT, F(step_factor), 0, 2, 1024, NULL, "F", 0,
     "multiply the size by F each step", 0},
    {"sizes", FSDP_OPT_STR, F(sizes), S(sizes), 0, 0, NULL, "LIST", 0,
     "explicit sizes instead of --min/--max, e.g. 4,4K,1M,64M", 0},
    {"iters", FSDP_OPT_INT, F(iters), 0, 1, 1000000, NULL, "N", 0, "timed iterations per size", 0},
    {"warmup", FSDP_OPT_INT, F(warmup), 0, 0, 1000000, NULL, "N", 0,
     "untimed iterations before them", 0},
    {"stat", FSDP_OPT_CHOICE, F(stat), 0, 0, 0, "avg|median", "avg|median", 0,
     "per-rank statistic of iteration times; the max over ranks is reported", 0},
    {"check", FSDP_OPT_INT, F(check), 0, 0, 1, NULL, "0|1", 0,
     "verify one extra iteration per size", 0},
    {"init", FSDP_OPT_STR, F(init), S(init), 0, 0, NULL, "METHOD", 0,
     "mpi, env://, tcp://HOST:PORT, file:///PATH (default auto)", 0},
    {"insecure", FSDP_OPT_FLAG, F(insecure), 0, 0, 0, NULL, "", 0, FSDP_DIST_INSECURE_HELP, 0},
    {"timeout", FSDP_OPT_FLOAT, F(timeout_s), 0, 0, 1e9, NULL, "S", FSDP_OPT_MIN_OPEN,
     "deadline for setup and each collective (default $FSDPC_TIMEOUT, else 300)", 0},
    {"csv", FSDP_OPT_STR, F(csv), S(csv), 0, 0, NULL, "FILE", 0,
     "also write one row per size and placement to FILE (rank 0)", 0},
};
#undef F
#undef S

/* --redop's choices, in the table's order. */
static const enum fsdp_redop bench_redops[] = {FSDP_SUM, FSDP_AVG, FSDP_MAX, FSDP_MIN};

static const char bench_about[] =
    "Measures collectives like nccl-tests: time, algbw and busbw per size; run it\n"
    "under a launcher (mpiexec.mpich -n N fsdpc-bench [options]).\n"
    "\n"
    "Sizes are total bytes as in nccl-tests: the allreduce/broadcast buffer, the whole\n"
    "allgather output, the whole reduce_scatter input (count per rank = size/N/elem).\n"
    "busbw = algbw * 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter),\n"
    "1 (broadcast). The exit status is 1 when any checked element was wrong.";

/* A wrong flag's message and where to look, from one rank. */
static void bench_say_bad_flag(const char *fmt, va_list ap)
{
    fprintf(stderr, "fsdpc-bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'fsdpc-bench --help' for the options.\n");
}

/* Every rank parses the same flags, so every rank exits here alike. */
__attribute__((format(printf, 1, 2))) _Noreturn static void bench_bad_flag(const char *fmt, ...)
{
    if (fsdp_dist_launcher_rank() == 0) {
        va_list ap;
        va_start(ap, fmt);
        bench_say_bad_flag(fmt, ap);
        va_end(ap);
    }
    exit(2);
}

static unsigned bench_parse_ops(const char *s)
{
    if (strcmp(s, "all") == 0) {
        return (1u << BENCH_NCOLLS) - 1;
    }
    unsigned ops = 0;
    char buf[256];
    if (strlen(s) >= sizeof(buf)) {
        bench_bad_flag("--op '%.40s...': too long", s);
    }
    strcpy(buf, s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < BENCH_NCOLLS && strcmp(bench_colls[i]->name, tok) != 0) {
            i++;
        }
        if (i == BENCH_NCOLLS) {
            bench_bad_flag("--op '%s': unknown collective (allreduce, allgather, reduce_scatter, "
                           "broadcast, all)", tok);
        }
        ops |= 1u << i;
    }
    if (!ops) {
        bench_bad_flag("--op '%s': no collective named", s);
    }
    return ops;
}

static size_t bench_parse_bytes(const char *flag, const char *s)
{
    size_t v;
    if (fsdp_parse_size(s, &v) < 0 || v == 0) {
        bench_bad_flag("%s '%s': expected a positive byte count such as 4, 64K, 256M", flag, s);
    }
    return v;
}

static int bench_cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

static void bench_parse_sizes(const char *s, struct bench_opts *o)
{
    char buf[2048];
    if (strlen(s) >= sizeof(buf)) {
        bench_bad_flag("--sizes: list too long");
    }
    strcpy(buf, s);
    o->nsizes = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (o->nsizes == BENCH_MAX_SIZES) {
            bench_bad_flag("--sizes: more than %d sizes", BENCH_MAX_SIZES);
        }
        o->sizes[o->nsizes++] = bench_parse_bytes("--sizes", tok);
    }
    if (o->nsizes == 0) {
        bench_bad_flag("--sizes '%s': no size given", s);
    }
    qsort(o->sizes, (size_t)o->nsizes, sizeof(size_t), bench_cmp_size);
    o->sizes_listed = 1;
}

/* The sizes to run: --sizes, else --min times --step-factor up to --max;
 * the buffers are sized for the largest. */
static void bench_size_range(struct bench_opts *o)
{
    size_t elem = fsdp_dtype_size(o->dtype);
    if (!o->sizes_listed) {
        if (o->min_bytes > o->max_bytes) {
            bench_bad_flag("--min %zu is larger than --max %zu", o->min_bytes, o->max_bytes);
        }
        o->nsizes = 0;
        for (size_t size = o->min_bytes; o->nsizes < BENCH_MAX_SIZES;
             size *= (size_t)o->step_factor) {
            o->sizes[o->nsizes++] = size;
            if (size > o->max_bytes / (size_t)o->step_factor) {
                break;
            }
        }
    }
    o->min_bytes = o->sizes[0];
    o->max_bytes = o->sizes[o->nsizes - 1];
    if (o->max_bytes < elem) {
        bench_bad_flag("--max %zu is smaller than one %s element", o->max_bytes,
                       fsdp_dtype_name(o->dtype));
    }
}

static void bench_parse(int argc, char **argv, struct bench_opts *o)
{
    *o = (struct bench_opts){
        .f = {.op = "allreduce",
              .dtype = FSDP_F32,
              .min_bytes = 4,
              .max_bytes = (size_t)256 << 20,
              .step_factor = 2,
              .iters = 20,
              .warmup = 5,
              .check = 1},
    };
    struct bench_flags *f = &o->f;
    struct fsdp_optset set = {.prog = "fsdpc-bench",
                              .opts = bench_table,
                              .n = sizeof(bench_table) / sizeof(bench_table[0]),
                              .base = f,
                              .about = bench_about,
                              .abbreviations = 1};
    int rc = fsdp_opt_parse(&set, argc, argv, NULL);
    if (rc == 1) {
        if (fsdp_dist_launcher_rank() == 0) {
            fsdp_opt_usage(&set, stdout, "[options]");
        }
        exit(0);
    }
    if (rc < 0) {
        bench_bad_flag("%s", fsdp_err_msg());
    }
    o->ops = bench_parse_ops(f->op);
    o->backend = f->backend[0] ? f->backend : NULL;
    o->mesh = f->mesh[0] ? f->mesh : NULL;
    o->dim = f->dim[0] ? f->dim : NULL;
    o->init = f->init[0] ? f->init : NULL;
    o->csv = f->csv[0] ? f->csv : NULL;
    o->dtype = f->dtype;
    o->redop = bench_redops[f->redop];
    o->root = (int)f->root;
    o->min_bytes = f->min_bytes;
    o->max_bytes = f->max_bytes;
    o->step_factor = f->step_factor;
    o->iters = f->iters;
    o->warmup = f->warmup;
    o->timeout_s = f->timeout_s;
    o->check = (int)f->check;
    o->stat = (enum bench_stat)f->stat;
    if (f->insecure) {
        setenv("FSDPC_INSECURE", "1", 1); /* dist.h */
    }
    if (f->sizes[0]) {
        bench_parse_sizes(f->sizes, o);
    }
    bench_size_range(o);
}

// ----------------------------------------------------------------------------
// setup and teardown

/* A flag that only makes sense once the mesh is known was wrong: every rank
 * finds the same, so rank 0 says it once and all leave in order. */
__attribute__((format(printf, 2, 3))) _Noreturn static void bench_config_error(struct bench *b,
                                                                            const char *fmt, ...)
{
    if (b->dist->rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        bench_say_bad_flag(fmt, ap);
        va_end(ap);
    }
    fsdp_mesh_destroy(b->mesh);
    fsdp_dist_finalize(b->dist);
    exit(2);
}

static struct fsdp_group *bench_pick_group(struct bench *b)
{
    struct fsdp_mesh *m = b->mesh;
    if (!b->o.dim) {
        if (m->ndims != 1) {
            bench_config_error(b, "--mesh %s has %d dimensions: choose one with --dim", m->spec,
                               m->ndims);
        }
        return m->dims[0].group;
    }
    struct fsdp_group *g = fsdp_mesh_group(m, b->o.dim);
    if (!g) {
        bench_config_error(b, "--dim '%s': the mesh %s has no such dimension", b->o.dim, m->spec);
    }
    return g;
}

/* Barriers and statistics need a host-memory group over every rank: the
 * measured group when it is one, else a world group of its own. */
static void bench_setup_world(struct bench *b)
{
    struct fsdp_backend_caps caps = {0};
    b->group->ops->capabilities(b->group->be, &caps);
    if (b->group->size == b->dist->world_size && (caps.flags & FSDP_CAP_MEM_HOST)) {
        b->world = b->group;
        return;
    }
    const char *name = fsdp_dist_mpi_available() ? "mpi" : "tcp";
    const struct fsdp_backend_ops *ops = fsdp_backend_find(name);
    int n = b->dist->world_size;
    int *ranks = malloc((size_t)n * sizeof(*ranks));
    if (!ranks) {
        fsdp_die(FSDP_ERR_NOMEM, "world group", NULL);
    }
    for (int r = 0; r < n; r++) {
        ranks[r] = r;
    }
    int rc = ops ? fsdp_group_create(b->dist, "bench", ranks, n, ops, &b->own_world)
                 : fsdp_err(FSDP_ERR_UNSUPPORTED, "backend %s not built", name);
    free(ranks);
    if (rc < 0) {
        fsdp_die(rc, "creating the world group for barriers and statistics", NULL);
    }
    b->world = b->own_world;
}

static void bench_setup_memory(struct bench *b)
{
    struct fsdp_backend_caps caps = {0};
    b->group->ops->capabilities(b->group->be, &caps);
    if (!(caps.dtypes & (1u << b->o.dtype))) {
        bench_config_error(b, "--dtype %s: backend %s does not support it",
                           fsdp_dtype_name(b->o.dtype), b->group->ops->name);
    }
    if (!(caps.redops & (1u << b->o.redop))) {
        bench_config_error(b, "--redop %s: backend %s does not support it",
                           fsdp_redop_name(b->o.redop), b->group->ops->name);
    }
    if (b->o.root >= b->group->size) {
        bench_config_error(b, "--root %d: the group has ranks 0..%d", b->o.root,
                           b->group->size - 1);
    }
    b->mem = (caps.flags & FSDP_CAP_MEM_HOST) ? FSDP_MEM_HOST : FSDP_MEM_CUDA;

    int rc = fsdp_bench_mem_stream_create(b->mem, b->dist->local_rank, &b->stream);
    if (rc < 0) {
        fsdp_die(rc, "creating the CUDA stream", NULL);
    }
    size_t bytes = b->o.max_bytes;
    b->send = fsdp_bench_mem_alloc(b->mem, bytes);
    b->recv = fsdp_bench_mem_alloc(b->mem, bytes);
    if (!b->send || !b->recv) {
        fsdp_die(FSDP_ERR_NOMEM, "allocating the benchmark buffers", "lower --max");
    }
    if (b->mem == FSDP_MEM_HOST) {
        b->hsend = b->send;
        b->hrecv = b->recv;
    } else {
        b->hsend = fsdp_alloc(bytes);
        b->hrecv = fsdp_alloc(bytes);
        if (!b->hsend || !b->hrecv) {
            fsdp_die(fsdp_err(FSDP_ERR_NOMEM, "%zu bytes of host staging", bytes),
                     "allocating the benchmark buffers", "lower --max");
        }
    }
    b->samples = malloc((size_t)b->o.iters * sizeof(*b->samples));
    if (!b->samples) {
        fsdp_die(fsdp_err(FSDP_ERR_NOMEM, "%lld samples", b->o.iters), "allocating", NULL);
    }
}

static void bench_setup(struct bench *b, int *argc, char ***argv)
{
    int rc = fsdp_dist_init(argc, argv, b->o.init, b->o.timeout_s, &b->dist);
    if (rc < 0) {
        fsdp_die(rc, "initializing the job", "check --init and the launcher's environment");
    }
    rc = fsdp_mesh_create(b->dist, b->o.mesh, b->o.backend, &b->mesh);
    if (rc < 0) {
        fsdp_die(rc, "creating the mesh", "check --mesh and --backend");
    }
    b->group = bench_pick_group(b);
    bench_setup_memory(b);
    bench_setup_world(b);
    if (b->o.csv && b->dist->rank == 0) {
        b->csv = fopen(b->o.csv, "w");
        if (!b->csv) {
            fsdp_die(fsdp_err(FSDP_ERR_IO, "cannot write --csv %s", b->o.csv), "opening the CSV",
                     NULL);
        }
        fprintf(b->csv, "impl,op,nranks,dtype,redop,root,size_bytes,count,placement,time_us,"
                        "algbw_gbs,busbw_gbs,wrong,time_avg_us,time_median_us,time_min_us\n");
    }
}

static void bench_teardown(struct bench *b)
{
    if (b->csv) {
        fclose(b->csv);
    }
    free(b->samples);
    if (b->mem != FSDP_MEM_HOST) {
        fsdp_free(b->hsend);
        fsdp_free(b->hrecv);
    }
    fsdp_bench_mem_free(b->mem, b->send);
    fsdp_bench_mem_free(b->mem, b->recv);
    fsdp_bench_mem_stream_destroy(b->mem, b->stream);
    if (b->own_world) {
        fsdp_group_destroy(b->own_world);
    }
    fsdp_mesh_destroy(b->mesh);
    fsdp_dist_finalize(b->dist);
}

// ----------------------------------------------------------------------------
// running, timing, checking

static void bench_issue_wait(const struct fsdp_bench_coll *coll, const struct fsdp_bench_ctx *c,
                             int in_place)
{
    struct fsdp_work *w = NULL;
    int rc = coll->run(c, in_place, &w);
    if (rc >= 0) {
        rc = fsdp_work_wait(w, -1.0);
        fsdp_work_free(w);
    }
    if (rc < 0) {
        char what[160];
        snprintf(what, sizeof(what), "%s of %zu elements (%s) on group %s", coll->name, c->count,
                 in_place ? "in place" : "out of place", c->group->name);
        fsdp_die(rc, what, "FSDPC_LOG=debug shows the backend's steps");
    }
}

static void bench_barrier(struct bench *b)
{
    int rc = fsdp_barrier_sync(b->world);
    if (rc < 0) {
        fsdp_die(rc, "barrier between measurements", NULL);
    }
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Warm-up, barrier, timed loop; this rank's mean/median/min in seconds. */
static void bench_time(struct bench *b, const struct fsdp_bench_coll *coll,
                       const struct fsdp_bench_ctx *c, int in_place, struct bench_result *res)
{
    for (long long i = 0; i < b->o.warmup; i++) {
        bench_issue_wait(coll, c, in_place);
    }
    bench_barrier(b);
    double start = fsdp_now();
    for (long long i = 0; i < b->o.iters; i++) {
        double t0 = fsdp_now();
        bench_issue_wait(coll, c, in_place);
        b->samples[i] = fsdp_now() - t0;
    }
    res->avg_s = (fsdp_now() - start) / (double)b->o.iters;
    qsort(b->samples, (size_t)b->o.iters, sizeof(double), bench_cmp_double);
    size_t n = (size_t)b->o.iters;
    res->median_s = n % 2 ? b->samples[n / 2] : 0.5 * (b->samples[n / 2 - 1] + b->samples[n / 2]);
    res->min_s = b->samples[0];
}

static void bench_transfer(struct bench *b, int upload, size_t bytes)
{
    int rc;
    if (upload) {
        rc = fsdp_bench_mem_upload(b->mem, b->send, b->hsend, bytes);
        if (rc >= 0) {
            rc = fsdp_bench_mem_upload(b->mem, b->recv, b->hrecv, bytes);
        }
    } else {
        rc = fsdp_bench_mem_download(b->mem, b->hsend, b->send, bytes);
        if (rc >= 0) {
            rc = fsdp_bench_mem_download(b->mem, b->hrecv, b->recv, bytes);
        }
    }
    if (rc < 0) {
        fsdp_die(rc, upload ? "copying inputs to the device" : "copying results from the device",
                 NULL);
    }
}

/* One extra iteration on fresh inputs; wrong elements on this rank. */
static int64_t bench_check(struct bench *b, const struct fsdp_bench_coll *coll,
                           const struct fsdp_bench_ctx *c, int in_place, uint32_t seed,
                           size_t bytes)
{
    coll->fill(c, in_place, seed);
    bench_transfer(b, 1, bytes);
    bench_issue_wait(coll, c, in_place);
    bench_transfer(b, 0, bytes);
    return (int64_t)coll->verify(c, in_place, seed);
}

/* Max over ranks of the times, sum over ranks of the wrong elements. */
static void bench_reduce_result(struct bench *b, struct bench_result *res)
{
    int64_t t[3] = {(int64_t)(res->avg_s * 1e9), (int64_t)(res->median_s * 1e9),
                    (int64_t)(res->min_s * 1e9)};
    int rc = fsdp_allreduce_sync(b->world, t, t, 3, FSDP_I64, FSDP_MAX);
    if (rc >= 0 && res->wrong >= 0) {
        rc = fsdp_allreduce_sync(b->world, &res->wrong, &res->wrong, 1, FSDP_I64, FSDP_SUM);
    }
    if (rc < 0) {
        fsdp_die(rc, "gathering the timings", NULL);
    }
    res->avg_s = (double)t[0] * 1e-9;
    res->median_s = (double)t[1] * 1e-9;
    res->min_s = (double)t[2] * 1e-9;
}

static void bench_measure(struct bench *b, const struct fsdp_bench_coll *coll,
                          const struct fsdp_bench_ctx *c, int in_place, uint32_t seed,
                          size_t bytes, struct bench_result *res)
{
    /* inputs are defined values for the timed loop too (no denormals or
     * NaNs from stale memory); in-place loops reuse their own outputs, as
     * nccl-tests does */
    coll->fill(c, in_place, seed);
    bench_transfer(b, 1, bytes);
    bench_time(b, coll, c, in_place, res);
    res->wrong = b->o.check ? bench_check(b, coll, c, in_place, seed + 1, bytes) : -1;
    bench_reduce_result(b, res);
    if (res->wrong > 0) {
        b->wrong_total += res->wrong;
    }
}

// ----------------------------------------------------------------------------
// printing

static void bench_print_header(struct bench *b)
{
    int n = b->dist->world_size;
    int64_t *hashes = calloc((size_t)n, sizeof(*hashes));
    if (!hashes) {
        fsdp_die(FSDP_ERR_NOMEM, "host list", NULL);
    }
    int64_t mine = (int64_t)fsdp_hash64(b->dist->host, strlen(b->dist->host), 0);
    int rc = fsdp_allgather_sync(b->world, &mine, hashes, 1, FSDP_I64);
    if (rc < 0) {
        fsdp_die(rc, "gathering host names", NULL);
    }
    int hosts = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) {
            seen = hashes[j] == hashes[i];
        }
        hosts += !seen;
    }
    free(hashes);
    if (b->dist->rank != 0) {
        return;
    }
    const struct bench_opts *o = &b->o;
    printf("# fsdpc-bench %s: nccl-tests columns, sizes in total bytes\n", PACKAGE_VERSION);
    printf("# world %d rank%s on %d host%s (rank 0 on %s, %d local), init %s, timeout %.0f s\n",
           n, n == 1 ? "" : "s", hosts, hosts == 1 ? "" : "s", b->dist->host, b->dist->local_size,
           fsdp_dist_method_name(b->dist), b->dist->timeout_s);
    printf("# mesh %s, backend %s; measuring dim %s: group %s of %d rank%s, backend %s, %s "
           "memory\n",
           b->mesh->spec, b->mesh->backends, o->dim ? o->dim : b->mesh->dims[0].name,
           b->group->name, b->group->size, b->group->size == 1 ? "" : "s", b->group->ops->name,
           fsdp_bench_mem_name(b->mem));
    char range[64];
    if (o->sizes_listed) {
        snprintf(range, sizeof(range), "%d listed", o->nsizes);
    } else {
        snprintf(range, sizeof(range), "x%lld", o->step_factor);
    }
    printf("# dtype %s, redop %s, root %d, sizes %zu..%zu bytes (%s), warmup %lld, iters %lld, "
           "check %s\n",
           fsdp_dtype_name(o->dtype), fsdp_redop_name(o->redop), o->root, o->min_bytes,
           o->max_bytes, range, o->warmup, o->iters, o->check ? "on" : "off");
    printf("# time: per-iteration %s on each rank (issue to completion), max over ranks\n",
           o->stat == BENCH_STAT_MEDIAN ? "median" : "mean");
    fflush(stdout);
}

static void bench_print_columns(const struct fsdp_bench_coll *coll)
{
    printf("#\n# %s\n", coll->name);
    printf("# %62s %31s\n", "out-of-place", "in-place");
    printf("# %10s %13s %6s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "size", "count", "type",
           "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
           "#wrong");
    printf("# %10s %13s %6s %6s %6s %9s %7s %7s %6s %9s %7s %7s %6s\n", "(B)", "(elements)", "",
           "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

static double bench_time_of(const struct bench *b, const struct bench_result *r)
{
    return b->o.stat == BENCH_STAT_MEDIAN ? r->median_s : r->avg_s;
}

static void bench_print_placement(const struct bench *b, const struct bench_result *r,
                                  size_t bytes, double factor)
{
    if (!r) {
        printf(" %9s %7s %7s %6s", "-", "-", "-", "-");
        return;
    }
    double t = bench_time_of(b, r);
    double algbw = t > 0 ? (double)bytes / t * 1e-9 : 0.0;
    char wrong[24];
    if (r->wrong < 0) {
        snprintf(wrong, sizeof(wrong), "N/A");
    } else {
        snprintf(wrong, sizeof(wrong), "%lld", (long long)r->wrong);
    }
    double us = t * 1e6;
    printf(us < 1e4 ? " %9.2f" : us < 1e6 ? " %9.1f" : " %9.0f", us);
    printf(" %7.2f %7.2f %6s", algbw, algbw * factor, wrong);
}

static void bench_csv_row(struct bench *b, const struct fsdp_bench_coll *coll,
                          const struct fsdp_bench_ctx *c, size_t bytes, int in_place,
                          const struct bench_result *r)
{
    double t = bench_time_of(b, r);
    double algbw = t > 0 ? (double)bytes / t * 1e-9 : 0.0;
    fprintf(b->csv, "fsdpc-%s,%s,%d,%s,%s,%d,%zu,%zu,%s,%.3f,%.4f,%.4f,%lld,%.3f,%.3f,%.3f\n",
            b->group->ops->name, coll->name, c->nranks, fsdp_dtype_name(c->dtype),
            (coll->flags & FSDP_BENCH_REDOP) ? fsdp_redop_name(c->redop) : "none",
            (coll->flags & FSDP_BENCH_ROOT) ? c->root : -1, bytes, c->count,
            in_place ? "in" : "out", t * 1e6, algbw, algbw * coll->busbw_factor(c->nranks),
            (long long)r->wrong, r->avg_s * 1e6, r->median_s * 1e6, r->min_s * 1e6);
    fflush(b->csv);
}

// ----------------------------------------------------------------------------
// sizes

size_t fsdp_bench_count_whole(size_t bytes, size_t elem_size, int nranks)
{
    (void)nranks;
    return bytes / elem_size;
}

size_t fsdp_bench_bytes_whole(size_t count, size_t elem_size, int nranks)
{
    (void)nranks;
    return count * elem_size;
}

size_t fsdp_bench_count_blocks(size_t bytes, size_t elem_size, int nranks)
{
    return bytes / elem_size / (size_t)nranks;
}

size_t fsdp_bench_bytes_blocks(size_t count, size_t elem_size, int nranks)
{
    return count * elem_size * (size_t)nranks;
}

double fsdp_bench_busbw_blocks(int nranks)
{
    return nranks > 0 ? (double)(nranks - 1) / nranks : 0.0;
}

// ----------------------------------------------------------------------------
// one collective over the size range

static void bench_run_coll(struct bench *b, const struct fsdp_bench_coll *coll, uint32_t op_seed)
{
    struct fsdp_bench_ctx c = {
        .group = b->group,
        .rank = b->group->rank,
        .nranks = b->group->size,
        .dtype = b->o.dtype,
        .redop = b->o.redop,
        .root = b->o.root,
        .attr = {.mem = b->mem, .stream = b->stream},
        .send = b->send,
        .recv = b->recv,
        .hsend = b->hsend,
        .hrecv = b->hrecv,
    };
    size_t elem = fsdp_dtype_size(b->o.dtype);
    double factor = coll->busbw_factor(c.nranks);
    double busbw_sum = 0.0;
    int busbw_n = 0;
    int64_t wrong = 0;
    size_t last_bytes = 0;
    int rows = 0;
    int rank0 = b->dist->rank == 0;

    if (rank0) {
        bench_print_columns(coll);
    }
    for (int step = 0; step < b->o.nsizes; step++) {
        size_t size = b->o.sizes[step];
        c.count = coll->count(size, elem, c.nranks);
        size_t bytes = coll->bytes(c.count, elem, c.nranks);
        if (c.count > 0 && bytes != last_bytes) {
            uint32_t seed = op_seed + 16u * (uint32_t)step;
            struct bench_result out = {0}, in = {0};
            int has_out = !(coll->flags & FSDP_BENCH_IN_PLACE_ONLY);
            if (has_out) {
                bench_measure(b, coll, &c, 0, seed, bytes, &out);
            }
            bench_measure(b, coll, &c, 1, seed + 8u, bytes, &in);
            if (rank0) {
                printf("  %10zu %13zu %6s %6s %6d", bytes, c.count, fsdp_dtype_name(c.dtype),
                       (coll->flags & FSDP_BENCH_REDOP) ? fsdp_redop_name(c.redop) : "none",
                       (coll->flags & FSDP_BENCH_ROOT) ? c.root : -1);
                bench_print_placement(b, has_out ? &out : NULL, bytes, factor);
                bench_print_placement(b, &in, bytes, factor);
                printf("\n");
                fflush(stdout);
                if (b->csv && has_out) {
                    bench_csv_row(b, coll, &c, bytes, 0, &out);
                }
                if (b->csv) {
                    bench_csv_row(b, coll, &c, bytes, 1, &in);
                }
            }
            for (int p = 0; p < 2; p++) {
                const struct bench_result *r = p ? &in : &out;
                if (!p && !has_out) {
                    continue;
                }
                double t = bench_time_of(b, r);
                busbw_sum += t > 0 ? (double)bytes / t * 1e-9 * factor : 0.0;
                busbw_n++;
                wrong += r->wrong > 0 ? r->wrong : 0;
            }
            last_bytes = bytes;
            rows++;
        }
    }
    if (rank0) {
        if (rows == 0) {
            printf("# no size given holds one element per rank\n");
        }
        if (b->o.check) {
            printf("# Out of bounds values : %lld %s\n", (long long)wrong, wrong ? "FAILED" : "OK");
        }
        printf("# Avg bus bandwidth    : %.4f GB/s\n", busbw_n ? busbw_sum / busbw_n : 0.0);
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    struct bench b = {0};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("fsdpc-bench fsdpc %s\n", PACKAGE_VERSION);
            return 0;
        }
    }
    bench_parse(argc, argv, &b.o);
    bench_setup(&b, &argc, &argv);
    bench_print_header(&b);
    for (size_t i = 0; i < BENCH_NCOLLS; i++) {
        if (b.o.ops & (1u << i)) {
            bench_run_coll(&b, bench_colls[i], 1000u * (uint32_t)(i + 1));
        }
    }
    int failed = b.wrong_total > 0;
    bench_teardown(&b);
    return failed ? 1 : 0;
}
