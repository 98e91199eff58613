/*
 * pp_comm.c - the message order around a pipeline rank's passes
 * (pp_comm.h) and its check against rendezvous sends. Owns no group.
 */
#include "parallel/pp_comm.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* The stage action a runs on s's rank, and the pipeline's stage count. */
static int pp_st(const struct fsdp_pp_schedule *s, const struct fsdp_pp_action *a)
{
    return a->chunk * s->P + s->rank;
}

/* The rank action a receives its input from (-1: none): the previous
 * stage's for a forward, the next stage's for a backward. */
static int pp_recv_peer(const struct fsdp_pp_schedule *s, const struct fsdp_pp_action *a)
{
    int st = pp_st(s, a), S = s->P * s->V;
    if (a->op == FSDP_PP_FWD) {
        return st > 0 ? (st - 1) % s->P : -1;
    }
    return st < S - 1 ? (st + 1) % s->P : -1;
}

static int pp_send_peer(const struct fsdp_pp_schedule *s, const struct fsdp_pp_action *a)
{
    int st = pp_st(s, a), S = s->P * s->V;
    if (a->op == FSDP_PP_FWD) {
        return st < S - 1 ? (st + 1) % s->P : -1;
    }
    return st > 0 ? (st - 1) % s->P : -1;
}

/* The plain order of s: each action's receive, the action, its send. */
static int pp_plain(const struct fsdp_pp_schedule *s, struct fsdp_pp_step **out, size_t *n)
{
    struct fsdp_pp_step *st = calloc(3 * s->n + 1, sizeof(*st));
    if (!st) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline steps");
    }
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct fsdp_pp_action *a = &s->at[i];
        const int from = pp_recv_peer(s, a), to = pp_send_peer(s, a);
        if (from >= 0) {
            st[k++] = (struct fsdp_pp_step){FSDP_PP_RECV, (int)i, from};
        }
        st[k++] = (struct fsdp_pp_step){FSDP_PP_RUN, (int)i, -1};
        if (to >= 0) {
            st[k++] = (struct fsdp_pp_step){FSDP_PP_SEND, (int)i, to};
        }
    }
    *out = st;
    *n = k;
    return 0;
}

/* The stage a message is for: a send's (by its action), a receive's. */
static int pp_msg_dest(const struct fsdp_pp_schedule *s, const struct fsdp_pp_step *x)
{
    const struct fsdp_pp_action *a = &s->at[x->act];
    if (x->kind == FSDP_PP_RECV) {
        return pp_st(s, a);
    }
    return a->op == FSDP_PP_FWD ? pp_st(s, a) + 1 : pp_st(s, a) - 1;
}

/* Do send x of rank r and receive y of rank q carry the same message? */
static int pp_same_msg(const struct fsdp_pp_schedule *ranks, int r, const struct fsdp_pp_step *x,
                       int q, const struct fsdp_pp_step *y)
{
    const struct fsdp_pp_action *a = &ranks[r].at[x->act], *b = &ranks[q].at[y->act];
    return x->peer == q && y->peer == r && a->op == b->op && a->mb == b->mb &&
           pp_msg_dest(&ranks[r], x) == pp_msg_dest(&ranks[q], y);
}

/*
 * The queue model. Each rank has one queue of operations per group (pp_grp:
 * activations on one, gradients on the other), started one at a time in
 * issue order, as the tcp backend runs a group's operations. A send is
 * issued from its direction's slot and the rank goes on; a send whose slot
 * still holds the previous one waits for it first. A receive is issued and
 * waited for. An operation at the head of its queue completes when the
 * peer's head of the same group is the other end of the same message (a
 * send completes only when its receiver takes it: messages larger than the
 * socket buffers). At the end of its steps a rank waits for its sends.
 */
struct pp_sim {
    size_t *at;  /* (P,) each rank's next step */
    int *send;   /* (P, 2) the step of each group's send in flight; -1 */
    int *recv;   /* (P,) the step of the receive waited for; -1 */
    int *recv_g; /* (P,) its group */
};

/* The group a step's message travels on: 0 activations, 1 gradients. */
static int pp_grp(const struct fsdp_pp_schedule *s, const struct fsdp_pp_step *x)
{
    return s->at[x->act].op == FSDP_PP_BWD;
}

/* The step at the head of rank r's queue g, -1: empty. A send in flight
 * is ahead of the receive waited for: the receive blocks the rank, so no
 * send is issued behind it. */
static int pp_head(const struct pp_sim *m, int r, int g)
{
    if (m->send[2 * r + g] >= 0) {
        return m->send[2 * r + g];
    }
    return m->recv[r] >= 0 && m->recv_g[r] == g ? m->recv[r] : -1;
}

