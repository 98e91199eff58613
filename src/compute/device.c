/*
 * device.c - choosing a device by name, and the conveniences over the ops
 * that the layers above use (device.h): named allocation with a clear
 * out-of-memory error, zeroing, and the copies the host waits for.
 */
#include "config.h"
#include "compute/device.h"
#include "compute/device_impl.h"
#include "core/error.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Devices a program added (a test's emulated device). */
static struct {
    const char *name;
    fsdp_device_init_fn init;
} extra_devices[4];

int fsdp_device_register(const char *name, fsdp_device_init_fn init)
{
    for (size_t i = 0; i < sizeof(extra_devices) / sizeof(extra_devices[0]); i++) {
        if (!extra_devices[i].name) {
            extra_devices[i].name = name;
            extra_devices[i].init = init;
            return 0;
        }
    }
    return fsdp_err(FSDP_ERR_INVALID, "device '%s': no room for another registered device", name);
}

int fsdp_device_create(const char *name, int index, struct fsdp_device **out)
{
    int (*init)(struct fsdp_device *, int) = NULL;
    for (size_t i = 0; i < sizeof(extra_devices) / sizeof(extra_devices[0]); i++) {
        if (extra_devices[i].name && strcmp(name, extra_devices[i].name) == 0) {
            init = extra_devices[i].init;
        }
    }
    if (init) {
        /* a registered device */
    } else if (strcmp(name, "cpu") == 0) {
        init = fsdp_cpu_device_init;
    } else if (strcmp(name, "guarded") == 0) {
        init = fsdp_guarded_device_init;
    }
#if HAVE_CUDA
    if (strcmp(name, "cuda") == 0) {
        init = fsdp_cuda_device_init;
    }
#endif
    if (!init) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "device '%s': not a device of this build (devices: %s)",
                        name, fsdp_device_names());
    }
    struct fsdp_device *d = calloc(1, sizeof(*d));
    if (!d) {
        return fsdp_err(FSDP_ERR_NOMEM, "device");
    }
    int rc = init(d, index);
    if (rc < 0) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void fsdp_device_destroy(struct fsdp_device *d)
{
    if (d && d->k && d->kstate &&
        d->k->size >= offsetof(struct fsdp_kernels, kstate_free) + sizeof(d->k->kstate_free) &&
        d->k->kstate_free) {
        d->k->kstate_free(d); /* before the memory it holds goes */
    }
    if (d && d->mem == FSDP_MEM_GUARDED) {
        fsdp_guarded_device_fini(d);
    }
#if HAVE_CUDA
    if (d && d->mem == FSDP_MEM_CUDA) {
        fsdp_cuda_device_fini(d);
    }
#endif
    free(d);
}

const char *fsdp_device_default_name(void)
{
#if HAVE_CUDA && HAVE_CUDA_KERNELS
    return fsdp_cuda_visible() > 0 ? "cuda" : "cpu";
#else
    return "cpu";
#endif
}

const char *fsdp_device_names(void)
{
    return HAVE_CUDA && HAVE_CUDA_KERNELS ? "cpu, guarded, cuda" : "cpu, guarded";
}

static struct fsdp_device cpu_device;
static pthread_once_t cpu_device_once = PTHREAD_ONCE_INIT;

static void cpu_device_make(void)
{
    (void)fsdp_cpu_device_init(&cpu_device, 0);
}

struct fsdp_device *fsdp_cpu_device(void)
{
    pthread_once(&cpu_device_once, cpu_device_make);
    return &cpu_device;
}

uint32_t fsdp_device_mem_cap(const struct fsdp_device *d)
{
    return d->mem == FSDP_MEM_CUDA      ? FSDP_CAP_MEM_CUDA
           : d->mem == FSDP_MEM_GUARDED ? FSDP_CAP_MEM_GUARDED
                                        : FSDP_CAP_MEM_HOST;
}

// ----------------------------------------------------------------------------
// conveniences

int fsdp_device_alloc(struct fsdp_device *d, size_t bytes, const char *name, void **out)
{
    *out = d->ops->alloc(d, bytes, name);
    if (*out) {
        return 0;
    }
    size_t free_b = 0, total_b = 0;
    (void)d->ops->mem_info(d, &free_b, &total_b);
    int rc = fsdp_err(FSDP_ERR_NOMEM,
                      "out of memory on device %s:%d: %s needs %zu bytes, %zu of %zu free",
                      d->ops->name, d->index, name, bytes, free_b, total_b);
    fsdp_err_hint("reduce --batch-size or --seq-len, add ranks, or see --print-memory");
    return rc;
}

int fsdp_device_reserve(struct fsdp_device *d, size_t bytes)
{
    return d->ops->reserve ? d->ops->reserve(d, bytes) : 0;
}

int fsdp_device_zero(struct fsdp_device *d, void *p, size_t bytes)
{
    return d->ops->memset(d, p, 0, bytes, d->stream);
}

int fsdp_device_read(struct fsdp_device *d, void *dst, const void *src, size_t bytes)
{
    FSDP_CHECK(d->ops->copy(d, dst, src, bytes, FSDP_COPY_D2H, d->stream));
    return d->ops->synchronize(d, d->stream);
}

int fsdp_device_write(struct fsdp_device *d, void *dst, const void *src, size_t bytes)
{
    return d->ops->copy(d, dst, src, bytes, FSDP_COPY_H2D, d->stream);
}

void fsdp_device_check_matmul(const struct fsdp_device *d, enum fsdp_dtype ot, const void *residual)
{
    if (residual && ot != FSDP_F32) {
        fsdp_fatal("device %s:%d: matmul_forward with a residual writes f32, not %s; round the "
                   "sum after the product",
                   d->ops->name, d->index, fsdp_dtype_name(ot));
    }
}

int fsdp_device_copy(struct fsdp_device *d, void *dst, const void *src, size_t bytes)
{
    return d->ops->copy(d, dst, src, bytes, FSDP_COPY_D2D, d->stream);
}
