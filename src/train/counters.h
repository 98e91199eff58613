/*
 * counters.h - where a run stands: the steps done, the tokens trained on,
 * and the checkpoint it resumed from. The trainer owns them and advances
 * them after each step; resuming (ckpt_cadence.h) sets them from a
 * checkpoint and saving records them in one, through a pointer to these
 * alone.
 */
#ifndef FSDP_TRAIN_COUNTERS_H
#define FSDP_TRAIN_COUNTERS_H

#include "train/train_config.h"

struct fsdp_run_counters {
    long step;          /* optimizer steps done, resumed runs included */
    double tokens_seen; /* training tokens of every rank, resumed runs included */
    long resumed_from;  /* -1: started from the model file */
    char resumed_dir[FSDP_TRAIN_PATH_MAX]; /* the step directory resumed from */
};

#endif
