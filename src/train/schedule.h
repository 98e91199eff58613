/*
 * schedule.h - learning-rate schedules: linear warm-up, then cosine or
 * linear decay to a floor, or constant.
 *
 * For step s (0-based) of S steps with W warm-up steps:
 *   s < W       lr * (s + 1) / W
 *   constant    lr
 *   otherwise   p = (s - W) / (S - W) in [0, 1)
 *               cosine: min + (lr - min) * (1 + cos(pi * p)) / 2
 *               linear: min + (lr - min) * (1 - p)
 * The first step after warm-up runs at the peak; the floor is approached,
 * as in llm.c and nanoGPT, one step past the last.
 */
#ifndef FSDP_TRAIN_SCHEDULE_H
#define FSDP_TRAIN_SCHEDULE_H

#include "train/train_config.h"

struct fsdp_lr_schedule {
    enum fsdp_lr_kind kind;
    double lr;     /* peak */
    double min_lr; /* floor of the decay */
    long warmup;   /* W */
    long steps;    /* S */
};

void fsdp_lr_schedule_init(struct fsdp_lr_schedule *s, const struct fsdp_train_config *c);
/* Learning rate of 0-based step s. */
double fsdp_lr_at(const struct fsdp_lr_schedule *s, long step);
/* "cosine", "linear", "constant". */
const char *fsdp_lr_kind_name(enum fsdp_lr_kind kind);

#endif
