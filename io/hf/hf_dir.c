/*
 * hf_dir.c - Hugging Face model directories read and written (see
 * hf_dir.h): config.json opened, the single weights file or the index and
 * its shards joined into one tensor table, and the sharded writer with its
 * index and directory commit. Knows no architecture: which tensors and
 * config members a model needs is the caller's.
 */
#include "config.h"
#include "io/hf/hf_dir.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/util/fileutil.h"
#include "core/error.h"
#include "core/util.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_SHOW 96

/* "<dir>/<name>", malloc'd (NULL when out of memory). */
static char *hf_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) {
        snprintf(p, n, "%s/%s", dir, name);
    }
    return p;
}

/* dir without trailing slashes ("out/" and "out" name one directory, and
 * the temporary beside it must not land inside it), malloc'd. */
static char *hf_dir_name(const char *dir)
{
    char *d = strdup(dir);
    size_t n = d ? strlen(d) : 0;
    while (n > 1 && d[n - 1] == '/') {
        d[--n] = '\0';
    }
    return d;
}

// ----------------------------------------------------------------------------
// reading: the index

struct hf_entry {
    const char *name, *file; /* borrowed from the index document */
    size_t fidx;             /* file's place in the list of shards */
};

struct hf_index {
    const char *path;
    struct hf_entry *e;
    size_t n, cap;
    const char **files; /* distinct shard names, in order of first mention */
    size_t n_files, cap_files;
};

static int hf_grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap) {
        return 0;
    }
    size_t c = *cap ? *cap * 2 : 64;
    void *a = realloc(*arr, c * size);
    if (!a) {
        return FSDP_ERR_NOMEM;
    }
    *arr = a;
    *cap = c;
    return 0;
}

/* A shard must be a file of the directory itself: a bare, non-empty name. */
static int hf_plain_name(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int hf_index_add(const char *name, const char *file, void *arg)
{
    struct hf_index *x = arg;
    if (!hf_plain_name(file)) {
        char a[HF_SHOW], b[HF_SHOW];
        return fsdp_err(FSDP_ERR_FORMAT, "%s: weight_map puts '%s' in '%s', which is not a file "
                        "name inside the directory", x->path, fsdp_str_printable(a, sizeof(a), name, 0),
                        fsdp_str_printable(b, sizeof(b), file, 0));
    }
    size_t f = x->n_files;
    if (f > 0 && strcmp(x->files[f - 1], file) == 0) {
        f--; /* consecutive tensors usually share a shard */
    } else {
        for (f = 0; f < x->n_files && strcmp(x->files[f], file) != 0; f++) {
        }
    }
    if (f == x->n_files) {
        if (hf_grow((void **)&x->files, &x->cap_files, f + 1, sizeof(*x->files)) < 0) {
            return fsdp_err(FSDP_ERR_NOMEM, "%s: shard list", x->path);
        }
        x->files[x->n_files++] = file;
    }
    if (hf_grow((void **)&x->e, &x->cap, x->n + 1, sizeof(*x->e)) < 0) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: weight map", x->path);
    }
    x->e[x->n++] = (struct hf_entry){.name = name, .file = file, .fidx = f};
    return 0;
}

/* Opens shard name of the index at path, with a clear line when it is not there. */
static int hf_open_shard(struct fsdp_hf_dir *d, const char *index, const char *name,
                         struct fsdp_safetensors **st)
{
    char show[HF_SHOW];
    struct stat sb;
    char *p = hf_join(d->dir, name);
    if (!p) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: shard path", index);
    }
    int rc = 0;
    if (stat(p, &sb) != 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: shard '%s' named in the index is missing: %s", index,
                      fsdp_str_printable(show, sizeof(show), name, 0), strerror(errno));
    } else {
        rc = fsdp_safetensors_open(p, st);
    }
    free(p);
    return rc;
}

