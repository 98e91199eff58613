/*
 * fsdp_impl.h - the sharding engine's private state, shared by its files:
 *   shard.c   groups, the dim-0 row layout and its packing, every buffer,
 *             the state pieces (blocks of the whole tensors with tensor
 *             parallelism) and whole units gathered for saving
 *   shard_save.c  with tensor parallelism, the pieces re-laid out as a
 *             checkpoint shard's rows (save_rows): the exchange, its group
 *   unit.c    the per-unit gather / reduce state machine: buffer slots,
 *             precision casts, replica all-reduces, polls and wait timers
 *   engine.c  the engine table: the overlap schedule, step, eval, clipping,
 *             the optimizer update and loss scaling
 *   engine_check.c  the configuration and the parts checked before a build
 *   offload.c optimizer state in pinned host memory: the copy stream, the
 *             gradient shards staged device-to-host as their reductions
 *             finish, AdamW on the host, the master copied back
 * The model, the tensor-parallel plan and context and the optimizer are the
 * caller's parts (fsdp.h, struct fsdp_shard_parts), borrowed.
 */
#ifndef FSDP_PARALLEL_IMPL_H
#define FSDP_PARALLEL_IMPL_H

#include <stdint.h>

#include "parallel/fsdp.h"
#include "tp/tp_plan.h"
#include "comm/group.h"
#include "core/util.h"
#include "compute/device.h"
#include "model/model.h"
#include "tp/tp_ops.h"
#include "optim/optim.h"

#define FSDP_MAX_REP_GROUPS 2

/*
 * One unit's sharded state. Rank r holds, of every parameter of the unit,
 * the dim-0 rows fsdp_shard_rows gives, packed parameter after parameter
 * (its "shard"); shards are padded to a common length S so that rank r's
 * shard is block r of an all-gather.
 */
struct fsdp_unit {
    size_t numel;  /* elements of the whole unit */
    size_t first;  /* index of the unit's first parameter in the spec */
    size_t nparam; /* parameters in the unit */
    size_t S;      /* shard elements: the longest rank's (rounded up to 16 when sharded) */
    size_t cnt;    /* elements in this rank's shard (<= S; 0 possible) */
    size_t big;    /* spec index of the unit's largest parameter: moved in place when
                      the unit is packed or unpacked, the others through se->scratch */
    float *master; /* (S,) f32 parameters; padding zero. NULL under params,optim with a
                      16-bit param dtype: the master is hmaster, the device keeps send */
    float *grad;   /* (S,) reduced gradient, accumulated over micro-batches */
    float *m;      /* (S,) AdamW first moment (pinned host memory with offload) */
    float *v;      /* (S,) AdamW second moment (pinned host memory with offload) */
    /* offload only (offload.c), pinned host memory: */
    float *hgrad;   /* (S,) the reduced gradient shard, copied from grad once final */
    float *hmaster; /* (S,) f32 parameters: with params the master itself (the device
                       holding only what the all-gathers send), else a staged copy */
    uint16_t *send; /* (S,) params,optim with a 16-bit param dtype (se->send16): the master
                       in the param dtype on the device, what the all-gathers (and unit 0's
                       rows) read; NULL otherwise */
    int staged;     /* this step's D2H copy of grad into hgrad is issued */
};

/*
 * A gathered-parameter buffer and its in-flight all-gather. The buffer is
 * the all-gather's receive buffer: the shards arrive packed (Rs blocks of
 * S, in the param dtype; a 16-bit send is cast into block rs first, in
 * place) and are unpacked into the unit layout within the buffer.
 */
