/*
 * pipeline.h - what the trainer's pipeline composition (pipeline.c) shares
 * with the memory plan (memory_plan.c), so that --print-memory sizes each
 * pipeline rank as a run builds it: the stage split and a rank's units.
 */
#ifndef FSDP_TRAIN_PIPELINE_H
#define FSDP_TRAIN_PIPELINE_H

#include "train/trainer.h"
#include "parallel/fsdp.h"

struct fsdp_model_spec;

/* The split of L layers over S = P V stages into first (S + 1):
 * --pp-layers, or the one whose largest stage holds the least parameter
 * state (16 bytes an element: master, gradient, two AdamW moments). */
/* What a pipeline stage's model must be: an architecture that can be cut
 * into stages, tying at most the head to the embedding. One error naming
 * the tie or the architecture. */
int fsdp_train_pp_check_model(const struct fsdp_model_spec *spec, int P);
int fsdp_train_pp_split(const struct fsdp_model_spec *spec, const struct fsdp_train_config *c,
                        int P, int V, int *first);

/* The units rank s of P holds (its V stages', and with a tied head on the
 * last rank a copy of unit 0), into mask (n_units), and sc's unit range
 * (stage s's) and mask (V > 1 or tied; else NULL) for its sharding engine;
 * sc borrows mask. */
void fsdp_train_pp_units(const int *first, int P, int V, int s, int tied, int n_units,
                         unsigned char *mask, struct fsdp_shard_config *sc);

#endif
