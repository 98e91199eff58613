/*
 * ckpt_tool.c - fsdpc-ckpt's checkpoint subcommands: inspect (for
 * checkpoints), verify, consolidate, reshard and convert. Every command
 * streams tensor by tensor through buffers sized by the largest tensor (or
 * shard piece), prints one progress line on stderr while it works, and
 * writes its output under a temporary name beside it that the io layer
 * commits (fsync, rename, fsync of the directory: fsdp_file_commit for a
 * file, fsdp_ckpt_commit_dir for a step directory) only when complete.
 * Errors end the program with one line (fsdp_die/fatal).
 */
#include "config.h"
#include "programs/ckpt_tool.h"
#include "comm/mesh_spec.h"
#include "io/ckpt/ckpt.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/util/fileutil.h"
#include "io/h5/model_file.h"
#include "core/error.h"
#include "core/util.h"

#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fsdp_ckpt_tool_parse(const struct fsdp_cli_cmd *cmd, struct fsdp_ckpt_args *a, int argc,
                         char **argv, const char **in)
{
    struct fsdp_optset set;
    if (fsdp_cli_command("fsdpc-ckpt", cmd, a, argc, argv, &set) == 1) {
        return 1;
    }
    *in = set.n_operands == 1 ? set.operand[0] : NULL;
    a->n_operands = set.n_operands;
    return 0;
}

int fsdp_ckpt_tool_parse_io(const struct fsdp_cli_cmd *cmd, struct fsdp_ckpt_args *a, int argc,
                            char **argv, const char **in, const char *input, const char *output)
{
    if (fsdp_ckpt_tool_parse(cmd, a, argc, argv, in) == 1) {
        return 1;
    }
    if (!*in || !a->out[0]) {
        fsdp_fatal("fsdpc-ckpt %s: expected one %s and -o %s (see --help)", argv[0], input, output);
    }
    return 0;
}

#define F(field) offsetof(struct fsdp_ckpt_args, field)
#define S(field) sizeof(((struct fsdp_ckpt_args *)0)->field)
#define N_OPTS(t) (sizeof(t) / sizeof(t[0]))

void fsdp_ckpt_tool_bytes(char *buf, size_t len, double b, int decimals)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) {
        b /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.*f %s", u ? decimals : 0, b, unit[u]);
}

static void tool_progress(size_t done, size_t total, void *arg)
{
    const char *what = arg;
    if (isatty(STDERR_FILENO) || done == total) {
        fprintf(stderr, "\r%s: %zu/%zu tensors", what, done, total);
        if (done == total) {
            fprintf(stderr, "\n");
        }
        fflush(stderr);
    }
}

static struct fsdp_ckpt *tool_open(const char *cmd, const char *path)
{
    struct fsdp_ckpt *ck;
    char what[64];
    int rc = fsdp_ckpt_open(path, fsdp_arch_registered(), &ck);
    if (rc < 0) {
        snprintf(what, sizeof(what), "fsdpc-ckpt %s", cmd);
        fsdp_ckpt_tool_recovery_hint(path);
        fsdp_die(rc, what, NULL);
    }
    return ck;
}

