/*
 * pp_schedule.c - the pipeline schedules' tables (pp_schedule.h), their
 * peaks and bubbles, and the simulation that runs them against their
 * dependencies. Owns no group and calls no collective.
 */
#include "parallel/pp_schedule.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const char *const pp_names[] = {
    [FSDP_PP_GPIPE] = "gpipe",
    [FSDP_PP_1F1B] = "1f1b",
    [FSDP_PP_INTERLEAVED] = "interleaved",
};

int fsdp_pp_kind_parse(const char *s, enum fsdp_pp_kind *out)
{
    for (int k = 0; k < (int)(sizeof(pp_names) / sizeof(pp_names[0])); k++) {
        if (s && strcmp(s, pp_names[k]) == 0) {
            *out = (enum fsdp_pp_kind)k;
            return 0;
        }
    }
    return fsdp_err(FSDP_ERR_INVALID, "pipeline schedule '%s': use gpipe, 1f1b or interleaved",
                    s ? s : "");
}

const char *fsdp_pp_kind_name(enum fsdp_pp_kind kind)
{
    return (unsigned)kind < sizeof(pp_names) / sizeof(pp_names[0]) ? pp_names[kind] : "?";
}

int fsdp_pp_check(enum fsdp_pp_kind kind, int P, int V, int M)
{
    if (P < 1 || M < 1 || V < 1) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "pipeline: %d stages, %d micro-batches, %d virtual "
                        "stages per rank: each must be at least 1",
                        P, M, V);
    }
    if (kind != FSDP_PP_INTERLEAVED && V != 1) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "pipeline schedule %s runs one stage per rank, not "
                        "%d: use --pp-schedule interleaved for virtual stages",
                        fsdp_pp_kind_name(kind), V);
    }
    if (kind == FSDP_PP_INTERLEAVED && V < 2) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "pipeline schedule interleaved needs at least 2 "
                        "virtual stages per rank (--pp-virtual), not %d",
                        V);
    }
    if (kind == FSDP_PP_INTERLEAVED && M % P != 0) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "pipeline schedule interleaved takes micro-batches in "
                        "groups of the %d ranks: %d micro-batches is not a multiple of %d",
                        P, M, P);
    }
    return 0;
}

/* The k-th forward (or backward) pass of an interleaved rank: micro-batches
 * go through the chunks in groups of P; backwards run the chunks from the
 * last. */
static struct fsdp_pp_action pp_interleaved_at(enum fsdp_pp_op op, int k, int P, int V)
{
    int group = k / (P * V), in_group = k % (P * V);
    int chunk = in_group / P;
    struct fsdp_pp_action a = {.op = op, .mb = group * P + in_group % P, .chunk = chunk};
    if (op == FSDP_PP_BWD) {
        a.chunk = V - 1 - chunk;
    }
    return a;
}

static int pp_warmup(enum fsdp_pp_kind kind, int P, int V, int M, int rank)
{
    int total = M * V, w;
    switch (kind) {
    case FSDP_PP_GPIPE:
        w = total;
        break;
    case FSDP_PP_1F1B:
        w = P - 1 - rank;
        break;
    default:
        w = (P - 1 - rank) * 2 + (V - 1) * P;
        break;
    }
    return w < total ? w : total;
}

int fsdp_pp_schedule_create(enum fsdp_pp_kind kind, int P, int V, int M, int rank,
                            struct fsdp_pp_schedule *out)
{
    memset(out, 0, sizeof(*out));
    FSDP_CHECK(fsdp_pp_check(kind, P, V, M));
    if (rank < 0 || rank >= P) {
        return fsdp_err(FSDP_ERR_INVALID, "pipeline rank %d of %d", rank, P);
    }
    int total = M * V;
    out->at = malloc(2 * (size_t)total * sizeof(*out->at));
    if (!out->at) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline schedule of %d passes", 2 * total);
    }
    *out = (struct fsdp_pp_schedule){
        .kind = kind, .P = P, .V = V, .M = M, .rank = rank, .at = out->at};
    int w = pp_warmup(kind, P, V, M, rank), f = 0, b = 0;
    /* warm-up forwards, then one forward and one backward in turn, then
     * the cool-down backwards: gpipe is all warm-up */
    while (f < w) {
        out->at[out->n++] = pp_interleaved_at(FSDP_PP_FWD, f++, P, V);
    }
    while (f < total) {
        out->at[out->n++] = pp_interleaved_at(FSDP_PP_FWD, f++, P, V);
        out->at[out->n++] = pp_interleaved_at(FSDP_PP_BWD, b++, P, V);
    }
    while (b < total) {
        out->at[out->n++] = pp_interleaved_at(FSDP_PP_BWD, b++, P, V);
    }
    return 0;
}

void fsdp_pp_schedule_free(struct fsdp_pp_schedule *s)
{
    if (s) {
        free(s->at);
        s->at = NULL;
        s->n = 0;
    }
}

size_t fsdp_pp_schedule_peak(const struct fsdp_pp_schedule *s)
{
    size_t held = 0, peak = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->at[i].op == FSDP_PP_FWD) {
            held++;
            peak = held > peak ? held : peak;
        } else if (held > 0) {
            held--;
        }
    }
    return peak;
}

size_t fsdp_pp_peak_bound(enum fsdp_pp_kind kind, int P, int V, int M, int rank)
{
    size_t total = (size_t)M * V;
    size_t w = (size_t)pp_warmup(kind, P, V, M, rank);
    return w + 1 < total ? w + 1 : total;
}