/* The index and every shard it names. */
static int hf_open_index(struct fsdp_hf_dir *d, struct hf_index *x, struct json_t **doc,
                         struct fsdp_json_obj *map)
{
    struct fsdp_json_obj root;
    x->path = d->index_path;
    FSDP_CHECK(fsdp_json_load(d->index_path, FSDP_HF_JSON_MAX, doc, &root));
    int rc = fsdp_json_obj(&root, "weight_map", map);
    if (rc != 0) {
        return rc < 0 ? rc
                      : fsdp_err(FSDP_ERR_FORMAT, "%s: 'weight_map' is missing (an object of "
                                 "tensor name: shard file)", d->index_path);
    }
    FSDP_CHECK(fsdp_json_each_str(map, hf_index_add, x));
    if (x->n == 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: 'weight_map' names no tensor", d->index_path);
    }
    d->files = calloc(x->n_files, sizeof(*d->files));
    if (!d->files) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: shards", d->index_path);
    }
    for (size_t f = 0; f < x->n_files; f++) {
        FSDP_CHECK(hf_open_shard(d, d->index_path, x->files[f], &d->files[f]));
        d->n_files = f + 1;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// reading: the tensor table

static int hf_tensor_cmp(const void *a, const void *b)
{
    return strcmp(((const struct fsdp_hf_tensor *)a)->t->name,
                  ((const struct fsdp_hf_tensor *)b)->t->name);
}

/* Every file's tensors in one table sorted by name; a name in two files
 * is an error (which one would be meant?). */
static int hf_build_table(struct fsdp_hf_dir *d)
{
    size_t n = 0;
    for (size_t f = 0; f < d->n_files; f++) {
        n += d->files[f]->n;
    }
    d->t = malloc((n ? n : 1) * sizeof(*d->t));
    if (!d->t) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: tensor table", d->dir);
    }
    for (size_t f = 0; f < d->n_files; f++) {
        for (size_t k = 0; k < d->files[f]->n; k++) {
            d->t[d->n++] = (struct fsdp_hf_tensor){.t = &d->files[f]->t[k], .file = f};
        }
    }
    qsort(d->t, d->n, sizeof(*d->t), hf_tensor_cmp);
    for (size_t i = 1; i < d->n; i++) {
        if (strcmp(d->t[i - 1].t->name, d->t[i].t->name) == 0) {
            char show[HF_SHOW];
            return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' is in both %s and %s", d->dir,
                            fsdp_str_printable(show, sizeof(show), d->t[i].t->name, 0),
                            d->files[d->t[i - 1].file]->path, d->files[d->t[i].file]->path);
        }
    }
    if (d->n == 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: the weights hold no tensor", d->dir);
    }
    return 0;
}

/* The index and the files agree tensor for tensor. */
static int hf_check_index(const struct fsdp_hf_dir *d, const struct hf_index *x,
                          const struct fsdp_json_obj *map)
{
    char a[HF_SHOW], b[HF_SHOW];
    for (size_t k = 0; k < x->n; k++) {
        long i = fsdp_hf_dir_find(d, x->e[k].name);
        if (i < 0 || d->t[i].file != x->e[k].fidx) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: weight_map puts '%s' in %s, which does not "
                            "hold it%s%s", d->index_path,
                            fsdp_str_printable(a, sizeof(a), x->e[k].name, 0),
                            fsdp_str_printable(b, sizeof(b), x->e[k].file, 0),
                            i < 0 ? "" : "; it is in ", i < 0 ? "" : fsdp_hf_dir_file(d, (size_t)i));
        }
    }
    for (size_t i = 0; i < d->n; i++) {
        if (!json_object_get(map->obj, d->t[i].t->name)) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' is not in %s's weight_map",
                            fsdp_hf_dir_file(d, i),
                            fsdp_str_printable(a, sizeof(a), d->t[i].t->name, 0), FSDP_HF_INDEX);
        }
    }
    return 0;
}

