/*
 * flight.h - the flight recorder: a per-process ring buffer of the last N
 * collectives (group, seq, op, dtype, count, root, reduce op, state and
 * times), with per-group, per-op totals and a JSON dump.
 *
 * The group layer records every collective when it is issued and again when
 * a wait or test sees it finish; the watchdog scans the ring for collectives
 * past their deadline; the dump is what `fsdpc-flight merge` reads to name
 * the collective that some ranks entered and others did not. Recording costs
 * a clock read and an uncontended lock; nothing here allocates after create.
 *
 * The dump is one JSON object per file; every recorded collective sits on a
 * line of its own with its keys in a fixed order, which keeps the merge tool
 * a line reader (doc/debugging.md describes the format).
 */
#ifndef FSDP_COMM_FLIGHT_H
#define FSDP_COMM_FLIGHT_H

#include <stddef.h>
#include <stdint.h>

enum fsdp_coll_op {
    FSDP_COLL_ALLREDUCE = 0,
    FSDP_COLL_ALLGATHER,
    FSDP_COLL_REDUCE_SCATTER,
    FSDP_COLL_BROADCAST,
    FSDP_COLL_BARRIER,
    FSDP_COLL_SEND, /* point-to-point: recorded on the pair's channel (group "dp[0]:0>1") */
    FSDP_COLL_RECV,
    FSDP_COLL_OP_COUNT,
};

/* "allreduce", "all_gather", ... (torch.distributed's names). */
const char *fsdp_coll_op_name(enum fsdp_coll_op op);

enum fsdp_flight_state {
    FSDP_FLIGHT_ISSUED = 1,
    FSDP_FLIGHT_COMPLETED,
    FSDP_FLIGHT_FAILED,
    FSDP_FLIGHT_ABANDONED, /* freed without a completed wait (after an abort) */
};

#define FSDP_FLIGHT_MAX_GROUPS 64
#define FSDP_FLIGHT_NO_REDOP 0xff

struct fsdp_flight_entry {
    uint64_t id;       /* record number in this process, from 1 */
    uint64_t seq;      /* the group's collective number */
    size_t count;      /* elements per rank */
    double t_issue;    /* fsdp_now() */
    double t_done;     /* 0 while issued */
    double deadline_s; /* seconds after t_issue */
    int16_t group;     /* index from fsdp_flight_add_group */
    int16_t root;
    uint8_t op;        /* enum fsdp_coll_op */
    uint8_t dtype;     /* enum fsdp_dtype */
    uint8_t redop;     /* enum fsdp_redop or FSDP_FLIGHT_NO_REDOP */
    uint8_t state;     /* enum fsdp_flight_state */
    uint32_t tag;      /* point-to-point: what the caller says the message is */
};

struct fsdp_flight;

/* A ring of n >= 1 entries. */
int fsdp_flight_create(size_t n, int rank, int world_size, const char *host,
                       struct fsdp_flight **out);
void fsdp_flight_destroy(struct fsdp_flight *f);

/* Registers a group (name, world ranks); returns its index or an error. */
int fsdp_flight_add_group(struct fsdp_flight *f, const char *name, const int *world_ranks,
                          int size);
const char *fsdp_flight_group_name(const struct fsdp_flight *f, int group);

/* Records an issued collective (id and state are filled in); returns its id. */
uint64_t fsdp_flight_issue(struct fsdp_flight *f, struct fsdp_flight_entry *e);
/* Marks record id finished (state COMPLETED, FAILED or ABANDONED); a record
 * the ring has overwritten only adds to the totals when still found. */
void fsdp_flight_finish(struct fsdp_flight *f, uint64_t id, int state);

/* Copies record id into *out; 1 when the ring still holds it, else 0. */
int fsdp_flight_get(struct fsdp_flight *f, uint64_t id, struct fsdp_flight_entry *out);

/* Copies the oldest entry issued after `since`, unfinished, whose deadline
 * plus grace_s has passed at `now` into *out; 1 when there is one, else 0. */
int fsdp_flight_overdue(struct fsdp_flight *f, double now, double since, double grace_s,
                        struct fsdp_flight_entry *out);

/* Writes DIR/flight_<rank>.json (DIR created when missing); reason says why.
 * Safe from any thread; concurrent dumps are serialized. */
int fsdp_flight_dump(struct fsdp_flight *f, const char *dir, const char *reason);

/* Logs the per-group, per-op totals (count, bytes, time) at INFO. */
void fsdp_flight_log_summary(struct fsdp_flight *f);

#endif
