/*
 * registry.c - the table of compiled backends, looked up by name.
 */
#include "config.h"
#include "backends/backend.h"

#include <string.h>

static const struct fsdp_backend_ops *const registry[] = {
    &fsdp_mpi_ops,
    &fsdp_tcp_ops,
#if HAVE_NCCL
    &fsdp_nccl_ops,
#endif
};

const struct fsdp_backend_ops *fsdp_backend_find(const char *name)
{
    for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++) {
        if (strcmp(registry[i]->name, name) == 0) {
            return registry[i];
        }
    }
    return NULL;
}

const char *fsdp_backend_names(void)
{
#if HAVE_NCCL
    return "mpi,tcp,nccl";
#else
    return "mpi,tcp";
#endif
}
