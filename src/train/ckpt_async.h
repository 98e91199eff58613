/*
 * ckpt_async.h - a checkpoint shard written in the background: this rank's
 * state pieces (the f32 master shard and the optimizer's state) copied into
 * a snapshot, host memory from the device's pinned allocation made once and
 * reused, then a thread that writes the shard file from the snapshot through
 * io's writer (create, put every piece, commit: written and fsynced) while
 * the training loop goes on.
 *
 * The thread calls io and the file system only: no collective, no device
 * call; whether every rank's write is done is agreed by the caller's main
 * thread (ckpt_cadence.c). HDF5 is built without thread safety, so the
 * process makes no other HDF5 call between fsdp_ckpt_async_start and the
 * fsdp_ckpt_async_wait that follows it: the cadence writes the index after
 * the wait, and every other save, the --out model and the end of the run
 * wait first (fsdp_ckpt_cadence_wait). Nothing the loop calls between
 * steps (token files, the metrics file, the flight recorder) uses HDF5.
 *
 * A tensor-parallel engine's pieces are blocks, not whole rows: its
 * snapshot is the rows of its checkpoint shard, every tensor re-laid out
 * into it by save_rows (collective: the snapshot is then collective too,
 * and the exchange is the loop's stall); the thread writes them as it
 * writes any rows.
 */
#ifndef FSDP_TRAIN_CKPT_ASYNC_H
#define FSDP_TRAIN_CKPT_ASYNC_H

#include <stddef.h>

struct fsdp_ckpt_async;
struct fsdp_device;
struct fsdp_engine;
struct fsdp_model_spec;
struct fsdp_save_progress;

/* Bytes of e's snapshot on this rank: every piece it holds (0 on a rank
 * that writes no shard). */
size_t fsdp_ckpt_async_bytes(struct fsdp_engine *e, const struct fsdp_model_spec *spec);

/* The snapshot buffer (pinned host memory of dev) and the writer's state. */
int fsdp_ckpt_async_create(struct fsdp_engine *e, const struct fsdp_model_spec *spec,
                           struct fsdp_device *dev, struct fsdp_ckpt_async **out);
/* Waits for a write under way (its file stays for the next start's
 * recovery when it was not committed), then frees everything. */
void fsdp_ckpt_async_destroy(struct fsdp_ckpt_async *a);

/* Copies every piece into the snapshot; returns once the host holds them.
 * Local, but for a tensor-parallel engine (e->blocks), where it re-lays out
 * every tensor (save_rows) and is collective: every rank calls it, one
 * that will write nothing too. Not while a write is under way. */
int fsdp_ckpt_async_snapshot(struct fsdp_ckpt_async *a);

/*
 * Starts the thread that writes shard_<e->shard>.h5 of step into dir from
 * the snapshot, ticking p (the cadence's, untouched by the caller until the
 * wait). A rank that writes no shard starts nothing and is done at once.
 */
int fsdp_ckpt_async_start(struct fsdp_ckpt_async *a, const char *dir, long step,
                          struct fsdp_save_progress *p);

/* 1 when the write started last is finished (or none is under way), 0
 * while it runs; never blocks. */
int fsdp_ckpt_async_done(struct fsdp_ckpt_async *a);

/* Waits for the write to finish; its outcome, with the writer's message
 * and hint recorded in the caller's thread on failure. *write_s: seconds
 * the write took (NULL: not wanted). */
int fsdp_ckpt_async_wait(struct fsdp_ckpt_async *a, double *write_s);

#endif
