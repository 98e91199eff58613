/*
 * tcp_algo.c - the collective algorithms of the tcp backend.
 *
 * Each algorithm describes an op as phases of channels (struct tcp_algo in
 * tcp.h): which peers to send to and receive from, the messages of each
 * channel, which message waits for which, and the reduction of a received
 * chunk. The engine moves the bytes; nothing here touches a socket.
 *
 *   ring       reduce-scatter, allgather, and allreduce (= the two back to
 *              back in one stream), for large messages. Each segment moves in
 *              chunks, and chunk c of step s+1 leaves as soon as chunk c of
 *              step s has arrived and been reduced, so reductions overlap the
 *              transfer of the following chunks and the ring stays full.
 *   direct     one round: every rank exchanges with every other at once;
 *              for small messages in groups of up to direct_max ranks.
 *   rd         recursive doubling allreduce for small messages in larger
 *              groups (ranks beyond the largest power of two fold in first).
 *   tree       broadcast down a pipelined k-ary tree: a chain (k = 1) for
 *              large messages, flat or wide for small ones.
 *   dissem     dissemination barrier: ceil(log2 n) rounds of empty frames.
 *   p2p        send/recv: one frame.
 *
 * Every reduction combines contributions in an order that does not depend
 * on timing, so all ranks end with bitwise identical results.
 */
#include "config.h"
#include "backends/tcp/tcp.h"
#include "core/dtype.h"
#include "core/error.h"

#include <string.h>

static int tcp_mod(int a, int n)
{
    a %= n;
    return a < 0 ? a + n : a;
}

static char *tcp_at(const void *base, size_t elems, size_t esize)
{
    return (char *)base + elems * esize;
}

static size_t tcp_ceil_div(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* Chunks a segment of seg_elems must be cut into (at least 1). */
static size_t tcp_nchunks(const struct tcp_backend *be, size_t seg_elems, size_t esize)
{
    size_t c = tcp_ceil_div(seg_elems * esize, be->cfg.chunk_bytes);
    return c ? c : 1;
}

static void tcp_chan_set(struct tcp_chan *ch, int peer, int send, uint32_t nmsg, int tag)
{
    memset(ch, 0, sizeof(*ch));
    ch->peer = peer;
    ch->send = send;
    ch->nmsg = nmsg;
    ch->tag = tag;
}

static void tcp_msg_set(struct tcp_msg *m, const void *buf, size_t len)
{
    m->buf = (void *)buf;
    m->len = len;
    m->gate_chan = -1;
    m->gate_done = 0;
}

static void tcp_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes > 0 && dst != src) {
        memcpy(dst, src, bytes);
    }
}

/* Whether bytes take the small-message algorithms (FSDPC_TCP_ALGO, or auto by size). */
static int tcp_small(const struct tcp_backend *be, size_t bytes)
{
    return be->cfg.algo == TCP_ALGO_SMALL ||
           (be->cfg.algo == TCP_ALGO_AUTO && bytes <= be->cfg.small_bytes);
}

