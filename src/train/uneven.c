/*
 * uneven.c - per-rank data paths, passes without wrap-around, and the
 * per-step agreement of join / stop for uneven inputs (see uneven.h).
 *
 * Owns the decision of which ranks contribute to a step and when a pass and
 * the run end; the engine (a step with no batch arrays) owns what a rank
 * without a batch does inside the step. Every rank reaches the same
 * decision from the same agreed vector, so the ranks never disagree on the
 * number of steps.
 */
#include "config.h"
#include "train/uneven.h"
#include "train/train_config.h"
#include "train/world.h"
#include "core/error.h"
#include "core/log.h"
#include "rendezvous/dist.h"
#include "io/ckpt/ckpt.h"
#include "io/text/tokens.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fsdp_uneven_path(const char *tmpl, int rank, char *out, size_t len, int *per_rank)
{
    static const char field[] = FSDP_TRAIN_RANK_FIELD;
    size_t used = 0;
    *per_rank = 0;
    for (const char *p = tmpl; *p;) {
        char piece[32];
        const char *next;
        if (strncmp(p, field, sizeof(field) - 1) == 0) {
            snprintf(piece, sizeof(piece), "%d", rank);
            next = p + sizeof(field) - 1;
            *per_rank = 1;
        } else if (*p == '{' && strchr(p, '}')) {
            return fsdp_err(FSDP_ERR_INVALID, "%s: unknown field '%.*s' (the only one is %s)",
                            tmpl, (int)(strchr(p, '}') - p + 1), p, field);
        } else {
            piece[0] = *p;
            piece[1] = '\0';
            next = p + 1;
        }
        size_t n = strlen(piece);
        if (used + n >= len) {
            return fsdp_err(FSDP_ERR_INVALID, "%s: the path for rank %d is too long", tmpl, rank);
        }
        memcpy(out + used, piece, n);
        used += n;
        p = next;
    }
    out[used] = '\0';
    return 0;
}

// ----------------------------------------------------------------------------
// setup

int fsdp_uneven_create(const struct fsdp_uneven_run *run, struct fsdp_uneven **out)
{
    const struct fsdp_train_config *c = run->cfg;
    struct fsdp_uneven *u;
    int rc;
    *out = NULL;
    if (c->epochs == 0) {
        return 0;
    }
    if (!(u = calloc(1, sizeof(*u)))) {
        return fsdp_err(FSDP_ERR_NOMEM, "uneven inputs");
    }
    u->run = *run;
    u->rank = run->rank;
    u->world = run->size;
    u->join = c->uneven == FSDP_UNEVEN_JOIN;
    u->K = (int)c->grad_accum;
    u->epochs = c->epochs;
    run->train->wrap = 0; /* a pass ends at the end of the data; the vote starts the next */
    u->per_pass = calloc((size_t)u->world, sizeof(*u->per_pass));
    u->vote = calloc((size_t)u->world + 1, sizeof(*u->vote));
    u->had = calloc((size_t)u->world, sizeof(*u->had));
    u->scratch = calloc((size_t)u->world, sizeof(*u->scratch));
    if (!u->per_pass || !u->vote || !u->had || !u->scratch) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "uneven inputs: tables for %d ranks", u->world);
        goto err;
    }
    uint64_t mine = fsdp_dataloader_steps_per_pass(run->train, u->K);
    /* every rank's count in vote[0..world), one collective */
    FSDP_CHECK_GOTO(
        fsdp_world_allgather(run->world, mine > INT32_MAX ? INT32_MAX : (int32_t)mine, u->vote), rc,
        err);
    uint64_t lo = UINT64_MAX, hi = 0;
    int lo_rank = 0;
    for (int r = 0; r < u->world; r++) {
        u->per_pass[r] = (uint64_t)u->vote[r];
        if (u->per_pass[r] < lo) {
            lo = u->per_pass[r];
            lo_rank = r;
        }
        hi = u->per_pass[r] > hi ? u->per_pass[r] : hi;
    }
    if (hi == 0) {
        rc = fsdp_err(FSDP_ERR_INVALID, "data %s: no rank has a full step (%d micro-batch%s of "
                      "%ld x %ld tokens) in a pass, so --epochs would train no step", c->data,
                      u->K, u->K > 1 ? "es" : "", c->batch_size, c->seq_len);
        goto err;
    }
    if (!u->join && lo == 0) {
        rc = fsdp_err(FSDP_ERR_INVALID, "data %s: rank %d has no full step (%d micro-batch%s of "
                      "%ld x %ld tokens), so --uneven stop would train no step (with --uneven "
                      "join it shadows the others)", c->data, lo_rank, u->K, u->K > 1 ? "es" : "",
                      c->batch_size, c->seq_len);
        goto err;
    }
    u->pass_steps = (long)(u->join ? hi : lo);
    u->total_steps = u->pass_steps * c->epochs;
    if (c->steps > 0 && c->steps < u->total_steps) {
        u->total_steps = c->steps;
    }
    if (c->warmup > u->total_steps) {
        rc = fsdp_err(FSDP_ERR_INVALID, "warmup %ld is longer than the run's %ld steps (%ld "
                      "epoch%s of %ld)", c->warmup, u->total_steps, c->epochs,
                      c->epochs > 1 ? "s" : "", u->pass_steps);
        goto err;
    }
    for (int r = 0; r < u->world; r++) {
        u->had[r] = 1;
    }
    *out = u;
    return 0;
