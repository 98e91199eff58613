/*
 * error.h - error codes and the check macros that carry them up the stack.
 *
 * Library code returns 0 or a negative FSDP_ERR_* code. The first failure
 * records a one-line message (what went wrong, naming the file, peer or flag)
 * with fsdp_err(); every FSDP_CHECK on the way up logs "file:line -> code" at
 * debug level, which gives a backtrace under FSDPC_LOG=debug. Only programs
 * turn an error into a job-wide abort (fsdp_die), never library code.
 */
#ifndef FSDP_CORE_ERROR_H
#define FSDP_CORE_ERROR_H

#include <stddef.h>

enum fsdp_err {
    FSDP_OK = 0,
    FSDP_ERR_INVALID = -1,      /* bad argument, flag or configuration */
    FSDP_ERR_NOMEM = -2,        /* allocation failed */
    FSDP_ERR_IO = -3,           /* file or socket I/O failed */
    FSDP_ERR_FORMAT = -4,       /* a file or message is malformed */
    FSDP_ERR_TIMEOUT = -5,      /* a bounded wait ran out */
    FSDP_ERR_PEER = -6,         /* a peer died, closed, or misbehaved */
    FSDP_ERR_MISMATCH = -7,     /* ranks disagree (mesh, backend, collective) */
    FSDP_ERR_UNSUPPORTED = -8,  /* an operation or dtype a backend lacks */
    FSDP_ERR_SYSTEM = -9,       /* an OS call failed */
    FSDP_ERR_ABORTED = -10,     /* the job or communicator was aborted */
    FSDP_ERR_STALE = -11,       /* state left by an earlier job */
    FSDP_ERR_INTERNAL = -12,    /* a bug in fsdpc */
    FSDP_ERR_BACKEND = -13,     /* an MPI/NCCL/CUDA library call failed */
    FSDP_ERR_AUTH = -14,        /* a peer or store failed the job-secret handshake */
};

/* Short name of a code ("timeout", "peer lost", ...). */
const char *fsdp_strerror(int code);

/*
 * Records the message of a new error and returns code, so that
 *     return fsdp_err(FSDP_ERR_FORMAT, "%s: attribute 'n_layer' missing", path);
 * both describes and propagates it. The message is per thread; a later call
 * replaces it only when the previous one has been taken (fsdp_err_take) or
 * cleared, so the root cause survives the unwinding above it.
 */
int fsdp_err_at(const char *file, int line, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define fsdp_err(code, ...) fsdp_err_at(__FILE__, __LINE__, (code), __VA_ARGS__)

/* The current thread's recorded message ("" when none). */
const char *fsdp_err_msg(void);
/* Copies the message into buf and clears it; a hint stays with the error
 * (fsdp_err_hint), so that a caller that re-records the message with more
 * context keeps it. */
void fsdp_err_take(char *buf, size_t len);
/* Forgets the message and its hint. */
void fsdp_err_clear(void);

/*
 * Attaches a hint to the current error: what to check, or the flag that
 * fixes it ("lower --seq-len to at most 64"). The first hint stays, like the
 * first message: the layer nearest the cause knows best. Programs print it
 * as a second line, "fsdpc: hint: ...".
 */
void fsdp_err_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The current thread's hint ("" when none). */
const char *fsdp_err_hint_msg(void);

/*
 * Prints "fsdpc: rank R on HOST: <what>: <message> (<class>)" and the hint
 * line, flushes them, and waits (at most 2 s) until a pipe or socket on
 * stderr has been read: a launcher that tears the job down next must not
 * lose the line. cls NULL leaves out the class (a message that carries it
 * already). Ends nothing.
 */
void fsdp_err_report(const char *what, const char *cls);
/* The same wait for output already written to stderr. */
void fsdp_err_drain_stderr(void);

/* Logs the propagation step; used by FSDP_CHECK. */
void fsdp_err_trace(const char *file, int line, int code);

#define FSDP_CHECK(call)                                  \
    do {                                                  \
        int fsdp_check_rc_ = (call);                      \
        if (fsdp_check_rc_ < 0) {                         \
            fsdp_err_trace(__FILE__, __LINE__, fsdp_check_rc_); \
            return fsdp_check_rc_;                        \
        }                                                 \
    } while (0)

/* Same, but jumps to a cleanup label with rc set (for unwinding setup). */
#define FSDP_CHECK_GOTO(call, rc, label)                  \
    do {                                                  \
        (rc) = (call);                                    \
        if ((rc) < 0) {                                   \
            fsdp_err_trace(__FILE__, __LINE__, (rc));     \
            goto label;                                   \
        }                                                 \
    } while (0)

/*
 * Program-level: prints one message "fsdpc: rank R on HOST: <what>: <error
 * message> (<code name>)" plus a hint line (hint, else the one recorded with
 * fsdp_err_hint), waits until stderr has been read (fsdp_err_report), then
 * aborts the whole job through the registered abort hook (MPI_Abort,
 * backend abort, _exit).
 */
#if defined(__cplusplus) /* the CUDA sources include this header as C++ */
#define FSDP_NORETURN [[noreturn]]
#else
#define FSDP_NORETURN _Noreturn
#endif
FSDP_NORETURN void fsdp_die(int code, const char *what, const char *hint);
/* Same with a formatted message and no error code. */
FSDP_NORETURN void fsdp_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The job-wide abort; set by the distribution layer once it is up. */
typedef void (*fsdp_abort_fn)(int exit_code, void *arg);
void fsdp_set_abort_hook(fsdp_abort_fn fn, void *arg);
/* Runs the hook (or _exit) with exit_code; never returns. */
FSDP_NORETURN void fsdp_abort_job(int exit_code);

#endif
