/*
 * dist.h - the process's place in the job: rank, world size, host, the
 * rendezvous store, the job nonce, and the job-wide abort.
 *
 * Init methods (--init):
 *   mpi               rank/size from MPI (mpiexec, srun --mpi=pmi2); rank 0
 *                     serves a TCP store whose address MPI broadcasts
 *   env://            RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun);
 *                     SLURM_PROCID/SLURM_NTASKS when RANK/WORLD_SIZE unset;
 *                     rank 0 serves the TCP store on MASTER_PORT
 *   tcp://HOST:PORT   as env:// with the store address given
 *   file:///PATH      rank/size as env://; store is a directory on a shared FS
 * Default (NULL or "auto"): mpi when an MPI launcher started more than one
 * rank, else env:// when RANK/WORLD_SIZE (or SLURM_*) are set, else a
 * single-rank job.
 */
#ifndef FSDP_DIST_DIST_H
#define FSDP_DIST_DIST_H

#include <stdint.h>

struct fsdp_store;

enum fsdp_init_method {
    FSDP_INIT_SINGLE = 0, /* one rank, no launcher */
    FSDP_INIT_MPI,
    FSDP_INIT_ENV,
    FSDP_INIT_TCP,
    FSDP_INIT_FILE,
};

struct fsdp_dist {
    enum fsdp_init_method method;
    int rank;
    int world_size;
    int local_rank; /* rank among the processes on this host */
    int local_size;
    char host[256];
    uint64_t nonce;           /* same on every rank of the job, random per job */
    double timeout_s;         /* default deadline for rendezvous and collectives */
    struct fsdp_store *store; /* the job's store (unprefixed) */
    int mpi_initialized;      /* this layer called MPI_Init and must finalize */
    void *impl;               /* private: store server, file store handle */
};

/* Sets up rank, size, store and nonce. init may be NULL for the default. */
int fsdp_dist_init(int *argc, char ***argv, const char *init, double timeout_s,
                   struct fsdp_dist **out);
/* Orderly shutdown (store, MPI). */
void fsdp_dist_finalize(struct fsdp_dist *d);
/* Human name of the init method ("mpi", "env://", ...). */
const char *fsdp_dist_method_name(const struct fsdp_dist *d);
/* True when MPI is initialized in this process (the mpi backend needs it). */
int fsdp_dist_mpi_available(void);

/* Called, in registration order, when the job aborts (before MPI_Abort or
 * _exit): backends close sockets so that peers notice at once. */
typedef void (*fsdp_dist_abort_cb)(void *arg, const char *why);
int fsdp_dist_on_abort(struct fsdp_dist *d, fsdp_dist_abort_cb cb, void *arg);
void fsdp_dist_off_abort(struct fsdp_dist *d, void *arg);

#endif
