/*
 * trainer.h - the composition root and the training loop. The trainer
 * builds the mesh and its groups (and a world group for its own votes and
 * barriers), the model's parameter table (by the file's architecture, from
 * the registry), the engine that holds the model state (the sharding
 * engine, fsdp.h), whose parameters it loads from the model file through
 * the engine's state pieces, and the data loaders; then it runs the loop:
 * the learning-rate schedule, batches handed to the engine as arrays, step
 * lines and metrics, validation, checkpoints and the final model file.
 *
 * Model- and data-dependent checks happen at create: seq-len against the
 * model's context, every token against the model's vocabulary, one global
 * batch fitting the token file. Each failure is one error naming the file
 * and the value.
 */
#ifndef FSDP_TRAIN_TRAINER_H
#define FSDP_TRAIN_TRAINER_H

#include "comm/group.h"
#include "train/train_config.h"
#include "parallel/engine.h"
#include "train/metrics.h"
#include "train/schedule.h"
#include "train/world.h"
#include "train/counters.h"

struct fsdp_dist;
struct fsdp_mesh;
struct fsdp_device;
struct fsdp_trainer;
struct fsdp_train_parts;

/* Makes the engine for t (t->spec, t->mesh are set). */
typedef int (*fsdp_engine_factory)(struct fsdp_trainer *t, struct fsdp_engine **out);

struct fsdp_trainer {
    const struct fsdp_train_config *cfg;
    struct fsdp_dist *dist;        /* NULL: one rank, no launcher */
    struct fsdp_mesh *mesh;        /* NULL on one rank without a --mesh */
    struct fsdp_world *world;      /* the loop's own collectives */
    struct fsdp_model_spec *spec;  /* the model's parameter table */
    struct fsdp_device *dev;       /* where the engine's state lives and computes */
    struct fsdp_stager stager;     /* the mesh's groups stage dev's memory through it where
                                      their backends cannot take it */
    struct fsdp_engine *engine;
    struct fsdp_train_parts *parts; /* what the sharding engine applies to (train/parts.h):
                                       destroyed after it; NULL with another engine */
    int32_t *batch_in, *batch_tgt; /* (K, B, T) this step's micro-batches */
    struct fsdp_dataloader *train; /* this rank's slice of each global batch */
    struct fsdp_dataloader *val;   /* NULL without val-data */
    struct fsdp_metrics *metrics;  /* rank 0 only; NULL elsewhere */
    struct fsdp_lr_schedule sched;
    double peak_flops;             /* per rank, FLOP/s */
    char peak_method[128];         /* how peak_flops was obtained */
    int peak_beaten;               /* a step ran above peak_flops (said once) */
    struct fsdp_run_counters count; /* step, tokens seen, resume point */
    long val_batches;              /* per validation, capped to what the file holds */
    double last_loss;
    double last_val_loss;          /* NaN until a validation ran */
    double train_seconds;          /* wall time inside this run's steps */
    double first_step_s;           /* of those, this run's first step (left out of the ETA) */
    double side_seconds;           /* wall time of this run's validations and checkpoint saves
                                      between steps (spread over the steps in the ETA) */
    struct fsdp_ckpt_cadence *ckpt; /* NULL without ckpt-dir */
    struct fsdp_uneven *uneven;    /* NULL without epochs: the data wraps around */
    int per_rank_data;             /* data names one file per rank ({rank}) */
    long total_steps;              /* steps the run plans (the schedule's length) */
    double run_tokens;             /* of those, the ones this run trained on */
    char model_path[FSDP_TRAIN_PATH_MAX]; /* the file read: --model, or a checkpoint's index.h5 */
    long start_step;                      /* step this run started at: 0, or the step resumed */
    int stopped_by;                /* the signal that stopped the run early (agreed), 0: none */
    char run_id[24];               /* random per run, in the metrics file */
    double start_unix;             /* wall-clock start of the run */
    int world_ready;               /* the world group is up on every rank */
    int agree_seq;                 /* setup agreements made through the store */
    int tp;                        /* ranks of the mesh's tp dimension (1: none) */
    int pp;                        /* ranks of the mesh's pp dimension (1: none) */
    int data_rank, data_world;     /* this rank's place among the data-parallel ranks (every
                                      dimension but tp: tp peers read the same batch) */
};

/*
 * Sets up the engine, loaders, metrics and peak FLOP/s; prints nothing but
 * warnings. Every step of the setup that can fail ends in an agreement of
 * all ranks (fsdp_trainer_agree): the model file, the data files and the
 * output directory are checked first, then the device and the mesh, the
 * engine, the loaders, the checkpoint directory, the resume. A failure on
 * any rank is FSDP_ERR_ABORTED on every rank, with a message (and often a
 * hint, fsdp_err_hint) on one rank only, the lowest that failed, and none
 * elsewhere; no collective is left pending, so the ranks can end in order
 * and the one line is not lost to a launcher tearing the job down. Only an
 * agreement that itself fails (a peer lost) leaves an error of another
 * code, which need not have happened on every rank.
 */
int fsdp_trainer_create(const struct fsdp_train_config *cfg, struct fsdp_dist *dist,
                        fsdp_engine_factory factory, struct fsdp_trainer **out);
/*
 * Agreement on a setup step whose outcome on this rank is rc: 0 when no rank
 * failed; otherwise FSDP_ERR_ABORTED on every rank, the message kept (with
 * the class of its error appended, and how many ranks failed when not all
 * did) by the lowest rank that has one and cleared on the others. Before the
 * world group is up it goes through the rendezvous store. Collective; what
 * ("open its data file") is for the others' log line.
 */
int fsdp_trainer_agree(struct fsdp_trainer *t, int rc, const char *what);
/* What the plan for uneven inputs needs of t (uneven.h): its world, its
 * data loader and settings. */
struct fsdp_uneven_run fsdp_trainer_uneven_run(const struct fsdp_trainer *t);

/* The sharding engine over t's mesh (the default factory). */
int fsdp_trainer_shard_engine(struct fsdp_trainer *t, struct fsdp_engine **out);
/* With a pp dimension: this rank's pipeline stage, sharded over its dp and
 * rdp groups (pipeline.c); fsdp_trainer_shard_engine calls it. */
int fsdp_trainer_pp_engine(struct fsdp_trainer *t, struct fsdp_engine **out);
void fsdp_trainer_destroy(struct fsdp_trainer *t);

/* Prints the run header on rank 0: model, data, batch, peak FLOP/s. */
void fsdp_trainer_print_header(const struct fsdp_trainer *t, FILE *fp);

/* One optimizer step, with its step line and metrics record as configured. */
int fsdp_trainer_step(struct fsdp_trainer *t, struct fsdp_step_stats *stats);

/* Mean loss over val_batches batches from the start of the validation file. */
int fsdp_trainer_validate(struct fsdp_trainer *t, double *val_loss);

/*
 * The whole run: every step, validations, and the final model file. A run
 * stopped by a signal (stop.h) saves a checkpoint (or, without ckpt-dir,
 * the --out model) after the step in progress, sets t->stopped_by and
 * returns 0; the program exits with FSDP_TRAIN_EXIT_STOPPED then. A
 * non-finite gradient norm, decided by the whole group, and a failed
 * checkpoint save come back agreed (FSDP_ERR_ABORTED, one message).
 */
int fsdp_trainer_run(struct fsdp_trainer *t);

#endif