struct fsdp_pslot {
    void *buf;              /* (cap,) the gathered unit in its layout, in the param dtype (the
                               kernels read it so); while its all-gather is in flight, the
                               packed shards */
    struct fsdp_work *work; /* pending all-gather or NULL */
    double issued;     /* fsdp_now() at issue */
    double done;       /* when a progress poll first saw it complete; 0: not yet */
    size_t numel;      /* largest unit that maps here */
    size_t cap;        /* capacity in param-dtype elements: max(numel, Rs * S) over those units */
    int unit;          /* unit held (or being gathered); -1: none */
    int ready;         /* buf holds the unit: gathered and cast */
};

/*
 * A full-gradient buffer and its in-flight reduce-scatter. The buffer is
 * also the reduce-scatter's send and receive buffer: the gradient is packed
 * by shard (and cast to the reduce dtype) within it, and block rs receives
 * this rank's reduced shard, which the replica all-reduces also use.
 */
struct fsdp_gslot {
    float *buf;        /* (floats,) the unit's unsharded gradient in its layout; from its
                          reduce-scatter's issue to its retirement, the packed gradient */
    struct fsdp_work *work; /* pending reduce-scatter or NULL */
    double issued;
    double done;
    size_t numel;      /* largest unit that maps here */
    size_t floats;     /* capacity: max(numel, Rs * S) over those units */
    int unit;          /* unit whose reduction is pending; -1: none */
    int accumulate;    /* 1: add the result into the shard; 0: overwrite */
    int phase;         /* replica all-reduces issued after the reduce-scatter */
    int final;         /* the step's last reduction of the unit: offload stages the
                          gradient shard when it retires */
};

/*
 * Where rank r's rows of parameter i are, computed once for every (r, i)
 * (fsdp_shard_seg): every walk over shards (packing, the optimizer, the
 * state pieces) reads this table instead of redoing the row split.
 */
struct fsdp_shard_seg {
    size_t row0, rows;  /* rows [row0, row0 + rows) of the parameter */
    size_t unit_at;     /* where they start in the unit layout */
    size_t len;         /* rows * cols elements */
    size_t block_off;   /* where they start within rank r's block of the unit */
};

/* A piece of parameter `param`'s shard in whole-tensor coordinates (tensor
 * parallelism: a shard's rows of a tp-local tensor may be several blocks). */
struct fsdp_shard_tp_piece {
    size_t param;
    struct fsdp_tp_block b;
};

struct fsdp_shard_engine {
    struct fsdp_engine base;           /* the table the training layer sees */
    struct fsdp_device *dev;           /* where every buffer lives and the kernels run */
    struct fsdp_coll_attr attr;        /* the unit collectives' memory kind */
    const struct fsdp_model_spec *spec; /* what is sharded and computed: the tp-local
                                           table with tensor parallelism, else base.spec */
    const struct fsdp_model_spec *full; /* the whole table (base.spec) */
    const struct fsdp_tp_plan *plan;    /* borrowed; NULL without tensor parallelism */
    struct fsdp_tp *tp;                 /* the model's tp operators: the parts', else solo */
    struct fsdp_tp solo;                /* one rank's, when the parts hold no tp context */
    struct fsdp_shard_tp_piece *tp_pieces; /* (n_tp_pieces,) this rank's kind-0 pieces */
    size_t n_tp_pieces;
    struct fsdp_model *model;   /* borrowed: bound to the slots, used only from here */
    struct fsdp_optimizer *opt; /* borrowed: AdamW over this rank's shard ranges */
    struct fsdp_loss_scaler scaler;
    struct fsdp_shard_config ec;
    char mesh[128], backends[128];     /* for describe */

    int world_rank;
    struct fsdp_group *shard_g;        /* NULL when Rs == 1 */
    struct fsdp_group *rep_g[FSDP_MAX_REP_GROUPS]; /* replicas, size > 1 only */
    int n_rep;
    int Rs, rs;                        /* shard group size and rank */
    int world;                         /* data-parallel ranks: Rs * replicas */

    int n_units;
    struct fsdp_unit *units;           /* (n_units,) */
    struct fsdp_shard_seg *segs;       /* (Rs, n_params) */
    size_t Smax;                       /* largest shard */

