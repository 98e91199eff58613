/*
 * error.c - per-thread error messages and hints, propagation traces, the
 * program's error report and the job abort. Owns no state but the abort
 * hook and the thread-local message and hint.
 */
#include "config.h"
#include "core/error.h"
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char err_msg[1024];
static _Thread_local int err_set;
static _Thread_local char err_hint[512];

static fsdp_abort_fn abort_hook;
static void *abort_arg;

const char *fsdp_strerror(int code)
{
    switch (code) {
    case FSDP_OK: return "success";
    case FSDP_ERR_INVALID: return "invalid argument";
    case FSDP_ERR_NOMEM: return "out of memory";
    case FSDP_ERR_IO: return "I/O error";
    case FSDP_ERR_FORMAT: return "bad format";
    case FSDP_ERR_TIMEOUT: return "timeout";
    case FSDP_ERR_PEER: return "peer lost";
    case FSDP_ERR_MISMATCH: return "ranks disagree";
    case FSDP_ERR_UNSUPPORTED: return "not supported";
    case FSDP_ERR_SYSTEM: return "system error";
    case FSDP_ERR_ABORTED: return "aborted";
    case FSDP_ERR_STALE: return "stale state from an earlier job";
    case FSDP_ERR_INTERNAL: return "internal error";
    case FSDP_ERR_BACKEND: return "backend library error";
    case FSDP_ERR_AUTH: return "authentication failed";
    default: return "unknown error";
    }
}

int fsdp_err_at(const char *file, int line, int code, const char *fmt, ...)
{
    if (!err_set) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err_msg, sizeof(err_msg), fmt, ap);
        va_end(ap);
        err_set = 1;
    }
    if (fsdp_log_enabled(FSDP_LOG_DEBUG, FSDP_SUB_CORE)) {
        fsdp_log_at(FSDP_LOG_DEBUG, FSDP_SUB_CORE, file, line, "error %d (%s): %s", code,
                    fsdp_strerror(code), err_msg);
    }
    return code;
}

const char *fsdp_err_msg(void)
{
    return err_set ? err_msg : "";
}

void fsdp_err_take(char *buf, size_t len)
{
    if (len) {
        snprintf(buf, len, "%s", err_set ? err_msg : "");
    }
    err_set = 0; /* the hint stays: the message is usually recorded again, with context */
    err_msg[0] = '\0';
}

void fsdp_err_clear(void)
{
    err_set = 0;
    err_msg[0] = '\0';
    err_hint[0] = '\0';
}

void fsdp_err_hint(const char *fmt, ...)
{
    if (err_hint[0]) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_hint, sizeof(err_hint), fmt, ap);
    va_end(ap);
}

const char *fsdp_err_hint_msg(void)
{
    return err_hint;
}

void fsdp_err_trace(const char *file, int line, int code)
{
    if (fsdp_log_enabled(FSDP_LOG_DEBUG, FSDP_SUB_CORE)) {
        fsdp_log_at(FSDP_LOG_DEBUG, FSDP_SUB_CORE, file, line, "-> %d (%s)", code,
                    fsdp_strerror(code));
    }
}

void fsdp_set_abort_hook(fsdp_abort_fn fn, void *arg)
{
    abort_hook = fn;
    abort_arg = arg;
}

_Noreturn void fsdp_abort_job(int exit_code)
{
    fflush(stdout);
    fflush(stderr);
    if (abort_hook) {
        fsdp_abort_fn fn = abort_hook;
        abort_hook = NULL; /* a failing hook must not recurse */
        fn(exit_code, abort_arg);
    }
    _exit(exit_code);
}

/* "rank 3 on node12", or "on node12" before the rank is known. */
static void fsdp_who(char *buf, size_t len)
{
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    if (fsdp_log_rank() >= 0) {
        snprintf(buf, len, "rank %d on %s", fsdp_log_rank(), host);
    } else {
        snprintf(buf, len, "on %s", host);
    }
}

/*
 * Bytes written to stderr that its reader has not taken yet: what is left in
 * a pipe (FIONREAD) or in a socket's send queue (TIOCOUTQ); 0 for a file or
 * a terminal, whose writes are done when write() returns.
 */
static int err_unread(int fd)
{
    struct stat st;
    int n = 0;
    if (fstat(fd, &st) != 0) {
        return 0;
    }
    if (S_ISFIFO(st.st_mode)) {
        return ioctl(fd, FIONREAD, &n) == 0 ? n : 0;
    }
    if (S_ISSOCK(st.st_mode)) {
        return ioctl(fd, TIOCOUTQ, &n) == 0 ? n : 0;
    }
    return 0;
}

/*
 * A launcher (MPICH's mpiexec) that is told to abort the job kills its
 * proxies at once, and a line still in the pipe between a rank and its proxy
 * is lost with them. So the reporter waits until the pipe is empty, polling
 * every 2 ms for at most 2 s.
 */
void fsdp_err_drain_stderr(void)
{
    fflush(stderr);
    for (int i = 0; i < 1000 && err_unread(STDERR_FILENO) > 0; i++) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

void fsdp_err_report(const char *what, const char *cls)
{
    const char *msg = fsdp_err_msg();
    char who[300];
    fsdp_who(who, sizeof(who));
    fflush(stdout);
    if (cls) {
        fprintf(stderr, "fsdpc: %s: %s%s%s (%s)\n", who, what ? what : "error", msg[0] ? ": " : "",
                msg, cls);
    } else {
        fprintf(stderr, "fsdpc: %s: %s%s%s\n", who, what ? what : "error", msg[0] ? ": " : "",
                msg);
    }
    if (err_hint[0]) {
        fprintf(stderr, "fsdpc: hint: %s\n", err_hint);
    }
    fsdp_err_drain_stderr();
}

_Noreturn void fsdp_die(int code, const char *what, const char *hint)
{
    if (hint && hint[0]) {
        snprintf(err_hint, sizeof(err_hint), "%s", hint);
    }
    fsdp_err_report(what, fsdp_strerror(code));
    fsdp_abort_job(1);
}

_Noreturn void fsdp_fatal(const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    char who[300];
    fsdp_who(who, sizeof(who));
    fflush(stdout);
    fprintf(stderr, "fsdpc: %s: %s\n", who, buf);
    fsdp_err_drain_stderr();
    fsdp_abort_job(1);
}
