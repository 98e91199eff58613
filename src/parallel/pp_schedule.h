/*
 * pp_schedule.h - pipeline schedules as tables. A pipeline of P ranks runs
 * S = P V stages (V virtual stages, "chunks", per rank: stage s lives on
 * rank s mod P as its chunk s / P) over M micro-batches. A schedule is, for
 * each rank, the order of its forward (F) and backward (B) passes over
 * (micro-batch, chunk); everything a pipeline run does follows that table,
 * so the table is what the tests compare a run's log against.
 *
 *   gpipe        F0 .. F(M-1), then B0 .. B(M-1): M activations held
 *   1f1b         P - 1 - r warm-up forwards, then one forward and one
 *                backward in turn, then the cool-down backwards: at most
 *                P - r activations held on rank r
 *   interleaved  Megatron's interleaved 1F1B over V chunks per rank
 *                (M a multiple of P): micro-batches go through the chunks
 *                in groups of P, warm-up (P - 1 - r) 2 + (V - 1) P
 *
 * The bubble (idle share of each rank's time, with constant forward and
 * backward times and free communication) is (P - 1) / (M + P - 1) for
 * gpipe and 1f1b and (P - 1) / (V M + P - 1) interleaved; the simulation
 * below runs the tables against their dependencies to check both the
 * absence of deadlock and that bound. Pure bookkeeping: no group, no
 * collective, no model.
 */
#ifndef FSDP_PARALLEL_PP_SCHEDULE_H
#define FSDP_PARALLEL_PP_SCHEDULE_H

#include <stddef.h>

enum fsdp_pp_kind {
    FSDP_PP_GPIPE,
    FSDP_PP_1F1B,
    FSDP_PP_INTERLEAVED,
};

enum fsdp_pp_op {
    FSDP_PP_FWD,
    FSDP_PP_BWD,
};

/* One pass of one rank: micro-batch mb through its chunk (stage
 * chunk P + rank). */
struct fsdp_pp_action {
    enum fsdp_pp_op op;
    int mb;
    int chunk;
};

struct fsdp_pp_schedule {
    enum fsdp_pp_kind kind;
    int P, V, M, rank;
    size_t n;                  /* 2 M V */
    struct fsdp_pp_action *at; /* (n,) in the order the rank runs them */
};

/* "gpipe", "1f1b" or "interleaved" into *out; anything else is one error
 * listing the three. */
int fsdp_pp_kind_parse(const char *s, enum fsdp_pp_kind *out);
const char *fsdp_pp_kind_name(enum fsdp_pp_kind kind);

/* Are (kind, P, V, M) a schedule one can build? One error naming the
 * setting and the fix when not (V > 1 only interleaved; interleaved needs
 * V >= 2 and M a multiple of P). */
int fsdp_pp_check(enum fsdp_pp_kind kind, int P, int V, int M);

/* Rank `rank`'s table into *out (free with fsdp_pp_schedule_free). */
int fsdp_pp_schedule_create(enum fsdp_pp_kind kind, int P, int V, int M, int rank,
                            struct fsdp_pp_schedule *out);
void fsdp_pp_schedule_free(struct fsdp_pp_schedule *s);

/* The stage of action a on s's rank. */
static inline int fsdp_pp_stage(const struct fsdp_pp_schedule *s, const struct fsdp_pp_action *a)
{
    return a->chunk * s->P + s->rank;
}

/* The most forwards whose backward has not yet run, at any point of the
 * table: the activations the rank holds at its peak. */
size_t fsdp_pp_schedule_peak(const struct fsdp_pp_schedule *s);

/* What the schedule promises for that peak on rank `rank`: M for gpipe,
 * min(P - rank, M) for 1f1b, and for interleaved the warm-up plus one,
 * capped at V M. */
size_t fsdp_pp_peak_bound(enum fsdp_pp_kind kind, int P, int V, int M, int rank);

/* The most micro-batches each chunk of s's rank holds between their
 * forward and their backward, into most (V entries, each at least 1):
 * the activation sets a chunk keeps. Returns their sum. */
int fsdp_pp_chunk_holds(const struct fsdp_pp_schedule *s, int *most);

/* The same for rank `rank` of (kind, P, V, M), a schedule one can build
 * (fsdp_pp_check); the sum, or < 0 on error. */
int fsdp_pp_chunk_holds_of(enum fsdp_pp_kind kind, int P, int V, int M, int rank, int *most);

/* The analytical bubble: the idle share of each rank's time. */
double fsdp_pp_bubble(enum fsdp_pp_kind kind, int P, int V, int M);

/* The tables of ranks[0 .. P) as text, one line per rank, cells "F<mb>"
 * or "B<mb>" (with ".<chunk>" when V > 1). Returns the length written
 * (truncated to n - 1 like snprintf). */
size_t fsdp_pp_format(const struct fsdp_pp_schedule *ranks, char *buf, size_t n);

/* The result of running every rank's table against the dependencies. */
struct fsdp_pp_sim {
    int deadlock;    /* 1: some rank waits for ever (stuck names it) */
    int stuck_rank;  /* the first rank that could not go on */
    double makespan; /* end of the last pass */
    double idle_max; /* the largest idle share over the ranks */
    double idle_min; /* the smallest */
};

/*
 * Runs ranks[0 .. P) (one schedule per rank, same kind, P, V, M) with a
 * chunk's forward taking tf and its backward tb: a rank runs its table in
 * order; F(mb, s) starts when F(mb, s - 1) has ended, B(mb, s) when
 * B(mb, s + 1) and F(mb, s) have; communication is free.
 */
int fsdp_pp_simulate(const struct fsdp_pp_schedule *ranks, double tf, double tb,
                     struct fsdp_pp_sim *out);

#endif
