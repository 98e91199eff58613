/*
 * unit.c - the per-unit state machine of the sharding engine: which buffer
 * slot a unit's gathered parameters and full gradient use, the
 * asynchronous all-gather of a unit straight into its parameter slot (its
 * shard cast to the param dtype into its block of the slot before; after,
 * the gathered shards cast back to f32 and unpacked into the unit layout
 * within the slot), the asynchronous reduce-scatter of its gradient within
 * its gradient slot (packed by shard and cast to the reduce dtype in place
 * before, this rank's block reduced in place; after, all-reduced over the
 * replicas there and accumulated into the gradient shard as f32; with
 * offload the step's final shard then goes to the host, offload.c), and the
 * wait timers. No staging buffer is involved.
 *
 * A parameter slot is "held" by a unit from the issue of its all-gather to
 * its release; issuing a gather into a slot that another unit still holds
 * is a scheduling bug and fails loudly rather than corrupting parameters.
 * With one rank in the shard group there is no collective: the "gather" is
 * the cast of the master shard and the "reduce-scatter" the cast of the
 * gradient, so that a single rank runs the same precision policy. Unit 0
 * by rows is treated the same way on any number of ranks: the model
 * computes from this rank's rows, so its "gather" is the cast of the master
 * shard (nothing in f32) and its gradient, already summed over the shard
 * group by the model's exchanges, only goes through the reduce dtype and
 * the replicas.
 */
#include "config.h"
#include "parallel/fsdp_impl.h"
#include "core/error.h"
#include "core/util.h"
#include "compute/kernels.h"

#include <string.h>

// ----------------------------------------------------------------------------
// slots

int fsdp_unit_pslot(const struct fsdp_shard_engine *se, int u)
{
    if (u == 0 || se->keep_gathered) {
        return u;
    }
    return 1 + (u - 1) % (se->n_pslots - 1);
}

int fsdp_unit_gslot(const struct fsdp_shard_engine *se, int u)
{
    if (u == 0 || se->ec.no_sync_accum) {
        return u;
    }
    return 1 + (u - 1) % (se->n_gslots - 1);
}

// ----------------------------------------------------------------------------
// the order of the compute and comm streams

int fsdp_unit_streams_init(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    FSDP_CHECK(d->ops->stream_create(d, &se->comm_stream));
    FSDP_CHECK(d->ops->event_create(d, &se->ev_compute));
    FSDP_CHECK(d->ops->event_create(d, &se->ev_comm));
    se->attr.stream = se->comm_stream;
    return 0;
}

void fsdp_unit_streams_fini(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    if (se->ev_compute) {
        d->ops->event_destroy(d, se->ev_compute);
    }
    if (se->ev_comm) {
        d->ops->event_destroy(d, se->ev_comm);
    }
    if (se->comm_stream) {
        d->ops->stream_destroy(d, se->comm_stream);
    }
    se->ev_compute = se->ev_comm = se->comm_stream = NULL;
}

int fsdp_unit_comm_begin(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    if (!se->ev_compute) {
        return 0; /* sizing */
    }
    FSDP_CHECK(d->ops->event_record(d, se->ev_compute, d->stream));
    return d->ops->stream_wait(d, se->comm_stream, se->ev_compute);
}

int fsdp_unit_comm_end(struct fsdp_shard_engine *se)
{
    struct fsdp_device *d = se->dev;
    if (!se->ev_comm) {
        return 0;
    }
    FSDP_CHECK(d->ops->event_record(d, se->ev_comm, se->comm_stream));
    return d->ops->stream_wait(d, d->stream, se->ev_comm);
}

int fsdp_unit_wait(struct fsdp_shard_engine *se, struct fsdp_work **w, double issued,
                   double done)
{
    double t0 = fsdp_now();
    FSDP_CHECK(fsdp_work_wait(*w, -1.0));
    FSDP_CHECK(fsdp_unit_comm_end(se));
    double t1 = fsdp_now();
    se->comm_exposed += t1 - t0;
    se->comm_total += (done > 0.0 ? done : t1) - issued;
    fsdp_work_free(*w);
    *w = NULL;
    return 0;
}

static int unit_reduce_advance(struct fsdp_shard_engine *se, int block, int *moved);