/* The weights: model.safetensors, else the index and its shards. */
static int hf_open_weights(struct fsdp_hf_dir *d)
{
    struct stat sb;
    char *single = hf_join(d->dir, FSDP_HF_WEIGHTS);
    d->index_path = hf_join(d->dir, FSDP_HF_INDEX);
    if (!single || !d->index_path) {
        free(single);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: paths", d->dir);
    }
    int rc;
    if (stat(single, &sb) == 0) {
        free(d->index_path);
        d->index_path = NULL;
        d->files = calloc(1, sizeof(*d->files));
        rc = d->files ? fsdp_safetensors_open(single, &d->files[0])
                      : fsdp_err(FSDP_ERR_NOMEM, "%s: weights", d->dir);
        d->n_files = rc == 0;
        free(single);
        return rc < 0 ? rc : hf_build_table(d);
    }
    free(single);
    if (stat(d->index_path, &sb) != 0) {
        char *bin = hf_join(d->dir, "pytorch_model.bin");
        int has_bin = bin && stat(bin, &sb) == 0;
        free(bin);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: neither %s nor %s is there%s", d->dir,
                        FSDP_HF_WEIGHTS, FSDP_HF_INDEX,
                        has_bin ? " (pytorch_model.bin, a pickle, is not read: save the model "
                                  "with safe_serialization=True)" : "");
    }
    struct hf_index x = {0};
    struct json_t *doc = NULL;
    struct fsdp_json_obj map;
    rc = hf_open_index(d, &x, &doc, &map);
    if (rc == 0) {
        rc = hf_build_table(d);
    }
    if (rc == 0) {
        rc = hf_check_index(d, &x, &map);
    }
    free(x.e);
    free(x.files);
    fsdp_json_free(doc);
    return rc;
}

int fsdp_hf_dir_open(const char *dir, struct fsdp_hf_dir **out)
{
    struct stat sb;
    int rc;
    if (stat(dir, &sb) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: not a directory (a Hugging Face model directory "
                        "holds config.json and the safetensors weights)", dir);
    }
    struct fsdp_hf_dir *d = calloc(1, sizeof(*d));
    if (!d || !(d->dir = hf_dir_name(dir)) || !(d->config_path = hf_join(d->dir, FSDP_HF_CONFIG))) {
        fsdp_hf_dir_close(d);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: directory handle", dir);
    }
    FSDP_CHECK_GOTO(fsdp_json_load(d->config_path, FSDP_HF_JSON_MAX, &d->config_doc, &d->config),
                    rc, err);
    FSDP_CHECK_GOTO(hf_open_weights(d), rc, err);
    *out = d;
    return 0;
err:
    fsdp_hf_dir_close(d);
    return rc;
}

void fsdp_hf_dir_close(struct fsdp_hf_dir *d)
{
    if (!d) {
        return;
    }
    for (size_t f = 0; f < d->n_files; f++) {
        fsdp_safetensors_close(d->files[f]);
    }
    free(d->files);
    free(d->t);
    fsdp_json_free(d->config_doc);
    free(d->index_path);
    free(d->config_path);
    free(d->dir);
    free(d);
}

static int hf_tensor_named(const void *name, const void *e)
{
    return strcmp(name, ((const struct fsdp_hf_tensor *)e)->t->name);
}

long fsdp_hf_dir_find(const struct fsdp_hf_dir *d, const char *name)
{
    const struct fsdp_hf_tensor *e = bsearch(name, d->t, d->n, sizeof(*d->t), hf_tensor_named);
    return e ? (long)(e - d->t) : -1;
}

const char *fsdp_hf_dir_file(const struct fsdp_hf_dir *d, size_t i)
{
    return d->files[d->t[i].file]->path;
}

int fsdp_hf_dir_read(struct fsdp_hf_dir *d, size_t i, void *dst)
{
    struct fsdp_safetensors *st = d->files[d->t[i].file];
    return fsdp_safetensors_read(st, (size_t)(d->t[i].t - st->t), dst);
}

int fsdp_hf_dir_occupied(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        return errno == ENOENT ? 0 : fsdp_err(FSDP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: exists and is not a directory", path);
    }
    DIR *dp = opendir(path);
    if (!dp) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
    }
    int any = 0;
    for (struct dirent *e; !any && (e = readdir(dp));) {
        any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    }
    closedir(dp);
    return any;
}

// ----------------------------------------------------------------------------
// writing

struct fsdp_hf_writer {
    char *dir, *tmp;
    int replace, committed;
    const struct fsdp_st_entry *e; /* (n,) borrowed */
    size_t n, next;
    size_t n_shards;
    size_t *first;                 /* (n_shards + 1,) shard s holds entries [first[s], first[s+1]) */
    size_t total;                  /* bytes of every tensor */
    struct fsdp_st_writer *cur;    /* the open shard */
};

static size_t hf_entry_bytes(const struct fsdp_st_entry *e)
{
    size_t n = fsdp_dtype_size(e->dtype);
    for (int k = 0; k < e->ndim; k++) {
        n *= e->shape[k];
    }
    return n;
}

