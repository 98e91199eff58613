/*
 * pp_plan.h - which transformer layers each pipeline stage holds. Stages
 * are contiguous blocks of layers, the embedding with the first and the
 * final norm, head and loss with the last; a stage's memory is its
 * parameters and optimizer state plus the activations of the micro-batches
 * it holds at its peak (pp_schedule.h: under 1f1b the first stage holds the
 * most). The plan either balances that memory (the largest stage as small
 * as it can be) or takes the layer counts the user gives (--pp-layers
 * 5,6,6,5). Pure bookkeeping: no group, no model, no file.
 */
#ifndef FSDP_PARALLEL_PP_PLAN_H
#define FSDP_PARALLEL_PP_PLAN_H

#include <stddef.h>

/* What each piece of the model costs a stage, in bytes. */
struct fsdp_pp_costs {
    int L;               /* transformer layers */
    const double *param; /* (L,) each layer's parameters and optimizer state */
    const double *act;   /* (L,) each layer's saved activations of one micro-batch */
    double first, last;  /* the embedding's state (first stage); the head's and norm's (last) */
    double first_act, last_act; /* their activations of one micro-batch */
};

/* The bytes stage s holds when it has layers [a, b) and `held` micro-batches
 * of activations at its peak, of P stages. */
double fsdp_pp_stage_bytes(const struct fsdp_pp_costs *c, int s, int P, int a, int b, size_t held);

/*
 * The contiguous split of c's layers over P stages (every stage at least
 * one layer) whose largest stage is smallest, with held[s] micro-batches
 * held on stage s (P entries). first[0 .. P] gets each stage's first layer
 * (first[P] = L); *peak (unless NULL) the largest stage's bytes. One error
 * when P stages cannot each have a layer.
 */
int fsdp_pp_partition(const struct fsdp_pp_costs *c, int P, const size_t *held, int *first,
                      double *peak);

/* --pp-layers "5,6,6,5": P counts of at least one layer summing to L, into
 * first[0 .. P]; anything else is one error naming what is wrong. */
int fsdp_pp_layers_parse(const char *s, int L, int P, int *first);

#endif
