/*
 * mesh_spec.h - the syntax of "--mesh" ("dp=4", "rdp=2,dp=2") and of the
 * lists "--backend" is written in ("tcp", "dp=tcp,tp=mpi"): the one parser
 * of these strings, for the mesh itself and for any program that reads a
 * mesh spec without building one (fsdpc-ckpt reshard).
 *
 * Pure string work: no ranks, no groups, no backends, nothing allocated, so
 * that an offline tool linking it pulls in neither MPI nor a backend.
 * Errors are recorded with fsdp_err() and name the spec as written.
 */
#ifndef FSDP_COMM_MESH_SPEC_H
#define FSDP_COMM_MESH_SPEC_H

#include <stddef.h>

#define FSDP_MESH_MAX_DIMS 4
#define FSDP_MESH_NAME_MAX 16

/* A parsed mesh spec: named dimensions, outermost first. */
struct fsdp_mesh_dims {
    int ndims;
    char name[FSDP_MESH_MAX_DIMS][FSDP_MESH_NAME_MAX]; /* [a-z][a-z0-9_]*, distinct */
    int size[FSDP_MESH_MAX_DIMS];                      /* each in [1, 2^24] */
    long long nranks;                                  /* product of the sizes, at most 2^30 */
    char spec[128];                                    /* normalized: "dp=2,tp=2" */
};

/*
 * "NAME=SIZE[,NAME=SIZE...]" into out. 0, or FSDP_ERR_INVALID naming the
 * first fault (an empty dimension, no '=', a bad name or size, a name given
 * twice, more than FSDP_MESH_MAX_DIMS dimensions, more than 2^30 ranks).
 */
int fsdp_mesh_parse(const char *spec, struct fsdp_mesh_dims *out);

/* 0 when dims (parsed from spec) has exactly world_size ranks, else
 * FSDP_ERR_INVALID with the sizes spelled out. */
int fsdp_mesh_check_world(const char *spec, const struct fsdp_mesh_dims *dims, int world_size);

/*
 * One entry of a comma-separated spec, from p to the next comma or the end:
 * copied into tok (len bytes, truncated) without surrounding blanks, then
 * cut at its first '=' into *name and *value, blanks around both removed.
 * Without '=', *value is NULL and *name is tok (empty for an empty entry).
 * Returns where the next entry starts, or NULL after the last one; "" is
 * one empty entry and "a," ends in one.
 */
const char *fsdp_mesh_spec_entry(const char *p, char *tok, size_t len, char **name,
                                 char **value);

#endif
