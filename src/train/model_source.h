/*
 * model_source.h - what a program's --model may name: a model file, or a
 * checkpoint (a step directory, a checkpoint root whose `latest` is
 * followed, or a step's index.h5), whose index.h5 is itself a model file of
 * the checkpoint's weights (doc/formats.md). fsdpc-train, fsdpc-sample and
 * fsdpc-ckpt accept the same paths.
 */
#ifndef FSDP_TRAIN_MODEL_SOURCE_H
#define FSDP_TRAIN_MODEL_SOURCE_H

#include <stddef.h>

/*
 * The model file to open for path: path itself unless it is a directory;
 * for a step directory its index.h5, for a checkpoint root the index.h5 of
 * the step `latest` names (as "ROOT/step_N/index.h5"). *ckpt (may be NULL)
 * says whether path named a checkpoint directory. A directory that is
 * neither, or a root whose latest names nothing, is one error naming it.
 */
int fsdp_model_source_resolve(const char *path, char *out, size_t len, int *ckpt);

#endif
