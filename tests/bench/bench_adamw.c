/*
 * bench_adamw.c - the CPU AdamW update (fsdp_cpu_adamw_update) over flat f32
 * shards, in elements per second, beside two memory-bandwidth references
 * measured in the same run on the same buffers with the same threads:
 *   pattern: AdamW's own traffic (read p, g, m, v; write p, m, v) with one
 *            multiply-add per stream, i.e. 28 bytes an element at the
 *            memory's speed: the bound the update can reach;
 *   triad:   STREAM's a = b + s c (12 bytes an element counted, as STREAM
 *            counts, write-allocate not included).
 *
 * Built on request only (`make tests/bench/bench_adamw`), run by hand or by
 * tests/peers/run_adamw_bench.sh beside torch.optim.AdamW
 * (tests/peers/torch_adamw_bench.py); doc/performance.md has the figures.
 *
 * Method: per size, warm-up steps, then each timed step alone (one call
 * over the whole shard, the step count advancing as in training), median.
 * #wrong: after the first step, the first and last 4099 elements are
 * recomputed from saved inputs by a one-thread call on copies (at another
 * offset) and compared bit for bit.
 *
 * usage: bench_adamw [--threads T] [--iters N] [--warmup W] [--offset K] SIZE...
 *   SIZE in elements, binary suffixes (1M = 1048576); --offset K starts every
 *   buffer K floats past a 64-byte boundary.
 */
#include "config.h"
#include "compute/kernels.h"
#include "core/util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_MAX_ITERS 1000
#define BENCH_CHECK 4099

struct bench_opts {
    int threads, iters, warmup;
    size_t offset;
};

struct bench_bufs {
    float *p, *g, *m, *v; /* (n) each, offset floats past their allocation */
    float *alloc[4];
    size_t n;
};

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double bench_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(double), bench_cmp);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* deterministic values in [-1, 1) */
static float bench_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 23)) - 1.0f;
}

static int bench_bufs_init(struct bench_bufs *b, size_t n, size_t offset)
{
    float **dst[4] = {&b->p, &b->g, &b->m, &b->v};
    b->n = n;
    for (int k = 0; k < 4; k++) {
        b->alloc[k] = fsdp_alloc((n + offset) * sizeof(float));
        if (!b->alloc[k]) {
            fprintf(stderr, "bench_adamw: no memory for 4 x %zu floats; give smaller sizes\n", n);
            return -1;
        }
        *dst[k] = b->alloc[k] + offset;
    }
    uint64_t s = 42;
    for (size_t i = 0; i < n; i++) {
        b->p[i] = bench_rand(&s);
        b->g[i] = bench_rand(&s);
        b->m[i] = 0.0f;
        b->v[i] = 0.0f;
    }
    return 0;
}

static void bench_bufs_free(struct bench_bufs *b)
{
    for (int k = 0; k < 4; k++) {
        fsdp_free(b->alloc[k]);
    }
}

// ----------------------------------------------------------------------------
// the bandwidth references, over the same threads as the update

struct bench_piece {
    struct bench_bufs *b;
    size_t lo, hi;
    int triad;
};

static void *bench_stream_piece(void *arg)
{
    const struct bench_piece *w = arg;
    float *p = w->b->p, *g = w->b->g, *m = w->b->m, *v = w->b->v;
    if (w->triad) {
        for (size_t i = w->lo; i < w->hi; i++) {
            p[i] = g[i] + 0.5f * m[i];
        }
        return NULL;
    }
    for (size_t i = w->lo; i < w->hi; i++) {
        float x = 0.5f * v[i] + 0.25f * g[i]; /* keeps v >= 0 and bounded */
        p[i] = 0.5f * p[i] + g[i];
        m[i] = 0.5f * m[i] + g[i];
        v[i] = x < 0.0f ? -x : x;
    }
    return NULL;
}

static double bench_stream_once(struct bench_bufs *b, int threads, int triad)
{
    struct bench_piece w[FSDP_ADAMW_MAX_THREADS];
    pthread_t tid[FSDP_ADAMW_MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        size_t first, count;
        fsdp_split_even(b->n, (size_t)threads, (size_t)t, &first, &count);
        w[t] = (struct bench_piece){b, first, first + count, triad};
    }
    double t0 = fsdp_now();
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&tid[t], NULL, bench_stream_piece, &w[t]) != 0) {
            tid[t] = 0;
            bench_stream_piece(&w[t]);
        }
    }
    bench_stream_piece(&w[0]);
    for (int t = 1; t < threads; t++) {
        if (tid[t]) {
            pthread_join(tid[t], NULL);
        }
    }
    return fsdp_now() - t0;
}

static double bench_stream(struct bench_bufs *b, const struct bench_opts *o, int triad)
{
    double t[BENCH_MAX_ITERS];
    for (int i = 0; i < o->warmup; i++) {
        bench_stream_once(b, o->threads, triad);
    }
    for (int i = 0; i < o->iters; i++) {
        t[i] = bench_stream_once(b, o->threads, triad);
    }
    return bench_median(t, o->iters);
}

// ----------------------------------------------------------------------------
// the update

