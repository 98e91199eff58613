/*
 * offload.c - the sharding engine's optimizer state in pinned host memory
 * (fsdp.h, enum fsdp_offload; FSDP2's CPUOffloadPolicy, ZeRO-Offload).
 *
 * Where the state lives, per unit shard of S elements:
 *   device  master (f32 parameters: the all-gathers' send, the direct and
 *           by-rows models' input), grad (the reduced gradient); under
 *           params,optim with a 16-bit param dtype no master but send (the
 *           parameters in that dtype: what the all-gathers, and unit 0 by
 *           rows, read)
 *   host    m, v (AdamW moments), hgrad (grad staged), hmaster (optim: the
 *           master staged; params: the master itself)
 * In f32 the all-gathers send f32, so params keeps master on the device as
 * that send (and as the direct model's input, one rank in f32); with a
 * 16-bit param dtype the device's parameter shard drops from 4 to 2 bytes
 * an element.
 *
 * One step with offload:
 *   backward      as each unit's gradient shard becomes final (its last
 *                 reduction retired into grad on the compute stream; on the
 *                 direct engine its last backward), the copy stream waits
 *                 for the compute stream (ev_grad) and copies grad D2H into
 *                 hgrad: the copies overlap the backward of the units left
 *   norm          the sum of squares runs on the device over grad, as
 *                 without offload (the step's host reads stay the loss and
 *                 the norm); the clip factor needs the global norm, so no
 *                 update can start before it
 *   update        one host wait for the copy stream; then unit by unit:
 *                 AdamW on the host (fsdp_optimizer_update_host, --threads)
 *                 over hmaster, hgrad, m, v, and the updated hmaster copied
 *                 H2D on the copy stream into master, or (send16) into
 *                 grad, which nothing reads again before the next backward,
 *                 so a unit's copy overlaps the next unit's update; send16:
 *                 once the compute stream waited for the copies, every
 *                 unit's grad cast into send (the device's cast, as the
 *                 all-gathers' without offload: the same bits)
 *   next step     the compute stream waits for the copy stream (ev_copy)
 *                 before anything reads master or send (casts, all-gathers,
 *                 the direct model)
 * With optim only, hmaster equals master after every update; only a load
 * of the pieces (state_changed) makes it stale, and the next update copies
 * master D2H first. With params the pieces are hmaster, and state_changed
 * copies it to the device (send16: through grad and the cast, as an
 * update). The final model file (gather_unit) copies hmaster H2D where the
 * device has no master.
 *
 * What does not overlap: the update with the backward (it needs the norm,
 * as ZeRO-Offload's does), and the last units' D2H copies with compute (the
 * backward ends with them). Nothing here reads or writes device memory
 * from the host: the host touches hgrad, hmaster, m and v only, after the
 * copy stream's wait. With tensor parallelism all of this is the same over
 * the tp-local shards; the checkpoint re-layout (shard_save.c) copies the
 * host kinds to the device itself.
 */
#include "config.h"
#include "parallel/fsdp_impl.h"
#include "core/error.h"
#include "optim/optim.h"

int fsdp_offload_init(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    if (se->offload == FSDP_OFFLOAD_NONE || se->sizing) {
        return 0;
    }
    FSDP_CHECK(d->ops->stream_create(d, &se->copy_stream));
    FSDP_CHECK(d->ops->event_create(d, &se->ev_grad));
    FSDP_CHECK(d->ops->event_create(d, &se->ev_copy));
    se->hmaster_stale = 1;
    return 0;
}

void fsdp_offload_fini(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    if (se->copy_stream) {
        (void)d->ops->synchronize(d, se->copy_stream);
    }
    if (se->ev_grad) {
        d->ops->event_destroy(d, se->ev_grad);
    }
    if (se->ev_copy) {
        d->ops->event_destroy(d, se->ev_copy);
    }
    if (se->copy_stream) {
        d->ops->stream_destroy(d, se->copy_stream);
    }
    se->ev_grad = se->ev_copy = se->copy_stream = NULL;
}

/* The copy stream after what the compute stream has issued so far. */
static int offload_after_compute(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    FSDP_CHECK(d->ops->event_record(d, se->ev_grad, d->stream));
    return d->ops->stream_wait(d, se->copy_stream, se->ev_grad);
}

/* The compute stream after what the copy stream has issued so far. */
static int offload_join(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    FSDP_CHECK(d->ops->event_record(d, se->ev_copy, se->copy_stream));
    return d->ops->stream_wait(d, d->stream, se->ev_copy);
}