    int keep_gathered;                 /* params stay gathered from forward to backward */
    int rows_root;                     /* the model computes unit 0 (and the units tied to it)
                                          from this rank's rows of it, exchanging activations
                                          over the shard group: unit 0 is never gathered and
                                          its gradient is only ever this rank's rows */
    int direct;                        /* one rank, f32, no replicas: the model computes on the
                                          shards themselves and the slots hold no buffers */
    int n_pslots, n_gslots;
    struct fsdp_pslot *pslots;         /* [0]: unit 0 (the root), then a ring */
    struct fsdp_gslot *gslots;         /* [0]: unit 0, then a ring (or one per unit) */
    int *rqueue;                       /* (n_gslots,) pending reductions, in issue order */
    float *scratch;                    /* (scratch_floats,) a unit less its largest parameter,
                                          for packing in place (NULL when Rs == 1) */
    float *save_buf;                   /* rows_root: unit 0 gathered whole by gather_unit,
                                          until the next op; with tensor parallelism every
                                          tp rank's local unit and the assembled whole one */
    size_t scratch_floats;
    float *relayout;                   /* save_rows' buffer, allocated at the first save
                                          (fsdp_shard_relayout_floats): the exchange's cuts
                                          to send, received and placed, or the
                                          reduce-scatters' n_shards row slots; a band of
                                          columns of a tensor at a time */
    size_t relayout_bound;             /* floats that buffer may take: FSDPC_CKPT_RELAYOUT_BYTES
                                          (64 MiB), read at create */
    int save_mode;                     /* FSDP_SAVE_*: how save_rows re-lays out (0: not yet
                                          chosen; FSDPC_CKPT_TP_SAVE, at the first save) */
    struct fsdp_group *save_g;         /* the exchange's: the dp-shard x tp ranks of this
                                          replica (tp's group when Rs == 1) */
    int save_own_g;                    /* save_g was made at the first save (and is freed) */
    int *save_rank;                    /* (Rs T,) save_g rank of checkpoint shard s */
    struct fsdp_work **save_w;         /* (2 Rs T,) one band's messages in flight */
    struct fsdp_comm_counts save_comm; /* what this rank's saves sent and received since
                                          creation (a send's bytes are its wire bytes) */
    struct fsdp_comm_counts save_mark; /* save_comm when the current save began */
    double save_kept, save_kept0;      /* bytes the exchange kept here (its own rows' cuts),
                                          since creation and when the current save began */
    double save_s;                     /* seconds in save_rows in the current save */
    double *sum_buf;                   /* (max(world, tp),) one double per rank of a group */
    double *dnorm;                     /* (1,) device: this rank's squared gradient norm;
                                          (2 + max(world, tp),) with room for a group sum's
                                          send and receive (fsdp_shard_sums_on_device) */
    void *comm_stream;                 /* the dp, rdp and tp collectives' stream (attr.stream) */
    void *ev_compute, *ev_comm;        /* the two streams' order (fsdp_unit_comm_begin/end) */
    int rq_head, rq_len;

    int shadow;                        /* this step: no batch here (join), collectives only */
    int u_lo, u_hi;                    /* the units a pass computes (a pipeline stage's; 0 and
                                          n_units - 1 without one) */
    unsigned char *own;                /* (n_units,) the units held (interleaved stages);
                                          NULL: [u_lo, u_hi] */
    /* Called on the squared gradient norm after the shard and tp sums (a
     * pipeline sums it over its stages); NULL: none. */
    int (*sumsq_hook)(void *arg, double *sumsq);
    void *sumsq_arg;
    /* Called with sumsq_arg once a step's reductions are done, before the
     * norm and the update (a pipeline sums a tied parameter's gradient
     * over the stages that hold it); NULL: none. */
    int (*pre_update)(void *arg);
    int norm_skip_root;                /* unit 0's gradient is another rank's copy: left out of
                                          the norm */
    int staged;                        /* a pipeline stage: unit 0 is never taken by rows */
    int sizing;                        /* fsdp_shard_engine_plan: every buffer is sized and
                                          counted, none allocated; the groups are shapes */

