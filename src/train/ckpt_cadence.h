/*
 * ckpt_cadence.h - when and how the training loop checkpoints: the
 * --ckpt-every cadence, the save at the end, the save of a run stopped by a
 * signal (stop.h), resuming, retention, and the commit protocol that makes a
 * checkpoint directory appear complete or not at all (doc/formats.md,
 * "Checkpoints").
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
 * leftovers removed) before any rank reads it; refuses --resume required
 * when D holds no checkpoint. Without: *out is NULL and nothing happens.
 */
int fsdp_ckpt_cadence_create(struct fsdp_trainer *t, struct fsdp_ckpt_cadence **out);
void fsdp_ckpt_cadence_destroy(struct fsdp_ckpt_cadence *c);

/*
 * Restores the engine, step counter and data cursor from cfg->resume, with
 * an agreement of all ranks after opening the checkpoint and after reading
 * it (fsdp_trainer_agree). --resume latest with no checkpoint yet starts
 * afresh with a warning ("required" is refused at create). Rank 0 warns
 * when the stored schedule or global batch differs from this run's, and
 * when ckpt-dir holds steps newer than the one resumed.
 */
int fsdp_ckpt_resume(struct fsdp_trainer *t);
/* After a resume from path failed with rc on a damaged step: the hint
 * names the newest older step of its root whose data verifies and the
 * --resume for it (ckpt_damage.c; reads older steps). Returns rc. */
int fsdp_ckpt_damage_hint(const char *path, int rc);

/* After each step: saves when the cadence (ckpt-every) says so. c may be NULL. */
int fsdp_ckpt_cadence_after_step(struct fsdp_ckpt_cadence *c, struct fsdp_trainer *t);

/* A save of the step just done, now (a run stopped by a signal); a failure
 * is an error whatever ckpt-keep-going says. c may be NULL. */
int fsdp_ckpt_cadence_save_now(struct fsdp_ckpt_cadence *c, struct fsdp_trainer *t);

/* The save at the end of training (unless this step was just saved). */
int fsdp_ckpt_cadence_final(struct fsdp_ckpt_cadence *c, struct fsdp_trainer *t);

#endif
