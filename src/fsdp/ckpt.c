/*
 * ckpt.c - the sharding engine's side of sharded checkpoints (io/ckpt.h):
 * each shard rank of the first replica writes its own rows of every
 * parameter and AdamW moment straight from its shards (no gather), world
 * rank 0 writes the index; loading reads this rank's rows under the current
 * layout from whatever shard count the checkpoint was written with.
 */
#include "config.h"
#include "fsdp/fsdp_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "io/ckpt.h"

#include <stdio.h>
#include <string.h>

/* The ranks of the first replica write; the other replicas hold copies. */
static int ckpt_is_writer(const struct fsdp_shard_engine *se)
{
    for (int i = 0; i < se->n_rep; i++) {
        if (se->rep_g[i]->rank != 0) {
            return 0;
        }
    }
    return 1;
}

static int ckpt_write_shard(struct fsdp_shard_engine *se, const char *dir, long step)
{
    struct fsdp_ckpt_shard_writer *w = NULL;
    int rc;
    FSDP_CHECK(fsdp_ckpt_shard_create(dir, se->rs, se->Rs, step, se->spec, &w));
    for (int u = 0; u < se->n_units; u++) {
        const struct fsdp_unit *un = &se->units[u];
        size_t off = 0;
        for (size_t i = un->first; i < un->first + un->nparam; i++) {
            const struct fsdp_param_spec *p = &se->spec->params[i];
            size_t row0, rows;
            fsdp_shard_rows(p, se->Rs, se->rs, &row0, &rows);
            FSDP_CHECK_GOTO(fsdp_ckpt_shard_put(w, FSDP_CKPT_MODEL, i, un->master + off), rc, out);
            FSDP_CHECK_GOTO(fsdp_ckpt_shard_put(w, FSDP_CKPT_EXP_AVG, i, un->m + off), rc, out);
            FSDP_CHECK_GOTO(fsdp_ckpt_shard_put(w, FSDP_CKPT_EXP_AVG_SQ, i, un->v + off), rc, out);
            off += rows * p->shape[1];
        }
    }
    rc = fsdp_ckpt_shard_commit(w);
out:
    fsdp_ckpt_shard_destroy(w);
    return rc;
}

int fsdp_shard_ckpt_save(struct fsdp_shard_engine *se, const char *dir,
                         const struct fsdp_ckpt_meta *meta)
{
    fsdp_unit_release_all(se);
    if (ckpt_is_writer(se)) {
        FSDP_CHECK(ckpt_write_shard(se, dir, meta->step));
    }
    if (se->world_rank == 0) {
        struct fsdp_ckpt_meta m = *meta;
        m.n_shards = se->Rs;
        m.world_size = se->world;
        snprintf(m.mesh, sizeof(m.mesh), "%s", se->mesh ? se->mesh->spec : "single rank");
        snprintf(m.backends, sizeof(m.backends), "%s", se->mesh ? se->mesh->backends : "none");
        m.adam_step = se->opt.step;
        m.loss_scale = se->scale;
        m.scale_good_steps = se->good_steps;
        m.skipped_steps = se->skipped;
        FSDP_CHECK(fsdp_ckpt_index_write(dir, se->spec, &m));
    }
    return 0;
}

int fsdp_shard_ckpt_load(struct fsdp_shard_engine *se, struct fsdp_ckpt *ck)
{
    const struct fsdp_ckpt_meta *m = fsdp_ckpt_meta(ck);
    float *dst[FSDP_CKPT_NKINDS];
    fsdp_unit_release_all(se);
    for (int u = 0; u < se->n_units; u++) {
        const struct fsdp_unit *un = &se->units[u];
        size_t off = 0;
        dst[FSDP_CKPT_MODEL] = un->master;
        dst[FSDP_CKPT_EXP_AVG] = un->m;
        dst[FSDP_CKPT_EXP_AVG_SQ] = un->v;
        for (size_t i = un->first; i < un->first + un->nparam; i++) {
            const struct fsdp_param_spec *p = &se->spec->params[i];
            size_t row0, rows;
            fsdp_shard_rows(p, se->Rs, se->rs, &row0, &rows);
            for (int k = 0; k < FSDP_CKPT_NKINDS && rows > 0; k++) {
                FSDP_CHECK(fsdp_ckpt_read_rows(ck, (enum fsdp_ckpt_kind)k, i, row0, rows,
                                               dst[k] + off));
            }
            off += rows * p->shape[1];
        }
    }
    se->opt.step = m->adam_step;
    se->skipped = m->skipped_steps;
    if (se->ec.loss_scale_dynamic) {
        se->scale = (float)m->loss_scale;
        se->good_steps = m->scale_good_steps;
    }
    return 0;
}
