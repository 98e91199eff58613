/*
 * mesh_check.h - a --mesh checked before anything is built for it: the
 * dimension names the trainer uses (with the nearest one for a typo), the
 * world size, and that the model splits over its tp. Each refusal carries
 * a hint with a --mesh that works.
 */
#ifndef FSDP_TRAIN_MESH_CHECK_H
#define FSDP_TRAIN_MESH_CHECK_H

#include "comm/mesh_spec.h"
#include "core/spec.h"

/* The names of d are the trainer's (dp, rdp, tp) and one shards (dp). */
int fsdp_trainer_mesh_check(const struct fsdp_mesh_dims *d);

/* mesh (the --mesh text) parsed and checked by name, against world ranks,
 * and, with a tp dimension, against how spec's architecture splits. */
int fsdp_trainer_mesh_precheck(const char *mesh, const struct fsdp_model_spec *spec, int world);

#endif