/* transformers' rule: a shard closes when the next tensor would take it
 * over max_shard, so a tensor larger than that is a shard of its own. */
static int hf_plan(struct fsdp_hf_writer *w, size_t max_shard)
{
    w->first = malloc((w->n + 1) * sizeof(*w->first));
    if (!w->first) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: shard plan", w->dir);
    }
    size_t used = 0;
    w->first[0] = 0;
    w->n_shards = 1;
    for (size_t i = 0; i < w->n; i++) {
        size_t b = hf_entry_bytes(&w->e[i]);
        if (i > w->first[w->n_shards - 1] && used + b > max_shard) {
            w->first[w->n_shards++] = i;
            used = 0;
        }
        used += b;
        w->total += b;
    }
    w->first[w->n_shards] = w->n;
    return 0;
}

/* The file name of shard s. */
static void hf_shard_name(const struct fsdp_hf_writer *w, size_t s, char *buf, size_t len)
{
    if (w->n_shards == 1) {
        snprintf(buf, len, "%s", FSDP_HF_WEIGHTS);
    } else {
        snprintf(buf, len, "model-%05zu-of-%05zu.safetensors", s + 1, w->n_shards);
    }
}

int fsdp_hf_writer_create(const char *dir, const struct fsdp_st_entry *entries, size_t n,
                          size_t max_shard, int replace, struct fsdp_hf_writer **out)
{
    int rc;
    if (n == 0 || max_shard == 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: nothing to write or a shard size of 0", dir);
    }
    struct fsdp_hf_writer *w = calloc(1, sizeof(*w));
    if (!w || !(w->dir = hf_dir_name(dir))) {
        free(w);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: writer", dir);
    }
    w->e = entries;
    w->n = n;
    w->replace = replace;
    FSDP_CHECK_GOTO(hf_plan(w, max_shard), rc, err);
    rc = fsdp_hf_dir_occupied(w->dir);
    if (rc < 0) {
        goto err;
    }
    if (rc > 0 && !replace) {
        rc = fsdp_err(FSDP_ERR_INVALID, "%s: exists and is not empty", w->dir);
        goto err;
    }
    FSDP_CHECK_GOTO(fsdp_file_tmp_mkdir(w->dir, &w->tmp), rc, err);
    *out = w;
    return 0;
err:
    fsdp_hf_writer_destroy(w);
    return rc;
}

size_t fsdp_hf_writer_shards(const struct fsdp_hf_writer *w)
{
    return w->n_shards;
}

/* Shard s's writer in the temporary directory. */
static int hf_shard_begin(struct fsdp_hf_writer *w, size_t s)
{
    static const char *const meta[] = {"format", "pt"}; /* transformers insists on it */
    char name[64];
    hf_shard_name(w, s, name, sizeof(name));
    char *p = hf_join(w->tmp, name);
    if (!p) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: shard path", w->tmp);
    }
    int rc = fsdp_st_writer_create(p, w->e + w->first[s], w->first[s + 1] - w->first[s], meta, 1,
                                   &w->cur);
    free(p);
    return rc;
}

int fsdp_hf_writer_put(struct fsdp_hf_writer *w, size_t i, const void *data)
{
    if (i != w->next || i >= w->n) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: tensor %zu written out of order (next is %zu)",
                        w->dir, i, w->next);
    }
    size_t s = 0;
    while (w->first[s + 1] <= i) {
        s++;
    }
    if (i == w->first[s]) {
        FSDP_CHECK(hf_shard_begin(w, s));
    }
    FSDP_CHECK(fsdp_st_writer_put(w->cur, i - w->first[s], data));
    w->next++;
    if (w->next == w->first[s + 1]) {
        int rc = fsdp_st_writer_commit(w->cur);
        fsdp_st_writer_destroy(w->cur);
        w->cur = NULL;
        FSDP_CHECK(rc);
    }
    return 0;
}

