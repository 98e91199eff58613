/*
 * pp_comm.h - the order of a pipeline rank's messages around its passes.
 * A rank receives a pass's
 * input before running it (a forward's activation from the previous stage,
 * a backward's gradient from the next) and sends its output after (the
 * activation to the next stage, the input's gradient to the previous).
 *
 * Two ranks must not both wait in a send to each other before their
 * receives (a backend that runs a group's operations one at a time, or
 * sends that wait for their receiver, would hang). In 1f1b's steady state
 * rank r ends a forward sending to r + 1 and starts a backward receiving
 * from r + 1, while r + 1 ends a backward sending to r and starts a
 * forward receiving from r: head on; interleaved schedules add the ring
 * from the last rank back to rank 0. The order is therefore derived, the
 * same on every rank: all ranks' plain orders run against sends that wait
 * for their receiver, and wherever every rank waits, the first rank whose
 * waiting send has a later receive that its peer's waiting send would meet
 * takes that receive first. A receive may so come some passes before its
 * own (the runtime holds as many received buffers as the steps need).
 * fsdp_pp_steps_run checks any order against rendezvous sends. Pure
 * bookkeeping: no group, no model.
 */
#ifndef FSDP_PARALLEL_PP_COMM_H
#define FSDP_PARALLEL_PP_COMM_H

#include <stddef.h>

#include "parallel/pp_schedule.h"

enum fsdp_pp_step_kind {
    FSDP_PP_RECV, /* the input of action `act` from rank peer */
    FSDP_PP_RUN,  /* action `act` itself */
    FSDP_PP_SEND, /* the output of action `act` to rank peer */
};

struct fsdp_pp_step {
    enum fsdp_pp_step_kind kind;
    int act;  /* index into the schedule's table */
    int peer; /* the pipeline rank at the other end; -1 for RUN */
};

/*
 * s's table as steps into *out (free()), *n of them; parity 0 gives the
 * plain order (receive, run, send: the one that hangs), 1 the derived
 * order above. Interleaved needs at least 2 ranks (one error).
 */
int fsdp_pp_steps_create(const struct fsdp_pp_schedule *s, int parity, struct fsdp_pp_step **out,
                         size_t *n);

/* The tag of the message that carries action a's output or input: the
 * forward or backward, the micro-batch and the sending stage. */
unsigned fsdp_pp_tag(const struct fsdp_pp_action *a, int from_stage);

/*
 * Runs every rank's steps (steps[r], n[r] of them, from ranks[r]) with
 * sends that complete only when their receiver takes them: *deadlock 1
 * (and *stuck the first rank that could not go on) when some rank waits
 * for ever; an error when a send meets a receive of another message.
 */
int fsdp_pp_steps_run(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                      const size_t *n, int *deadlock, int *stuck);

/*
 * The most received stage inputs (*held) and received output gradients
 * (*grads) rank s->rank holds at once running steps (n of them), each at
 * least 1: the runtime's buffer slots, and the memory plan's. A receive may
 * come some passes before its pass, so this can exceed the schedule's bound
 * of forwards in flight by the receives taken early.
 */
void fsdp_pp_pool_sizes(const struct fsdp_pp_schedule *s, const struct fsdp_pp_step *steps,
                        size_t n, size_t *held, size_t *grads);

#endif
