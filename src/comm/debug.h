/*
 * debug.h - the distributed debug layer: FSDPC_DEBUG levels, collective
 * deadlines, the flight recorder's process-wide instance, the watchdog and
 * DETAIL fingerprint checks. "Hangs become named errors."
 *
 * The group layer (group.c) calls these hooks around every collective; the
 * layer is set up by the first group a process creates and torn down by
 * fsdp_dist_finalize. One debug layer per process, as there is one job per
 * process.
 *
 * Environment (read once):
 *   FSDPC_DEBUG=OFF|INFO|DETAIL  INFO: log groups and a per-collective summary
 *                                at exit; DETAIL: also check every
 *                                collective's fingerprint across the group
 *   FSDPC_TIMEOUT                deadline of a collective (dist.h)
 *   FSDPC_INIT_TIMEOUT           deadline until fsdp_debug_mark_steady (the
 *                                first training step); default
 *                                max(FSDPC_TIMEOUT, 600 s)
 *   FSDPC_FLIGHT_RECORDER=N      ring size (default 2048; 0 disables the
 *                                recorder and the watchdog; INFO and DETAIL
 *                                keep at least 256 for their summary)
 *   FSDPC_FLIGHT_DIR             dump directory (default ./fsdpc-flight-dumps;
 *                                not ./fsdpc-flight, the merge tool's name)
 *   FSDPC_FLIGHT_DUMP_AT_EXIT=1  dump at fsdp_dist_finalize too
 * SIGUSR2 dumps the recorder of the process that receives it.
 *
 * The watchdog is the one place below the programs that aborts the job:
 * a collective still pending past its deadline means some rank is stuck
 * outside any call that could return an error (a stopped process, a
 * kernel that never ends), and only a job-wide abort frees the others.
 */
#ifndef FSDP_COMM_DEBUG_H
#define FSDP_COMM_DEBUG_H

#include <stddef.h>
#include <stdint.h>

#include "comm/flight.h"

struct fsdp_group;

#define FSDP_FLIGHT_DEFAULT_DIR "fsdpc-flight-dumps"

enum fsdp_debug_level {
    FSDP_DEBUG_OFF = 0,
    FSDP_DEBUG_INFO,
    FSDP_DEBUG_DETAIL,
};

/* What a collective call looked like on this rank. */
struct fsdp_debug_call {
    enum fsdp_coll_op op;
    int dtype;   /* enum fsdp_dtype */
    size_t count;
    int root;    /* group rank; 0 where the op has none */
    int redop;   /* enum fsdp_redop or -1 */
    uint32_t tag; /* send and recv: what the caller says the message is */
};

/* The level in force (FSDP_DEBUG_OFF before the first group). */
enum fsdp_debug_level fsdp_debug_level(void);

/* Registers a new group (sets up the layer on first use); *id receives the
 * group's index for the hooks below. */
int fsdp_debug_group_add(struct fsdp_group *g, int *id);

/* The deadline of g's collectives now: FSDPC_INIT_TIMEOUT until the first
 * step is marked done, the group's timeout after. */
double fsdp_debug_timeout(const struct fsdp_group *g);
/* Init and the first step are over: use the regular deadline from now on. */
void fsdp_debug_mark_steady(void);

/* Records collective g->seq as issued; returns its record id (0: none). */
uint64_t fsdp_debug_issued(struct fsdp_group *g, int id, const struct fsdp_debug_call *c);
/* The channel of g's point-to-point messages from group rank src to dst,
 * named "<g>:<src>><dst>" in the recorder's group table (its messages are
 * numbered apart from g's collectives); *id as fsdp_debug_group_add's. */
void fsdp_debug_channel_add(struct fsdp_group *g, int src, int dst, int *id);
/* Records message seq of channel id (send or recv) as issued. */
uint64_t fsdp_debug_issued_p2p(struct fsdp_group *g, int id, uint64_t seq,
                               const struct fsdp_debug_call *c);
/* The wait/test of record id ended with rc (0: complete). On error the
 * message is rewritten to name the collective, and the recorder dumped. */
