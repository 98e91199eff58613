/*
 * log.h - rank-aware logging with levels and subsystems.
 *
 * Configured once from the environment, on first use:
 *   FSDPC_LOG=LEVEL[,SUBSYS=LEVEL...]   levels: error warn info debug trace
 *                                       e.g. FSDPC_LOG=warn,tcp=debug
 *   FSDPC_LOG_RANKS=0|all|R[,R...]      which ranks print info and below
 *                                       (default 0: rank 0 only); warnings
 *                                       and errors print on every rank
 *   FSDPC_LOG_FILE=PATH                 append to PATH.<rank> instead of stderr
 * Lines look like "[fsdpc r3 WARN tcp] message".
 */
#ifndef FSDP_CORE_LOG_H
#define FSDP_CORE_LOG_H

enum fsdp_log_level {
    FSDP_LOG_ERROR = 0,
    FSDP_LOG_WARN,
    FSDP_LOG_INFO,
    FSDP_LOG_DEBUG,
    FSDP_LOG_TRACE,
};

enum fsdp_log_sub {
    FSDP_SUB_CORE = 0,
    FSDP_SUB_DIST,   /* store, groups, mesh */
    FSDP_SUB_MPI,    /* backends/mpi */
    FSDP_SUB_TCP,    /* backends/tcp */
    FSDP_SUB_NCCL,   /* backends/nccl */
    FSDP_SUB_MODEL,
    FSDP_SUB_FSDP,
    FSDP_SUB_TRAIN,
    FSDP_SUB_IO,
    FSDP_SUB_SAMPLE, /* fsdpc-sample */
    FSDP_SUB_COUNT,
};

/* From now on only warnings and errors print, unless FSDPC_LOG asked for
 * more (a program about to report an error and end). */
void fsdp_log_quiet(void);

/* Sets the rank printed in every line (default -1 until known). */
void fsdp_log_set_rank(int rank);
int fsdp_log_rank(void);

/* True when a message at level for sub would print on this rank. */
int fsdp_log_enabled(enum fsdp_log_level level, enum fsdp_log_sub sub);

void fsdp_log_at(enum fsdp_log_level level, enum fsdp_log_sub sub, const char *file, int line,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define FSDP_LOG(level, sub, ...)                                          \
    do {                                                                   \
        if (fsdp_log_enabled((level), (sub)))                              \
            fsdp_log_at((level), (sub), __FILE__, __LINE__, __VA_ARGS__);  \
    } while (0)

#define FSDP_ERROR(sub, ...) FSDP_LOG(FSDP_LOG_ERROR, sub, __VA_ARGS__)
#define FSDP_WARN(sub, ...) FSDP_LOG(FSDP_LOG_WARN, sub, __VA_ARGS__)
#define FSDP_INFO(sub, ...) FSDP_LOG(FSDP_LOG_INFO, sub, __VA_ARGS__)
#define FSDP_DEBUG(sub, ...) FSDP_LOG(FSDP_LOG_DEBUG, sub, __VA_ARGS__)
#define FSDP_TRACE(sub, ...) FSDP_LOG(FSDP_LOG_TRACE, sub, __VA_ARGS__)

#endif
