/*
 * stage.c - host staging of device memory for files (stage.h).
 */
#include "config.h"
#include "train/stage.h"
#include "compute/device.h"
#include "comm/group.h"
#include "core/error.h"

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

void fsdp_stage_stager(struct fsdp_device *dev, struct fsdp_stager *out)
{
    *out = (struct fsdp_stager){
        .mem = dev->mem,
        .ctx = dev,
        .host_alloc = stager_host_alloc,
        .host_free = stager_host_free,
        .to_host = stager_to_host,
        .to_device = stager_to_device,
    };
}
