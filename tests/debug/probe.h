/*
 * probe.h - what the debug layer's probe programs (debug_probe.c,
 * p2p_probe.c) share: their flags (--init, --mesh, --backend), the job and
 * mesh they run on, and how a rank reports an error: "rank R: error:
 * <message>", a moment for the other ranks to report theirs, then the job
 * taken down (fsdp_die), as a program would.
 */
#ifndef FSDP_TESTS_DEBUG_PROBE_H
#define FSDP_TESTS_DEBUG_PROBE_H

#include "comm/debug.h"
#include "comm/mesh.h"
#include "core/error.h"
#include "core/log.h"
#include "rendezvous/dist.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int probe_rank;
static const char *probe_name;

static _Noreturn __attribute__((unused)) void probe_fail(int rc)
{
    printf("rank %d: error: %s\n", probe_rank, fsdp_err_msg());
    fflush(stdout);
    sleep(1);
    fsdp_die(rc, probe_name, NULL);
}

#define PROBE_CHECK(call)                                                                          \
    do {                                                                                           \
        int probe_rc_ = (call);                                                                    \
        if (probe_rc_ < 0) {                                                                       \
            probe_fail(probe_rc_);                                                                 \
        }                                                                                          \
    } while (0)

/* The job and mesh from argv's flags; *mode, *args and *nargs are what
 * follows them. modes lists the program's modes for the usage error. */
static __attribute__((unused)) void probe_start(int argc, char **argv, const char *name,
                                                const char *modes, const char **mode, char ***args,
                                                int *nargs, struct fsdp_dist **d,
                                                struct fsdp_mesh **m)
{
    const char *init = NULL, *mesh = NULL, *backend = NULL;
    int i = 1;
    probe_name = name;
    for (; i + 1 < argc && !strncmp(argv[i], "--", 2); i += 2) {
        if (!strcmp(argv[i], "--init")) {
            init = argv[i + 1];
        } else if (!strcmp(argv[i], "--mesh")) {
            mesh = argv[i + 1];
        } else if (!strcmp(argv[i], "--backend")) {
            backend = argv[i + 1];
        } else {
            fsdp_fatal("%s: unknown flag %s", name, argv[i]);
        }
    }
    if (i >= argc) {
        fsdp_fatal("%s: no mode given (%s)", name, modes);
    }
    *mode = argv[i];
    *args = argv + i + 1;
    *nargs = argc - i - 1;
    int rc = fsdp_dist_init(&argc, &argv, init, 0, d);
    if (rc < 0) {
        char what[96];
        snprintf(what, sizeof(what), "%s: dist init", name);
        fsdp_die(rc, what, NULL);
    }
    probe_rank = (*d)->rank;
    PROBE_CHECK(fsdp_mesh_create(*d, mesh, backend, m));
    fsdp_debug_mark_steady();
}

#endif
