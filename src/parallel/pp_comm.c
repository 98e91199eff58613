/*
 * pp_comm.c - the message order around a pipeline rank's passes
 * (pp_comm.h) and its check against rendezvous sends. Owns no group.
 */
#include "parallel/pp_comm.h"

#include <stdlib.h>

#include "core/error.h"

/* The peer action a receives from (-1: none): the previous stage for a
 * forward, the next for a backward. */
static int pp_recv_peer(const struct fsdp_pp_schedule *s, const struct fsdp_pp_action *a)
{
    if (a->op == FSDP_PP_FWD) {
        return s->rank > 0 ? s->rank - 1 : -1;
    }
    return s->rank < s->P - 1 ? s->rank + 1 : -1;
}

static int pp_send_peer(const struct fsdp_pp_schedule *s, const struct fsdp_pp_action *a)
{
    if (a->op == FSDP_PP_FWD) {
        return s->rank < s->P - 1 ? s->rank + 1 : -1;
    }
    return s->rank > 0 ? s->rank - 1 : -1;
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

/* Does the peer's plain order (q, nq steps of table t) send message `got`
 * and receive `sent` right after: both sides would send first? */
static int pp_head_on(const struct fsdp_pp_schedule *t, const struct fsdp_pp_step *q, size_t nq,
                      const struct fsdp_pp_action *sent, const struct fsdp_pp_action *got)
{
    for (size_t k = 0; k + 1 < nq; k++) {
        const struct fsdp_pp_action *a = &t->at[q[k].act], *b = &t->at[q[k + 1].act];
        if (q[k].kind == FSDP_PP_SEND && a->op == got->op && a->mb == got->mb) {
            return q[k + 1].kind == FSDP_PP_RECV && b->op == sent->op && b->mb == sent->mb;
        }
    }
    return 0;
}

/* On an odd rank, each send followed by a receive from the same peer whose
 * plain order has the mirror pair becomes receive, then send. */
static int pp_parity(const struct fsdp_pp_schedule *s, struct fsdp_pp_step *st, size_t n)
{
    int rc = 0;
    for (int side = -1; side <= 1 && rc == 0; side += 2) {
        int q = s->rank + side;
        struct fsdp_pp_schedule t = {0};
        struct fsdp_pp_step *qs = NULL;
        size_t nq = 0;
        if (q < 0 || q >= s->P) {
            continue;
        }
        rc = fsdp_pp_schedule_create(s->kind, s->P, s->V, s->M, q, &t);
        rc = rc < 0 ? rc : pp_plain(&t, &qs, &nq);
        for (size_t k = 0; rc == 0 && k + 1 < n; k++) {
            if (st[k].kind == FSDP_PP_SEND && st[k + 1].kind == FSDP_PP_RECV && st[k].peer == q &&
                st[k + 1].peer == q &&
                pp_head_on(&t, qs, nq, &s->at[st[k].act], &s->at[st[k + 1].act])) {
                struct fsdp_pp_step x = st[k];
                st[k] = st[k + 1];
                st[k + 1] = x;
                k++;
            }
        }
        free(qs);
        fsdp_pp_schedule_free(&t);
    }
    return rc;
}

int fsdp_pp_steps_create(const struct fsdp_pp_schedule *s, int parity, struct fsdp_pp_step **out,
                         size_t *n)
{
    if (s->V != 1) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "pipeline schedule %s: the runtime runs one "
                        "stage per rank (gpipe, 1f1b); interleaved stages are not built",
                        fsdp_pp_kind_name(s->kind));
    }
    FSDP_CHECK(pp_plain(s, out, n));
    int rc = parity && s->rank % 2 == 1 ? pp_parity(s, *out, *n) : 0;
    if (rc < 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

unsigned fsdp_pp_tag(const struct fsdp_pp_action *a, int from_stage)
{
    return ((unsigned)a->op << 28) | (((unsigned)a->mb & 0xfffffu) << 8) |
           ((unsigned)from_stage & 0xffu);
}

/* Can rank r's send at its step k meet its peer's current step? */
static int pp_meets(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                    const size_t *n, const size_t *at, int r, int *ok)
{
    const struct fsdp_pp_step *snd = &steps[r][at[r]];
    int q = snd->peer;
    *ok = 0;
    if (at[q] >= n[q] || steps[q][at[q]].kind != FSDP_PP_RECV || steps[q][at[q]].peer != r) {
        return 0;
    }
    const struct fsdp_pp_action *a = &ranks[r].at[snd->act];
    const struct fsdp_pp_action *b = &ranks[q].at[steps[q][at[q]].act];
    if (a->op != b->op || a->mb != b->mb) {
        return fsdp_err(FSDP_ERR_MISMATCH,
                        "pipeline: rank %d sends %c%d where rank %d receives "
                        "for %c%d",
                        r, a->op == FSDP_PP_FWD ? 'F' : 'B', a->mb, q,
                        b->op == FSDP_PP_FWD ? 'F' : 'B', b->mb);
    }
    *ok = 1;
    return 0;
}

int fsdp_pp_steps_run(const struct fsdp_pp_schedule *ranks, struct fsdp_pp_step *const *steps,
                      const size_t *n, int *deadlock, int *stuck)
{
    const int P = ranks[0].P;
    size_t *at = calloc((size_t)P, sizeof(*at));
    if (!at) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline step check");
    }
    int moved = 1, rc = 0;
    *deadlock = 0;
    *stuck = -1;
    while (moved && rc == 0) {
        moved = 0;
        for (int r = 0; r < P && rc == 0; r++) {
            while (at[r] < n[r] && steps[r][at[r]].kind == FSDP_PP_RUN) {
                at[r]++;
                moved = 1;
            }
            int ok = 0;
            if (at[r] < n[r] && steps[r][at[r]].kind == FSDP_PP_SEND) {
                rc = pp_meets(ranks, steps, n, at, r, &ok);
            }
            if (ok) {
                at[steps[r][at[r]].peer]++;
                at[r]++;
                moved = 1;
            }
        }
    }
    for (int r = 0; r < P && rc == 0; r++) {
        if (at[r] < n[r]) {
            *deadlock = 1;
            *stuck = *stuck < 0 ? r : *stuck;
        }
    }
    free(at);
    return rc;
}