/* Issues rank r's steps until it must wait; 1 when it issued any. */
static int pp_issue(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                    const size_t *n, struct pp_sim *m, int r)
{
    int moved = 0;
    while (m->recv[r] < 0 && m->at[r] < n[r]) {
        const struct fsdp_pp_step *x = &steps[r][m->at[r]];
        const int g = pp_grp(&ranks[r], x);
        if (x->kind == FSDP_PP_SEND) {
            if (m->send[2 * r + g] >= 0) {
                break; /* the slot's previous send first */
            }
            m->send[2 * r + g] = (int)m->at[r];
        } else if (x->kind == FSDP_PP_RECV) {
            m->recv[r] = (int)m->at[r];
            m->recv_g[r] = g;
        }
        m->at[r]++;
        moved = 1;
    }
    return moved;
}

/* Completes the message at the head of rank r's queue g when its
 * receiver's head is the other end; 1 when it did. An error when the
 * receiver's head is another message from r. */
static int pp_match(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                    struct pp_sim *m, int r, int g)
{
    const int h = pp_head(m, r, g);
    if (h < 0 || steps[r][h].kind != FSDP_PP_SEND) {
        return 0;
    }
    const struct fsdp_pp_step *x = &steps[r][h];
    const int q = x->peer, k = pp_head(m, q, g);
    if (k < 0 || steps[q][k].kind != FSDP_PP_RECV || steps[q][k].peer != r) {
        return 0;
    }
    if (!pp_same_msg(ranks, r, x, q, &steps[q][k])) {
        const struct fsdp_pp_action *a = &ranks[r].at[x->act];
        const struct fsdp_pp_action *b = &ranks[q].at[steps[q][k].act];
        return fsdp_err(FSDP_ERR_MISMATCH,
                        "pipeline: rank %d sends %c%d.%d where rank %d receives for %c%d.%d", r,
                        a->op == FSDP_PP_FWD ? 'F' : 'B', a->mb, a->chunk, q,
                        b->op == FSDP_PP_FWD ? 'F' : 'B', b->mb, b->chunk);
    }
    m->send[2 * r + g] = -1;
    m->recv[q] = -1;
    return 1;
}

/* Runs every rank as far as the queues let it. An error when a send meets
 * another message's receive. */
static int pp_advance(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                      const size_t *n, struct pp_sim *m)
{
    const int P = ranks[0].P;
    int moved = 1;
    while (moved) {
        moved = 0;
        for (int r = 0; r < P; r++) {
            moved |= pp_issue(ranks, steps, n, m, r);
            for (int g = 0; g < 2; g++) {
                int rc = pp_match(ranks, steps, m, r, g);
                if (rc < 0) {
                    return rc;
                }
                moved |= rc;
            }
        }
    }
    return 0;
}

/* Has rank r run all its steps with its sends complete? */
static int pp_done(const struct pp_sim *m, const size_t *n, int r)
{
    return m->at[r] >= n[r] && m->recv[r] < 0 && m->send[2 * r] < 0 && m->send[2 * r + 1] < 0;
}

static int pp_sim_init(struct pp_sim *m, int P)
{
    m->at = calloc((size_t)P, sizeof(*m->at));
    m->send = malloc(2 * (size_t)P * sizeof(*m->send));
    m->recv = malloc((size_t)P * sizeof(*m->recv));
    m->recv_g = calloc((size_t)P, sizeof(*m->recv_g));
    if (!m->at || !m->send || !m->recv || !m->recv_g) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline steps");
    }
    for (int r = 0; r < P; r++) {
        m->send[2 * r] = m->send[2 * r + 1] = m->recv[r] = -1;
    }
    return 0;
}

static void pp_sim_free(struct pp_sim *m)
{
    free(m->at);
    free(m->send);
    free(m->recv);
    free(m->recv_g);
}

/* Where every rank waits: the first rank with a send in flight whose
 * later receive meets a peer's send in flight posts that receive before
 * its own send (y moved to x's place: the receives from one peer stay in
 * the order it sends). 0: none could (a true deadlock), else 1. */
static int pp_unblock(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                      const size_t *n, const struct pp_sim *m)
{
    for (int r = 0; r < ranks[0].P; r++) {
        for (int g = 0; g < 2; g++) {
            const int x = m->send[2 * r + g];
            for (size_t k = (size_t)x + 1; x >= 0 && k < n[r]; k++) {
                struct fsdp_pp_step *y = &steps[r][k];
                const int q = y->peer,
                          h = y->kind == FSDP_PP_RECV ? m->send[2 * q + pp_grp(&ranks[r], y)] : -1;
                if (h < 0 || !pp_same_msg(ranks, q, &steps[q][h], r, y)) {
                    continue;
                }
                struct fsdp_pp_step t = *y;
                memmove(&steps[r][x + 1], &steps[r][x], (k - (size_t)x) * sizeof(t));
                steps[r][x] = t;
                return 1;
            }
        }
    }
    return 0;
}

/* Every rank's plain order run on the queue model; wherever all wait,
 * pp_unblock moves one receive and the run starts over. The same on every
 * rank. */
