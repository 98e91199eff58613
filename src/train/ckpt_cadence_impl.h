/*
 * ckpt_cadence_impl.h - what the cadence (ckpt_cadence.c), a save
 * (ckpt_save.c) and resuming (ckpt_resume.c) share: the cadence's state
 * and a few helpers.
 */
#ifndef FSDP_TRAIN_CKPT_CADENCE_IMPL_H
#define FSDP_TRAIN_CKPT_CADENCE_IMPL_H

#include "train/ckpt_cadence.h"
#include "train/save_progress.h"
#include "train/train_config.h"
#include "io/ckpt/ckpt.h"

#define CAD_PATH_MAX 4096
#define CAD_MAX_STEPS 4096

struct fsdp_ckpt_async;

/* The save under way (ckpt_save.c). */
struct cad_pending {
    long step;
    unsigned nonce;
    char tmp[CAD_PATH_MAX]; /* D/.tmp_step_<N>_<nonce> */
    double t0;              /* when it began */
    double stall_s;         /* background: what the loop spent on it (snapshot included) */
    int background;         /* the shard is written by the writer thread */
    int rc;                 /* this rank's failure before its write started; msg, hint: why */
    char msg[1024], hint[512];
};

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
    struct fsdp_ckpt_async *async;      /* snapshot and writer thread; NULL: saves in the loop */
    struct cad_pending cur;             /* the last save begun */
    struct fsdp_ckpt_meta meta;         /* its run state, as of its step */
    int in_flight;                      /* cur is being written in the background */
};

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

/* Rank 0: tmp -> step_<N>, latest -> step_<N>, then retention. */
int fsdp_cad_commit(struct fsdp_ckpt_cadence *c, const char *tmp, long step, unsigned nonce,
                    long keep);

/* A save of the step just done: in the background when asked and c has a
 * writer (started: the loop goes on), else here, committed on return. A
 * failure comes back agreed (FSDP_ERR_ABORTED on every rank). _checked:
 * with ckpt-keep-going a failure is a warning and 0. Collective. */
int fsdp_cad_save(struct fsdp_ckpt_cadence *c, int background);
int fsdp_cad_save_checked(struct fsdp_ckpt_cadence *c, int background);

/* The save in flight, if any: wait 0 agrees on whether every rank's write
 * is done (one small all-reduce) and commits it if so; wait 1 waits for
 * this rank's write and commits. Every rank calls it with the same wait.
 * Failures as fsdp_cad_save_checked. Collective. */
int fsdp_cad_poll(struct fsdp_ckpt_cadence *c, int wait);

#endif
