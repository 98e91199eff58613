/*
 * uneven.h - data that does not end at the same step on every rank:
 * per-rank data files ("{rank}" in --data), passes that end at the end of
 * the data instead of wrapping (--epochs), and what a rank that has run out
 * of batches does while others still have some (--uneven join|stop).
 *
 * Before every step all ranks agree, in one small collective that also
 * carries the preemption signal, on which ranks have a batch for it. With
 * join the ranks without one shadow the step (same collectives, zero
 * gradient, no compute) and the gradient and loss are means over the ranks
 * that contributed; a pass ends when no rank has a batch. With stop a pass
 * ends at the first step where any rank has none. After the last pass the
 * loop ends. doc/user-guide.md and doc/debugging.md ("Join for uneven
 * inputs") describe the behaviour; this file holds the bookkeeping only and
 * never touches parameters.
 */
#ifndef FSDP_TRAIN_UNEVEN_H
#define FSDP_TRAIN_UNEVEN_H

#include <stddef.h>
#include <stdint.h>

struct fsdp_ckpt_meta;
struct fsdp_dataloader;
struct fsdp_dataloader_state;
struct fsdp_train_config;
struct fsdp_world;

/* What the plan for uneven inputs needs of the run: its world, this rank's
 * data loader and the settings (the trainer fills it; nothing here reaches
 * the trainer). */
struct fsdp_uneven_run {
    struct fsdp_world *world; /* the agreements' group */
    int rank, size;           /* in the world */
    struct fsdp_dataloader *train;
    const struct fsdp_train_config *cfg;
    int per_rank_data; /* each rank reads its own file ({rank} in --data) */
};

struct fsdp_uneven {
    struct fsdp_uneven_run run;
    int rank, world;
    int join;           /* 1: join, 0: stop */
    int K;              /* micro-batches per step */
    long epochs;        /* passes to run */
    uint64_t *per_pass; /* (world,) steps each rank has in one pass */
    long pass_steps;    /* steps of one pass: the largest (join) or smallest (stop) of per_pass */
    long total_steps;   /* epochs x pass_steps, capped by --steps: what the schedule plans */
    int32_t *vote;      /* (1 + world,) [0]: a rank's signal number; [1 + r]: rank r has a batch */
    int32_t *had;       /* (world,) who contributed to the previous step of this pass */
    int32_t *scratch;   /* (world,) for the log lines */
    int have;           /* this rank has a batch for the next step */
    int n_contrib;      /* ranks that have one */
    int done;           /* the last pass has ended */
};

/*
 * Writes tmpl with every "{rank}" replaced by rank; *per_rank says whether
 * there was one. An unknown "{...}" field is an error naming it.
 */
int fsdp_uneven_path(const char *tmpl, int rank, char *out, size_t len, int *per_rank);

/*
 * With --epochs: learns every rank's steps per pass of run->train (one
 * collective) and plans the run's length; *out NULL without --epochs.
 * Fails when the data gives no step at all (stop: when some rank has none).
 */
int fsdp_uneven_create(const struct fsdp_uneven_run *run, struct fsdp_uneven **out);
void fsdp_uneven_destroy(struct fsdp_uneven *u);

/*
 * The per-step agreement, before step + 1: which ranks have a batch for
 * it, and the highest signal number any rank brings (signalled, 0: none;
 * returned in *preempt). Starts the
 * next pass when this one has ended (then agrees once more) and sets done
 * after the last; logs on rank 0 when ranks start joining and when a pass
 * ends.
 */
int fsdp_uneven_vote(struct fsdp_uneven *u, long step, int signalled, int *preempt);

/* One line for the run header, without newline. */
void fsdp_uneven_describe(const struct fsdp_uneven *u, char *buf, size_t len);

/*
 * Resume with per-rank data files: a checkpoint stores rank 0's cursor
 * only, so every rank recomputes its own from the step count (the loader is
 * deterministic), after checking that the checkpoint's rank count is this
 * run's and that rank 0's recomputed cursor is the stored one (same files,
 * batch-size, seq-len and grad-accum). Replaces *ds; a no-op for a shared
 * data file, whose global cursor is stored whole. Collective; a refusal is
 * FSDP_ERR_ABORTED on every rank with the message on rank 0 only.
 */
int fsdp_uneven_resume_state(const struct fsdp_uneven_run *run, const struct fsdp_uneven *u,
                             const struct fsdp_ckpt_meta *m, struct fsdp_dataloader_state *ds);

#endif
