/*
 * util.h - small helpers every layer uses: clocks, buffers that are
 * allocated once and pre-faulted, environment parameters, number parsing,
 * the even split of n items over parts, printable copies of untrusted text,
 * and the visibility of private symbols.
 */
#ifndef FSDP_CORE_UTIL_H
#define FSDP_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>

/*
 * Marks a symbol that a layer's files share among themselves but that is no
 * part of the library's interface (a backend's internal calls): it links
 * between objects as usual but is never exported should the library be built
 * as a shared object, so it cannot collide with or be bound by another
 * library's symbols. Goes on the declaration in the private header.
 */
#define FSDP_PRIVATE __attribute__((visibility("hidden")))

/* Monotonic seconds. */
double fsdp_now(void);

/*
 * 64-byte aligned allocation whose pages are touched before it is returned:
 * the page-fault cost (about 12 us a page on VMs) is paid once here, not in
 * the first collective or kernel that uses the buffer. Free with fsdp_free.
 */
void *fsdp_alloc(size_t bytes);
void *fsdp_calloc(size_t bytes);
void fsdp_free(void *p);

/* pthread_create for the library's own service threads (progress, store
 * server, watchdog): asynchronous signals stay with the application's
 * threads, synchronous faults (SEGV, BUS, FPE, ILL) are not blocked.
 * Returns pthread_create's result. */
#include <pthread.h>
int fsdp_thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

/* The job abort's guarantee that an error never becomes a hang: after
 * $FSDPC_ABORT_TIMEOUT seconds (default 30) the process _exit(code)s with a
 * line on stderr, whatever the abort is still waiting for (a communicator
 * abort behind a stuck kernel, MPI_Abort behind a dead peer). Armed once per
 * process; later calls do nothing. */
void fsdp_arm_hard_exit(int code);

/*
 * Environment parameters, read when first asked for. On a malformed value
 * they return the default and log a warning naming the variable.
 */
long long fsdp_env_int(const char *name, long long dflt);
double fsdp_env_double(const char *name, double dflt);
const char *fsdp_env_str(const char *name, const char *dflt);

/* "256M", "4K", "1G", "1000" -> bytes (binary suffixes). 0 or FSDP_ERR_INVALID. */
int fsdp_parse_size(const char *s, size_t *out);
/* Strict integer / double parse of a whole string. 0 or FSDP_ERR_INVALID. */
int fsdp_parse_long(const char *s, long long *out);
int fsdp_parse_double(const char *s, double *out);

/*
 * The one rule for cutting n items into `parts` contiguous pieces as evenly
 * as possible: piece `part` is [*first, *first + *count), and the first
 * n % parts pieces hold one item more. Checkpoint shards (doc/formats.md)
 * and the tcp backend's segments and chunks both follow it, so it must not
 * change. parts > 0, part < parts.
 */
static inline void fsdp_split_even(size_t n, size_t parts, size_t part, size_t *first,
                                   size_t *count)
{
    size_t base = n / parts, extra = n % parts;
    *count = base + (part < extra ? 1 : 0);
    *first = part * base + (part < extra ? part : extra);
}

/*
 * Text read from a file (tensor and dataset names, attributes, HDF5's own
 * messages about the file) made fit to print: every byte outside printable
 * ASCII becomes '?' (newlines too, unless keep_nl), so that an escape
 * sequence, a carriage return or an 8-bit control cannot reach a terminal
 * or a log. The result goes to dst (len > 4 bytes; dst may be src); text
 * longer than len - 1 bytes is cut and ends in "...". Returns dst.
 */
char *fsdp_str_printable(char *dst, size_t len, const char *src, int keep_nl);

/* 64-bit FNV-1a, for agreement hashes. */
uint64_t fsdp_hash64(const void *data, size_t len, uint64_t seed);

#endif
