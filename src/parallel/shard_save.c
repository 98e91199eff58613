/*
 * shard_save.c - tensor parallelism: the state as the whole rows of a
 * checkpoint shard (engine.h's save_rows), for the training layer to write.
 *
 * Checkpoint shard s = rs T + t (shard rank rs, tp rank t) of R = Rs T holds
 * rows fsdp_split_even(n, R, s) of every tensor, every column, so that a
 * checkpoint of a tensor-parallel run is laid out exactly as one of a
 * data-parallel run of R ranks and every reader and tool takes it as it is.
 * A rank's state is blocks of the whole tensors (shard.c's tp pieces), not
 * those rows, so each tensor is re-laid out before it is written, in one of
 * two ways (FSDPC_CKPT_TP_SAVE):
 *
 *   exchange (the default): point-to-point messages over the save group,
 *   the dp-shard x tp ranks of this replica (the tp group when Rs == 1,
 *   else a group made at the first save). Every rank cuts each of its
 *   blocks to the rows of each checkpoint shard it covers and sends each
 *   cut once, to the rank that writes those rows (a replicated parameter's
 *   rows only from tp rank 0, its one holder that sends); it receives the
 *   cuts of its own rows from the ranks that hold them. Each rank sends at
 *   most its shard of the state per save (less what stays with it), and
 *   only the replica that writes takes part.
 *
 *   reduce-scatter: each rank puts its blocks into a zeroed buffer of R row
 *   slots and two reduce-scatters (over the shard group, then over tp) sum
 *   the buffers into each rank's slot. Exact (the blocks are disjoint: one
 *   value added to zeros), but each rank moves about the whole tensor, so
 *   a save moves O(model) per rank. Kept for backends without
 *   point-to-point operations and as the exchange's reference.
 *
 * Both go through a tensor a band of columns at a time when their buffers
 * would pass FSDPC_CKPT_RELAYOUT_BYTES (64 MiB), and write the same rows.
 * With offload the moments (and with params the master) are pinned host
 * memory: their cuts reach the device buffers by H2D copies on the
 * device's stream, which the host waits for before it may write the
 * pieces again; everything sent and received stays device memory.
 * This file allocates only the re-layout buffer (at the first save) and the
 * save group's tables; it never opens a file.
 */
#include "config.h"
#include "parallel/fsdp_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SAVE_TAG 0x5341u /* "SA": the exchange's messages */

// ----------------------------------------------------------------------------
// the method and the save group

/* The method FSDPC_CKPT_TP_SAVE names (the exchange by default), or an
 * error naming the value. */
static int save_mode_env(int *mode)
{
    const char *v = fsdp_env_str("FSDPC_CKPT_TP_SAVE", "exchange");
    if (strcasecmp(v, "exchange") == 0) {
        *mode = FSDP_SAVE_EXCHANGE;
    } else if (strcasecmp(v, "reduce-scatter") == 0) {
        *mode = FSDP_SAVE_REDUCE_SCATTER;
    } else {
        int rc = fsdp_err(FSDP_ERR_INVALID, "FSDPC_CKPT_TP_SAVE=%s: unknown method", v);
        fsdp_err_hint("FSDPC_CKPT_TP_SAVE is exchange (the default) or reduce-scatter");
        return rc;
    }
    return 0;
}

/* Can g's backend send and receive? */
static int save_can_p2p(const struct fsdp_group *g)
{
    struct fsdp_backend_caps caps = {0};
    g->ops->capabilities(g->be, &caps);
    return (caps.flags & FSDP_CAP_SEND_RECV) != 0;
}

