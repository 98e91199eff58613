/*
 * train_program.c - fsdpc-train's program: options, rendezvous, the run,
 * exit status. The only place in the trainer that prints errors and aborts
 * the job. train_main.c is its main; tests that register an architecture of
 * their own call it after registering.
 *
 *   fsdpc-train --model m.h5 --data train.bin --steps 1000 --batch-size 8 \
 *               --seq-len 256 --lr 6e-4 [--config run.cfg] [...]
 *   mpiexec.mpich -n 4 fsdpc-train ...
 */
#include "config.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "programs/train_program.h"
#include "core/error.h"
#include "rendezvous/dist.h"

#include <stdio.h>
#include <stdlib.h>

/*
 * A setup failure every rank agreed on (FSDP_ERR_ABORTED from
 * fsdp_trainer_create): the one rank with a message reports it, then all
 * leave through an orderly finalize. An abort here could let the launcher
 * tear the job down before that line has reached it.
 */
static _Noreturn void main_fail_together(struct fsdp_dist *dist, const char *what)
{
    const char *msg = fsdp_err_msg();
    if (msg[0]) {
        fprintf(stderr, "fsdpc: rank %d on %s: %s: %s\n", dist->rank, dist->host, what, msg);
        fflush(stderr);
    }
    fflush(stdout);
    fsdp_dist_finalize(dist);
    exit(1);
}

int fsdp_train_program(int argc, char **argv)
{
    struct fsdp_train_config cfg;
    struct fsdp_optset set;
    struct fsdp_dist *dist = NULL;
    struct fsdp_trainer *t = NULL;

    /* every rank parses the same argv, so every rank reaches the same verdict */
    fsdp_train_config_init(&cfg, &set);
    int rc = fsdp_train_config_parse(&cfg, &set, argc, argv);
    if (rc == 1) {
        fsdp_train_config_usage(&set, stdout);
        return 0;
    }
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-train: options", NULL);
    }

    if (cfg.debug > 0) {
        /* read by the debug layer when the first group is created */
        static const char *const levels[] = {"", "OFF", "INFO", "DETAIL"};
        setenv("FSDPC_DEBUG", levels[cfg.debug], 1);
    }
    if (cfg.insecure) {
        setenv("FSDPC_INSECURE", "1", 1); /* read by the rendezvous (dist.h) */
    }
    rc = fsdp_dist_init(&argc, &argv, cfg.init, cfg.timeout, &dist);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-train: rendezvous", NULL);
    }
    if (dist->rank == 0) {
        printf("# fsdpc-train %s configuration (each key: default, file or flag)\n",
               PACKAGE_VERSION);
        fsdp_opt_print(&set, stdout, "");
        fflush(stdout);
    }
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
    rc = fsdp_trainer_run(t);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-train", NULL);
    }
    fsdp_trainer_destroy(t);
    fsdp_dist_finalize(dist);
    return 0;
}
