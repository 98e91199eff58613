/*
 * trainer.c - the composition root (see trainer.h): the trainer's lifetime,
 * and the agreement every rank reaches after each phase. Building it:
 * trainer_build.c; the loop and its reporting: trainer_loop.c.
 * Builds the mesh, the world group, the model's table and the engine, and
 * owns the loaders, the schedule, metrics and the run's cadence; it moves
 * parameters only between files and the engine's state pieces. Every rank
 * runs the same sequence of engine calls; only rank 0 prints and writes
 * metrics.
 */

#include "config.h"
#include "train/trainer.h"
#include "train/trainer_impl.h"
#include "train/ckpt_cadence.h"
#include "train/model_source.h"
#include "train/stop.h"
#include "train/uneven.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "comm/debug.h"
#include "comm/mesh.h"
#include "comm/mesh_spec.h"
#include "train/mesh_check.h"
#include "compute/device.h"
#include "train/stage.h"
#include "parallel/fsdp.h"
#include "io/h5/model_file.h"
#include "io/text/tokens.h"
#include "model/model.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Seconds since the epoch, for the metrics file's timestamps. */
double fsdp_trainer_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int fsdp_trainer_world(const struct fsdp_trainer *t)
{
    return t->dist ? t->dist->world_size : 1;
}

int fsdp_trainer_rank(const struct fsdp_trainer *t)
{
    return t->dist ? t->dist->rank : 0;
}

/*
 * This rank's place among the data-parallel ranks, from --mesh: its
 * coordinates in every dimension but tp, row-major (the order the mesh
 * lays ranks out in), so that tp peers read the same batch and the global
 * batch is batch-size x the product of the other dimensions. A mesh that
 * does not parse or cover the world is left to the mesh's own checks.
 */
void fsdp_trainer_data_place(struct fsdp_trainer *t)
{
    struct fsdp_mesh_dims d;
    const int rank = fsdp_trainer_rank(t), world = fsdp_trainer_world(t);
    t->tp = 1;
    t->pp = 1;
    t->data_rank = rank;
    t->data_world = world;
    if (!t->cfg->mesh[0]) {
        return;
    }
    if (fsdp_mesh_parse(t->cfg->mesh, &d) < 0 || d.nranks != world) {
        fsdp_err_clear();
        return;
    }
    int rem = rank, idx = 0, span = 1;
    for (int i = d.ndims - 1; i >= 0; i--) {
        int coord = rem % d.size[i];
        rem /= d.size[i];
        if (strcmp(d.name[i], "tp") == 0) {
            t->tp = d.size[i];
            continue;
        }
        if (strcmp(d.name[i], "pp") == 0) { /* a pipeline's stages read the same batch */
            t->pp = d.size[i];
            continue;
        }
        idx += coord * span;
        span *= d.size[i];
    }
    t->data_rank = idx;
    t->data_world = span;
}

/* Prefixes the recorded error message with the option it concerns. */
int fsdp_trainer_blame(int rc, const char *what)
{
    char msg[1024];
    fsdp_err_take(msg, sizeof(msg));
    if (rc == FSDP_ERR_ABORTED && !msg[0]) {
        return rc; /* another rank reports it (fsdp_trainer_create) */
    }
    return fsdp_err(rc, "%s: %s", what, msg);
}

int fsdp_trainer_agree(struct fsdp_trainer *t, int rc, const char *what)
{
    if (t->world_ready) {
        return fsdp_world_outcome(t->world, rc, what);
    }
    char name[32];
    snprintf(name, sizeof(name), "setup%d", t->agree_seq++);
    return fsdp_world_outcome_store(t->dist, name, rc, what);
}

/* A run id: random enough to tell runs appended to one metrics file apart. */
static void trainer_run_id(struct fsdp_trainer *t)
{
    uint64_t x = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(t->start_unix * 1e6);
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        uint64_t r;
        if (fread(&r, sizeof(r), 1, f) == 1) {
            x ^= r;
        }
        fclose(f);
    }
    snprintf(t->run_id, sizeof(t->run_id), "%016llx", (unsigned long long)x);
}

struct fsdp_uneven_run fsdp_trainer_uneven_run(const struct fsdp_trainer *t)
{
    return (struct fsdp_uneven_run){.world = t->world,
                                    .rank = fsdp_trainer_rank(t),
                                    .size = fsdp_trainer_world(t),
                                    .train = t->train,
                                    .cfg = t->cfg,
                                    .per_rank_data = t->per_rank_data};
}

