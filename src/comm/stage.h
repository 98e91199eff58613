/*
 * stage.h - host staging of collectives (group.h, fsdp_group_set_stager):
 * a collective on memory its group's backend cannot take (a GPU's, a
 * guarded device's) runs on host copies of its buffers. The send side is
 * copied to the host when the collective is issued, the host collective
 * runs as any other (debug layer included), and the receive side is copied
 * back when the collective is waited for (or tested done). Host buffers are
 * the stager's (pinned memory on a GPU), kept per group and reused.
 *
 * This file is the group layer's own; callers use group.h.
 */
#ifndef FSDP_COMM_STAGE_H
#define FSDP_COMM_STAGE_H

#include <stddef.h>

#include "comm/group.h"

struct fsdp_staged; /* one staged collective in flight */

/* Whether a collective with attr on g runs staged. */
int fsdp_stage_needed(const struct fsdp_group *g, const struct fsdp_coll_attr *attr);
/* Host copies of send (send_bytes) and recv (recv_bytes), which may overlap
 * as an in-place collective's do (the host pair overlaps the same way);
 * send is copied now, both copies are ordered on stream (the collective's). */
int fsdp_stage_begin(struct fsdp_group *g, void *stream, const void *send, size_t send_bytes,
                     void *recv, size_t recv_bytes, const void **hsend, void **hrecv,
                     struct fsdp_staged **out);
/* The host collective's issue returned rc with *work: ties st to it (or
 * drops st when the issue failed). */
int fsdp_stage_bind(struct fsdp_group *g, struct fsdp_staged *st, int rc, struct fsdp_work *work);
/* w completed: its receive side back to the device; idempotent. */
int fsdp_stage_end(struct fsdp_work *w);
/* w is freed: its buffers go back to the pool. */
void fsdp_stage_release(struct fsdp_work *w);
/* The group's pool freed (group destroy). */
void fsdp_stage_pool_free(struct fsdp_group *g);

#endif
