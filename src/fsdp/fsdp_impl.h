/*
 * fsdp_impl.h - the sharding engine's private state, shared by its files:
 *   shard.c   mesh and groups, the dim-0 row layout and its packing,
 *             every buffer, loading the shards, saving the model
 *   unit.c    the per-unit gather / reduce state machine: buffer slots,
 *             precision casts, replica all-reduces, polls and wait timers
 *   engine.c  the engine table: the overlap schedule, step, eval, save,
 *             destroy, clipping, AdamW, loss scaling
 */
#ifndef FSDP_FSDP_IMPL_H
#define FSDP_FSDP_IMPL_H

#include <stdint.h>

#include "fsdp/fsdp.h"
#include "comm/group.h"
#include "comm/mesh.h"
#include "io/ckpt.h"
#include "model/gpt2.h"
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
    float *master; /* (S,) f32 parameters; padding zero */
    float *grad;   /* (S,) reduced gradient, accumulated over micro-batches */
    float *m;      /* (S,) AdamW first moment */
    float *v;      /* (S,) AdamW second moment */
};

/*
 * A gathered-parameter buffer and its in-flight all-gather. The buffer is
 * the all-gather's receive buffer: the shards arrive packed (Rs blocks of
 * S, in the param dtype; a 16-bit send is cast into block rs first, in
 * place) and are unpacked into the unit layout within the buffer.
 */
struct fsdp_pslot {
    float *buf;        /* (floats,) the gathered unit in its layout, f32 for the kernels;
                          while its all-gather is in flight, the packed shards */
    struct fsdp_work *work; /* pending all-gather or NULL */
    double issued;     /* fsdp_now() at issue */
    double done;       /* when a progress poll first saw it complete; 0: not yet */
    size_t numel;      /* largest unit that maps here */
    size_t floats;     /* capacity: max(numel, Rs * S) over those units */
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
};

struct fsdp_shard_engine {
    struct fsdp_model_spec *spec;
    struct fsdp_gpt2 *model;
    struct fsdp_optimizer opt;         /* AdamW over this rank's shard ranges */
    struct fsdp_engine_config ec;
    int B, T;

    struct fsdp_dist *dist;            /* NULL: one rank, no launcher */
    int world_rank;
    struct fsdp_mesh *mesh;            /* NULL on one rank */
    struct fsdp_group *shard_g;        /* NULL when Rs == 1 */
    struct fsdp_group *rep_g[FSDP_MAX_REP_GROUPS]; /* replicas, size > 1 only */
    int n_rep;
    int Rs, rs;                        /* shard group size and rank */
    int world;                         /* data-parallel ranks: Rs * replicas */

    int n_units;
    struct fsdp_unit *units;           /* (n_units,) */
    size_t Smax;                       /* largest shard */

    int keep_gathered;                 /* params stay gathered from forward to backward */
    int n_pslots, n_gslots;
    struct fsdp_pslot *pslots;         /* [0]: unit 0 (the root), then a ring */
    struct fsdp_gslot *gslots;         /* [0]: unit 0, then a ring (or one per unit) */
    int *rqueue;                       /* (n_gslots,) pending reductions, in issue order */
    float *scratch;                    /* (scratch_floats,) a unit less its largest parameter,
                                          for packing in place (NULL when Rs == 1) */
    size_t scratch_floats;
    double *sum_buf;                   /* (world,) one double per rank of a group */
    int rq_head, rq_len;

    int shadow;                        /* this step: no batch here (join), collectives only */
    float scale;                       /* current loss scale (1 when off) */
    long good_steps;                   /* finite steps since the last change of scale */
    long skipped;

    double comm_total, comm_exposed;   /* seconds, since creation */
    size_t state_bytes, gathered_bytes, grad_bytes, comm_bytes;
};

/* shard.c */
/* Rows [*row0, *row0 + *rows) of parameter p that rank r of Rs holds: the
 * checkpoint format's row split (fsdp_ckpt_rows), so that a rank's shard is
 * exactly its piece of a checkpoint of the same mesh. */
static inline void fsdp_shard_rows(const struct fsdp_param_spec *p, int Rs, int r, size_t *row0,
                                   size_t *rows)
{
    fsdp_ckpt_rows(p->shape[0], Rs, r, row0, rows);
}
/*
 * Unit layout <-> shards packed rank after rank (Rs blocks of S elements,
 * padding zero), within buf (at least max(numel, Rs * S) floats), using
 * se->scratch. Packing casts to t (f32, bf16 or f16) after the move: t's
 * Rs * S values start at buf; unpacking casts from t before it.
 */
void fsdp_shard_unpack_inplace(const struct fsdp_shard_engine *se, int u, float *buf,
                               enum fsdp_dtype t);
void fsdp_shard_pack_inplace(const struct fsdp_shard_engine *se, int u, float *buf,
                             enum fsdp_dtype t);
/* The unit table, shard lengths and state shards for se->spec over se->Rs
 * ranks as rank se->rs, and the packing scratch. */
int fsdp_shard_layout_create(struct fsdp_shard_engine *se);
int fsdp_shard_setup(struct fsdp_shard_engine *se, const char *model_path);
void fsdp_shard_teardown(struct fsdp_shard_engine *se);
int fsdp_shard_save(struct fsdp_shard_engine *se, const char *path, const char *created_by);

/* ckpt.c */
struct fsdp_ckpt;
struct fsdp_ckpt_meta;
int fsdp_shard_ckpt_save(struct fsdp_shard_engine *se, const char *dir,
                         const struct fsdp_ckpt_meta *meta);
int fsdp_shard_ckpt_load(struct fsdp_shard_engine *se, struct fsdp_ckpt *ck);

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
/* Sum (op) of n values over every data-parallel rank: shard group, then replicas. */
int fsdp_world_allreduce(struct fsdp_shard_engine *se, void *buf, size_t n, enum fsdp_dtype t,
                         enum fsdp_redop op);
/* Blocking wait with the exposed/total timers; done: when a poll saw it
 * complete (0: not seen). Frees the handle. */
int fsdp_unit_wait(struct fsdp_shard_engine *se, struct fsdp_work **w, double issued,
                   double done);
/* Polls the collectives in flight (which also drives backends that progress
 * only inside their calls), notes when each completed, and moves finished
 * reduce-scatters on to their replica all-reduces. */
int fsdp_unit_progress(struct fsdp_shard_engine *se);

#endif
