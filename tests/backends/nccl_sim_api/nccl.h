/*
 * nccl.h (test copy) - the NCCL API as an older release declared it, for
 * compiling the nccl backend and its simulation against an API level other
 * than the installed one, so that the backend's version guards are built
 * both ways in CI. Written for this purpose from the public API; nothing
 * here links against libnccl (test_nccl_sim's simulation defines the calls).
 *
 * SIM_NCCL_API picks the level, as NCCL_VERSION_CODE (default 22602):
 *   21400 and up   non-blocking communicators, ncclConfig_t {blocking}
 *   21700 and up   + cgaClusterSize, minCTAs, maxCTAs, netName, splitShare
 *   22600 and up   + trafficClass
 * commName (2.27) and ncclCommRevoke (2.28) are never declared here: code
 * that uses them without a guard fails to compile against this header.
 */
#ifndef FSDP_TESTS_NCCL_SIM_API_NCCL_H
#define FSDP_TESTS_NCCL_SIM_API_NCCL_H

#include <cuda_runtime_api.h>
#include <limits.h>
#include <stddef.h>

#ifndef SIM_NCCL_API
#define SIM_NCCL_API 22602
#endif

#define NCCL_MAJOR (SIM_NCCL_API / 10000)
#define NCCL_MINOR (SIM_NCCL_API / 100 % 100)
#define NCCL_PATCH (SIM_NCCL_API % 100)
#define NCCL_SUFFIX ""
#define NCCL_VERSION_CODE SIM_NCCL_API
/* releases before 2.9 were coded X*1000 + Y*100 + Z */
#define NCCL_VERSION(X, Y, Z) \
    (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#if SIM_NCCL_API < 21400
#error "SIM_NCCL_API below 2.14 has no non-blocking communicators"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL

typedef struct {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
#if SIM_NCCL_API >= 21700
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
#endif
#if SIM_NCCL_API >= 22600
    int trafficClass;
#endif
} ncclConfig_t;

#if SIM_NCCL_API >= 22600
#define NCCL_CONFIG_FIELDS_AFTER_BLOCKING                                              \
    , NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,             \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT
#elif SIM_NCCL_API >= 21700
#define NCCL_CONFIG_FIELDS_AFTER_BLOCKING                                              \
    , NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,             \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT
#else
#define NCCL_CONFIG_FIELDS_AFTER_BLOCKING
#endif

#define NCCL_CONFIG_INITIALIZER                                                          \
    {                                                                                    \
        sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), \
            NCCL_CONFIG_UNDEF_INT NCCL_CONFIG_FIELDS_AFTER_BLOCKING                      \
    }

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif
