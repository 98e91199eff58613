/*
 * ckpt_resume.c - resuming from a checkpoint (ckpt_cadence.h): the newest
 * committed step found (or the one named), checked against the model and
 * the configuration (what changed is said), read into the engine's pieces
 * through the stage, the counters and the data cursor restored, and a
 * newer lineage's steps in the directory pointed out. Saving is
 * ckpt_cadence.c's.
 */
#include "config.h"
#include "train/ckpt_cadence.h"
#include "train/ckpt_cadence_impl.h"
#include "train/save_progress.h"
#include "train/schedule.h"
#include "train/uneven.h"
#include "train/world.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "comm/mesh_spec.h"
#include "io/ckpt/ckpt.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/util/fileutil.h"
#include "io/text/tokens.h"
#include "parallel/engine.h"
#include "compute/device.h"
#include "train/stage.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Every piece this rank holds, from whatever shard count ck was written
 * with, and the counters. Local: the caller agrees on the outcome, then
 * tells the engine (state_changed, collective). */
/* A checkpoint as a row source: the engine's kind k is the checkpoint's kind_of[k]. */
struct cad_rows {
    struct fsdp_ckpt *ck;
    const int *kind_of;
};

static int cad_ckpt_rows(void *arg, int kind, size_t param, const struct fsdp_param_spec *p,
                         size_t row0, size_t rows, float *dst)
{
    const struct cad_rows *src = arg;
    (void)p;
    return fsdp_ckpt_read_rows(src->ck, src->kind_of[kind], param, row0, rows, dst);
}

static int cad_read_state(const struct fsdp_ckpt_run *r, struct fsdp_ckpt *ck)
{
    struct fsdp_engine *e = r->engine;
    const struct fsdp_ckpt_meta *m = fsdp_ckpt_meta(ck);
    const struct fsdp_ckpt_kinds *ks = fsdp_ckpt_kinds(ck);
    int kind_of[1 + FSDP_CKPT_MAX_STATE] = {FSDP_CKPT_MODEL}; /* the engine's kind -> ck's */
    if (e->n_state + 1 != ks->n) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "%s: the checkpoint keeps %d optimizer tensors per parameter, the "
                        "optimizer %d",
                        fsdp_ckpt_dir(ck), ks->n - 1, e->n_state);
    }
    for (int k = 1; k <= e->n_state; k++) {
        if ((kind_of[k] = fsdp_ckpt_kind_of(ks, e->state_names[k - 1])) < 0) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED,
                            "%s: the checkpoint keeps no optimizer state '%s'", fsdp_ckpt_dir(ck),
                            e->state_names[k - 1]);
        }
    }
    struct cad_rows src = {ck, kind_of};
    FSDP_CHECK(fsdp_stage_fill_pieces(e, r->spec, r->dev, 1 + e->n_state, cad_ckpt_rows, &src));
    struct fsdp_engine_counters cn = {.opt_step = m->adam_step,
                                      .loss_scale = m->loss_scale,
                                      .scale_good_steps = m->scale_good_steps,
                                      .skipped_steps = m->skipped_steps};
    e->ops->set_counters(e, &cn);
    return 0;
}

/* The error for a root whose latest names nothing: what it names and which
 * steps there are to resume from instead. */