err:
    fsdp_uneven_destroy(u);
    return rc;
}

void fsdp_uneven_destroy(struct fsdp_uneven *u)
{
    if (!u) {
        return;
    }
    free(u->per_pass);
    free(u->vote);
    free(u->had);
    free(u->scratch);
    free(u);
}

void fsdp_uneven_describe(const struct fsdp_uneven *u, char *buf, size_t len)
{
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int r = 0; r < u->world; r++) {
        lo = u->per_pass[r] < lo ? u->per_pass[r] : lo;
        hi = u->per_pass[r] > hi ? u->per_pass[r] : hi;
    }
    int n = snprintf(buf, len, "passes: %ld epoch%s of %ld steps = %ld steps", u->epochs,
                     u->epochs > 1 ? "s" : "", u->pass_steps, u->total_steps);
    if (n < 0 || (size_t)n >= len) {
        return;
    }
    if (u->run.cfg->steps > 0 && u->run.cfg->steps == u->total_steps) {
        int m = snprintf(buf + n, len - (size_t)n, " (capped by --steps)");
        n += m > 0 && (size_t)m < len - (size_t)n ? m : 0;
    }
    if (lo == hi) {
        snprintf(buf + n, len - (size_t)n, " | every rank has %llu steps per pass",
                 (unsigned long long)lo);
    } else {
        snprintf(buf + n, len - (size_t)n, " | ranks have %llu to %llu steps per pass, uneven %s",
                 (unsigned long long)lo, (unsigned long long)hi, u->join ? "join" : "stop");
    }
}

// ----------------------------------------------------------------------------
// the per-step agreement

/* "2" or "1, 2" or "0, 1, 2, ... (5 ranks)": the ranks whose flag is set */
static void unv_list(const int32_t *flags, int world, char *buf, size_t len)
{
    size_t used = 0;
    int shown = 0, total = 0;
    buf[0] = '\0';
    for (int r = 0; r < world; r++) {
        if (!flags[r]) {
            continue;
        }
        total++;
        if (shown < 8 && used < len) {
            int n = snprintf(buf + used, len - used, "%s%d", shown ? ", " : "", r);
            used += n > 0 ? (size_t)n : 0;
            shown++;
        }
    }
    if (total > shown && used < len) {
        snprintf(buf + used, len - used, ", ... (%d ranks)", total);
    }
}