/* What checkpointing needs of t (ckpt_cadence.h). */
static struct fsdp_ckpt_run trainer_ckpt_run(struct fsdp_trainer *t)
{
    return (struct fsdp_ckpt_run){.world = t->world,
                                  .engine = t->engine,
                                  .spec = t->spec,
                                  .dev = t->dev,
                                  .cfg = t->cfg,
                                  .train = t->train,
                                  .uneven = t->uneven,
                                  .per_rank_data = t->per_rank_data,
                                  .data_world = t->data_world,
                                  .local_ranks = t->dist ? t->dist->local_size : 1,
                                  .mesh = t->mesh ? t->mesh->spec : "single rank",
                                  .backends = t->mesh ? t->mesh->backends : "none",
                                  .sched = &t->sched,
                                  .count = &t->count};
}

/* Phase 3: loaders, passes, checkpoints, resume, metrics and peak FLOP/s. */
static int trainer_open_run(struct fsdp_trainer *t)
{
    const struct fsdp_train_config *cfg = t->cfg;
    int rc = fsdp_trainer_open_data(t, cfg->data, "data", &t->train, &t->per_rank_data);
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "open its data file"));
    FSDP_CHECK(fsdp_trainer_open_val(t));
    struct fsdp_uneven_run run = fsdp_trainer_uneven_run(t);
    rc = fsdp_uneven_create(&run, &t->uneven);
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "plan the passes over its data"));
    t->total_steps = t->uneven ? t->uneven->total_steps : cfg->steps;
    t->sched.steps = t->total_steps;
    const struct fsdp_ckpt_run ck = trainer_ckpt_run(t);
    rc = fsdp_ckpt_cadence_create(&ck, &t->ckpt);
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "prepare ckpt-dir"));
    if ((rc = fsdp_ckpt_resume(t->ckpt, &ck)) < 0) {
        rc = fsdp_trainer_blame(rc, "resume");
    }
    FSDP_CHECK(fsdp_trainer_agree(t, rc, "resume"));
    t->start_step = t->count.step;
    FSDP_CHECK(fsdp_trainer_agree(t, fsdp_trainer_open_metrics(t), "open the metrics file"));
    return fsdp_trainer_agree(t, fsdp_trainer_peak(t), "measure its peak FLOP/s");
}

int fsdp_trainer_create(const struct fsdp_train_config *cfg, struct fsdp_dist *dist,
                        fsdp_engine_factory factory, struct fsdp_trainer **out)
{
    struct fsdp_trainer *t = calloc(1, sizeof(*t));
    struct fsdp_model_file *mf = NULL;
    int rc;
    if (!t) {
        return fsdp_err(FSDP_ERR_NOMEM, "trainer");
    }
    t->cfg = cfg;
    t->dist = dist;
    t->last_loss = NAN;
    t->last_val_loss = NAN;
    t->count.resumed_from = -1;
    t->start_unix = fsdp_trainer_wall();
    trainer_run_id(t);
    fsdp_lr_schedule_init(&t->sched, cfg);
    openblas_set_num_threads((int)cfg->threads);

    rc = fsdp_trainer_check_inputs(t, &mf);
    rc = fsdp_trainer_agree(t, rc, "read its inputs");
    if (rc == 0) {
        rc = fsdp_trainer_build_engine(t, factory, mf);
    }
    fsdp_model_file_close(mf);
    if (rc == 0) {
        rc = trainer_open_run(t);
    }
    if (rc < 0) {
        fsdp_trainer_destroy(t);
        return rc;
    }
    fsdp_stop_install(fsdp_trainer_rank(t));
    *out = t;
    return 0;
}

void fsdp_trainer_destroy(struct fsdp_trainer *t)
{
    if (!t) {
        return;
    }
    fsdp_stop_restore();
    fsdp_metrics_close(t->metrics);
    fsdp_ckpt_cadence_destroy(t->ckpt);
    fsdp_uneven_destroy(t->uneven);
    fsdp_dataloader_destroy(t->val);
    fsdp_dataloader_destroy(t->train);
    fsdp_trainer_close_engine(t);
    free(t);
}
