/*
 * stop.h - stopping a run from outside: SIGUSR1, SIGTERM and SIGINT (Ctrl-C),
 * and SIGPIPE: a closed stdout (`fsdpc-train ... | head`, a launcher that
 * went away) stops the run like Ctrl-C instead of killing it mid-step; the
 * rest of its output goes to stderr.
 *
 * The handlers only note the first signal; the training loop folds it into
 * its per-step agreement, so every rank stops after the same step (with a
 * checkpoint when --ckpt-dir is set) and the run exits with
 * FSDP_TRAIN_EXIT_STOPPED. A second SIGINT ends the process at once, as
 * Ctrl-C does to any program (under mpiexec.mpich, hydra forwards the first
 * Ctrl-C to every rank as SIGINT and aborts the job on the second).
 */
#ifndef FSDP_TRAIN_STOP_H
#define FSDP_TRAIN_STOP_H

/* Exit status of a run stopped by a signal at a step boundary (EX_TEMPFAIL):
 * not finished, and continued by running the same command again. */
#define FSDP_TRAIN_EXIT_STOPPED 75

/* Installs the handlers (once per process); rank 0 says on stderr what a
 * first Ctrl-C does. fsdp_stop_restore puts back the previous ones. */
void fsdp_stop_install(int rank);
void fsdp_stop_restore(void);

/* The first signal this process received (SIGUSR1, SIGTERM, SIGINT,
 * SIGPIPE), 0: none. */
int fsdp_stop_signal(void);

/* "SIGINT", "SIGTERM", "SIGUSR1", "SIGPIPE (its output was closed)", or
 * "signal N". */
const char *fsdp_stop_signal_name(int sig);

#endif
