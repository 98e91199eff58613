/*
 * ckpt_list.c - what fsdpc-ckpt does with a checkpoint root. list: the
 * checkpoints, one line each (step, time, size, ranks, mesh, complete or
 * not, latest), with the leftovers of interrupted saves; each step is
 * opened as --resume would open it (every shard checked), so "complete"
 * means it loads. recover: puts a root back in order after a crash, as the
 * next run would (io/ckpt/ckpt_commit.h). And the hint the other commands give
 * when what they were asked to open is missing because a save was cut short.
 */
#include "config.h"
#include "programs/ckpt_tool.h"
#include "io/ckpt/ckpt.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/util/fileutil.h"
#include "core/error.h"

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LIST_MAX 4096

/* How far list looks into each step. */
enum { LIST_OPEN = 0, LIST_QUICK, LIST_VERIFY };
static const char *const list_checked[] = {
    "checked: every shard of every step opened (present, readable, the same step, shapes, row "
    "ranges, checksums recorded); not checked: the data against its checksums (--verify reads "
    "it, or fsdpc-ckpt verify for one step)",
    "checked: each index.h5 read and its shard files counted; not checked: the shards opened "
    "(without --quick) or the data read (--verify)",
    "checked: every shard of every step opened, and every tensor read back against its "
    "checksums",
};

struct list_entry {
    long step;
    char name[256];
    int tmp; /* a leftover of an interrupted save (.tmp_*) */
};

#define F(field) offsetof(struct fsdp_ckpt_args, field)
static const struct fsdp_opt list_opts[] = {
    {"quick", FSDP_OPT_FLAG, F(quick), 0, 0, 0, NULL, "", 0,
     "read each step's index.h5 only and count its shard files, without opening them (every "
     "shard costs an HDF5 open)",
     'q'},
    {"verify", FSDP_OPT_FLAG, F(verify), 0, 0, 0, NULL, "", 0,
     "also read every tensor of every step against its checksums (as fsdpc-ckpt verify does; "
     "reads every byte)",
     'v'},
};
#undef F
static const struct fsdp_cli_cmd list_cmd = {
    "[--quick | --verify] DIR",
    "Lists the checkpoints of a checkpoint root (the --ckpt-dir of a run): for each\n"
    "step directory its step, when its index was written, its size, the ranks and\n"
    "mesh that wrote it, whether it is complete (opens as --resume would open it)\n"
    "and which one 'latest' names; then any leftovers of interrupted saves, which\n"
    "the next run with this --ckpt-dir removes. The last line says what was\n"
    "checked and what was not: opening does not read the data, so a damaged byte\n"
    "shows only with --verify.",
    list_opts, sizeof(list_opts) / sizeof(list_opts[0])};

static int list_cmp(const void *a, const void *b)
{
    const struct list_entry *x = a, *y = b;
    if (x->tmp != y->tmp) {
        return x->tmp - y->tmp;
    }
    return x->step < y->step ? -1 : x->step > y->step ? 1 : strcmp(x->name, y->name);
}

/* Where list_scan's entries go: out, *n of them so far. */
struct list_acc {
    struct list_entry *out;
    size_t *n;
};

static int list_add(const char *name, long step, void *arg)
{
    struct list_acc *a = arg;
    struct list_entry *x = &a->out[(*a->n)++];
    x->step = step;
    x->tmp = step < 0;
    snprintf(x->name, sizeof(x->name), "%s", name);
    return *a->n == LIST_MAX;
}

/* The entries of root: step directories and .tmp_* leftovers. */
static int list_scan(const char *root, struct list_entry *out, size_t *n)
{
    struct list_acc a = {out, n};
    *n = 0;
    int rc = fsdp_ckpt_step_scan(root, 1, list_add, &a);
    if (rc < 0) {
        return rc;
    }
    qsort(out, *n, sizeof(*out), list_cmp);
    return 0;
}

/* quick: the index's word and the shard files present. */
static void list_quick(const char *dir, char *ranks, char *mesh, char *state, size_t len)
{
    struct fsdp_ckpt_meta m;
    if (fsdp_ckpt_read_meta(dir, fsdp_arch_registered(), &m) < 0) {
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        fsdp_err_clear();
        snprintf(state, len, "INCOMPLETE: %s", msg);
        return;
    }
    int present = 0;
    for (int r = 0; r < m.n_shards; r++) {
        char shard[8300];
        snprintf(shard, sizeof(shard), "%s/shard_%d.h5", dir, r);
        present += access(shard, R_OK) == 0;
    }
    snprintf(ranks, 16, "%d", m.world_size);
    snprintf(mesh, 128, "%s", m.mesh);
    if (present == m.n_shards) {
        snprintf(state, len, "index and %d shard files present (not opened: --quick)", present);
    } else {
        snprintf(state, len, "INCOMPLETE: %d of %d shard files present", present, m.n_shards);
    }
}