    double comm_total, comm_exposed;   /* seconds, since creation */
    struct fsdp_comm_counts unit_comm; /* the units' all-gathers and reduce-scatters over the
                                        shard group and all-reduces over the replicas,
                                        since creation (ring wire bytes, tp/tp_ops.h) */
    size_t state_bytes, gathered_bytes, grad_bytes, comm_bytes;
    /* offload (offload.c) */
    int offload;       /* enum fsdp_offload */
    float *host_state; /* pinned: every unit's m, v, hgrad and hmaster */
    void *state_mem;   /* the device's one state allocation (shard_state_alloc) */
    size_t host_bytes;
    void *copy_stream;       /* the offload's D2H and H2D copies */
    void *ev_grad, *ev_copy; /* compute -> copy, copy -> compute */
    int stage_grads;         /* the step's last micro-batch: a unit's gradient is
                                final once reduced (or computed, direct) */
    int hmaster_stale;       /* optim: the device master was written (a load):
                                hmaster is copied from it before the update */
    int send16;              /* params,optim with a 16-bit param dtype: no f32 master on
                                the device, units[u].send instead (offload.c) */
};

/* shard.c */
/* Rows [*row0, *row0 + *rows) of parameter p that rank r of Rs holds: the
 * checkpoint format's row split, so that a rank's shard is exactly its
 * piece of a checkpoint of the same mesh. */
static inline void fsdp_shard_rows(const struct fsdp_param_spec *p, int Rs, int r, size_t *row0,
                                   size_t *rows)
{
    fsdp_split_even(p->shape[0], Rs, r, row0, rows);
}
/* Rank r's segment of parameter i (the table above). */
static inline const struct fsdp_shard_seg *fsdp_shard_seg(const struct fsdp_shard_engine *se,
                                                          int r, size_t i)
{
    return &se->segs[(size_t)r * se->spec->n_params + i];
}
/*
 * Unit layout <-> shards packed rank after rank (Rs blocks of S elements,
 * padding zero), within buf (at least max(numel, Rs * S) elements), using
 * se->scratch. Packing moves f32 values and then casts to t (f32, bf16 or
 * f16): t's Rs * S values start at buf. Unpacking moves elements of t and
 * keeps them in t (gathered parameters stay in the param dtype).
 */
void fsdp_shard_unpack_inplace(const struct fsdp_shard_engine *se, int u, void *buf,
                               enum fsdp_dtype t);
void fsdp_shard_pack_inplace(const struct fsdp_shard_engine *se, int u, float *buf,
                             enum fsdp_dtype t);
/* The unit table, shard lengths and state shards for se->spec over se->Rs
 * ranks as rank se->rs, and the packing scratch. */
int fsdp_shard_layout_create(struct fsdp_shard_engine *se);
/* The shard group, the replica groups and the mesh names from g. */
void fsdp_shard_groups_set(struct fsdp_shard_engine *se, const struct fsdp_shard_groups *g);
/* Every slot and the packing scratch, on se->dev (after the layout, and
 * after the model has said whether it takes unit 0 by rows). */
int fsdp_shard_alloc_slots(struct fsdp_shard_engine *se);
void fsdp_shard_teardown(struct fsdp_shard_engine *se);
/* engine.c: whether the gradient norm's group sums go through the device
 * (a shard, replica or tp group whose backend takes no host memory). */
int fsdp_shard_sums_on_device(const struct fsdp_shard_engine *se);
/* Whether g's backend takes device memory only (nccl). */
int fsdp_shard_group_device_only(const struct fsdp_group *g);
/* The state pieces (engine.h) and whole units gathered for saving. */
size_t fsdp_shard_n_pieces(const struct fsdp_shard_engine *se);
void fsdp_shard_piece(struct fsdp_shard_engine *se, size_t k, struct fsdp_state_piece *out);
int fsdp_shard_gather_unit(struct fsdp_shard_engine *se, int u, const float **full);

