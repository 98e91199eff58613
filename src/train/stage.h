/*
 * stage.h - the one way the training layer moves the engine's state
 * between device memory and files: through a host buffer of the device's
 * pinned memory, grown as needed and reused. Nothing in src/train reads or
 * writes a device pointer itself (a guarded device would stop it).
 */
#ifndef FSDP_TRAIN_STAGE_H
#define FSDP_TRAIN_STAGE_H

#include <stddef.h>

struct fsdp_device;
struct fsdp_engine;
struct fsdp_model_spec;
struct fsdp_param_spec;
struct fsdp_stager;

struct fsdp_stage {
    struct fsdp_device *dev;
    float *buf; /* (cap) pinned host memory */
    size_t cap; /* floats */
};

void fsdp_stage_init(struct fsdp_stage *st, struct fsdp_device *dev);
void fsdp_stage_free(struct fsdp_stage *st);
/* Room for n floats in st->buf; what says what for in the error. */
int fsdp_stage_reserve(struct fsdp_stage *st, size_t n, const char *what);
/* The comm layer's stager (comm/group.h) over dev: its pinned host memory,
 * its waited-for copies, and its streams and events for chunked staging. */
void fsdp_stage_stager(struct fsdp_device *dev, struct fsdp_stager *out);

/* n floats of device memory src into st->buf, waited for: *host = st->buf. */
int fsdp_stage_read(struct fsdp_stage *st, const float *src, size_t n, const float **host);
/* n floats at host (st->buf or any host array) to device memory dst,
 * complete when this returns. */
int fsdp_stage_write(struct fsdp_stage *st, float *dst, const float *host, size_t n);
/* The same for a state piece's data, which an engine that offloads keeps in
 * pinned host memory (pc->host): read there directly, written with memcpy. */
struct fsdp_state_piece;
int fsdp_stage_read_piece(struct fsdp_stage *st, const struct fsdp_state_piece *pc, size_t n,
                          const float **host);
int fsdp_stage_write_piece(struct fsdp_stage *st, const struct fsdp_state_piece *pc,
                           const float *host, size_t n);

/* A source of whole rows of a parameter's tensor of one state kind (0: the
 * parameters, 1..: the optimizer's states): rows [row0, row0 + rows) of
 * parameter `param` (spec p) into host memory dst. A model file serves kind
 * 0, a checkpoint every kind it keeps. */
typedef int (*fsdp_row_source)(void *arg, int kind, size_t param, const struct fsdp_param_spec *p,
                               size_t row0, size_t rows, float *dst);
/*
 * Every piece of the engine's state whose kind is below kinds, from read:
 * whole rows through the stage, a block of columns (tensor parallelism) as
 * its rows whole, a few MiB at a time. Local: the caller agrees on the
 * outcome, then tells the engine (state_changed, collective).
 */
int fsdp_stage_fill_pieces(struct fsdp_engine *e, const struct fsdp_model_spec *spec,
                           struct fsdp_device *dev, int kinds, fsdp_row_source read, void *arg);

#endif
