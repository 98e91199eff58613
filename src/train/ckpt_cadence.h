/*
 * ckpt_cadence.h - when and how the training loop checkpoints: the
 * --ckpt-every cadence, the save at the end, the save of a run stopped by a
 * signal (stop.h), resuming, retention, and the commit protocol that makes a
 * checkpoint directory appear complete or not at all (doc/formats.md,
 * "Checkpoints").
 *
 * What it sees of the run is struct fsdp_ckpt_run: the world group (every
 * function is collective over it, and each agreement goes through it, so
 * all ranks take the same branch), the engine whose state pieces are saved
 * and restored, the device they live on, the settings, this rank's data
 * loader, and the run's counters, which the trainer owns and passes by
 * pointer. Nothing here reaches the trainer.
 */
#ifndef FSDP_TRAIN_CKPT_CADENCE_H
#define FSDP_TRAIN_CKPT_CADENCE_H

#include "train/counters.h"

struct fsdp_ckpt_cadence;
struct fsdp_dataloader;
struct fsdp_device;
struct fsdp_engine;
struct fsdp_lr_schedule;
struct fsdp_model_spec;
struct fsdp_train_config;
struct fsdp_uneven;
struct fsdp_world;

/* What checkpointing needs of the run (the trainer fills it). */
struct fsdp_ckpt_run {
    struct fsdp_world *world;             /* the agreements' group; its rank 0 commits */
    struct fsdp_engine *engine;           /* whose state pieces are saved and restored */
    const struct fsdp_model_spec *spec;   /* the model's parameter table */
    struct fsdp_device *dev;              /* where the pieces live */
    const struct fsdp_train_config *cfg;  /* ckpt-*, resume, seed; stored whole in index.h5 */
    struct fsdp_dataloader *train;        /* this rank's loader: its cursor is saved, restored */
    const struct fsdp_uneven *uneven;     /* NULL without epochs */
    int per_rank_data;                    /* data names one file per rank ({rank}) */
    int data_world;                       /* data-parallel ranks (every dimension but tp) */
    int local_ranks;                      /* ranks on this host (the snapshot's memory bound) */
    const char *mesh, *backends;          /* as the mesh reports them; "single rank", "none" */
    const struct fsdp_lr_schedule *sched; /* this run's (its steps: the planned length) */
    struct fsdp_run_counters *count;      /* the trainer's: read at a save, set by a resume */
};

/*
 * With ckpt-dir set: creates it (rank 0), puts it back in order after an
 * interrupted save (fsdp_ckpt_commit_recover: a step moved aside restored,
 * leftovers removed) before any rank reads it; refuses --resume required
 * when D holds no checkpoint. Without: *out is NULL and nothing happens.
 * run is copied; what it points to must outlive the cadence.
 */
int fsdp_ckpt_cadence_create(const struct fsdp_ckpt_run *run, struct fsdp_ckpt_cadence **out);
void fsdp_ckpt_cadence_destroy(struct fsdp_ckpt_cadence *c);

/*
 * Restores the engine, the counters and the data cursor from cfg->resume,
 * with an agreement of all ranks after opening the checkpoint and after
 * reading it. --resume latest with no checkpoint yet starts afresh with a
 * warning ("required" is refused at create). Rank 0 warns when the stored
 * schedule or global batch differs from this run's, and when ckpt-dir holds
 * steps newer than the one resumed. c (NULL without ckpt-dir) learns the
 * step resumed.
 */
int fsdp_ckpt_resume(struct fsdp_ckpt_cadence *c, const struct fsdp_ckpt_run *run);
/* After a resume from path failed with rc on a damaged step: the hint
 * names the newest older step of its root whose data verifies and the
 * --resume for it (ckpt_damage.c; reads older steps). Returns rc. */
int fsdp_ckpt_damage_hint(const char *path, int rc);

/* After each step: commits the save in flight when every rank's write is
 * done, and saves when the cadence (ckpt-every) says so (after the save in
 * flight, which it waits for and says so). c may be NULL. */
int fsdp_ckpt_cadence_after_step(struct fsdp_ckpt_cadence *c);

/* A save of the step just done, now (a run stopped by a signal), after the
 * save in flight; a failure of this one is an error whatever
 * ckpt-keep-going says. c may be NULL. */
int fsdp_ckpt_cadence_save_now(struct fsdp_ckpt_cadence *c);

/* The save at the end of training (unless this step was just saved),
 * after the save in flight. */
int fsdp_ckpt_cadence_final(struct fsdp_ckpt_cadence *c);

/*
 * With --ckpt-async, a save's shards are written by a thread while the
 * loop goes on: fsdp_ckpt_cadence_after_step takes the snapshot and starts
 * it, and at each later step agrees whether every rank's write is done and
 * commits the checkpoint then. This waits for the save in flight and
 * commits it (nothing when none is). Before any other HDF5 use of the
 * process (the --out model); the saves above wait by themselves. Collective.
 */
int fsdp_ckpt_cadence_wait(struct fsdp_ckpt_cadence *c);

#endif
