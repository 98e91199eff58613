/*
 * dist.h - the process's place in the job: rank, world size, host, the
 * rendezvous store, the job nonce, and the job-wide abort.
 *
 * Init methods (--init):
 *   mpi               rank/size from MPI (mpiexec, srun --mpi=pmi2), local
 *                     rank from MPI_Comm_split_type(SHARED); rank 0 serves a
 *                     TCP store on an ephemeral port and MPI_Bcast's the
 *                     random job nonce and "host:port" ($FSDPC_STORE_HOST,
 *                     else an address of rank 0's host; 127.0.0.1 when all
 *                     ranks share one host). MPI_Init_thread(FUNNELED) is
 *                     called only when MPI is not initialized yet.
 *   env://            RANK, WORLD_SIZE, MASTER_ADDR (default 127.0.0.1),
 *                     MASTER_PORT (required when WORLD_SIZE > 1), as torchrun;
 *                     SLURM_PROCID/SLURM_NTASKS when RANK/WORLD_SIZE unset;
 *                     rank 0 serves the TCP store on MASTER_PORT
 *   tcp://HOST:PORT   as env:// with the store address given
 *   file:///PATH      rank/size as env://; the store is a directory on a
 *                     shared file system (stale stores: see store.h)
 * Default (NULL or "auto"): mpi when an MPI launcher started more than one
 * rank (PMI_SIZE, OMPI_COMM_WORLD_SIZE, or PMI_FD/PMI_RANK/PMIX_RANK with
 * SLURM_NTASKS > 1), else env:// when RANK/WORLD_SIZE are set (or
 * SLURM_PROCID with SLURM_NTASKS > 1), else a single-rank job with an
 * in-process store.
 *
 * Authentication (auth.h, doc/rendezvous.md). Every store and tcp-backend
 * connection starts with a mutual HMAC challenge-response keyed by the job
 * secret: under mpi rank 0 draws it and MPI_Bcast's it; under env:// and
 * tcp:// it comes from $FSDPC_SECRET or the 0600 file $FSDPC_SECRET_FILE
 * (the job scripts make one per job); under file:// from the store's stamp
 * (0600 in a 0700 directory) unless the user names one. env:// and tcp://
 * without a secret run only on a loopback store address (connected to and
 * listened on), with the user's per-user secret (auth.h); with
 * $FSDPC_INSECURE=1 (--insecure) they run keyed by public values (the
 * store address, WORLD_SIZE and the launcher's job id: $FSDPC_JOB_ID, else
 * $SLURM_JOB_ID.$SLURM_STEP_ID, else $TORCHELASTIC_RUN_ID), on a
 * non-loopback address too. Once connected, rank 0 publishes a
 * random job nonce (key "fsdpc/nonce"); d->nonce names the job and
 * d->job_key, derived from the secret and the nonce, keys the backends'
 * handshakes.
 *
 * Local rank and size without MPI: LOCAL_RANK (or SLURM_LOCALID) and
 * LOCAL_WORLD_SIZE where set, else counted from what every rank publishes in
 * the store: its host name, boot id and network namespace, so that
 * containers or namespaces that share a host name but not a network are not
 * taken for one host.
 *
 * d->addr: the address this rank gives other hosts (netaddr.h): the tcp
 * backend listens there; chosen once the local ranks are known.
 *
 * Environment: FSDPC_TIMEOUT (default deadline when timeout_s <= 0; 300 s),
 * FSDPC_FINALIZE_TIMEOUT (bound of the finalize rendezvous; 10 s),
 * FSDPC_STORE_HOST, FSDPC_STORE_PORT (mpi: the store's address and port),
 * FSDPC_JOB_ID, FSDPC_FILE_STORE_SLACK (store.h), FSDPC_SECRET,
 * FSDPC_SECRET_FILE, FSDPC_INSECURE (above).
 */
#ifndef FSDP_RENDEZVOUS_DIST_H
#define FSDP_RENDEZVOUS_DIST_H

#include "rendezvous/auth.h"
#include "rendezvous/netaddr.h"

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
    struct fsdp_netaddr addr; /* where other hosts reach this rank (netaddr.h) */
    uint64_t nonce;           /* same on every rank of the job, random per job */
    struct fsdp_auth_key job_key; /* keys the backends' handshakes (from the secret) */
    int authenticated;        /* 0: no secret (--insecure): keys are public */
    double timeout_s;         /* default deadline for rendezvous and collectives */
    struct fsdp_store *store; /* the job's store (unprefixed) */
    int mpi_initialized;      /* this layer called MPI_Init and must finalize */
    void *impl;               /* private: store server, file store handle */
};

/* Sets up rank, size, store and nonce. init may be NULL for the default;
 * timeout_s <= 0 means $FSDPC_TIMEOUT or 300 s. One per process. On failure
 * an MPI that this call started stays initialized, so that the program's
 * fsdp_die can still take the whole job down. */
int fsdp_dist_init(int *argc, char ***argv, const char *init, double timeout_s,
                   struct fsdp_dist **out);
/* Orderly shutdown: a rendezvous of all ranks bounded by
 * FSDPC_FINALIZE_TIMEOUT (a dead peer costs that long, never a hang), rank 0
 * waits until the others are done with the store, then removes a file
 * store, stops its server, and MPI_Finalize runs if init started MPI (not
 * when some rank never arrived: that could block). */
void fsdp_dist_finalize(struct fsdp_dist *d);
/* What a launcher says before any rendezvous: this process's rank (0
 * without a launcher) and the number of ranks it started (1 without one),
 * from the variables above (PMI, Open MPI, Slurm, torchrun's RANK and
 * WORLD_SIZE). For what must happen once per job before there is a job. */
int fsdp_dist_launcher_rank(void);
int fsdp_dist_launcher_size(void);
/* What --insecure (FSDPC_INSECURE=1 above) means, as every program's --help
 * says it. */
#define FSDP_DIST_INSECURE_HELP                                                                    \
    "env:// or tcp:// without a job secret (FSDPC_SECRET_FILE): on a non-loopback address, "       \
    "or on loopback keyed by public values instead of the per-user secret"

/* Human name of the init method ("mpi", "env://", ...). */
const char *fsdp_dist_method_name(const struct fsdp_dist *d);
/* True when MPI is initialized in this process (the mpi backend needs it). */
int fsdp_dist_mpi_available(void);

/* Called, in registration order, when the job aborts (fsdp_die and friends,
 * before MPI_Abort or _exit): backends close sockets so that peers notice at
 * once. A callback must not allocate or block; why is the error message.
 * At most 64 callbacks; off_abort removes every callback registered with arg. */
typedef void (*fsdp_dist_abort_cb)(void *arg, const char *why);
int fsdp_dist_on_abort(struct fsdp_dist *d, fsdp_dist_abort_cb cb, void *arg);
void fsdp_dist_off_abort(struct fsdp_dist *d, void *arg);

/* Called, in registration order, at the start of fsdp_dist_finalize while
 * the job is still whole (the layers above, e.g. the debug layer's summary
 * and exit dump, register here rather than being called by name). At most
 * 8; registering the same (cb, arg) twice keeps one. */
typedef void (*fsdp_dist_finalize_cb)(void *arg);
int fsdp_dist_on_finalize(struct fsdp_dist *d, fsdp_dist_finalize_cb cb, void *arg);

#endif
