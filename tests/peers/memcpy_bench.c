/*
 * memcpy_bench.c - the memory-copy limit every host collective pays: memcpy
 * into pre-faulted pages, and into fresh pages touched for the first time.
 *
 *   memcpy_bench [--sizes 4K,64K,1M,16M,256M] [--min-time 0.2] [--csv FILE]
 *
 * prefaulted  source and destination allocated once and written before
 *             timing; GB/s = bytes copied / time of the fastest iteration
 * first-touch the destination is a fresh anonymous mapping each iteration
 *             (what a per-call malloc of a large buffer gets), so the copy
 *             pays one page fault per page; munmap is outside the timing;
 *             also reported as microseconds per 4 KiB page
 * Single thread. Each size repeats until --min-time seconds have passed (at
 * least 3 times). Whether transparent huge pages apply to fresh mappings is
 * printed, as it changes the first-touch figure. CSV rows are
 * "limit,test,size_bytes,value,unit".
 */
#include <sys/mman.h>
#include <unistd.h>

#include "peer_common.h"

#define MC_MAX_ITERS 100000

static double mc_samples[MC_MAX_ITERS];

/* The fastest iteration: a limit is what the machine can do, not what it
 * usually does while other processes compete for it. */
static double mc_best(int n)
{
    double stats[3];
    peer_stats(mc_samples, n, 0.0, stats);
    return stats[2];
}

static void mc_row(FILE *csv, const char *test, size_t bytes, double value, const char *unit)
{
    printf("  %-12s %12zu %10.3f %s\n", test, bytes, value, unit);
    fflush(stdout);
    if (csv) {
        fprintf(csv, "memcpy,%s,%zu,%.4f,%s\n", test, bytes, value, unit);
    }
}

static double mc_prefaulted(char *dst, const char *src, size_t n, double min_time)
{
    memcpy(dst, src, n); /* warm caches and TLB */
    int it = 0;
    for (double start = peer_now(); it < MC_MAX_ITERS && (it < 3 || peer_now() - start < min_time);
         it++) {
        double t0 = peer_now();
        memcpy(dst, src, n);
        mc_samples[it] = peer_now() - t0;
        __asm__ __volatile__("" : : "r"(dst) : "memory"); /* keep the copy */
    }
    return mc_best(it);
}

static double mc_first_touch(const char *src, size_t n, double min_time)
{
    int it = 0;
    for (double start = peer_now(); it < MC_MAX_ITERS && (it < 3 || peer_now() - start < min_time);
         it++) {
        char *dst = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (dst == MAP_FAILED) {
            perror("memcpy_bench: mmap");
            exit(1);
        }
        double t0 = peer_now();
        memcpy(dst, src, n);
        mc_samples[it] = peer_now() - t0;
        __asm__ __volatile__("" : : "r"(dst) : "memory");
        munmap(dst, n);
    }
    return mc_best(it);
}

static void mc_thp(char *out, size_t len)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    snprintf(out, len, "unknown");
    if (f) {
        if (fgets(out, (int)len, f)) {
            out[strcspn(out, "\n")] = 0;
        }
        fclose(f);
    }
}

int main(int argc, char **argv)
{
    const char *list = "4K,64K,1M,16M,256M";
    const char *csvpath = NULL;
    double min_time = 0.2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--sizes") == 0) {
            list = argv[i + 1];
        } else if (strcmp(argv[i], "--min-time") == 0) {
            min_time = atof(argv[i + 1]);
        } else if (strcmp(argv[i], "--csv") == 0) {
            csvpath = argv[i + 1];
        } else {
            break;
        }
    }
    size_t sizes[PEER_MAX_SIZES];
    int nsizes = peer_size_list(list, 0, 0, 0, sizes);
    if (argc % 2 == 0 || nsizes <= 0 || !(min_time >= 0)) {
        fprintf(stderr, "usage: memcpy_bench [--sizes LIST] [--min-time S] [--csv FILE]\n");
        return 2;
    }
    size_t max = 0;
    for (int i = 0; i < nsizes; i++) {
        max = sizes[i] > max ? sizes[i] : max;
    }
    char *src = malloc(max);
    char *dst = malloc(max);
    if (!src || !dst) {
        fprintf(stderr, "memcpy_bench: cannot allocate 2 x %zu bytes\n", max);
        return 1;
    }
    memset(src, 1, max); /* pre-fault both */
    memset(dst, 0, max);
    FILE *csv = NULL;
    if (csvpath) {
        csv = fopen(csvpath, "w");
        if (!csv) {
            perror(csvpath);
            return 1;
        }
        fprintf(csv, "limit,test,size_bytes,value,unit\n");
    }
    char thp[128];
    mc_thp(thp, sizeof(thp));
    long page = sysconf(_SC_PAGESIZE);
    printf("# memcpy, one thread, best of >= 3 iterations and >= %.2f s; page %ld B; "
           "transparent hugepages: %s\n",
           min_time, page, thp);
    for (int i = 0; i < nsizes; i++) {
        size_t n = sizes[i];
        double pre = mc_prefaulted(dst, src, n, min_time);
        double fresh = mc_first_touch(src, n, min_time);
        double pages = (double)((n + (size_t)page - 1) / (size_t)page);
        mc_row(csv, "prefaulted", n, (double)n / pre * 1e-9, "GB/s");
        mc_row(csv, "first-touch", n, (double)n / fresh * 1e-9, "GB/s");
        mc_row(csv, "fault", n, (fresh - pre) / pages * 1e6, "us per page");
    }
    if (csv) {
        fclose(csv);
    }
    free(src);
    free(dst);
    return 0;
}