static int save_int_cmp(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/*
 * The save group and where each checkpoint shard's rank sits in it. The
 * mesh is row-major, so the world rank of shard rank rs and tp rank t is
 * this rank's, moved by the shard group's and the tp group's offsets; the
 * group's members ascend, so shard s is member save_rank[s]. Every rank
 * makes one (each replica its own), so the groups made after it agree.
 */
static int save_group_create(struct fsdp_shard_engine *se)
{
    const int T = se->tp->size, N = se->Rs * T;
    struct fsdp_group *tg = se->tp->g;
    se->save_rank = calloc((size_t)N, sizeof(int));
    se->save_w = calloc(2 * (size_t)N, sizeof(*se->save_w));
    int *world = calloc((size_t)N, sizeof(int));
    if (!se->save_rank || !se->save_w || !world) {
        free(world);
        return fsdp_err(FSDP_ERR_NOMEM, "fsdp: the checkpoint exchange's tables");
    }
    if (!se->shard_g) {
        for (int s = 0; s < N; s++) {
            se->save_rank[s] = s;
        }
        se->save_g = tg;
        free(world);
        return 0;
    }
    const struct fsdp_group *sg = se->shard_g;
    const int me = sg->world_ranks[sg->rank];
    for (int s = 0; s < N; s++) {
        world[s] = sg->world_ranks[s / T] + tg->world_ranks[s % T] - me;
    }
    int *sorted = calloc((size_t)N, sizeof(int));
    if (!sorted) {
        free(world);
        return fsdp_err(FSDP_ERR_NOMEM, "fsdp: the checkpoint exchange's tables");
    }
    memcpy(sorted, world, (size_t)N * sizeof(int));
    qsort(sorted, (size_t)N, sizeof(int), save_int_cmp);
    for (int s = 0; s < N; s++) {
        int *at = bsearch(&world[s], sorted, (size_t)N, sizeof(int), save_int_cmp);
        se->save_rank[s] = (int)(at - sorted);
    }
    char name[64];
    snprintf(name, sizeof(name), "save[%d]", sorted[0]);
    int rc = fsdp_group_create(sg->dist, name, sorted, N, sg->ops, &se->save_g);
    free(sorted);
    free(world);
    FSDP_CHECK(rc);
    se->save_own_g = 1;
    if (sg->stager) {
        (void)fsdp_group_set_stager(se->save_g, sg->stager);
    }
    return 0;
}

/* At the first save (and after a first save that failed here): the
 * method, and for the exchange its group. */
static int save_setup(struct fsdp_shard_engine *se)
{
    int mode;
    fsdp_shard_save_fini(se); /* what a failed setup left */
    FSDP_CHECK(save_mode_env(&mode));
    if (mode == FSDP_SAVE_EXCHANGE) {
        FSDP_CHECK(save_group_create(se));
        if (!save_can_p2p(se->save_g)) {
            FSDP_INFO(FSDP_SUB_FSDP,
                      "checkpoint re-layout: backend %s has no point-to-point operations; "
                      "tensor-parallel saves go through reduce-scatters",
                      se->save_g->ops->name);
            mode = FSDP_SAVE_REDUCE_SCATTER;
        }
    }
    se->save_mode = mode;
    return 0;
}

void fsdp_shard_save_fini(struct fsdp_shard_engine *se)
{
    if (se->save_own_g) {
        fsdp_group_destroy(se->save_g);
    }
    se->save_g = NULL;
    se->save_own_g = 0;
    free(se->save_rank);
    free(se->save_w);
    se->save_rank = NULL;
    se->save_w = NULL;
}

// ----------------------------------------------------------------------------
// the exchange: who sends whom which cuts

/* A cut of a block: rows [row0, row0 + rows) and columns [col0, col0 +
 * cols) of the whole tensor; at: where its first element sits in the
 * sending rank's shard of the tensor's kind (row stride ld). */
struct save_cut {
    size_t row0, rows, col0, cols;
    size_t at, ld;
};

/* Rows of tensor i that checkpoint shard s writes. */
static void save_rows_of(const struct fsdp_shard_engine *se, size_t i, size_t s, size_t *row0,
                         size_t *rows)
{
    fsdp_split_even(se->full->params[i].shape[0], (size_t)se->base.n_shards, s, row0, rows);
}

/*
 * The cuts of tensor i that checkpoint shard src's rank sends dst's, in
 * columns [c0, c0 + w): src's blocks (none of a replicated tensor but on tp
 * rank 0) cut to dst's rows and the band, in block order; both ends
 * enumerate the same. Returns the count (at most FSDP_TP_MAX_CHUNKS),
 * *floats their elements.
 */
static size_t save_cuts(const struct fsdp_shard_engine *se, size_t i, size_t src, size_t dst,
                        size_t c0, size_t w, struct save_cut *out, size_t *floats)
{
    const size_t T = (size_t)se->tp->size;
    const int rs = (int)(src / T), t = (int)(src % T);
    struct fsdp_tp_block b[FSDP_TP_MAX_CHUNKS];
    size_t d0, dn, n = 0;
    *floats = 0;
    if (fsdp_tp_plan_replicated(se->plan, i) && t != 0) {
        return 0;
    }
    save_rows_of(se, i, dst, &d0, &dn);
    const struct fsdp_shard_seg *g = fsdp_shard_seg(se, rs, i);
    const size_t ld = se->spec->params[i].shape[1];
    size_t k = fsdp_tp_plan_blocks(se->plan, i, t, g->row0, g->rows, b);
    for (size_t j = 0; j < k; j++) {
        size_t r0 = b[j].row0 > d0 ? b[j].row0 : d0;
        size_t r1 = b[j].row0 + b[j].rows < d0 + dn ? b[j].row0 + b[j].rows : d0 + dn;
        size_t a = b[j].col0 > c0 ? b[j].col0 : c0;
        size_t e = b[j].col0 + b[j].cols < c0 + w ? b[j].col0 + b[j].cols : c0 + w;
        if (r0 >= r1 || a >= e) {
            continue;
        }
        size_t local = b[j].local_row - g->row0 + (r0 - b[j].row0);
        out[n++] = (struct save_cut){.row0 = r0,
                                     .rows = r1 - r0,
                                     .col0 = a,
                                     .cols = e - a,
                                     .at = g->block_off + local * ld + (a - b[j].col0),
                                     .ld = ld};
        *floats += (r1 - r0) * (e - a);
    }
    return n;
}

/* rows x cols floats from src (row stride sld) to dst (row stride dld) on
 * the device's stream, into device memory from device memory or (host)
 * from pinned host memory: one copy when both are contiguous. */
static int save_copy2d(struct fsdp_device *dev, float *dst, size_t dld, const float *src,
                       size_t sld, size_t rows, size_t cols, int host)
{
    const enum fsdp_copy_dir dir = host ? FSDP_COPY_H2D : FSDP_COPY_D2D;
    if (dld == cols && sld == cols) {
        return dev->ops->copy(dev, dst, src, rows * cols * sizeof(float), dir, dev->stream);
    }
    for (size_t r = 0; r < rows; r++) {
        FSDP_CHECK(dev->ops->copy(dev, dst + r * dld, src + r * sld, cols * sizeof(float), dir,
                                  dev->stream));
    }
    return 0;
}

/* Whether tensor kind `kind` lives in host memory: offloaded, the moments,
 * and with params the master (offload.c). */
static int save_host_kind(const struct fsdp_shard_engine *se, int kind)
{
    return se->offload != FSDP_OFFLOAD_NONE &&
           (kind > 0 || se->offload == FSDP_OFFLOAD_PARAMS_OPTIM);
}

/* This rank's shard of tensor kind `kind` (the unit's master, m or v; the
 * pieces' own memory, host or device: save_host_kind). */
static const float *save_base(const struct fsdp_shard_engine *se, int kind, size_t i)
{
    const struct fsdp_unit *un = &se->units[se->spec->params[i].unit];
    const int params = se->offload == FSDP_OFFLOAD_PARAMS_OPTIM;
    const float *const base[3] = {params ? un->hmaster : un->master, un->m, un->v};
    return base[kind];
}

/*
 * The partner of checkpoint shard s in round r of N (rounds 0 .. N - 2, or
 * N - 1 when N is odd): the circle method, which meets every pair once and
 * in every round pairs each shard with one other (or none: -1, a bye).
 */
static int save_partner(int s, int r, int N)
{
    const int M = N % 2 ? N : N - 1; /* shards on the circle; shard M is fixed */
    int p;
    if (s == M) {
        p = r;
    } else if (s == r) {
        p = M;
    } else {
        p = ((2 * r - s) % M + M) % M;
    }
    return p < N ? p : -1;
}

/* The exchange's rounds for N shards. */
static int save_rounds(int N)
{
    return N % 2 ? N : N - 1;
}

/*
 * Columns [c0, c0 + w) of tensor (kind, i) into rows (this shard's rows of
 * the band, row-major): the cuts that stay are copied, those for other
 * shards packed into send (partner after partner, in the rounds' order),
 * every message posted in that order (in a pair the lower shard sends
 * first: a group's operations start one at a time on tcp, so this order
 * meets every pair and cannot wait on itself), all waited for, and what
 * came placed from recv. Every row of the band comes from one cut.
 */
static int save_exchange_band(struct fsdp_shard_engine *se, int kind, size_t i, size_t c0, size_t w,
                              float *send, float *recv, float *rows)
{
    const int N = se->base.n_shards, me = se->base.shard, n_rounds = save_rounds(N);
    const float *base = save_base(se, kind, i);
    const int host = save_host_kind(se, kind);
    struct save_cut cut[FSDP_TP_MAX_CHUNKS];
    size_t my0, myn, nf, so = 0, ro = 0;
    save_rows_of(se, i, (size_t)me, &my0, &myn);
    FSDP_CHECK(fsdp_device_zero(se->dev, rows, myn * w * sizeof(float)));
    for (int r = -1; r < n_rounds; r++) { /* -1: what stays here */
        int p = r < 0 ? me : save_partner(me, r, N);
        size_t k = p < 0 ? 0 : save_cuts(se, i, (size_t)me, (size_t)p, c0, w, cut, &nf);
        for (size_t j = 0; j < k; j++) {
            float *to = r < 0 ? rows + (cut[j].row0 - my0) * w + (cut[j].col0 - c0) : send + so;
            FSDP_CHECK(save_copy2d(se->dev, to, r < 0 ? w : cut[j].cols, base + cut[j].at,
                                   cut[j].ld, cut[j].rows, cut[j].cols, host));
            so += r < 0 ? 0 : cut[j].rows * cut[j].cols;
            se->save_kept += r < 0 ? (double)(cut[j].rows * cut[j].cols * sizeof(float)) : 0;
        }
    }
    FSDP_CHECK(fsdp_unit_comm_begin(se));
    int rc = 0, nw = 0;
    so = 0;
    for (int r = 0; r < n_rounds && rc == 0; r++) {
        int p = save_partner(me, r, N);
        size_t out_n = 0, in_n = 0;
        if (p < 0) {
            continue;
        }
        (void)save_cuts(se, i, (size_t)me, (size_t)p, c0, w, cut, &out_n);
        (void)save_cuts(se, i, (size_t)p, (size_t)me, c0, w, cut, &in_n);
        for (int step = 0; step < 2 && rc == 0; step++) {
            int sending = (step == 0) == (me < p);
            size_t n = sending ? out_n : in_n;
            if (n == 0) {
                continue;
            }
            rc = sending ? fsdp_send(se->save_g, send + so, n, FSDP_F32, se->save_rank[p], SAVE_TAG,
                                     &se->attr, &se->save_w[nw])
                         : fsdp_recv(se->save_g, recv + ro, n, FSDP_F32, se->save_rank[p], SAVE_TAG,
                                     &se->attr, &se->save_w[nw]);
            nw += rc == 0;
            if (rc == 0) {
                fsdp_comm_count(&se->save_comm, sending ? FSDP_COLL_SEND : FSDP_COLL_RECV, 2,
                                (double)(n * sizeof(float)));
            }
        }
        so += out_n;
        ro += in_n;
    }
    for (int k = 0; k < nw; k++) { /* every posted message, after a failure too */
        int wrc = fsdp_work_wait(se->save_w[k], -1.0);
        rc = rc < 0 ? rc : wrc;
        fsdp_work_free(se->save_w[k]);
        se->save_w[k] = NULL;
    }
    FSDP_CHECK(rc);
    FSDP_CHECK(fsdp_unit_comm_end(se));
    ro = 0;
    for (int r = 0; r < n_rounds; r++) {
        int p = save_partner(me, r, N);
        size_t k = p < 0 ? 0 : save_cuts(se, i, (size_t)p, (size_t)me, c0, w, cut, &nf);
        for (size_t j = 0; j < k; j++) {
            FSDP_CHECK(save_copy2d(se->dev, rows + (cut[j].row0 - my0) * w + (cut[j].col0 - c0), w,
                                   recv + ro, cut[j].cols, cut[j].rows, cut[j].cols, 0));
            ro += cut[j].rows * cut[j].cols;
        }
    }
    return 0;
}

/* Rows of tensor i this rank's blocks hold (every band's cuts lie in them). */
static size_t save_held_rows(const struct fsdp_shard_engine *se, size_t i)
{
    size_t n = 0;
    for (size_t k = 0; k < se->n_tp_pieces; k++) {
        n += se->tp_pieces[k].param == i ? se->tp_pieces[k].b.rows : 0;
    }
    return n;
}

/* Columns per band of the exchange for tensor i: its three buffers (the
 * held rows to send, this shard's rows received and placed) within
 * se->relayout_bound floats (at least one column). */
static size_t save_exchange_cols(const struct fsdp_shard_engine *se, size_t i)
{
    size_t r0, myn, m = se->full->params[i].shape[1];
    save_rows_of(se, i, (size_t)se->base.shard, &r0, &myn);
    size_t per = save_held_rows(se, i) + 2 * myn, w = se->relayout_bound / (per ? per : 1);
    return w < 1 ? 1 : w > m ? m : w;
}

/* The exchange's buffer for tensor i: send, recv and rows, in floats. */
static void save_exchange_floats(const struct fsdp_shard_engine *se, size_t i, size_t *send,
                                 size_t *recv)
{
    size_t r0, myn, w = save_exchange_cols(se, i);
    save_rows_of(se, i, (size_t)se->base.shard, &r0, &myn);
    *send = save_held_rows(se, i) * w;
    *recv = myn * w;
}

/* Tensor (kind, i) through the exchange into out (this shard's rows, every
 * column; NULL: not copied to the host), a band at a time. */
static int save_exchange(struct fsdp_shard_engine *se, int kind, size_t i, float *out)
{
    const size_t m = se->full->params[i].shape[1], step = save_exchange_cols(se, i);
    size_t r0, myn, sendf, recvf;
    save_rows_of(se, i, (size_t)se->base.shard, &r0, &myn);
    save_exchange_floats(se, i, &sendf, &recvf);
    float *send = se->relayout, *recv = send + sendf, *rows = recv + recvf;
    for (size_t c0 = 0; c0 < m; c0 += step) {
        const size_t w = m - c0 < step ? m - c0 : step;
        FSDP_CHECK(save_exchange_band(se, kind, i, c0, w, send, recv, rows));
        /* into the host's rows: the one way device memory reaches a file */
        for (size_t j = 0; out && j < myn; j++) {
            FSDP_CHECK(se->dev->ops->copy(se->dev, out + j * m + c0, rows + j * w,
                                          w * sizeof(float), FSDP_COPY_D2H, se->dev->stream));
        }
        if (out && myn > 0) {
            FSDP_CHECK(se->dev->ops->synchronize(se->dev, se->dev->stream));
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the reduce-scatters: R row slots of ceil(n / R) rows, summed

/* The slot and the row within it of whole row r of n over R shards. */
static void shard_row_slot(size_t n, size_t R, size_t r, size_t *slot, size_t *at)
{
    size_t base = n / R, extra = n % R, big = extra * (base + 1);
    if (r < big) {
        *slot = r / (base + 1);
        *at = r % (base + 1);
    } else {
        *slot = extra + (r - big) / base;
        *at = (r - big) % base;
    }
}

/* Columns per pass for a tensor of n x m over R shards: the re-layout runs
 * over columns [c0, c0 + w) at a time, so that its buffer (R slots of
 * ceil(n / R) rows of w columns) stays within se->relayout_bound however
 * large the tensor (at least one column a pass). */
static size_t shard_relayout_cols(const struct fsdp_shard_engine *se, size_t n, size_t m, size_t R)
{
    size_t col = R * ((n + R - 1) / R), w = se->relayout_bound / (col ? col : 1);
    return w < 1 ? 1 : w > m ? m : w;
}

/* Columns [c0, c0 + w) of this rank's blocks of tensor (kind, i) into buf
 * (R slots of `per` rows of w columns). */
static void shard_place_blocks(struct fsdp_shard_engine *se, int kind, size_t i, float *buf,
                               size_t per, size_t c0, size_t w)
{
    const struct fsdp_param_spec *p = &se->full->params[i];
    const size_t n = p->shape[0], R = (size_t)se->base.n_shards;
    const size_t stride = se->n_tp_pieces;
    for (size_t k = 0; k < stride; k++) {
        struct fsdp_state_piece pc;
        if (se->tp_pieces[k].param != i) {
            continue;
        }
        fsdp_shard_piece(se, (size_t)kind * stride + k, &pc);
        size_t a = pc.col0 > c0 ? pc.col0 : c0;
        size_t b = pc.col0 + pc.cols < c0 + w ? pc.col0 + pc.cols : c0 + w;
        if (pc.copy || a >= b) {
            continue;
        }
        for (size_t j = 0; j < pc.rows; j++) {
            size_t q, at;
            shard_row_slot(n, R, pc.row0 + j, &q, &at);
            (void)save_copy2d(se->dev, buf + (q * per + at) * w + (a - c0), b - a,
                              pc.data + j * pc.cols + (a - pc.col0), b - a, 1, b - a, pc.host);
        }
    }
}

static int shard_rs_wait(struct fsdp_shard_engine *se, struct fsdp_group *g, float *send,
                         float *recv, size_t count)
{
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_unit_comm_begin(se));
    FSDP_CHECK(fsdp_reduce_scatter(g, send, recv, count, FSDP_F32, FSDP_SUM, &se->attr, &w));
    fsdp_comm_count(&se->save_comm, FSDP_COLL_REDUCE_SCATTER, g->size,
                    (double)count * (double)g->size * sizeof(float));
    int rc = fsdp_work_wait(w, -1.0);
    rc = rc < 0 ? rc : fsdp_unit_comm_end(se);
    fsdp_work_free(w);
    return rc;
}

/* Tensor (kind, i) through the reduce-scatters into out (NULL: not copied). */
static int save_reduce_scatter(struct fsdp_shard_engine *se, int kind, size_t i, float *out)
{
    const struct fsdp_param_spec *p = &se->full->params[i];
    const size_t n = p->shape[0], m = p->shape[1], R = (size_t)se->base.n_shards;
    const size_t T = (size_t)se->tp->size, per = (n + R - 1) / R;
    size_t row0, rows, step = shard_relayout_cols(se, n, m, R);
    fsdp_split_even(n, R, (size_t)se->base.shard, &row0, &rows);
    for (size_t c0 = 0; c0 < m; c0 += step) {
        const size_t w = m - c0 < step ? m - c0 : step, slot = per * w;
        float *buf = se->relayout, *group = buf + (size_t)se->rs * T * slot;
        float *mine = group + (size_t)se->tp->rank * slot;
        FSDP_CHECK(fsdp_device_zero(se->dev, buf, R * slot * sizeof(float)));
        shard_place_blocks(se, kind, i, buf, per, c0, w);
        if (se->shard_g) {
            FSDP_CHECK(shard_rs_wait(se, se->shard_g, buf, group, T * slot));
        }
        FSDP_CHECK(shard_rs_wait(se, se->tp->g, group, mine, slot));
        for (size_t j = 0; out && j < rows; j++) {
            FSDP_CHECK(se->dev->ops->copy(se->dev, out + j * m + c0, mine + j * w,
                                          w * sizeof(float), FSDP_COPY_D2H, se->dev->stream));
        }
        if (out && rows > 0) {
            FSDP_CHECK(se->dev->ops->synchronize(se->dev, se->dev->stream));
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// save_rows

/* The method the buffer is sized for: the one chosen, or before the first
 * save (and when sizing) the one FSDPC_CKPT_TP_SAVE names. */
static int save_mode_planned(const struct fsdp_shard_engine *se)
{
    int mode = se->save_mode;
    if (!mode && save_mode_env(&mode) < 0) {
        fsdp_err_clear(); /* reported at the first save */
        mode = FSDP_SAVE_EXCHANGE;
    }
    return mode;
}

size_t fsdp_shard_relayout_floats(const struct fsdp_shard_engine *se)
{
    const size_t R = (size_t)se->base.n_shards;
    const int mode = se->plan ? save_mode_planned(se) : 0;
    size_t need = 0;
    for (size_t j = 0; se->plan && j < se->full->n_params; j++) {
        const struct fsdp_param_spec *q = &se->full->params[j];
        size_t f, sendf, recvf;
        if (mode == FSDP_SAVE_EXCHANGE) {
            save_exchange_floats(se, j, &sendf, &recvf);
            f = sendf + 2 * recvf;
        } else {
            f = R * ((q->shape[0] + R - 1) / R) *
                shard_relayout_cols(se, q->shape[0], q->shape[1], R);
        }
        need = f > need ? f : need;
    }
    return need;
}

/* Bytes of this rank's state (every kind), and of them the copies of
 * replicated parameters that another rank sends. */
static void save_state_bytes(const struct fsdp_shard_engine *se, double *all, double *copies)
{
    *all = *copies = 0;
    for (size_t k = 0; k < se->n_tp_pieces; k++) {
        const struct fsdp_shard_tp_piece *tp = &se->tp_pieces[k];
        double b = (double)tp->b.rows * (double)tp->b.cols * sizeof(float) * (1 + se->opt->n_state);
        *all += b;
        *copies += fsdp_tp_plan_replicated(se->plan, tp->param) && se->plan->rank != 0 ? b : 0;
    }
}

/* After a save's last tensor: what this rank sent for it, against its state. */
static void save_log(const struct fsdp_shard_engine *se)
{
    const struct fsdp_comm_counts *c = &se->save_comm, *m = &se->save_mark;
    double sent = 0, all, copies;
    uint64_t calls = 0;
    for (int k = 0; k < FSDP_COLL_OP_COUNT; k++) {
        sent += c->wire[k] - m->wire[k];
        calls += k == FSDP_COLL_RECV ? 0 : c->calls[k] - m->calls[k];
    }
    save_state_bytes(se, &all, &copies);
    FSDP_DEBUG(FSDP_SUB_FSDP,
               "checkpoint re-layout (%s): checkpoint shard %d of %d sent %.0f bytes in %llu "
               "operations and kept %.0f; its state is %.0f bytes (%.0f of them copies of "
               "replicated parameters, sent by tp rank 0); %.3f s in the re-layout",
               se->save_mode == FSDP_SAVE_EXCHANGE ? "exchange" : "reduce-scatter", se->base.shard,
               se->base.n_shards, sent, (unsigned long long)calls, se->save_kept - se->save_kept0,
               all, copies, se->save_s);
}

int fsdp_shard_save_rows(struct fsdp_shard_engine *se, int kind, size_t i, float *out)
{
    if (!se->plan || kind < 0 || kind > se->opt->n_state || i >= se->full->n_params) {
        return fsdp_err(FSDP_ERR_INTERNAL, "fsdp: save_rows of tensor %d/%zu", kind, i);
    }
    if (!se->save_mode) { /* collective: the save group is made here */
        FSDP_CHECK(save_setup(se));
    }
    const double t0 = fsdp_now();
    if (kind == 0 && i == 0) {
        se->save_mark = se->save_comm;
        se->save_kept0 = se->save_kept;
        se->save_s = 0;
    }
    if (!se->relayout) { /* the largest tensor's, at the first save */
        size_t need = fsdp_shard_relayout_floats(se);
        void *mem;
        FSDP_CHECK(fsdp_device_alloc(se->dev, (need ? need : 1) * sizeof(float),
                                     "fsdp checkpoint re-layout (a tensor as rows)", &mem));
        se->relayout = mem;
    }
    if (se->save_mode == FSDP_SAVE_REDUCE_SCATTER) {
        FSDP_CHECK(save_reduce_scatter(se, kind, i, out));
    } else if (se->base.writes_state) { /* the other replicas write nothing */
        FSDP_CHECK(save_exchange(se, kind, i, out));
    }
    if (save_host_kind(se, kind)) { /* the host writes these pieces again only after the
                                       copies that read them (the next update, a load) */
        FSDP_CHECK(se->dev->ops->synchronize(se->dev, se->dev->stream));
    }
    se->save_s += fsdp_now() - t0;
    if (kind == se->opt->n_state && i == se->full->n_params - 1 &&
        (se->base.writes_state || se->save_mode == FSDP_SAVE_REDUCE_SCATTER)) {
        save_log(se);
    }
    return 0;
}