int fsdp_debug_finished(uint64_t id, int rc, double waited_s);
/* The collective failed its DETAIL check (a mismatch, a rank that never
 * reached it): recorded as failed and dumped, the message, which already
 * names the collective, left alone. */
void fsdp_debug_refused(uint64_t id);
/* A handle freed before it completed. */
void fsdp_debug_abandoned(uint64_t id);

/* When the first collective error of the process was recorded (fsdp_now();
 * 0: none yet). Collectives issued before it are its fallout: the program
 * is already on its way to reporting the error, so the watchdog leaves them. */
double fsdp_debug_error_time(void);

/* Dumps the recorder (when there is one) with reason; errors are logged. */
void fsdp_debug_dump(const char *reason);

/* Summary at INFO, dump when FSDPC_FLIGHT_DUMP_AT_EXIT=1, threads stopped. */
void fsdp_debug_finalize(void);

/* What the debug layer calls an op in its messages: "message" (send,
 * recv) or "collective". */
const char *fsdp_debug_op_kind(enum fsdp_coll_op op);

/* The call a flight record describes. */
void fsdp_debug_entry_call(const struct fsdp_flight_entry *e, struct fsdp_debug_call *c);

/* "all_gather(bf16, 1024)", with root or reduce op where they matter. */
void fsdp_debug_call_str(const struct fsdp_debug_call *c, char *buf, size_t len);

// ----------------------------------------------------------------------------
// fingerprint.c: DETAIL's per-group check that every member made the same call

struct fsdp_work;
struct fsdp_fingerprint;

/* The group's checker; *out stays NULL when the group cannot be checked
 * (a backend without host memory: logged). Call after the backend exists. */
int fsdp_fingerprint_create(struct fsdp_group *g, struct fsdp_fingerprint **out);
/* Ends exchanges nobody waited for (aborting the backend if one is pending). */
void fsdp_fingerprint_destroy(struct fsdp_fingerprint *fp);
/* Collective g->seq is about to be issued: issues its fingerprint exchange
 * (and, in the strict mode, checks it: FSDP_ERR_MISMATCH naming both ranks
 * and calls, or FSDP_ERR_TIMEOUT naming the ranks that never reached it). */
int fsdp_fingerprint_issue(struct fsdp_fingerprint *fp, const struct fsdp_debug_call *c);
/* The backend refused collective g->seq with rc: the mismatch of an
 * earlier collective when one explains it (the message replaced), else rc. */
int fsdp_fingerprint_refused(struct fsdp_fingerprint *fp, int rc);
/* Ties collective g->seq, just issued, to its handle w. */
void fsdp_fingerprint_bind(struct fsdp_fingerprint *fp, struct fsdp_work *w);
/* Before w's own wait: checks the exchanges up to w's collective, waiting
 * up to timeout_s for them (deadline: the timeout is the group's deadline;
 * else a timeout is the caller's poll and fails nothing). On a mismatch or
 * a failed exchange the group's backend is aborted and the error is sticky. */
int fsdp_fingerprint_wait(struct fsdp_fingerprint *fp, struct fsdp_work *w, double timeout_s,
                          int deadline);
/* After w's test: finished (complete or failed) checks up to w's
 * collective; otherwise only the exchanges already complete are checked. */
int fsdp_fingerprint_test(struct fsdp_fingerprint *fp, struct fsdp_work *w, int finished);
/* A collective of the group failed with rc (peer lost, aborted): the
 * mismatch behind it when this or another member found one (the message is
 * replaced), else rc. */
int fsdp_fingerprint_explain(struct fsdp_fingerprint *fp, int rc);
/* w is freed: its check is left to a later wait or to the ring. */
void fsdp_fingerprint_release(struct fsdp_fingerprint *fp, const struct fsdp_work *w);
/* Stops the thread that publishes the last fingerprints (debug finalize). */
void fsdp_fingerprint_shutdown(void);

// ----------------------------------------------------------------------------
// watchdog.c: the thread that watches deadlines and answers SIGUSR2

struct fsdp_watchdog;
int fsdp_watchdog_start(struct fsdp_flight *f, struct fsdp_watchdog **out);
void fsdp_watchdog_stop(struct fsdp_watchdog *w);

#endif
