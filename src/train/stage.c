/*
 * stage.c - host staging of device memory for files (stage.h).
 */
#include "config.h"
#include "train/stage.h"
#include "compute/device.h"
#include "comm/group.h"
#include "core/error.h"
#include "core/spec.h"
#include "parallel/engine.h"

#include <string.h>

void fsdp_stage_init(struct fsdp_stage *st, struct fsdp_device *dev)
{
    *st = (struct fsdp_stage){.dev = dev};
}

void fsdp_stage_free(struct fsdp_stage *st)
{
    if (st->buf) {
        st->dev->ops->host_free(st->dev, st->buf);
    }
    st->buf = NULL;
    st->cap = 0;
}

int fsdp_stage_reserve(struct fsdp_stage *st, size_t n, const char *what)
{
    if (n <= st->cap) {
        return 0;
    }
    fsdp_stage_free(st);
    st->buf = st->dev->ops->host_alloc(st->dev, n * sizeof(float));
    if (!st->buf) {
        return fsdp_err(FSDP_ERR_NOMEM, "%zu bytes of pinned host memory to stage %s",
                        n * sizeof(float), what);
    }
    st->cap = n;
    return 0;
}

int fsdp_stage_read(struct fsdp_stage *st, const float *src, size_t n, const float **host)
{
    FSDP_CHECK(fsdp_stage_reserve(st, n, "device memory for a file"));
    FSDP_CHECK(fsdp_device_read(st->dev, st->buf, src, n * sizeof(float)));
    *host = st->buf;
    return 0;
}

int fsdp_stage_write(struct fsdp_stage *st, float *dst, const float *host, size_t n)
{
    FSDP_CHECK(fsdp_device_write(st->dev, dst, host, n * sizeof(float)));
    return st->dev->ops->synchronize(st->dev, st->dev->stream);
}

int fsdp_stage_read_piece(struct fsdp_stage *st, const struct fsdp_state_piece *pc, size_t n,
                          const float **host)
{
    if (pc->host) {
        *host = pc->data;
        return 0;
    }
    return fsdp_stage_read(st, pc->data, n, host);
}

int fsdp_stage_write_piece(struct fsdp_stage *st, const struct fsdp_state_piece *pc,
                           const float *host, size_t n)
{
    if (pc->host) {
        memcpy(pc->data, host, n * sizeof(float));
        return 0;
    }
    return fsdp_stage_write(st, pc->data, host, n);
}

// ----------------------------------------------------------------------------
// the comm layer's stager

static void *stager_host_alloc(void *ctx, size_t bytes)
{
    struct fsdp_device *d = ctx;
    return d->ops->host_alloc(d, bytes);
}

static void stager_host_free(void *ctx, void *p)
{
    struct fsdp_device *d = ctx;
    d->ops->host_free(d, p);
}

static int stager_to_host(void *ctx, void *stream, void *dst, const void *src, size_t bytes)
{
    struct fsdp_device *d = ctx;
    FSDP_CHECK(d->ops->copy(d, dst, src, bytes, FSDP_COPY_D2H, stream));
    return d->ops->synchronize(d, stream);
}

static int stager_to_device(void *ctx, void *stream, void *dst, const void *src, size_t bytes)
{
    struct fsdp_device *d = ctx;
    FSDP_CHECK(d->ops->copy(d, dst, src, bytes, FSDP_COPY_H2D, stream));
    return d->ops->synchronize(d, stream);
}

/* the copy stream of chunked staging: the device's own ops */
static int stager_stream_create(void *ctx, void **stream)
{
    struct fsdp_device *d = ctx;
    return d->ops->stream_create(d, stream);
}

static void stager_stream_destroy(void *ctx, void *stream)
{
    struct fsdp_device *d = ctx;
    d->ops->stream_destroy(d, stream);
}

static int stager_copy(void *ctx, void *stream, void *dst, const void *src, size_t bytes,
                       int to_device)
{
    struct fsdp_device *d = ctx;
    return d->ops->copy(d, dst, src, bytes, to_device ? FSDP_COPY_H2D : FSDP_COPY_D2H, stream);
}

static int stager_event_create(void *ctx, void **ev)
{
    struct fsdp_device *d = ctx;
    return d->ops->event_create(d, ev);
}

