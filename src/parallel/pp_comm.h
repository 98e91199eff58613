/*
 * pp_comm.h - the order of a pipeline rank's messages around its passes.
 * A rank receives a pass's input before running it (a forward's
 * activation from the previous stage, a backward's gradient from the next)
 * and sends its output after (the activation to the next stage, the
 * input's gradient to the previous).
 *
 * The runtime it orders (pp_engine.c): activations travel on the pipeline
 * group and gradients on a second group of the same ranks, so that one
 * never queues behind the other; a send is copied into its direction's
 * slot and goes on while the rank computes (the slot's previous send is
 * waited for before it is written again); a receive is waited for where it
 * is issued. The queue model the order is checked on: each rank's
 * operations on a group start one at a time in issue order (the tcp
 * backend's way), and a send completes only when its receiver takes it (a
 * message larger than the socket buffers). Each send then comes right
 * after its pass (for gpipe and 1f1b no receive needs to move: 1f1b's
 * steady state is F sF rB B sB rF, its bubble the schedule's); where the
 * plain order still hangs (interleaved, whose last stage's activations go
 * round to rank 0 and can face rank 0's on the same group), every rank's
 * order is run on the model and, wherever all ranks wait, the first rank
 * with a send in flight whose later receive meets a peer's send in flight
 * posts that receive before its own send, and the run starts over: the
 * same on every rank. A receive may so come some passes before its own
 * (the runtime holds as many received buffers as the steps need).
 * fsdp_pp_steps_run checks any order on the model. Pure bookkeeping: no
 * group, no model.
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
 * plain order (receive, run, send), 1 the derived order above. Interleaved
 * needs at least 2 ranks (one error).
 */
int fsdp_pp_steps_create(const struct fsdp_pp_schedule *s, int parity, struct fsdp_pp_step **out,
                         size_t *n);

/* The tag of the message that carries action a's output or input: the
 * forward or backward, the micro-batch and the sending stage. */
unsigned fsdp_pp_tag(const struct fsdp_pp_action *a, int from_stage);

/*
 * Runs every rank's steps (steps[r], n[r] of them, from ranks[r]) on the
 * queue model above: *deadlock 1 (and *stuck the first rank that could not
 * finish) when some rank waits for ever; an error when a send meets a
 * receive of another message.
 */
int fsdp_pp_steps_run(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                      const size_t *n, int *deadlock, int *stuck);

/*
 * The most received stage inputs (*held) and received output gradients
 * (*grads) rank s->rank holds at once running steps (n of them), each at
 * least 1: the runtime's buffer slots, and the memory plan's. A message is
 * held from its receive to its pass, which copies it into the model
 * instance the pass runs on (an input into the activation set its forward
 * takes, a gradient into the set its backward runs on); a receive may
 * come some passes before its pass.
 */
void fsdp_pp_pool_sizes(const struct fsdp_pp_schedule *s, const struct fsdp_pp_step *steps,
                        size_t n, size_t *held, size_t *grads);

/* Which directions rank s->rank sends in running steps: dirs[0] activations
 * (forward), dirs[1] gradients (backward); each needs one send slot. */
void fsdp_pp_send_dirs(const struct fsdp_pp_schedule *s, const struct fsdp_pp_step *steps, size_t n,
                       int dirs[2]);

#endif