int fsdp_pp_chunk_holds(const struct fsdp_pp_schedule *s, int *most)
{
    int sum = 0;
    for (int c = 0; c < s->V; c++) {
        int now = 0;
        most[c] = 1;
        for (size_t i = 0; i < s->n; i++) {
            if (s->at[i].chunk == c) {
                now += s->at[i].op == FSDP_PP_FWD ? 1 : -1;
                most[c] = now > most[c] ? now : most[c];
            }
        }
        sum += most[c];
    }
    return sum;
}

int fsdp_pp_chunk_holds_of(enum fsdp_pp_kind kind, int P, int V, int M, int rank, int *most)
{
    struct fsdp_pp_schedule s;
    FSDP_CHECK(fsdp_pp_check(kind, P, V, M));
    FSDP_CHECK(fsdp_pp_schedule_create(kind, P, V, M, rank, &s));
    int n = fsdp_pp_chunk_holds(&s, most);
    fsdp_pp_schedule_free(&s);
    return n;
}

double fsdp_pp_bubble(enum fsdp_pp_kind kind, int P, int V, int M)
{
    double v = kind == FSDP_PP_INTERLEAVED ? V : 1;
    return (P - 1) / (v * M + P - 1);
}

/* snprintf that keeps counting past the end (the total length, as
 * snprintf returns it, whatever n). */
static size_t pp_put(char *buf, size_t n, size_t at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(at < n ? buf + at : NULL, at < n ? n - at : 0, fmt, ap);
    va_end(ap);
    return at + (w > 0 ? (size_t)w : 0);
}

size_t fsdp_pp_format(const struct fsdp_pp_schedule *ranks, char *buf, size_t n)
{
    size_t at = 0;
    if (n > 0) {
        buf[0] = '\0';
    }
    for (int r = 0; r < ranks[0].P; r++) {
        const struct fsdp_pp_schedule *s = &ranks[r];
        at = pp_put(buf, n, at, "rank %d:", r);
        for (size_t i = 0; i < s->n; i++) {
            const struct fsdp_pp_action *a = &s->at[i];
            at = pp_put(buf, n, at, " %c%d", a->op == FSDP_PP_FWD ? 'F' : 'B', a->mb);
            if (s->V > 1) {
                at = pp_put(buf, n, at, ".%d", a->chunk);
            }
        }
        at = pp_put(buf, n, at, "\n");
    }
    return at;
}

// ----------------------------------------------------------------------------
// simulation

/* When each (op, mb, stage) pass ended, -1 until it has. */
struct pp_clock {
    int S, M;
    double *end; /* (2, M, S) */
};

static double *pp_end(struct pp_clock *c, enum fsdp_pp_op op, int mb, int stage)
{
    return &c->end[((size_t)op * c->M + mb) * c->S + stage];
}

/* When action a of rank s may start (its inputs are there), or -1. */
static double pp_ready(struct pp_clock *c, const struct fsdp_pp_schedule *s,
                       const struct fsdp_pp_action *a)
{
    int st = fsdp_pp_stage(s, a);
    if (a->op == FSDP_PP_FWD) {
        return st == 0 ? 0 : *pp_end(c, FSDP_PP_FWD, a->mb, st - 1);
    }
    double own = *pp_end(c, FSDP_PP_FWD, a->mb, st);
    double next = st == c->S - 1 ? 0 : *pp_end(c, FSDP_PP_BWD, a->mb, st + 1);
    if (own < 0 || next < 0) {
        return -1;
    }
    return own > next ? own : next;
}

int fsdp_pp_simulate(const struct fsdp_pp_schedule *ranks, double tf, double tb,
                     struct fsdp_pp_sim *out)
{
    int P = ranks[0].P;
    memset(out, 0, sizeof(*out));
    out->stuck_rank = -1;
    struct pp_clock c = {.S = P * ranks[0].V, .M = ranks[0].M};
    size_t n_end = 2 * (size_t)c.M * c.S;
    c.end = malloc(n_end * sizeof(double));
    size_t *next = calloc((size_t)P, sizeof(size_t));
    double *free_at = calloc((size_t)P, sizeof(double)), *busy = calloc((size_t)P, sizeof(double));
    if (!c.end || !next || !free_at || !busy) {
        free(c.end), free(next), free(free_at), free(busy);
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline simulation of %d ranks", P);
    }
    for (size_t i = 0; i < n_end; i++) {
        c.end[i] = -1;
    }
    /* run every rank as far as its inputs allow, until no rank can go on:
     * each rank's passes are in table order, each starts at the latest of
     * its rank's last end and its inputs' ends */
    for (int moved = 1; moved;) {
        moved = 0;
        for (int r = 0; r < P; r++) {
            while (next[r] < ranks[r].n) {
                const struct fsdp_pp_action *a = &ranks[r].at[next[r]];
                double ready = pp_ready(&c, &ranks[r], a);
                if (ready < 0) {
                    break;
                }
                double t = a->op == FSDP_PP_FWD ? tf : tb;
                double start = ready > free_at[r] ? ready : free_at[r];
                free_at[r] = start + t;
                busy[r] += t;
                *pp_end(&c, a->op, a->mb, fsdp_pp_stage(&ranks[r], a)) = free_at[r];
                next[r]++;
                moved = 1;
            }
        }
    }
    for (int r = 0; r < P; r++) {
        if (next[r] < ranks[r].n && !out->deadlock) {
            out->deadlock = 1;
            out->stuck_rank = r;
        }
        out->makespan = free_at[r] > out->makespan ? free_at[r] : out->makespan;
    }
    out->idle_min = 1;
    for (int r = 0; r < P && out->makespan > 0; r++) {
        double idle = 1 - busy[r] / out->makespan;
        out->idle_max = idle > out->idle_max ? idle : out->idle_max;
        out->idle_min = idle < out->idle_min ? idle : out->idle_min;
    }
    free(c.end), free(next), free(free_at), free(busy);
    return 0;
}