/* One step directory's line. */
static void list_step(const char *root, const struct list_entry *en, const char *latest,
                      int mode)
{
    char dir[8192], when[32] = "-", size[32], state[600];
    time_t newest;
    snprintf(dir, sizeof(dir), "%s/%s", root, en->name);
    fsdp_ckpt_tool_bytes(size, sizeof(size), fsdp_file_dir_bytes(dir, &newest), 1);
    if (newest) {
        struct tm tm;
        localtime_r(&newest, &tm);
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    }
    struct fsdp_ckpt *ck = NULL;
    char ranks[16] = "-", mesh[128] = "-";
    if (mode == LIST_QUICK) {
        list_quick(dir, ranks, mesh, state, sizeof(state));
    } else if (fsdp_ckpt_open(dir, fsdp_arch_registered(), &ck) == 0) {
        const struct fsdp_ckpt_meta *m = fsdp_ckpt_meta(ck);
        snprintf(ranks, sizeof(ranks), "%d", m->world_size);
        snprintf(mesh, sizeof(mesh), "%s", m->mesh);
        snprintf(state, sizeof(state), mode == LIST_VERIFY ? "complete, data verified"
                                                            : "complete (data not read)");
        fsdp_ckpt_close(ck);
        if (mode == LIST_VERIFY && fsdp_ckpt_verify_data(dir, fsdp_arch_registered()) < 0) {
            char msg[512];
            fsdp_err_take(msg, sizeof(msg));
            fsdp_err_clear();
            snprintf(state, sizeof(state), "DAMAGED: %s", msg);
        }
    } else {
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        fsdp_err_clear();
        snprintf(state, sizeof(state), "INCOMPLETE: %s", msg);
    }
    printf("%8ld  %-19s  %10s  %5s  %-12s  %s%s\n", en->step, when, size, ranks, mesh, state,
           strcmp(en->name, latest) == 0 ? ", latest" : "");
}

/* The one checkpoint root a command takes (cmd: its flags and help, a:
 * what they set); NULL after --help. */
static const char *root_arg(const struct fsdp_cli_cmd *cmd, struct fsdp_ckpt_args *a, int argc,
                            char **argv)
{
    const char *root;
    if (fsdp_ckpt_tool_parse(cmd, a, argc, argv, &root) == 1) {
        return NULL;
    }
    if (!root) {
        fsdp_fatal("fsdpc-ckpt %s: expected one checkpoint root, got %d (see --help)", argv[0],
                   a->n_operands);
    }
    return root;
}

int fsdp_ckpt_cmd_list(int argc, char **argv)
{
    struct fsdp_ckpt_args a = {0};
    const char *root = root_arg(&list_cmd, &a, argc, argv);
    if (!root) {
        return 0;
    }
    int mode = a.verify ? LIST_VERIFY : a.quick ? LIST_QUICK : LIST_OPEN;
    struct stat st;
    if (stat(root, &st) != 0) {
        fsdp_fatal("fsdpc-ckpt list: %s: %s", root, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) {
        fsdp_fatal("fsdpc-ckpt list: %s: not a directory (list takes a checkpoint root, the "
                   "--ckpt-dir of a run)", root);
    }
    char index[8192];
    snprintf(index, sizeof(index), "%s/%s", root, FSDP_CKPT_INDEX);
    if (access(index, F_OK) == 0) {
        fsdp_fatal("fsdpc-ckpt list: %s is a step directory; list takes the checkpoint root "
                   "above it ('fsdpc-ckpt inspect %s' shows this one)", root, root);
    }
    struct list_entry *en = calloc(LIST_MAX, sizeof(*en));
    size_t n;
    if (!en) {
        fsdp_fatal("fsdpc-ckpt list: out of memory");
    }
    int rc = list_scan(root, en, &n);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-ckpt list", NULL);
    }
    char link[8192], latest[256] = "";
    snprintf(link, sizeof(link), "%s/%s", root, FSDP_CKPT_LATEST);
    ssize_t k = readlink(link, latest, sizeof(latest) - 1);
    latest[k > 0 ? k : 0] = '\0';
    size_t steps = 0;
    for (size_t i = 0; i < n; i++) {
        steps += !en[i].tmp;
    }
    printf("%s: %zu checkpoint%s", root, steps, steps == 1 ? "" : "s");
    if (latest[0]) {
        struct stat lt;
        printf(", latest -> %s%s", latest, stat(link, &lt) != 0 ? " (MISSING)" : "");
    } else {
        printf(", no latest");
    }
    printf("\n");
    if (steps > 0) {
        printf("%8s  %-19s  %10s  %5s  %-12s  %s\n", "step", "written", "size", "ranks", "mesh",
               "state");
    }
    for (size_t i = 0; i < n; i++) {
        if (!en[i].tmp) {
            list_step(root, &en[i], latest, mode);
        }
    }
    for (size_t i = 0; i < n; i++) {
        long s = en[i].tmp ? fsdp_ckpt_commit_aside_step(en[i].name) : -1;
        char step[8192];
        snprintf(step, sizeof(step), "%s/step_%ld", root, s);
        if (s >= 0 && access(step, F_OK) != 0) {
            printf("leftover  %s: the only copy of step_%ld, which an interrupted save moved "
                   "aside; 'fsdpc-ckpt recover %s' (or the next run with this --ckpt-dir) "
                   "puts it back\n", en[i].name, s, root);
        } else if (en[i].tmp) {
            printf("leftover  %s (an interrupted save; 'fsdpc-ckpt recover %s' or the next run "
                   "with this --ckpt-dir removes it)\n", en[i].name, root);
        }
    }
    if (steps > 0) {
        printf("%s\n", list_checked[mode]);
    }
    free(en);
    return 0;
}