static int tcp_scratch_for(struct tcp_backend *be, size_t bytes, char **out)
{
    *out = fsdp_tcp_engine_scratch(be, bytes ? bytes : 64);
    if (!*out) {
        return fsdp_err(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of scratch", bytes);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// local: a group of one

static int local_start(struct tcp_backend *be, struct tcp_op *op)
{
    (void)be;
    size_t bytes = op->count * op->esize;
    if (op->coll == TCP_COLL_ALLREDUCE || op->coll == TCP_COLL_ALLGATHER ||
        op->coll == TCP_COLL_REDUCE_SCATTER) {
        tcp_copy(op->recvbuf, op->sendbuf, bytes);
    }
    op->nphases = 0;
    return 0;
}

static const struct tcp_algo tcp_algo_local = {
    .name = "local",
    .start = local_start,
};

// ----------------------------------------------------------------------------
// ring: channel 0 sends to the right neighbour, channel 1 receives from the left

static int ring_phase(struct tcp_backend *be, struct tcp_op *op, int phase, struct tcp_chan *ch)
{
    (void)phase;
    int n = be->size, r = be->rank;
    int steps = op->coll == TCP_COLL_ALLREDUCE ? 2 * (n - 1) : n - 1;
    uint32_t nmsg = (uint32_t)((size_t)steps * op->nchunks);
    tcp_chan_set(&ch[0], tcp_mod(r + 1, n), 1, nmsg, 0);
    tcp_chan_set(&ch[1], tcp_mod(r - 1, n), 0, nmsg, 1);
    return 2;
}

/* Message j of a ring's send channel: from step 1 on, chunk c waits until
 * chunk c of the step before has arrived (and been reduced) on channel 1. */
static void ring_gate_send(const struct tcp_op *op, uint32_t j, struct tcp_msg *m)
{
    if (j >= op->nchunks) {
        m->gate_chan = 1;
        m->gate_done = j - (uint32_t)op->nchunks + 1;
    }
}

/* Chunk c of segment seg when count elements are split into n segments. */
static void ring_chunk(const struct tcp_op *op, int n, int seg, size_t c, size_t *lo, size_t *len)
{
    size_t slo, sn, clo;
    fsdp_split_even(op->count, (size_t)n, (size_t)seg, &slo, &sn);
    fsdp_split_even(sn, op->nchunks, c, &clo, len);
    *lo = slo + clo;
}

/* allreduce: steps 0..n-2 reduce-scatter, n-1..2n-3 allgather. After the
 * reduce-scatter rank r holds the reduced segment r+1. */
static int ring_allreduce_start(struct tcp_backend *be, struct tcp_op *op)
{
    size_t seg = tcp_ceil_div(op->count, (size_t)be->size);
    op->nchunks = tcp_nchunks(be, seg, op->esize);
    FSDP_CHECK(tcp_scratch_for(be, tcp_ceil_div(seg, op->nchunks) * op->esize, &op->slot));
    op->nphases = 1;
    return 0;
}

static void ring_allreduce_msg(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                               uint32_t j, struct tcp_msg *m)
{
    int n = be->size, r = be->rank;
    int s = (int)(j / op->nchunks);
    size_t c = j % op->nchunks, lo, len;
    int rs = s < n - 1, t = s - (n - 1);
    if (ch->send) {
        int seg = rs ? tcp_mod(r - s, n) : tcp_mod(r + 1 - t, n);
        ring_chunk(op, n, seg, c, &lo, &len);
        /* step 0 sends this rank's own data; later steps what it reduced */
        tcp_msg_set(m, tcp_at(s == 0 ? op->sendbuf : op->recvbuf, lo, op->esize), len * op->esize);
        ring_gate_send(op, j, m);
        return;
    }
    int seg = rs ? tcp_mod(r - s - 1, n) : tcp_mod(r - t, n);
    ring_chunk(op, n, seg, c, &lo, &len);
    tcp_msg_set(m, rs ? op->slot : tcp_at(op->recvbuf, lo, op->esize), len * op->esize);
}

static void ring_allreduce_recv(struct tcp_backend *be, struct tcp_op *op,
                                const struct tcp_chan *ch, uint32_t j, const struct tcp_msg *m)
{
    (void)ch;
    int n = be->size, r = be->rank;
    int s = (int)(j / op->nchunks);
    size_t lo, len;
    if (s >= n - 1) {
        return; /* allgather: landed in place */
    }
    ring_chunk(op, n, tcp_mod(r - s - 1, n), j % op->nchunks, &lo, &len);
    char *dst = tcp_at(op->recvbuf, lo, op->esize);
    fsdp_reduce3(dst, tcp_at(op->sendbuf, lo, op->esize), m->buf, len, op->dtype, op->redop);
    if (s == n - 2 && op->redop == FSDP_AVG) {
        fsdp_scale_div(dst, len, op->dtype, n);
    }
}

static const struct tcp_algo tcp_algo_ring_allreduce = {
    .name = "ring",
    .start = ring_allreduce_start,
    .phase = ring_phase,
    .msg = ring_allreduce_msg,
    .recv_done = ring_allreduce_recv,
};

/* allgather: step s sends block r-s and receives block r-s-1, in place. */
static int ring_allgather_start(struct tcp_backend *be, struct tcp_op *op)
{
    size_t bytes = op->count * op->esize;
    tcp_copy(tcp_at(op->recvbuf, (size_t)be->rank * op->count, op->esize), op->sendbuf, bytes);
    op->nchunks = tcp_nchunks(be, op->count, op->esize);
    op->nphases = 1;
    return 0;
}

static void ring_allgather_msg(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                               uint32_t j, struct tcp_msg *m)
{
    int n = be->size, r = be->rank;
    int s = (int)(j / op->nchunks);
    int blk = ch->send ? tcp_mod(r - s, n) : tcp_mod(r - s - 1, n);
    size_t lo, len;
    fsdp_split_even(op->count, op->nchunks, j % op->nchunks, &lo, &len);
    tcp_msg_set(m, tcp_at(op->recvbuf, (size_t)blk * op->count + lo, op->esize), len * op->esize);
    if (ch->send) {
        ring_gate_send(op, j, m);
    }
}

static const struct tcp_algo tcp_algo_ring_allgather = {
    .name = "ring",
    .start = ring_allgather_start,
    .phase = ring_phase,
    .msg = ring_allgather_msg,
};

/* reduce_scatter: step s sends block r-s-1 and receives block r-s-2, so the
 * last step (n-2) delivers block r. Partial sums of the steps in between
 * alternate between two accumulators (acc[s % 2]); a chunk of acc is only
 * overwritten once the send that reads its previous content is done. */
static int ring_rs_start(struct tcp_backend *be, struct tcp_op *op)
{
    op->nchunks = tcp_nchunks(be, op->count, op->esize);
    size_t slot = tcp_ceil_div(op->count, op->nchunks) * op->esize;
    size_t acc = be->size > 2 ? 2 * op->count * op->esize : 0;
    char *sc;
    FSDP_CHECK(tcp_scratch_for(be, slot + acc, &sc));
    op->slot = sc;
    op->acc = sc + slot;
    op->nphases = 1;
    return 0;
}

static char *ring_rs_acc(const struct tcp_op *op, int s)
{
    return tcp_at(op->acc, (size_t)(s % 2) * op->count, op->esize);
}

static void ring_rs_msg(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                        uint32_t j, struct tcp_msg *m)
{
    int n = be->size, r = be->rank;
    int s = (int)(j / op->nchunks);
    size_t lo, len;
    fsdp_split_even(op->count, op->nchunks, j % op->nchunks, &lo, &len);
    if (ch->send) {
        const char *src = s == 0 ? tcp_at(op->sendbuf, (size_t)tcp_mod(r - 1, n) * op->count,
                                          op->esize)
                                 : ring_rs_acc(op, s - 1);
        tcp_msg_set(m, tcp_at(src, lo, op->esize), len * op->esize);
        ring_gate_send(op, j, m);
        return;
    }
    tcp_msg_set(m, op->slot, len * op->esize);
    if (s >= 2) {
        m->gate_chan = 0; /* acc[s % 2] chunk is still being sent by step s-1 */
        m->gate_done = j - (uint32_t)op->nchunks + 1;
    }
}

static void ring_rs_recv(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                         uint32_t j, const struct tcp_msg *m)
{
    (void)ch;
    int n = be->size, r = be->rank;
    int s = (int)(j / op->nchunks);
    int blk = tcp_mod(r - s - 2, n);
    size_t lo, len;
    fsdp_split_even(op->count, op->nchunks, j % op->nchunks, &lo, &len);
    const char *own = tcp_at(op->sendbuf, (size_t)blk * op->count + lo, op->esize);
    char *dst = s == n - 2 ? tcp_at(op->recvbuf, lo, op->esize)
                           : tcp_at(ring_rs_acc(op, s), lo, op->esize);
    fsdp_reduce3(dst, own, m->buf, len, op->dtype, op->redop);
    if (s == n - 2 && op->redop == FSDP_AVG) {
        fsdp_scale_div(dst, len, op->dtype, n);
    }
}

static const struct tcp_algo tcp_algo_ring_rs = {
    .name = "ring",
    .start = ring_rs_start,
    .phase = ring_phase,
    .msg = ring_rs_msg,
    .recv_done = ring_rs_recv,
};

// ----------------------------------------------------------------------------
// direct exchange: channels 0..n-2 send, n-1..2n-3 receive; tag = peer

static int direct_phase(struct tcp_backend *be, struct tcp_op *op, int phase, struct tcp_chan *ch)
{
    (void)op;
    (void)phase;
    int n = be->size, k = 0;
    for (int q = 0; q < n; q++) {
        if (q != be->rank) {
            tcp_chan_set(&ch[k++], q, 1, 1, q);
        }
    }
    for (int q = 0; q < n; q++) {
        if (q != be->rank) {
            tcp_chan_set(&ch[k++], q, 0, 1, q);
        }
    }
    return k;
}

/* out = x0 op x1 op ... op x(n-1) in rank order, x(r) = own, x(q) = slot q. */
static void direct_reduce(struct tcp_backend *be, struct tcp_op *op, void *out, const void *own)
{
    int n = be->size, r = be->rank;
    size_t bytes = op->count * op->esize;
    if (op->count == 0) {
        return;
    }
#define X(q) ((q) == r ? (const char *)own : op->slot + (size_t)(q) * bytes)
    if (n == 2) {
        fsdp_reduce3(out, X(0), X(1), op->count, op->dtype, op->redop);
    } else {
        fsdp_reduce3(op->acc, X(0), X(1), op->count, op->dtype, op->redop);
        for (int q = 2; q < n - 1; q++) {
            fsdp_reduce(op->acc, X(q), op->count, op->dtype, op->redop);
        }
        fsdp_reduce3(out, op->acc, X(n - 1), op->count, op->dtype, op->redop);
    }
#undef X
    if (op->redop == FSDP_AVG) {
        fsdp_scale_div(out, op->count, op->dtype, n);
    }
}

static int direct_reduce_start(struct tcp_backend *be, struct tcp_op *op)
{
    size_t bytes = op->count * op->esize;
    char *sc;
    FSDP_CHECK(tcp_scratch_for(be, (size_t)(be->size + 1) * bytes, &sc));
    op->slot = sc;
    op->acc = sc + (size_t)be->size * bytes;
    op->nphases = 1;
    return 0;
}

static void direct_allreduce_msg(struct tcp_backend *be, struct tcp_op *op,
                                 const struct tcp_chan *ch, uint32_t j, struct tcp_msg *m)
{
    (void)be;
    (void)j;
    size_t bytes = op->count * op->esize;
    tcp_msg_set(m, ch->send ? op->sendbuf : op->slot + (size_t)ch->tag * bytes, bytes);
}

static void direct_allreduce_finish(struct tcp_backend *be, struct tcp_op *op)
{
    direct_reduce(be, op, op->recvbuf, op->sendbuf);
}

static const struct tcp_algo tcp_algo_direct_allreduce = {
    .name = "direct",
    .start = direct_reduce_start,
    .phase = direct_phase,
    .msg = direct_allreduce_msg,
    .finish = direct_allreduce_finish,
};

static void direct_rs_msg(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                          uint32_t j, struct tcp_msg *m)
{
    (void)be;
    (void)j;
    size_t bytes = op->count * op->esize;
    tcp_msg_set(m, ch->send ? tcp_at(op->sendbuf, (size_t)ch->tag * op->count, op->esize)
                            : op->slot + (size_t)ch->tag * bytes,
                bytes);
}

static void direct_rs_finish(struct tcp_backend *be, struct tcp_op *op)
{
    direct_reduce(be, op, op->recvbuf,
                  tcp_at(op->sendbuf, (size_t)be->rank * op->count, op->esize));
}

static const struct tcp_algo tcp_algo_direct_rs = {
    .name = "direct",
    .start = direct_reduce_start,
    .phase = direct_phase,
    .msg = direct_rs_msg,
    .finish = direct_rs_finish,
};

static int direct_allgather_start(struct tcp_backend *be, struct tcp_op *op)
{
    tcp_copy(tcp_at(op->recvbuf, (size_t)be->rank * op->count, op->esize), op->sendbuf,
             op->count * op->esize);
    op->nphases = 1;
    return 0;
}

static void direct_allgather_msg(struct tcp_backend *be, struct tcp_op *op,
                                 const struct tcp_chan *ch, uint32_t j, struct tcp_msg *m)
{
    (void)be;
    (void)j;
    tcp_msg_set(m, ch->send ? op->sendbuf
                            : tcp_at(op->recvbuf, (size_t)ch->tag * op->count, op->esize),
                op->count * op->esize);
}

static const struct tcp_algo tcp_algo_direct_allgather = {
    .name = "direct",
    .start = direct_allgather_start,
    .phase = direct_phase,
    .msg = direct_allgather_msg,
};

// ----------------------------------------------------------------------------
// recursive doubling allreduce. With p the largest power of two <= n and
// e = n - p: in phase 0 odd ranks below 2e hand their data to the even rank
// below them; phases 1..log2(p) exchange and reduce between the p remaining
// ranks; the last phase hands the result back to the odd ranks.

static int rd_vrank(const struct tcp_backend *be, const struct tcp_op *op)
{
    int e = be->size - op->pof2, r = be->rank;
    if (r < 2 * e) {
        return r % 2 ? -1 : r / 2;
    }
    return r - e;
}

static int rd_real(const struct tcp_backend *be, const struct tcp_op *op, int v)
{
    int e = be->size - op->pof2;
    return v < e ? 2 * v : v + e;
}

static int rd_start(struct tcp_backend *be, struct tcp_op *op)
{
    size_t bytes = op->count * op->esize;
    int rounds = 0;
    tcp_copy(op->recvbuf, op->sendbuf, bytes);
    for (op->pof2 = 1; op->pof2 * 2 <= be->size; op->pof2 *= 2) {
        rounds++;
    }
    FSDP_CHECK(tcp_scratch_for(be, bytes, &op->slot));
    op->nphases = rounds + 2;
    return 0;
}

static int rd_phase(struct tcp_backend *be, struct tcp_op *op, int phase, struct tcp_chan *ch)
{
    int r = be->rank, e = be->size - op->pof2;
    if (phase == 0 || phase == op->nphases - 1) {
        if (r >= 2 * e) {
            return 0;
        }
        /* fold: odd sends to even; unfold: even sends back to odd */
        int send = (r % 2 == 1) == (phase == 0);
        tcp_chan_set(&ch[0], r % 2 ? r - 1 : r + 1, send, 1, 0);
        return 1;
    }
    int v = rd_vrank(be, op);
    if (v < 0) {
        return 0;
    }
    int partner = rd_real(be, op, v ^ (1 << (phase - 1)));
    tcp_chan_set(&ch[0], partner, 1, 1, 0);
    tcp_chan_set(&ch[1], partner, 0, 1, 1);
    return 2;
}

static void rd_msg(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                   uint32_t j, struct tcp_msg *m)
{
    (void)be;
    (void)j;
    int lands_in_place = op->phase == op->nphases - 1;
    tcp_msg_set(m, ch->send || lands_in_place ? op->recvbuf : op->slot, op->count * op->esize);
}

/* The partner's data waits in slot until the phase is over: recvbuf is only
 * reduced into once it has been sent. (Gating the receive on the send
 * instead would deadlock two partners whose messages exceed the socket
 * buffers.) The lower rank's contribution goes first, on both sides. */
static void rd_phase_end(struct tcp_backend *be, struct tcp_op *op)
{
    int r = be->rank, e = be->size - op->pof2, partner;
    if (op->phase == op->nphases - 1) {
        return;
    }
    if (op->phase == 0) {
        if (r >= 2 * e || r % 2) {
            return;
        }
        partner = r + 1;
    } else {
        int v = rd_vrank(be, op);
        if (v < 0) {
            return;
        }
        partner = rd_real(be, op, v ^ (1 << (op->phase - 1)));
    }
    int mine_first = r < partner;
    fsdp_reduce3(op->recvbuf, mine_first ? op->recvbuf : op->slot,
                 mine_first ? op->slot : op->recvbuf, op->count, op->dtype, op->redop);
}

static void rd_finish(struct tcp_backend *be, struct tcp_op *op)
{
    if (op->redop == FSDP_AVG) {
        fsdp_scale_div(op->recvbuf, op->count, op->dtype, be->size);
    }
}

static const struct tcp_algo tcp_algo_rd = {
    .name = "rd",
    .start = rd_start,
    .phase = rd_phase,
    .msg = rd_msg,
    .phase_end = rd_phase_end,
    .finish = rd_finish,
};

// ----------------------------------------------------------------------------
// pipelined k-ary tree broadcast rooted at op->root (virtual rank 0).
// Channel 0 receives from the parent (not at the root), the others send to
// the children; chunk j goes down as soon as it has arrived.

static int tree_start(struct tcp_backend *be, struct tcp_op *op)
{
    size_t bytes = op->count * op->esize;
    int small = tcp_small(be, bytes);
    op->fanout = small ? be->cfg.direct_max : 1;
    op->nchunks = tcp_nchunks(be, op->count, op->esize);
    op->nphases = 1;
    return 0;
}

static int tree_phase(struct tcp_backend *be, struct tcp_op *op, int phase, struct tcp_chan *ch)
{
    (void)phase;
    int n = be->size, k = 0, f = op->fanout;
    int v = tcp_mod(be->rank - op->root, n);
    uint32_t nmsg = (uint32_t)op->nchunks;
    if (v > 0) {
        tcp_chan_set(&ch[k++], tcp_mod((v - 1) / f + op->root, n), 0, nmsg, 0);
    }
    for (int c = v * f + 1; c <= v * f + f && c < n; c++) {
        tcp_chan_set(&ch[k++], tcp_mod(c + op->root, n), 1, nmsg, c);
    }
    return k;
}

static void tree_msg(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                     uint32_t j, struct tcp_msg *m)
{
    size_t lo, len;
    fsdp_split_even(op->count, op->nchunks, j, &lo, &len);
    tcp_msg_set(m, tcp_at(op->recvbuf, lo, op->esize), len * op->esize);
    if (ch->send && be->rank != op->root) {
        m->gate_chan = 0;
        m->gate_done = j + 1;
    }
}

static const struct tcp_algo tcp_algo_tree = {
    .name = "tree",
    .start = tree_start,
    .phase = tree_phase,
    .msg = tree_msg,
};

// ----------------------------------------------------------------------------
// dissemination barrier and point-to-point

static int dissem_start(struct tcp_backend *be, struct tcp_op *op)
{
    op->nphases = 0;
    for (int d = 1; d < be->size; d *= 2) {
        op->nphases++;
    }
    return 0;
}

static int dissem_phase(struct tcp_backend *be, struct tcp_op *op, int phase, struct tcp_chan *ch)
{
    (void)op;
    int n = be->size, d = 1 << phase;
    tcp_chan_set(&ch[0], tcp_mod(be->rank + d, n), 1, 1, 0);
    tcp_chan_set(&ch[1], tcp_mod(be->rank - d, n), 0, 1, 1);
    return 2;
}

static void empty_msg(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                      uint32_t j, struct tcp_msg *m)
{
    (void)be;
    (void)op;
    (void)ch;
    (void)j;
    tcp_msg_set(m, NULL, 0);
}

static const struct tcp_algo tcp_algo_dissem = {
    .name = "dissemination",
    .start = dissem_start,
    .phase = dissem_phase,
    .msg = empty_msg,
};

static int p2p_start(struct tcp_backend *be, struct tcp_op *op)
{
    (void)be;
    op->nphases = 1;
    return 0;
}

static int p2p_phase(struct tcp_backend *be, struct tcp_op *op, int phase, struct tcp_chan *ch)
{
    (void)be;
    (void)phase;
    tcp_chan_set(&ch[0], op->peer, op->coll == TCP_COLL_SEND, 1, 0);
    return 1;
}

static void p2p_msg(struct tcp_backend *be, struct tcp_op *op, const struct tcp_chan *ch,
                    uint32_t j, struct tcp_msg *m)
{
    (void)be;
    (void)ch;
    (void)j;
    tcp_msg_set(m, op->coll == TCP_COLL_SEND ? op->sendbuf : op->recvbuf,
                op->count * op->esize);
}

static const struct tcp_algo tcp_algo_p2p = {
    .name = "p2p",
    .start = p2p_start,
    .phase = p2p_phase,
    .msg = p2p_msg,
};

// ----------------------------------------------------------------------------

const struct tcp_algo *fsdp_tcp_algo_select(const struct tcp_backend *be, const struct tcp_op *op)
{
    int n = be->size;
    size_t bytes = op->count * op->esize;
    if (op->coll == TCP_COLL_ALLGATHER || op->coll == TCP_COLL_REDUCE_SCATTER) {
        bytes *= (size_t)n; /* the whole gathered / scattered buffer */
    }
    int small = tcp_small(be, bytes);
    int direct = small && n <= be->cfg.direct_max;
    if (n == 1 && op->coll != TCP_COLL_SEND && op->coll != TCP_COLL_RECV) {
        return &tcp_algo_local;
    }
    switch (op->coll) {
    case TCP_COLL_ALLREDUCE:
        return direct ? &tcp_algo_direct_allreduce : small ? &tcp_algo_rd
                                                          : &tcp_algo_ring_allreduce;
    case TCP_COLL_ALLGATHER:
        return direct ? &tcp_algo_direct_allgather : &tcp_algo_ring_allgather;
    case TCP_COLL_REDUCE_SCATTER:
        return direct ? &tcp_algo_direct_rs : &tcp_algo_ring_rs;
    case TCP_COLL_BROADCAST:
        return &tcp_algo_tree;
    case TCP_COLL_BARRIER:
        return &tcp_algo_dissem;
    default:
        return &tcp_algo_p2p;
    }
}
