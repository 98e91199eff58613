/*
 * world.c - the loop's collectives over every rank (world.h), on a group of
 * their own.
 */
#include "config.h"
#include "train/world.h"
#include "comm/group.h"
#include "core/error.h"
#include "rendezvous/dist.h"

#include <stdlib.h>
#include <string.h>

int fsdp_world_create(struct fsdp_dist *d, const struct fsdp_backend_ops *ops,
                      struct fsdp_world **out)
{
    struct fsdp_world *w = calloc(1, sizeof(*w));
    int n = d ? d->world_size : 1;
    int *ranks = calloc((size_t)n, sizeof(int));
    int rc = 0;
    if (!w || !ranks) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "world group");
        goto out;
    }
    w->rank = d ? d->rank : 0;
    w->size = n;
    for (int r = 0; r < n; r++) {
        ranks[r] = r;
    }
    if (n > 1) {
        rc = fsdp_group_create(d, "world", ranks, n, ops, &w->g);
    }
out:
    free(ranks);
    if (rc < 0) {
        fsdp_world_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

void fsdp_world_destroy(struct fsdp_world *w)
{
    if (!w) {
        return;
    }
    fsdp_group_destroy(w->g);
    free(w);
}

int fsdp_world_max(struct fsdp_world *w, int32_t *v, int n)
{
    return w->g ? fsdp_allreduce_sync(w->g, v, v, (size_t)n, FSDP_I32, FSDP_MAX) : 0;
}

int fsdp_world_min(struct fsdp_world *w, int32_t *v, int n)
{
    return w->g ? fsdp_allreduce_sync(w->g, v, v, (size_t)n, FSDP_I32, FSDP_MIN) : 0;
}

int fsdp_world_allgather(struct fsdp_world *w, int32_t x, int32_t *v)
{
    if (!w->g) {
        v[0] = x;
        return 0;
    }
    return fsdp_allgather_sync(w->g, &x, v, 1, FSDP_I32);
}

int fsdp_world_broadcast(struct fsdp_world *w, int32_t *x, int root)
{
    return w->g ? fsdp_broadcast_sync(w->g, x, 1, FSDP_I32, root) : 0;
}

int fsdp_world_barrier(struct fsdp_world *w)
{
    return w->g ? fsdp_barrier_sync(w->g) : 0;
}

int fsdp_world_any_failed(struct fsdp_world *w, int rc, int *any)
{
    int32_t f = rc < 0;
    FSDP_CHECK(fsdp_world_max(w, &f, 1));
    *any = f != 0;
    return 0;
}