const struct fsdp_model_spec *fsdp_ckpt_source_open(const char *what, const char *path,
                                                    struct fsdp_ckpt_source *src)
{
    int rc;
    *src = (struct fsdp_ckpt_source){0};
    if (fsdp_ckpt_is_checkpoint(path)) {
        if ((rc = fsdp_ckpt_open(path, fsdp_arch_registered(), &src->ck)) < 0) {
            fsdp_die(rc, what, NULL);
        }
        return fsdp_ckpt_spec(src->ck);
    }
    if ((rc = fsdp_model_file_open(path, fsdp_arch_registered(), &src->mf)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    return fsdp_model_file_spec(src->mf);
}

int fsdp_ckpt_source_read(const struct fsdp_ckpt_source *src, size_t i,
                          const struct fsdp_param_spec *p, float *dst)
{
    return src->ck ? fsdp_ckpt_read_rows(src->ck, FSDP_CKPT_MODEL, i, 0, p->shape[0], dst)
                   : fsdp_model_file_read_block(src->mf, i, 0, p->shape[0], 0, p->shape[1], dst);
}

void fsdp_ckpt_source_close(struct fsdp_ckpt_source *src)
{
    fsdp_ckpt_close(src->ck);
    fsdp_model_file_close(src->mf);
    *src = (struct fsdp_ckpt_source){0};
}

static void tool_shape(char *buf, size_t len, const struct fsdp_param_spec *p)
{
    if (p->ndim == 1) {
        snprintf(buf, len, "(%zu,)", p->shape[0]);
    } else {
        snprintf(buf, len, "(%zu, %zu)", p->shape[0], p->shape[1]);
    }
}

// ----------------------------------------------------------------------------
// inspect

void fsdp_ckpt_tool_print_tokens(const struct fsdp_model_spec *s)
{
    if (s->eos_token_id >= 0 || s->bos_token_id >= 0) {
        printf("tokens        bos_token_id %ld, eos_token_id %ld (-1: unknown)\n", s->bos_token_id,
               s->eos_token_id);
    } else {
        printf("tokens        no bos_token_id or eos_token_id (export-hf warns; its --tokenizer "
               "or --eos-token-id sets them)\n");
    }
}

int fsdp_ckpt_tool_inspect(const char *path)
{
    struct fsdp_ckpt *ck = tool_open("inspect", path);
    const struct fsdp_ckpt_meta *m = fsdp_ckpt_meta(ck);
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(ck);
    char attrs[512];
    fsdp_attrs_format(s->arch, s->cfg, attrs, sizeof(attrs));
    printf("checkpoint    %s\n", fsdp_ckpt_dir(ck));
    printf("format        %s version %d\n", FSDP_CKPT_FORMAT, FSDP_CKPT_VERSION);
    if (m->created_by[0]) {
        printf("created by    %s\n", m->created_by);
    }
    printf("step          %ld (%.0f tokens seen)\n", m->step, m->tokens_seen);
    printf("written by    %d rank%s, mesh %s, backends %s, %d shard file%s\n", m->world_size,
           m->world_size > 1 ? "s" : "", m->mesh, m->backends, m->n_shards,
           m->n_shards > 1 ? "s" : "");
    printf("data loader   position %llu, epoch %llu, file of %llu tokens\n",
           (unsigned long long)m->data_position, (unsigned long long)m->data_epoch,
           (unsigned long long)m->data_n_tokens);
    printf("optimizer     AdamW step %ld | loss scale %g (%ld good steps, %ld skipped)\n",
           m->adam_step, m->loss_scale, m->scale_good_steps, m->skipped_steps);
    printf("architecture  %s: %s\n", s->arch->name, attrs);
    fsdp_ckpt_tool_print_tokens(s);
    const int n_kinds = fsdp_ckpt_kinds(ck)->n;
    size_t summed = 0, all = (size_t)n_kinds * s->n_params;
    for (int k = 0; k < n_kinds; k++) {
        for (size_t i = 0; i < s->n_params; i++) {
            summed += fsdp_ckpt_checksum_blocks(ck, k, i) > 0;
        }
    }
    if (summed == all) {
        printf("checksums     xxh3_64 per block, recorded for all %zu tensors and matched by every "
               "shard's (fsdpc-ckpt verify reads the data and checks it)\n", all);
    } else {
        printf("checksums     recorded for %zu of %zu tensors (%s)\n", summed, all,
               summed ? "the others are read unchecked"
                      : "a checkpoint from an fsdpc without them: read unchecked");
    }
    printf("attributes    %s\n", m->attrs_summed
           ? "run state and architecture covered by xxh3_64_attrs, all matched"
           : "no checksums recorded (a checkpoint from an fsdpc without them: read unchecked)");
    printf("\nconfig:\n");
    for (const char *line = m->config; *line;) {
        const char *nl = strchr(line, '\n');
        int n = nl ? (int)(nl - line) : (int)strlen(line);
        printf("  %.*s\n", n, line);
        line += n + (nl != NULL);
    }
    printf("\n%-28s %-14s %-6s %s\n", "tensor", "shape", "dtype", "rows per shard");
    for (size_t i = 0; i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        char shape[48];
        size_t r0, lo, hi;
        tool_shape(shape, sizeof(shape), p);
        fsdp_ckpt_rows(p->shape[0], m->n_shards, m->n_shards - 1, &r0, &lo);
        fsdp_ckpt_rows(p->shape[0], m->n_shards, 0, &r0, &hi);
        if (lo == hi) {
            printf("%-28s %-14s %-6s %zu\n", p->name, shape, "f32", lo);
        } else {
            printf("%-28s %-14s %-6s %zu..%zu\n", p->name, shape, "f32", lo, hi);
        }
    }
    double b = (double)s->total_numel * 4.0;
    char kinds[256] = "weights";
    for (int k = 1; k < n_kinds; k++) { /* "weights, exp_avg, exp_avg_sq" */
        size_t o = strlen(kinds);
        snprintf(kinds + o, sizeof(kinds) - o, ", %s",
                 fsdp_ckpt_kind_group(fsdp_ckpt_kinds(ck), k) + strlen("optim/"));
    }
    printf("\ntotal         %zu tensors x %d (%s), %zu parameters, "
           "%.0f bytes of weights + %.0f bytes of optimizer state\n",
           s->n_params, n_kinds, kinds, s->total_numel, b, (double)(n_kinds - 1) * b);
    fsdp_ckpt_close(ck);
    return 0;
}

// ----------------------------------------------------------------------------
// verify

static const struct fsdp_opt verify_opts[] = {
    {"scan-nan", FSDP_OPT_FLAG, F(scan_nan), 0, 0, 0, NULL, "", 0,
     "also fail on any NaN or infinity in weights or moments", 0},
    {"quiet", FSDP_OPT_FLAG, F(quiet), 0, 0, 0, NULL, "", 0, "print failures and the summary only",
     'q'},
};
static const struct fsdp_cli_cmd verify_cmd = {
    "PATH [--scan-nan] [--quiet]",
    "Checks a checkpoint (a step directory, its index.h5, or a checkpoint root\n"
    "whose 'latest' is followed): index attributes, every shard file present,\n"
    "readable, of the same step and with the expected rows, every shard's\n"
    "checksums those the index recorded (a shard of another run is refused),\n"
    "every virtual source of index.h5 present, and every tensor read in full\n"
    "and checked against its checksums (xxh3_64). Prints each tensor's status\n"
    "(ok, FAILED, or unchecked when the checkpoint recorded no checksum) and\n"
    "goes on past a failed tensor; exit status 0 only when all of it holds.",
    verify_opts, N_OPTS(verify_opts)};

/* What reading one tensor through its checksums gave. */
enum verify_status { VERIFY_OK, VERIFY_UNCHECKED, VERIFY_FAILED };

struct verify_run {
    struct fsdp_ckpt *ck;
    float *buf; /* (largest,) one shard's rows of a tensor */
    int scan, quiet;
    enum verify_status *st; /* (kinds * n_params,) */
    char (*why)[1024];      /* (kinds * n_params,) each failed tensor's first failure */
    size_t failed;
    char first[1024]; /* the first failure's message */
};

/* Shard r's rows of tensor j = (k, i); a failure is kept for its table row. */
static void verify_piece(struct verify_run *v, int r, size_t j)
{
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(v->ck);
    const int k = (int)(j / s->n_params);
    const struct fsdp_param_spec *p = &s->params[j % s->n_params];
    size_t row0, rows;
    fsdp_ckpt_rows(p->shape[0], fsdp_ckpt_meta(v->ck)->n_shards, r, &row0, &rows);
    if (rows == 0 || v->st[j] == VERIFY_FAILED) {
        return;
    }
    if (fsdp_ckpt_read_rows(v->ck, k, j % s->n_params, row0, rows, v->buf) < 0) {
        fsdp_err_take(v->why[j], sizeof(v->why[j]));
        if (v->failed++ == 0) {
            snprintf(v->first, sizeof(v->first), "%s", v->why[j]);
        }
        v->st[j] = VERIFY_FAILED;
        return;
    }
    size_t n = rows * p->shape[1];
    for (size_t e = 0; v->scan && e < n; e++) {
        if (!isfinite(v->buf[e])) {
            fsdp_fatal("fsdpc-ckpt verify: %s: /%s/%s holds %g at element %zu",
                       fsdp_ckpt_dir(v->ck), fsdp_ckpt_kind_group(fsdp_ckpt_kinds(v->ck), k),
                       p->name, (double)v->buf[e], row0 * p->shape[1] + e);
        }
    }
}

/* One row of the table, a column per kind: "%-*s %-10s ... %s". */
static void verify_row(int width, const char *first, const char *const *cols, int n)
{
    printf("%-*s", width, first);
    for (int k = 0; k < n; k++) {
        printf(k + 1 < n ? " %-10s" : " %s", cols[k]);
    }
    printf("\n");
}

/* One row of the table: a parameter's tensors (the model, then each of the
 * optimizer's states), then what failed. */
static void verify_param(struct verify_run *v, size_t i, int width)
{
    static const char *const word[] = {"ok", "unchecked", "FAILED"};
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(v->ck);
    const struct fsdp_ckpt_kinds *kinds = fsdp_ckpt_kinds(v->ck);
    const char *cols[1 + FSDP_CKPT_MAX_STATE];
    int bad = 0;
    for (int k = 0; k < kinds->n; k++) {
        cols[k] = word[v->st[k * s->n_params + i]];
        bad |= v->st[k * s->n_params + i] == VERIFY_FAILED;
    }
    if (!v->quiet || bad) {
        verify_row(width, s->params[i].name, cols, kinds->n);
    }
    for (int k = 0; k < kinds->n; k++) {
        if (v->st[k * s->n_params + i] == VERIFY_FAILED) {
            printf("  %s/%s: %s\n", fsdp_ckpt_kind_group(kinds, k), s->params[i].name,
                   v->why[k * s->n_params + i]);
        }
    }
}

/* Every shard's rows of every tensor, one shard file after another (each
 * read front to back, then left), then the table. */
static void verify_all(struct verify_run *v)
{
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(v->ck);
    const struct fsdp_ckpt_kinds *kinds = fsdp_ckpt_kinds(v->ck);
    const int R = fsdp_ckpt_meta(v->ck)->n_shards;
    const size_t n = (size_t)kinds->n * s->n_params;
    for (size_t j = 0; j < n; j++) {
        v->st[j] = fsdp_ckpt_checksum_blocks(v->ck, (int)(j / s->n_params), j % s->n_params)
                       ? VERIFY_OK
                       : VERIFY_UNCHECKED;
    }
    for (int r = 0; r < R; r++) {
        for (size_t j = 0; j < n; j++) {
            verify_piece(v, r, j);
        }
        if (v->quiet) {
            tool_progress(((size_t)r + 1) * n, (size_t)R * n, "verify (tensor pieces)");
        }
    }
    int width = 6;
    for (size_t i = 0; i < s->n_params; i++) {
        int w = (int)strlen(s->params[i].name);
        width = w > width ? w : width;
    }
    if (!v->quiet) { /* model, then the optimizer's state names */
        const char *heads[1 + FSDP_CKPT_MAX_STATE];
        for (int k = 0; k < kinds->n; k++) {
            const char *g = fsdp_ckpt_kind_group(kinds, k), *slash = strchr(g, '/');
            heads[k] = slash ? slash + 1 : g;
        }
        verify_row(width, "tensor", heads, kinds->n);
    }
    for (size_t i = 0; i < s->n_params; i++) {
        verify_param(v, i, width);
    }
    fflush(stdout);
}

int fsdp_ckpt_cmd_verify(int argc, char **argv)
{
    struct fsdp_ckpt_args a = {0};
    struct verify_run v = {0};
    const char *in;
    if (fsdp_ckpt_tool_parse(&verify_cmd, &a, argc, argv, &in) == 1) {
        return 0;
    }
    if (!in) {
        fsdp_fatal("fsdpc-ckpt verify: expected one checkpoint path, got %d (see --help)",
                   a.n_operands);
    }
    v.scan = a.scan_nan;
    v.quiet = a.quiet;
    /* opening checks the index's virtual datasets and every shard they map */
    v.ck = tool_open("verify", in);
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(v.ck);
    const struct fsdp_ckpt_meta *m = fsdp_ckpt_meta(v.ck);
    const struct fsdp_ckpt_kinds *kinds = fsdp_ckpt_kinds(v.ck);
    const size_t total = (size_t)kinds->n * s->n_params;
    v.buf = fsdp_alloc(fsdp_model_spec_largest(s) * sizeof(float));
    v.st = calloc(total, sizeof(*v.st));
    v.why = calloc(total, sizeof(*v.why));
    if (!v.buf || !v.st || !v.why) {
        fsdp_fatal("fsdpc-ckpt verify: out of memory for one tensor");
    }
    verify_all(&v);
    if (v.failed) {
        fsdp_fatal("fsdpc-ckpt verify: %s: %zu of %zu tensors failed; the first: %s",
                   fsdp_ckpt_dir(v.ck), v.failed, total, v.first);
    }
    size_t checked = 0;
    for (size_t j = 0; j < total; j++) {
        checked += v.st[j] == VERIFY_OK;
    }
    char sums[96];
    if (checked == total) {
        snprintf(sums, sizeof(sums), "all matched their checksums (xxh3_64)");
    } else {
        snprintf(sums, sizeof(sums), "%zu matched their checksums, %zu have none recorded", checked,
                 total - checked);
    }
    printf("ok: %s: step %ld, %d shard%s, %zu tensors x %d readable, %s, %s%s\n",
           fsdp_ckpt_dir(v.ck), m->step, m->n_shards, m->n_shards > 1 ? "s" : "", s->n_params,
           kinds->n, sums,
           m->attrs_summed ? "attributes matched theirs" : "attributes have none recorded",
           v.scan ? ", all finite" : "");
    free(v.why);
    free(v.st);
    fsdp_free(v.buf);
    fsdp_ckpt_close(v.ck);
    return 0;
}

// ----------------------------------------------------------------------------
// consolidate

static const struct fsdp_opt consolidate_opts[] = {
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "FILE", 0, "the model file to write", 'o'},
    {"with-optimizer", FSDP_OPT_FLAG, F(with_optimizer), 0, 0, 0, NULL, "", 0,
     "also write /optim/exp_avg and /optim/exp_avg_sq", 0},
};
static const struct fsdp_cli_cmd consolidate_cmd = {
    "PATH -o MODEL.h5 [--with-optimizer]",
    "Writes a checkpoint's full tensors into one model file (f32), tensor by tensor:\n"
    "memory is about one tensor's worth. The file is written under a fresh\n"
    "temporary name beside it (MODEL.h5.tmp.XXXXXX) and renamed when complete.",
    consolidate_opts, N_OPTS(consolidate_opts)};

int fsdp_ckpt_cmd_consolidate(int argc, char **argv)
{
    struct fsdp_ckpt_args a = {0};
    const char *in, *out = a.out;
    int rc, with;
    if (fsdp_ckpt_tool_parse(&consolidate_cmd, &a, argc, argv, &in) == 1) {
        return 0;
    }
    if (!in || !out[0]) {
        fsdp_fatal("fsdpc-ckpt consolidate: expected one checkpoint path and -o FILE (see --help)");
    }
    with = a.with_optimizer;
    struct fsdp_ckpt *ck = tool_open("consolidate", in);
    if ((rc = fsdp_ckpt_consolidate(ck, out, with, tool_progress, "consolidate")) < 0) {
        fsdp_die(rc, "fsdpc-ckpt consolidate", NULL);
    }
    printf("%s: step %ld consolidated into %s%s\n", fsdp_ckpt_dir(ck), fsdp_ckpt_meta(ck)->step,
           out, with ? " (with optimizer state)" : "");
    fsdp_ckpt_close(ck);
    return 0;
}

// ----------------------------------------------------------------------------
// reshard

static const struct fsdp_opt reshard_opts[] = {
    {"world-size", FSDP_OPT_INT, F(world_size), 0, 1, 65536, NULL, "N", 0,
     "shard over N ranks (mesh dp=N)", 0},
    {"mesh", FSDP_OPT_STR, F(mesh), S(mesh), 0, 0, NULL, "SPEC", 0,
     "dp=N or rdp=R,dp=N (N shards, R x N ranks), either with tp=T (N x T shards: a "
     "tensor-parallel run's checkpoint is one of a data-parallel run of N x T ranks)",
     0},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "DIR", 0, "the new step directory", 'o'},
};
static const struct fsdp_cli_cmd reshard_cmd = {
    "PATH (--world-size N | --mesh SPEC) -o OUTDIR",
    "Rewrites a checkpoint for another world size or mesh, offline (no MPI):\n"
    "OUTDIR gets one shard file per shard rank and an index.h5, with the same\n"
    "step, data cursor and optimizer state. Each output shard is streamed tensor\n"
    "by tensor. OUTDIR must not exist; it appears only when complete.",
    reshard_opts, N_OPTS(reshard_opts)};

