/*
 * test_mesh_parse.c - mesh and backend specs in one process: what parses,
 * how it is normalized, and the message of every kind of bad spec. Also
 * creates one-rank meshes (every dimension of size 1) and checks that the
 * mpi backend refuses clearly when MPI is not up.
 */
#include "config.h"
#include "core/error.h"
#include "rendezvous/dist.h"
#include "comm/mesh.h"
#include "tests/tap.h"

#include <string.h>

/* The spec as fsdp_mesh_create takes it: parsed, then held against the world. */
static int parse(const char *spec, int world, struct fsdp_mesh_dims *dims)
{
    int rc = fsdp_mesh_parse(spec, dims);
    return rc < 0 ? rc : fsdp_mesh_check_world(spec, dims, world);
}

static void parse_ok(const char *spec, int world, const char *norm, int ndims)
{
    struct fsdp_mesh_dims m;
    int rc = parse(spec, world, &m);
    int ok = rc == 0 && strcmp(m.spec, norm) == 0 && m.ndims == ndims && m.nranks == world;
    if (rc < 0) {
        tap_diag("'%s': %s", spec, fsdp_err_msg());
    } else if (!ok) {
        tap_diag("'%s': normalized to '%s' (%d dims, %lld ranks), want '%s' (%d, %d)", spec,
                 m.spec, m.ndims, m.nranks, norm, ndims, world);
    }
    tap_ok(ok, "mesh '%s' parses as %s", spec, norm);
    fsdp_err_clear();
}

static void parse_bad(const char *spec, int world, const char *needle)
{
    struct fsdp_mesh_dims m;
    int rc = parse(spec, world, &m);
    const char *msg = fsdp_err_msg();
    int ok = rc == FSDP_ERR_INVALID && strstr(msg, needle) != NULL;
    if (!ok) {
        tap_diag("'%s' (world %d): rc %d, message '%s', want one with '%s'", spec, world, rc, msg,
                 needle);
    }
    tap_ok(ok, "mesh '%s' (world %d) is refused: %s", spec, world, needle);
    fsdp_err_clear();
}

static void create_bad(struct fsdp_dist *d, const char *mesh, const char *backend,
                       const char *needle)
{
    struct fsdp_mesh *m = NULL;
    int rc = fsdp_mesh_create(d, mesh, backend, &m);
    const char *msg = fsdp_err_msg();
    int ok = rc < 0 && strstr(msg, needle) != NULL;
    if (!ok) {
        tap_diag("mesh %s backend %s: rc %d, message '%s', want one with '%s'", mesh, backend, rc,
                 msg, needle);
    }
    if (rc == 0) {
        fsdp_mesh_destroy(m);
    }
    tap_ok(ok, "mesh %s with --backend '%s' is refused: %s", mesh, backend, needle);
    fsdp_err_clear();
}

static void create_ok(struct fsdp_dist *d, const char *mesh, const char *backend,
                      const char *norm_backends)
{
    struct fsdp_mesh *m = NULL;
    int rc = fsdp_mesh_create(d, mesh, backend, &m);
    int ok = rc == 0;
    if (!ok) {
        tap_diag("mesh %s backend %s: %s", mesh ? mesh : "(default)", backend ? backend : "(default)",
                 fsdp_err_msg());
    } else {
        ok = strcmp(m->backends, norm_backends) == 0;
        for (int i = 0; ok && i < m->ndims; i++) {
            ok = m->dims[i].group && m->dims[i].group->size == 1 && m->dims[i].coord == 0;
        }
        if (!ok) {
            tap_diag("mesh %s: backends '%s' (want '%s') or groups wrong", m->spec, m->backends,
                     norm_backends);
        }
        fsdp_mesh_destroy(m);
    }
    tap_ok(ok, "one-rank mesh %s with --backend %s", mesh ? mesh : "(default)",
           backend ? backend : "(default)");
    fsdp_err_clear();
}

int main(int argc, char **argv)
{
    parse_ok("dp=2,tp=2", 4, "dp=2,tp=2", 2);
    parse_ok(" dp = 4 , tp=2 ", 8, "dp=4,tp=2", 2);
    parse_ok("rdp=2,dp=1,tp=2", 4, "rdp=2,dp=1,tp=2", 3);
    parse_ok("dp=3", 3, "dp=3", 1);
    parse_ok("a=1,b_2=1,c=1,d9=1", 1, "a=1,b_2=1,c=1,d9=1", 4);

    parse_bad("dp=2,tp=3", 4, "has 6 ranks (2 x 3) but the world has 4");
    parse_bad("dp=2,dp=2", 4, "dimension 'dp' appears twice");
    parse_bad("dp2", 2, "'dp2' is not NAME=SIZE");
    parse_bad("dp=2,,tp=2", 4, "dimension 2 is empty");
    parse_bad("", 1, "dimension 1 is empty");
    parse_bad("dp=2,", 2, "dimension 2 is empty");
    parse_bad("dp=0", 1, "size '0' of dimension 'dp' is not a positive integer");
    parse_bad("dp=two", 2, "size 'two' of dimension 'dp'");
    parse_bad("dp=-2", 2, "size '-2'");
    parse_bad("dp=2x", 2, "size '2x'");
    parse_bad("2p=2", 2, "dimension name '2p' must match [a-z][a-z0-9_]*");
    parse_bad("Dp=2", 2, "dimension name 'Dp'");
    parse_bad("=2", 2, "dimension name ''");
    parse_bad("averyveryverylongname=1", 1, "at most 15 characters");
    parse_bad("a=1,b=1,c=1,d=1,e=1", 1, "more than 4 dimensions");

    struct fsdp_dist *d;
    int rc = fsdp_dist_init(&argc, &argv, NULL, 10, &d);
    if (rc < 0) {
        fsdp_die(rc, "init", NULL);
    }
    create_bad(d, "dp=1", "gloo", "backend 'gloo' (in --backend 'gloo') is unknown; this build has: ");
    create_bad(d, "dp=1", "dp=gloo", "backend 'gloo'");
    create_bad(d, "dp=1,tp=1", "pp=tcp", "names dimension 'pp', which mesh dp=1,tp=1 does not have");
    create_bad(d, "dp=1", "dp=tcp,dp=tcp", "names dimension 'dp' twice");
    create_bad(d, "dp=1", "tcp,mpi", "two defaults");
    create_bad(d, "dp=1", "dp=tcp,", "entry 2 is empty");
    create_bad(d, "dp=2", "tcp", "has 2 ranks (2) but the world has 1");
    create_bad(d, "dp=1", "mpi", "the mpi backend needs an MPI launch (mpiexec/srun)");
    create_ok(d, NULL, NULL, "tcp");
    create_ok(d, "pp=1,dp=1,tp=1", "tcp", "tcp");
    create_ok(d, "dp=1,tp=1", "mpi,dp=tcp,tp=tcp", "tcp");
    fsdp_dist_finalize(d);
    return tap_done();
}