static int unv_count(struct fsdp_uneven *u)
{
    int n = 0;
    for (int r = 0; r < u->world; r++) {
        n += u->vote[1 + r] != 0;
    }
    return n;
}

/* One agreement over [signal, has a batch of rank 0 .. world-1]. */
static int unv_agree(struct fsdp_uneven *u, int signalled)
{
    memset(u->vote, 0, ((size_t)u->world + 1) * sizeof(*u->vote));
    u->vote[0] = signalled; /* a signal number: the highest wins */
    u->vote[1 + u->rank] = fsdp_dataloader_fits(u->run.train, u->K);
    return fsdp_world_max(u->run.world, u->vote, u->world + 1);
}

/* Rank 0's line when ranks run out in the middle of a pass (join). */
static void unv_log_join(struct fsdp_uneven *u, long step, int n)
{
    int32_t *out_now = u->scratch;
    int any = 0;
    for (int r = 0; r < u->world; r++) {
        out_now[r] = u->had[r] && !u->vote[1 + r];
        any |= out_now[r];
    }
    if (any && u->rank == 0) {
        char who[128];
        unv_list(out_now, u->world, who, sizeof(who));
        FSDP_INFO(FSDP_SUB_TRAIN,
                  "rank%s %s out of data at step %ld (pass %llu of %ld); %d of "
                  "%d ranks contribute",
                  strchr(who, ',') ? "s" : "", who, step + 1,
                  (unsigned long long)u->run.train->epoch + 1, u->epochs, n, u->world);
    }
}

/* Rank 0's line when a pass ends. */
static void unv_log_pass_end(struct fsdp_uneven *u, long step, int n)
{
    unsigned long long pass = (unsigned long long)u->run.train->epoch + 1;
    int last = (long)pass >= u->epochs;
    if (u->rank != 0) {
        return;
    }
    if (u->join || n == 0) {
        FSDP_INFO(FSDP_SUB_TRAIN,
                  "pass %llu of %ld ended after step %ld: no rank has data "
                  "left%s",
                  pass, u->epochs, step, last ? "; training ends" : "");
        return;
    }
    int32_t *lacking = u->scratch;
    char who[128], rest[128];
    for (int r = 0; r < u->world; r++) {
        lacking[r] = !u->vote[1 + r];
    }
    unv_list(lacking, u->world, who, sizeof(who));
    unv_list(u->vote + 1, u->world, rest, sizeof(rest));
    FSDP_INFO(FSDP_SUB_TRAIN,
              "uneven stop: rank%s %s out of data at step %ld; pass %llu of %ld "
              "ends here on all %d ranks (rank%s %s had batches left)%s",
              strchr(who, ',') ? "s" : "", who, step + 1, pass, u->epochs, u->world,
              strchr(rest, ',') ? "s" : "", rest, last ? "; training ends" : "");
}

int fsdp_uneven_vote(struct fsdp_uneven *u, long step, int signalled, int *preempt)
{
    FSDP_CHECK(unv_agree(u, signalled));
    *preempt = u->vote[0];
    int n = unv_count(u);
    int ended = u->join ? n == 0 : n < u->world;
    if (ended) {
        unv_log_pass_end(u, step, n);
        if ((long)u->run.train->epoch + 1 >= u->epochs) {
            u->done = 1;
            u->have = 0;
            u->n_contrib = 0;
            return 0;
        }
        fsdp_dataloader_new_pass(u->run.train);
        FSDP_CHECK(unv_agree(u, 0));
        n = unv_count(u);
        if (u->join ? n == 0 : n < u->world) {
            /* every rank's next pass starts at token 0 of an unchanged file */
            return fsdp_err(FSDP_ERR_INTERNAL,
                            "pass %llu: %d of %d ranks have a batch at its "
                            "start",
                            (unsigned long long)u->run.train->epoch + 1, n, u->world);
        }
        for (int r = 0; r < u->world; r++) {
            u->had[r] = 1;
        }
    }
    if (u->join) {
        unv_log_join(u, step, n);
    }
    for (int r = 0; r < u->world; r++) {
        u->had[r] = u->vote[1 + r];
    }
    u->have = u->vote[1 + u->rank] != 0;
    u->n_contrib = n;
    return 0;
}

