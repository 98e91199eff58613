/*
 * peer_common.h - what the peer benchmarks share: size lists, clocks, the
 * per-iteration statistics and the CSV rows the comparison driver reads.
 *
 * The peers (mpi_raw_bench, gloo_bench) measure exactly as fsdpc-bench does:
 * sizes in total bytes (nccl-tests), warm-up, a barrier, timed iterations
 * each issued and completed on its own, per-rank mean/median/min, max over
 * ranks. Header-only, C and C++; no fsdpc code, so the peers stand alone.
 */
#ifndef PEER_COMMON_H
#define PEER_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PEER_MAX_SIZES 256

static inline double peer_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "4", "64K", "256M", "1G" -> bytes (binary suffixes); 0 on error. */
static inline size_t peer_parse_size(const char *s)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) {
        return 0;
    }
    switch (*end) {
    case 'K': case 'k': v <<= 10; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'G': case 'g': v <<= 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') {
        end++;
    }
    return *end ? 0 : (size_t)v;
}

/* Sizes from "--sizes 4,4K,1M" or from min..max multiplied by factor.
 * Returns how many, or -1 after printing what was wrong. */
static inline int peer_size_list(const char *list, size_t min, size_t max, size_t factor,
                                 size_t *out)
{
    int n = 0;
    if (list) {
        char buf[1024];
        snprintf(buf, sizeof(buf), "%s", list);
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save)) {
            size_t v = peer_parse_size(tok);
            if (!v || n == PEER_MAX_SIZES) {
                fprintf(stderr, "bad --sizes entry '%s'\n", tok);
                return -1;
            }
            out[n++] = v;
        }
        return n;
    }
    if (!min || min > max || factor < 2) {
        fprintf(stderr, "bad size range %zu..%zu x%zu\n", min, max, factor);
        return -1;
    }
    for (size_t s = min; s <= max && n < PEER_MAX_SIZES; s *= factor) {
        out[n++] = s;
        if (s > max / factor) {
            break;
        }
    }
    return n;
}

static inline int peer_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* samples (n,) are sorted in place; stats[0..2] = mean, median, min. */
static inline void peer_stats(double *samples, int n, double total, double stats[3])
{
    qsort(samples, (size_t)n, sizeof(double), peer_cmp_double);
    stats[0] = total / n;
    stats[1] = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
    stats[2] = samples[0];
}

/* The same columns as fsdpc-bench --csv. */
static inline void peer_csv_header(FILE *f)
{
    fprintf(f, "impl,op,nranks,dtype,redop,root,size_bytes,count,placement,time_us,algbw_gbs,"
               "busbw_gbs,wrong,time_avg_us,time_median_us,time_min_us\n");
}

/* stats in seconds (mean, median, min), already max over ranks. */
static inline void peer_report(FILE *csv, const char *impl, const char *op, int nranks,
                               const char *redop, size_t bytes, size_t count,
                               const char *placement, double factor, long long wrong,
                               const double stats[3])
{
    double t = stats[0];
    double algbw = t > 0 ? (double)bytes / t * 1e-9 : 0.0;
    printf("  %10zu %13zu %9.2f %7.2f %7.2f %9.2f %6lld\n", bytes, count, t * 1e6, algbw,
           algbw * factor, stats[1] * 1e6, wrong);
    fflush(stdout);
    if (csv) {
        fprintf(csv, "%s,%s,%d,f32,%s,%d,%zu,%zu,%s,%.3f,%.4f,%.4f,%lld,%.3f,%.3f,%.3f\n", impl,
                op, nranks, redop, strcmp(op, "broadcast") == 0 ? 0 : -1, bytes, count, placement,
                t * 1e6, algbw, algbw * factor, wrong, stats[0] * 1e6, stats[1] * 1e6,
                stats[2] * 1e6);
        fflush(csv);
    }
}

static inline void peer_columns(const char *impl, const char *op, int nranks)
{
    printf("# %s %s, %d ranks (time = mean, max over ranks)\n", impl, op, nranks);
    printf("# %10s %13s %9s %7s %7s %9s %6s\n", "size(B)", "count", "time(us)", "algbw", "busbw",
           "median", "#wrong");
}

#endif