/* "dp=4" or "rdp=2,dp=2" (in either order), with "tp=T" or without, read by
 * the mesh parser every program shares: shards (dp x tp) and world size,
 * the normalized spec in dims; 0 on success. */
static int reshard_parse_mesh(const char *spec, struct fsdp_mesh_dims *dims, int *shards,
                              int *world)
{
    if (fsdp_mesh_parse(spec, dims) < 0) {
        fsdp_err_clear(); /* the caller's message says what reshard takes */
        return -1;
    }
    int dp = 0, tp = 0;
    for (int i = 0; i < dims->ndims; i++) {
        if (strcmp(dims->name[i], "dp") == 0) {
            dp = dims->size[i];
        } else if (strcmp(dims->name[i], "tp") == 0) {
            tp = dims->size[i];
        } else if (strcmp(dims->name[i], "rdp") != 0) {
            return -1; /* a dimension that does not shard or replicate */
        }
    }
    *shards = dp || tp ? (dp ? dp : 1) * (tp ? tp : 1) : 0;
    if (dims->nranks > 65536) {
        return -1; /* more ranks than any mesh fsdpc builds */
    }
    *world = (int)dims->nranks;
    return *shards > 0 ? 0 : -1;
}

static int reshard_write(struct fsdp_ckpt *ck, const char *dir, int shards, float *buf,
                         size_t *done, size_t total)
{
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(ck);
    const struct fsdp_ckpt_meta *m = fsdp_ckpt_meta(ck);
    for (int r = 0; r < shards; r++) {
        struct fsdp_ckpt_shard_writer *w;
        int rc;
        FSDP_CHECK(fsdp_ckpt_shard_create(dir, r, shards, m->step, s, fsdp_ckpt_kinds(ck), &w));
        for (int k = 0; k < fsdp_ckpt_kinds(ck)->n; k++) {
            for (size_t i = 0; i < s->n_params; i++) {
                size_t row0, rows;
                fsdp_ckpt_rows(s->params[i].shape[0], shards, r, &row0, &rows);
                rc = fsdp_ckpt_read_rows(ck, k, i, row0, rows, buf);
                if (rc == 0) {
                    rc = fsdp_ckpt_shard_put(w, k, i, buf);
                }
                if (rc < 0) {
                    fsdp_ckpt_shard_destroy(w);
                    return rc;
                }
                tool_progress(++*done, total, "reshard");
            }
        }
        rc = fsdp_ckpt_shard_commit(w);
        fsdp_ckpt_shard_destroy(w);
        FSDP_CHECK(rc);
    }
    return 0;
}

