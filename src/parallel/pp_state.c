/*
 * pp_state.c - the pipeline engine's state as the trainer sees it
 * (pp_engine_impl.h): the stage's pieces, whole units brought to world rank
 * 0 for the final model file, checkpoint rows brought to stage 0, which
 * writes the shard; and the boundary message itself (fsdp_pp_xfer), which
 * every exchange of the runtime goes through. Runs no pass.
 */
#include "config.h"
#include "parallel/pp_engine_impl.h"
#include "core/error.h"

#include <stdlib.h>

/* The pipeline rank that holds unit u (stage s is on rank s mod P). */
static int pp_owner(const struct pp_engine *pe, int u)
{
    for (int s = 0; s < pe->S; s++) {
        int lo, hi;
        fsdp_pp_stage_units(pe->first, pe->S, s, &lo, &hi);
        if (u >= lo && u <= hi) {
            return s % pe->P;
        }
    }
    return -1;
}

/* pp_engine_impl.h: a message of n floats in device memory to or from pipeline rank peer,
 * ordered after what the compute stream has issued and before what it
 * issues next, waited for. */
int fsdp_pp_xfer(struct pp_engine *pe, int send, void *buf, size_t n, int peer, unsigned tag)
{
    struct fsdp_shard_engine *se = pe->se;
    struct fsdp_work *w = NULL;
    const double t0 = fsdp_now();
    FSDP_CHECK(fsdp_unit_comm_begin(se));
    if (send) {
        FSDP_CHECK(fsdp_send(pe->pp, buf, n, FSDP_F32, peer, tag, &se->attr, &w));
    } else {
        FSDP_CHECK(fsdp_recv(pe->pp, buf, n, FSDP_F32, peer, tag, &se->attr, &w));
    }
    int rc = fsdp_work_wait(w, -1.0);
    fsdp_work_free(w);
    FSDP_CHECK(rc);
    rc = fsdp_unit_comm_end(se);
    pe->idle_s += fsdp_now() - t0;
    return rc;
}

int fsdp_pp_lanes_init(struct pp_engine *pe)
{
    struct fsdp_device *d = pp_dev(pe);
    if (!pe->se->ev_compute) {
        return 0; /* sizing: no streams */
    }
    for (int dir = 0; dir < 2; dir++) {
        FSDP_CHECK(d->ops->stream_create(d, &pe->lane[dir]));
        FSDP_CHECK(d->ops->event_create(d, &pe->lane_in[dir]));
        FSDP_CHECK(d->ops->event_create(d, &pe->lane_out[dir]));
    }
    return 0;
}

void fsdp_pp_lanes_fini(struct pp_engine *pe)
{
    struct fsdp_device *d = pe->se ? pe->se->dev : NULL;
    for (int dir = 0; d && dir < 2; dir++) {
        if (pe->lane_in[dir]) {
            d->ops->event_destroy(d, pe->lane_in[dir]);
        }
        if (pe->lane_out[dir]) {
            d->ops->event_destroy(d, pe->lane_out[dir]);
        }
        if (pe->lane[dir]) {
            d->ops->stream_destroy(d, pe->lane[dir]);
        }
        pe->lane[dir] = pe->lane_in[dir] = pe->lane_out[dir] = NULL;
    }
}

/* Direction dir's lane after what the compute stream has issued. */
static int pp_lane_begin(struct pp_engine *pe, int dir)
{
    struct fsdp_device *d = pp_dev(pe);
    if (!pe->lane_in[dir]) {
        return 0;
    }
    FSDP_CHECK(d->ops->event_record(d, pe->lane_in[dir], d->stream));
    return d->ops->stream_wait(d, pe->lane[dir], pe->lane_in[dir]);
}

/* The compute stream's later work after direction dir's lane. */
static int pp_lane_end(struct pp_engine *pe, int dir)
{
    struct fsdp_device *d = pp_dev(pe);
    if (!pe->lane_out[dir]) {
        return 0;
    }
    FSDP_CHECK(d->ops->event_record(d, pe->lane_out[dir], pe->lane[dir]));
    return d->ops->stream_wait(d, d->stream, pe->lane_out[dir]);
}

static struct fsdp_group *pp_lane_group(const struct pp_engine *pe, int dir)
{
    return dir ? pe->pp_grad : pe->pp;
}

/* Waits for a message of the lane, then orders the compute stream after
 * the lane (the received buffer is read, or the sent slot written again,
 * only after it); the time since t0 counts as idle. */