/* shard_save.c */
enum { FSDP_SAVE_EXCHANGE = 1, FSDP_SAVE_REDUCE_SCATTER = 2 };
/* engine.h's save_rows: tensor (kind, i) of the whole table re-laid out
 * from every rank's blocks into the rows checkpoint shard base.shard of
 * base.n_shards holds. Collective over the save group (the exchange: the
 * replica that writes; the others return at once) or over the shard and tp
 * groups (the reduce-scatters: every rank); the first call makes the save
 * group, on every rank. */
int fsdp_shard_save_rows(struct fsdp_shard_engine *se, int kind, size_t i, float *out);
/* Floats of save_rows' re-layout buffer (0 without tensor parallelism):
 * the largest tensor's send, receive and placed rows for the exchange, or
 * its n_shards equal row slots for the reduce-scatters, a band of columns
 * within relayout_bound. */
size_t fsdp_shard_relayout_floats(const struct fsdp_shard_engine *se);
/* Frees the save group (when made here) and its tables. */
void fsdp_shard_save_fini(struct fsdp_shard_engine *se);
/* Floats gather_unit allocates for unit u (freed at the next op): unit 0 by
 * rows gathered whole, with tensor parallelism every tp rank's local unit
 * and the assembled whole one; 0 when it uses a slot. */
size_t fsdp_shard_gather_floats(const struct fsdp_shard_engine *se, int u);
/* Frees what gather_unit allocated for a unit by rows. */
void fsdp_shard_drop_saved(struct fsdp_shard_engine *se);
/* Unit u is one this rank holds (all of them, but for a pipeline stage). */
static inline int fsdp_shard_owns(const struct fsdp_shard_engine *se, int u)
{
    return se->own ? se->own[u] : u >= se->u_lo && u <= se->u_hi;
}
/* Unit u is given to the model as this rank's rows (rows_root, unit 0). */
static inline int fsdp_shard_by_rows(const struct fsdp_shard_engine *se, int u)
{
    return se->rows_root && u == 0;
}

/* engine.c: one micro-batch's passes over the units [u_lo, u_hi] (a
 * pipeline stage drives them in its own order), and the end of a step:
 * the reductions completed, *loss summed over the data-parallel ranks, the
 * clip and the update (the gathered units released). */
int fsdp_shard_mb_forward(struct fsdp_shard_engine *se, const int32_t *inputs,
                          const int32_t *targets);
int fsdp_shard_mb_backward(struct fsdp_shard_engine *se, int first, int reduce, int accumulate);
int fsdp_shard_mb_finish(struct fsdp_shard_engine *se, double lr, double *loss,
                         struct fsdp_step_result *out);
/* x summed over the data-parallel ranks (the shard group, then the replicas). */
int fsdp_shard_loss_sum(struct fsdp_shard_engine *se, double *x);
/* Binds unit u's gathered (or master) buffers to se->model. */
int fsdp_shard_bind_unit(struct fsdp_shard_engine *se, int u);
/* Unit 0's gradient before a backward that adds into it without running
 * unit 0's own (a tied head on a pipeline's last stage): its slot zeroed
 * when first, or the shard itself zeroed on the step's first micro-batch
 * without accumulation where the model adds into it directly. */
int fsdp_shard_root_begin(struct fsdp_shard_engine *se, int first, int accumulate);

