/*
 * pp_engine.h - the pipeline-parallel runtime behind the engine table
 * (engine.h): a rank holds its stages of the model (blocks of units,
 * pp_plan.h: one stage under gpipe and 1f1b, V under interleaved, stage
 * c P + r on rank r) sharded over its data-parallel groups by one sharding
 * engine restricted to those units (fsdp.h, unit_lo/unit_hi or unit_mask),
 * and runs its passes of the step's M micro-batches in the order its
 * schedule's table gives (pp_schedule.h), with the messages around each
 * pass in the order pp_comm.h derives.
 *
 *   forward   a stage after the first receives the residual stream at its
 *             input from the previous stage (B x T x C floats), runs its
 *             units, and sends its output on; the last computes the loss
 *   backward  the last stage starts from the loss, the others from the
 *             residual's gradient received from the next stage; each sends
 *             the gradient of its input back (not stage 0)
 *
 * Activations travel on pp, gradients on a second group of the same ranks
 * (pc->grad); each send is copied into its direction's slot and left in
 * flight while the rank computes, waited for before the slot is written
 * again and at the end of the step's passes (pp_comm.h: the order).
 *
 * Activations: each chunk keeps one model instance per micro-batch it may
 * hold between its forward and its backward (the schedule's most,
 * fsdp_pp_chunk_holds: 1f1b's stage s up to P - s, gpipe M), all cut at
 * the chunk's units and bound at each use to the sharding engine's
 * gathered parameters and gradient buffers. A forward takes a free
 * instance and keeps its activations there; the micro-batch's backward
 * runs on that instance and frees it, so no forward runs twice. With
 * activation checkpointing each instance keeps only its checkpointed
 * blocks' inputs, which their backward recomputes, as without pp. The
 * received stage inputs stay in their slots until the backward, as the
 * pool sizes count them (pp_comm.h).
 *
 * A head tied to the embedding: the last stage's rank holds a copy of unit
 * 0; the copies' gradients are summed before the update, the norm counts
 * the embedding once, checkpoints take rank 0's.
 *
 * The step's loss is summed over the stages (only the last has one) and
 * the data-parallel ranks, the squared gradient norm over the stages too,
 * so every rank reports and clips by the whole model's. A step without a
 * batch (join) is a shadow step of the whole pipeline: the stages run
 * their tables with the sharding engine's shadow passes and no boundary
 * messages (pp_step checks that the pipeline's stages agree). With
 * FSDPC_LOG=fsdp=debug each rank logs, per step, the order its passes ran
 * in and the most inputs it held, and the stage forwards it ran (M V: none
 * twice). Opens no file, reads no data.
 */
#ifndef FSDP_PARALLEL_PP_ENGINE_H
#define FSDP_PARALLEL_PP_ENGINE_H

#include "parallel/engine.h"
#include "parallel/pp_schedule.h"

struct fsdp_group;
struct fsdp_model;

struct fsdp_pp_config {
    enum fsdp_pp_kind kind;
    int V;            /* stages per rank (chunks; more than 1: interleaved) */
    int M;            /* micro-batches per step (the batch's K) */
    const int *first; /* (P V + 1,) first layer of each stage; first[P V] = L */
    size_t C;         /* width of the residual stream at the stage boundaries */
    int root_line;    /* this rank's pipeline group holds world rank 0 (its other
                         coordinates are all 0): gather_unit brings units there */
    int tied;         /* the head reads the embedding's table (a tie to unit 0): the
                         last stage's rank holds a copy of unit 0 (its engine holds it
                         too), and the two copies' gradients are summed before the
                         update, so that both take the same step */
    int n_models;     /* models' length: every chunk's instances (fsdp_pp_chunk_holds' sum) */
    struct fsdp_group *grad; /* the pipeline group's ranks again, a communicator of
                                their own for the gradients (backward direction), so
                                that they never queue behind activations; taken */
};

/*
 * The pipeline engine over the pipeline group pp (rank r runs stages
 * c P + r, c < V) around inner, a sharding engine made for those stages'
 * units, and pc->n_models model instances: chunk 0's, then chunk 1's, ...,
 * as many of each as fsdp_pp_chunk_holds says for this rank, each cut at
 * its chunk's units (set_stage applied, not reserved: the engine mirrors
 * the inner engine's unit 0 by rows on chunk 0's and reserves them; the
 * first is the inner engine's parts' model, borrowed, the others become
 * the engine's), with the gradients on pc->grad. Takes inner, models[1 ..]
 * and pc->grad: they are destroyed with the engine, also on failure.
 * Collective over pp.
 */
int fsdp_pp_engine_create(struct fsdp_engine *inner, struct fsdp_model *const *models,
                          struct fsdp_group *pp, const struct fsdp_pp_config *pc,
                          struct fsdp_engine **out);

/* The units [*lo, *hi] stage s of S holds, for layers split at first
 * (S + 1 entries) of a model with L layers (units 0 .. L + 1). */
void fsdp_pp_stage_units(const int *first, int P, int s, int *lo, int *hi);

#endif
