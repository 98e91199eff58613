/*
 * group_impl.h - the group layer's private view of a group, shared by its
 * own files (group.c: collectives, p2p.c: point-to-point). Nothing above
 * the comm layer includes it.
 */
#ifndef FSDP_COMM_GROUP_IMPL_H
#define FSDP_COMM_GROUP_IMPL_H

#include "comm/group.h"

struct fsdp_fingerprint;
struct fsdp_p2p;

#define GROUP_MAX_INFLIGHT 64

/* The public struct followed by what only the group layer needs. */
struct group_impl {
    struct fsdp_group g;         /* must stay first */
    struct fsdp_group_info info; /* lives as long as the backend instance */
    struct fsdp_backend_caps caps;
    /* operations issued and not yet freed, for fsdp_group_progress; more
     * than fit are left to their waits */
    struct fsdp_work *inflight[GROUP_MAX_INFLIGHT];
    int n_inflight;
    int abort_registered;
    int debug_id;                /* index in the flight recorder's group table */
    struct fsdp_fingerprint *fp; /* FSDPC_DEBUG=DETAIL's checker; NULL: off */
    struct fsdp_p2p *p2p;        /* point-to-point state (p2p.c); NULL until the first */
};

static inline struct group_impl *group_impl_of(struct fsdp_group *g)
{
    return (struct group_impl *)(void *)g;
}

/* w, just issued on g, joins g's operations in flight (for progress). */
void fsdp_group_track(struct fsdp_group *g, struct fsdp_work *w);
/* w leaves g's operations in flight (freed; or a staged collective's
 * chunk, which the group's progress reaches through its first). */
void fsdp_group_untrack(struct fsdp_work *w);
/* w's own operation waited for, as fsdp_work_wait does (its staging
 * aside): up to timeout_s; deadline: that is the group's deadline, and a
 * timeout ends w's flight record as failed. */
int fsdp_group_wait_one(struct fsdp_work *w, double timeout_s, int deadline);

// ----------------------------------------------------------------------------
// p2p.c: the group layer's hooks for point-to-point operations

/* Before w's own wait: under DETAIL, checks the description its peer sent
 * ahead of a receive (FSDP_ERR_MISMATCH naming both calls; the group is
 * aborted). 0 for anything else. */
int fsdp_p2p_wait(struct fsdp_work *w, double timeout_s, int deadline);
/* After w's test: the same check once w has finished, or early when the
 * description has arrived. */
int fsdp_p2p_test(struct fsdp_work *w, int finished);
/* w is freed: its description goes with it. */
void fsdp_p2p_release(struct fsdp_work *w);
/* g is destroyed. */
void fsdp_p2p_free(struct fsdp_group *g);

#endif