int fsdp_offload_stage_grad(struct fsdp_shard_engine *se, int u)
{
    struct fsdp_device *d = se->dev;
    struct fsdp_unit *un = &se->units[u];
    if (se->offload == FSDP_OFFLOAD_NONE || un->staged) {
        return 0;
    }
    un->staged = 1;
    if (un->cnt == 0) {
        return 0;
    }
    FSDP_CHECK(offload_after_compute(se));
    return d->ops->copy(d, un->hgrad, un->grad, un->cnt * sizeof(float), FSDP_COPY_D2H,
                        se->copy_stream);
}

void fsdp_offload_step_begin(struct fsdp_shard_engine *se)
{
    for (int u = 0; se->offload && u < se->n_units; u++) {
        se->units[u].staged = 0;
    }
}

/* optim: hmaster from the device's master where a load made it stale. */
static int offload_fetch_master(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    if (se->offload != FSDP_OFFLOAD_OPTIM || !se->hmaster_stale) {
        return 0;
    }
    FSDP_CHECK(offload_after_compute(se));
    for (int u = 0; u < se->n_units; u++) {
        const struct fsdp_unit *un = &se->units[u];
        if (un->cnt > 0) {
            FSDP_CHECK(d->ops->copy(d, un->hmaster, un->master, un->cnt * sizeof(float),
                                    FSDP_COPY_D2H, se->copy_stream));
        }
    }
    se->hmaster_stale = 0;
    return 0;
}

/*
 * Unit u's host master to the device on the copy stream: into master, or
 * (send16) in f32 into the unit's gradient shard, free from the update to
 * the next backward (its D2H copy to hgrad is done, the norm read it), for
 * offload_cast_send to cast into the send shard. The whole S: the host
 * padding is zero, as a master's is.
 */
static int offload_put_master(struct fsdp_shard_engine *se, int u)
{
    struct fsdp_device *d = se->dev;
    const struct fsdp_unit *un = &se->units[u];
    if (un->cnt == 0) {
        return 0;
    }
    if (se->send16) {
        return d->ops->copy(d, un->grad, un->hmaster, un->S * sizeof(float), FSDP_COPY_H2D,
                            se->copy_stream);
    }
    return d->ops->copy(d, un->master, un->hmaster, un->cnt * sizeof(float), FSDP_COPY_H2D,
                        se->copy_stream);
}

/* send16, after offload_join: every unit's master, put in its gradient
 * shard, cast to the param dtype into its send shard on the compute
 * stream (the device's cast, as the all-gathers' without offload). */
static int offload_cast_send(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    for (int u = 0; se->send16 && u < se->n_units; u++) {
        const struct fsdp_unit *un = &se->units[u];
        if (un->cnt == 0) {
            continue;
        }
        if (se->ec.param_dtype == FSDP_BF16) {
            d->k->f32_to_bf16(d, un->send, un->grad, un->S);
        } else {
            d->k->f32_to_f16(d, un->send, un->grad, un->S);
        }
    }
    return 0;
}

int fsdp_offload_update(struct fsdp_shard_engine *se, float grad_scale)
{
    struct fsdp_device *d = se->dev;
    for (int u = 0; u < se->n_units; u++) { /* units no reduction staged (none are, usually) */
        FSDP_CHECK(fsdp_offload_stage_grad(se, u));
    }
    FSDP_CHECK(offload_fetch_master(se));
    if (se->send16) { /* the copies into grad come after the norm's reads of it */
        FSDP_CHECK(offload_after_compute(se));
    }
    FSDP_CHECK(d->ops->synchronize(d, se->copy_stream)); /* hgrad and hmaster are the host's */
    for (int u = 0; u < se->n_units; u++) {
        struct fsdp_unit *un = &se->units[u];
        un->staged = 0;
        if (un->cnt == 0) {
            continue;
        }
        FSDP_CHECK(fsdp_shard_update_unit(se, u, 1, grad_scale));
        FSDP_CHECK(offload_put_master(se, u));
    }
    FSDP_CHECK(offload_join(se));
    return offload_cast_send(se);
}

int fsdp_offload_skip(struct fsdp_shard_engine *se)
{
    for (int u = 0; u < se->n_units; u++) {
        se->units[u].staged = 0;
    }
    /* the next step's backward overwrites grad only after these copies read it */
    return offload_join(se);
}

int fsdp_offload_state_changed(struct fsdp_shard_engine *se)
{
    if (se->offload == FSDP_OFFLOAD_OPTIM) {
        se->hmaster_stale = 1;
        return 0;
    }
    if (se->offload != FSDP_OFFLOAD_PARAMS_OPTIM || se->sizing) {
        return 0;
    }
    /* the host waited for nothing here: the copy stream runs after the
     * compute stream's last reads of master, and compute after the copies */
    FSDP_CHECK(offload_after_compute(se));
    for (int u = 0; u < se->n_units; u++) {
        FSDP_CHECK(offload_put_master(se, u));
    }
    FSDP_CHECK(offload_join(se));
    return offload_cast_send(se);
}