/* unit.c */
int fsdp_unit_pslot(const struct fsdp_shard_engine *se, int u);
int fsdp_unit_gslot(const struct fsdp_shard_engine *se, int u);
int fsdp_unit_gather_issue(struct fsdp_shard_engine *se, int u);
int fsdp_unit_gather_wait(struct fsdp_shard_engine *se, int u);
void fsdp_unit_release(struct fsdp_shard_engine *se, int u);
void fsdp_unit_release_all(struct fsdp_shard_engine *se);
int fsdp_unit_reduce_issue(struct fsdp_shard_engine *se, int u, int accumulate);
int fsdp_unit_reduce_wait_slot(struct fsdp_shard_engine *se, int g);
int fsdp_unit_reduce_wait_all(struct fsdp_shard_engine *se);
/* Blocking wait with the exposed/total timers; done: when a poll saw it
 * complete (0: not seen). Frees the handle. */
/* Before a collective on the comm stream: it waits for what the compute
 * stream has issued so far (the gradients a reduce-scatter reads, the slot
 * a gather overwrites). After one is waited for: the compute stream waits
 * for it (the gathered parameters, the reduced gradient). */
int fsdp_unit_comm_begin(struct fsdp_shard_engine *se);
int fsdp_unit_comm_end(struct fsdp_shard_engine *se);
/* Creates the comm stream and the events (not when sizing); _fini frees them. */
int fsdp_unit_streams_init(struct fsdp_shard_engine *se);
void fsdp_unit_streams_fini(struct fsdp_shard_engine *se);
int fsdp_unit_wait(struct fsdp_shard_engine *se, struct fsdp_work **w, double issued,
                   double done);
/* Has the group layer drive the collectives in flight, notes when each
 * completed, and moves finished reduce-scatters on to their replica
 * all-reduces. */
int fsdp_unit_progress(struct fsdp_shard_engine *se);

/* engine.c: AdamW over unit u's shard, parameter by parameter (weight
 * decay as the table says): over master and grad on the device, or (host)
 * over the staged hmaster and hgrad on the host (offload). */
int fsdp_shard_update_unit(struct fsdp_shard_engine *se, int u, int host, float grad_scale);

/* engine_check.c: one error naming what does not fit, before anything is built */
int fsdp_shard_check_config(const struct fsdp_shard_config *ec);
/* the model and the optimizer on the table the plan cuts (or the whole
 * one), the tp context the plan's rank */
int fsdp_shard_check_parts(const struct fsdp_shard_parts *p);
/* every tie's parameter is unit 0's (the root's, kept gathered) */
int fsdp_shard_check_ties(const struct fsdp_model_spec *spec);
/* sets se->offload from the config (every mesh takes it) */
int fsdp_shard_check_offload(struct fsdp_shard_engine *se, const struct fsdp_shard_parts *p);
/* each group's backend takes the device's memory, or the group stages it */
int fsdp_shard_check_backends(const struct fsdp_shard_engine *se);

/* offload.c */
/* The copy stream and its events (not when sizing, nor without offload). */
int fsdp_offload_init(struct fsdp_shard_engine *se);
void fsdp_offload_fini(struct fsdp_shard_engine *se);
/* Issues the D2H copy of unit u's gradient shard into its host copy on
 * the copy stream, after what the compute stream has issued (once a step;
 * nothing without offload). */
int fsdp_offload_stage_grad(struct fsdp_shard_engine *se, int u);
/* A step starts: no gradient staged yet (also after a step that failed). */
void fsdp_offload_step_begin(struct fsdp_shard_engine *se);
/* AdamW on the host over every unit's staged shards (grad_scale: the
 * unscale and clip factor), the master copied back to the device; the
 * compute stream waits for those copies. */
int fsdp_offload_update(struct fsdp_shard_engine *se, float grad_scale);
/* A step that takes no update (overflow): the staged copies are dropped,
 * the compute stream ordered after them. */
int fsdp_offload_skip(struct fsdp_shard_engine *se);
/* The pieces were written: params, the host master to the device; optim,
 * the staged master is stale. */
int fsdp_offload_state_changed(struct fsdp_shard_engine *se);

#endif