static int pp_order_all(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step **steps,
                        size_t *n)
{
    const int P = ranks[0].P;
    size_t moves = 0, most = 0;
    for (int r = 0; r < P; r++) {
        most += n[r];
    }
    int rc = 0, done = 0;
    while (rc == 0 && !done) {
        struct pp_sim m;
        rc = pp_sim_init(&m, P);
        rc = rc < 0 ? rc : pp_advance(ranks, steps, n, &m);
        done = 1;
        for (int r = 0; r < P; r++) {
            done &= pp_done(&m, n, r);
        }
        if (rc == 0 && !done && (moves++ > most || !pp_unblock(ranks, steps, n, &m))) {
            rc = fsdp_err(FSDP_ERR_INTERNAL,
                          "pipeline schedule %s (P %d, V %d, M %d): no "
                          "message order without a deadlock",
                          fsdp_pp_kind_name(ranks[0].kind), P, ranks[0].V, ranks[0].M);
        }
        pp_sim_free(&m);
    }
    return rc;
}

int fsdp_pp_steps_create(const struct fsdp_pp_schedule *s, int parity, struct fsdp_pp_step **out,
                         size_t *n)
{
    if (s->V > 1 && s->P < 2) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "pipeline schedule %s needs at least 2 pipeline "
                        "ranks",
                        fsdp_pp_kind_name(s->kind));
    }
    if (!parity) {
        return pp_plain(s, out, n);
    }
    const int P = s->P;
    struct fsdp_pp_schedule *ranks = calloc((size_t)P, sizeof(*ranks));
    struct fsdp_pp_step **steps = calloc((size_t)P, sizeof(*steps));
    size_t *ns = calloc((size_t)P, sizeof(*ns));
    int rc = ranks && steps && ns ? 0 : fsdp_err(FSDP_ERR_NOMEM, "pipeline steps");
    for (int r = 0; r < P && rc == 0; r++) {
        rc = fsdp_pp_schedule_create(s->kind, P, s->V, s->M, r, &ranks[r]);
        rc = rc < 0 ? rc : pp_plain(&ranks[r], &steps[r], &ns[r]);
    }
    rc = rc < 0 ? rc : pp_order_all(ranks, steps, ns);
    for (int r = 0; ranks && steps && ns && r < P; r++) {
        if (r == s->rank && rc == 0) {
            *out = steps[r];
            *n = ns[r];
        } else {
            free(steps[r]);
        }
        fsdp_pp_schedule_free(&ranks[r]);
    }
    free(ranks);
    free(steps);
    free(ns);
    return rc;
}

unsigned fsdp_pp_tag(const struct fsdp_pp_action *a, int from_stage)
{
    return ((unsigned)a->op << 28) | (((unsigned)a->mb & 0xfffffu) << 8) |
           ((unsigned)from_stage & 0xffu);
}

int fsdp_pp_steps_run(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                      const size_t *n, int *deadlock, int *stuck)
{
    const int P = ranks[0].P;
    struct pp_sim m;
    int rc = pp_sim_init(&m, P);
    rc = rc < 0 ? rc : pp_advance(ranks, steps, n, &m);
    *deadlock = 0;
    *stuck = -1;
    for (int r = 0; r < P && rc == 0; r++) {
        if (!pp_done(&m, n, r)) {
            *deadlock = 1;
            *stuck = *stuck < 0 ? r : *stuck;
        }
    }
    pp_sim_free(&m);
    return rc;
}

void fsdp_pp_pool_sizes(const struct fsdp_pp_schedule *s, const struct fsdp_pp_step *steps,
                        size_t n, size_t *held, size_t *grads)
{
    const int S = s->P * s->V;
    size_t f = 0, g = 0;
    *held = *grads = 1;
    for (size_t i = 0; i < n; i++) {
        const struct fsdp_pp_step *st = &steps[i];
        const struct fsdp_pp_action *a = &s->at[st->act];
        const int stage = a->chunk * s->P + s->rank;
        if (st->kind == FSDP_PP_RECV) {
            f += a->op == FSDP_PP_FWD;
            g += a->op == FSDP_PP_BWD;
        } else if (st->kind == FSDP_PP_RUN) { /* each pass copies its message out */
            f -= a->op == FSDP_PP_FWD && stage > 0;
            g -= a->op == FSDP_PP_BWD && stage < S - 1;
        }
        *held = f > *held ? f : *held;
        *grads = g > *grads ? g : *grads;
    }
}

void fsdp_pp_send_dirs(const struct fsdp_pp_schedule *s, const struct fsdp_pp_step *steps, size_t n,
                       int dirs[2])
{
    dirs[0] = dirs[1] = 0;
    for (size_t i = 0; i < n; i++) {
        if (steps[i].kind == FSDP_PP_SEND) {
            dirs[pp_grp(s, &steps[i])] = 1;
        }
    }
}
