/*
 * ckpt_cadence_impl.h - what saving (ckpt_cadence.c) and resuming
 * (ckpt_resume.c) share: the cadence's state and a few helpers.
 */
#ifndef FSDP_TRAIN_CKPT_CADENCE_IMPL_H
#define FSDP_TRAIN_CKPT_CADENCE_IMPL_H

#include "train/ckpt_cadence.h"
#include "train/save_progress.h"
#include "train/train_config.h"

#define CAD_PATH_MAX 4096
#define CAD_MAX_STEPS 4096

struct fsdp_ckpt_cadence {
    struct fsdp_ckpt_run run;
    char dir[FSDP_TRAIN_PATH_MAX]; /* the checkpoint root D */
    int rank;
    long last_saved;   /* step of the last committed checkpoint; -1: none */
    long last_tried;   /* step of the last save attempt; -1: none */
    long resumed_from; /* step this run resumed from; -1: it started afresh */
    /* (n_foreign) rank 0: the step directories in D at the start that this
     * run has not written since; those above resumed_from are another
     * lineage's, which retention neither counts nor removes */
    long *foreign;
    size_t n_foreign;
    int warned_foreign;                 /* the warning about them is logged once */
    int existed;                        /* rank 0: D was there before this run */
    struct fsdp_save_progress progress; /* of the save under way */
};

/* Bytes of the regular files directly under dir (a checkpoint step's
 * shards and index), for the throughput figure in the log; 0 when unreadable. */
double fsdp_cad_dir_bytes(const char *dir);

/* "1.40 GiB in 1.75 s, 0.86 GB/s" */
void fsdp_cad_rate_str(double bytes, double secs, char *buf, size_t n);

/* Steps of D's step_<N> directories, at most cap; *n of them. */
int fsdp_cad_list_steps(const char *dir, long *steps, size_t cap, size_t *n);

int fsdp_cad_cmp_desc(const void *a, const void *b);

/*
 * --ckpt-keep K over this run's lineage: the steps it wrote, the one it
 * resumed from and those below that. Of these only the newest K stay, and
 * never current (which latest names). A step above resumed_from that this
 * run did not write belongs to a run that went further before this one
 * was resumed from an older step; counting it would delete this run's own
 * checkpoints (its resume point first) to keep that abandoned run's, so it
 * is left alone, with a warning.
 */
int fsdp_cad_retain(struct fsdp_ckpt_cadence *c, long keep, long current, unsigned nonce);

#endif
