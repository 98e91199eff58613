/*
 * mpsim_nccl.c - the simulated NCCL of mpsim.h: communicators over MPI,
 * collectives that move the data between the rank processes when they are
 * called (after the order check of the stream they are queued on), and
 * send/recv posted together at ncclGroupEnd.
 */
#include "config.h"
#include "core/dtype.h"
#include "tests/backends/mpsim.h"

#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MPSIM_TAG0 31000 /* tags on MPI_COMM_WORLD for the init handshake */
#define MPSIM_TAGS 1500
#define MPSIM_GROUP_OPS 64

struct ncclComm {
    MPI_Comm mc;
    int nranks;
    int rank;
    int dev;
    int dead;
};

struct p2p {
    int send;
    void *buf;
    size_t bytes;
    int peer;
    ncclComm_t comm;
};

static _Thread_local int group_depth;
static _Thread_local struct p2p group_ops[MPSIM_GROUP_OPS];
static _Thread_local int group_n;
static _Thread_local ncclResult_t group_err;

static int type_of(ncclDataType_t t, enum fsdp_dtype *out)
{
    switch (t) {
    case ncclFloat32:
        *out = FSDP_F32;
        return 0;
    case ncclFloat16:
        *out = FSDP_F16;
        return 0;
    case ncclBfloat16:
        *out = FSDP_BF16;
        return 0;
    case ncclInt32:
        *out = FSDP_I32;
        return 0;
    case ncclInt64:
        *out = FSDP_I64;
        return 0;
    case ncclUint8:
        *out = FSDP_U8;
        return 0;
    default:
        return -1;
    }
}

static int op_of(ncclRedOp_t op, enum fsdp_redop *out)
{
    switch (op) {
    case ncclSum:
        *out = FSDP_SUM;
        return 0;
    case ncclAvg:
        *out = FSDP_AVG;
        return 0;
    case ncclMax:
        *out = FSDP_MAX;
        return 0;
    case ncclMin:
        *out = FSDP_MIN;
        return 0;
    default:
        return -1;
    }
}

static int mpi_ready(void)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin) {
        fprintf(stderr, "fsdpc: nccl simulation: MPI is not initialised (run under mpiexec)\n");
        return 0;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// communicators

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclInvalidArgument:
        return "invalid argument";
    case ncclInvalidUsage:
        return "invalid usage";
    case ncclSystemError:
        return "system error (simulated)";
    default:
        return "simulated NCCL error";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}

ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    static int next;
    int me = 0;
    if (!mpi_ready()) {
        return ncclSystemError;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    memset(uniqueId, 0, sizeof(*uniqueId));
    snprintf(uniqueId->internal, sizeof(uniqueId->internal), "mpsim %d %d", me, next++);
    return ncclSuccess;
}

/* The members' world ranks, in communicator order: each tells the maker
 * of the id (member 0) its own, and the maker sends the table back. */
