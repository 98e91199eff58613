/*
 * trainer_impl.h - what the trainer's files share (trainer.c,
 * trainer_build.c, trainer_loop.c); nothing outside src/train/trainer*.c
 * includes it.
 */
#ifndef FSDP_TRAIN_TRAINER_IMPL_H
#define FSDP_TRAIN_TRAINER_IMPL_H

#include "train/trainer.h"
#include "io/h5/model_file.h"
#include "io/text/tokens.h"

/* Seconds since the epoch, for the metrics file's timestamps. */
double fsdp_trainer_wall(void);

int fsdp_trainer_world(const struct fsdp_trainer *t);

int fsdp_trainer_rank(const struct fsdp_trainer *t);

/*
 * This rank's place among the data-parallel ranks, from --mesh: its
 * coordinates in every dimension but tp, row-major (the order the mesh
 * lays ranks out in), so that tp peers read the same batch and the global
 * batch is batch-size x the product of the other dimensions. A mesh that
 * does not parse or cover the world is left to the mesh's own checks.
 */
void fsdp_trainer_data_place(struct fsdp_trainer *t);

/*
 * A device that keeps an arena (a GPU's) takes this rank's whole memory
 * plan at once: plan bytes (its engine's, or its pipeline rank's, with the
 * checkpoint re-layout), the step's batches and room for the kernel
 * table's own workspaces; so no step allocates from the runtime. Nothing
 * on a device without one.
 */
int fsdp_trainer_reserve(struct fsdp_trainer *t, size_t plan);
/* This rank's place in its shard and tensor-parallel groups, the shape a
 * memory plan is made for (one rank's without a mesh). */
struct fsdp_shard_shape fsdp_trainer_shard_shape(const struct fsdp_trainer *t);
/* The room fsdp_trainer_reserve adds for the kernel table's own workspaces
 * (cuBLASLt's workspace and staging, the norms' partial sums, the cast
 * chunk). */
#define FSDP_TRAINER_KERNEL_ROOM ((size_t)256 << 20)
/* Prefixes the recorded error message with the option it concerns. */
int fsdp_trainer_blame(int rc, const char *what);

/* Phase 1: what each rank can check alone; the model file stays open. */
int fsdp_trainer_check_inputs(struct fsdp_trainer *t, struct fsdp_model_file **mf);

/*
 * Phase 2: the device, the mesh, the world group (each agreed on before the
 * next, which is collective), then the engine and its parameters.
 */
int fsdp_trainer_build_engine(struct fsdp_trainer *t, fsdp_engine_factory factory,
                              struct fsdp_model_file *mf);

/*
 * Token file for the model: vocabulary checked, one batch must fit. A
 * shared file is sliced over the ranks; with {rank} in path each rank reads
 * its own file whole (as rank 0 of 1). *per_rank: which of the two.
 */
int fsdp_trainer_open_data(struct fsdp_trainer *t, const char *path, const char *what,
                           struct fsdp_dataloader **out, int *per_rank);

int fsdp_trainer_open_val(struct fsdp_trainer *t);

void fsdp_trainer_close_engine(struct fsdp_trainer *t);

/* Phase 3 on rank 0: the metrics file and its start record. */
int fsdp_trainer_open_metrics(struct fsdp_trainer *t);

int fsdp_trainer_peak(struct fsdp_trainer *t);

#endif
