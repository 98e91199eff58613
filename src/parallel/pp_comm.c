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

/* The plain order of s: each action's receive, the action, its send,
 * which stays pending until just before the next action's receive. */
static int pp_plain(const struct fsdp_pp_schedule *s, struct fsdp_pp_step **out, size_t *n)
{
    struct fsdp_pp_step *st = calloc(3 * s->n + 1, sizeof(*st));
    if (!st) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline steps");
    }
    size_t k = 0;
    int pending = -1; /* the action whose send is still to be placed */
    for (size_t i = 0; i < s->n; i++) {
        const struct fsdp_pp_action *a = &s->at[i];
        if (pending >= 0) {
            st[k++] =
                (struct fsdp_pp_step){FSDP_PP_SEND, pending, pp_send_peer(s, &s->at[pending])};
        }
        int from = pp_recv_peer(s, a);
        if (from >= 0) {
            st[k++] = (struct fsdp_pp_step){FSDP_PP_RECV, (int)i, from};
        }
        st[k++] = (struct fsdp_pp_step){FSDP_PP_RUN, (int)i, -1};
        pending = pp_send_peer(s, a) >= 0 ? (int)i : -1;
    }
    if (pending >= 0) {
        st[k++] = (struct fsdp_pp_step){FSDP_PP_SEND, pending, pp_send_peer(s, &s->at[pending])};
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

/* Runs every rank as far as rendezvous sends let it (at[r]: each rank's
 * next step). An error when a send meets another message's receive. */
static int pp_advance(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                      const size_t *n, size_t *at)
{
    const int P = ranks[0].P;
    int moved = 1;
    while (moved) {
        moved = 0;
        for (int r = 0; r < P; r++) {
            while (at[r] < n[r] && steps[r][at[r]].kind == FSDP_PP_RUN) {
                at[r]++;
                moved = 1;
            }
            if (at[r] >= n[r] || steps[r][at[r]].kind != FSDP_PP_SEND) {
                continue;
            }
            const struct fsdp_pp_step *x = &steps[r][at[r]];
            int q = x->peer;
            if (at[q] >= n[q] || steps[q][at[q]].kind != FSDP_PP_RECV ||
                steps[q][at[q]].peer != r) {
                continue;
            }
            if (!pp_same_msg(ranks, r, x, q, &steps[q][at[q]])) {
                const struct fsdp_pp_action *a = &ranks[r].at[x->act];
                const struct fsdp_pp_action *b = &ranks[q].at[steps[q][at[q]].act];
                return fsdp_err(FSDP_ERR_MISMATCH,
                                "pipeline: rank %d sends %c%d.%d where rank %d "
                                "receives for %c%d.%d",
                                r, a->op == FSDP_PP_FWD ? 'F' : 'B', a->mb, a->chunk, q,
                                b->op == FSDP_PP_FWD ? 'F' : 'B', b->mb, b->chunk);
            }
            at[q]++;
            at[r]++;
            moved = 1;
        }
    }
    return 0;
}

/* Where every rank waits: the first rank whose waiting send has a later
 * receive that its peer's waiting send would meet takes that receive now
 * (moved before the send; the receives from one peer stay in the order
 * it sends). 0: none could (a true deadlock), else 1. */
static int pp_unblock(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                      const size_t *n, const size_t *at)
{
    for (int r = 0; r < ranks[0].P; r++) {
        if (at[r] >= n[r] || steps[r][at[r]].kind != FSDP_PP_SEND) {
            continue;
        }
        for (size_t k = at[r] + 1; k < n[r]; k++) {
            struct fsdp_pp_step *y = &steps[r][k];
            int q = y->peer;
            if (y->kind != FSDP_PP_RECV || at[q] >= n[q] || steps[q][at[q]].kind != FSDP_PP_SEND ||
                !pp_same_msg(ranks, q, &steps[q][at[q]], r, y)) {
                continue;
            }
            struct fsdp_pp_step t = *y;
            memmove(&steps[r][at[r] + 1], &steps[r][at[r]], (k - at[r]) * sizeof(t));
            steps[r][at[r]] = t;
            return 1;
        }
    }
    return 0;
}

/* Every rank's plain order run against rendezvous sends; wherever all
 * wait, pp_unblock reorders one pair. The same on every rank. */
static int pp_order_all(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step **steps,
                        size_t *n)
{
    const int P = ranks[0].P;
    size_t *at = calloc((size_t)P, sizeof(*at));
    if (!at) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline steps");
    }
    int rc = 0, done = 0;
    while (rc == 0 && !done) {
        rc = pp_advance(ranks, steps, n, at);
        done = 1;
        for (int r = 0; r < P; r++) {
            done &= at[r] >= n[r];
        }
        if (rc == 0 && !done && !pp_unblock(ranks, steps, n, at)) {
            rc = fsdp_err(FSDP_ERR_INTERNAL,
                          "pipeline schedule %s (P %d, V %d, M %d): no "
                          "message order without a deadlock",
                          fsdp_pp_kind_name(ranks[0].kind), P, ranks[0].V, ranks[0].M);
        }
    }
    free(at);
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
    size_t *at = calloc((size_t)P, sizeof(*at));
    if (!at) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline step check");
    }
    int rc = pp_advance(ranks, steps, n, at);
    *deadlock = 0;
    *stuck = -1;
    for (int r = 0; r < P && rc == 0; r++) {
        if (at[r] < n[r]) {
            *deadlock = 1;
            *stuck = *stuck < 0 ? r : *stuck;
        }
    }
    free(at);
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
        } else if (st->kind == FSDP_PP_RUN && a->op == FSDP_PP_BWD) {
            f -= stage > 0;
            g -= stage < S - 1;
        }
        *held = f > *held ? f : *held;
        *grads = g > *grads ? g : *grads;
    }
}
