/*
 * test_pp_comm.c - the messages around a pipeline rank's passes
 * (parallel/pp_comm.h) run on the queue model: a queue per group per rank
 * (activations and gradients apart) run one operation at a time, sends
 * that go on from one slot per direction and complete only when their
 * receiver takes them. The order made never hangs for gpipe and 1f1b over
 * P 1..8 ranks and M 1..16 micro-batches, nor for interleaved over P 2..8,
 * V 2..3, and every message meets the receive of the same pass and stage;
 * for gpipe and 1f1b it is the plain order (each send right after its
 * pass, no receive taken early: what keeps 1f1b's bubble at its bound),
 * while interleaved's plain order hangs at P 2, V 2, M 4 (the last
 * stage's activations going round to rank 0 face rank 0's), which is what
 * the derivation exists to fix. Each rank's steps hold every pass once, in
 * its table's order, each receive before its pass and each send after it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "parallel/pp_comm.h"
#include "tests/tap.h"

#define MAXP 8

/* Every pass once in table order; receives before, sends after their pass. */
static int well_formed(const struct fsdp_pp_schedule *s, const struct fsdp_pp_step *st, size_t n,
                       char *why, size_t len)
{
    int next = 0;
    for (size_t k = 0; k < n; k++) {
        if (st[k].kind == FSDP_PP_RUN) {
            if (st[k].act != next) {
                snprintf(why, len, "rank %d step %zu runs pass %d, table says %d", s->rank, k,
                         st[k].act, next);
                return 0;
            }
            next++;
        } else if ((st[k].kind == FSDP_PP_RECV) != (st[k].act >= next)) {
            snprintf(why, len, "rank %d step %zu: the %s of pass %d is on the wrong side of it",
                     s->rank, k, st[k].kind == FSDP_PP_RECV ? "receive" : "send", st[k].act);
            return 0;
        }
    }
    if (next != (int)s->n) {
        snprintf(why, len, "rank %d runs %d of %zu passes", s->rank, next, s->n);
        return 0;
    }
    return 1;
}

/* 0: ran to the end; 1: hung; -1: a message met the wrong receive. */
static int run_setting(enum fsdp_pp_kind kind, int P, int V, int M, int parity, char *why,
                       size_t len)
{
    struct fsdp_pp_schedule ranks[MAXP];
    struct fsdp_pp_step *steps[MAXP];
    size_t n[MAXP];
    int result = 0;
    for (int r = 0; r < P; r++) {
        if (fsdp_pp_schedule_create(kind, P, V, M, r, &ranks[r]) < 0 ||
            fsdp_pp_steps_create(&ranks[r], parity, &steps[r], &n[r]) < 0) {
            snprintf(why, len, "rank %d: no table", r);
            return -1;
        }
        if (!well_formed(&ranks[r], steps[r], n[r], why, len)) {
            result = -1;
        }
    }
    int deadlock = 0, stuck = -1;
    if (result == 0 && fsdp_pp_steps_run(ranks, steps, n, &deadlock, &stuck) < 0) {
        fsdp_err_take(why, len);
        result = -1;
    } else if (result == 0 && deadlock) {
        snprintf(why, len, "rank %d waits for ever", stuck);
        result = 1;
    }
    for (int r = 0; r < P; r++) {
        free(steps[r]);
        fsdp_pp_schedule_free(&ranks[r]);
    }
    return result;
}

/* Is the order made for every rank the plain one? */
static int plain_kept(enum fsdp_pp_kind kind, int P, int M, char *why, size_t len)
{
    int same = 1;
    for (int r = 0; r < P && same; r++) {
        struct fsdp_pp_schedule s;
        struct fsdp_pp_step *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        int rc = fsdp_pp_schedule_create(kind, P, 1, M, r, &s);
        rc = rc < 0 ? rc : fsdp_pp_steps_create(&s, 0, &a, &na);
        rc = rc < 0 ? rc : fsdp_pp_steps_create(&s, 1, &b, &nb);
        same = rc == 0 && na == nb && memcmp(a, b, na * sizeof(*a)) == 0;
        if (!same) {
            snprintf(why, len, "%s P %d M %d rank %d: a receive moved ahead of a send",
                     fsdp_pp_kind_name(kind), P, M, r);
        }
        free(a);
        free(b);
        fsdp_pp_schedule_free(&s);
    }
    return same;
}

int main(void)
{
    fsdp_log_quiet();
    char why[256] = "";
    const enum fsdp_pp_kind kinds[] = {FSDP_PP_GPIPE, FSDP_PP_1F1B};
    for (int k = 0; k < 2; k++) {
        int bad = 0;
        for (int P = 1; P <= MAXP && !bad; P++) {
            for (int M = 1; M <= 16 && !bad; M++) {
                if (run_setting(kinds[k], P, 1, M, 1, why, sizeof(why)) != 0) {
                    tap_diag("%s P %d M %d: %s", fsdp_pp_kind_name(kinds[k]), P, M, why);
                    bad = 1;
                }
            }
        }
        tap_ok(!bad,
               "%s, the order made: P 1..8 x M 1..16 run to the end on the queue model, "
               "each message meeting its own receive",
               fsdp_pp_kind_name(kinds[k]));
    }
    int bad = 0;
    for (int P = 2; P <= MAXP && !bad; P++) {
        for (int V = 2; V <= 3 && !bad; V++) {
            for (int M = P; M <= 16 && !bad; M += P) {
                if (run_setting(FSDP_PP_INTERLEAVED, P, V, M, 1, why, sizeof(why)) != 0) {
                    tap_diag("interleaved P %d V %d M %d: %s", P, V, M, why);
                    bad = 1;
                }
            }
        }
    }
    tap_ok(!bad, "interleaved, the order made: P 2..8 x V 2..3 x M (multiples of P) up to 16 run "
                 "to the end, the last stage's messages going round to rank 0");
    for (int k = 0; k < 2; k++) {
        int moved = 0;
        for (int P = 1; P <= MAXP && !moved; P++) {
            for (int M = 1; M <= 16 && !moved; M++) {
                moved = !plain_kept(kinds[k], P, M, why, sizeof(why));
            }
        }
        if (moved) {
            tap_diag("%s", why);
        }
        tap_ok(!moved,
               "%s, the order made is the plain one over P 1..8 x M 1..16: every send right "
               "after its pass, no receive ahead of a send",
               fsdp_pp_kind_name(kinds[k]));
    }
    int il = run_setting(FSDP_PP_INTERLEAVED, 2, 2, 4, 0, why, sizeof(why));
    tap_ok(il == 1, "interleaved, plain order: hangs at P 2, V 2, M 4 (%s)",
           il == 1 ? why : "it did not");
    struct fsdp_pp_schedule s;
    struct fsdp_pp_step *st = NULL;
    size_t n;
    int rc = fsdp_pp_schedule_create(FSDP_PP_INTERLEAVED, 1, 2, 2, 0, &s);
    rc = rc < 0 ? rc : fsdp_pp_steps_create(&s, 1, &st, &n);
    tap_ok(rc == FSDP_ERR_UNSUPPORTED, "interleaved on one pipeline rank: one error");
    free(rc == 0 ? st : NULL);
    fsdp_pp_schedule_free(&s);
    return tap_done();
}
