/*
 * oracle_engine.h - a single-rank engine for tests: whole tensors in one
 * process, the plainest implementation of the engine table
 * (src/parallel/engine.h). The sharding engine must equal it on one rank, and it
 * is what the PyTorch comparison reads gradients and moments from.
 */
#ifndef FSDP_TESTS_ORACLE_ENGINE_H
#define FSDP_TESTS_ORACLE_ENGINE_H

#include "parallel/engine.h"
#include "optim/optim.h"

struct fsdp_model;

/* spec is borrowed; parameters start at zero (the caller loads them). */
int fsdp_oracle_engine_create(const struct fsdp_model_spec *spec, int B, int T, int head_chunk,
                              const struct fsdp_optim_config *oc, struct fsdp_engine **out);
/* The averaged gradient of unit u from the last step, before clipping. */
const float *fsdp_oracle_engine_grads(const struct fsdp_engine *e, int unit);
const float *fsdp_oracle_engine_params(const struct fsdp_engine *e, int unit);
void fsdp_oracle_engine_moments(const struct fsdp_engine *e, int unit, const float **m,
                                const float **v);
struct fsdp_model *fsdp_oracle_engine_model(const struct fsdp_engine *e);

#endif
