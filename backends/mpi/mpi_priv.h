/*
 * mpi_priv.h - private header of the mpi backend (backends/mpi).
 *
 * One backend instance wraps one MPI communicator made from the group's world
 * ranks with MPI_Comm_create_group. Every collective is an MPI nonblocking
 * collective; its request lives in a work handle taken from a per-instance
 * free list, so the steady state allocates nothing. The only work a handle
 * does after MPI completes the request is the AVG divide and, for an in-place
 * reduce-scatter on a rank other than 0, moving the block MPI leaves at the
 * front of the buffer to the block's own place.
 *
 * MPI runs with MPI_THREAD_FUNNELED: every function here is called on the
 * thread that initialized MPI. Nothing outside backends/mpi includes this file.
 * File-local symbols and types carry the prefix mpibe_ (mpi_ and MPI_ belong
 * to MPI); the calls shared between the backend's files carry fsdp_mpi_ and
 * are FSDP_PRIVATE, so that only fsdp_mpi_ops leaves the backend.
 */
#ifndef FSDP_BACKENDS_MPI_PRIV_H
#define FSDP_BACKENDS_MPI_PRIV_H

#include <mpi.h>
#include <stddef.h>

#include "backends/backend.h"
#include "core/dtype.h"
#include "core/util.h"

// ----------------------------------------------------------------------------
// datatypes and reduce ops (mpi_types.c)

/* Creates the f16/bf16 datatypes and their user ops on first use; every
 * successful acquire is paired with one release (the last frees them). */
FSDP_PRIVATE int fsdp_mpi_types_acquire(void);
FSDP_PRIVATE void fsdp_mpi_types_release(void);

/* Fills the lookup tables of an instance (valid between acquire and
 * release): the MPI datatype of every dtype, and the MPI op of every (dtype,
 * op) pair, AVG mapping to SUM (the divide is the backend's). */
FSDP_PRIVATE void fsdp_mpi_types_fill(MPI_Datatype types[FSDP_DTYPE_COUNT],
                                      MPI_Op ops[FSDP_DTYPE_COUNT][FSDP_REDOP_COUNT]);

// ----------------------------------------------------------------------------
// backend instance and work handles (mpi_ops.c)

enum mpibe_work_state {
    MPIBE_WORK_FREE = 0, /* on the free list */
    MPIBE_WORK_PENDING,  /* request in flight */
    MPIBE_WORK_DONE,     /* completed (fix-ups applied) or failed */
};

struct mpibe;

struct mpibe_work {
    struct fsdp_work base; /* must stay first */
    struct mpibe *be;
    MPI_Request req;
    enum mpibe_work_state state;
    int rc;           /* 0 or the op's error, valid once DONE */
    const char *what; /* "MPI_Iallreduce", for messages */

    /* completion fix-ups, applied once when MPI reports completion */
    void *avg_buf; /* AVG: divide avg_count elements here by the group size */
    size_t avg_count;
    enum fsdp_dtype dtype;
    void *move_dst; /* in-place reduce-scatter: block to move into place */
    const void *move_src;
    size_t move_bytes;

    struct mpibe_work *next; /* free list link */
};

/* Handles are carved from slabs of this many, allocated when the free list
 * runs dry and kept until the instance is destroyed. */
#define MPIBE_WORK_SLAB 32

struct mpibe_slab {
    struct mpibe_slab *next;
    struct mpibe_work works[MPIBE_WORK_SLAB];
};

struct mpibe {
    char name[64]; /* the group's, kept here: handles may outlive the group */
    MPI_Comm comm;
    int rank;
    int size;
    MPI_Datatype types[FSDP_DTYPE_COUNT];           /* lookups on the hot path */
    MPI_Op ops[FSDP_DTYPE_COUNT][FSDP_REDOP_COUNT];
    struct mpibe_work *free_list;
    struct mpibe_slab *slabs;
    size_t outstanding; /* handles handed out and not yet freed */
    int destroyed;      /* destroy() ran while handles were outstanding */
    int failed;         /* sticky: an MPI call failed, fail_msg says which */
    int aborted;        /* set by abort() from any thread (__atomic) */
    char fail_msg[256];
    char abort_msg[128];
};

#endif