static const struct fsdp_adamw_params bench_hp = {
    .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

/* saves 4 x k inputs from element at, for the check after step 1 */
static float *bench_save(const struct bench_bufs *b, size_t at, size_t k)
{
    float *s = malloc(4 * k * sizeof(float) + 64);
    if (s) {
        const float *src[4] = {b->p, b->g, b->m, b->v};
        for (int j = 0; j < 4; j++) {
            memcpy(s + 1 + j * k, src[j] + at, k * sizeof(float));
        }
    }
    return s;
}

/* recomputes step 1 on the saved copies (one thread, one float past the
 * original alignment) and counts bitwise differences from b at `at` */
static long bench_check(float *s, const struct bench_bufs *b, size_t at, size_t k)
{
    if (!s) {
        return -1;
    }
    float *p = s + 1, *g = p + k, *m = g + k, *v = m + k;
    struct fsdp_adamw_params hp = bench_hp;
    hp.step = 1;
    fsdp_cpu_adamw_update(p, g, m, v, k, &hp, 1, 1.0f);
    long wrong = 0;
    for (size_t i = 0; i < k; i++) {
        wrong += memcmp(&p[i], &b->p[at + i], 4) || memcmp(&m[i], &b->m[at + i], 4) ||
                 memcmp(&v[i], &b->v[at + i], 4);
    }
    free(s);
    return wrong;
}

static double bench_update(struct bench_bufs *b, const struct bench_opts *o, long *wrong)
{
    size_t n = b->n, k = n < BENCH_CHECK ? n : BENCH_CHECK;
    float *head = bench_save(b, 0, k), *tail = bench_save(b, n - k, k);
    struct fsdp_adamw_params hp = bench_hp;
    hp.threads = o->threads;
    double t[BENCH_MAX_ITERS];
    for (int i = 0; i < o->warmup + o->iters; i++) {
        hp.step = i + 1;
        double t0 = fsdp_now();
        fsdp_cpu_adamw_update(b->p, b->g, b->m, b->v, n, &hp, 1, 1.0f);
        double dt = fsdp_now() - t0;
        if (i == 0) {
            long w1 = bench_check(head, b, 0, k), w2 = bench_check(tail, b, n - k, k);
            *wrong = w1 < 0 || w2 < 0 ? -1 : w1 + w2;
        }
        if (i >= o->warmup) {
            t[i - o->warmup] = dt;
        }
    }
    return bench_median(t, o->iters);
}

static int bench_size(size_t n, const struct bench_opts *o)
{
    struct bench_bufs b;
    memset(&b, 0, sizeof(b));
    if (bench_bufs_init(&b, n, o->offset) != 0) {
        bench_bufs_free(&b);
        return 1;
    }
    long wrong = 0;
    double tu = bench_update(&b, o, &wrong);
    double tp = bench_stream(&b, o, 0), tt = bench_stream(&b, o, 1);
    double pat = 28.0 * (double)n / tp * 1e-9;
    printf("%12zu %8d %10.3f %9.1f %8.2f %12.2f %9.1f %8.2f %10.2f %6ld\n", n, o->threads, tu * 1e3,
           (double)n / tu * 1e-6, 28.0 * (double)n / tu * 1e-9, pat, pat / 28.0 * 1e3, tp / tu,
           12.0 * (double)n / tt * 1e-9, wrong);
    fflush(stdout);
    bench_bufs_free(&b);
    return wrong != 0;
}

static int bench_usage(const char *what)
{
    fprintf(stderr,
            "bench_adamw: %s\nusage: bench_adamw [--threads T (1..%d)] [--iters N (1..%d)] "
            "[--warmup W (>= 1)] [--offset K (0..1023)] SIZE... (elements, e.g. 1M 16M)\n",
            what, FSDP_ADAMW_MAX_THREADS, BENCH_MAX_ITERS);
    return 2;
}

/* one option and its value; 0, or -1 when the value is out of range */
static int bench_option(struct bench_opts *o, const char *name, const char *val)
{
    long long x;
    if (!val || fsdp_parse_long(val, &x) != 0) {
        return -1;
    }
    if (!strcmp(name, "--threads") && x >= 1 && x <= FSDP_ADAMW_MAX_THREADS) {
        o->threads = (int)x;
    } else if (!strcmp(name, "--iters") && x >= 1 && x <= BENCH_MAX_ITERS) {
        o->iters = (int)x;
    } else if (!strcmp(name, "--warmup") && x >= 1 && x <= BENCH_MAX_ITERS) {
        o->warmup = (int)x;
    } else if (!strcmp(name, "--offset") && x >= 0 && x < 1024) {
        o->offset = (size_t)x;
    } else {
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct bench_opts o = {.threads = 1, .iters = 20, .warmup = 3};
    size_t sizes[64];
    int ns = 0;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--", 2)) {
            if (bench_option(&o, argv[i], i + 1 < argc ? argv[i + 1] : NULL) != 0) {
                return bench_usage("unknown option or bad value");
            }
            i++;
        } else if (ns < 64 && fsdp_parse_size(argv[i], &sizes[ns]) == 0 && sizes[ns] > 0) {
            ns++;
        } else {
            return bench_usage("not a size (give elements, e.g. 1M) or more than 64 sizes");
        }
    }
    if (ns == 0) {
        return bench_usage("no size given");
    }
    printf("# bench_adamw: %d thread(s), %d warm-up + %d timed steps per size, median; "
           "buffers %zu floats past 64-byte alignment\n",
           o.threads, o.warmup, o.iters, o.offset);
    printf("# %10s %8s %10s %9s %8s %12s %9s %8s %10s %6s\n", "elements", "threads", "ms/step",
           "Melem/s", "GB/s", "pattern GB/s", "bound M/s", "of bound", "triad GB/s", "#wrong");
    int bad = 0;
    for (int i = 0; i < ns; i++) {
        bad |= bench_size(sizes[i], &o);
    }
    return bad;
}