/* The step directory out, written from ck for the mesh dims (shards files
 * for world ranks) through a temporary directory; its new metadata in *m. */
static int reshard_commit(struct fsdp_ckpt *ck, const struct fsdp_mesh_dims *dims, int shards,
                          int world, const char *out, struct fsdp_ckpt_meta *m)
{
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(ck);
    float *buf = fsdp_alloc(fsdp_model_spec_largest(s) * sizeof(float));
    if (!buf) {
        fsdp_fatal("fsdpc-ckpt reshard: out of memory for one tensor");
    }
    char *tmp;
    FSDP_CHECK(fsdp_file_tmp_mkdir(out, &tmp));
    size_t done = 0, total = (size_t)shards * (size_t)fsdp_ckpt_kinds(ck)->n * s->n_params;
    int rc = reshard_write(ck, tmp, shards, buf, &done, total);
    *m = *fsdp_ckpt_meta(ck);
    m->n_shards = shards;
    m->world_size = world;
    snprintf(m->mesh, sizeof(m->mesh), "%s", dims->spec);
    /* a normalized spec is at most 4 x "name15=16777216" with commas: 99 characters */
    snprintf(m->created_by, sizeof(m->created_by), "fsdpc-ckpt reshard to %.99s", dims->spec);
    if (rc == 0) {
        rc = fsdp_ckpt_index_write(tmp, s, fsdp_ckpt_kinds(ck), m);
    }
    if (rc == 0) {
        rc = fsdp_ckpt_commit_dir(tmp, out);
    }
    if (rc < 0) {
        fsdp_file_rmtree(tmp); /* a failure here leaves the recorded cause in place */
    }
    free(tmp);
    fsdp_free(buf);
    return rc;
}

