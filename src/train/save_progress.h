/*
 * save_progress.h - what a checkpoint save says while it runs: a line when
 * it starts (so a pause in the step lines has a reason), and on a save
 * that takes longer than a few seconds, how far rank 0's shard has got.
 * Rank 0 alone prints; other ranks keep the counts silently.
 */
#ifndef FSDP_TRAIN_SAVE_PROGRESS_H
#define FSDP_TRAIN_SAVE_PROGRESS_H

#include <stddef.h>

struct fsdp_save_progress {
    long step;
    int print;      /* rank 0 */
    double t0;      /* when the save started */
    double every;   /* seconds between progress lines ($FSDPC_SAVE_PROGRESS_S, default 5) */
    double next;    /* when the next one is due */
    size_t done;    /* tensors (or pieces) of this rank's shard written */
    size_t total;
};

/* Logs "checkpoint step N: saving to DIR ..." on rank 0. */
void fsdp_save_progress_start(struct fsdp_save_progress *p, int rank, long step, const char *dir);
/* This rank's shard has `total` tensors to write (0: it writes none). */
void fsdp_save_progress_total(struct fsdp_save_progress *p, size_t total);
/* One more written; a progress line when one is due. */
void fsdp_save_progress_tick(struct fsdp_save_progress *p);

#endif
