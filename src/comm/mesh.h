/*
 * mesh.h - the N-dimensional device mesh (torch init_device_mesh).
 *
 * "--mesh rdp=2,dp=2,tp=2": named dimensions, outermost first, product equal
 * to the world size, ranks laid out row-major (the last dimension varies
 * fastest). For each dimension this rank belongs to one slice: the ranks that
 * share its coordinates in every other dimension; that slice is a process
 * group named "<dim>[<slice index>]" served by the dimension's backend.
 * "--backend tcp" applies one backend to every dimension; "--backend
 * dp=tcp,tp=mpi" chooses per dimension (unnamed dimensions get the default).
 * At creation every rank checks that all ranks agree on names, sizes and
 * backends; a disagreement fails on every rank, naming a disagreeing rank.
 * The spec syntax (and a parser that needs no ranks) is in mesh_spec.h.
 */
#ifndef FSDP_COMM_MESH_H
#define FSDP_COMM_MESH_H

#include "comm/group.h"
#include "comm/mesh_spec.h"

struct fsdp_mesh_dim {
    char name[FSDP_MESH_NAME_MAX];
    int size;
    int coord;                          /* this rank's coordinate on the dim */
    const struct fsdp_backend_ops *ops; /* backend chosen for the dim */
    struct fsdp_group *group;           /* this rank's slice */
};

struct fsdp_mesh {
    int ndims;
    struct fsdp_mesh_dim dims[FSDP_MESH_MAX_DIMS];
    struct fsdp_dist *dist;
    char spec[128];    /* normalized "dp=2,tp=2" */
    char backends[128]; /* normalized "dp=tcp,tp=mpi" */
};

/* mesh_spec NULL means "dp=<world size>"; backend_spec NULL means "mpi" when
 * MPI is up, else "tcp". Collective over the whole world. */
int fsdp_mesh_create(struct fsdp_dist *d, const char *mesh_spec, const char *backend_spec,
                     struct fsdp_mesh **out);
/* As fsdp_mesh_create, refusing (on every rank, before any group or
 * communicator exists) a backend that cannot take mem_cap memory
 * (FSDP_CAP_MEM_*; 0: no requirement). */
int fsdp_mesh_create_for(struct fsdp_dist *d, const char *mesh_spec, const char *backend_spec,
                         uint32_t mem_cap, struct fsdp_mesh **out);
void fsdp_mesh_destroy(struct fsdp_mesh *m);

/* The group of dimension `name`, or NULL. */
struct fsdp_group *fsdp_mesh_group(struct fsdp_mesh *m, const char *name);
/* Index of dimension `name`, or -1. */
int fsdp_mesh_dim_index(const struct fsdp_mesh *m, const char *name);

#endif
