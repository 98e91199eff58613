/*
 * save_progress.c - the start line and the progress lines of a checkpoint
 * save (save_progress.h).
 */
#include "config.h"
#include "train/save_progress.h"
#include "core/log.h"
#include "core/util.h"

#include <string.h>

void fsdp_save_progress_start(struct fsdp_save_progress *p, int rank, long step, const char *dir)
{
    memset(p, 0, sizeof(*p));
    p->step = step;
    p->print = rank == 0;
    p->t0 = fsdp_now();
    p->every = fsdp_env_double("FSDPC_SAVE_PROGRESS_S", 5.0);
    p->next = p->t0 + p->every;
    if (p->print) {
        FSDP_INFO(FSDP_SUB_TRAIN, "checkpoint step %ld: saving to %s/step_%ld (every rank writes "
                  "its shard, then rank 0 the index)", step, dir, step);
    }
}

void fsdp_save_progress_total(struct fsdp_save_progress *p, size_t total)
{
    p->total = total;
    p->done = 0;
}

void fsdp_save_progress_tick(struct fsdp_save_progress *p)
{
    p->done++;
    if (!p->print || p->total == 0) {
        return;
    }
    double now = fsdp_now();
    if (now < p->next) {
        return;
    }
    p->next = now + p->every;
    FSDP_INFO(FSDP_SUB_TRAIN, "checkpoint step %ld: rank 0 has written %zu of %zu tensors of its "
              "shard (%.0f%%) in %.1f s", p->step, p->done, p->total,
              100.0 * (double)p->done / (double)p->total, now - p->t0);
}