int fsdp_ckpt_cmd_reshard(int argc, char **argv)
{
    struct fsdp_ckpt_args a = {0};
    struct fsdp_mesh_dims dims;
    const char *in;
    int rc, shards = 0, world = 0;
    if (fsdp_ckpt_tool_parse(&reshard_cmd, &a, argc, argv, &in) == 1) {
        return 0;
    }
    if (!a.mesh[0] && a.world_size > 0) {
        snprintf(a.mesh, sizeof(a.mesh), "dp=%ld", a.world_size);
    }
    if (!in || !a.out[0] || !a.mesh[0]) {
        fsdp_fatal("fsdpc-ckpt reshard: expected one checkpoint path, --world-size N or --mesh "
                   "SPEC, and -o DIR (see --help)");
    }
    if (reshard_parse_mesh(a.mesh, &dims, &shards, &world) < 0) {
        fsdp_fatal("fsdpc-ckpt reshard: --mesh '%s' must be dp=N or rdp=R,dp=N, either with "
                   "tp=T or without (each name once, at most 65536 ranks in all)",
                   a.mesh);
    }
    if (access(a.out, F_OK) == 0) {
        fsdp_fatal("fsdpc-ckpt reshard: %s already exists", a.out);
    }
    struct fsdp_ckpt *ck = tool_open("reshard", in);
    struct fsdp_ckpt_meta m;
    if ((rc = reshard_commit(ck, &dims, shards, world, a.out, &m)) < 0) {
        fsdp_die(rc, "fsdpc-ckpt reshard", NULL);
    }
    printf("%s: step %ld resharded to %s (%d shard%s) in %s\n", fsdp_ckpt_dir(ck), m.step,
           dims.spec, shards, shards > 1 ? "s" : "", a.out);
    fsdp_ckpt_close(ck);
    return 0;
}