// ----------------------------------------------------------------------------
// recover

static const struct fsdp_cli_cmd recover_cmd = {
    "DIR",
    "Puts a checkpoint root (the --ckpt-dir of a run) back in order after a crash,\n"
    "as the next run with that --ckpt-dir would: a step that an interrupted save\n"
    "moved aside is renamed back, other leftovers of interrupted saves are removed.\n"
    "Complete checkpoints are never touched. Says what it did.",
    NULL, 0};

/* path as a root to scan: a directory (0), else -1. */
static int recover_root_of(const char *path, char *root, size_t len)
{
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        return -1; /* a missing step directory: its parent may hold its aside copy */
    }
    snprintf(root, len, "%s", path);
    return 0;
}

/* The path itself (a root whose latest is missing), then its parent (the
 * root of a missing step directory). */
void fsdp_ckpt_tool_recovery_hint(const char *path)
{
    char root[8192], parent[8192];
    struct fsdp_ckpt_recovery rep;
    snprintf(parent, sizeof(parent), "%s", path);
    char *slash = strrchr(parent, '/');
    while (slash && slash > parent && slash[1] == '\0') { /* "ck/step_8/" */
        *slash = '\0';
        slash = strrchr(parent, '/');
    }
    if (slash) {
        *slash = '\0';
    } else {
        snprintf(parent, sizeof(parent), ".");
    }
    const char *tries[2] = {path, parent};
    for (int i = 0; i < 2; i++) {
        if (recover_root_of(tries[i], root, sizeof(root)) < 0) {
            continue;
        }
        /* the caller's error stays the one recorded: a failing scan adds none */
        if (fsdp_ckpt_commit_scan(root, &rep) == 0 && rep.n_restored > 0) {
            fsdp_err_hint("an interrupted save moved step_%ld of %s aside: 'fsdpc-ckpt recover "
                          "%s' (or the next run with that --ckpt-dir) puts it back",
                          rep.restored[0], root, root);
            return;
        }
    }
}

int fsdp_ckpt_cmd_recover(int argc, char **argv)
{
    struct fsdp_ckpt_args a = {0};
    const char *root = root_arg(&recover_cmd, &a, argc, argv);
    if (!root) {
        return 0;
    }
    struct stat st;
    char index[8192];
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fsdp_fatal("fsdpc-ckpt recover: %s: %s", root,
                   errno ? strerror(errno) : "not a directory");
    }
    snprintf(index, sizeof(index), "%s/%s", root, FSDP_CKPT_INDEX);
    if (access(index, F_OK) == 0) {
        fsdp_fatal("fsdpc-ckpt recover: %s is a step directory; recover takes the checkpoint "
                   "root above it", root);
    }
    struct fsdp_ckpt_recovery rep;
    int rc = fsdp_ckpt_commit_recover(root, &rep);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-ckpt recover", NULL);
    }
    for (int i = 0; i < rep.n_restored && i < 8; i++) {
        printf("%s: step_%ld put back from the copy an interrupted save moved aside\n", root,
               rep.restored[i]);
    }
    if (rep.n_removed > 0) {
        printf("%s: %d leftover%s of interrupted saves removed\n", root, rep.n_removed,
               rep.n_removed > 1 ? "s" : "");
    }
    if (rep.n_restored == 0 && rep.n_removed == 0) {
        printf("%s: nothing to recover\n", root);
    }
    if (rep.latest_missing) {
        printf("%s: latest names %s, which does not exist; the next run's first save moves "
               "it\n", root, rep.latest_target);
        return 1;
    }
    return 0;
}