static void stager_event_destroy(void *ctx, void *ev)
{
    struct fsdp_device *d = ctx;
    d->ops->event_destroy(d, ev);
}

static int stager_event_record(void *ctx, void *ev, void *stream)
{
    struct fsdp_device *d = ctx;
    return d->ops->event_record(d, ev, stream);
}

static int stager_stream_wait(void *ctx, void *stream, void *ev)
{
    struct fsdp_device *d = ctx;
    return d->ops->stream_wait(d, stream, ev);
}

static int stager_event_synchronize(void *ctx, void *ev)
{
    struct fsdp_device *d = ctx;
    return d->ops->event_synchronize(d, ev);
}

void fsdp_stage_stager(struct fsdp_device *dev, struct fsdp_stager *out)
{
    *out = (struct fsdp_stager){
        .mem = dev->mem,
        .ctx = dev,
        .host_alloc = stager_host_alloc,
        .host_free = stager_host_free,
        .to_host = stager_to_host,
        .to_device = stager_to_device,
        .stream_create = stager_stream_create,
        .stream_destroy = stager_stream_destroy,
        .copy = stager_copy,
        .event_create = stager_event_create,
        .event_destroy = stager_event_destroy,
        .event_record = stager_event_record,
        .stream_wait = stager_stream_wait,
        .event_synchronize = stager_event_synchronize,
    };
}

// ----------------------------------------------------------------------------
// filling the engine's pieces from a row source

/* A block of columns [col0, col0 + cols) of its rows: the rows are read
 * whole, a few at a time through the stage, and the block's columns kept. */
static int stage_fill_block(struct fsdp_stage *st, const struct fsdp_state_piece *pc,
                            const struct fsdp_param_spec *p, size_t cols, fsdp_row_source read,
                            void *arg)
{
    size_t W = p->shape[1];
    FSDP_CHECK(fsdp_stage_reserve(st, W * (((size_t)4 << 20) / W + 1), p->name));
    size_t step = st->cap / W;
    for (size_t r = 0; r < pc->rows; r += step) {
        size_t n = pc->rows - r < step ? pc->rows - r : step;
        FSDP_CHECK(read(arg, pc->kind, pc->param, p, pc->row0 + r, n, st->buf));
        for (size_t i = 0; i < n; i++) {
            float *to = pc->data + (r + i) * cols;
            const float *from = st->buf + i * W + pc->col0;
            if (pc->host) { /* offloaded state: host memory */
                memcpy(to, from, cols * sizeof(float));
                continue;
            }
            FSDP_CHECK(fsdp_device_write(st->dev, to, from, cols * sizeof(float)));
        }
        /* the buffer is read again by the next rows */
        FSDP_CHECK(st->dev->ops->synchronize(st->dev, st->dev->stream));
    }
    return 0;
}

int fsdp_stage_fill_pieces(struct fsdp_engine *e, const struct fsdp_model_spec *spec,
                           struct fsdp_device *dev, int kinds, fsdp_row_source read, void *arg)
{
    size_t n = e->ops->n_pieces(e);
    struct fsdp_stage st;
    int rc = 0;
    fsdp_stage_init(&st, dev);
    for (size_t k = 0; k < n && rc == 0; k++) {
        struct fsdp_state_piece pc = {0};
        e->ops->piece(e, k, &pc);
        const struct fsdp_param_spec *p = &spec->params[pc.param];
        size_t cols = fsdp_state_piece_cols(&pc, p->shape[1]);
        if (pc.kind >= kinds || pc.rows == 0) {
            continue;
        }
        if (cols == p->shape[1]) { /* whole rows: through the stage */
            size_t floats = pc.rows * cols;
            rc = fsdp_stage_reserve(&st, floats, p->name);
            rc = rc < 0 ? rc : read(arg, pc.kind, pc.param, p, pc.row0, pc.rows, st.buf);
            rc = rc < 0 ? rc : fsdp_stage_write_piece(&st, &pc, st.buf, floats);
            continue;
        }
        rc = stage_fill_block(&st, &pc, p, cols, read, arg);
    }
    fsdp_stage_free(&st);
    return rc;
}