// ----------------------------------------------------------------------------
// convert

static const struct fsdp_opt convert_opts[] = {
    {"dtype", FSDP_OPT_DTYPE, F(dtype), 0, 0, 0, "bf16|f16|f32", "T", FSDP_OPT_REQUIRED,
     "the stored dtype", 0},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "F", 0, "the model file to write", 'o'},
};
static const struct fsdp_cli_cmd convert_cmd = {
    "PATH --dtype bf16|f16|f32 -o MODEL.h5",
    "Writes the weights of a model file or a checkpoint as a model file stored in\n"
    "the given dtype (round to nearest even), tensor by tensor.",
    convert_opts, N_OPTS(convert_opts)};

int fsdp_ckpt_cmd_convert(int argc, char **argv)
{
    struct fsdp_ckpt_args a = {.dtype = FSDP_DTYPE_COUNT}; /* none until given */
    const char *in, *out = a.out;
    int rc;
    if (fsdp_ckpt_tool_parse(&convert_cmd, &a, argc, argv, &in) == 1) {
        return 0;
    }
    if (!in || !out[0] || a.dtype == FSDP_DTYPE_COUNT) {
        fsdp_fatal("fsdpc-ckpt convert: expected one input, --dtype T and -o FILE (see --help)");
    }
    enum fsdp_dtype dtype = a.dtype;
    const char *dt = fsdp_dtype_name(dtype);
    struct fsdp_ckpt_source src = {0};
    const struct fsdp_model_spec *s;
    if (fsdp_ckpt_is_checkpoint(in)) {
        src.ck = tool_open("convert", in); /* with the hint of an interrupted save */
        s = fsdp_ckpt_spec(src.ck);
    } else {
        s = fsdp_ckpt_source_open("fsdpc-ckpt convert", in, &src);
    }
    char created_by[256];
    snprintf(created_by, sizeof(created_by), "fsdpc-ckpt convert %s to %s", in, dt);
    struct fsdp_model_write_opts wo = {.created_by = created_by, .dtype = dtype};
    struct fsdp_model_writer *w = NULL;
    float *buf = fsdp_alloc(fsdp_model_spec_largest(s) * sizeof(float));
    if (!buf) {
        fsdp_fatal("fsdpc-ckpt convert: out of memory for one tensor");
    }
    rc = fsdp_model_writer_create(out, s, &wo, &w);
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        rc = fsdp_ckpt_source_read(&src, i, p, buf);
        if (rc == 0) {
            rc = fsdp_model_writer_put(w, i, buf);
        }
        if (rc == 0) {
            tool_progress(i + 1, s->n_params, "convert");
        }
    }
    if (rc == 0) {
        rc = fsdp_model_writer_commit(w);
    }
    fsdp_model_writer_destroy(w);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-ckpt convert", NULL);
    }
    printf("%s: %zu tensors written to %s as %s\n", in, s->n_params, out, dt);
    fsdp_free(buf);
    fsdp_ckpt_source_close(&src);
    return 0;
}