static int gather_members(int nranks, int rank, int maker, int tag, int *world)
{
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    if (rank == 0) {
        if (me != maker) {
            return -1;
        }
        world[0] = me;
        for (int i = 1; i < nranks; i++) {
            int rec[2];
            MPI_Recv(rec, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (rec[0] <= 0 || rec[0] >= nranks) {
                return -1;
            }
            world[rec[0]] = rec[1];
        }
        for (int i = 1; i < nranks; i++) {
            MPI_Send(world, nranks, MPI_INT, world[i], tag, MPI_COMM_WORLD);
        }
        return 0;
    }
    int rec[2] = {rank, me};
    MPI_Send(rec, 2, MPI_INT, maker, tag, MPI_COMM_WORLD);
    MPI_Recv(world, nranks, MPI_INT, maker, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    return 0;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    int maker = -1, seq = -1;
    (void)config;
    if (!mpi_ready()) {
        return ncclSystemError;
    }
    if (sscanf(commId.internal, "mpsim %d %d", &maker, &seq) != 2 || nranks < 1 || rank < 0 ||
        rank >= nranks) {
        return ncclInvalidArgument;
    }
    struct ncclComm *c = calloc(1, sizeof(*c));
    int *world = calloc((size_t)nranks, sizeof(int));
    if (!c || !world) {
        free(c);
        free(world);
        return ncclSystemError;
    }
    c->nranks = nranks;
    c->rank = rank;
    c->dev = mpsim_current_device();
    c->mc = MPI_COMM_SELF;
    if (nranks > 1) {
        int tag = MPSIM_TAG0 + seq % MPSIM_TAGS;
        MPI_Group wg, g;
        if (gather_members(nranks, rank, maker, tag, world) < 0) {
            free(world);
            free(c);
            return ncclInvalidUsage;
        }
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        MPI_Group_incl(wg, nranks, world, &g);
        MPI_Comm_create_group(MPI_COMM_WORLD, g, tag, &c->mc);
        MPI_Group_free(&g);
        MPI_Group_free(&wg);
    }
    free(world);
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    *asyncError = comm->dead ? ncclInvalidUsage : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    (void)comm;
    return ncclSuccess;
}

static void comm_free(ncclComm_t comm)
{
    int main_thread = 0, fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        MPI_Is_thread_main(&main_thread);
    }
    if (main_thread && comm->mc != MPI_COMM_SELF) {
        MPI_Comm_free(&comm->mc);
    }
    free(comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    comm_free(comm);
    return ncclSuccess;
}

/* Nothing is ever in flight here: the communicator just goes. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    comm->dead = 1;
    comm_free(comm);
    return ncclSuccess;
}

// ----------------------------------------------------------------------------
// collectives

/* recv = the members' contributions (n of bytes each, in rank order in
 * all) reduced in rank order. */
static void reduce_ranks(void *recv, const char *all, size_t count, size_t bytes, int n,
                         enum fsdp_dtype t, enum fsdp_redop op)
{
    memcpy(recv, all, bytes);
    for (int r = 1; r < n; r++) {
        fsdp_reduce(recv, all + (size_t)r * bytes, count, t, op);
    }
    if (op == FSDP_AVG) {
        fsdp_scale_div(recv, count, t, n);
    }
}

enum coll {
    COLL_ALLREDUCE,
    COLL_ALLGATHER,
    COLL_REDUCE_SCATTER,
    COLL_BROADCAST,
};

static const char *const coll_names[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter",
                                         "ncclBroadcast"};

/* count: elements of the result for allreduce and broadcast, of each
 * rank's part for allgather and reduce-scatter. */
static ncclResult_t coll(enum coll k, const void *send, void *recv, size_t count, ncclDataType_t dt,
                         ncclRedOp_t rop, int root, ncclComm_t comm, cudaStream_t stream)
{
    enum fsdp_dtype t;
    enum fsdp_redop op = FSDP_SUM;
    int s = mpsim_stream_id(stream);
    if (comm == NULL || comm->dead || type_of(dt, &t) < 0 || op_of(rop, &op) < 0 || s < 0) {
        return ncclInvalidArgument;
    }
    mpsim_order(s, coll_names[k], send, recv);
    const int n = comm->nranks;
    const size_t es = fsdp_dtype_size(t), part = count * es;
    size_t in = k == COLL_REDUCE_SCATTER ? part * (size_t)n : part;
    char *mine = malloc(in ? in : 1), *all = malloc(part * (size_t)n + 1);
    if (!mine || !all) {
        free(mine);
        free(all);
        return ncclSystemError;
    }
    memcpy(mine, send, in); /* the send buffer may be (part of) the result */
    switch (k) {
    case COLL_ALLREDUCE:
        MPI_Allgather(mine, (int)part, MPI_BYTE, all, (int)part, MPI_BYTE, comm->mc);
        reduce_ranks(recv, all, count, part, n, t, op);
        break;
    case COLL_ALLGATHER:
        MPI_Allgather(mine, (int)part, MPI_BYTE, recv, (int)part, MPI_BYTE, comm->mc);
        break;
    case COLL_REDUCE_SCATTER:
        MPI_Alltoall(mine, (int)part, MPI_BYTE, all, (int)part, MPI_BYTE, comm->mc);
        reduce_ranks(recv, all, count, part, n, t, op);
        break;
    case COLL_BROADCAST:
        MPI_Bcast(mine, (int)part, MPI_BYTE, root, comm->mc);
        memcpy(recv, mine, part);
        break;
    }
    free(mine);
    free(all);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return coll(COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return coll(COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return coll(COLL_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    if (comm == NULL || root < 0 || root >= comm->nranks) {
        return ncclInvalidArgument;
    }
    /* only the root's send buffer is read */
    return coll(COLL_BROADCAST, comm->rank == root ? sendbuff : recvbuff, recvbuff, count, datatype,
                ncclSum, root, comm, stream);
}

// ----------------------------------------------------------------------------
// send/recv and groups

/* Posts the batch (every send and recv at once) and waits for it. */
static ncclResult_t group_run(void)
{
    MPI_Request req[MPSIM_GROUP_OPS];
    MPI_Status st[MPSIM_GROUP_OPS];
    ncclResult_t r = group_err;
    for (int i = 0; i < group_n; i++) {
        struct p2p *o = &group_ops[i];
        if (o->send) {
            MPI_Isend(o->buf, (int)o->bytes, MPI_BYTE, o->peer, 7, o->comm->mc, &req[i]);
        } else {
            MPI_Irecv(o->buf, (int)o->bytes, MPI_BYTE, o->peer, 7, o->comm->mc, &req[i]);
        }
    }
    MPI_Waitall(group_n, req, st);
    group_n = 0;
    group_err = ncclSuccess;
    return r;
}

static ncclResult_t p2p(int send, void *buf, size_t count, ncclDataType_t dt, int peer,
                        ncclComm_t comm, cudaStream_t stream)
{
    enum fsdp_dtype t;
    int s = mpsim_stream_id(stream);
    if (comm == NULL || comm->dead || type_of(dt, &t) < 0 || s < 0 || peer < 0 ||
        peer >= comm->nranks || peer == comm->rank) {
        return ncclInvalidArgument;
    }
    mpsim_order(s, send ? "ncclSend" : "ncclRecv", send ? buf : NULL, send ? NULL : buf);
    if (group_n == MPSIM_GROUP_OPS) {
        group_err = ncclInvalidUsage;
        return ncclInvalidUsage;
    }
    group_ops[group_n++] = (struct p2p){
        .send = send, .buf = buf, .bytes = count * fsdp_dtype_size(t), .peer = peer, .comm = comm};
    return group_depth > 0 ? ncclSuccess : group_run();
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p(1, (void *)(uintptr_t)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return p2p(0, recvbuff, count, datatype, peer, comm, stream);
}

/* nccl.h declares these without a prototype */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0) {
        return ncclInvalidUsage;
    }
    return --group_depth == 0 ? group_run() : ncclSuccess;
}
