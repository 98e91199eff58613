/*
 * pp_engine_impl.h - the pipeline runtime's private state, shared by its
 * files:
 *   pp_engine.c  the step: the schedule's passes with their boundary
 *                messages, the held stage inputs, eval, the sums over the
 *                stages, setup and teardown
 *   pp_state.c   the state seen from outside the stage: pieces, whole units
 *                brought to world rank 0, checkpoint rows brought to stage 0
 * The sharding engine (fsdp_impl.h) keeps the model state; these files keep
 * only the boundary buffers and the schedule.
 */
#ifndef FSDP_PARALLEL_PP_ENGINE_IMPL_H
#define FSDP_PARALLEL_PP_ENGINE_IMPL_H

#include "parallel/pp_engine.h"
#include "parallel/pp_comm.h"
#include "parallel/fsdp_impl.h"
#include "comm/counts.h"

struct pp_engine {
    struct fsdp_engine base;
    struct fsdp_engine *inner;    /* the stage's sharding engine (owned) */
    struct fsdp_shard_engine *se; /* its state */
    struct fsdp_model *model;     /* borrowed: the inner engine's parts (chunk 0's first) */
    struct fsdp_model **models;   /* (n_models) every chunk's instances, chunk after chunk:
                                     one activation set per micro-batch it holds; [1 ..] owned */
    int n_models;
    int *inst0;                   /* (V + 1) each chunk's first instance in models */
    int *inst_of;                 /* (V M) instance of each (chunk, micro-batch) since its
                                     forward; kept after its backward for the send; -1 */
    int *inst_busy;               /* (n_models) holds a micro-batch whose backward has not run */
    struct fsdp_group *pp;        /* activations (and the stage-to-stage state messages) */
    struct fsdp_group *pp_grad;   /* the same ranks' gradients, a queue of their own (owned) */
    struct fsdp_pp_config pc;
    int *first;                    /* (S + 1,) a copy of pc.first */
    int P, V, S, stage, lo, hi, L; /* stage: this rank in the pipeline group */
    int *clo, *chi;                /* (V,) each chunk's units */
    int *n_bwd;                    /* (V,) backwards of each chunk so far this step */
    struct fsdp_pp_schedule sched;
    struct fsdp_pp_step *steps; /* (n_steps,) */
    size_t n_steps;
    size_t count;     /* B T C: one boundary message */
    size_t n_held;    /* slots of received stage inputs: the most the steps hold at once */
    float *held;      /* (n_held, count) device: stage inputs (stage > 0) */
    int *slot_of;     /* (V M,) held slot of each (chunk, micro-batch); -1: none */
    int *slot_busy;   /* (n_held,) */
    size_t n_gbuf;    /* slots of received output gradients: the most held at once */
    float *gbuf;      /* (n_gbuf, count) device: received output gradients */
    int *gbuf_of;     /* (V M,) */
    int *gbuf_busy;   /* (n_gbuf,) */
    float *slot[2];   /* (count) device: the send in flight of each direction (0
                         activations, 1 gradients); NULL where this rank sends none */
    struct fsdp_work *slot_w[2]; /* that send, waited before the slot is written again */
    void *lane[2];               /* each direction's boundary messages on a stream of their own (a
                                    GPU runs a stream's operations in order: one queue per group,
                                    apart from the sharding engine's collectives); NULL: none */
    void *lane_in[2], *lane_out[2]; /* events: the lane after the compute stream, back */
    float *unit_buf;  /* world rank 0: a unit received from its stage */
    float *save_buf;  /* stage 0 of a writing pipeline: a tensor's rows received for a
                         checkpoint (at the first save) */
    float *save_host; /* the owning stage's rows re-laid out from tp blocks (host) */
    int tied_last;    /* this rank runs the last stage and holds a copy of unit 0 */
    float *tie_buf;   /* (units[0].S) device: the other copy's gradient shard */
    double *sums;     /* (P,) the pipeline sum's all-gather */
    double *dsums;    /* (1 + P) device: its send and receive where the pp group's
                         backend takes no host memory (nccl); else NULL */
    size_t held_now, peak;
    long n_fwd; /* this step: forward passes run (chunks' passes) */
    long step_no;
    double idle_s;                  /* this step: seconds blocked in the boundary messages */
    struct fsdp_comm_counts bounds; /* the step's boundary messages (sends, receives) */
    double pass_s; /* FSDPC_PP_PASS_MS: a synthetic pass time added to each forward and
                      twice to each backward; 0: none */
    char *order;   /* the executed passes of the step, for the log */
    size_t order_len, order_cap;
};

static inline struct pp_engine *pp_impl(const struct fsdp_engine *e)
{
    return e->impl;
}

static inline struct fsdp_device *pp_dev(const struct pp_engine *pe)
{
    return pe->se->dev;
}

/* A message of n floats in device memory to or from pipeline rank peer,
 * ordered after what the compute stream has issued and before what it
 * issues next, waited for; the wait counts as the step's idle time. On
 * the pipeline group (fsdp_pp_xfer) or on g. */
int fsdp_pp_xfer(struct pp_engine *pe, int send, void *buf, size_t n, int peer, unsigned tag);

/* A boundary receive of direction dir (0 activations on pp, 1 gradients on
 * pp_grad) into buf (count floats, device), on the direction's lane,
 * waited for (idle time). */
int fsdp_pp_recv_dir(struct pp_engine *pe, int dir, float *buf, int peer, unsigned tag);
/* The lanes' streams and events (none on a device without streams), and
 * their release. */
int fsdp_pp_lanes_init(struct pp_engine *pe);
void fsdp_pp_lanes_fini(struct pp_engine *pe);

/* A boundary send of direction dir (0 activations on pp, 1 gradients on
 * pp_grad) that the compute does not wait for: src (count floats, device)
 * is copied into the direction's slot on the compute stream and sent from
 * there; the slot's previous send is waited for first (idle time). */
int fsdp_pp_send_async(struct pp_engine *pe, int dir, const float *src, int peer, unsigned tag);
/* Waits for direction dir's send in flight, if any (idle time). */
int fsdp_pp_slot_wait(struct pp_engine *pe, int dir);

/* pp_state.c: the engine table's state ops (engine.h) */
size_t fsdp_pp_n_pieces(const struct fsdp_engine *e);
void fsdp_pp_piece(struct fsdp_engine *e, size_t k, struct fsdp_state_piece *out);
int fsdp_pp_state_changed(struct fsdp_engine *e);
int fsdp_pp_gather_unit(struct fsdp_engine *e, int u, const float **full);
int fsdp_pp_save_rows(struct fsdp_engine *e, int kind, size_t param, float *out);
void fsdp_pp_get_counters(const struct fsdp_engine *e, struct fsdp_engine_counters *c);
void fsdp_pp_set_counters(struct fsdp_engine *e, const struct fsdp_engine_counters *c);

#endif