// ----------------------------------------------------------------------------
// resume

/* This rank's cursor after `steps` steps, computed as the loop moves it. */
static void unv_state_after(const struct fsdp_uneven_run *run, const struct fsdp_uneven *u,
                            long steps, struct fsdp_dataloader_state *st)
{
    const uint64_t K = (uint64_t)run->cfg->grad_accum;
    if (!u) { /* wrapping: every step takes K micro-batches */
        fsdp_dataloader_state_after(run->train, (uint64_t)steps * K, st);
        return;
    }
    st->n_tokens = fsdp_tokens_count(run->train->tokens);
    st->position = 0;
    st->epoch = 0;
    if (steps <= 0) {
        return;
    }
    /* passes have pass_steps steps; the vote after a pass's last step (which
     * precedes that step's checkpoint) starts the next pass when one remains,
     * so a boundary leaves the cursor at token 0 of the next pass; after the
     * last pass it stays at the end */
    uint64_t s = (uint64_t)steps, L = (uint64_t)u->pass_steps;
    if (s % L == 0 && s / L < (uint64_t)u->epochs) {
        st->epoch = s / L;
        return;
    }
    uint64_t in_pass = s - (s - 1) / L * L;
    uint64_t mine = u->per_pass[u->rank];
    st->epoch = (s - 1) / L;
    st->position = (in_pass < mine ? in_pass : mine) * K * run->train->step_tokens;
}

int fsdp_uneven_resume_state(const struct fsdp_uneven_run *run, const struct fsdp_uneven *u,
                             const struct fsdp_ckpt_meta *m, struct fsdp_dataloader_state *ds)
{
    const struct fsdp_train_config *c = run->cfg;
    int rc = 0;
    if (!run->per_rank_data) {
        return 0;
    }
    if (m->world_size != run->size) {
        /* every rank finds this alike; rank 0 alone reports it (trainer.h) */
        if (run->rank != 0) {
            return FSDP_ERR_ABORTED;
        }
        return fsdp_err(FSDP_ERR_ABORTED,
                        "per-rank data files (%s): the checkpoint was "
                        "written by %d rank%s and this run has %d; each rank's cursor is only "
                        "known for the same ranks and files",
                        c->data, m->world_size, m->world_size > 1 ? "s" : "", run->size);
    }
    struct fsdp_dataloader_state st;
    unv_state_after(run, u, m->step, &st);
    if (run->rank == 0 && (st.position != ds->position || st.epoch != ds->epoch ||
                           (ds->n_tokens != 0 && st.n_tokens != ds->n_tokens))) {
        rc = fsdp_err(FSDP_ERR_INVALID,
                      "per-rank data files (%s): the checkpoint's cursor of "
                      "rank 0 (token %llu of pass %llu, file of %llu tokens) is not where %ld "
                      "steps leave %s (token %llu of pass %llu, %llu tokens); resume with the "
                      "files, batch-size, seq-len, grad-accum and epochs of the run that wrote it",
                      c->data, (unsigned long long)ds->position, (unsigned long long)ds->epoch + 1,
                      (unsigned long long)ds->n_tokens, m->step,
                      fsdp_tokens_path(run->train->tokens), (unsigned long long)st.position,
                      (unsigned long long)st.epoch + 1, (unsigned long long)st.n_tokens);
    }
    int32_t failed = rc < 0;
    FSDP_CHECK(fsdp_world_max(run->world, &failed, 1));
    if (failed) { /* every rank knows now; rank 0, the one with the message, reports it */
        return FSDP_ERR_ABORTED;
    }
    *ds = st;
    return 0;
}