static int pp_lane_finish(struct pp_engine *pe, int dir, struct fsdp_work *w, double t0)
{
    int rc = fsdp_work_wait(w, -1.0);
    fsdp_work_free(w);
    FSDP_CHECK(rc);
    rc = pp_lane_end(pe, dir);
    pe->idle_s += fsdp_now() - t0;
    return rc;
}

int fsdp_pp_recv_dir(struct pp_engine *pe, int dir, float *buf, int peer, unsigned tag)
{
    const struct fsdp_coll_attr attr = {.mem = pe->se->attr.mem, .stream = pe->lane[dir]};
    struct fsdp_work *w = NULL;
    const double t0 = fsdp_now();
    FSDP_CHECK(pp_lane_begin(pe, dir));
    FSDP_CHECK(fsdp_recv(pp_lane_group(pe, dir), buf, pe->count, FSDP_F32, peer, tag, &attr, &w));
    return pp_lane_finish(pe, dir, w, t0);
}

int fsdp_pp_slot_wait(struct pp_engine *pe, int dir)
{
    struct fsdp_work *w = pe->slot_w[dir];
    if (!w) {
        return 0;
    }
    const double t0 = fsdp_now();
    pe->slot_w[dir] = NULL;
    return pp_lane_finish(pe, dir, w, t0);
}

int fsdp_pp_send_async(struct pp_engine *pe, int dir, const float *src, int peer, unsigned tag)
{
    const struct fsdp_coll_attr attr = {.mem = pe->se->attr.mem, .stream = pe->lane[dir]};
    if (!pe->slot[dir]) {
        return fsdp_err(FSDP_ERR_INTERNAL, "pipeline rank %d: a %s send without its slot",
                        pe->stage, dir ? "gradient" : "activation");
    }
    FSDP_CHECK(fsdp_pp_slot_wait(pe, dir));
    FSDP_CHECK(fsdp_device_copy(pp_dev(pe), pe->slot[dir], src, pe->count * sizeof(float)));
    FSDP_CHECK(pp_lane_begin(pe, dir));
    FSDP_CHECK(fsdp_send(pp_lane_group(pe, dir), pe->slot[dir], pe->count, FSDP_F32, peer, tag,
                         &attr, &pe->slot_w[dir]));
    /* started now: a backend that batches its point-to-point calls until the
     * next call on the group (nccl) would otherwise hold it */
    int done;
    return fsdp_work_test(pe->slot_w[dir], &done);
}

size_t fsdp_pp_n_pieces(const struct fsdp_engine *e)
{
    const struct pp_engine *pe = pp_impl(e);
    return pe->inner->ops->n_pieces(pe->inner);
}

void fsdp_pp_piece(struct fsdp_engine *e, size_t k, struct fsdp_state_piece *out)
{
    struct pp_engine *pe = pp_impl(e);
    pe->inner->ops->piece(pe->inner, k, out);
}

int fsdp_pp_state_changed(struct fsdp_engine *e)
{
    struct pp_engine *pe = pp_impl(e);
    return pe->inner->ops->state_changed(pe->inner);
}

/*
 * Unit u whole: its stage gathers it over its data-parallel group; on the
 * pipeline line of world rank 0 a unit of another stage then comes to
 * stage 0 over the pipeline group. *full is the unit on stage 0 of that
 * line (world rank 0, the writer) and on the owning stage, NULL elsewhere.
 */
int fsdp_pp_gather_unit(struct fsdp_engine *e, int u, const float **full)
{
    struct pp_engine *pe = pp_impl(e);
    const int owner = pp_owner(pe, u);
    const float *f = NULL;
    *full = NULL;
    if (owner == pe->stage) {
        FSDP_CHECK(pe->inner->ops->gather_unit(pe->inner, u, &f));
        *full = f;
    }
    if (owner == 0 || !pe->pc.root_line) {
        return 0;
    }
    const struct fsdp_pp_action a = {.op = FSDP_PP_FWD, .mb = u, .chunk = 0};
    size_t n = pe->se->full->unit_numel[u];
    if (pe->stage == owner) {
        return fsdp_pp_xfer(pe, 1, (void *)f, n, 0, fsdp_pp_tag(&a, owner));
    }
    if (pe->stage == 0) {
        FSDP_CHECK(fsdp_pp_xfer(pe, 0, pe->unit_buf, n, owner, fsdp_pp_tag(&a, owner)));
        *full = pe->unit_buf;
    }
    return 0;
}

/* A buffer on the device for one shard's rows of any tensor. */
static int pp_save_buf(struct pp_engine *pe)
{
    if (!pe->save_buf) {
        void *mem;
        FSDP_CHECK(fsdp_device_alloc(pp_dev(pe),
                                     fsdp_model_spec_largest(pe->se->full) * sizeof(float),
                                     "pipeline checkpoint rows", &mem));
        pe->save_buf = mem;
    }
    return 0;
}

