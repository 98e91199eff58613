/*
 * world.h - the training loop's own collectives over every rank: the
 * per-step vote, the checkpoint nonce and outcome, barriers, gathers of
 * one value per rank. A process group of its own ("world"), apart from the
 * engine's groups, so that the loop never borrows the model-state engine to
 * talk. With one rank (no group) every call is local.
 */
#ifndef FSDP_TRAIN_WORLD_H
#define FSDP_TRAIN_WORLD_H

#include <stdint.h>

struct fsdp_dist;
struct fsdp_group;
struct fsdp_backend_ops;

struct fsdp_world {
    int rank, size;
    struct fsdp_group *g; /* NULL with one rank */
};

/* Collective over d's world (d NULL: one rank), served by backend ops. */
int fsdp_world_create(struct fsdp_dist *d, const struct fsdp_backend_ops *ops,
                      struct fsdp_world **out);
void fsdp_world_destroy(struct fsdp_world *w);

/* Element-wise maximum of v[0..n) over every rank, in place. */
int fsdp_world_max(struct fsdp_world *w, int32_t *v, int n);
/* Element-wise minimum of v[0..n) over every rank, in place. */
int fsdp_world_min(struct fsdp_world *w, int32_t *v, int n);
/* Every rank's x, in rank order, into v[0..size). */
int fsdp_world_allgather(struct fsdp_world *w, int32_t x, int32_t *v);
/* root's *x on every rank. */
int fsdp_world_broadcast(struct fsdp_world *w, int32_t *x, int root);
int fsdp_world_barrier(struct fsdp_world *w);
/* Whether any rank failed (rc < 0 there): 1 on every rank if so. */
int fsdp_world_any_failed(struct fsdp_world *w, int rc, int *any);

/*
 * Who failed, and who reports it: every rank brings its state (0: fine; 1:
 * failed, with nothing to say because another rank reports it; 2: failed,
 * with a message to report). On every rank *first becomes the lowest rank of
 * state 2 (-1: none) and *n the number of ranks that failed. fsdp_world_agree
 * runs over the world group; fsdp_world_agree_store over the job's
 * rendezvous store, for setup before any group exists (d NULL or one rank:
 * this rank alone). name tells successive store agreements apart and must be
 * the same on every rank. Neither records an error unless the agreement
 * itself fails.
 */
int fsdp_world_agree(struct fsdp_world *w, int state, int *first, int *n);
int fsdp_world_agree_store(struct fsdp_dist *d, const char *name, int state, int *first, int *n);

/*
 * Agreement on an outcome whose value on this rank is rc: 0 when no rank
 * failed; otherwise FSDP_ERR_ABORTED on every rank, the message kept (with
 * the class of its error appended, and how many ranks failed when not all
 * did) by the lowest rank that has one and cleared on the others, which log
 * "rank R could not WHAT; it reports why" at info level. Only an agreement
 * that itself fails (a peer lost) leaves another code: this rank's error,
 * which need not have happened elsewhere. Collective over w;
 * fsdp_world_outcome_store over the rendezvous store (name as for
 * fsdp_world_agree_store), for setup before the world group exists.
 */
int fsdp_world_outcome(struct fsdp_world *w, int rc, const char *what);
int fsdp_world_outcome_store(struct fsdp_dist *d, const char *name, int rc, const char *what);

#endif
