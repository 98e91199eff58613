/*
 * test_pp_schedule.c - the pipeline schedules' tables checked by what they
 * promise: every rank runs each (micro-batch, chunk) forward and backward
 * exactly once, a backward after its forward; the tables of 1f1b and
 * interleaved at (P 4, M 8) are the published ones; the peak of held
 * activations equals the schedule's bound (gpipe M, 1f1b P - rank), and each
 * chunk's activation sets match tables counted by hand; run
 * against their dependencies no table deadlocks and every rank's idle share
 * equals the analytical bubble; settings that make no schedule are one
 * error each.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "parallel/pp_schedule.h"
#include "tests/tap.h"

#define MAXP 8

/* Each (op, mb, chunk) once, each forward before its backward. */
static int covers(const struct fsdp_pp_schedule *s, char *why, size_t n)
{
    int M = s->M, V = s->V;
    int *pos = malloc(2 * (size_t)M * V * sizeof(int));
    for (int i = 0; i < 2 * M * V; i++) {
        pos[i] = -1;
    }
    int ok = s->n == 2 * (size_t)M * V;
    for (size_t i = 0; i < s->n && ok; i++) {
        const struct fsdp_pp_action *a = &s->at[i];
        int k = ((int)a->op * M + a->mb) * V + a->chunk;
        if (a->mb < 0 || a->mb >= M || a->chunk < 0 || a->chunk >= V || pos[k] >= 0) {
            snprintf(why, n, "pass %zu (%c%d.%d) out of range or twice", i,
                     a->op == FSDP_PP_FWD ? 'F' : 'B', a->mb, a->chunk);
            ok = 0;
            break;
        }
        pos[k] = (int)i;
    }
    for (int k = 0; k < M * V && ok; k++) {
        if (pos[k] < 0 || pos[M * V + k] < pos[k]) {
            snprintf(why, n, "micro-batch %d chunk %d: forward at %d, backward at %d", k / V, k % V,
                     pos[k], pos[M * V + k]);
            ok = 0;
        }
    }
    free(pos);
    return ok;
}

/* Builds all P tables of one setting and checks everything they promise. */
static void one_setting(enum fsdp_pp_kind kind, int P, int V, int M, double tf, double tb)
{
    struct fsdp_pp_schedule s[MAXP];
    char why[128] = "";
    int ok = 1;
    size_t bad_peak = 0, want_peak = 0;
    int bad_rank = -1;
    for (int r = 0; r < P; r++) {
        ok &= fsdp_pp_schedule_create(kind, P, V, M, r, &s[r]) == 0;
    }
    for (int r = 0; r < P && ok; r++) {
        ok &= covers(&s[r], why, sizeof(why));
        size_t peak = fsdp_pp_schedule_peak(&s[r]);
        /* what each promises: gpipe M, 1f1b P - r (at most M), interleaved
         * its warm-up plus one */
        size_t bound = kind == FSDP_PP_GPIPE  ? (size_t)M
                       : kind == FSDP_PP_1F1B ? (size_t)(P - r < M ? P - r : M)
                                              : fsdp_pp_peak_bound(kind, P, V, M, r);
        if ((peak != bound || fsdp_pp_peak_bound(kind, P, V, M, r) != bound) && bad_rank < 0) {
            bad_rank = r, bad_peak = peak, want_peak = bound;
        }
    }
    tap_ok(ok, "%s P=%d V=%d M=%d: every pass once, each forward before its backward%s%s",
           fsdp_pp_kind_name(kind), P, V, M, why[0] ? ": " : "", why);
    if (bad_rank >= 0) {
        tap_diag("rank %d holds %zu activations at its peak, the schedule promises %zu", bad_rank,
                 bad_peak, want_peak);
    }
    tap_ok(bad_rank < 0, "%s P=%d V=%d M=%d: peak of held activations equals the bound",
           fsdp_pp_kind_name(kind), P, V, M);
    struct fsdp_pp_sim sim;
    double bubble = fsdp_pp_bubble(kind, P, V, M);
    ok = ok && fsdp_pp_simulate(s, tf, tb, &sim) == 0;
    if (ok && (sim.deadlock || fabs(sim.idle_max - bubble) > 1e-9 ||
               fabs(sim.idle_min - bubble) > 1e-9)) {
        tap_diag("deadlock %d (rank %d), idle %.6f .. %.6f, analytical %.6f", sim.deadlock,
                 sim.stuck_rank, sim.idle_min, sim.idle_max, bubble);
        ok = 0;
    }
    tap_ok(ok, "%s P=%d V=%d M=%d (tf %.0f, tb %.0f): no deadlock, idle share %.4f on every rank",
           fsdp_pp_kind_name(kind), P, V, M, tf, tb, bubble);
    for (int r = 0; r < P; r++) {
        fsdp_pp_schedule_free(&s[r]);
    }
}

