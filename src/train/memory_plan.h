/*
 * memory_plan.h - fsdpc-train --print-memory: what each rank of a run would
 * hold, planned on one process without allocating it. The model is a model
 * file, a checkpoint or a preset name (llama-8b: no file of its size is
 * needed); the mesh is --mesh (no ranks are started); the engine's buffers
 * are sized by the engine itself (fsdp_shard_engine_plan), so the figures
 * are the bytes the engine logs when it is created.
 */
#ifndef FSDP_TRAIN_MEMORY_PLAN_H
#define FSDP_TRAIN_MEMORY_PLAN_H

#include <stdio.h>

#include "train/train_config.h"

/* Prints the plan for c to fp. Errors name the option at fault. */
int fsdp_train_print_memory(const struct fsdp_train_config *c, FILE *fp);

#endif
