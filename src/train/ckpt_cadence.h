/*
 * ckpt_cadence.h - when and how the training loop checkpoints: the
 * --ckpt-every cadence, the save at the end, preemption by SIGUSR1/SIGTERM,
 * resuming, retention, and the commit protocol that makes a checkpoint
 * directory appear complete or not at all (doc/formats.md, "Checkpoints").
 *
 * Every function is collective over the trainer's ranks; the agreement
 * goes through the trainer's world group, so all ranks take the same branch.
 */
#ifndef FSDP_TRAIN_CKPT_CADENCE_H
#define FSDP_TRAIN_CKPT_CADENCE_H

struct fsdp_trainer;
struct fsdp_ckpt_cadence;

/*
 * With ckpt-dir set: creates it (rank 0), puts it back in order after an
 * interrupted save (fsdp_ckpt_commit_recover: a step moved aside restored,
 * leftovers removed) before any rank reads it, and installs the
 * SIGUSR1/SIGTERM flag handlers. Without: *out is NULL and nothing happens.
 */
int fsdp_ckpt_cadence_create(struct fsdp_trainer *t, struct fsdp_ckpt_cadence **out);
void fsdp_ckpt_cadence_destroy(struct fsdp_ckpt_cadence *c);

/* Restores the engine, step counter and data cursor from cfg->resume. */
int fsdp_ckpt_resume(struct fsdp_trainer *t);

/* Whether this rank has received SIGUSR1 or SIGTERM (not agreed; 0 without ckpt-dir). */
int fsdp_ckpt_cadence_signalled(void);

/*
 * After each step: saves when the cadence says so or when preempt (the
 * ranks' agreed fsdp_ckpt_cadence_signalled, which the loop folds into its
 * per-step agreement) is set; *stop becomes 1 after a preemption
 * checkpoint. c may be NULL.
 */
int fsdp_ckpt_cadence_after_step(struct fsdp_ckpt_cadence *c, struct fsdp_trainer *t,
                                 int preempt, int *stop);

/* The save at the end of training (unless this step was just saved). */
int fsdp_ckpt_cadence_final(struct fsdp_ckpt_cadence *c, struct fsdp_trainer *t);

#endif