/* The tables everyone draws for P 4, M 8 (Megatron, PyTorch's
 * schedules): warm-up, steady one-forward-one-backward, cool-down. */
static void published_tables(void)
{
    static const char *const f1b = "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"
                                   "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\n"
                                   "rank 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7\n"
                                   "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n";
    /* P 2, V 2, M 4: rank 0 warms up with (2 - 1) 2 + (2 - 1) 2 = 4
     * forwards, rank 1 with 2; micro-batches pass the chunks in pairs */
    static const char *const inter =
        "rank 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0\n"
        "rank 1: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0\n";
    struct {
        enum fsdp_pp_kind kind;
        int P, V, M;
        const char *want;
    } cases[] = {{FSDP_PP_1F1B, 4, 1, 8, f1b}, {FSDP_PP_INTERLEAVED, 2, 2, 4, inter}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        struct fsdp_pp_schedule s[MAXP];
        char buf[2048];
        int P = cases[c].P;
        for (int r = 0; r < P; r++) {
            fsdp_pp_schedule_create(cases[c].kind, P, cases[c].V, cases[c].M, r, &s[r]);
        }
        size_t len = fsdp_pp_format(s, buf, sizeof(buf));
        int ok = len < sizeof(buf) && strcmp(buf, cases[c].want) == 0;
        if (!ok) {
            tap_diag("got:\n%swant:\n%s", buf, cases[c].want);
        }
        tap_ok(ok, "%s P=%d V=%d M=%d: the published table", fsdp_pp_kind_name(cases[c].kind), P,
               cases[c].V, cases[c].M);
        char small[16];
        size_t cut = fsdp_pp_format(s, small, sizeof(small));
        tap_ok(cut == len && strlen(small) == sizeof(small) - 1 &&
                   strncmp(small, buf, sizeof(small) - 1) == 0,
               "the table truncates like snprintf and says its whole length");
        for (int r = 0; r < P; r++) {
            fsdp_pp_schedule_free(&s[r]);
        }
    }
}

/* A table with one backward moved before the forward that feeds it (its
 * activation gradient cannot have arrived) is a deadlock the simulation
 * names. */
static void broken_table(void)
{
    struct fsdp_pp_schedule s[2];
    fsdp_pp_schedule_create(FSDP_PP_1F1B, 2, 1, 4, 0, &s[0]);
    fsdp_pp_schedule_create(FSDP_PP_1F1B, 2, 1, 4, 1, &s[1]);
    struct fsdp_pp_action t = s[1].at[0]; /* rank 1: F0 B0 ... -> B0 F0 ... */
    s[1].at[0] = s[1].at[1];
    s[1].at[1] = t;
    struct fsdp_pp_sim sim;
    int rc = fsdp_pp_simulate(s, 1, 2, &sim);
    tap_ok(rc == 0 && sim.deadlock && sim.stuck_rank >= 0,
           "a backward ahead of its forward deadlocks, and the simulation names rank %d",
           sim.stuck_rank);
    fsdp_pp_schedule_free(&s[0]);
    fsdp_pp_schedule_free(&s[1]);
}

