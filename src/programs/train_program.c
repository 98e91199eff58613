/*
 * train_program.c - fsdpc-train's program: options, rendezvous, the run,
 * exit status. The only place in the trainer that prints errors and ends
 * the job. train_main.c is its main; tests that register an architecture of
 * their own call it after registering.
 *
 *   fsdpc-train --model m.h5 --data train.bin --steps 1000 --batch-size 8 \
 *               --seq-len 256 --lr 6e-4 [--config run.cfg] [...]
 *   mpiexec.mpich -n 4 fsdpc-train ...
 *
 * Exit status: 0 when the run is done (or was done already), 1 on an error,
 * FSDP_TRAIN_EXIT_STOPPED (75) when a signal stopped it at a step boundary
 * (stop.h): run the same command again to go on.
 *
 * An error every rank knows of (bad options, a missing file, a mesh that
 * does not fit) is printed once, by the lowest rank that has it, and every
 * rank then leaves through an orderly finalize: under MPICH's mpiexec a rank
 * that aborts takes the others' unread output with it.
 */
#include "config.h"
#include "train/memory_plan.h"
#include "train/stop.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "train/world.h"
#include "programs/train_program.h"
#include "core/error.h"
#include "core/log.h"
#include "rendezvous/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * A failure every rank agreed on (FSDP_ERR_ABORTED): the one rank with a
 * message reports it (the class is in the message already), then all leave
 * through an orderly finalize, so that no rank ends before the line is out.
 */
static _Noreturn void main_fail_together(struct fsdp_dist *dist, const char *what)
{
    if (fsdp_err_msg()[0]) {
        fsdp_err_report(what, NULL);
    }
    fflush(stdout);
    fsdp_dist_finalize(dist);
    exit(1);
}

/*
 * Options that did not parse. Every rank of a launched job parsed the same
 * argv, so every rank has this error: they meet first (with the defaults of
 * what did not parse) and the lowest reports it. Without a job to meet in,
 * or when meeting fails, each rank reports its own.
 */
static _Noreturn void main_bad_options(int rc, int *argc, char ***argv,
                                       const struct fsdp_train_config *cfg)
{
    struct fsdp_dist *dist = NULL;
    int first, n;
    fsdp_err_hint("fsdpc-train --help lists every option; a config file takes the same keys "
                  "without the dashes");
    char msg[1024], hint[512];
    fsdp_err_take(msg, sizeof(msg));
    snprintf(hint, sizeof(hint), "%s", fsdp_err_hint_msg());
    /* only with a launcher that started several ranks is there anyone to agree with; the
     * rendezvous's start-up line would only come before the error */
    fsdp_log_quiet();
    int drc = fsdp_dist_launcher_size() > 1
                  ? fsdp_dist_init(argc, argv, cfg->init[0] ? cfg->init : NULL, cfg->timeout, &dist)
                  : -1;
    if (drc == 0 && dist->world_size > 1 &&
        fsdp_world_agree_store(dist, "options", 2, &first, &n) == 0) {
        fsdp_err_clear();
        if (first == dist->rank) {
            fsdp_err(rc, "%s (%s)", msg, fsdp_strerror(rc));
            fsdp_err_hint("%s", hint);
        }
        main_fail_together(dist, "fsdpc-train: options");
    }
    fsdp_err_clear();
    fsdp_log_set_rank(-1); /* found before the ranks mattered: the message names the host */
    fsdp_err(rc, "%s", msg);
    fsdp_err_hint("%s", hint);
    fsdp_die(rc, "fsdpc-train: options", NULL);
}

static int main_wants_version(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            return 1;
        }
    }
    return 0;
}

/* The job, joined with the settings cfg asks for; rank 0 prints what was
 * asked for (every key is in the metrics and checkpoints). */
static struct fsdp_dist *main_rendezvous(const struct fsdp_train_config *cfg,
                                         const struct fsdp_optset *set, int *argc, char ***argv)
{
    struct fsdp_dist *dist = NULL;
    if (cfg->debug > 0) {
        /* read by the debug layer when the first group is created */
        static const char *const levels[] = {"", "OFF", "INFO", "DETAIL"};
        setenv("FSDPC_DEBUG", levels[cfg->debug], 1);
    }
    if (cfg->insecure) {
        setenv("FSDPC_INSECURE", "1", 1); /* read by the rendezvous (dist.h) */
    }
    int rc = fsdp_dist_init(argc, argv, cfg->init, cfg->timeout, &dist);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-train: rendezvous", NULL);
    }
    if (dist->rank == 0) {
        printf("# fsdpc-train %s configuration (each key: file or flag)\n", PACKAGE_VERSION);
        size_t left = fsdp_opt_print_given(set, stdout, "");
        printf("# %zu more keys at their defaults (fsdpc-train --help lists them; the metrics "
               "start record and every checkpoint hold all of them)\n",
               left);
        fflush(stdout);
    }
    return dist;
}

/* The run; returns whether a signal stopped it. A failure ends the job. */
static int main_run(struct fsdp_trainer *t, struct fsdp_dist *dist)
{
    int rc = fsdp_trainer_run(t);
    if (rc == FSDP_ERR_ABORTED) {
        /* every rank is here, between collectives: the groups can be freed */
        char msg[1024], hint[512];
        fsdp_err_take(msg, sizeof(msg));
        snprintf(hint, sizeof(hint), "%s", fsdp_err_hint_msg());
        fsdp_trainer_destroy(t);
        fsdp_err_clear();
        if (msg[0]) {
            fsdp_err(rc, "%s", msg);
            fsdp_err_hint("%s", hint);
        }
        main_fail_together(dist, "fsdpc-train");
    }
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-train", NULL);
    }
    return t->stopped_by != 0;
}

int fsdp_train_program(int argc, char **argv)
{
    struct fsdp_train_config cfg;
    struct fsdp_optset set;
    struct fsdp_trainer *t = NULL;

    /* --version, --help and --print-memory print once under a launcher */
    const int quiet = fsdp_dist_launcher_rank() != 0;
    if (main_wants_version(argc, argv)) {
        if (!quiet) {
            printf("fsdpc-train fsdpc %s\n", PACKAGE_VERSION);
        }
        return 0;
    }
    /* every rank parses the same argv, so every rank reaches the same verdict */
    fsdp_train_config_init(&cfg, &set);
    int rc = fsdp_train_config_parse(&cfg, &set, argc, argv);
    if (rc == 1) {
        if (!quiet) {
            fsdp_train_config_usage(&set, stdout);
        }
        return 0;
    }
    if (rc < 0) {
        main_bad_options(rc, &argc, &argv, &cfg);
    }
    if (cfg.print_memory) { /* one process plans the whole mesh; no rendezvous */
        if (!quiet && (rc = fsdp_train_print_memory(&cfg, stdout)) < 0) {
            fsdp_die(rc, "fsdpc-train: --print-memory", NULL);
        }
        return 0;
    }
    struct fsdp_dist *dist = main_rendezvous(&cfg, &set, &argc, &argv);
    rc = fsdp_trainer_create(&cfg, dist, NULL, &t);
    if (rc == FSDP_ERR_ABORTED) {
        main_fail_together(dist, "fsdpc-train");
    }
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-train", NULL);
    }
    if (dist->rank == 0) {
        fsdp_trainer_print_header(t, stdout);
    }
    const int stopped = main_run(t, dist);
    fsdp_trainer_destroy(t);
    fsdp_dist_finalize(dist);
    return stopped ? FSDP_TRAIN_EXIT_STOPPED : 0;
}