/* When a collective was first seen complete, for the exposed-time report. */
static void unit_note(struct fsdp_work *w, double *done, double now)
{
    if (w && *done == 0.0 && fsdp_work_done(w)) {
        *done = now;
    }
}

/*
 * Between two units' compute: the group layer drives what is in flight
 * (on a backend without a progress thread), then finished reduce-scatters
 * move on to their replica all-reduces and completion times are noted.
 */
int fsdp_unit_progress(struct fsdp_shard_engine *se)
{
    fsdp_group_progress(se->shard_g);
    for (int i = 0; i < se->n_rep; i++) {
        fsdp_group_progress(se->rep_g[i]);
    }
    int moved = 1;
    while (se->rq_len > 0 && moved) {
        FSDP_CHECK(unit_reduce_advance(se, 0, &moved));
    }
    double now = fsdp_now();
    for (int i = 0; i < se->n_pslots; i++) {
        unit_note(se->pslots[i].work, &se->pslots[i].done, now);
    }
    for (int i = 0; i < se->n_gslots; i++) {
        unit_note(se->gslots[i].work, &se->gslots[i].done, now);
    }
    return 0;
}

static void unit_to16(const struct fsdp_shard_engine *se, enum fsdp_dtype t, uint16_t *dst,
                      const float *src, size_t n)
{
    if (t == FSDP_BF16) {
        se->dev->k->f32_to_bf16(se->dev, dst, src, n);
    } else {
        se->dev->k->f32_to_f16(se->dev, dst, src, n);
    }
}

/* Unit un's shard in the 16-bit param dtype into dst (S elements): cast
 * from the f32 master, or under params,optim (send16) copied from the
 * device's send shard, which the update leaves cast already. */
static int unit_send16(const struct fsdp_shard_engine *se, const struct fsdp_unit *un,
                       uint16_t *dst)
{
    if (se->send16) {
        return fsdp_device_copy(se->dev, dst, un->send, un->S * sizeof(uint16_t));
    }
    unit_to16(se, se->ec.param_dtype, dst, un->master, un->S);
    return 0;
}

/* Block r of S elements of t in buf. */
static void *unit_block(float *buf, int r, size_t S, enum fsdp_dtype t)
{
    return (char *)buf + (size_t)r * S * fsdp_dtype_size(t);
}

/* Where gradient slot s holds this rank's reduced shard of unit u. */
static void *unit_reduced(const struct fsdp_shard_engine *se, const struct fsdp_gslot *s, int u)
{
    return fsdp_shard_by_rows(se, u) ? (void *)s->buf
                                     : unit_block(s->buf, se->rs, se->units[u].S,
                                                  se->ec.reduce_dtype);
}