static void bad_settings(void)
{
    enum fsdp_pp_kind k;
    struct fsdp_pp_schedule s;
    tap_ok(fsdp_pp_kind_parse("1f1b", &k) == 0 && k == FSDP_PP_1F1B, "parse 1f1b");
    tap_ok(fsdp_pp_kind_parse("zerobubble", &k) == FSDP_ERR_INVALID, "an unknown schedule");
    tap_ok(fsdp_pp_schedule_create(FSDP_PP_1F1B, 4, 2, 8, 0, &s) == FSDP_ERR_INVALID,
           "virtual stages with 1f1b");
    tap_ok(fsdp_pp_schedule_create(FSDP_PP_INTERLEAVED, 4, 1, 8, 0, &s) == FSDP_ERR_INVALID,
           "interleaved with one stage per rank");
    tap_ok(fsdp_pp_schedule_create(FSDP_PP_INTERLEAVED, 4, 2, 6, 0, &s) == FSDP_ERR_INVALID,
           "interleaved with micro-batches not a multiple of the ranks");
    tap_ok(fsdp_pp_schedule_create(FSDP_PP_GPIPE, 4, 1, 0, 0, &s) == FSDP_ERR_INVALID,
           "no micro-batches");
    tap_ok(fsdp_pp_schedule_create(FSDP_PP_GPIPE, 4, 1, 8, 4, &s) == FSDP_ERR_INVALID,
           "a rank outside the pipeline");
}

/* The activation sets each chunk keeps (fsdp_pp_chunk_holds) for tables
 * counted by hand: 1f1b P 4, M 8 (rank r: P - r), gpipe (M), interleaved
 * P 2, V 2, M 4 (rank 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1
 * B0.0 ..., chunk 0 up to 4, chunk 1 up to 2; rank 1: 3 and 1) and P 4,
 * V 2, M 8 (rank 0: 8 and 4). */
static void chunk_holds(void)
{
    static const struct {
        enum fsdp_pp_kind kind;
        int P, V, M, rank, sum, most[2];
    } cases[] = {
        {FSDP_PP_1F1B, 4, 1, 8, 0, 4, {4, 0}},        {FSDP_PP_1F1B, 4, 1, 8, 1, 3, {3, 0}},
        {FSDP_PP_1F1B, 4, 1, 8, 3, 1, {1, 0}},        {FSDP_PP_1F1B, 4, 1, 2, 0, 2, {2, 0}},
        {FSDP_PP_GPIPE, 4, 1, 8, 2, 8, {8, 0}},       {FSDP_PP_INTERLEAVED, 2, 2, 4, 0, 6, {4, 2}},
        {FSDP_PP_INTERLEAVED, 2, 2, 4, 1, 4, {3, 1}}, {FSDP_PP_INTERLEAVED, 4, 2, 8, 0, 12, {8, 4}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int most[2] = {0, 0};
        int n = fsdp_pp_chunk_holds_of(cases[i].kind, cases[i].P, cases[i].V, cases[i].M,
                                       cases[i].rank, most);
        int ok = n == cases[i].sum && most[0] == cases[i].most[0] &&
                 (cases[i].V < 2 || most[1] == cases[i].most[1]);
        if (!ok) {
            tap_diag("got %d (%d, %d)", n, most[0], most[1]);
        }
        tap_ok(ok, "%s P=%d V=%d M=%d rank %d keeps %d activation sets (%d, %d by chunk)",
               fsdp_pp_kind_name(cases[i].kind), cases[i].P, cases[i].V, cases[i].M, cases[i].rank,
               cases[i].sum, cases[i].most[0], cases[i].most[1]);
    }
    int most[2];
    tap_ok(fsdp_pp_chunk_holds_of(FSDP_PP_INTERLEAVED, 2, 2, 3, 0, most) < 0,
           "activation sets of a schedule one cannot build: an error");
}

int main(void)
{
    fsdp_log_quiet();
    published_tables();
    chunk_holds();
    broken_table();
    bad_settings();
    const int Ps[] = {1, 2, 3, 4, 8}, Ms[] = {1, 2, 3, 4, 8, 16};
    for (size_t i = 0; i < sizeof(Ps) / sizeof(Ps[0]); i++) {
        for (size_t j = 0; j < sizeof(Ms) / sizeof(Ms[0]); j++) {
            one_setting(FSDP_PP_GPIPE, Ps[i], 1, Ms[j], 1, 2);
            one_setting(FSDP_PP_1F1B, Ps[i], 1, Ms[j], 1, 2);
            one_setting(FSDP_PP_1F1B, Ps[i], 1, Ms[j], 1, 1);
            for (int V = 2; V <= 3; V++) {
                if (Ms[j] % Ps[i] == 0) {
                    one_setting(FSDP_PP_INTERLEAVED, Ps[i], V, Ms[j], 1, 2);
                    one_setting(FSDP_PP_INTERLEAVED, Ps[i], V, Ms[j], 1, 1);
                }
            }
        }
    }
    return tap_done();
}
