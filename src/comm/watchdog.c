/*
 * watchdog.c - the thread that turns a stuck collective into a named,
 * job-wide error, and dumps the flight recorder on SIGUSR2.
 *
 * Every collective is recorded with its deadline when it is issued. The
 * thread wakes a few times a second, and when the oldest unfinished record
 * is past its deadline (plus a short grace, so that a wait timing out on
 * its own reports first, from the thread that owns the call) it dumps the
 * recorder and aborts the job through the abort hook, with a message that
 * names the group, the sequence number and the call. The deadline runs from
 * the issue, so a collective issued and then not waited for longer than the
 * deadline counts as stuck too: the engine waits for what it issues within
 * a step, and the deadline is far longer than a step.
 *
 * Collectives issued before the first collective error of the process are
 * left alone: they are that error's fallout, and the program is already
 * reporting it (a stuck teardown is bounded by the program's abort).
 *
 * SIGUSR2 reaches the thread through a self-pipe: the handler only write()s
 * one byte (async-signal-safe), and the thread does the dump.
 *
 * Before it aborts the job the watchdog starts the hard-exit timer
 * (fsdp_arm_hard_exit; the job abort starts it too): the abort runs every
 * group's abort callback and then MPI_Abort, and any of them may block (a
 * communicator abort waiting for a kernel stuck behind another group's, an
 * MPI_Abort waiting for a dead peer). After FSDPC_ABORT_TIMEOUT seconds
 * the process exits regardless, so a stuck collective always ends as an
 * error, never as a hang.
 */
#include "config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "comm/debug.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WATCHDOG_TICK_MS 200
#define WATCHDOG_GRACE_S 1.0

struct fsdp_watchdog {
    struct fsdp_flight *flight;
    pthread_t thread;
    int pipe[2]; /* [0] read by the thread; [1] written by SIGUSR2 and stop */
    struct sigaction old_usr2;
    int have_old_usr2;
};

/* The write end the signal handler uses (one watchdog per process). */
static volatile sig_atomic_t watchdog_signal_fd = -1;

static void watchdog_on_usr2(int sig)
{
    (void)sig;
    int saved = errno;
    int fd = watchdog_signal_fd;
    if (fd >= 0) {
        char c = 'd';
        ssize_t r = write(fd, &c, 1);
        (void)r; /* a full pipe already holds a pending dump request */
    }
    errno = saved;
}

static void watchdog_fire(struct fsdp_watchdog *w, const struct fsdp_flight_entry *e, double now)
{
    struct fsdp_debug_call c;
    fsdp_debug_entry_call(e, &c);
    char call[128];
    fsdp_arm_hard_exit(1); /* fsdp_die's exit status */
    fsdp_debug_call_str(&c, call, sizeof(call));
    fsdp_err_clear();
    fsdp_err(FSDP_ERR_TIMEOUT,
             "%s #%" PRIu64 " %s on group %s not complete after %.1f s (deadline %.1f s; "
             "some rank of the group is stuck or never called it)",
             fsdp_debug_op_kind(c.op), e->seq, call, fsdp_flight_group_name(w->flight, e->group),
             now - e->t_issue, e->deadline_s);
    fsdp_debug_dump(fsdp_err_msg());
    fsdp_die(FSDP_ERR_TIMEOUT, "watchdog",
             "the flight recorder dumps show which rank is behind: fsdpc-flight merge DIR");
}

static void *watchdog_main(void *arg)
{
    struct fsdp_watchdog *w = arg;
    for (;;) {
        struct pollfd p = {.fd = w->pipe[0], .events = POLLIN};
        int n = poll(&p, 1, WATCHDOG_TICK_MS);
        if (n > 0) {
            char c = 0;
            if (read(w->pipe[0], &c, 1) == 1) {
                if (c == 'q') {
                    return NULL;
                }
                if (fsdp_flight_dump(w->flight, fsdp_env_str("FSDPC_FLIGHT_DIR", FSDP_FLIGHT_DEFAULT_DIR),
                                     "SIGUSR2") < 0) {
                    char msg[512];
                    fsdp_err_take(msg, sizeof(msg));
                    FSDP_WARN(FSDP_SUB_DIST, "%s", msg);
                }
            }
        }
        struct fsdp_flight_entry e;
        double now = fsdp_now();
        if (fsdp_flight_overdue(w->flight, now, fsdp_debug_error_time(), WATCHDOG_GRACE_S, &e)) {
            watchdog_fire(w, &e, now);
        }
    }
}

int fsdp_watchdog_start(struct fsdp_flight *f, struct fsdp_watchdog **out)
{
    int rc;
    struct fsdp_watchdog *w = calloc(1, sizeof(*w));
    if (!w) {
        return fsdp_err(FSDP_ERR_NOMEM, "watchdog: out of memory");
    }
    w->flight = f;
    if (pipe2(w->pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        rc = fsdp_err(FSDP_ERR_SYSTEM, "watchdog: pipe: %s", strerror(errno));
        goto err_free;
    }
    int err = fsdp_thread_start(&w->thread, watchdog_main, w);
    if (err) {
        rc = fsdp_err(FSDP_ERR_SYSTEM, "watchdog: cannot start its thread: %s", strerror(err));
        goto err_pipe;
    }
    watchdog_signal_fd = w->pipe[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = watchdog_on_usr2;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    w->have_old_usr2 = sigaction(SIGUSR2, &sa, &w->old_usr2) == 0;
    *out = w;
    return 0;

err_pipe:
    close(w->pipe[0]);
    close(w->pipe[1]);
err_free:
    free(w);
    return rc;
}

void fsdp_watchdog_stop(struct fsdp_watchdog *w)
{
    if (!w) {
        return;
    }
    if (w->have_old_usr2) {
        sigaction(SIGUSR2, &w->old_usr2, NULL);
    }
    watchdog_signal_fd = -1;
    char q = 'q';
    while (write(w->pipe[1], &q, 1) < 0 && errno == EINTR) {
    }
    pthread_join(w->thread, NULL);
    close(w->pipe[0]);
    close(w->pipe[1]);
    free(w);
}
