/*
 * util.h - small helpers every layer uses: clocks, buffers that are
 * allocated once and pre-faulted, environment parameters, number parsing.
 */
#ifndef FSDP_CORE_UTIL_H
#define FSDP_CORE_UTIL_H

#include <stddef.h>
#include <stdint.h>

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

/* 64-bit FNV-1a, for agreement hashes. */
uint64_t fsdp_hash64(const void *data, size_t len, uint64_t seed);

#endif
