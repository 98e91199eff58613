/*
 * stop.c - the signals that stop a run at a step boundary (stop.h). The
 * handlers do only what is async-signal-safe: note the signal, for a
 * second SIGINT restore the default action and raise it again, and for a
 * SIGPIPE whose cause is a closed stdout (`| head`, a launcher gone) point
 * stdout at stderr, so that what is left to print goes somewhere or
 * nowhere instead of killing the process.
 */
#include "config.h"
#include "train/stop.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_sig;
static volatile sig_atomic_t stop_ints; /* SIGINTs received */
static volatile sig_atomic_t stop_rank0;
static int stop_installed;
#define STOP_NSIGS 4
static struct sigaction stop_old[STOP_NSIGS];
static const int stop_sigs[STOP_NSIGS] = {SIGUSR1, SIGTERM, SIGINT, SIGPIPE};

static void stop_write(const char *s)
{
    ssize_t n = write(STDERR_FILENO, s, strlen(s));
    (void)n;
}

static void stop_on_signal(int sig)
{
    if (sig == SIGPIPE) {
        struct pollfd p = {.fd = STDOUT_FILENO, .events = POLLOUT};
        if (poll(&p, 1, 0) == 1 && (p.revents & POLLERR)) {
            dup2(STDERR_FILENO, STDOUT_FILENO); /* no reader: the rest goes to stderr */
        }
    }
    if (sig == SIGINT && ++stop_ints > 1) {
        if (stop_rank0) {
            stop_write("\nfsdpc-train: second SIGINT: stopping now, without a checkpoint\n");
        }
        signal(SIGINT, SIG_DFL);
        raise(SIGINT); /* delivered when this handler returns */
        return;
    }
    if (sig == SIGINT && stop_rank0) {
        stop_write("\nfsdpc-train: SIGINT: stopping after this step (with a checkpoint when "
                   "--ckpt-dir is set); a second Ctrl-C stops at once\n");
    }
    if (!stop_sig) {
        stop_sig = sig;
    }
}

void fsdp_stop_install(int rank)
{
    if (stop_installed) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = stop_on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    stop_rank0 = rank == 0;
    for (int i = 0; i < STOP_NSIGS; i++) {
        sigaction(stop_sigs[i], &sa, &stop_old[i]);
    }
    stop_installed = 1;
}

void fsdp_stop_restore(void)
{
    if (!stop_installed) {
        return;
    }
    for (int i = 0; i < STOP_NSIGS; i++) {
        sigaction(stop_sigs[i], &stop_old[i], NULL);
    }
    stop_installed = 0;
}

int fsdp_stop_signal(void)
{
    return stop_sig;
}

const char *fsdp_stop_signal_name(int sig)
{
    static char buf[32];
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGPIPE: return "SIGPIPE (its output was closed)";
    default: snprintf(buf, sizeof(buf), "signal %d", sig); return buf;
    }
}
