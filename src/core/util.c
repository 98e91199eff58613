/*
 * util.c - clocks, pre-faulted buffers, environment parameters, parsing.
 */
#include "config.h"
#include "core/util.h"
#include "core/error.h"
#include "core/log.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double fsdp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void *fsdp_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) {
        bytes = 64;
    }
    if (posix_memalign(&p, 64, (bytes + 63) & ~(size_t)63) != 0) {
        return NULL;
    }
    /* touch one byte per page: faults are paid now, not on the hot path */
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) {
        page = 4096;
    }
    volatile char *c = p;
    for (size_t off = 0; off < bytes; off += (size_t)page) {
        c[off] = 0;
    }
    return p;
}

void *fsdp_calloc(size_t bytes)
{
    void *p = fsdp_alloc(bytes);
    if (p) {
        memset(p, 0, bytes);
    }
    return p;
}

void fsdp_free(void *p)
{
    free(p);
}

int fsdp_thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

#define FSDP_HARD_EXIT_S 30.0

static struct {
    double s;
    int code;
    int armed;
    pthread_mutex_t mu;
} hard_exit = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *hard_exit_main(void *arg)
{
    char msg[160];
    double t0 = fsdp_now(), left;
    (void)arg;
    while ((left = hard_exit.s - (fsdp_now() - t0)) > 0) {
        struct timespec ts = {0, left < 0.05 ? (long)(left * 1e9) + 1 : 50000000L};
        nanosleep(&ts, NULL);
    }
    int n = snprintf(msg, sizeof(msg), "fsdpc: the job abort did not end the process within "
                     "%.1f s (FSDPC_ABORT_TIMEOUT): exiting\n", hard_exit.s);
    if (n > 0) {
        ssize_t r = write(STDERR_FILENO, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg));
        (void)r;
    }
    _exit(hard_exit.code);
}

void fsdp_arm_hard_exit(int code)
{
    pthread_t t;
    pthread_mutex_lock(&hard_exit.mu);
    int was = hard_exit.armed;
    hard_exit.armed = 1;
    pthread_mutex_unlock(&hard_exit.mu);
    if (was) {
        return;
    }
    double s = fsdp_env_double("FSDPC_ABORT_TIMEOUT", FSDP_HARD_EXIT_S);
    hard_exit.s = s > 0 ? s : FSDP_HARD_EXIT_S;
    hard_exit.code = code;
    if (fsdp_thread_start(&t, hard_exit_main, NULL) == 0) {
        pthread_detach(t);
        return;
    }
    alarm((unsigned)hard_exit.s + 1); /* no thread: SIGALRM's default action ends it */
}

long long fsdp_env_int(const char *name, long long dflt)
{
    const char *s = getenv(name);
    long long v = dflt;
    if (!s || !*s) {
        return dflt;
    }
    if (fsdp_parse_long(s, &v) < 0) {
        fsdp_err_clear();
        FSDP_WARN(FSDP_SUB_CORE, "ignoring %s='%s': not an integer (using %lld)", name, s, dflt);
        return dflt;
    }
    return v;
}

double fsdp_env_double(const char *name, double dflt)
{
    const char *s = getenv(name);
    double v = dflt;
    if (!s || !*s) {
        return dflt;
    }
    if (fsdp_parse_double(s, &v) < 0) {
        fsdp_err_clear();
        FSDP_WARN(FSDP_SUB_CORE, "ignoring %s='%s': not a number (using %g)", name, s, dflt);
        return dflt;
    }
    return v;
}

const char *fsdp_env_str(const char *name, const char *dflt)
{
    const char *s = getenv(name);
    return s && *s ? s : dflt;
}

int fsdp_parse_long(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end) {
        return fsdp_err(FSDP_ERR_INVALID, "'%s' is not an integer", s);
    }
    *out = v;
    return 0;
}

int fsdp_parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) {
        return fsdp_err(FSDP_ERR_INVALID, "'%s' is not a number", s);
    }
    *out = v;
    return 0;
}

int fsdp_parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') {
        return fsdp_err(FSDP_ERR_INVALID, "'%s' is not a size (e.g. 4, 64K, 256M, 1G)", s);
    }
    unsigned long long mul = 1;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') {
        end++;
    }
    if (*end) {
        return fsdp_err(FSDP_ERR_INVALID, "'%s' is not a size (e.g. 4, 64K, 256M, 1G)", s);
    }
    *out = (size_t)(v * mul);
    return 0;
}

char *fsdp_str_printable(char *dst, size_t len, const char *src, int keep_nl)
{
    size_t i = 0;
    /* forward copy: dst == src is safe since i never passes the read index */
    for (; src[i] && i + 1 < len; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = (c >= 0x20 && c < 0x7f) || (keep_nl && c == '\n') ? (char)c : '?';
    }
    int cut = src[i] != '\0';
    dst[i] = '\0';
    if (cut && len > 4) {
        memcpy(dst + len - 4, "...", 4);
    }
    return dst;
}

uint64_t fsdp_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ull ^ seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}