int fsdp_hf_writer_file(struct fsdp_hf_writer *w, const char *name, const char *text, size_t len)
{
    char *p = hf_join(w->tmp, name), *tmp = NULL;
    int fd = -1, rc = 0;
    if (!p) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: path", w->tmp);
    }
    FSDP_CHECK_GOTO(fsdp_file_tmp_create(p, &tmp, &fd), rc, out);
    for (size_t done = 0; done < len;) {
        ssize_t r = write(fd, text + done, len - done);
        if (r <= 0) {
            rc = fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
            break;
        }
        done += (size_t)r;
    }
    if (close(fd) != 0 && rc == 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    }
    rc = fsdp_file_commit_or_remove(rc, tmp, p);
out:
    free(tmp);
    free(p);
    return rc;
}

static int hf_name_cmp(const void *a, const void *b)
{
    return strcmp((*(const struct fsdp_st_entry *const *)a)->name,
                  (*(const struct fsdp_st_entry *const *)b)->name);
}

/* model.safetensors.index.json: total bytes and the shard of every tensor,
 * names sorted (as transformers writes it). */
static int hf_write_index(struct fsdp_hf_writer *w)
{
    const struct fsdp_st_entry **by = malloc(w->n * sizeof(*by));
    struct fsdp_json_writer jw;
    char name[64], *text;
    size_t len;
    if (!by || fsdp_json_writer_init(&jw) < 0) {
        free(by);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: index", w->dir);
    }
    for (size_t i = 0; i < w->n; i++) {
        by[i] = &w->e[i];
    }
    qsort(by, w->n, sizeof(*by), hf_name_cmp);
    fsdp_json_begin_obj(&jw, NULL);
    fsdp_json_begin_obj(&jw, "metadata");
    fsdp_json_put_int(&jw, "total_size", (long long)w->total);
    fsdp_json_end(&jw);
    fsdp_json_begin_obj(&jw, "weight_map");
    for (size_t k = 0; k < w->n; k++) {
        size_t i = (size_t)(by[k] - w->e), s = 0;
        while (w->first[s + 1] <= i) {
            s++;
        }
        hf_shard_name(w, s, name, sizeof(name));
        fsdp_json_put_str(&jw, by[k]->name, name);
    }
    fsdp_json_end(&jw);
    fsdp_json_end(&jw);
    free(by);
    FSDP_CHECK(fsdp_json_writer_finish(&jw, &text, &len));
    int rc = fsdp_hf_writer_file(w, FSDP_HF_INDEX, text, len);
    free(text);
    return rc;
}

/* tmp into dir's place; a directory already there is moved aside to a
 * fresh empty "<dir>.tmp.XXXXXX" (rename replaces an empty directory),
 * then removed once the new one is in. */
static int hf_put_in_place(struct fsdp_hf_writer *w)
{
    int occupied = fsdp_hf_dir_occupied(w->dir);
    if (occupied < 0) {
        return occupied;
    }
    if (occupied && !w->replace) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: exists and is not empty", w->dir);
    }
    if (!occupied) {
        return fsdp_ckpt_commit_dir(w->tmp, w->dir);
    }
    char *aside;
    FSDP_CHECK(fsdp_file_tmp_mkdir(w->dir, &aside));
    if (rename(w->dir, aside) != 0) {
        int rc = fsdp_err(FSDP_ERR_IO, "%s: cannot move it aside to %s: %s", w->dir, aside,
                          strerror(errno));
        rmdir(aside);
        free(aside);
        return rc;
    }
    int rc = fsdp_ckpt_commit_dir(w->tmp, w->dir);
    if (rc < 0) {
        rename(aside, w->dir); /* put the old one back; the recorded cause stays */
    } else {
        fsdp_file_rmtree(aside);
    }
    free(aside);
    return rc;
}

int fsdp_hf_writer_commit(struct fsdp_hf_writer *w)
{
    if (w->next != w->n) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: %zu of %zu tensors written", w->dir, w->next, w->n);
    }
    if (w->n_shards > 1) {
        FSDP_CHECK(hf_write_index(w));
    }
    FSDP_CHECK(hf_put_in_place(w));
    w->committed = 1;
    return 0;
}

void fsdp_hf_writer_destroy(struct fsdp_hf_writer *w)
{
    if (!w) {
        return;
    }
    fsdp_st_writer_destroy(w->cur);
    if (!w->committed && w->tmp) {
        fsdp_file_rmtree(w->tmp);
    }
    free(w->first);
    free(w->tmp);
    free(w->dir);
    free(w);
}