static int cad_latest_missing(const char *root, const char *link)
{
    char target[256], list[512];
    long steps[CAD_MAX_STEPS];
    size_t n, used = 0;
    ssize_t k = readlink(link, target, sizeof(target) - 1);
    target[k > 0 ? k : 0] = '\0';
    list[0] = '\0';
    if (fsdp_cad_list_steps(root, steps, CAD_MAX_STEPS, &n) < 0) {
        fsdp_err_clear();
        n = 0;
    }
    qsort(steps, n, sizeof(steps[0]), fsdp_cad_cmp_desc);
    for (size_t i = 0; i < n && used < sizeof(list); i++) {
        int w = snprintf(list + used, sizeof(list) - used, "%sstep_%ld", i ? ", " : "", steps[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    return fsdp_err(FSDP_ERR_FORMAT, "%s names %s, which is missing; step directories in %s: %s%s",
                    link, target, root, n ? list : "none",
                    n ? " (resume one of them by its path)" : "");
}

/* --resume latest with no checkpoint in ckpt-dir yet: start from the model,
 * and say so on stderr (a mistyped --ckpt-dir looks just like this). */
static void cad_warn_no_latest(const struct fsdp_ckpt_cadence *c, const struct fsdp_ckpt_run *r,
                               const char *root)
{
    if (r->world->rank != 0) {
        return;
    }
    const int existed = c ? c->existed : 1;
    FSDP_WARN(FSDP_SUB_TRAIN,
              "resume latest: no checkpoint in %s%s; training starts at step 0 "
              "from %s. If a run should be continued, check --ckpt-dir; --resume required "
              "makes this an error",
              root, existed ? " yet" : " (the directory did not exist before this run)",
              r->cfg->model);
}

/* The model of the checkpoint is the model of --model (same architecture
 * and attributes), or one error naming what differs, with both values. */
static int cad_check_model(const struct fsdp_ckpt_run *r, struct fsdp_ckpt *ck)
{
    const struct fsdp_model_spec *have = fsdp_ckpt_spec(ck), *want = r->spec;
    int k = have->arch == want->arch ? fsdp_attrs_diff(want->arch, have->cfg, want->cfg) : -2;
    int rc;
    if (k == -1) {
        return 0;
    }
    char hs[256];
    fsdp_arch_describe(have->arch, have->cfg, hs, sizeof(hs));
    if (k >= 0) {
        const struct fsdp_attr_desc *a = &want->arch->attrs[k];
        rc = fsdp_err(FSDP_ERR_INVALID,
                      "%s: the checkpoint's model (%s %s) is not the "
                      "model of %s: %s is %g in the checkpoint and %g in the model",
                      fsdp_ckpt_dir(ck), have->arch->name, hs, r->cfg->model, a->name,
                      fsdp_attr_get(a, have->cfg), fsdp_attr_get(a, want->cfg));
    } else {
        rc = fsdp_err(FSDP_ERR_INVALID,
                      "%s: the checkpoint's model (%s %s) is not the "
                      "model of %s (%s)",
                      fsdp_ckpt_dir(ck), have->arch->name, hs, r->cfg->model, want->arch->name);
    }
    fsdp_err_hint("--model must be the model the checkpoint was trained from (or the "
                  "checkpoint itself: --model %s); 'fsdpc-ckpt inspect' shows both",
                  fsdp_ckpt_dir(ck));
    return rc;
}

/* The configuration the checkpoint's run stored (index.h5), read back into
 * a config of its own: set->source[i] is FSDP_SRC_FILE for each key it held. */
static int cad_stored_config(const struct fsdp_ckpt_meta *m, struct fsdp_train_config *old,
                             struct fsdp_optset *set)
{
    char line[FSDP_TRAIN_PATH_MAX + 64];
    fsdp_train_config_init(old, set);
    for (const char *p = m->config; *p;) {
        size_t n = strcspn(p, "\n");
        snprintf(line, sizeof(line), "%.*s", (int)(n < sizeof(line) ? n : sizeof(line) - 1), p);
        p += n + (p[n] == '\n');
        char *eq = strstr(line, " = ");
        if (!eq) {
            continue;
        }
        *eq = '\0';
        const char *value = eq + 3;
        if (strcmp(value, "\"\"") == 0) {
            value = "";
        }
        if (fsdp_opt_set(set, line, value, FSDP_SRC_FILE, "checkpoint") < 0) {
            fsdp_err_clear(); /* a key of another version: not compared */
        }
    }
    return 0;
}

/* Appends "key A -> B" for each of keys whose values differ. */
static int cad_diff_keys(struct fsdp_optset *set, const struct fsdp_train_config *old,
                         const struct fsdp_train_config *now, const char *const *keys, char *buf,
                         size_t len)
{
    int n = 0;
    size_t used = strlen(buf);
    for (const char *const *k = keys; *k; k++) {
        long i = fsdp_opt_find(set, *k);
        char a[160], b[160];
        if (i < 0 || set->source[i] != FSDP_SRC_FILE) {
            continue;
        }
        set->base = (void *)old;
        fsdp_opt_format_value(set, (size_t)i, a, sizeof(a));
        set->base = (void *)now;
        fsdp_opt_format_value(set, (size_t)i, b, sizeof(b));
        if (strcmp(a, b) != 0 && used < len) {
            int w = snprintf(buf + used, len - used, "%s%s %s -> %s", used ? ", " : "", *k, a, b);
            used += w > 0 ? (size_t)w : 0;
            n++;
        }
    }
    return n;
}

/* The data-parallel ranks of the run that wrote m: its ranks less its mesh's
 * tp dimension (tp peers share a batch). */
static int cad_data_world(const struct fsdp_ckpt_meta *m)
{
    struct fsdp_mesh_dims d;
    if (fsdp_mesh_parse(m->mesh, &d) < 0 || d.nranks != m->world_size) {
        fsdp_err_clear(); /* "single rank", or a mesh from elsewhere: every rank is one */
        return m->world_size;
    }
    for (int i = 0; i < d.ndims; i++) {
        if (strcmp(d.name[i], "tp") == 0) {
            return m->world_size / d.size[i];
        }
    }
    return m->world_size;
}

/*
 * Rank 0, after a resume: what changed since the run that wrote the
 * checkpoint and changes what this run does. The learning rate is a
 * function of the step and the schedule keys; the data cursor is a token
 * position, so another global batch reads other batches than the
 * uninterrupted run would have.
 */
static void cad_warn_config(const struct fsdp_ckpt_run *r, const struct fsdp_ckpt_meta *m,
                            const char *dir)
{
    static const char *const sched_keys[] = {"steps", "epochs", "warmup", "lr-schedule",
                                             "lr",    "min-lr", NULL};
    struct fsdp_train_config *old = malloc(sizeof(*old));
    struct fsdp_optset set;
    char diff[768] = "";
    if (!old || r->world->rank != 0) {
        free(old);
        return;
    }
    cad_stored_config(m, old, &set);
    if (cad_diff_keys(&set, old, r->cfg, sched_keys, diff, sizeof(diff)) > 0) {
        struct fsdp_lr_schedule was;
        fsdp_lr_schedule_init(&was, old);
        if (old->epochs > 0) {
            was.steps = r->sched->steps; /* its planned length is not stored; the pass length is */
        }
        FSDP_WARN(FSDP_SUB_TRAIN,
                  "resume: the learning-rate schedule differs from the run that "
                  "wrote %s (%s): step %ld runs at lr %.3g here, and at %.3g on that run's "
                  "schedule; give the same values to continue its schedule",
                  dir, diff, m->step + 1, fsdp_lr_at(r->sched, m->step), fsdp_lr_at(&was, m->step));
    }
    long i_b = fsdp_opt_find(&set, "batch-size"), i_k = fsdp_opt_find(&set, "grad-accum"),
         i_t = fsdp_opt_find(&set, "seq-len");
    if (i_b >= 0 && i_k >= 0 && i_t >= 0 && set.source[i_b] == FSDP_SRC_FILE && m->world_size > 0) {
        int old_dw = cad_data_world(m);
        double was = (double)old->batch_size * (double)old->grad_accum * (double)old->seq_len *
                     (double)old_dw;
        double now = (double)fsdp_train_config_step_tokens(r->cfg) * (double)r->data_world;
        if (was != now) {
            FSDP_WARN(FSDP_SUB_TRAIN,
                      "resume: the global batch differs from the run that wrote "
                      "the checkpoint: %d rank%s x %ld seq x %ld tokens x %ld micro-steps = %.0f "
                      "tokens per step there, %d x %ld x %ld x %ld = %.0f here; the data goes on "
                      "from the same token, but the steps see other batches than that run's (and "
                      "the schedule counts steps, not tokens)",
                      old_dw, old_dw > 1 ? "s" : "", old->batch_size, old->seq_len, old->grad_accum,
                      was, r->data_world, r->cfg->batch_size, r->cfg->seq_len, r->cfg->grad_accum,
                      now);
        }
    }
    static const char *const prec_keys[] = {"param-dtype", "reduce-dtype", "loss-scale", NULL};
    diff[0] = '\0';
    if (cad_diff_keys(&set, old, r->cfg, prec_keys, diff, sizeof(diff)) > 0) {
        FSDP_WARN(FSDP_SUB_TRAIN,
                  "resume: the precision differs from the run that "
                  "wrote %s (%s): the f32 master weights and optimizer state go on as saved, but "
                  "the steps from here round differently than that run's would",
                  dir, diff);
    }
    free(old);
    if (strcmp(m->mesh, r->mesh) != 0) {
        FSDP_INFO(FSDP_SUB_TRAIN,
                  "resume: %s was written on mesh %s (%d rank%s), this run is %s: "
                  "the state is re-sharded as it is read",
                  dir, m->mesh, m->world_size, m->world_size == 1 ? "" : "s", r->mesh);
    }
}

/*
 * Rank 0, after a resume: checkpoints in ckpt-dir newer than the one
 * resumed (a rollback, or a resume of an older step by mistake). latest
 * follows this run from its first save; retention leaves them alone
 * (fsdp_cad_retain, which names them again at its first removal).
 */
static void cad_warn_newer(struct fsdp_ckpt_cadence *c, long resumed)
{
    char list[512];
    size_t used = 0, n = 0;
    list[0] = '\0';
    if (!c || c->rank != 0) {
        return;
    }
    for (size_t i = 0; i < c->n_foreign; i++) {
        if (c->foreign[i] > resumed) {
            n++;
        }
    }
    if (n == 0) {
        return;
    }
    long *newer = malloc(n * sizeof(*newer));
    if (!newer) {
        return;
    }
    n = 0;
    for (size_t i = 0; i < c->n_foreign; i++) {
        if (c->foreign[i] > resumed) {
            newer[n++] = c->foreign[i];
        }
    }
    qsort(newer, n, sizeof(*newer), fsdp_cad_cmp_desc);
    for (size_t i = 0; i < n && used < sizeof(list); i++) {
        int w = snprintf(list + used, sizeof(list) - used, "%sstep_%ld", i ? ", " : "", newer[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    FSDP_WARN(FSDP_SUB_TRAIN,
              "resume: step_%ld is older than %s in %s: from this run's first "
              "save on, latest names this run's checkpoints and moves back past %s; a step this "
              "run saves again replaces the old one, and ckpt-keep neither counts nor removes the "
              "others (remove them by hand when done with them)",
              resumed, list, c->dir, n > 1 ? "them" : "it");
    free(newer);
}

/* The step directory dir is, "ROOT/step_N" for "ROOT/latest". */
static void cad_step_dir(const char *dir, char *out, size_t len)
{
    char target[256];
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    ssize_t k =
        strcmp(base, FSDP_CKPT_LATEST) == 0 ? readlink(dir, target, sizeof(target) - 1) : -1;
    if (k <= 0) {
        snprintf(out, len, "%s", dir);
        return;
    }
    target[k] = '\0';
    snprintf(out, len, "%.*s%s", (int)(base - dir), dir, target);
}

/* After the checkpoint is read: the run's counters, and what rank 0 says. */
static void cad_resumed(struct fsdp_ckpt_cadence *c, const struct fsdp_ckpt_run *r,
                        struct fsdp_ckpt *ck, double load_s)
{
    const struct fsdp_ckpt_meta *m = fsdp_ckpt_meta(ck);
    struct fsdp_run_counters *n = r->count;
    n->step = m->step;
    n->tokens_seen = m->tokens_seen;
    n->resumed_from = m->step;
    cad_step_dir(fsdp_ckpt_dir(ck), n->resumed_dir, sizeof(n->resumed_dir));
    if (c) {
        c->last_saved = m->step;
        c->last_tried = m->step;
        c->resumed_from = m->step;
    }
    if (r->world->rank != 0) {
        return;
    }
    char rate[96];
    fsdp_cad_rate_str(fsdp_file_dir_bytes(fsdp_ckpt_dir(ck), NULL), load_s, rate, sizeof(rate));
    FSDP_INFO(FSDP_SUB_TRAIN,
              "resumed from %s: step %ld, %.0f tokens seen, written by %d "
              "rank%s (mesh %s, %d shard%s); read %s",
              n->resumed_dir, m->step, m->tokens_seen, m->world_size, m->world_size > 1 ? "s" : "",
              m->mesh, m->n_shards, m->n_shards > 1 ? "s" : "", rate);
    cad_warn_config(r, m, n->resumed_dir);
    cad_warn_newer(c, m->step);
}

int fsdp_ckpt_resume(struct fsdp_ckpt_cadence *c, const struct fsdp_ckpt_run *r)
{
    const struct fsdp_train_config *cfg = r->cfg;
    struct fsdp_ckpt *ck = NULL;
    int rc;
    if (!cfg->resume[0]) {
        return 0;
    }
    const int latest = fsdp_train_config_resume_latest(cfg);
    const char *path = latest ? cfg->ckpt_dir : cfg->resume;
    char link[FSDP_TRAIN_PATH_MAX + 16];
    struct stat st;
    snprintf(link, sizeof(link), "%s/%s", path, FSDP_CKPT_LATEST);
    if (latest && lstat(link, &st) != 0) { /* a dangling latest is an error, below */
        cad_warn_no_latest(c, r, path);
        return 0;
    }
    const double t_load = fsdp_now();
    if (lstat(link, &st) == 0 && S_ISLNK(st.st_mode) && stat(link, &st) != 0) {
        rc = cad_latest_missing(path, link);
    } else { /* each rank checks and opens the shards it reads, not all of them */
        rc = fsdp_ckpt_damage_hint(path, fsdp_ckpt_open_lazy(path, fsdp_arch_registered(), &ck));
    }
    if (rc == 0) {
        rc = cad_check_model(r, ck);
    }
    /* every rank opened it before any goes into the collectives below */
    FSDP_CHECK_GOTO(fsdp_world_outcome(r->world, rc, "open the checkpoint"), rc, out);
    const struct fsdp_ckpt_meta *m = fsdp_ckpt_meta(ck);
    struct fsdp_dataloader_state ds = {m->data_position, m->data_epoch, m->data_n_tokens};
    struct fsdp_uneven_run run = {.world = r->world,
                                  .rank = r->world->rank,
                                  .size = r->world->size,
                                  .train = r->train,
                                  .cfg = r->cfg,
                                  .per_rank_data = r->per_rank_data};
    rc = fsdp_uneven_resume_state(&run, r->uneven, m, &ds);
    if (rc == 0) {
        rc = fsdp_ckpt_damage_hint(path, cad_read_state(r, ck));
    }
    if (rc == 0) {
        rc = fsdp_dataloader_set_state(r->train, &ds);
    }
    FSDP_CHECK_GOTO(fsdp_world_outcome(r->world, rc, "read the checkpoint"), rc, out);
    FSDP_CHECK_GOTO(r->engine->ops->state_changed(r->engine), rc, out);
    /* every rank has its state when the slowest is done */
    FSDP_CHECK_GOTO(fsdp_world_barrier(r->world), rc, out);
    cad_resumed(c, r, ck, fsdp_now() - t_load);
    rc = 0;
out:
    fsdp_ckpt_close(ck);
    return rc;
}