/* save_rows with tensor parallelism: the owning stage's ranks re-lay the
 * tensor out as their shard's rows (the sharding engine's save_rows,
 * collective over the stage's dp and tp groups), which go to stage 0 of
 * the same dp and tp coordinates (n floats). */
static int pp_save_blocks(struct pp_engine *pe, int kind, size_t param, int owner, size_t n,
                          float *out)
{
    const struct fsdp_pp_action a = {.op = FSDP_PP_BWD, .mb = kind, .chunk = 0};
    if (owner == 0 && pe->stage == 0) {
        return pe->inner->ops->save_rows(pe->inner, kind, param, out);
    }
    FSDP_CHECK(pp_save_buf(pe));
    if (pe->stage == owner) {
        if (!pe->save_host) {
            pe->save_host = malloc(fsdp_model_spec_largest(pe->se->full) * sizeof(float));
            if (!pe->save_host) {
                return fsdp_err(FSDP_ERR_NOMEM, "pipeline checkpoint rows");
            }
        }
        FSDP_CHECK(pe->inner->ops->save_rows(pe->inner, kind, param, pe->save_host));
        FSDP_CHECK(fsdp_device_write(pp_dev(pe), pe->save_buf, pe->save_host, n * sizeof(float)));
        return fsdp_pp_xfer(pe, 1, pe->save_buf, n, 0, fsdp_pp_tag(&a, owner));
    }
    FSDP_CHECK(fsdp_pp_xfer(pe, 0, pe->save_buf, n, owner, fsdp_pp_tag(&a, owner)));
    return out ? fsdp_device_read(pp_dev(pe), out, pe->save_buf, n * sizeof(float)) : 0;
}

/*
 * engine.h's save_rows: checkpoint shard base.shard (this rank's dp rank)
 * holds rows of every tensor; a tensor of another stage comes from that
 * stage's rank of the same dp coordinate to stage 0, which writes the
 * shard. Every rank calls it for every tensor in the same order; only the
 * writing replica's pipelines exchange.
 */
int fsdp_pp_save_rows(struct fsdp_engine *e, int kind, size_t param, float *out)
{
    struct pp_engine *pe = pp_impl(e);
    const struct fsdp_model_spec *spec = pe->se->full;
    const struct fsdp_param_spec *p = &spec->params[param];
    const int owner = pp_owner(pe, p->unit);
    if (!pe->inner->writes_state || (pe->stage != owner && pe->stage != 0)) {
        return 0;
    }
    struct fsdp_state_piece pc = {0};
    size_t row0, rows;
    fsdp_split_even(p->shape[0], (size_t)e->n_shards, (size_t)e->shard, &row0, &rows);
    const size_t n = rows * p->shape[1];
    if (pe->inner->blocks) { /* tensor parallelism: the stage re-lays its blocks out as rows */
        return pp_save_blocks(pe, kind, param, owner, n, out);
    }
    if (pe->stage == owner) {
        pe->inner->ops->piece(pe->inner, (size_t)kind * spec->n_params + param, &pc);
        if (pc.row0 != row0 || pc.rows != rows) {
            return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: %s rows %zu+%zu, shard holds %zu+%zu",
                            p->name, pc.row0, pc.rows, row0, rows);
        }
    }
    const struct fsdp_pp_action a = {.op = FSDP_PP_BWD, .mb = kind, .chunk = 0};
    if (owner != 0 && pe->stage == owner) {
        return fsdp_pp_xfer(pe, 1, pc.data, n, 0, fsdp_pp_tag(&a, owner));
    }
    const float *src = pc.data;
    if (owner != 0) {
        FSDP_CHECK(pp_save_buf(pe));
        FSDP_CHECK(fsdp_pp_xfer(pe, 0, pe->save_buf, n, owner, fsdp_pp_tag(&a, owner)));
        src = pe->save_buf;
    }
    return out ? fsdp_device_read(pp_dev(pe), out, src, n * sizeof(float)) : 0;
}

void fsdp_pp_get_counters(const struct fsdp_engine *e, struct fsdp_engine_counters *c)
{
    const struct pp_engine *pe = pp_impl(e);
    pe->inner->ops->get_counters(pe->inner, c);
}

void fsdp_pp_set_counters(struct fsdp_engine *e, const struct fsdp_engine_counters *c)
{
    struct pp_engine *pe = pp_impl(e);
    pe->inner->ops->set_counters(pe->inner, c);
}
