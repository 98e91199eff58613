/*
 * mpi_types.c - MPI datatypes and reduce ops for the fsdp dtypes.
 *
 * u8, i32, i64 and f32 map to MPI's predefined types and ops. MPI has no
 * bf16, and MPICH 4.0 does not reduce its own f16, so both 16-bit formats
 * travel as a contiguous 2-byte datatype and reduce with commutative user ops
 * that widen to f32, apply the op and round back once per call (fsdp_reduce):
 * one rounding per reduction step, as NCCL does. AVG is a SUM here; the
 * backend divides once when the request completes.
 *
 * The types and ops exist once per process: the first acquire creates them,
 * the last release frees them (unless MPI is already finalized, when freeing
 * is erroneous and the objects are gone anyway). Only the MPI thread calls
 * these functions, so a plain counter is enough.
 */
#include "config.h"
#include "backends/mpi/mpi_priv.h"
#include "core/error.h"
#include "core/log.h"

enum { HALF_F16 = 0, HALF_BF16 = 1, HALF_COUNT = 2 };
enum { HOP_SUM = 0, HOP_MAX = 1, HOP_MIN = 2, HOP_COUNT = 3 };

static struct {
    int refs;
    MPI_Datatype types[HALF_COUNT];          /* 2-byte contiguous, committed */
    MPI_Op ops[HALF_COUNT][HOP_COUNT];       /* user ops, commutative */
} mpibe_types = {
    .types = {MPI_DATATYPE_NULL, MPI_DATATYPE_NULL},
    .ops = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}},
};

// ----------------------------------------------------------------------------
// user reduce functions: inoutvec[i] = op(inoutvec[i], invec[i])

/*
 * MPI 4 lets a user op take an MPI_Count length, which also serves the
 * large-count collectives; MPICH calls it for the int-count ones as well.
 */
#if MPI_VERSION >= 4
typedef MPI_Count mpibe_len_t;
#define mpibe_op_create MPI_Op_create_c
#else
typedef int mpibe_len_t;
#define mpibe_op_create MPI_Op_create
#endif

/* The 16-bit format of one of our datatypes: MPI hands a user op the
 * datatype of the call, so one function serves both formats. */
static enum fsdp_dtype mpibe_half_of(const MPI_Datatype *dt)
{
    return *dt == mpibe_types.types[HALF_BF16] ? FSDP_BF16 : FSDP_F16;
}

static void mpibe_half_sum(void *in, void *inout, mpibe_len_t *len, MPI_Datatype *dt)
{
    fsdp_reduce(inout, in, (size_t)*len, mpibe_half_of(dt), FSDP_SUM);
}

static void mpibe_half_max(void *in, void *inout, mpibe_len_t *len, MPI_Datatype *dt)
{
    fsdp_reduce(inout, in, (size_t)*len, mpibe_half_of(dt), FSDP_MAX);
}

static void mpibe_half_min(void *in, void *inout, mpibe_len_t *len, MPI_Datatype *dt)
{
    fsdp_reduce(inout, in, (size_t)*len, mpibe_half_of(dt), FSDP_MIN);
}

typedef void mpibe_user_fn(void *, void *, mpibe_len_t *, MPI_Datatype *);

static mpibe_user_fn *const mpibe_user_fns[HOP_COUNT] = {mpibe_half_sum, mpibe_half_max,
                                                         mpibe_half_min};

// ----------------------------------------------------------------------------
// lifetime

static int mpibe_types_fail(int mpirc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpirc, msg, &len) != MPI_SUCCESS) {
        len = 0;
    }
    msg[len] = '\0';
    return fsdp_err(FSDP_ERR_BACKEND, "mpi: %s failed: %s", what, msg);
}

static void mpibe_types_free_all(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (int h = 0; h < HALF_COUNT; h++) {
        for (int o = 0; o < HOP_COUNT; o++) {
            if (mpibe_types.ops[h][o] != MPI_OP_NULL && !finalized) {
                MPI_Op_free(&mpibe_types.ops[h][o]);
            }
            mpibe_types.ops[h][o] = MPI_OP_NULL;
        }
        if (mpibe_types.types[h] != MPI_DATATYPE_NULL && !finalized) {
            MPI_Type_free(&mpibe_types.types[h]);
        }
        mpibe_types.types[h] = MPI_DATATYPE_NULL;
    }
}

int fsdp_mpi_types_acquire(void)
{
    int rc;
    if (mpibe_types.refs > 0) {
        mpibe_types.refs++;
        return 0;
    }
    for (int h = 0; h < HALF_COUNT; h++) {
        rc = MPI_Type_contiguous(2, MPI_BYTE, &mpibe_types.types[h]);
        if (rc == MPI_SUCCESS) {
            rc = MPI_Type_commit(&mpibe_types.types[h]);
        }
        if (rc != MPI_SUCCESS) {
            rc = mpibe_types_fail(rc, "creating the 16-bit float datatype");
            goto err_free;
        }
        for (int o = 0; o < HOP_COUNT; o++) {
            rc = mpibe_op_create(mpibe_user_fns[o], 1, &mpibe_types.ops[h][o]);
            if (rc != MPI_SUCCESS) {
                rc = mpibe_types_fail(rc, "creating a 16-bit float reduce op");
                goto err_free;
            }
        }
    }
    mpibe_types.refs = 1;
    FSDP_DEBUG(FSDP_SUB_MPI, "created f16/bf16 datatypes and reduce ops");
    return 0;

err_free:
    mpibe_types_free_all();
    return rc;
}

void fsdp_mpi_types_release(void)
{
    if (mpibe_types.refs <= 0) {
        return;
    }
    if (--mpibe_types.refs == 0) {
        mpibe_types_free_all();
        FSDP_DEBUG(FSDP_SUB_MPI, "freed f16/bf16 datatypes and reduce ops");
    }
}

// ----------------------------------------------------------------------------
// lookup tables, copied into every instance so the hot path is an array load

static MPI_Datatype mpibe_types_datatype(enum fsdp_dtype t)
{
    switch (t) {
    case FSDP_F32: return MPI_FLOAT;
    case FSDP_F16: return mpibe_types.types[HALF_F16];
    case FSDP_BF16: return mpibe_types.types[HALF_BF16];
    case FSDP_I32: return MPI_INT32_T;
    case FSDP_I64: return MPI_INT64_T;
    case FSDP_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpibe_types_op(enum fsdp_dtype t, enum fsdp_redop op)
{
    int hop;
    switch (op) {
    case FSDP_SUM:
    case FSDP_AVG: hop = HOP_SUM; break;
    case FSDP_MAX: hop = HOP_MAX; break;
    case FSDP_MIN: hop = HOP_MIN; break;
    default: return MPI_OP_NULL;
    }
    if (t == FSDP_F16 || t == FSDP_BF16) {
        return mpibe_types.ops[t == FSDP_F16 ? HALF_F16 : HALF_BF16][hop];
    }
    return hop == HOP_SUM ? MPI_SUM : hop == HOP_MAX ? MPI_MAX : MPI_MIN;
}

void fsdp_mpi_types_fill(MPI_Datatype types[FSDP_DTYPE_COUNT],
                         MPI_Op ops[FSDP_DTYPE_COUNT][FSDP_REDOP_COUNT])
{
    for (int t = 0; t < FSDP_DTYPE_COUNT; t++) {
        types[t] = mpibe_types_datatype((enum fsdp_dtype)t);
        for (int op = 0; op < FSDP_REDOP_COUNT; op++) {
            ops[t][op] = mpibe_types_op((enum fsdp_dtype)t, (enum fsdp_redop)op);
        }
    }
}