/* grad = (accumulate ? grad : 0) + shard, the shard in t, added as f32. */
static int unit_accumulate(const struct fsdp_shard_engine *se, float *grad, const void *shard,
                           size_t n, enum fsdp_dtype t, int accumulate)
{
    if (t != FSDP_F32) {
        se->dev->k->accumulate16(se->dev, grad, shard, n, t == FSDP_BF16, accumulate);
    } else if (!accumulate) {
        FSDP_CHECK(fsdp_device_copy(se->dev, grad, shard, n * sizeof(float)));
    } else {
        se->dev->k->accumulate(se->dev, grad, shard, n);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// parameters: all-gather

int fsdp_unit_gather_issue(struct fsdp_shard_engine *se, int u)
{
    struct fsdp_pslot *s = &se->pslots[fsdp_unit_pslot(se, u)];
    const struct fsdp_unit *un = &se->units[u];
    const enum fsdp_dtype pt = se->ec.param_dtype;
    if (s->unit == u) {
        return 0; /* held or in flight */
    }
    if (s->unit >= 0 || s->work) {
        return fsdp_err(FSDP_ERR_INTERNAL, "fsdp: unit %d needs the buffer that unit %d still holds",
                        u, s->unit);
    }
    s->unit = u;
    s->ready = 0;
    s->issued = fsdp_now();
    s->done = 0.0;
    int rc = 0;
    if (se->direct) {
        return 0; /* the model reads the master shard itself */
    }
    if (fsdp_shard_by_rows(se, u)) {
        /* this rank's rows in the param dtype; even a joined rank's serve
         * the others */
        if (pt != FSDP_F32) {
            rc = unit_send16(se, un, s->buf);
        }
        s->ready = rc == 0;
        s->unit = rc == 0 ? u : -1;
        return rc;
    }
    if (pt == FSDP_F32) {
        if (!se->shard_g) {
            rc = fsdp_device_copy(se->dev, s->buf, un->master, un->numel * sizeof(float));
        } else {
            rc = fsdp_unit_comm_begin(se);
            rc = rc < 0 ? rc
                        : fsdp_allgather(se->shard_g, un->master, s->buf, un->S, FSDP_F32,
                                         &se->attr, &s->work);
        }
    } else {
        /* in place: this rank's block of the 16-bit receive buffer is the send */
        uint16_t *recv = s->buf, *mine = recv + (size_t)se->rs * un->S;
        rc = unit_send16(se, un, mine);
        if (se->shard_g && rc == 0) {
            rc = fsdp_unit_comm_begin(se);
            rc = rc < 0 ? rc
                        : fsdp_allgather(se->shard_g, mine, recv, un->S, pt, &se->attr, &s->work);
        }
    }
    if (se->shard_g && rc == 0) {
        fsdp_comm_count(&se->unit_comm, FSDP_COLL_ALLGATHER, se->Rs,
                        (double)se->Rs * (double)un->S * (double)fsdp_dtype_size(pt));
    }
    if (rc < 0) {
        s->unit = -1;
    }
    return rc;
}

int fsdp_unit_gather_wait(struct fsdp_shard_engine *se, int u)
{
    struct fsdp_pslot *s = &se->pslots[fsdp_unit_pslot(se, u)];
    const enum fsdp_dtype pt = se->ec.param_dtype;
    if (s->unit != u) {
        return fsdp_err(FSDP_ERR_INTERNAL, "fsdp: unit %d is used before its all-gather was issued",
                        u);
    }
    if (s->ready) {
        return 0;
    }
    if (s->work) {
        FSDP_CHECK(fsdp_unit_wait(se, &s->work, s->issued, s->done));
    }
    if (se->shadow) {
        /* a joined rank computes nothing: the gathered shards stay packed, and
         * the step ends with release_all, so no later compute sees this slot */
    } else if (se->shard_g) {
        fsdp_shard_unpack_inplace(se, u, s->buf, pt); /* stays in the param dtype */
    }
    s->ready = 1;
    return 0;
}

void fsdp_unit_release(struct fsdp_shard_engine *se, int u)
{
    struct fsdp_pslot *s = &se->pslots[fsdp_unit_pslot(se, u)];
    if (s->unit == u && !s->work) {
        s->unit = -1;
        s->ready = 0;
    }
}

void fsdp_unit_release_all(struct fsdp_shard_engine *se)
{
    for (int p = 0; p < se->n_pslots; p++) {
        if (!se->pslots[p].work) {
            se->pslots[p].unit = -1;
            se->pslots[p].ready = 0;
        }
    }
}

// ----------------------------------------------------------------------------
// gradients: reduce-scatter, all-reduce over replicas, accumulate

int fsdp_unit_reduce_issue(struct fsdp_shard_engine *se, int u, int accumulate)
{
    int g = fsdp_unit_gslot(se, u);
    struct fsdp_gslot *s = &se->gslots[g];
    const struct fsdp_unit *un = &se->units[u];
    const enum fsdp_dtype rt = se->ec.reduce_dtype;
    if (s->unit >= 0 || s->work || se->rq_len == se->n_gslots) {
        return fsdp_err(FSDP_ERR_INTERNAL, "fsdp: unit %d's reduction needs the buffer of unit %d's",
                        u, s->unit);
    }
    if (fsdp_shard_by_rows(se, u) && !s->buf) {
        return 0; /* the model added into the gradient shard itself */
    }
    s->unit = u;
    s->accumulate = accumulate;
    s->phase = 0;
    s->final = se->stage_grads;
    s->issued = fsdp_now();
    s->done = 0.0;
    int rc = 0;
    if (fsdp_shard_by_rows(se, u)) { /* this rank's rows, summed already: only the cast */
        if (rt != FSDP_F32) {
            se->dev->k->narrow_inplace(se->dev, s->buf, un->S, rt == FSDP_BF16);
        }
    } else if (!se->shard_g) { /* one shard: the unit itself, cast to the reduce dtype (and back later) */
        if (rt != FSDP_F32) {
            se->dev->k->narrow_inplace(se->dev, s->buf, un->numel, rt == FSDP_BF16);
        }
    } else {
        /* in place: block rs of the packed send receives this rank's shard */
        fsdp_shard_pack_inplace(se, u, s->buf, rt);
        rc = fsdp_unit_comm_begin(se);
        rc = rc < 0
                 ? rc
                 : fsdp_reduce_scatter(se->shard_g, s->buf, unit_block(s->buf, se->rs, un->S, rt),
                                       un->S, rt, FSDP_SUM, &se->attr, &s->work);
        if (rc == 0) {
            fsdp_comm_count(&se->unit_comm, FSDP_COLL_REDUCE_SCATTER, se->Rs,
                            (double)se->Rs * (double)un->S * (double)fsdp_dtype_size(rt));
        }
    }
    if (rc < 0) {
        s->unit = -1;
        return rc;
    }
    se->rqueue[(se->rq_head + se->rq_len++) % se->n_gslots] = g;
    return 0;
}

/*
 * Moves the oldest pending reduction one stage on: once its current
 * collective is done (waiting for it when block, else only when a test says
 * so), it issues the next all-reduce over the replicas, or, after the last
 * one, accumulates the result into the gradient shard and retires the
 * reduction. Replica all-reduces are issued strictly in the order the
 * reduce-scatters were, so that every member of a replica group issues the
 * same sequence. *moved: whether anything happened.
 */
static int unit_reduce_advance(struct fsdp_shard_engine *se, int block, int *moved)
{
    const enum fsdp_dtype rt = se->ec.reduce_dtype;
    int g = se->rqueue[se->rq_head];
    struct fsdp_gslot *s = &se->gslots[g];
    struct fsdp_unit *un = &se->units[s->unit];
    *moved = 0;
    if (s->work) {
        if (!block && !fsdp_work_done(s->work)) {
            return 0;
        }
        FSDP_CHECK(fsdp_unit_wait(se, &s->work, s->issued, s->done));
    }
    *moved = 1;
    /* hybrid: the shard is summed over the replicas, in the reduce dtype
     * (replicas hold the same rows, so they agree on skipping an empty shard) */
    void *shard = unit_reduced(se, s, s->unit);
    if (s->phase < se->n_rep && un->cnt > 0) {
        void *buf = shard;
        struct fsdp_group *rep = se->rep_g[s->phase++];
        s->issued = fsdp_now();
        s->done = 0.0;
        fsdp_comm_count(&se->unit_comm, FSDP_COLL_ALLREDUCE, rep->size,
                        (double)un->cnt * (double)fsdp_dtype_size(rt));
        FSDP_CHECK(fsdp_unit_comm_begin(se));
        return fsdp_allreduce(rep, buf, buf, un->cnt, rt, FSDP_SUM, &se->attr, &s->work);
    }
    FSDP_CHECK(unit_accumulate(se, un->grad, shard, un->cnt, rt, s->accumulate));
    if (s->final) { /* the gradient shard is final: offload copies it to the host now */
        FSDP_CHECK(fsdp_offload_stage_grad(se, s->unit));
    }
    s->unit = -1;
    se->rq_head = (se->rq_head + 1) % se->n_gslots;
    se->rq_len--;
    return 0;
}

int fsdp_unit_reduce_wait_slot(struct fsdp_shard_engine *se, int g)
{
    int moved;
    while (se->gslots[g].unit >= 0 && se->rq_len > 0) {
        FSDP_CHECK(unit_reduce_advance(se, 1, &moved));
    }
    return 0;
}

int fsdp_unit_reduce_wait_all(struct fsdp_shard_engine *se)
{
    int moved;
    while (se->rq_len > 0) {
        FSDP_CHECK(unit_reduce_advance(se, 1, &moved));
    }
    return 0;
}

