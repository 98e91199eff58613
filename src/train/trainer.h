/*
 * trainer.h - the training loop: the data loaders, the learning-rate
 * schedule, step lines and metrics, validation cadence and the final
 * model file, around an engine (engine.h) that runs each optimizer step.
 *
 * Model- and data-dependent checks happen at create: seq-len against the
 * model's context, every token against the model's vocabulary, one global
 * batch fitting the token file. Each failure is one error naming the file
 * and the value.
 */
#ifndef FSDP_TRAIN_TRAINER_H
#define FSDP_TRAIN_TRAINER_H

#include "train/train_config.h"
#include "train/engine.h"
#include "train/metrics.h"
#include "train/schedule.h"

struct fsdp_dist;

struct fsdp_trainer {
    const struct fsdp_train_config *cfg;
    struct fsdp_dist *dist;        /* the sharding engine builds its mesh on it */
    struct fsdp_train_engine *engine;
    struct fsdp_dataloader *train; /* this rank's slice of each global batch */
    struct fsdp_dataloader *val;   /* NULL without val-data */
    struct fsdp_metrics *metrics;  /* rank 0 only; NULL elsewhere */
    struct fsdp_lr_schedule sched;
    double peak_flops;             /* per rank, FLOP/s */
    char peak_method[128];         /* how peak_flops was obtained */
    long step;                     /* optimizer steps done */
    long val_batches;              /* per validation, capped to what the file holds */
    double last_loss;
    double last_val_loss;          /* NaN until a validation ran */
    double train_seconds;          /* wall time inside steps */
    struct fsdp_ckpt_cadence *ckpt; /* NULL without ckpt-dir */
    struct fsdp_uneven *uneven;    /* NULL without epochs: the data wraps around */
    int per_rank_data;             /* data names one file per rank ({rank}) */
    long total_steps;              /* steps the run plans (the schedule's length) */
    double tokens_seen;            /* training tokens of every rank, resumed runs included */
    double run_tokens;             /* of those, the ones this run trained on */
};

/*
 * Sets up the engine, loaders, metrics and peak FLOP/s; prints nothing.
 * A failure that every rank knows of (a data file that fails on some ranks,
 * a checkpoint that does not fit the per-rank data files) is FSDP_ERR_ABORTED
 * on every rank, with a message on one rank only (the one to report it)
 * and none elsewhere; no collective is left pending, so the ranks can end
 * in order. Other errors keep their own code and need not have happened on
 * every rank.
 */
int fsdp_trainer_create(const struct fsdp_train_config *cfg, struct fsdp_dist *dist,
                        struct fsdp_trainer **out);
void fsdp_trainer_destroy(struct fsdp_trainer *t);

/* Prints the run header on rank 0: model, data, batch, peak FLOP/s. */
void fsdp_trainer_print_header(const struct fsdp_trainer *t, FILE *fp);

/* One optimizer step, with its step line and metrics record as configured. */
int fsdp_trainer_step(struct fsdp_trainer *t, struct fsdp_step_stats *stats);

/* Mean loss over val_batches batches from the start of the validation file. */
int fsdp_trainer_validate(struct fsdp_trainer *t, double *val_loss);

/* The whole run: every step, validations, and the final model file. */
int fsdp_trainer_run(struct fsdp_trainer *t);

#endif
